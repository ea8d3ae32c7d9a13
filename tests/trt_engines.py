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
#: every engine with a per-layer profile, which the time model is fitted on (qdq.lint.speed.fit):
#: the four above and four more (RTX 3090, RTX 3060 Laptop twice, the TITAN RTX on TensorRT 8.2)
TIMED = (*PREFIXES, "resnet50-keras-rtx3090-fp32", "alexnet-rtx3060laptop-fp16",
         "mobilenetv2-rtx3060laptop-fp16", "mobilenet-qat-titanrtx-trt8.2")  # fmt: skip
#: every JSON file of the directory
FILES = (
    "alexnet-rtx3060laptop-fp16.build.metadata.json",
    "alexnet-rtx3060laptop-fp16.graph.json",
    "alexnet-rtx3060laptop-fp16.profile.json",
    "alexnet-rtx3060laptop-fp16.profile.metadata.json",
    "mobilenet-qat-titanrtx-trt8.2.graph.json",
    "mobilenet-qat-titanrtx-trt8.2.metadata.json",
    "mobilenet-qat-titanrtx-trt8.2.profile.json",
    "mobilenet-qat.build.metadata.json",
    "mobilenet-qat.graph.json",
    "mobilenet-qat.profile.json",
    "mobilenetv2-rtx3060laptop-fp16.build.metadata.json",
    "mobilenetv2-rtx3060laptop-fp16.graph.json",
    "mobilenetv2-rtx3060laptop-fp16.profile.json",
    "mobilenetv2-rtx3060laptop-fp16.profile.metadata.json",
    "resnet18-a100-fp16.build.metadata.json",
    "resnet18-a100-fp16.graph.json",
    "resnet18-a100-fp16.profile.json",
    "resnet18-a100-fp32.build.metadata.json",
    "resnet18-a100-fp32.graph.json",
    "resnet18-a100-fp32.profile.json",
    "resnet18-a100-qat.build.metadata.json",
    "resnet18-a100-qat.graph.json",
    "resnet18-a100-qat.profile.json",
    "resnet50-keras-rtx3090-fp32.build.metadata.json",
    "resnet50-keras-rtx3090-fp32.graph.json",
    "resnet50-keras-rtx3090-fp32.profile.json",
    "resnet50-keras-rtx3090-fp32.profile.metadata.json",
)
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
