"""Public verbs: ``prepare`` → ``calibrate``; ``plan_of`` explains what ``prepare`` decided."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from qdq._progress import progress
from qdq.calib import CalibrationError, Calibrator
from qdq.calib.batched import read_back
from qdq.calib.batches import expected_inputs, run_batch
from qdq.calib.parts import CalibrationParts
from qdq.config import CALIBRATION_METHODS, QuantConfig
from qdq.graph.capture import CaptureError, ForwardError
from qdq.graph.insert import materialize
from qdq.graph.plan import QuantPlan
from qdq.graph.planner import build_plan
from qdq.graph.record import record
from qdq.graph.replace import prepare_by_replacement
from qdq.quant import MIN_AMAX, Quantizer, QuantMode, quantizers_of
from qdq.quant.primitives import batched_amax_checks

__all__ = [
    "calibrate",
    "calibrate_from",
    "calibrate_parts",
    "copy_prepared",
    "plan_of",
    "prepare",
    "quantizers_of",
    "recompute_amax",
]

_log = logging.getLogger("qdq")
_PLAN_ATTR = "qdq_plan"
#: a module's forward hooks (what :func:`copy_prepared` restores on a GraphModule's copy)
_ROOT_HOOKS = frozenset({"_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
                         "_forward_hooks_with_kwargs", "_forward_hooks_always_called"})  # fmt: skip


def prepare(
    model: nn.Module,
    example_inputs: Sequence[Any],
    config: QuantConfig | None = None,
    *,
    fallback: bool = True,
) -> nn.Module:
    """Return a quantization-ready copy of ``model`` with TensorRT-aware Q/DQ placement.

    The copy is the user's own model (same class, attributes, ``forward`` signature, train/eval
    behaviour) with :class:`~qdq.quant.Quantizer` modules registered next to the code they quantize
    and applied at the planned call sites (see :mod:`qdq.graph.runtime`). Placement is planned on
    a recording of one forward on ``example_inputs`` (:mod:`qdq.graph.record`). Its plan is at
    ``.qdq_plan`` (or ``qdq.plan_of(m)``). Weights are calibrated immediately (per-channel
    abs-max); activations need :func:`calibrate`. ``model`` is not modified.

    Args:
        model: the float model.
        example_inputs: a tuple of example inputs for one forward.
        config: placement and calibration settings (default ``QuantConfig.tensorrt()``).
        fallback: when the model cannot be recorded, warn and quantize only what needs no
            graph (every Conv/Linear call: input and weight) instead of raising.

    Raises:
        TypeError: bad argument types.
        qdq.graph.capture.CaptureError: the forward fails on the example inputs (and
            ``fallback`` is false).

    Example:
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU())
        >>> qnet = prepare(net, (torch.randn(1, 3, 8, 8),))
        >>> plan_of(qnet).point("0:input").decision
        'quantize'
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(example_inputs, (tuple, list)):
        raise TypeError(
            f"example_inputs must be a tuple of inputs, got {type(example_inputs).__name__}; "
            "wrap a single tensor as (x,)"
        )
    if config is not None and not isinstance(config, QuantConfig):
        raise TypeError(f"config must be a QuantConfig, got {type(config).__name__}")
    cfg = config if config is not None else QuantConfig.tensorrt()
    try:
        rec = record(model, tuple(example_inputs))
    except ForwardError as err:  # the model itself fails: nothing to fall back to
        cause = err.__cause__
        raise ValueError(
            f"{type(model).__name__} raises on the example inputs "
            f"({type(cause).__name__}: {cause}); check their number, shapes and dtypes"
        ) from cause
    except CaptureError as err:
        if not fallback:
            raise
        prepared, plan = prepare_by_replacement(model, cfg, str(err))
        warnings.warn(f"{plan.notes[0]}; {plan.notes[1]}", stacklevel=2)
    else:
        prepared = rec.root
        plan = materialize(
            prepared,
            rec.graph,
            build_plan(rec.graph, prepared, cfg, model, rec.unused),
            rec.leaf_calls,
        )
        if rec.data_dependent:
            where = ", ".join(p or "<root>" for p in rec.data_dependent)
            plan = dataclasses.replace(
                plan,
                control_flow=rec.data_dependent,
                control_flow_sites=rec.value_reads,
                notes=(
                    *plan.notes,
                    f"tensor values decide Python control flow in {where}: the plan follows the "
                    "branches the example inputs took (a branch not taken runs in float)",
                ),
            )
    object.__setattr__(prepared, _PLAN_ATTR, plan)
    prepared.train(model.training)
    _log.info("%s", plan.summary())
    return prepared


