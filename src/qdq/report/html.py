"""``report.json`` → ``report.html``: the view model of every section, then the jinja2 template."""

from __future__ import annotations

import datetime
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qdq._io import atomic_write_text
from qdq.lint.engine_report import EngineReport
from qdq.lint.report import LintReport
from qdq.pipeline.outputs import PSNR_CAP
from qdq.pipeline.report import STAGE_LABELS, format_label, stage_error
from qdq.ptq.step import STEPS

__all__ = ["check_dependencies", "render_html", "write_html"]

_log = logging.getLogger(__name__)
_TEMPLATE = "report.html.j2"
_PERCENT_METRICS = (
    "top1_accuracy",
    "top1_agreement",
    "pixel_agreement",
    "box_agreement",
    "detection_f1",
)
_SEVERITY_ORDER = ("ERROR", "WARN", "INFO")
#: headline metrics in dB (the PSNR of an image output, at most PSNR_CAP)
_DB_METRICS = ("psnr",)
#: an INT8 PSNR below this is shown as bad
_PSNR_BAD_DB = 30.0


def check_dependencies() -> None:
    """Raise ``ImportError`` naming what the HTML report needs and is not installed."""
    missing = []
    for module in ("jinja2", "matplotlib"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise ImportError(
            f"the HTML report needs {' and '.join(missing)}: pip install 'qdq[report]'"
        )


def write_html(
    report: Mapping[str, Any],
    path: str | Path,
    *,
    onnx_path: str | Path | None = None,
    max_nodes: int = 80,
    engine: EngineReport | None = None,
    failures: list[dict[str, str]] | None = None,
) -> Path:
    """Write the page for ``report`` to ``path`` and return it.

    The page's own parts (the model drawing, the engine views, the plots) cannot stop it: a part
    that raises is left out, the page says which and why, and the failure is appended to
    ``failures`` (``{"stage", "error", "message"}``, as ``report.json``'s ``stage_errors``). Should
    the page itself fail to render, a plain page with the headline figures and the error is
    written instead.

    Args:
        report: the content of ``report.json``.
        path: the ``.html`` file to write.
        onnx_path: the exported Q/DQ ONNX, drawn with the report's ``predicted_layers`` (without
            it, or without Graphviz, the page says why there is no drawing).
        max_nodes: above this many layers a drawing is collapsed by module scope.
        engine: a real engine report of this model (trtexec ``--exportLayerInfo``, parsed by
            :func:`qdq.lint.load_engine_report`): the page also draws what TensorRT built and
            marks, in both drawings, the layers where prediction and engine disagree.
        failures: where the parts that failed are recorded (a new list if ``None``).
    """
    from qdq.lint.draw import DrawError

    failed = [] if failures is None else failures
    svg, note = None, "no ONNX model was given to draw"
    real: dict[str, Any] | None = None
    diff = None
    if engine is not None:
        try:
            from qdq.lint.diff import diff_engine
            from qdq.lint.engine_pages import engine_svg

            diff = diff_engine(_lint_report(report), engine)
            real = {"svg": None, "note": "", "summary": diff.format()}
            try:
                real["svg"] = engine_svg(engine, diff, max_nodes=max_nodes)
            except DrawError as err:
                real["note"] = str(err)
        except Exception as err:  # a view of the report, never a reason to lose it
            failed.append(_failure("engine_views", err))
            real = {"svg": None, "note": f"the engine views failed: {err}", "summary": ""}
    if onnx_path is not None and report.get("lint") is None:
        note = "the lint stage failed (see the stages that failed), so there is no prediction"
    elif onnx_path is not None:
        try:
            from qdq.lint.engine_pages import predicted_svg

            svg = predicted_svg(onnx_path, _lint_report(report), diff, max_nodes=max_nodes)
        except DrawError as err:
            note = str(err)
            _log.warning("report.html without the model drawing: %s", err)
        except Exception as err:
            failed.append(_failure("drawing", err))
            note = f"the drawing failed: {type(err).__name__}: {err}"
    out = Path(path)
    try:
        page = render_html(report, graph_svg=svg, graph_note=note, engine=real, failures=failed)
    except ImportError:
        raise
    except Exception as err:
        failed.append(_failure("html", err))
        page = _plain_page(report, failed)
    atomic_write_text(out, page)
    return out


def _failure(stage: str, err: BaseException) -> dict[str, str]:
    _log.debug("report.html: %s failed", stage, exc_info=err)
    return stage_error(stage, err)


def _plain_page(report: Mapping[str, Any], failed: list[dict[str, str]]) -> str:
    """The page when the full one could not be rendered: headline figures and what failed."""
    from html import escape

    rows = "".join(
        f"<li><b>{escape(e['stage'])}</b>: <code>{escape(e['error'])}</code> "
        f"{escape(e['message'])}</li>"
        for e in [*(report.get("stage_errors") or []), *failed]
    )
    metric = escape(str(report.get("metric_name")))
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>qdq report</title></head><body>"
        f"<h1>qdq report: {escape(str((report.get('model') or {}).get('spec')))}</h1>"
        f"<p>{metric}: FP32 {report.get('fp32_metric')} · "
        f"{escape(format_label((report.get('settings') or {}).get('format')))} "
        f"{report.get('int8_metric')} "
        "(the exported ONNX in ONNX Runtime)</p>"
        "<p>The full page could not be rendered; everything measured is in report.json.</p>"
        f"<h2>Stages that failed</h2><ul>{rows}</ul></body></html>\n"
    )


