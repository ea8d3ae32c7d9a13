"""PTQ improvements, sensitivity and fallback on the zoo, every figure measured through the export.

For each zoo model (its own calibration and evaluation data), at full INT8 coverage
(``QuantConfig.tensorrt(disable=("performance",))``: every weighted layer INT8):

* the metric of the exported ONNX in ONNX Runtime (``ORT_ENABLE_BASIC``) with the default (mse),
  with the calibration method per quantizer, with bias correction, with kernel-sum rounding
  (alone and with bias correction), with AdaRound, and with all three, plus top-1 agreement
  and logit cosine with FP32; and the same with cross-layer equalization of the float model first
  (``--equalize``: alone, with kernel-sum + bias, with AdaRound, with all three);
* the top-5 units by the one-off output proxy (``qdq.sensitivity``) and the proxy's cost relative
  to one evaluation of the model over the evaluation set (torch fake-quant);
* ``qdq.auto_quantize`` under ``--max-drop`` (default 0.01) from the default placement, scored in
  torch fake-quant, the final model exported and measured in ONNX Runtime.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/ptq.py [--models a,b] [--json out.json]``.
Prints figures; asserts nothing. Times are ratios within one run (shared, noisy machine).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import qdq
from qdq.config import QuantConfig
from qdq.pipeline.data import resolve_data
from qdq.pipeline.evaluate import batches, ort_outputs, score, torch_outputs
from qdq.pipeline.improve import PtqOptions, improver
from qdq.pipeline.models import resolve_model
from qdq.ptq.equalize import equalize

MODELS = ("fashion-mnist-resnet", "efficientnet-lite0", "crepe-tiny", "mtcnn-rnet", "mtcnn-onet")
CONFIGS: dict[str, PtqOptions] = {
    "mse (default)": PtqOptions(),
    "method per quantizer": PtqOptions(method_per_quantizer=True),
    "bias correction": PtqOptions(bias_correction=True),
    "kernel-sum rounding": PtqOptions(rounding="kernel-sum"),
    "kernel-sum + bias": PtqOptions(rounding="kernel-sum", bias_correction=True),
    "AdaRound": PtqOptions(rounding="adaround"),
    "all three": PtqOptions(method_per_quantizer=True, rounding="adaround", bias_correction=True),
    "equalize": PtqOptions(equalize=True),
    "equalize + kernel-sum + bias": PtqOptions(
        equalize=True, rounding="kernel-sum", bias_correction=True
    ),
    "equalize + AdaRound": PtqOptions(equalize=True, rounding="adaround"),
    "equalize + all three": PtqOptions(
        equalize=True, method_per_quantizer=True, rounding="adaround", bias_correction=True
    ),
}
FULL = QuantConfig.tensorrt(disable=("performance",))


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def quiet(fn: Callable[[], Any]) -> Any:
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        return fn()


class Bench:
    """One zoo model, its data and its FP32 reference outputs."""

    def __init__(self, name: str, batch: int) -> None:
        self.name = name
        self.source = resolve_model(name)
        self.data = resolve_data(None, self.source.zoo, None)
        self.static = self.source.static_batch is not None
        self.size = self.source.static_batch or batch
        self.every = self.data.metric is not None
        self.calib = [b for b, _ in batches(self.data.calibration, self.size, self.static)]
        self.example = self.calib[0] if self.static else self.calib[0][:1]
        start = time.perf_counter()
        self.ref = self.outputs(self.source.module)
        self.fp32_eval_s = time.perf_counter() - start
        self.fp32 = self.score(self.ref)

    def outputs(self, model: nn.Module) -> list[torch.Tensor]:
        return torch_outputs(model, self.data.evaluation, self.size, static=self.static,
                             desc="", show=False, every=self.every)  # fmt: skip

    def score(self, outs: list[torch.Tensor]) -> dict[str, Any]:
        d = self.data
        return score(outs, self.ref, d.labels, d.metric, d.targets)

    def metric(self, model: nn.Module) -> float:
        return float(self.score(self.outputs(model))["metric"])

    def through_export(self, prepared: nn.Module, tmp: Path, tag: str) -> dict[str, Any]:
        path = tmp / f"{self.name}-{tag}.onnx"
        quiet(lambda: qdq.export_onnx(prepared, (self.example,), path, exporter="torchscript",
                                      dynamic_batch=not self.static, overwrite=True))  # fmt: skip
        outs = ort_outputs(path, self.data.evaluation, self.size, static=self.static, desc="",
                           show=False, every=self.every)  # fmt: skip
        return self.score(outs)


def _figures(s: dict[str, Any]) -> dict[str, Any]:
    return {"metric": s["metric"], "agreement": s["top1_agreement"], "cosine": s["cosine_mean"]}


def run_model(name: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    b = Bench(name, args.batch)
    out: dict[str, Any] = {"model": name, "fp32": _figures(b.fp32), "configs": {}}
    log(f"== {name}: FP32 {b.fp32['metric']:.4f} (one FP32 evaluation {b.fp32_eval_s:.1f} s)")
    full_prepared = None
    for label, options in CONFIGS.items():
        if label not in args.configs:
            continue
        start = time.perf_counter()
        model, eq_summary = b.source.module, None
        if options.equalize:
            eq = quiet(lambda: equalize(b.source.module, (b.example,), b.calib))
            model, eq_summary = eq.model, eq.summary()
        prepared = quiet(lambda m=model: qdq.prepare(m, (b.example,), FULL))
        quiet(lambda p=prepared: qdq.calibrate(p, b.calib, show_progress=False))
        improve, reports = improver(
            PtqOptions(**{**options.__dict__, "adaround_iters": args.adaround_iters}),
            b.calib, show_progress=False,
        )  # fmt: skip
        quiet(lambda p=prepared, f=improve: f(p))
        seconds = time.perf_counter() - start
        got = _figures(b.through_export(prepared, tmp, label.split()[0]))
        got["seconds"] = round(seconds, 1)
        got["summaries"] = {k: v.get("summary") for k, v in reports.items()}
        if eq_summary is not None:
            got["summaries"]["equalize"] = eq_summary
        out["configs"][label] = got
        log(f"  {label:<28} {got['metric']:.4f}  agree {got['agreement']}  cos "
            f"{got['cosine']:.5f}  ({seconds:.1f} s)")  # fmt: skip
        if label == "mse (default)":
            full_prepared = prepared
    if full_prepared is not None:
        start = time.perf_counter()
        sens = qdq.sensitivity(full_prepared, b.calib, show_progress=False)
        seconds = time.perf_counter() - start
        start = time.perf_counter()
        b.metric(full_prepared)
        eval_s = time.perf_counter() - start
        out["sensitivity"] = {
            "top5": [
                {
                    "unit": r.name,
                    "owners": list(r.owners),
                    "damage": r.damage,
                    "sqnr_db_without": r.score,
                }
                for r in sens.rows[:5]
            ],
            "units": len(sens.rows),
            "seconds": round(seconds, 2),
            "one_evaluation_s": round(eval_s, 2),
            "x_evaluation": round(seconds / eval_s, 2),
        }
        log(f"  sensitivity: {len(sens.rows)} units in {seconds:.1f} s = "
            f"{seconds / eval_s:.2f} evaluations; top 5: "
            + ", ".join(r.name for r in sens.rows[:5]))  # fmt: skip
    if args.max_drop is not None:
        start = time.perf_counter()
        res = quiet(lambda: qdq.auto_quantize(
            b.source.module, (b.example,), b.calib, metric=b.metric, max_drop=args.max_drop,
            exporter="torchscript", show_progress=False))  # fmt: skip
        seconds = time.perf_counter() - start
        final = _figures(b.through_export(res.model, tmp, "fallback"))
        out["fallback"] = {**res.to_dict(), "ort": final, "seconds_total": round(seconds, 1)}
        out["fallback"].pop("sensitivity", None)
        log(f"  fallback --max-drop {args.max_drop:g}: full INT8 {res.full_int8_metric:.4f} → "
            f"{res.int8_metric:.4f} torch, {final['metric']:.4f} ORT; float: "
            f"{', '.join(res.fallback) or 'nothing'} ({seconds:.0f} s)")  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated labels")
    p.add_argument("--max-drop", type=float, default=0.01)
    p.add_argument("--no-fallback", action="store_true")
    p.add_argument("--adaround-iters", type=int, default=500)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    args.configs = args.configs.split(",")
    if args.no_fallback:
        args.max_drop = None
    torch.manual_seed(0)
    results = []
    with tempfile.TemporaryDirectory(prefix="qdq-ptq-bench-") as tmp:
        for name in args.models.split(","):
            results.append(run_model(name, args, Path(tmp)))
            if args.json:
                args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