def copy_prepared(prepared: nn.Module) -> nn.Module:
    """A deep copy of a model from :func:`prepare` that keeps qdq's own attributes (its plan, a
    recorded PTQ recipe, QAT state): ``torch.fx.GraphModule``'s ``deepcopy``, which a ``.pt2``
    model prepares into, drops the attributes it does not know."""
    memo: dict[int, Any] = {}  # one memo: what the attributes reference is the clone's
    clone = copy.deepcopy(prepared, memo)
    for name, value in prepared.__dict__.items():
        lost = name.startswith(("qdq_", "_qdq_")) and name not in clone.__dict__
        # GraphModule's copy also drops the root's forward hooks, which run qdq's call sites
        if lost or (name in _ROOT_HOOKS and isinstance(prepared, torch.fx.GraphModule)):
            object.__setattr__(clone, name, copy.deepcopy(value, memo))
    return clone


def plan_of(prepared: nn.Module) -> QuantPlan:
    """The :class:`~qdq.graph.plan.QuantPlan` of a model returned by :func:`prepare`."""
    plan = getattr(prepared, _PLAN_ATTR, None)
    if not isinstance(plan, QuantPlan):
        raise ValueError(
            f"{type(prepared).__name__} was not returned by qdq.prepare (it has no .qdq_plan)"
        )
    return plan


Data = Iterable[Any] | Callable[[nn.Module], Any]