def _lint_report(report: Mapping[str, Any]) -> LintReport:
    """The prediction of ``report.json`` as a :class:`~qdq.lint.LintReport` (layers, summary)."""
    from qdq.lint.draw import predicted_layer
    from qdq.lint.report import LintReport

    settings = report.get("settings") or {}
    return LintReport(
        str((report.get("files") or {}).get("onnx", "")),
        str(settings.get("target", "trt10")),
        (),
        dict(report.get("lint") or {}),
        tuple(predicted_layer(d) for d in report.get("predicted_layers") or []),
    )


def render_html(
    report: Mapping[str, Any],
    *,
    graph_svg: str | None = None,
    graph_note: str = "",
    engine: Mapping[str, Any] | None = None,
    failures: list[dict[str, str]] | None = None,
) -> str:
    """The page as one string (inline CSS, JavaScript and SVG; it references no URL).

    Args:
        report: the content of ``report.json``.
        graph_svg: the model drawing (:func:`qdq.lint.draw.draw_svg`), or ``None``.
        graph_note: why there is no drawing (shown instead of it).
        engine: the real engine section, if an engine report was given: ``svg`` (its drawing,
            or ``None``), ``note`` (why there is none) and ``summary`` (prediction vs engine).
        failures: parts that failed so far; a plot that fails here is left out and appended.

    Raises:
        ImportError: jinja2 or matplotlib is missing.
    """
    check_dependencies()
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(Path(__file__).parent / "templates")),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = _num
    env.filters["pct"] = _pct
    failed = [] if failures is None else failures
    context = _context(report, failed)
    context["stage_errors"] = [*(report.get("stage_errors") or []), *failed]
    context["graph_svg"] = None if graph_svg is None else jinja2.filters.Markup(graph_svg)
    context["graph_note"] = graph_note
    context["engine"] = None
    if engine is not None:
        context["engine"] = {
            "svg": None if engine.get("svg") is None else jinja2.filters.Markup(engine["svg"]),
            "note": str(engine.get("note") or ""),
            "summary": str(engine.get("summary") or ""),
        }
    return env.get_template(_TEMPLATE).render(**context)


