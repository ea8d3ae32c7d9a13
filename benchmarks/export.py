"""Export benchmark: time, Q/DQ counts and ORT parity per model, exporter and opset.

Run: ``.venv/bin/python benchmarks/export.py`` (prints a table; asserts nothing). Models: the
built-in Fashion-MNIST ResNet (trained), torchvision ResNet-18 and a YOLO-style net (random init,
BN statistics re-estimated on the calibration data so activations are well scaled).
``benchmarks/export_stages.py`` splits one model's export time into stages per exporter.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import qdq
from qdq.backends.onnxruntime import parity


def _bn_reestimate(model: nn.Module, batches: list[torch.Tensor]) -> nn.Module:
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None
    model.train()
    with torch.no_grad():
        for b in batches:
            model(b)
    return model.eval()


def _models() -> dict[str, Callable[[], tuple[nn.Module, list[torch.Tensor]]]]:
    def fashion() -> tuple[nn.Module, list[torch.Tensor]]:
        from qdq.zoo import fashion_mnist as fm

        return fm.load_pretrained(), fm.calibration_batches(num_batches=4)

    def resnet18() -> tuple[nn.Module, list[torch.Tensor]]:
        from torchvision.models import resnet18 as rn

        torch.manual_seed(0)
        data = [torch.randn(4, 3, 96, 96) for _ in range(4)]
        return _bn_reestimate(rn(), data), data

    def yolo() -> tuple[nn.Module, list[torch.Tensor]]:
        from models.yolo import YoloStyleNet

        torch.manual_seed(0)
        data = [torch.randn(4, 3, 64, 64) for _ in range(4)]
        return _bn_reestimate(YoloStyleNet(), data), data

    return {"fashion_resnet": fashion, "resnet18": resnet18, "yolo_style": yolo}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--opsets", type=int, nargs="+", default=[13, 17])
    args = parser.parse_args()
    torch.set_num_threads(2)
    warnings.simplefilter("ignore")
    print(
        f"{'model':<15}{'exporter':<12}{'opset':>5}{'export s':>10}{'Q':>5}{'DQ':>5}"
        f"{'max rel diff':>14}{'min cos':>10}{'codes differing':>17}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for name, build in _models().items():
            model, data = build()
            prepared = qdq.prepare(model, (data[0][:1],))
            qdq.calibrate(prepared, data, show_progress=False)
            for exporter in ("dynamo", "torchscript"):
                for opset in args.opsets:
                    path = Path(tmp) / f"{name}_{exporter}_{opset}.onnx"
                    t0 = time.perf_counter()
                    out = qdq.export_onnx(
                        prepared, (data[0][:1],), path, exporter=exporter, opset=opset
                    )
                    secs = time.perf_counter() - t0
                    rep = parity(prepared, out.path, data, per_layer=True)
                    diff = sum(lp.differing_codes for lp in rep.layers.values())
                    total = sum(lp.elements for lp in rep.layers.values())
                    print(
                        f"{name:<15}{exporter:<12}{opset:>5}{secs:>10.2f}{out.num_quantize:>5}"
                        f"{out.num_dequantize:>5}{rep.max_rel_diff:>14.2e}{rep.min_cosine:>10.6f}"
                        f"{diff:>9}/{total:.1e}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
