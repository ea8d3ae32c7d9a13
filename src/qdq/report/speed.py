"""The page's engine-time part (issue 58): the card of the predicted engine time against FP16 and
the per-layer time chart, coloured by precision, from ``report.json: latency``
(:mod:`qdq.pipeline.speed`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from qdq.lint.speed.latency import SLOW_SPEEDUP, speedup_text

__all__ = ["CHART_LAYERS", "PRECISION_COLORS", "latency_view", "layer_time_svg"]

#: the slowest layers the chart draws
CHART_LAYERS = 30
#: bar colours by precision (the page's chip colours); standalone Q/DQ and reformats are drawn
#: in the Q/DQ colour whatever they convert to
PRECISION_COLORS = {
    "int8": "#2a9158",
    "fp8": "#2563eb",
    "fp16": "#c98410",
    "bf16": "#c98410",
    "fp32": "#c2412f",
    "tf32": "#c2412f",
    "qdq": "#7654b8",
    "other": "#9aa3ad",
}
_CONVERSIONS = ("qdq", "reformat")
#: the speed-up under which the page marks the engine as not paying (as the job warns)


def _color_key(layer: Mapping[str, Any]) -> str:
    if layer.get("type") in _CONVERSIONS:
        return "qdq"
    precision = str(layer.get("precision", ""))
    return precision if precision in PRECISION_COLORS else "other"


def latency_view(r: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the page shows of ``r["latency"]`` (``None``: no prediction; the page then says
    ``r["latency_reason"]``)."""
    lat = r.get("latency")
    if not lat:
        return None
    layers = list(lat.get("layers") or [])
    top = sorted(layers, key=lambda ly: -float(ly.get("ms", 0.0)))[:CHART_LAYERS]
    speedup = float(lat.get("speedup_vs_fp16") or 0.0)
    shares: dict[str, float] = {}
    for ly in layers:
        key = _color_key(ly)
        shares[key] = shares.get(key, 0.0) + float(ly.get("ms", 0.0))
    total = float(lat.get("total_ms") or 0.0)
    return {
        "total_ms": total,
        "fp16_total_ms": float(lat.get("fp16_total_ms") or 0.0),
        "speedup": speedup,
        "slow": speedup < SLOW_SPEEDUP,
        "speedup_text": speedup_text(speedup),
        "gpu": str(lat.get("gpu_label") or lat.get("gpu") or ""),
        "note": str(lat.get("gpu_note") or ""),
        "target": str(lat.get("target") or ""),
        "layers": len(layers),
        "shown": len(top),
        "not_paying": list(lat.get("not_paying") or []),
        "shares": [
            {"key": k, "ms": v, "share": v / total if total > 0 else 0.0}
            for k, v in sorted(shares.items(), key=lambda kv: -kv[1])
        ],
        "svg": layer_time_svg(top) if top else None,
    }


def layer_time_svg(layers: Sequence[Mapping[str, Any]]) -> str:
    """Horizontal bars of each layer's predicted time (slowest first), coloured by precision."""
    from matplotlib import rc_context
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    from qdq.report.plots import _RC, _svg

    names = [_head(str(ly.get("name", ""))) for ly in layers]
    ms = [float(ly.get("ms", 0.0)) for ly in layers]
    keys = [_color_key(ly) for ly in layers]
    n = len(layers)
    with rc_context(_RC):
        fig = Figure(figsize=(7.2, min(0.22 * n + 0.9, 8.0)))
        ax = fig.add_subplot()
        ax.barh(range(n), ms, color=[PRECISION_COLORS[k] for k in keys], height=0.7)
        ax.set_yticks(range(n), names)
        ax.invert_yaxis()
        ax.set_xlabel("predicted time per layer (ms)")
        used = list(dict.fromkeys(keys))
        labels = {"qdq": "Q/DQ, reformat", "other": "other"}
        ax.legend(
            [Patch(color=PRECISION_COLORS[k]) for k in used],
            [labels.get(k, k.upper()) for k in used],
            fontsize=6.5,
            frameon=True,
            framealpha=0.92,
            edgecolor="none",
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
        )
        return _svg(fig)


def _head(name: str, limit: int = 48) -> str:
    """A fused layer's name cut at its end: its first node (the convolution) is what names it."""
    return name if len(name) <= limit else name[: limit - 1] + "…"