# ------------------------------------------------------------------------------ view model
#: what the page shows of the lint summary when the lint stage failed
_NO_LINT = dict.fromkeys(
    ("int8_weighted_layers", "weighted_layers", "int8_flops_percent", "unfused_qdq",
     "float_islands", "scale_mismatches", "alignment_reformats"),
    "-",
)  # fmt: skip


def _guarded(stage: str, failed: list[dict[str, str]], fn: Any, *args: Any) -> Any:
    """``fn(*args)``, or ``None`` with the failure recorded (a plot never stops the page)."""
    try:
        return fn(*args)
    except Exception as err:
        failed.append(_failure(stage, err))
        return None


def _context(r: Mapping[str, Any], failed: list[dict[str, str]]) -> dict[str, Any]:
    metric = str(r["metric_name"])
    fmt = _metric_formatter(metric)
    fp32, int8 = float(r["fp32_metric"]), float(r["int8_metric"])
    lint = r["lint"] or _NO_LINT
    errors = r.get("layer_errors") or None
    return {
        "qlabel": format_label((r.get("settings") or {}).get("format")),
        "r": r,
        "lint": lint,
        "title": str(r["model"]["spec"]).replace("\\", "/").rsplit("/", 1)[-1],
        "generated": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "metric": metric,
        "metric_label": metric.replace("_", " "),
        "fp32": fmt(fp32),
        "int8": fmt(int8),
        "delta": _delta(metric, int8 - fp32),
        "delta_bad": _delta_bad(metric, fp32, int8),
        "degenerate": (r.get("fp32") or {}).get("degenerate") or [],
        "coverage": f"{lint['int8_weighted_layers']}/{lint['weighted_layers']}",
        "verdict": r["lint_verdict"],
        "methods": _methods(r, fmt),
        "headline": r.get("headline"),
        "outputs": _outputs(r),
        "timings": _timings(r),
        "budget": r.get("budget"),
        "budget_clock": _budget_clock(r.get("budget")),
        "errors": errors,
        "error_rows": [] if errors is None else [_error_row(e) for e in errors["rows"]],
        "profile_svg": _guarded("plots", failed, _profile, errors),
        "histograms": _guarded("plots", failed, _histograms, errors) or [],
        "points": _points(r),
        "plan_counts": _plan_counts(r),
        "findings": _findings(r),
        "severity_counts": {
            s: sum(1 for f in r["lint_findings"] if f["severity"] == s) for s in _SEVERITY_ORDER
        },
        "predicted": _predicted(r),
        "ptq_steps": _ptq_steps(r),
        "eq_rows": ((r.get("ptq") or {}).get("equalize") or {}).get("rows", []),
        "latency": _guarded("plots", failed, _latency, r),
    }


def _latency(r: Mapping[str, Any]) -> dict[str, Any] | None:
    from qdq.report.speed import latency_view

    return latency_view(r)


#: report.json's PTQ step keys in pipeline order (each step's report has a one-line summary)
_PTQ_STEPS = tuple(s.key for s in STEPS)


def _ptq_steps(r: Mapping[str, Any]) -> list[str]:
    """The one-line summary of each PTQ step that ran, in pipeline order."""
    ptq = r.get("ptq") or {}
    return [str(ptq[k].get("summary", k)) for k in _PTQ_STEPS if isinstance(ptq.get(k), Mapping)]


def _metric_formatter(metric: str) -> Any:
    if metric in _PERCENT_METRICS:
        return lambda v: "-" if v is None else f"{100 * v:.2f} %"
    if metric in _DB_METRICS:
        return lambda v: "-" if v is None else f"{v:.2f} dB"
    return lambda v: "-" if v is None else f"{v:.5f}"


def _delta(metric: str, d: float) -> str:
    if metric in _DB_METRICS:
        return f"{d:+.2f} dB"
    return f"{100 * d:+.2f} pt" if metric in _PERCENT_METRICS else f"{d:+.5f}"


