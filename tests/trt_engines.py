"""The real TensorRT engine reports (trtexec layer information, profiles, build metadata) that the
tests, ``scripts/engine_docs.py`` and the docs read: one place that says where they are.

They lie in the repository (``tests/fixtures/trt-engines/``, origin in its README), so a fresh
clone runs every test that reads them; a missing file raises (the test fails) instead of skipping.
"""

from __future__ import annotations

from pathlib import Path

#: the directory of the engine-report fixtures, inside the repository
TRT_ENGINES = Path(__file__).resolve().parent / "fixtures" / "trt-engines"
#: the four engines: ResNet-18 on an A100 at batch 32 (FP32, FP16, naive Q/DQ) and MobileNet Q/DQ
PREFIXES = ("resnet18-a100-fp32", "resnet18-a100-fp16", "resnet18-a100-qat", "mobilenet-qat")
#: the files trtexec wrote for each engine: ``<prefix>.<kind>.json``
KINDS = ("graph", "profile", "build.metadata")


def engine_file(prefix: str, kind: str = "graph") -> Path:
    """The path of one engine-report fixture, checked to exist.

    Args:
        prefix: the engine, one of :data:`PREFIXES`.
        kind: which of its files, one of :data:`KINDS` (``graph``: ``--exportLayerInfo``;
            ``profile``: ``--exportProfile``; ``build.metadata``: the build options).

    Returns:
        ``TRT_ENGINES / f"{prefix}.{kind}.json"``.

    Raises:
        FileNotFoundError: the file is not in the repository (a failure, never a skip).
    """
    path = TRT_ENGINES / f"{prefix}.{kind}.json"
    if not path.is_file():
        raise FileNotFoundError(f"engine-report fixture missing from the repository: {path}")
    return path
