"""Fit the time model's free parameters on real engine profiles, and measure its error.

Used by ``scripts/fit_engine_time.py`` (writes ``params.json``) and
``benchmarks/engine_time.py`` (leave-one-out). A sample is one engine report with its per-layer
profile: each layer's predicted time against its measured average. The loss weighs every engine
equally: the squared log error of its total plus the time-weighted mean squared log error of its
layers, so the fit cannot buy one engine's total with another's. Needs scipy (the fit only).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from qdq.lint.engine_report import load_engine_report
from qdq.lint.speed.cost import CostLayer, CostParams, layer_time
from qdq.lint.speed.engine import engine_cost_layers, engine_trt_major
from qdq.lint.speed.gpus import GPU, find_gpu

__all__ = [
    "SHARED_ENGINES",
    "EngineSample",
    "evaluate",
    "fit_params",
    "leave_one_out",
    "load_samples",
]

#: the shared engine reports (``../shared/fixtures/trt-engines``) and the GPU each ran on; the
#: A100's variant is not recorded, the SXM4 40 GB of NVIDIA's DGX A100 is assumed
SHARED_ENGINES: Mapping[str, str] = {
    "alexnet-rtx3060laptop-fp16": "rtx3060-laptop",
    "mobilenet-qat-titanrtx-trt8.2": "titan-rtx",
    "mobilenet-qat": "titan-rtx",
    "mobilenetv2-rtx3060laptop-fp16": "rtx3060-laptop",
    "resnet18-a100-fp16": "a100-sxm4-40gb",
    "resnet18-a100-fp32": "a100-sxm4-40gb",
    "resnet18-a100-qat": "a100-sxm4-40gb",
    "resnet50-keras-rtx3090-fp32": "rtx3090",
}
_SHARE_FOR_LAYER_ERROR = 0.02  # layers of at least this share of their engine's time
_RESTARTS = 3
_TOTAL_WEIGHT = 1.0  # the loss weighs an engine's total error this many times its layers' mean


@dataclass(frozen=True)
class EngineSample:
    """One profiled engine: its layers and each layer's measured average time (ms)."""

    name: str
    gpu: GPU
    layers: tuple[CostLayer, ...]
    measured: tuple[float, ...]
    trt_major: int = 10

    @property
    def total_ms(self) -> float:
        """The sum of the measured per-layer times."""
        return sum(self.measured)


def load_samples(
    folder: str | Path, engines: Mapping[str, str] = SHARED_ENGINES
) -> list[EngineSample]:
    """Read ``<name>.graph.json`` and ``<name>.profile.json`` of each engine in ``folder``.

    Raises:
        FileNotFoundError: an engine's files are missing.
    """
    out = []
    for name, gpu in engines.items():
        base = Path(folder) / name
        report = load_engine_report(f"{base}.graph.json", f"{base}.profile.json")
        layers = [x for x in report.layers if x.profile == 0]
        measured = tuple(x.average_ms if x.average_ms is not None else x.median_ms or 0.0
                         for x in layers)  # fmt: skip
        out.append(EngineSample(name, find_gpu(gpu), tuple(engine_cost_layers(report)), measured,
                                engine_trt_major(report)))  # fmt: skip
    return out


def predict(sample: EngineSample, params: CostParams) -> list[float]:
    """The predicted time of each layer of ``sample`` (ms)."""
    return [layer_time(x, sample.gpu, params, trt_major=sample.trt_major).ms for x in sample.layers]


def evaluate(samples: Sequence[EngineSample], params: CostParams) -> dict[str, dict[str, Any]]:
    """Per engine: measured and predicted totals, the total's relative error, and the median
    relative error over the layers taking at least 2 % of the engine's time."""
    out: dict[str, dict[str, Any]] = {}
    for s in samples:
        pred = predict(s, params)
        total = sum(pred)
        errors = [
            abs(p / m - 1.0)
            for p, m in zip(pred, s.measured, strict=True)
            if m >= _SHARE_FOR_LAYER_ERROR * s.total_ms and m > 0
        ]
        out[s.name] = {
            "gpu": s.gpu.name,
            "measured_ms": round(s.total_ms, 4),
            "predicted_ms": round(total, 4),
            "total_error": round(total / s.total_ms - 1.0, 4),
            "layers": len(errors),
            "median_layer_error": round(statistics.median(errors), 4) if errors else None,
        }
    return out


def _loss(samples: Sequence[EngineSample], params: CostParams) -> float:
    loss = 0.0
    for s in samples:
        pred = predict(s, params)
        total = s.total_ms
        loss += _TOTAL_WEIGHT * math.log(sum(pred) / total) ** 2
        weighted = 0.0
        for p, m in zip(pred, s.measured, strict=True):
            if m > 0 and p > 0:
                weighted += (m / total) * math.log(p / m) ** 2
        loss += weighted
    return loss / max(1, len(samples))


def fit_params(samples: Sequence[EngineSample], start: CostParams | None = None) -> CostParams:
    """The parameters minimising the loss over ``samples`` (Nelder-Mead on their logarithms,
    restarted from its result, efficiencies kept in (0, 1]); deterministic."""
    from scipy.optimize import minimize

    start = start or CostParams()
    names = [f.name for f in fields(CostParams)]
    x0 = [math.log(getattr(start, n)) for n in names]

    def unpack(x: Sequence[float]) -> CostParams:
        values = {n: math.exp(v) for n, v in zip(names, x, strict=True)}
        for n in values:
            if n.endswith("efficiency"):
                values[n] = min(1.0, values[n])
        values["blend"] = max(1.0, values["blend"])
        return CostParams(**values)

    x = x0
    for _ in range(_RESTARTS):  # Nelder-Mead restarted from its result leaves shallow minima
        x = minimize(lambda v: _loss(samples, unpack(v)), x, method="Nelder-Mead",
                     options={"maxiter": 4000, "xatol": 1e-4, "fatol": 1e-7}).x  # fmt: skip
    best = unpack(x)
    return CostParams(**{n: round(getattr(best, n), 6) for n in names})


def leave_one_out(
    samples: Sequence[EngineSample], start: CostParams | None = None
) -> dict[str, dict[str, Any]]:
    """For each engine: fit on all the others, then :func:`evaluate` it (the model's error on an
    engine it has not seen)."""
    out: dict[str, dict[str, Any]] = {}
    for i, s in enumerate(samples):
        params = fit_params([*samples[:i], *samples[i + 1 :]], start)
        out[s.name] = {**evaluate([s], params)[s.name], "params": params.to_dict()}
    return out
