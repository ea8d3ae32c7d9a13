"""``qdq`` command: entry point and sub-command dispatch."""

from __future__ import annotations

import argparse
import io
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from qdq._version import __version__
from qdq.cli.accuracy import add_accuracy_parsers, run_debug, run_sensitivity
from qdq.cli.engine import add_engine_parser, run_engine
from qdq.cli.quantize import (
    add_qat_parser,
    add_quantize_parser,
    add_zoo_parser,
    run_quantize,
    run_zoo,
)

__all__ = ["main"]


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qdq", description="PyTorch → TensorRT-ready INT8 Q/DQ models."
    )
    parser.add_argument("--version", action="version", version=f"qdq {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo",
        help="qdq quantize on the built-in Fashion-MNIST ResNet, into demo-out/",
        description="qdq quantize --model fashion-mnist-resnet --compare-methods --out demo-out: "
        "FP32 vs INT8 (every calibration method from one histogram pass; the mse model exported "
        "and measured in ONNX Runtime), lint, demo-out/report.json. A previous demo's output is "
        "replaced.",
    )
    demo.add_argument("--out", default="demo-out", help="output directory (default: demo-out)")
    demo.add_argument("--calib-samples", type=int, default=256, help="calibration images (256)")
    demo.add_argument("--limit", type=int, default=None, help="evaluate only N test images")
    demo.add_argument("--overwrite", action="store_true", help="replace any non-empty OUT")
    demo.add_argument("--json", action="store_true", help="print report.json instead")
    demo.add_argument("--no-progress", action="store_true", help="no progress bars")
    demo.add_argument(
        "--time-budget",
        type=float,
        metavar="SECONDS",
        help="seconds for the whole job, as qdq quantize's (default: the predicted job, which "
        "stops nothing before 10x it; the work is counted from the model, the same under any load)",
    )
    demo.add_argument(
        "--search-budget",
        type=float,
        metavar="SECONDS",
        help="at most this much of it for the recipe search (as qdq quantize)",
    )
    add_quantize_parser(sub)
    add_qat_parser(sub)
    add_zoo_parser(sub)
    add_accuracy_parsers(sub)
    lint = sub.add_parser(
        "lint",
        help="predict what TensorRT does with a Q/DQ ONNX (no GPU needed)",
        description="Lint a Q/DQ ONNX for TensorRT. Exit code: 0 clean, 1 warnings, 2 errors, "
        "3 when an input cannot be read (or --latency cannot predict the engine time).",
    )
    lint.add_argument("model", help="the .onnx file")
    lint.add_argument(
        "--target",
        default="trt10",
        help="TensorRT version: trt10 (default, weakly typed --int8 --fp16), trt11 (strongly "
        "typed), or with a minor version (trt8.6, trt10.5) for version-dependent rules; a GPU "
        "after it (trt10-a100, trt10-hopper) for --latency",
    )
    lint.add_argument(
        "--strongly-typed", action="store_true", help="a --stronglyTyped build (TensorRT 10.12+)"
    )
    lint.add_argument(
        "--flags",
        default=None,
        help="weak-typing build flags, comma-separated (default: int8,fp16)",
    )
    lint.add_argument("--json", action="store_true", help="print one JSON object")
    lint.add_argument(
        "--layers", action="store_true", help="also print the predicted engine layers"
    )
    lint.add_argument("--engine-report", help="trtexec --exportLayerInfo JSON to compare with")
    lint.add_argument(
        "--draw",
        metavar="OUT.svg",
        help="draw the predicted engine (Graphviz); with --engine-report, disagreements marked",
    )
    lint.add_argument(
        "--latency",
        action="store_true",
        help="also predict the engine time on the target's GPU (--target trt10-a100) against "
        "the same model built FP16, and the layers where quantization does not pay",
    )
    lint.add_argument(
        "--shape",
        action="append",
        metavar="NAME:DIMS",
        help="with --latency, an input's size (input:32x3x224x224); needed for a dynamic "
        "dimension, repeatable",
    )
    lint.add_argument(
        "--gpu",
        help="with --latency, the GPU instead of the target's (qdq engine time --list-gpus)",
    )
    _add_parity(sub)
    add_engine_parser(sub)
    return parser


