"""The report's plots as inline SVG strings, drawn with matplotlib's object API (no pyplot, no
global state: every figure is its own ``Figure`` inside an ``rc_context``).

Text stays text (``svg.fonttype = none``), so the page's font renders it and the SVG stays small.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Sequence
from typing import Any

__all__ = ["histogram_svg", "sqnr_color", "sqnr_profile_svg"]

_RC: dict[Any, Any] = {  # rcParams keys are Literal-typed in matplotlib's stubs
    "svg.fonttype": "none",
    "font.family": "sans-serif",
    "font.size": 8,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.edgecolor": "#9aa3ad",
    "axes.labelcolor": "#3b4350",
    "xtick.color": "#5b6573",
    "ytick.color": "#5b6573",
    "axes.titlesize": 9,
    "axes.titleweight": "bold",
}
#: colours of the calibration methods' amax marks (the one in use is drawn solid and thick)
METHOD_COLORS = {
    "max": "#6b7280",
    "entropy": "#7654b8",
    "mse": "#2563eb",
    "percentile": "#c98410",
}
#: SQNR bands (dB) for colouring: below the first red, below the second amber, else green
SQNR_BANDS = (20.0, 30.0)


def sqnr_color(sqnr_db: float | None) -> str:
    """Red below 20 dB, amber below 30 dB, green above (``None``: identical, green)."""
    if sqnr_db is None or math.isnan(sqnr_db):
        return "#2a9158"
    if sqnr_db < SQNR_BANDS[0]:
        return "#c2412f"
    return "#c98410" if sqnr_db < SQNR_BANDS[1] else "#2a9158"


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    text = text[text.find("<svg") :]
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)
    return text.strip()


def sqnr_profile_svg(names: Sequence[str], sqnr_db: Sequence[float | None]) -> str:
    """Bars of accumulated SQNR per quantizer in execution order (``None``: no error, drawn at
    the top of the axis)."""
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    finite = [v for v in sqnr_db if v is not None and math.isfinite(v)]
    top = max([*finite, SQNR_BANDS[1] + 10.0]) * 1.08
    values = [top if v is None or not math.isfinite(v) else max(v, 0.0) for v in sqnr_db]
    n = len(values)
    with rc_context(_RC):
        fig = Figure(figsize=(min(max(0.42 * n + 2.2, 5.0), 12.0), 2.6))
        ax = fig.add_subplot()
        ax.bar(range(n), values, color=[sqnr_color(v) for v in sqnr_db], width=0.7)
        for band in SQNR_BANDS:
            ax.axhline(band, color="#c7ccd3", lw=0.8, ls="--", zorder=0)
        ax.set_ylim(0, top)
        ax.set_ylabel("SQNR (dB, higher is better)")
        ax.set_xlim(-0.6, n - 0.4)
        if n <= 48:
            ax.set_xticks(range(n), [_short(s) for s in names], rotation=60, ha="right")
        else:
            ax.set_xticks([])
            ax.set_xlabel(f"{n} quantizers in execution order")
        return _svg(fig)


def histogram_svg(
    name: str,
    bin_width: float,
    counts: Sequence[int],
    amax: float,
    method: str,
    methods: dict[str, float],
) -> str:
    """The ``|x|`` histogram (log counts) with the amax in use and every method's amax marked."""
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    edges = [i * bin_width for i in range(len(counts) + 1)]
    with rc_context(_RC):
        fig = Figure(figsize=(3.6, 2.3))
        ax = fig.add_subplot()
        ax.stairs(counts, edges, fill=True, color="#9cc3e6", lw=0)
        ax.stairs(counts, edges, color="#3b78b5", lw=0.7)
        ax.set_yscale("symlog", linthresh=1.0)
        ax.set_ylim(bottom=0)
        for m, value in methods.items():
            if m != method:
                ax.axvline(value, color=METHOD_COLORS.get(m, "#6b7280"), lw=0.9, ls=":")
        ax.axvline(amax, color=METHOD_COLORS.get(method, "#111827"), lw=2.0)
        ax.set_title(_short(name, 40), loc="left")
        ax.set_xlabel("|x|")
        ax.set_ylabel("count")
        handles = [
            ax.plot([], [], color=METHOD_COLORS.get(m, "#6b7280"), lw=2.0 if m == method else 0.9,
                    ls="-" if m == method else ":")[0]
            for m in methods
        ]  # fmt: skip
        ax.legend(
            handles,
            [f"{m} {v:.3g}" + (" (used)" if m == method else "") for m, v in methods.items()],
            fontsize=6.5,
            frameon=True,
            framealpha=0.92,
            edgecolor="none",
            loc="upper right",
        )
        return _svg(fig)


def _short(text: str, limit: int = 28) -> str:
    return text if len(text) <= limit else "…" + text[-(limit - 1) :]
