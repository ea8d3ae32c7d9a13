"""``qdq demo``: ``qdq quantize`` on the built-in ``fashion-mnist-resnet``, into ``demo-out/``.

The real trained checkpoint and the real 10k labelled test set (Debian ``dataset-fashion-mnist``):
plan, one histogram calibration pass, the metric of every calibration method recomputed from it
(torch fake-quant), the exported Q/DQ ONNX (mse) measured in ONNX Runtime, the lint verdict,
``demo-out/report.json`` and the page ``demo-out/report.html``. A previous demo's output (a
directory holding ``report.json``) is replaced; any other non-empty directory is refused unless
``--overwrite``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from qdq.cli.quantize import run_quantize

__all__ = ["DEMO_MODEL", "run_demo"]

DEMO_MODEL = "fashion-mnist-resnet"


def run_demo(
    out_dir: str | Path = "demo-out",
    calib_samples: int = 256,
    limit: int | None = None,
    overwrite: bool = False,
    as_json: bool = False,
    show_progress: bool = True,
) -> int:
    """Run the demo, print the summary, write ``<out_dir>/report.{json,html}``; return an exit code."""
    out = Path(out_dir)
    args = argparse.Namespace(
        model=DEMO_MODEL,
        data=None,
        out=str(out),
        overwrite=overwrite or (out / "report.json").is_file(),
        calib="mse",
        percentile=None,
        compare_methods=True,
        exporter="auto",
        opset=17,
        target="trt10",
        calib_samples=calib_samples,
        eval_samples=limit,
        batch_size=500,
        seed=0,
        image_size=None,
        mean=None,
        std=None,
        channels=None,
        json=as_json,
        no_progress=not show_progress,
    )
    return run_quantize(args, prog="qdq demo")