def calibrate(
    prepared: nn.Module,
    data: Data,
    method: str | None = None,
    num_batches: int | None = None,
    *,
    percentile: float | None = None,
    show_progress: bool = True,
    sync: bool = True,
) -> nn.Module:
    """Calibrate the activation quantizers of ``prepared`` in place and return it.

    Runs the model in eval mode, without gradients and without fake quantization (a float forward),
    collecting one histogram per scale group, then sets every activation amax by ``method``.
    Arguments are checked before the first batch runs; every batch is checked before it runs.

    Args:
        prepared: a model from :func:`prepare`.
        data: a DataLoader or any iterable of batches, or a ``forward_loop(model)`` callable that
            runs the model itself. A batch may be

            * a tensor: ``model(x)``;
            * a tuple or list whose first ``n`` items are the model's ``n`` inputs, the rest
              (labels) ignored: ``(x, y)`` → ``model(x)``, ``[x1, x2]`` or ``((x1, x2), y)`` →
              ``model(x1, x2)``;
            * a dict of keyword inputs; keys that ``forward`` does not take (labels) are ignored.

            ``n`` is the number of example inputs given to :func:`prepare` (else the positional
            parameters of ``forward`` without defaults). Each input must have the rank, dtype and
            device of the example input (see :mod:`qdq.calib.batches`).
        method: ``"max"``, ``"entropy"``, ``"mse"`` or ``"percentile"`` for every activation
            quantizer; ``None`` uses each quantizer's ``CalibSpec`` (default mse).
        num_batches: stop after this many batches (default: all).
        percentile: for ``method="percentile"`` only, in (0, 100] (default 99.99 or the
            quantizer's spec).
        show_progress: show a progress bar.
        sync: under ``torchrun`` (``torch.distributed`` initialised, more than one rank), combine
            the statistics of every rank before computing amax, so every rank gets identical amax,
            bit for bit, equal to one process's on the union of the ranks' batches
            (:func:`qdq.qat.distributed.sync_calibration`; every rank must call ``calibrate``). A
            rank with no batches is fine as long as some rank has one.

    Raises:
        ValueError: unknown ``method``, ``percentile`` out of range or given with another method,
            a method the quantizers' calibrators cannot compute (all before any batch runs).
        TypeError: a batch (or an input in it) is not a tensor / tuple / list / dict.
        CalibrationError: no batch was seen, a batch holds NaN/inf, or a batch does not match the
            model's inputs (naming the batch index, what was expected and what came).

    Warns:
        UserWarning: quantizers whose amax is 0 (they saw only zeros), and those that saw only
            values at or below 2**-24 (the amax floor), by name.

    Example:
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU())
        >>> m = prepare(net, (torch.randn(1, 3, 8, 8),))
        >>> data = [(torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])) for _ in range(2)]
        >>> _ = calibrate(m, data, method="percentile", percentile=99.9, show_progress=False)
        >>> calibrate(m, data, method="max", percentile=50)
        Traceback (most recent call last):
        ...
        ValueError: percentile=50 is only used by method='percentile', not method='max'
    """
    plan_of(prepared)
    if num_batches is not None and (
        isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 1
    ):
        raise ValueError(f"num_batches must be an int >= 1, got {num_batches!r}")
    quantizers = quantizers_of(prepared)
    acts = _activation_quantizers(prepared)
    _check_method(acts, method, percentile)
    for q in acts.values():
        q.calibrator.reset()
    with _calibration_mode(prepared, quantizers, acts):
        seen = _collect(prepared, acts, data, num_batches, show_progress)
    if sync:
        from qdq.calib.base import all_reduce, distributed_active
        from qdq.qat.distributed import sync_calibration

        if distributed_active():
            seen = int(all_reduce(torch.tensor([seen]), "sum")[0])
            sync_calibration(prepared)
    if seen == 0:
        raise CalibrationError("calibration saw no batches: the data is empty")
    return recompute_amax(prepared, method, percentile=percentile)


def _collect(
    prepared: nn.Module,
    acts: dict[str, Quantizer],
    data: Data,
    num_batches: int | None,
    show_progress: bool,
    first: int = 0,
    desc: str = "calibrating",
) -> int:
    """Run ``data``'s batches (numbered from ``first`` in error messages) through ``prepared`` in
    calibration mode; return how many ran."""
    if callable(data) and not isinstance(data, Iterable):
        data(prepared)
        return max((q.calibrator.num_batches for q in acts.values()), default=0)
    expected = expected_inputs(prepared)
    seen = 0
    total = num_batches if num_batches is not None else _len_or_none(data)
    for batch in progress(data, total=total, desc=desc, enabled=show_progress):
        run_batch(prepared, batch, first + seen, expected)
        seen += 1
        if num_batches is not None and seen >= num_batches:
            break
    return seen


