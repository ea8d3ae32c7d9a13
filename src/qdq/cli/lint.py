"""``qdq lint``: print the linter's verdict (and, with an engine report, what TensorRT really did;
with ``--latency``, the predicted engine time against the FP16 build: :mod:`qdq.lint.speed`)."""

from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

__all__ = ["parse_shapes", "run_lint"]

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
    latency: bool = False,
    shapes: list[str] | None = None,
    gpu: str | None = None,
) -> int:
    """Lint ``model``; return 0 clean, 1 warnings, 2 errors, 3 when an input cannot be read (or
    the ``draw`` SVG of the predicted engine cannot be made, or the ``latency`` prediction cannot
    be made: no GPU in the target nor ``gpu``, a bad ``--shape``, a dynamic input without one, a
    precision the GPU lacks).

    With ``latency``, the predicted engine time of the linter's layers on the target's GPU (or
    ``gpu``) against the same model built FP16 (:func:`qdq.lint.speed.latency.predict_latency`)
    follows the verdict; ``shapes`` are ``NAME:AxBxC`` sizes of the graph inputs.

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
        if not latency and (shapes or gpu is not None):
            option = "--shape" if shapes else "--gpu"
            raise ValueError(f"{option} is only read with --latency: add --latency, or drop it")
        sizes = parse_shapes(shapes or [])
        report = lint(model, target=target, strongly_typed=strongly_typed, flags=flags)
        diff = diff_engine(report, load_engine_report(engine)) if engine else None
        timed = _latency(model, report, target, gpu, sizes) if latency else None
        if draw is not None:
            _draw(model, report, diff, draw)
    except (
        OSError,
        ValueError,
        TypeError,
        DrawError,
    ) as err:  # LintInputError, engine report, options
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
        if timed is not None:
            _add_latency(doc, timed)
        print(json.dumps(doc, indent=2))
    else:
        print(printable_text(report.format(show_layers)))  # names from the file: escaped
        if diff is not None:
            print(printable_text(diff.format()))
        if timed is not None:
            print(timed.format())  # names escaped by the report
    return report.exit_code


def parse_shapes(specs: list[str]) -> dict[str, tuple[int, ...]]:
    """``["input:32x3x224x224", ...]`` as ``{"input": (32, 3, 224, 224)}``.

    The name is what comes before the last ``:`` (TensorFlow exports name inputs ``x:0``).

    Raises:
        ValueError: a spec without ``NAME:DIMS``, a dimension that is not a positive integer, or
            an input given twice (the message quotes the spec).
    """
    out: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        name, sep, dims = spec.rpartition(":")
        if not sep or not name or not dims:
            raise ValueError(f"--shape {spec!r}: expected NAME:DIMS, such as input:32x3x224x224")
        values = []
        for d in dims.lower().split("x"):
            if not re.fullmatch(r"[+-]?\d+", d.strip()):
                raise ValueError(
                    f"--shape {spec!r}: dimension {d!r} is not an integer "
                    "(dims are separated by x, such as 32x3x224x224)"
                )
            if int(d) <= 0:
                raise ValueError(f"--shape {spec!r}: every dimension must be positive, got {d}")
            if int(d) >= 2**63:
                raise ValueError(f"--shape {spec!r}: dimension {d} does not fit in 64 bits")
            values.append(int(d))
        if name in out:
            raise ValueError(f"--shape {spec!r}: input {name!r} is given twice")
        out[name] = tuple(values)
    return out


def _latency(
    model: str, report: Any, target: str, gpu: str | None, sizes: dict[str, tuple[int, ...]]
) -> Any:
    """The engine time of the linter's predicted layers (a ValueError names what is missing)."""
    from qdq.lint.speed.cost import UnsupportedPrecisionError
    from qdq.lint.speed.latency import predict_latency

    try:
        return predict_latency(
            model, target=target, gpu=gpu, shapes=sizes or None, layers=report.layers
        )
    except UnsupportedPrecisionError as err:
        raise UnsupportedPrecisionError(
            f"--latency: {err}; time it on a GPU that has them with --gpu (h100-sxm, l40s, ...: "
            "qdq engine time --list-gpus)"
        ) from None


def _add_latency(doc: dict[str, Any], timed: Any) -> None:
    """``latency`` (the whole prediction), the three totals at the top level, and each predicted
    layer's ``ms`` beside its other fields (``null`` for one the time model does not see)."""
    latency = timed.to_dict()
    doc["latency"] = latency
    for key in ("total_ms", "fp16_total_ms", "speedup_vs_fp16"):
        doc[key] = latency[key]
    ms = {ly.nodes: round(ly.ms, 6) for ly in timed.layers if ly.nodes}
    for layer in doc["layers"]:
        layer["ms"] = ms.get(tuple(layer["nodes"]))


def _draw(model: str, report: Any, diff: Any, out: str) -> None:
    from qdq._io import atomic_write_text
    from qdq.lint.engine_pages import predicted_svg

    svg = predicted_svg(model, report, diff, title=f"{Path(model).name}: predicted engine")
    atomic_write_text(out, '<?xml version="1.0" encoding="UTF-8"?>\n' + svg + "\n")
    logger.info("wrote %s", out)


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text or type(err).__name__
