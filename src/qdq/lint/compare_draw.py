"""Bar charts of an :class:`~qdq.lint.compare.EngineComparison` as one SVG (no dependency).

Four panels, top to bottom: total latency of A and B; latency by layer type (A and B bars side
by side); the precision mix (each engine's latency split by compute precision, in the engine
drawing's colours, with layer counts); the layers that differ most (B − A, slower in B to the
right). Without a profile the latency panels say so and the precision mix counts layers.

Example:
    >>> from qdq.lint.compare import EngineComparison
    >>> c = EngineComparison(("a", "b"), (1, 1), (None, None), (), {}, {}, "order", ())
    >>> comparison_svg(c).startswith("<svg")
    True
"""

from __future__ import annotations

from html import escape as _html_escape

from qdq.lint.compare import EngineComparison
from qdq.lint.draw import PRECISION_COLORS
from qdq.lint.text import visible

__all__ = ["ENGINE_COLORS", "comparison_svg"]

#: bar colours of engine A and engine B
ENGINE_COLORS = ("#7b8794", "#2b7bb9")
_W, _LABEL, _ROW, _FONT = 860, 300, 18, "Helvetica, Arial, sans-serif"


def comparison_svg(c: EngineComparison) -> str:
    """The comparison's charts as an inline ``<svg>`` string (see the module docstring)."""
    parts: list[str] = []
    y = 10
    y = _title(parts, y, f"A = {c.names[0]}  ·  B = {c.names[1]}", size=14)
    ta, tb = c.total_ms
    timed = ta is not None and tb is not None
    y = _title(parts, y + 6, "total latency (sum of layer medians, ms)")
    if timed:
        top = max(ta or 0.0, tb or 0.0) or 1.0
        for k, value in enumerate((ta or 0.0, tb or 0.0)):
            y = _bar(parts, y, f"{'AB'[k]}  {c.names[k]}", value, top, ENGINE_COLORS[k])
    else:
        y = _note(parts, y, "no profile: pass the --exportProfile JSON of both engines")
    y = _title(parts, y + 10, "latency by layer type (ms): A grey, B blue")
    if timed:
        top = max([r.ms_a or 0.0 for r in c.by_type] + [r.ms_b or 0.0 for r in c.by_type] + [1e-9])
        for r in c.by_type:
            y = _bar(parts, y, f"{r.layer_type} (n {r.count_a} / {r.count_b})", r.ms_a or 0.0,
                     top, ENGINE_COLORS[0], thin=True)  # fmt: skip
            y = _bar(parts, y, "", r.ms_b or 0.0, top, ENGINE_COLORS[1], thin=True) + 4
    else:
        y = _note(parts, y, "no profile")
    what = "ms" if timed else "layers"
    y = _title(parts, y + 10, f"precision mix of compute layers ({what} by precision)")
    for k in range(2):
        y = _stack(parts, y, c, k, timed)
    y = _legend(parts, y, [p for p in c.precision_mix])
    if c.top:
        y = _title(parts, y + 10, "layers that differ most: B − A (ms), slower in B to the right")
        y = _deltas(parts, y, c)
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{y + 10}" '
        f'viewBox="0 0 {_W} {y + 10}" font-family="{_FONT}" font-size="11">'
    )
    return head + "".join(parts) + "</svg>"


def _text(x: float, y: float, text: str, *, anchor: str = "start", size: int = 11,
          color: str = "#1f2933", bold: bool = False) -> str:  # fmt: skip
    weight = ' font-weight="bold"' if bold else ""
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size}" '
        f'fill="{color}"{weight}>{_escape(text)}</text>'
    )


def _title(parts: list[str], y: int, text: str, *, size: int = 12) -> int:
    parts.append(_text(10, y + size, text, size=size, bold=True))
    return y + size + 8


def _note(parts: list[str], y: int, text: str) -> int:
    parts.append(_text(_LABEL, y + 12, text, color="#5b6573"))
    return y + _ROW


