"""``qdq demo``: the pipeline as far as it goes, on the built-in Fashion-MNIST model and data.

Today that is: per-channel max weights, per-tensor activation quantizers on every Conv/Linear input,
one histogram calibration pass, then INT8 (fake-quant, bit-exact with ONNX Q/DQ) accuracy for each
calibration method computed from that single collection. TensorRT-aware placement (residual Add,
Concat, pooling), export and the linter arrive with their issues and will replace the simple
Conv/Linear-input placement used here.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from qdq import __version__
from qdq._io import atomic_write_text
from qdq.config import CALIBRATION_METHODS, QuantSpec
from qdq.quant import Quantizer, fake_quant, quantizer_mode

__all__ = ["DemoResult", "quantize_conv_linear", "run_demo"]


@dataclass(frozen=True)
class DemoResult:
    """Accuracy of one model variant on the test set."""

    name: str
    accuracy: float
    agreement: float  # top-1 agreement with FP32
    mean_cosine: float  # mean cosine similarity of the logits with FP32


def quantize_conv_linear(model: nn.Module) -> tuple[nn.Module, dict[str, Quantizer]]:
    """Return a quantized copy of ``model`` and its activation quantizers by module name.

    Weights of every Conv/Linear are fake-quantized per output channel (abs-max) in the copy; an
    input :class:`Quantizer` (histogram calibrator) runs before each of them. ``model`` itself is
    never modified.
    """
    qmodel = copy.deepcopy(model)
    quantizers: dict[str, Quantizer] = {}
    for name, module in qmodel.named_modules():
        if not isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)):
            continue
        with torch.no_grad():
            w = module.weight
            amax = w.detach().abs().flatten(1).amax(dim=1)
            w.copy_(fake_quant(w, amax, axis=0))
        q = Quantizer(QuantSpec(), name=f"{name}.input")
        module.add_module("input_quantizer", q)
        module.register_forward_pre_hook(_quantize_first_input)
        quantizers[name] = q
    return qmodel, quantizers


def _quantize_first_input(module: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple:
    quantizer = module.get_submodule("input_quantizer")
    return (quantizer(args[0]), *args[1:])


def _logits(model: nn.Module, images: torch.Tensor, batch_size: int = 500) -> torch.Tensor:
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return torch.cat(
                [model(images[i : i + batch_size]) for i in range(0, len(images), batch_size)]
            )
    finally:
        model.train(was_training)


def _score(name: str, logits: torch.Tensor, ref: torch.Tensor, labels: torch.Tensor) -> DemoResult:
    pred = logits.argmax(dim=1)
    cos = torch.nn.functional.cosine_similarity(logits, ref, dim=1)
    return DemoResult(
        name=name,
        accuracy=float((pred == labels).float().mean()),
        agreement=float((pred == ref.argmax(dim=1)).float().mean()),
        mean_cosine=float(cos.mean()),
    )


def run_demo(
    out_dir: str | Path = "reports",
    calib_batches: int = 8,
    calib_batch_size: int = 32,
    limit: int | None = None,
) -> int:
    """Run the demo, print the figures and write ``<out_dir>/demo.json``; return an exit code."""
    from qdq.zoo import fashion_mnist as fm

    if calib_batches < 1 or calib_batch_size < 1:
        raise ValueError("--calib-batches and --calib-batch-size must be >= 1")
    t0 = time.perf_counter()
    images, labels = fm.load_split("test")
    if limit is not None:
        if limit < 1:
            raise ValueError(f"--limit must be >= 1, got {limit}")
        images, labels = images[:limit], labels[:limit]
    model = fm.load_pretrained()
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"qdq {__version__} demo: Fashion-MNIST ResNet-ish ({n_params / 1e3:.1f}k parameters), "
        f"{len(images):,} labelled test images"
    )

    ref = _logits(model, images)
    fp32 = _score("fp32", ref, ref, labels)
    print(f"  FP32 accuracy {100 * fp32.accuracy:.2f}%", flush=True)

    qmodel, quantizers = quantize_conv_linear(model)
    batches = fm.calibration_batches(num_batches=calib_batches, batch_size=calib_batch_size)
    with quantizer_mode(qmodel, "calibrate"), torch.no_grad():
        for batch in batches:
            qmodel(batch)
    print(
        f"  calibrated {len(quantizers)} activation quantizers on {calib_batches}x"
        f"{calib_batch_size} training images (one histogram pass, all methods below)"
    )

    results: dict[str, dict[str, object]] = {}
    print(f"  {'method':<11}{'INT8 acc':>9}{'drop':>8}{'agree':>9}{'cosine':>9}")
    for method in CALIBRATION_METHODS:
        amax = {name: q.load_calib_amax(method).item() for name, q in quantizers.items()}
        res = _score(method, _logits(qmodel, images), ref, labels)
        drop = 100 * (res.accuracy - fp32.accuracy)
        print(
            f"  {method:<11}{100 * res.accuracy:8.2f}%{drop:+8.2f}{100 * res.agreement:8.2f}%"
            f"{res.mean_cosine:9.5f}",
            flush=True,
        )
        results[method] = {**res.__dict__, "amax": amax}

    best = max(results, key=lambda m: float(results[m]["accuracy"]))  # type: ignore[arg-type]
    lint = {"verdict": None, "reason": "the TensorRT linter is not built yet (issue #5)"}
    print(f"  best method: {best}")
    print(f"  lint verdict: not available yet ({lint['reason']})")
    report = {
        "qdq_version": __version__,
        "model": "qdq.zoo.fashion_mnist.ResNetish",
        "parameters": n_params,
        "dataset": "Fashion-MNIST test (Debian dataset-fashion-mnist)",
        "test_images": len(images),
        "calibration": {"batches": calib_batches, "batch_size": calib_batch_size},
        "placement": "per-channel max weights + per-tensor input of every Conv/Linear",
        "fp32": fp32.__dict__,
        "int8": results,
        "best_method": best,
        "lint": lint,
        "seconds": round(time.perf_counter() - t0, 2),
    }
    path = atomic_write_text(Path(out_dir) / "demo.json", json.dumps(report, indent=2) + "\n")
    print(f"  report written to {path}")
    return 0