def _delta_bad(metric: str, fp32: float, int8: float) -> bool:
    """Whether the INT8 figure is shown as bad: a point of agreement lost, a PSNR below 30 dB
    (FP32's own is the cap), a cosine-like figure below 0.99."""
    if metric in _PERCENT_METRICS:
        return int8 - fp32 < -0.01
    return int8 < _PSNR_BAD_DB if metric in _DB_METRICS else int8 < 0.99


def _num(value: Any, digits: int = 2) -> str:
    if value is None:
        return "∞"
    if isinstance(value, float) and not math.isfinite(value):
        return "∞" if value > 0 else "-∞"
    return f"{value:.{digits}f}"


def _pct(value: Any, digits: int = 1) -> str:
    return "-" if value is None else f"{100 * float(value):.{digits}f} %"


def _methods(r: Mapping[str, Any], fmt: Any) -> list[dict[str, Any]]:
    metric = str(r["metric_name"])
    fp32 = float(r["fp32_metric"])
    used = r["settings"]["method"]
    qlabel = format_label(r["settings"].get("format"))
    table = r.get("calibration_methods") or {used: r["int8_torch"]}
    rows = [
        {
            "name": "FP32 (torch)",
            "value": fmt(fp32),
            "raw": fp32,
            "delta": "",
            "agreement": None,
            "cosine": None,
            "kind": "fp32",
        },
        {
            "name": f"{qlabel} {used}, exported (ONNX Runtime)",
            "value": fmt(r["int8_metric"]),
            "raw": float(r["int8_metric"]),
            "delta": _delta(metric, float(r["int8_metric"]) - fp32),
            "agreement": r["int8"]["top1_agreement"],
            "cosine": r["int8"]["cosine_mean"],
            "kind": "exported",
        },
    ]
    for method, s in table.items():
        rows.append(
            {
                "name": f"{qlabel} {method} (torch fake-quant)",
                "value": fmt(s["metric"]),
                "raw": float(s["metric"]),
                "delta": _delta(metric, float(s["metric"]) - fp32),
                "agreement": s["top1_agreement"],
                "cosine": s["cosine_mean"],
                "kind": "used" if method == used else "method",
            }
        )
    if metric in _DB_METRICS:  # dB up to the cap (FP32's own)
        for row in rows:
            row["bar"] = max(2.0, 100 * min(max(row["raw"], 0.0), PSNR_CAP) / PSNR_CAP)
        return rows
    low = min(min(row["raw"] for row in rows), fp32)
    floor = max(0.0, low - 0.1 * (1.0 - low) - 0.02) if low > 0.5 else 0.0
    for row in rows:
        row["bar"] = max(2.0, 100 * (row["raw"] - floor) / max(1e-9, 1.0 - floor))
    return rows


