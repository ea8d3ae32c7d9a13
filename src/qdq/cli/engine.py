"""``qdq engine draw | diff | compare | report | time``: views of real TensorRT engine reports
(``time``: :mod:`qdq.cli.engine_time`).

Exit codes: 0 done (``diff``: and the prediction agrees with the engine), 1 ``diff`` found
disagreements, 2 bad options (argparse), 3 an input cannot be read or the drawing cannot be made
(Graphviz missing; ``report``: jinja2 or matplotlib missing). Every failure is one line on
stderr; ``qdq -v engine ...`` logs the traceback.

The reports are someone else's files: they are read within the limits of
:mod:`qdq.lint.untrusted_json`, names are printed with control characters made visible
(:func:`qdq.lint.text.visible`), and ``report`` reads and writes only inside OUT (the paths
in ``OUT/report.json`` are resolved, symbolic links included, and must stay inside it).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["add_engine_parser", "run_engine"]

logger = logging.getLogger(__name__)


def add_engine_parser(sub: Any) -> None:
    """Register ``qdq engine`` and its sub-commands on the ``qdq`` sub-parsers ``sub``."""
    engine = sub.add_parser(
        "engine",
        help="draw, diff and compare real TensorRT engines (trtexec --exportLayerInfo JSON)",
        description="Views of trtexec --exportLayerInfo (and --exportProfile) JSON, TensorRT "
        "8.6-11. Exit code: 0 done, 1 diff found disagreements, 3 an input cannot be read or "
        "Graphviz is missing.",
    )
    verbs = engine.add_subparsers(dest="engine_command", required=True)
    draw = verbs.add_parser(
        "draw",
        help="draw an engine: layers by precision, tensors, reformats, latency shares (SVG)",
        description="Draw the engine with Graphviz: one box per engine layer (fused ONNX nodes, "
        "type, input/output precision and format, latency share with --profile), filled by "
        "precision; unfused Q/DQ as violet ellipses, builder reformats as blue hexagons; edges "
        "labelled with shape, precision and format. Large engines collapse by module scope.",
    )
    draw.add_argument("layers", metavar="LAYERS.json", help="trtexec --exportLayerInfo JSON")
    draw.add_argument("--profile", metavar="PROFILE.json", help="trtexec --exportProfile JSON")
    draw.add_argument("-o", "--out", required=True, metavar="OUT.svg", help="SVG to write")
    _common(draw)
    diff = verbs.add_parser(
        "diff",
        help="the linter's predicted engine beside the real one, disagreements marked (HTML)",
        description="Lint MODEL.onnx, match its predicted layers with the engine's and write one "
        "HTML page: both drawings side by side, the layers that disagree on INT8 vs float marked "
        "and listed. Exit code 1 when any layer disagrees.",
    )
    diff.add_argument("model", metavar="MODEL.onnx", help="the Q/DQ ONNX the engine was built from")
    diff.add_argument("layers", metavar="LAYERS.json", help="trtexec --exportLayerInfo JSON")
    diff.add_argument("--profile", metavar="PROFILE.json", help="trtexec --exportProfile JSON")
    diff.add_argument("--target", default="trt10", help="linter target (default trt10)")
    diff.add_argument("-o", "--out", required=True, metavar="OUT.html", help="HTML to write")
    _common(diff)
    compare = verbs.add_parser(
        "compare",
        help="two engines side by side: latency by layer type, precision mix, top differences",
        description="Compare engine A with engine B (FP16 vs INT8, --best vs Q/DQ, two "
        "placements): total latency, latency by layer type, precision mix and the layers that "
        "differ most, printed as tables; -o writes the charts (.svg) or a page with the charts "
        "and both engine drawings (.html).",
    )
    compare.add_argument("a", metavar="A.json", help="engine A: trtexec --exportLayerInfo JSON")
    compare.add_argument("b", metavar="B.json", help="engine B: trtexec --exportLayerInfo JSON")
    compare.add_argument(
        "--profiles", nargs=2, metavar=("PA.json", "PB.json"), help="their --exportProfile JSON"
    )
    compare.add_argument("--names", nargs=2, metavar=("A", "B"), help="names for the tables")
    compare.add_argument("--top", type=int, default=10, help="most different layers (10)")
    compare.add_argument("--json", action="store_true", help="print one JSON object")
    compare.add_argument("-o", "--out", metavar="OUT.svg|OUT.html", help="charts or page")
    _common(compare)
    report = verbs.add_parser(
        "report",
        help="add a real engine to the report.html of qdq quantize",
        description="Rewrite OUT/report.html of `qdq quantize` (from OUT/report.json and the "
        "exported ONNX there) with the engine TensorRT built from that ONNX drawn beside the "
        "prediction, the layers where they disagree marked in both.",
    )
    report.add_argument("out_dir", metavar="OUT", help="the output directory of qdq quantize")
    report.add_argument("layers", metavar="LAYERS.json", help="trtexec --exportLayerInfo JSON")
    report.add_argument("--profile", metavar="PROFILE.json", help="trtexec --exportProfile JSON")
    report.add_argument(
        "--max-nodes", type=int, default=80, help="collapse by module scope past N layers (80)"
    )
    from qdq.cli.engine_time import add_time_parser

    add_time_parser(verbs)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-nodes", type=int, default=150, help="collapse by module scope past N layers (150)"
    )


def run_engine(args: argparse.Namespace) -> int:
    """Run ``qdq engine <verb>``; see the module docstring for the exit codes."""
    verbs: dict[str, Callable[[argparse.Namespace], int]] = {
        "draw": _draw,
        "diff": _diff,
        "compare": _compare,
        "report": _report,
        "time": _time,
    }
    prog = f"qdq engine {args.engine_command}"
    if args.engine_command == "time":
        return _time(args)
    if args.max_nodes < 2:
        print(f"{prog}: error: --max-nodes must be >= 2, got {args.max_nodes}", file=sys.stderr)
        return 2
    if getattr(args, "top", 0) < 0:
        print(f"{prog}: error: --top must be >= 0, got {args.top}", file=sys.stderr)
        return 2
    from qdq.lint.draw import DrawError

    try:
        return verbs[args.engine_command](args)
    except (OSError, ValueError, DrawError, ImportError) as err:  # bad input, no dot / jinja2
        logger.debug("%s failed", prog, exc_info=True)
        print(f"{prog}: error: {_one_line(err)}", file=sys.stderr)
        return 3


def _time(args: argparse.Namespace) -> int:
    from qdq.cli.engine_time import run_time

    return run_time(args)


def _one_line(err: BaseException) -> str:
    from qdq.lint.text import visible

    return visible(" ".join(str(err).split()), keep="") or type(err).__name__


def _say(text: str) -> None:
    """Print ``text`` (names from the reports in it) with control characters made visible."""
    from qdq.lint.text import visible

    print(visible(text))


def _name(path: str) -> str:
    name = Path(path).name
    for suffix in (".graph.json", ".layers.json", ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _check_out(out: str, suffixes: tuple[str, ...]) -> Path:
    path = Path(out)
    if path.suffix.lower() not in suffixes:
        raise ValueError(f"{out}: the output must end in {' or '.join(suffixes)}")
    if path.is_dir():
        raise ValueError(f"{out} is a directory")
    return path


def _draw(args: argparse.Namespace) -> int:
    from qdq._io import atomic_write_text
    from qdq.lint.engine_draw import draw_engine_svg
    from qdq.lint.engine_report import load_engine_report

    out = _check_out(args.out, (".svg",))
    engine = load_engine_report(args.layers, args.profile)
    svg = draw_engine_svg(engine, max_nodes=args.max_nodes, title=_name(args.layers))
    atomic_write_text(out, '<?xml version="1.0" encoding="UTF-8"?>\n' + svg + "\n")
    _say(f"wrote {out} ({len(engine.layers)} engine layers)")
    return 0


def _diff(args: argparse.Namespace) -> int:
    from qdq._io import atomic_write_text
    from qdq.lint.diff import diff_engine
    from qdq.lint.engine_pages import diff_page, engine_svg, predicted_svg
    from qdq.lint.engine_report import load_engine_report
    from qdq.lint.report import lint

    out = _check_out(args.out, (".html", ".htm"))
    engine = load_engine_report(args.layers, args.profile)
    report = lint(args.model, target=args.target)
    diff = diff_engine(report, engine)
    model_name, engine_name = Path(args.model).name, _name(args.layers)
    predicted = predicted_svg(args.model, report, diff, max_nodes=args.max_nodes)
    real = engine_svg(engine, diff, max_nodes=args.max_nodes)
    atomic_write_text(out, diff_page(model_name, engine_name, diff, predicted, real))
    _say(diff.format())
    _say(f"wrote {out}")
    return 1 if diff.mismatches or diff.only_predicted or diff.only_engine else 0


def _compare(args: argparse.Namespace) -> int:
    from qdq._io import atomic_write_text
    from qdq.lint.compare import compare_engines
    from qdq.lint.compare_draw import comparison_svg
    from qdq.lint.engine_report import load_engine_report

    out = _check_out(args.out, (".svg", ".html", ".htm")) if args.out else None
    profiles = args.profiles or (None, None)
    a = load_engine_report(args.a, profiles[0])
    b = load_engine_report(args.b, profiles[1])
    names = tuple(args.names) if args.names else (_name(args.a), _name(args.b))
    c = compare_engines(a, b, names=(names[0], names[1]), top=args.top)
    _say(c.to_json() if args.json else c.format())
    if out is not None:
        charts = comparison_svg(c)
        if out.suffix.lower() == ".svg":
            atomic_write_text(out, '<?xml version="1.0" encoding="UTF-8"?>\n' + charts + "\n")
        else:
            from qdq.lint.engine_draw import draw_engine_svg
            from qdq.lint.engine_pages import compare_page

            svgs = [draw_engine_svg(e, max_nodes=args.max_nodes) for e in (a, b)]
            atomic_write_text(out, compare_page(c, charts, svgs[0], svgs[1]))
        if not args.json:
            _say(f"wrote {out}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from qdq.lint.engine_report import load_engine_report
    from qdq.report import write_html

    out_dir = Path(args.out_dir)
    report_path = out_dir / "report.json"
    if not out_dir.is_dir() or not report_path.is_file():
        raise FileNotFoundError(f"{out_dir}: no report.json (the output directory of qdq quantize)")
    report_path = _confined(out_dir, "report.json", "report.json", out_dir)
    report = _read_report(report_path)
    files = report.get("files")
    if files is None:
        files = {}
    if not isinstance(files, dict):
        raise ValueError(f"{report_path}: 'files' must be an object, got {_json_kind(files)}")
    onnx_name = files.get("onnx") if files.get("onnx") is not None else "model.qdq.onnx"
    onnx_path = _confined(out_dir, onnx_name, "files.onnx", report_path)
    if not onnx_path.is_file():
        raise FileNotFoundError(f"{out_dir}: no exported model {onnx_path.name}")
    html_name = files.get("html") if files.get("html") is not None else "report.html"
    html = _confined(out_dir, html_name, "files.html", report_path)
    if html.suffix.lower() not in (".html", ".htm") or html.is_dir():
        raise ValueError(
            f"{report_path}: 'files.html' must name an .html file in {out_dir}, got {html_name!r}"
        )
    engine = load_engine_report(args.layers, args.profile)
    write_html(report, html, onnx_path=onnx_path, max_nodes=args.max_nodes, engine=engine)
    shown = html.relative_to(out_dir.resolve())
    _say(
        f"wrote {out_dir / shown} (with the {len(engine.layers)}-layer engine {_name(args.layers)})"
    )
    return 0


def _read_report(path: Path) -> dict[str, Any]:
    """``OUT/report.json``, within the limits of :mod:`qdq.lint.untrusted_json`, with the fields
    that the page's fallback reads checked (the rest the page renders defensively)."""
    from qdq.lint.untrusted_json import load_json

    report = load_json(path, "report JSON")
    if not isinstance(report, dict):
        raise ValueError(f"{path}: report.json must be a JSON object, got {_json_kind(report)}")
    if report.get("model") is not None and not isinstance(report["model"], dict):
        raise ValueError(f"{path}: 'model' must be an object, got {_json_kind(report['model'])}")
    errors = report.get("stage_errors")
    if errors is not None and not (
        isinstance(errors, list)
        and all(
            isinstance(e, dict)
            and all(isinstance(e.get(k), str) for k in ("stage", "error", "message"))
            for e in errors
        )
    ):
        raise ValueError(
            f"{path}: 'stage_errors' must be a list of objects with string 'stage', 'error' and "
            "'message'"
        )
    return report


def _confined(out_dir: Path, name: Any, key: str, source: Path) -> Path:
    """``out_dir / name`` resolved (symbolic links followed), refused unless it lies inside
    ``out_dir``: ``name`` comes from a file someone else may have written."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{source}: {key!r} must be a non-empty path, got {_json_kind(name)}")
    shown = repr(name) if len(name) <= 80 else repr(name[:77]) + "..."
    if "\x00" in name or Path(name).is_absolute() or ".." in Path(name).parts:
        raise ValueError(
            f"{source}: {key!r} is {shown}: a path from the report must be relative to {out_dir}, "
            "without '..'"
        )
    root = out_dir.resolve()
    try:
        path = (root / name).resolve()
    except (OSError, RuntimeError) as err:  # a symbolic-link loop
        raise ValueError(f"{source}: {key!r} is {shown}, which cannot be resolved: {err}") from None
    if not path.is_relative_to(root):
        raise ValueError(
            f"{source}: {key!r} is {shown}, which leads to {path}, outside {out_dir} (a symbolic "
            "link); refused"
        )
    return path


def _json_kind(value: Any) -> str:
    from qdq.lint.engine_fields import json_kind

    return json_kind(value)
