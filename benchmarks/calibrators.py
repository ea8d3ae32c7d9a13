"""Calibrator benchmark: vectorised entropy vs the reference loop; histogram collection overhead;
per zoo model, calibration time vs one FP32 pass and vs ONNX Runtime's MinMax calibration.

Run: ``make bench`` (or ``.venv/bin/python benchmarks/calibrators.py [--sections ...]
[--models NAME ...]``). Prints figures; asserts nothing about time. Times are medians of repeated
runs in this process (ratios are what count on a shared machine). The zoo section is described in
``benchmarks/calibrators_zoo.py``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from calibrators_zoo import bench_zoo
from qdq.calib import HistogramCalibrator, entropy_amax, mse_amax
from qdq.zoo.registry import MODELS
from reference_calib import entropy_reference

SECTIONS = ("entropy", "collection", "zoo")


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_entropy(repeats: int) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.relu(torch.randn(1_000_000, generator=g)) * 1.7
    x[:50] = torch.rand(50, generator=g) * 25
    counts, edges = np.histogram(x.numpy(), bins=2048, range=(0.0, float(x.max())))
    ref_amax, _ = entropy_reference(counts, edges)
    ours = entropy_amax(counts, edges)
    t_ref = _median_time(lambda: entropy_reference(counts, edges), max(1, repeats // 5))
    t_ours = _median_time(lambda: entropy_amax(counts, edges), repeats)
    print("entropy on a 2048-bin histogram (1M ReLU activations + outliers)")
    print(f"  reference loop      {t_ref * 1e3:10.1f} ms   amax={ref_amax:.6f}")
    print(
        f"  qdq vectorised      {t_ours * 1e3:10.2f} ms   amax={ours:.6f}   same={ours == ref_amax}"
    )
    print(f"  speedup             {t_ref / t_ours:10.1f} x")

    cal = HistogramCalibrator()
    cal.collect(x)
    c2, e2 = cal.histogram()
    t_cal = _median_time(lambda: cal.compute_amax("entropy"), repeats)
    t_mse = _median_time(lambda: mse_amax(c2, e2, observed_max=cal.observed_max), repeats)
    print(
        f"  calibrator histogram: {len(c2)} bins; entropy {t_cal * 1e3:.2f} ms, mse "
        f"{t_mse * 1e3:.1f} ms per tensor"
    )


def bench_collection(num_batches: int, batch_size: int, image: int) -> None:
    try:
        from torchvision.models import resnet18
    except ImportError:
        print("collection overhead: skipped (torchvision is not installed)")
        return
    torch.manual_seed(0)
    model = resnet18().eval()
    batches = [torch.randn(batch_size, 3, image, image) for _ in range(num_batches)]
    calibrators: list[HistogramCalibrator] = []
    hooks = []
    for module in model.modules():
        if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
            cal = HistogramCalibrator()
            calibrators.append(cal)
            hooks.append(module.register_forward_pre_hook(lambda m, a, c=cal: c.collect(a[0])))

    def run(collect: bool) -> float:
        for h in hooks:
            h.remove()
        hooks.clear()
        if collect:
            for module, cal in zip(
                [m for m in model.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))],
                calibrators,
                strict=True,
            ):
                hooks.append(module.register_forward_pre_hook(lambda m, a, c=cal: c.collect(a[0])))
        t0 = time.perf_counter()
        with torch.no_grad():
            for b in batches:
                model(b)
        return time.perf_counter() - t0

    run(False)  # warm-up
    plain, calib = [], []
    for _ in range(3):  # interleave to share the machine's noise
        plain.append(run(False))
        calib.append(run(True))
    p, c = statistics.median(plain), statistics.median(calib)
    n_elems = sum(int(cal.histogram()[0].sum()) for cal in calibrators) // (3 * num_batches)
    print(
        f"histogram collection on ResNet-18 ({len(calibrators)} quantizer inputs, "
        f"{num_batches} batches of {batch_size}x3x{image}x{image}, {n_elems / 1e6:.1f}M values/batch)"
    )
    print(f"  plain FP32 forward  {p:8.2f} s")
    print(f"  forward + collect   {c:8.2f} s")
    print(f"  ratio               {c / p:8.2f} x  (collection overhead {100 * (c / p - 1):.0f} %)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--batches", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--image", type=int, default=224)
    parser.add_argument(
        "--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="what to run (all)"
    )
    parser.add_argument(
        "--models", nargs="+", default=list(MODELS), help="zoo models (default: every one)"
    )
    parser.add_argument("--zoo-batch", type=int, default=32, help="zoo calibration batch (32)")
    parser.add_argument(
        "--calib-n", type=int, default=None, help="zoo calibration samples (default: the dataset's)"
    )
    parser.add_argument("--zoo-repeats", type=int, default=5, help="zoo timing repeats (5)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (2)")
    args = parser.parse_args()
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        parser.error(f"unknown zoo model(s) {unknown}; choose from {', '.join(MODELS)}")
    torch.set_num_threads(args.threads)
    if "entropy" in args.sections:
        bench_entropy(args.repeats)
    if "collection" in args.sections:
        bench_collection(args.batches, args.batch_size, args.image)
    if "zoo" in args.sections:
        bench_zoo(args.models, args.zoo_batch, args.calib_n, args.zoo_repeats)


if __name__ == "__main__":
    main()