def _bar(parts: list[str], y: int, label: str, value: float, top: float, color: str,
         *, thin: bool = False) -> int:  # fmt: skip
    h = 10 if thin else 14
    width = (_W - _LABEL - 90) * value / top if top > 0 else 0.0
    if label:
        parts.append(_text(_LABEL - 8, y + h - 2, _clip(label, 46), anchor="end"))
    parts.append(
        f'<rect x="{_LABEL}" y="{y}" width="{width:.1f}" height="{h}" fill="{color}">'
        f"<title>{_escape(label)} {value:.3f}</title></rect>"
    )
    parts.append(_text(_LABEL + width + 4, y + h - 2, f"{value:.3f}", size=10))
    return y + h + 2


def _stack(parts: list[str], y: int, c: EngineComparison, k: int, timed: bool) -> int:
    values = [
        (p, (c.precision_ms[p][k] or 0.0) if timed else float(c.precision_mix[p][k]))
        for p in c.precision_mix
    ]
    total = sum(v for _, v in values)
    scale = max(
        sum((c.precision_ms[p][j] or 0.0) if timed else c.precision_mix[p][j]
            for p in c.precision_mix)
        for j in range(2)
    ) or 1.0  # fmt: skip
    parts.append(_text(_LABEL - 8, y + 13, f"{'AB'[k]}  {_clip(c.names[k], 40)}", anchor="end"))
    x = float(_LABEL)
    for p, v in values:
        if v <= 0:
            continue
        width = (_W - _LABEL - 90) * v / scale
        fill, border = PRECISION_COLORS.get(p, ("#e5e7eb", "#6b7280"))
        n = c.precision_mix[p][k]
        parts.append(
            f'<rect x="{x:.1f}" y="{y}" width="{width:.1f}" height="18" fill="{fill}" '
            f'stroke="{border}"><title>{p.upper()}: {n} layers'
            + (f", {v:.3f} ms" if timed else "")
            + "</title></rect>"
        )
        if width > 44:
            parts.append(_text(x + width / 2, y + 13, f"{p.upper()} {n}", anchor="middle", size=10))
        x += width
    unit = " ms" if timed else " layers"
    parts.append(_text(x + 4, y + 13, f"{total:.3f}{unit}" if timed else f"{total:.0f}{unit}"))
    return y + 22


def _legend(parts: list[str], y: int, precisions: list[str]) -> int:
    x = float(_LABEL)
    for p in precisions:
        fill, border = PRECISION_COLORS.get(p, ("#e5e7eb", "#6b7280"))
        parts.append(f'<rect x="{x:.1f}" y="{y + 2}" width="10" height="10" fill="{fill}" '
                     f'stroke="{border}"/>')  # fmt: skip
        parts.append(_text(x + 14, y + 11, p.upper(), size=10))
        x += 60
    return y + 16


def _deltas(parts: list[str], y: int, c: EngineComparison) -> int:
    top = max(abs(d.delta_ms) for d in c.top) or 1.0
    mid = _LABEL + (_W - _LABEL - 60) / 2
    half = (_W - _LABEL - 60) / 2 - 50
    y0 = y
    for d in c.top:
        label = f"{d.a or '-'}  vs  {d.b or '-'}"
        parts.append(_text(_LABEL - 8, y + 11, _clip(label, 52), anchor="end", size=10))
        width = half * abs(d.delta_ms) / top
        x = mid if d.delta_ms >= 0 else mid - width
        color = "#c2412f" if d.delta_ms > 0 else "#2a9158"
        parts.append(
            f'<rect x="{x:.1f}" y="{y + 2}" width="{width:.1f}" height="11" fill="{color}">'
            f"<title>{_escape(label)}: {d.delta_ms:+.3f} ms</title></rect>"
        )
        tx = x + width + 4 if d.delta_ms >= 0 else x - 4
        parts.append(_text(tx, y + 11, f"{d.delta_ms:+.3f}", size=10,
                           anchor="start" if d.delta_ms >= 0 else "end"))  # fmt: skip
        y += 16
    parts.append(f'<line x1="{mid:.1f}" y1="{y0}" x2="{mid:.1f}" y2="{y}" stroke="#5b6573"/>')
    return y


def _escape(text: str) -> str:
    """``text`` for SVG: XML's special characters escaped, control characters made visible (XML
    1.0 forbids most; the names come from someone else's report)."""
    return _html_escape(visible(text, keep=""))


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
