"""Regenerate the drawings of docs/engine.md and print its FP16 vs INT8 comparison table.

Usage:
    python scripts/engine_docs.py [--fixtures DIR] [--out docs/img]

Writes, for the real TensorRT engine reports in the fixtures (``tests/fixtures/trt-engines/`` by
default, the directory ``tests/trt_engines.py`` names; trtexec --exportLayerInfo and
--exportProfile, A100):

* ``engine-<fixture>.svg``: each engine drawn (MobileNet collapsed to one box per block);
* ``predicted-resnet18.svg``, ``predicted-mobilenet-v2.svg``: the linter's predicted engine for
  the same structures exported by qdq (the fixtures ship no ONNX: torchvision ResNet-18 and
  MobileNetV2, random weights, Q/DQ on conv inputs and weights only as in the fixtures' builds,
  TorchScript exporter), with the layers that disagree with the real engine marked (none do);
* ``predicted-resnet18-default.svg``: qdq's default placement of ResNet-18, marked against the
  naive engine (the residual Adds and the pool it makes INT8 are the disagreements);
* ``compare-resnet18-fp16-vs-qat.svg``: the charts of ``qdq engine compare``;

and prints ``qdq engine compare`` of the FP16 and the Q/DQ ResNet-18 engines. Needs Graphviz
``dot`` and torchvision; deterministic (seeded; dot's layout is deterministic).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

import torch
import torchvision

import qdq
from qdq._io import atomic_write_text
from qdq.lint import diff_engine, lint, load_engine_report
from qdq.lint.compare import compare_engines
from qdq.lint.compare_draw import comparison_svg
from qdq.lint.engine_pages import engine_svg, predicted_svg

# the engine-report fixtures: where the tests find them (tests/trt_engines.py, the one place)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from trt_engines import TRT_ENGINES

ENGINES = {  # fixture: max_nodes (MobileNet's 73 layers collapse to one box per block)
    "resnet18-a100-fp32": 150,
    "resnet18-a100-fp16": 150,
    "resnet18-a100-qat": 150,
    "mobilenet-qat": 30,
}
NAIVE = ("residual", "pooling", "performance")  # Q/DQ on conv inputs and weights only


def _export(name: str, tmp: Path, naive: bool) -> Path:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 64, 64)
    config = qdq.QuantConfig.tensorrt(disable=NAIVE) if naive else None
    prepared = qdq.prepare(getattr(torchvision.models, name)().eval(), (x,), config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qdq.calibrate(prepared, [x], method="max", show_progress=False)
        out = tmp / f"{name}{'' if naive else '-default'}.onnx"
        return qdq.export_onnx(prepared, (x[:1],), out, exporter="torchscript").path


def _write(path: Path, svg: str) -> None:
    atomic_write_text(path, '<?xml version="1.0" encoding="UTF-8"?>\n' + svg + "\n")
    print(f"wrote {path} ({path.stat().st_size // 1024} KiB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--fixtures", type=Path, default=TRT_ENGINES)
    parser.add_argument("--out", type=Path, default=Path(__file__).parents[1] / "docs" / "img")
    args = parser.parse_args()
    fx: Path = args.fixtures

    def load(prefix: str) -> qdq.lint.EngineReport:
        return load_engine_report(fx / f"{prefix}.graph.json", fx / f"{prefix}.profile.json")

    engines = {prefix: load(prefix) for prefix in ENGINES}
    for prefix, max_nodes in ENGINES.items():
        svg = engine_svg(engines[prefix], max_nodes=max_nodes, title=f"{prefix} (real engine)")
        _write(args.out / f"engine-{prefix}.svg", svg)
    with tempfile.TemporaryDirectory() as tmp:
        cases = [
            ("resnet18", True, "resnet18-a100-qat", "predicted-resnet18.svg", 150),
            ("mobilenet_v2", True, "mobilenet-qat", "predicted-mobilenet-v2.svg", 30),
            ("resnet18", False, "resnet18-a100-qat", "predicted-resnet18-default.svg", 150),
        ]
        for name, naive, prefix, file, max_nodes in cases:
            onnx_path = _export(name, Path(tmp), naive)
            report = lint(onnx_path)
            diff = diff_engine(report, engines[prefix])
            placement = "Q/DQ on conv inputs and weights" if naive else "qdq's default placement"
            title = f"{name} ({placement}): predicted engine, marked against {prefix}"
            print(f"{file}: {len(diff.matches)} matched, {len(diff.mismatches)} disagree")
            _write(args.out / file, predicted_svg(onnx_path, report, diff, max_nodes=max_nodes,
                                                  title=title))  # fmt: skip
    comparison = compare_engines(
        engines["resnet18-a100-fp16"],
        engines["resnet18-a100-qat"],
        names=("resnet18-a100-fp16", "resnet18-a100-qat"),
    )
    _write(args.out / "compare-resnet18-fp16-vs-qat.svg", comparison_svg(comparison))
    print()
    print(comparison.format())


if __name__ == "__main__":
    main()