def _add_parity(sub: Any) -> None:
    parity = sub.add_parser(
        "parity",
        help="compare an exported Q/DQ ONNX with its torch fake-quant model, layer by layer",
        description="Run the torch fake-quant model (rebuilt from --model, prepared with the "
        "default config, calibration loaded from X.onnx.manifest.json beside X.onnx, or from a "
        "manifest.json there that names X.onnx) and the ONNX in "
        "ONNX Runtime on the same data; report end-to-end agreement, per quantizer the fraction "
        "of differing INT8 codes (free-running and isolated) and the first diverging layer. "
        "A float64 copy of the fake-quant model (exact INT8 accumulation) measures the float "
        "rounding noise floor: top-1 differences within it are not failures. "
        "The manifest must describe MODEL.onnx (same SHA-256) and name only files in its own "
        "folder. Exit code: 0 within the threshold, 1 past it, 2 when an input cannot be used.",
    )
    parity.add_argument("model_onnx", metavar="MODEL.onnx", help="the exported .onnx file")
    parity.add_argument(
        "--model",
        required=True,
        metavar="SPEC",
        help="pkg.module:factory or path/to/file.py:factory returning the float nn.Module; "
        "this imports/executes that code",
    )
    parity.add_argument(
        "--data", required=True, metavar="SPEC", help=".npy or .npz file of input samples"
    )
    parity.add_argument(
        "--threshold",
        type=float,
        default=0.01,
        help="largest tolerated top-1 disagreement and per-layer isolated code mismatch "
        "fraction (default 0.01)",
    )
    parity.add_argument("--batch-size", type=int, default=None, help="samples per batch")
    parity.add_argument(
        "--no-reference",
        action="store_true",
        help="skip the float64 reference run (then any top-1 difference past the threshold fails)",
    )
    parity.add_argument("--json", action="store_true", help="print one JSON object")
    parity.add_argument(
        "--ignore-hash",
        action="store_true",
        help="compare even when MODEL.onnx is not the file its manifest was written with "
        "(SHA-256 differs, or none recorded): a note instead of an error (exit 2)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``qdq`` command; return the process exit code."""
    args = _build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return _run(args)
    except BrokenPipeError:
        # the reader of the output went away (``qdq lint M.onnx | head``): stop quietly, as other
        # command-line tools do, and keep the interpreter's final flush from failing again
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, io.UnsupportedOperation):
            pass
        return 141  # 128 + SIGPIPE


def _run(args: argparse.Namespace) -> int:
    if args.command == "demo":
        from qdq.cli.demo import run_demo

        for flag, value in (("--limit", args.limit), ("--calib-samples", args.calib_samples)):
            if value is not None and value < 1:
                print(f"qdq demo: error: {flag} must be >= 1, got {value}", file=sys.stderr)
                return 2
        return run_demo(
            out_dir=args.out,
            calib_samples=args.calib_samples,
            limit=args.limit,
            overwrite=args.overwrite,
            as_json=args.json,
            show_progress=not args.no_progress,
            time_budget=args.time_budget,
            search_budget=args.search_budget,
        )
    if args.command == "quantize":
        return run_quantize(args)
    if args.command == "qat":
        if args.qat_epochs < 1:
            print("qdq qat: error: --qat-epochs must be >= 1 (use qdq quantize without QAT)",
                  file=sys.stderr)  # fmt: skip
            return 2
        return run_quantize(args, prog="qdq qat")
    if args.command == "debug":
        return run_debug(args)
    if args.command == "sensitivity":
        return run_sensitivity(args)
    if args.command == "zoo":
        return run_zoo(args.action)
    if args.command == "lint":
        from qdq.cli.lint import run_lint

        return run_lint(
            args.model,
            target=args.target,
            as_json=args.json,
            engine=args.engine_report,
            strongly_typed=True if args.strongly_typed else None,
            flags=args.flags.split(",") if args.flags is not None else None,
            show_layers=args.layers,
            draw=args.draw,
            latency=args.latency,
            shapes=args.shape,
            gpu=args.gpu,
        )
    if args.command == "engine":
        return run_engine(args)
    if args.command == "parity":
        from qdq.cli.parity import run_parity

        return run_parity(
            args.model_onnx,
            model=args.model,
            data=args.data,
            threshold=args.threshold,
            batch_size=args.batch_size,
            reference=not args.no_reference,
            as_json=args.json,
            ignore_hash=args.ignore_hash,
        )
    raise AssertionError(f"unhandled command {args.command}")  # argparse guarantees a command
