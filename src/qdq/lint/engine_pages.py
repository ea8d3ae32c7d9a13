"""Self-contained HTML pages of engine drawings: prediction vs engine, and engine vs engine.

:func:`predicted_svg` draws the linter's prediction with the layers that disagree with an engine
report marked; :func:`engine_svg` does the same for the real engine. :func:`diff_page` puts the
two side by side with the layer-by-layer comparison (``qdq engine diff``); :func:`compare_page`
shows an :class:`~qdq.lint.compare.EngineComparison` as its table, its charts and both engines
(``qdq engine compare -o page.html``). Pages inline every SVG and fetch nothing.

Example:
    >>> from qdq.lint.compare import EngineComparison
    >>> c = EngineComparison(("a", "b"), (0, 0), (None, None), (), {}, {}, "order", ())
    >>> "<html" in compare_page(c, "<svg/>", None, None)
    True
"""

from __future__ import annotations

from html import escape as _html_escape
from pathlib import Path
from typing import Any

from qdq.lint.compare import EngineComparison
from qdq.lint.diff import EngineDiff
from qdq.lint.draw import (
    MARK_COLOR,
    PRECISION_COLORS,
    layer_graph,
    mark_nodes,
    render_svg,
    to_dot,
)
from qdq.lint.engine_draw import draw_engine_svg
from qdq.lint.engine_report import EngineReport
from qdq.lint.report import LintReport
from qdq.lint.text import visible

__all__ = ["compare_page", "diff_page", "engine_svg", "predicted_svg"]


def predicted_svg(
    model: str | Path | Any,
    report: LintReport,
    diff: EngineDiff | None = None,
    *,
    max_nodes: int = 150,
    title: str = "",
) -> str:
    """The predicted engine of ``model``; with ``diff``, its disagreeing layers marked.

    Raises:
        qdq.lint.draw.DrawError: ``dot`` is missing or fails.
    """
    graph = layer_graph(model, report.layers)
    if diff is not None:
        ids = {ly.name: f"L{i}" for i, ly in enumerate(report.layers)}
        marks = {m.predicted: _mismatch(m.engine_input, m.engine_output) for m in diff.mismatches}
        marks.update((n, "not in the engine") for n in diff.only_predicted)
        graph = mark_nodes(graph, {ids[k]: v for k, v in marks.items() if k in ids})
    return render_svg(to_dot(graph, max_nodes=max_nodes, title=title))


def engine_svg(
    engine: EngineReport,
    diff: EngineDiff | None = None,
    *,
    max_nodes: int = 150,
    title: str = "",
) -> str:
    """The real engine; with ``diff``, the layers that disagree with the prediction marked.

    Raises:
        qdq.lint.draw.DrawError: ``dot`` is missing or fails.
    """
    marks: dict[str, str] = {}
    if diff is not None:
        marks = {
            m.engine: _mismatch(m.predicted_input, m.predicted_output, "predicted")
            for m in diff.mismatches
        }
        marks.update((n, "not predicted") for n in diff.only_engine)
    return draw_engine_svg(engine, max_nodes=max_nodes, title=title, marks=marks)


def _escape(text: str) -> str:
    """``text`` for HTML: special characters escaped, control characters made visible."""
    return _html_escape(visible(text))


def _io(src: str, dst: str) -> str:
    return f"{src.upper()} → {dst.upper()}"


def _mismatch(src: str, dst: str, side: str = "engine") -> str:
    return f"{side}: {src.upper()} → {dst.upper()}"


_STYLE = """
body { font-family: Helvetica, Arial, sans-serif; margin: 18px; color: #1f2933; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 24px; }
pre { background: #f5f7fa; padding: 10px; overflow-x: auto; font-size: 12px; }
.cols { display: flex; gap: 16px; align-items: flex-start; }
.col { flex: 1 1 0; min-width: 0; border: 1px solid #d5dbe2; border-radius: 6px; padding: 8px; }
.col h2 { margin-top: 0; } .scroll { overflow: auto; max-height: 88vh; }
.scroll svg { max-width: 100%; height: auto; }
table { border-collapse: collapse; font-size: 13px; }
td, th { border-bottom: 1px solid #e4e7eb; padding: 3px 8px; text-align: left; }
td.p { white-space: nowrap; }
.key span { display: inline-block; padding: 1px 8px; margin-right: 6px; border-radius: 4px;
            border: 1px solid; font-size: 12px; }
"""


