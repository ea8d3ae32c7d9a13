"""``qdq demo``: ``qdq quantize`` on the built-in ``fashion-mnist-resnet``, into ``demo-out/``.

The real trained checkpoint and the real 10k labelled test set (Debian ``dataset-fashion-mnist``):
plan, one histogram calibration pass, the metric of every calibration method recomputed from it
(torch fake-quant), the exported Q/DQ ONNX (mse) measured in ONNX Runtime, the lint verdict,
``demo-out/report.json`` and the page ``demo-out/report.html``. A previous demo's files (in a
directory holding ``report.json``) are replaced, other files there kept; any other non-empty
directory is refused unless ``--overwrite`` (:mod:`qdq.pipeline.outdir`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from qdq.cli.quantize import add_quantize_parser, run_quantize

__all__ = ["DEMO_MODEL", "run_demo"]

DEMO_MODEL = "fashion-mnist-resnet"


def run_demo(
    out_dir: str | Path = "demo-out",
    calib_samples: int = 256,
    limit: int | None = None,
    overwrite: bool = False,
    as_json: bool = False,
    show_progress: bool = True,
    time_budget: float | None = None,
    search_budget: float | None = None,
) -> int:
    """Run the demo, print the summary, write ``<out_dir>/report.{json,html}``; return an exit code."""
    out = Path(out_dir)
    argv = ["quantize", "--model", DEMO_MODEL, "--out", str(out), "--compare-methods",
            "--calib", "mse", "--batch-size", "500", "--calib-samples", str(calib_samples)]  # fmt: skip
    if limit is not None:
        argv += ["--eval-samples", str(limit)]
    if overwrite or (out / "report.json").is_file():
        argv.append("--overwrite")
    if as_json:
        argv.append("--json")
    if not show_progress:
        argv.append("--no-progress")
    for flag, seconds in (("--time-budget", time_budget), ("--search-budget", search_budget)):
        if seconds is not None:
            argv += [flag, str(seconds)]
    # parsed by the quantize command's own parser: every option it has keeps its default
    parser = argparse.ArgumentParser(prog="qdq")
    add_quantize_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return run_quantize(args, prog="qdq demo")