def calibrate_parts(
    prepared: nn.Module,
    parts: Sequence[Iterable[Any]],
    method: str | None = None,
    *,
    percentile: float | None = None,
    show_progress: bool = True,
) -> CalibrationParts:
    """Calibrate ``prepared`` as :func:`calibrate` does on all of ``parts``' batches, keeping each
    part's statistics apart (:mod:`qdq.calib.parts`): :func:`calibrate_from` then calibrates a
    copy on any union of the parts without running a batch again, with the amax a calibration
    on those batches alone gives, bit for bit.

    Args:
        prepared: a model from :func:`prepare`; calibrated on every part on return.
        parts: lists of batches (as :func:`calibrate` takes them; each part may be empty).
        method / percentile: as :func:`calibrate`.
        show_progress: one progress bar over every part's batches.

    Raises:
        ValueError / TypeError / CalibrationError: as :func:`calibrate`; no batch in any part.

    Example:
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU())
        >>> m = prepare(net, (torch.randn(1, 3, 8, 8),))
        >>> data = [torch.randn(4, 3, 8, 8) for _ in range(3)]
        >>> parts = calibrate_parts(m, [data[:1], data[1:]], show_progress=False)
        >>> one = calibrate_from(copy_prepared(m), parts, keep=[1])
        >>> two = calibrate(copy_prepared(m), data[1:], show_progress=False)
        >>> bool(one[0].input_quantizer.amax == two[0].input_quantizer.amax)
        True
    """
    plan_of(prepared)
    quantizers = quantizers_of(prepared)
    acts = _activation_quantizers(prepared)
    _check_method(acts, method, percentile)
    stats: list[dict[str, Calibrator]] = []
    counts: list[int] = []
    chained = [list(part) for part in parts]
    bar = iter(progress(range(sum(map(len, chained))), total=sum(map(len, chained)),
                        desc="calibrating", enabled=show_progress))  # fmt: skip
    with _calibration_mode(prepared, quantizers, acts):
        for part in chained:
            for q in acts.values():
                q.calibrator.reset()
            counts.append(_collect(prepared, acts, _ticking(part, bar), None, False, sum(counts)))
            stats.append({path: copy.deepcopy(q.calibrator) for path, q in acts.items()})
    if not sum(counts):
        raise CalibrationError("calibration saw no batches: the data is empty")
    collected = CalibrationParts(tuple(stats), tuple(counts))
    calibrate_from(prepared, collected, None, method, percentile=percentile)
    return collected


def _ticking(items: list[Any], bar: Iterator[Any]) -> Iterator[Any]:
    for item in items:
        next(bar, None)
        yield item


def calibrate_from(
    prepared: nn.Module,
    collected: CalibrationParts,
    keep: Iterable[int] | None = None,
    method: str | None = None,
    *,
    percentile: float | None = None,
) -> nn.Module:
    """Calibrate ``prepared`` (in place) on the union of the parts ``keep`` (default: all) of a
    :func:`calibrate_parts` collection, without running data: its calibrators get the merged
    statistics and amax is computed as :func:`calibrate` computes it. ``prepared`` must have the
    plan (the quantizer paths) of the model the parts were collected on (a
    :func:`copy_prepared` copy of it).

    Raises:
        ValueError: ``keep`` names no part or a missing one, the quantizers differ, no batch ran
            in the kept parts, or ``method``/``percentile`` as :func:`calibrate`.
    """
    acts = _activation_quantizers(prepared)
    _check_method(acts, method, percentile)
    chosen = sorted(set(range(len(collected.parts)) if keep is None else keep))
    merged = collected.merged(chosen)
    if merged.keys() != acts.keys():
        raise ValueError(
            "these calibration parts were collected on a model with other quantizers "
            f"({sorted(merged.keys() ^ acts.keys())[:5]} differ); calibrate_from needs a copy "
            "of the model calibrate_parts ran on"
        )
    if not sum(collected.batches[i] for i in chosen):
        raise CalibrationError(f"the calibration parts {chosen} ran no batch")
    for path, q in acts.items():
        q.calibrator = merged[path]
    return recompute_amax(prepared, method, percentile=percentile)


def recompute_amax(
    prepared: nn.Module, method: str | None = None, *, percentile: float | None = None
) -> nn.Module:
    """Set every activation amax from the statistics already collected, by ``method``.

    Calibrate once, evaluate many: after :func:`calibrate`, switch between ``"max"``,
    ``"entropy"``, ``"mse"`` and ``"percentile"`` without running data again.

    Raises:
        ValueError: as :func:`calibrate` for ``method``/``percentile`` (checked before any amax
            changes).

    Warns:
        UserWarning: quantizers whose amax is 0 (they saw only zeros), and those that saw only
            values at or below 2**-24 (the amax floor), by name.
    """
    plan_of(prepared)
    acts = _activation_quantizers(prepared)
    _check_method(acts, method, percentile)
    # what the calibrators read back, then the amax checks and the largest entry of every amax
    # (for the warnings): two host syncs in all, not four or five per quantizer (issue 48)
    read_back((q.calibrator, method or q.calib.method) for q in acts.values())
    with batched_amax_checks() as checks:
        for q in acts.values():
            uses_percentile = (method or q.calib.method) == "percentile"
            q.load_calib_amax(method, percentile=percentile if uses_percentile else None)
        for n, q in acts.items():
            if q.is_calibrated:
                checks.watch(n, q.amax)
    _warn_zero_amax(checks.largest)
    return prepared


