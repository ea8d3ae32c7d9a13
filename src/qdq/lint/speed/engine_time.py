"""``qdq engine time``: every layer of a real engine report timed by the model, and, with a
profile, against what TensorRT measured.

Example:
    >>> from qdq.lint.engine_report import parse_engine_report
    >>> report = parse_engine_report([{"Name": "Conv_0", "LayerType": "CaskConvolution",
    ...     "ParameterType": "Convolution", "Kernel": [3, 3], "Groups": 1, "OutMaps": 64,
    ...     "Inputs": [{"Name": "x", "Dimensions": [32, 64, 56, 56],
    ...                 "Format/Datatype": "Channel major FP16 format where channel % 8 == 0"}],
    ...     "Outputs": [{"Name": "y", "Dimensions": [32, 64, 56, 56],
    ...                  "Format/Datatype": "Channel major FP16 format where channel % 8 == 0"}]}])
    >>> t = time_engine(report, "a100")
    >>> t.layers[0].precision, 0.02 < t.total_ms < 0.2
    ('fp16', True)
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from qdq.lint.engine_report import EngineReport
from qdq.lint.speed.cost import CostParams, UnsupportedPrecisionError, layer_time
from qdq.lint.speed.engine import engine_layer_cost, engine_trt_major
from qdq.lint.speed.gpus import GPU, find_gpu
from qdq.lint.text import printable

__all__ = ["EngineTime", "TimedEngineLayer", "time_engine"]


@dataclass(frozen=True)
class TimedEngineLayer:
    """One engine layer: its predicted time and, with a profile, the measured one (ms)."""

    name: str
    type: str
    op: str
    precision: str
    ms: float
    measured_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """``name``, ``type``, ``precision``, ``ms`` (and ``measured_ms`` when measured)."""
        out: dict[str, Any] = {"name": self.name, "type": self.type, "op": self.op,
                               "precision": self.precision, "ms": round(self.ms, 6)}  # fmt: skip
        if self.measured_ms is not None:
            out["measured_ms"] = round(self.measured_ms, 6)
        return out


@dataclass(frozen=True)
class EngineTime:
    """An engine's predicted time on one GPU.

    Attributes:
        gpu, gpu_label: the GPU's canonical and marketing names.
        layers: every layer of the profile, in TensorRT's order.
        total_ms: the sum of the layers' predicted times (as ``trtexec --exportProfile`` sums its
            per-layer times).
        measured_ms: the sum of the profile's per-layer averages, when a profile was read.
    """

    gpu: str
    gpu_label: str
    layers: tuple[TimedEngineLayer, ...]
    total_ms: float
    measured_ms: float | None = None

    @property
    def total_error(self) -> float | None:
        """predicted / measured - 1, when measured."""
        if not self.measured_ms:
            return None
        return self.total_ms / self.measured_ms - 1.0

    @property
    def median_layer_error(self) -> float | None:
        """The median |predicted / measured - 1| over the layers taking at least 2 % of the
        measured time."""
        if not self.measured_ms:
            return None
        errors = [
            abs(x.ms / x.measured_ms - 1.0)
            for x in self.layers
            if x.measured_ms and x.measured_ms >= 0.02 * self.measured_ms
        ]
        return statistics.median(errors) if errors else None

    def to_dict(self) -> dict[str, Any]:
        """JSON: ``total_ms``, ``layers`` (``name``, ``type``, ``precision``, ``ms``), ``gpu``,
        and with a profile ``measured_ms``, ``total_error``, ``median_layer_error``."""
        out: dict[str, Any] = {
            "gpu": self.gpu,
            "gpu_label": self.gpu_label,
            "total_ms": round(self.total_ms, 6),
            "layers": [x.to_dict() for x in self.layers],
        }
        if self.measured_ms is not None:
            out["measured_ms"] = round(self.measured_ms, 6)
            error, median = self.total_error, self.median_layer_error
            out["total_error"] = None if error is None else round(error, 4)
            out["median_layer_error"] = None if median is None else round(median, 4)
        return out

    def format(self, top: int = 15) -> str:
        """A text summary: the total (against the measured one) and the ``top`` slowest layers."""
        measured = self.measured_ms is not None
        lines = [f"predicted engine time on {self.gpu_label}: {self.total_ms:.3f} ms "
                 f"({len(self.layers)} layer{'' if len(self.layers) == 1 else 's'})"]  # fmt: skip
        if measured:
            lines[0] += (
                f"; measured {self.measured_ms:.3f} ms, error {100 * (self.total_error or 0):+.1f} %"
            )
            median = self.median_layer_error
            if median is not None:
                lines.append(
                    f"median layer error {100 * median:.1f} % (layers of >= 2 % of the time)"
                )
        by_precision: dict[str, float] = {}
        for x in self.layers:
            by_precision[x.precision] = by_precision.get(x.precision, 0.0) + x.ms
        share = ", ".join(f"{p} {100 * ms / max(self.total_ms, 1e-12):.0f} %"
                          for p, ms in sorted(by_precision.items(), key=lambda kv: -kv[1]))  # fmt: skip
        lines.append(f"time by precision: {share}")
        slowest = sorted(self.layers, key=lambda x: -x.ms)[: max(0, top)]
        if slowest:
            head = f"{'predicted':>10} {'measured':>9}  {'prec':5} {'type':18} layer" if measured \
                else f"{'predicted':>10}  {'prec':5} {'type':18} layer"  # fmt: skip
            lines.append(head)
        for x in slowest:
            got = f" {x.measured_ms:9.4f}" if measured and x.measured_ms is not None else (
                f" {'-':>9}" if measured else "")  # fmt: skip
            lines.append(f"{x.ms:10.4f}{got}  {x.precision:5} {printable(x.type)[:18]:18} "
                         f"{printable(x.name)[:70]}")  # fmt: skip
        return "\n".join(lines)


def time_engine(
    report: EngineReport,
    gpu: str | GPU,
    params: CostParams | None = None,
    profile: int = 0,
) -> EngineTime:
    """Predict every layer of ``report``'s optimization profile ``profile`` on ``gpu``.

    Raises:
        ValueError: an unknown GPU; :class:`UnsupportedPrecisionError` (a ``ValueError``) a layer of
            a precision the GPU has no kernels for (FP8 on an A100), naming the layer.
    """
    g = find_gpu(gpu)
    trt_major = engine_trt_major(report)
    layers = []
    timed = False
    for x in report.layers:
        if x.profile != profile:
            continue
        cost = engine_layer_cost(x)
        try:
            ms = layer_time(cost, g, params, trt_major=trt_major).ms
        except UnsupportedPrecisionError as err:
            raise UnsupportedPrecisionError(f"{err}; choose a GPU that has them (--gpu)") from None
        measured = x.average_ms if x.average_ms is not None else x.median_ms
        timed = timed or measured is not None
        layers.append(TimedEngineLayer(x.name, x.layer_type or x.parameter_type or "", cost.op,
                                       cost.precision, ms, measured))  # fmt: skip
    total = sum(x.ms for x in layers)
    measured_total = None
    if report.has_timings and timed:
        measured_total = sum(x.measured_ms or 0.0 for x in layers)
        measured_total += sum(report.unmatched_timings.values())
    return EngineTime(g.name, g.label, tuple(layers), total, measured_total)
