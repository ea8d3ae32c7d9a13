"""``qdq debug`` (per-layer error) and ``qdq sensitivity`` (per-unit sensitivity) on a model + data.

Both load the model and data as ``qdq quantize`` does, prepare and calibrate (one histogram pass),
then measure: ``debug`` the accumulated and isolated error of every quantizer in one pass
(:func:`qdq.debug.layer_errors`), ``sensitivity`` one configuration per unit
(:func:`qdq.sensitivity`), by the output proxy or the data's own metric.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from qdq.cli.quantize import add_data_options, data_options, one_line

if TYPE_CHECKING:
    from qdq.pipeline.inputs import ForwardInputs

__all__ = ["add_accuracy_parsers", "run_debug", "run_sensitivity"]


def add_accuracy_parsers(sub: Any) -> None:
    """The ``debug`` and ``sensitivity`` sub-commands."""
    debug = sub.add_parser(
        "debug",
        help="per-layer INT8 error (accumulated and isolated) of a model on its data",
        description="Prepare and calibrate the model, then measure at every quantizer, in one "
        "pass over a few evaluation batches, the accumulated error (everything upstream "
        "quantized), the isolated error (only this Q/DQ) and the weight error, as SQNR, cosine "
        "and relative MSE, worst first.",
    )
    sens = sub.add_parser(
        "sensitivity",
        help="which quantized layers (scale groups) cost the most accuracy",
        description="Prepare and calibrate the model, then score every unit (a scale group with "
        "its layers' weights): one-off = all INT8 but this unit, one-on = only this unit. "
        "--metric proxy: the model outputs' SQNR vs FP32 on a few batches (one forward per unit "
        "and batch); --metric task: the data's own metric (accuracy, agreement, or the built-in "
        "dataset's task metric) on the evaluation samples, one evaluation per unit.",
    )
    for p in (debug, sens):
        p.add_argument("--model", required=True, metavar="SPEC", help="as for qdq quantize")
        p.add_argument(
            "--trust-model",
            action="store_true",
            help="load a .pt2 as torch.export.load does, unchecked: it may RUN CODE the file "
            "holds (pickles); only for a file whose sender you trust",
        )
        p.add_argument("--data", metavar="SPEC", help="the data (default: a zoo model's own)")
        p.add_argument(
            "--calib",
            default="mse",
            choices=("mse", "entropy", "percentile", "max"),
            help="calibration method (default mse)",
        )
        p.add_argument("--percentile", type=float, help="for --calib percentile (99.99)")
        p.add_argument(
            "--samples", type=int, default=64, help="evaluation samples measured (default 64)"
        )
        p.add_argument("--top", type=int, default=20, help="rows printed (default 20; 0: all)")
        p.add_argument("--json", action="store_true", help="print one JSON object")
        p.add_argument("-o", "--output", metavar="FILE", help="also write the JSON to FILE")
        p.add_argument("--no-progress", action="store_true", help="no progress bars")
        add_data_options(p)
    sens.add_argument("--mode", default="one-off", choices=("one-off", "one-on"))
    sens.add_argument(
        "--metric",
        default="proxy",
        choices=("proxy", "task"),
        help="proxy (default): output SQNR vs FP32; task: the data's metric",
    )


@dataclass
class _Loaded:
    source: Any
    qdata: Any
    prepared: nn.Module
    size: int
    static: bool
    inputs: ForwardInputs  # how the data meets forward


def _load(args: argparse.Namespace) -> _Loaded:
    """Model and data as ``qdq quantize`` reads them; prepared and calibrated."""
    import qdq
    from qdq.pipeline.data import resolve_data
    from qdq.pipeline.inputs import batches, bind_inputs, take
    from qdq.pipeline.models import resolve_model

    for flag, value in (("--samples", args.samples), ("--batch-size", args.batch_size)):
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    if args.top < 0:
        raise ValueError(f"--top must be >= 0, got {args.top}")
    source = resolve_model(args.model, trust_model=args.trust_model)
    qdata = resolve_data(args.data, source.zoo, data_options(args), model=source.module)
    static = source.static_batch is not None
    size = source.static_batch or args.batch_size
    inputs = bind_inputs(source.module, qdata.calibration)
    first = next(batches(qdata.calibration, size, static))[0]
    prepared = qdq.prepare(
        source.module, inputs.positional(first if static else take(first, slice(0, 1)))
    )
    calib = [inputs.arguments(b) for b, _ in batches(qdata.calibration, size, static)]
    qdq.calibrate(
        prepared,
        calib,
        method=args.calib,
        percentile=args.percentile,
        show_progress=not args.no_progress,
    )
    return _Loaded(source, qdata, prepared, size, static, inputs)


def _eval_batches(loaded: _Loaded, samples: int) -> list[Any]:
    from qdq.pipeline.inputs import batches, take

    size = loaded.size if loaded.static else min(loaded.size, 16)
    count = max(samples, size if loaded.static else 0)
    first = take(loaded.qdata.evaluation, slice(0, count))
    return [loaded.inputs.arguments(b) for b, _ in batches(first, size, loaded.static)]


def _emit(args: argparse.Namespace, payload: dict[str, Any], text: str) -> None:
    body = json.dumps(payload, indent=2)
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=out.parent, delete=False, suffix=".tmp") as f:
            f.write(body + "\n")
        Path(f.name).replace(out)
    print(body if args.json else text)
    if args.output and not args.json:
        print(f"wrote {args.output}")


def run_debug(args: argparse.Namespace) -> int:
    """``qdq debug``: print the per-layer error table (or JSON); return the exit code."""
    from qdq.debug import layer_errors

    def measure() -> Any:
        loaded = _load(args)
        data = _eval_batches(loaded, args.samples)
        return layer_errors(
            loaded.prepared, data, num_batches=len(data), show_progress=not args.no_progress
        )

    return _run("qdq debug", args, measure)


def run_sensitivity(args: argparse.Namespace) -> int:
    """``qdq sensitivity``: print the ranking (or JSON); return the exit code."""
    import qdq

    def measure() -> Any:
        loaded = _load(args)
        metric = _task_metric(loaded, args.samples) if args.metric == "task" else None
        return qdq.sensitivity(
            loaded.prepared,
            _eval_batches(loaded, args.samples) if metric is None else None,
            metric,
            mode=args.mode,
            num_batches=10**9,
            show_progress=not args.no_progress,
        )

    return _run("qdq sensitivity", args, measure)


def _run(prog: str, args: argparse.Namespace, measure: Callable[[], Any]) -> int:
    """Run ``measure``; print its result (``.to_dict()`` / ``.format(top)``) or one error line."""
    try:
        result = measure()
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # user code and files: one line, never a traceback
        print(f"{prog}: error: {one_line(err)}", file=sys.stderr)
        return 2
    payload = {"model": args.model, "calibration": args.calib, **result.to_dict()}
    _emit(args, payload, result.format(top=args.top or None))
    return 0


def _task_metric(loaded: _Loaded, samples: int) -> Any:
    """The data's metric (as ``qdq quantize`` reports it) on the first ``samples`` evaluation
    samples, in torch."""
    from qdq.pipeline.evaluate import score, torch_outputs
    from qdq.pipeline.inputs import take

    q = loaded.qdata
    x = take(q.evaluation, slice(0, samples))
    labels = None if q.labels is None else q.labels[:samples]
    targets = q.targets[:samples] if isinstance(q.targets, (list, torch.Tensor)) else q.targets
    every = q.metric is not None
    ref = torch_outputs(loaded.source.module, x, loaded.size, static=loaded.static, desc="FP32",
                        show=False, every=every)  # fmt: skip

    def metric(model: nn.Module) -> float:
        outs = torch_outputs(model, x, loaded.size, static=loaded.static, desc="INT8",
                             show=False, every=every)  # fmt: skip
        return float(score(outs, ref, labels, q.metric, targets)["metric"])

    return metric
