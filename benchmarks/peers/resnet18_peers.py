"""Peer Q/DQ exports of ResNet-18 or the YOLO-style net (ModelOpt ONNX PTQ, ORT quantize_static).

Run in a *separate* virtual environment (ModelOpt pins other onnx/onnxruntime versions; it is never
a qdq dependency)::

    python3 -m venv /tmp/peers
    /tmp/peers/bin/pip install torch==2.14.1 torchvision==0.29.1 "nvidia-modelopt[onnx]" \\
        requests huggingface_hub
    /tmp/peers/bin/python benchmarks/peers/resnet18_peers.py --out /tmp/peer_onnx

It writes ``fp32.onnx``, ``modelopt.onnx``, ``ort.onnx`` and ``calib.npz`` into ``--out`` and prints
the Q/DQ counts. The model is random-init ResNet-18 with BN statistics re-estimated on the same
seeded data that qdq's benchmarks use (96x96), so the graphs are comparable.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import torch
from torchvision.models import resnet18


def build(name: str = "resnet18") -> tuple[torch.nn.Module, list[torch.Tensor]]:
    torch.manual_seed(0)
    data = [torch.randn(4, 3, 96, 96) for _ in range(4)]
    if name == "yolo_style":
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
        from models.yolo import YoloStyleNet

        model: torch.nn.Module = YoloStyleNet()
    else:
        model = resnet18()
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None
    model.train()
    with torch.no_grad():
        for b in data:
            model(b)
    return model.eval(), data


def counts(path: Path) -> str:
    ops = Counter(n.op_type for n in onnx.load(str(path)).graph.node)
    q, dq = ops["QuantizeLinear"], ops["DequantizeLinear"]
    return f"Q {q:>3}  DQ {dq:>3}  Conv {ops['Conv']}  Gemm {ops['Gemm']}"


def export_ort(fp32: Path, path: Path, calib: np.ndarray) -> Path:
    """ONNX Runtime quantize_static with the TensorRT-correct options (rule spec §4)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter([{"input": calib[i : i + 1]} for i in range(len(calib))])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.items, None)

    quantize_static(
        str(fp32), str(path), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
        extra_options={  # the TensorRT-correct settings (rule spec §4)
            "ActivationSymmetric": True, "WeightSymmetric": True, "QuantizeBias": False,
            "AddQDQPairToWeight": True, "DedicatedQDQPair": False,
            "ForceQuantizeNoInputCheck": True,
            "QDQOpTypePerChannelSupportToAxis": {"Conv": 0, "ConvTranspose": 1},
        },
    )  # fmt: skip
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("/tmp/peer_onnx"))
    parser.add_argument("--model", choices=("resnet18", "yolo_style"), default="resnet18")
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    model, data = build(args.model)
    calib = torch.cat(data).numpy()
    np.savez(out / "calib.npz", input=calib)
    fp32 = out / "fp32.onnx"
    torch.onnx.export(model, (data[0][:1],), str(fp32), dynamo=False, opset_version=17,
                      input_names=["input"], output_names=["output"],
                      dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})  # fmt: skip

    mo = out / "modelopt.onnx"
    subprocess.run(
        [sys.executable, "-m", "modelopt.onnx.quantization", "--onnx_path", str(fp32),
         "--quantize_mode", "int8", "--calibration_data_path", str(out / "calib.npz"),
         "--calibration_method", "max", "--calibration_eps", "cpu",
         "--high_precision_dtype", "fp32", "--output_path", str(mo)],
        check=True,
    )  # fmt: skip

    export_ort(fp32, out / "ort.onnx", calib)
    for name in ("modelopt", "ort"):
        print(f"{name:<10}{counts(out / f'{name}.onnx')}")


if __name__ == "__main__":
    main()