def _legend() -> str:
    items = [("int8", "INT8"), ("fp8", "FP8"), ("fp16", "FP16 / BF16"), ("fp32", "FP32"),
             ("qdq", "standalone Q/DQ"), ("reformat", "builder reformat")]  # fmt: skip
    spans = [
        f'<span style="background:{PRECISION_COLORS[k][0]};border-color:{PRECISION_COLORS[k][1]}">'
        f"{text}</span>"
        for k, text in items
    ]
    spans.append(f'<span style="border:3px solid {MARK_COLOR}">disagreement</span>')
    return f'<p class="key">{"".join(spans)}</p>'


def _page(title: str, body: str) -> str:
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_escape(title)}'
        f"</title><style>{_STYLE}</style></head><body><h1>{_escape(title)}</h1>{body}</body></html>\n"
    )


def _column(heading: str, svg: str | None, note: str = "") -> str:
    inner = svg if svg is not None else f"<p>{_escape(note or 'no drawing')}</p>"
    return f'<div class="col"><h2>{_escape(heading)}</h2><div class="scroll">{inner}</div></div>'


def diff_page(
    model_name: str,
    engine_name: str,
    diff: EngineDiff,
    predicted: str,
    real: str,
) -> str:
    """Prediction (left) and engine (right) drawings with the disagreements marked and listed."""
    rows = "".join(
        f'<tr><td>{_escape(m.predicted)}</td><td class="p">{_io(m.predicted_input, m.predicted_output)}'
        f'</td><td>{_escape(m.engine)}</td><td class="p">{_io(m.engine_input, m.engine_output)}</td></tr>'
        for m in diff.mismatches
    )
    rows += "".join(
        f'<tr><td>{_escape(n)}</td><td class="p">not in the engine</td><td></td><td></td></tr>'
        for n in diff.only_predicted
    )
    rows += "".join(
        f'<tr><td></td><td></td><td>{_escape(n)}</td><td class="p">not predicted</td></tr>'
        for n in diff.only_engine
    )
    agree = len(diff.matches) - len(diff.mismatches)
    table = (
        "<table><tr><th>predicted layer</th><th>predicted</th><th>engine layer</th>"
        f"<th>engine</th></tr>{rows}</table>"
        if rows
        else "<p>No disagreement: every matched layer agrees on INT8 / FP8 / float.</p>"
    )
    body = (
        f"<p>{len(diff.matches)} layers matched by {diff.matched_by}, {agree} agree on INT8 / FP8 / "
        f"float; {len(diff.only_predicted)} predicted layers have no engine counterpart, "
        f"{len(diff.only_engine)} engine layers were not predicted.</p>"
        f"<details><summary>as printed by qdq lint --engine-report</summary>"
        f"<pre>{_escape(diff.format())}</pre></details>{_legend()}"
        f"<h2>Disagreements</h2>{table}"
        f'<div class="cols">{_column(f"Predicted: {model_name}", predicted)}'
        f"{_column(f'Engine: {engine_name}', real)}</div>"
    )
    return _page(f"Predicted vs real engine: {model_name}", body)


def compare_page(
    c: EngineComparison,
    charts: str,
    svg_a: str | None,
    svg_b: str | None,
    note: str = "",
) -> str:
    """The comparison's table, its charts and the two engines side by side."""
    body = (
        f"<pre>{_escape(c.format())}</pre>{charts}{_legend()}"
        f'<div class="cols">{_column(f"A: {c.names[0]}", svg_a, note)}'
        f"{_column(f'B: {c.names[1]}', svg_b, note)}</div>"
    )
    return _page(f"Engine comparison: {c.names[0]} vs {c.names[1]}", body)
