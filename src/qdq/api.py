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
import torch.fx as fx
from torch import nn

from qdq._progress import progress
from qdq.calib import CalibrationError
from qdq.config import QuantConfig
from qdq.graph.capture import CaptureError
from qdq.graph.insert import materialize
from qdq.graph.plan import QuantPlan
from qdq.graph.planner import build_plan
from qdq.graph.record import record
from qdq.graph.replace import prepare_by_replacement
from qdq.quant import Quantizer, QuantMode

__all__ = ["calibrate", "plan_of", "prepare", "quantizers_of", "recompute_amax"]

_log = logging.getLogger("qdq")
_PLAN_ATTR = "qdq_plan"


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
    except CaptureError as err:
        _check_runs(model, tuple(example_inputs))  # the model itself fails: nothing to fall back to
        if not fallback:
            raise
        prepared, plan = prepare_by_replacement(model, cfg, str(err))
        warnings.warn(f"{plan.notes[0]}; {plan.notes[1]}", stacklevel=2)
    else:
        prepared = rec.root
        plan = materialize(prepared, rec.graph, build_plan(rec.graph, prepared, cfg, model))
        if rec.data_dependent:
            where = ", ".join(p or "<root>" for p in rec.data_dependent)
            plan = dataclasses.replace(
                plan,
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


def _check_runs(model: nn.Module, example_inputs: tuple[Any, ...]) -> None:
    """Raise ``ValueError`` when ``model`` itself fails on ``example_inputs`` (in eval mode)."""
    clone = copy.deepcopy(model).eval()
    try:
        with torch.no_grad():
            clone(*example_inputs)
    except Exception as err:
        raise ValueError(
            f"{type(model).__name__} raises on the example inputs "
            f"({type(err).__name__}: {err}); check their number, shapes and dtypes"
        ) from err


def plan_of(prepared: nn.Module) -> QuantPlan:
    """The :class:`~qdq.graph.plan.QuantPlan` of a model returned by :func:`prepare`."""
    plan = getattr(prepared, _PLAN_ATTR, None)
    if not isinstance(plan, QuantPlan):
        raise ValueError(
            f"{type(prepared).__name__} was not returned by qdq.prepare (it has no .qdq_plan)"
        )
    return plan


def quantizers_of(prepared: nn.Module) -> dict[str, Quantizer]:
    """All quantizers of a prepared model by module path."""
    return {name: m for name, m in prepared.named_modules() if isinstance(m, Quantizer)}


Data = Iterable[Any] | Callable[[nn.Module], Any]


def calibrate(
    prepared: nn.Module,
    data: Data,
    method: str | None = None,
    num_batches: int | None = None,
    *,
    percentile: float | None = None,
    show_progress: bool = True,
) -> nn.Module:
    """Calibrate the activation quantizers of ``prepared`` in place and return it.

    Runs the model in eval mode, without gradients and without fake quantization (a float forward),
    collecting one histogram per scale group, then sets every activation amax by ``method``.

    Args:
        prepared: a model from :func:`prepare`.
        data: a DataLoader or any iterable of batches, or a ``forward_loop(model)`` callable that
            runs the model itself. A batch may be a tensor (``model(x)``), a dict (``model(**b)``),
            or a tuple/list whose first ``n`` items are the model's ``n`` inputs (labels are ignored).
        method: ``"max"``, ``"entropy"``, ``"mse"`` or ``"percentile"`` for every activation
            quantizer; ``None`` uses each quantizer's ``CalibSpec`` (default mse).
        num_batches: stop after this many batches (default: all).
        percentile: for ``method="percentile"`` (default 99.99 or the quantizer's spec).
        show_progress: show a progress bar.

    Raises:
        CalibrationError: no batch was seen, or a batch holds NaN/inf (naming quantizer and batch).
    """
    plan_of(prepared)
    if num_batches is not None and num_batches < 1:
        raise ValueError(f"num_batches must be >= 1, got {num_batches}")
    quantizers = quantizers_of(prepared)
    acts = _activation_quantizers(prepared)
    for q in acts.values():
        q.calibrator.reset()
    n_inputs = _num_inputs(prepared)
    seen = 0
    with _calibration_mode(prepared, quantizers, acts):
        if callable(data) and not isinstance(data, Iterable):
            data(prepared)
            seen = max((q.calibrator.num_batches for q in acts.values()), default=0)
        else:
            total = num_batches if num_batches is not None else _len_or_none(data)
            for batch in progress(data, total=total, desc="calibrating", enabled=show_progress):
                _run(prepared, batch, n_inputs)
                seen += 1
                if num_batches is not None and seen >= num_batches:
                    break
    if seen == 0:
        raise CalibrationError("calibration saw no batches: the data is empty")
    return recompute_amax(prepared, method, percentile=percentile)


def recompute_amax(
    prepared: nn.Module, method: str | None = None, *, percentile: float | None = None
) -> nn.Module:
    """Set every activation amax from the statistics already collected, by ``method``.

    Calibrate once, evaluate many: after :func:`calibrate`, switch between ``"max"``,
    ``"entropy"``, ``"mse"`` and ``"percentile"`` without running data again.
    """
    plan_of(prepared)
    for q in _activation_quantizers(prepared).values():
        uses_percentile = (method or q.calib.method) == "percentile"
        q.load_calib_amax(method, percentile=percentile if uses_percentile else None)
    return prepared


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


def _num_inputs(model: nn.Module) -> int:
    if isinstance(model, fx.GraphModule):
        return sum(1 for n in model.graph.nodes if n.op == "placeholder")
    return 1


def _run(model: nn.Module, batch: Any, n_inputs: int) -> None:
    if isinstance(batch, torch.Tensor):
        model(batch)
    elif isinstance(batch, dict):
        model(**batch)
    elif isinstance(batch, (tuple, list)):
        model(*batch[:n_inputs])
    else:
        raise TypeError(
            f"calibration batches must be tensors, dicts or tuples/lists, got {type(batch).__name__}; "
            "pass a forward_loop(model) callable for anything else"
        )


def _len_or_none(data: Any) -> int | None:
    try:
        return len(data)
    except TypeError:
        return None