def _check_method(acts: dict[str, Quantizer], method: str | None, percentile: float | None) -> None:
    """Validate ``method``/``percentile`` against each other and the quantizers' calibrators."""
    if method is not None and method not in CALIBRATION_METHODS:
        raise ValueError(
            f"unknown calibration method {method!r}; choose one of {', '.join(CALIBRATION_METHODS)}"
        )
    if percentile is not None:
        if isinstance(percentile, bool) or not isinstance(percentile, (int, float)):
            raise TypeError(f"percentile must be a number, got {type(percentile).__name__}")
        if not 0.0 < float(percentile) <= 100.0:
            raise ValueError(f"percentile must be in (0, 100], got {percentile}")
        if method is not None and method != "percentile":
            raise ValueError(
                f"percentile={percentile} is only used by method='percentile', not method={method!r}"
            )
        if method is None and not any(q.calib.method == "percentile" for q in acts.values()):
            raise ValueError(
                f"percentile={percentile} is only used by method='percentile', and no quantizer "
                "calibrates by percentile; pass method='percentile'"
            )
    if method is not None:
        unable = [n for n, q in acts.items() if method not in q.calibrator.methods]
        if unable:
            raise ValueError(
                f"method {method!r} needs a histogram calibrator, but quantizers {unable[:5]} "
                "use calibrator='max'"
            )


def _warn_zero_amax(largest: dict[str, float]) -> None:
    """Warn of the quantizers whose amax (``largest``: the largest entry of each calibrated
    one's, by name) is 0 or at most :data:`~qdq.quant.MIN_AMAX` (every entry of it)."""
    floored = {n: top for n, top in largest.items() if top <= MIN_AMAX}
    zero = [n for n, top in floored.items() if not top > 0]
    tiny = [n for n in floored if n not in zero]
    if zero:
        warnings.warn(
            f"{len(zero)} quantizer(s) have amax 0 (they saw only zeros during calibration): "
            f"{zero[:10]}; their scale will be floored at export and every value quantizes to 0. "
            "Check the calibration data, or exclude those layers",
            stacklevel=3,
        )
    if tiny:
        worst = max(floored[n] for n in tiny)
        warnings.warn(
            f"{len(tiny)} quantizer(s) saw only values at or below 2**-24 (largest {worst:.3g}; "
            f"vanishing activations, e.g. random weights): {tiny[:10]}; every calibration method "
            "gives their observed max, their scale is floored to 2**-24/127 and such values "
            "quantize to 0 or a few codes (FP16 flushes them to 0 too). Check the model's weights "
            "and data, or exclude those layers",
            stacklevel=3,
        )


def _activation_quantizers(prepared: nn.Module) -> dict[str, Quantizer]:
    return {n: q for n, q in quantizers_of(prepared).items() if not q.name.endswith(":weight")}


@contextlib.contextmanager
def _calibration_mode(
    model: nn.Module, quantizers: dict[str, Quantizer], acts: dict[str, Quantizer]
) -> Iterator[None]:
    saved_modes = {n: q.mode for n, q in quantizers.items()}
    was_training = model.training
    try:
        for n, q in quantizers.items():
            q.mode = QuantMode.CALIBRATE if n in acts else QuantMode.BYPASS
        model.eval()
        with torch.no_grad():
            yield
    finally:
        for n, q in quantizers.items():
            q.mode = saved_modes[n] if n not in acts else QuantMode.QUANTIZE
        model.train(was_training)


def _len_or_none(data: Any) -> int | None:
    try:
        return len(data)
    except TypeError:
        return None