def _outputs(r: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The rows of ``report.json: outputs``, their figure formatted (agreements in percent)."""
    rows = []
    for row in r.get("outputs") or []:
        value = row["value"]
        if row["figure"] in _DB_METRICS:
            shown = f"{_num(value, 2)} dB (min {_num(row.get('psnr_min'), 2)})"
        else:
            shown = _pct(value, 2) if row["figure"] in _PERCENT_METRICS else _num(value, 6)
        rows.append(
            {
                **row,
                "label": row["name"] or f"output {row['index']}",
                "shape_text": "×".join(str(d) for d in row["shape"]) or "scalar",
                "figure_label": str(row["figure"]).replace("_", " "),
                "reason": row.get("kind_reason") or "",
                "shown": shown,
            }
        )
    return rows


def _timings(r: Mapping[str, Any]) -> list[dict[str, Any]]:
    timings = r["timings_s"]
    total = max(1e-9, sum(timings.values()))
    top = max(timings.values(), default=1.0) or 1.0
    return [
        {
            "stage": STAGE_LABELS.get(name, name),
            "key": name,
            "seconds": seconds,
            "share": seconds / total,
            "bar": 100 * seconds / top,
        }
        for name, seconds in timings.items()
    ]


def _error_row(e: Mapping[str, Any]) -> dict[str, Any]:
    from qdq.report.plots import sqnr_color

    acc = e["accumulated"]
    weight, output, upstream = e.get("weight"), e.get("output"), e.get("upstream")
    isolated = e.get("isolated")
    return {
        **e,
        "isolated_sqnr": None if isolated is None else isolated["sqnr_db"],
        "has_isolated": isolated is not None,
        "upstream_sqnr": None if upstream is None else upstream["sqnr_db"],
        "has_upstream": upstream is not None,
        "sqnr": acc["sqnr_db"],
        "color": sqnr_color(acc["sqnr_db"]),
        "weight_sqnr": None if weight is None else weight["sqnr_db"],
        "has_weight": weight is not None,
        "output_sqnr": None if output is None else output["sqnr_db"],
        "has_output": output is not None,
    }


def _profile(errors: Mapping[str, Any] | None) -> str | None:
    if not errors or not errors["rows"]:
        return None
    from qdq.report.plots import sqnr_profile_svg

    rows = sorted(errors["rows"], key=lambda e: e["order"])
    return sqnr_profile_svg([e["name"] for e in rows], [e["accumulated"]["sqnr_db"] for e in rows])


def _histograms(errors: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    if not errors:
        return []
    from qdq.report.plots import histogram_svg

    out = []
    for e in errors["rows"]:
        h = e.get("histogram")
        if not h:
            continue
        svg = histogram_svg(
            e["name"], h["bin_width"], h["counts"], h["amax"], h["method"], h["methods"]
        )
        out.append({"row": e, "h": h, "svg": svg})
    return out


def _points(r: Mapping[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for p in r["plan"]["points"]:
        rule = p["share_rule"] if p["decision"] == "share" and p["share_rule"] else p["rule"]
        spec = p.get("spec") or {}
        fmt = str(spec.get("format", "")).upper() if p["decision"] != "skip" else ""
        if fmt and spec.get("block_size"):  # a block format: its elements per scale
            fmt = f"{fmt}/{spec['block_size']}"
        if fmt and p.get("format_rule"):
            fmt = f"{fmt} ({p['format_rule']})"
        rows.append({**p, "shown_rule": rule, "shown_format": fmt})
    return rows


def _plan_counts(r: Mapping[str, Any]) -> dict[str, int]:
    counts = {"quantize": 0, "share": 0, "skip": 0}
    for p in r["plan"]["points"]:
        counts[p["decision"]] = counts.get(p["decision"], 0) + 1
    return counts


def _findings(r: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Findings of one rule with the same effect and fix as one card listing every message."""
    order = {s: i for i, s in enumerate(_SEVERITY_ORDER)}
    cards: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for f in r["lint_findings"]:
        key = (f["severity"], f["rule"], f["effect"], f["fix"])
        card = cards.setdefault(key, {**f, "messages": [], "all_nodes": []})
        card["messages"].append(f["message"])
        card["all_nodes"].extend(n for n in f["nodes"] if n not in card["all_nodes"])
    return sorted(cards.values(), key=lambda c: (order.get(c["severity"], 9), c["rule"]))


def _predicted(r: Mapping[str, Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for ly in r.get("predicted_layers") or []:
        key = "qdq" if ly["kind"] == "qdq" else ly["input_precision"]
        counts[key] = counts.get(key, 0) + 1
    return counts


def _budget_clock(b: dict[str, Any] | None) -> dict[str, Any]:
    """The budget's plan against what was spent, and whether the result depended on the clock
    (the page's headline of the budget)."""
    if not b or b.get("seconds") is None:
        return {}
    clock = b.get("clock") or {}
    seconds = float(b["seconds"])
    return {
        "ratio": float(b["spent"]) / seconds if seconds > 0 else None,
        "ceiling": b.get("ceiling"),
        "depended": bool(clock.get("depended")),
        "cut": list(clock.get("cut") or []),
        "reproduce": clock.get("reproduce"),
    }
