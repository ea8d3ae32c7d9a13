"""``qdq engine time LAYERS.json --gpu NAME [--profile PROFILE.json] [--json]``: the engine-time
model on a real engine report (:mod:`qdq.lint.speed`), and ``--list-gpus``.

Exit codes: 0 done, 2 bad options (no LAYERS.json, no or an unknown ``--gpu``, a precision the GPU
lacks), 3 an input cannot be read. Every failure is one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

__all__ = ["add_time_parser", "run_time"]

logger = logging.getLogger(__name__)


def add_time_parser(verbs: Any) -> None:
    """Register ``qdq engine time`` on the ``qdq engine`` sub-parsers."""
    time = verbs.add_parser(
        "time",
        help="predict each engine layer's time on a GPU (no GPU needed); with --profile, "
        "against the measured times",
        description="Predict the time of every layer of a TensorRT engine report (trtexec "
        "--exportLayerInfo JSON, TensorRT 8.x-11) on a GPU of qdq's table from the layer's type, "
        "shapes and precisions, with qdq's fitted engine-time model (docs/engine_time.md). With "
        "--profile, print predicted against measured per layer and the total's error. "
        "--list-gpus lists the GPUs.",
    )
    time.add_argument(
        "layers", nargs="?", metavar="LAYERS.json", help="trtexec --exportLayerInfo JSON"
    )
    time.add_argument("--gpu", help="the GPU (a100, h100-sxm, rtx3090, l4, ...: --list-gpus)")
    time.add_argument("--profile", metavar="PROFILE.json", help="trtexec --exportProfile JSON")
    time.add_argument("--json", action="store_true", help="print one JSON object")
    time.add_argument("--top", type=int, default=15, help="slowest layers to print (15)")
    time.add_argument("--list-gpus", action="store_true", help="list the GPUs and exit")


def run_time(args: argparse.Namespace) -> int:
    """Run ``qdq engine time``; see the module docstring for the exit codes."""
    from qdq.lint.engine_report import load_engine_report
    from qdq.lint.speed.cost import UnsupportedPrecisionError
    from qdq.lint.speed.engine_time import time_engine
    from qdq.lint.speed.gpus import GPUS, find_gpu
    from qdq.lint.text import printable

    prog = "qdq engine time"
    if args.list_gpus:
        print(_gpu_table(GPUS))
        return 0
    if not args.layers:
        print(
            f"{prog}: error: give LAYERS.json (trtexec --exportLayerInfo) or --list-gpus",
            file=sys.stderr,
        )
        return 2
    if not args.gpu:
        print(
            f"{prog}: error: --gpu is required (qdq engine time --list-gpus lists them)",
            file=sys.stderr,
        )
        return 2
    if args.top < 0:
        print(f"{prog}: error: --top must be >= 0, got {args.top}", file=sys.stderr)
        return 2
    try:
        gpu = find_gpu(args.gpu)
    except ValueError as err:
        print(f"{prog}: error: {printable(str(err))}", file=sys.stderr)
        return 2
    try:
        report = load_engine_report(args.layers, args.profile)
        result = time_engine(report, gpu)
    except UnsupportedPrecisionError as err:
        print(f"{prog}: error: {printable(str(err))}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as err:
        logger.debug("%s failed", prog, exc_info=True)
        print(f"{prog}: error: {printable(' '.join(str(err).split()))}", file=sys.stderr)
        return 3
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(result.format(args.top))
    return 0


def _gpu_table(gpus: Any) -> str:
    from qdq.lint.speed import gpus as table

    listing = getattr(table, "list_gpus_table", None)
    if listing is not None:
        return str(listing())
    precisions = ("fp32", "tf32", "fp16", "bf16", "int8", "fp8", "fp4")
    head = (
        f"{'name':18} {'cc':4} {'SMs':>4} "
        + " ".join(f"{p:>6}" for p in precisions)
        + "  GB/s  aliases"
    )
    rows = [head]
    for g in gpus:
        peaks = " ".join(
            f"{g.tflops[p]:6.0f}" if p in g.tflops else f"{'-':>6}" for p in precisions
        )
        cc = f"{g.compute_capability[0]}.{g.compute_capability[1]}"
        rows.append(
            f"{g.name:18} {cc:4} {g.sms:4d} {peaks} {g.memory_gbs:5.0f}  {', '.join(g.aliases)}"
        )
    return "\n".join(rows)
