"""``qdq lint``: print the linter's verdict (and, with an engine report, what TensorRT really did)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

__all__ = ["run_lint"]

logger = logging.getLogger(__name__)


def run_lint(
    model: str,
    *,
    target: str,
    as_json: bool,
    engine: str | None,
    strongly_typed: bool | None = None,
    flags: list[str] | None = None,
    show_layers: bool = False,
    draw: str | None = None,
) -> int:
    """Lint ``model``; return 0 clean, 1 warnings, 2 errors, 3 when an input cannot be read (or
    the ``draw`` SVG of the predicted engine cannot be made).

    Every failure is one line on stderr naming the file and what is wrong; the traceback is logged
    at debug level (``qdq -v lint ...``).
    """
    from qdq.lint.diff import diff_engine
    from qdq.lint.draw import DrawError
    from qdq.lint.engine_report import load_engine_report
    from qdq.lint.report import lint
    from qdq.lint.text import printable, printable_text

    try:
        if draw is not None and (Path(draw).suffix.lower() != ".svg" or Path(draw).is_dir()):
            raise ValueError(f"--draw {draw}: the drawing must be an .svg file")
        report = lint(model, target=target, strongly_typed=strongly_typed, flags=flags)
        diff = diff_engine(report, load_engine_report(engine)) if engine else None
        if draw is not None:
            _draw(model, report, diff, draw)
    except (OSError, ValueError, DrawError) as err:  # LintInputError, engine report, options
        logger.debug("qdq lint %s failed", model, exc_info=True)
        print(f"qdq lint: error: {printable(_one_line(err))}", file=sys.stderr)
        return 3
    except Exception as err:  # a linter bug outside the guarded rule steps
        logger.debug("qdq lint %s failed", model, exc_info=True)
        print(
            f"qdq lint: error: {printable(model)}: the linter failed ({type(err).__name__}: "
            f"{printable(_one_line(err))}); this is a bug, `qdq -v lint` prints the traceback",
            file=sys.stderr,
        )
        return 3
    if as_json:
        doc: dict[str, Any] = report.to_dict()
        if diff is not None:
            doc["engine"] = {"path": engine, **diff.to_dict()}
        print(json.dumps(doc, indent=2))
    else:
        print(printable_text(report.format(show_layers)))  # names from the file: escaped
        if diff is not None:
            print(printable_text(diff.format()))
    return report.exit_code


def _draw(model: str, report: Any, diff: Any, out: str) -> None:
    from qdq._io import atomic_write_text
    from qdq.lint.engine_pages import predicted_svg

    svg = predicted_svg(model, report, diff, title=f"{Path(model).name}: predicted engine")
    atomic_write_text(out, '<?xml version="1.0" encoding="UTF-8"?>\n' + svg + "\n")
    logger.info("wrote %s", out)


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text or type(err).__name__
