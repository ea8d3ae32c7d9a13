"""ModelOpt's half of ``benchmarks/gpu.py``: the same figures for ``INT8_DEFAULT_CFG``.

Runs in the peer environment only (ModelOpt pins other onnx/onnxruntime versions; it is never a
qdq dependency); ``benchmarks/gpu.py`` starts it as a subprocess and reads the last stdout line, one
JSON object ``{"version": ..., "models": {name: {figure: ratio | "fails: <error>"}}}``. Same models,
data, timer and steps as qdq's half (``benchmarks/gpu_common.py``, loaded by path).

Calibration figures time ``mtq.calibrate(model, algorithm, forward_loop)`` on a copy of the
quantized model each (``max``, ``mse``) over the same batches; the fake-quant forward and the QAT
steps use the model ``mtq.quantize`` returned (calibrated by max).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_common as common


def measure(name: str, args: argparse.Namespace) -> dict[str, Any]:
    import modelopt.torch.quantization as mtq

    dev, reps, warm = args.device, args.repeats, args.warmup
    model = common.build(name, dev)
    data = common.batches(args.batches, args.batch, args.size, dev)

    def r(subject: Any, baseline: Any, repeats: int = reps) -> float:
        return common.paired_ratio(subject, baseline, dev, repeats, warm)

    def loop(m: torch.nn.Module) -> None:
        common.forward_pass(m, data)()

    fp32_pass = common.forward_pass(model, data)
    quantized = mtq.quantize(copy.deepcopy(model), mtq.INT8_DEFAULT_CFG, loop)
    out: dict[str, Any] = {}
    for method in ("max", "mse") if not args.only_compiled else ():
        target = copy.deepcopy(quantized)  # a failed calibration leaves no trace on the others

        def calib(a: str = method, m: torch.nn.Module = target) -> None:
            mtq.calibrate(m, algorithm=a, forward_loop=loop)

        common.put_cell(out, f"calib_{method}", lambda c=calib: r(c, fp32_pass, max(3, reps // 2)))
    eager = not args.only_compiled
    out.update(
        common.forward_and_step_ratios(
            quantized, quantized, model, data[0], dev, r, args.compile, eager_too=eager
        )
    )
    return out


def main() -> None:
    import modelopt

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--batches", type=int, required=True)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--device", required=True)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int)
    p.add_argument("--no-compile", dest="compile", action="store_false")
    p.add_argument("--only-compiled", action="store_true")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    models = {}
    for name in args.models:
        try:
            models[name] = measure(name, args)
        except Exception as err:  # ModelOpt cannot quantize this model: every cell says so
            models[name] = {
                k: f"fails: {type(err).__name__}"
                for k, _ in common.FIGURES
                if args.compile or not k.startswith("compiled")
            }
        print(f"{name}: {json.dumps(models[name])}", file=sys.stderr, flush=True)
    print(json.dumps({"version": modelopt.__version__, "models": models}))


if __name__ == "__main__":
    main()
