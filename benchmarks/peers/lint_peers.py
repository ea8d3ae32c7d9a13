"""Lint qdq's export and the peers' Q/DQ ONNX of the same network; print verdicts and INT8 coverage.

First write the peer exports with ``resnet18_peers.py`` (in its own virtual environment, see there),
then, in qdq's environment::

    python benchmarks/peers/lint_peers.py --peers /tmp/peer_onnx --model resnet18
    python benchmarks/peers/lint_peers.py --peers /tmp/peer_yolo --model yolo_style

The ONNX Runtime export (``ort.onnx``) is made here when missing (ORT is a qdq dependency);
``modelopt.onnx`` is linted when present. qdq's export uses the default TensorRT placement,
calibrated on the same ``calib.npz``.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from resnet18_peers import build, export_ort

import qdq
from qdq.lint import lint


def export_qdq(model_name: str, out: Path, calib: np.ndarray) -> Path:
    model, _ = build(model_name)
    data = [torch.from_numpy(calib[i : i + 4]) for i in range(0, len(calib), 4)]
    prepared = qdq.prepare(model, (data[0],))
    qdq.calibrate(prepared, data, method="max", show_progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = qdq.export_onnx(
            prepared, (data[0][:1],), out / "qdq.onnx", exporter="torchscript", overwrite=True
        )
    return result.path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--peers", type=Path, default=Path("/tmp/peer_onnx"))
    parser.add_argument("--model", choices=("resnet18", "yolo_style"), default="resnet18")
    parser.add_argument("--target", default="trt10")
    args = parser.parse_args()
    calib = np.load(args.peers / "calib.npz")["input"]
    paths = {"qdq": export_qdq(args.model, args.peers, calib)}
    if (args.peers / "modelopt.onnx").is_file():
        paths["modelopt"] = args.peers / "modelopt.onnx"
    ort = args.peers / "ort.onnx"
    paths["ort"] = ort if ort.is_file() else export_ort(args.peers / "fp32.onnx", ort, calib)
    print(f"{args.model}, target {args.target}")
    print(f"{'export':<10}{'verdict':<8}{'INT8 weighted':>14}{'FLOPs':>7}{'unfused':>9}"
          f"{'islands':>9}  WARN/ERROR rules")  # fmt: skip
    for name, path in paths.items():
        r = lint(path, target=args.target)
        s = r.summary
        rules = sorted(r.rules("WARN") | r.rules("ERROR"))
        print(
            f"{name:<10}{r.verdict:<8}{s['int8_weighted_layers']:>9}/{s['weighted_layers']:<4}"
            f"{s['int8_flops_percent']:>6}%{s['unfused_qdq']:>9}{s['float_islands']:>9}  "
            f"{', '.join(rules) or '-'}"
        )


if __name__ == "__main__":
    main()
