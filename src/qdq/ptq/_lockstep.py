"""The FP32 and the INT8 forward in lockstep, layer by layer: one pass each for every layer.

Bias correction and AdaRound work layer by layer in forward order, each layer on the INT8 model
with every earlier layer already corrected, against the same layer in the FP32 model. Done one
layer at a time, that is two forwards per layer (each stopped after the layer): a cost that grows
with the square of the depth (EfficientNet-Lite0's 50 layers: 83 s of bias correction on 24
samples, where one forward takes 0.3 s).

:func:`lockstep` runs both forwards once. The FP32 *twin* (a copy of the prepared model with every
quantizer bypassed) runs in a worker thread; the INT8 model runs in the calling thread. At every
planned call of a weighted layer the twin hands over its call (arguments and output) and waits;
the calling thread pairs it with its own call of the same layer (the same
:data:`~qdq.graph.calls.SiteKey`) and lets ``visit`` compute the layer's output — after changing
the layer's quantizer (a bias correction, learned rounding) if it likes — before its forward goes
on. The twin is at most one layer ahead, so memory is that of two forwards plus one handed-over
layer call.

A layer's correction depends on every batch, so the batches are joined into one forward
(:func:`join_batches`). The callers fall back to their layer-by-layer path when the batches cannot
be joined or the joined forward fails before reaching a layer (a ``.pt2`` exported with a static
batch), and when the two forwards call different layers (:class:`Mismatch`: control flow on the
values).

Both forwards use torch's intra-op threads; the torch function mode that tracks calls is
thread-local, so the twin's runtime and the model's runtime do not see each other's calls.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from qdq._modes import eval_no_grad
from qdq.calib.batches import batch_arguments, expected_inputs
from qdq.graph.calls import SiteKey
from qdq.graph.runtime import ArgRef, Call, Site
from qdq.ptq import _layers
from qdq.ptq._layers import Index, Layer
from qdq.quant import QuantMode, quantizer_mode

__all__ = ["Handed", "Mismatch", "join_batches", "lockstep", "passes", "twin_of"]

#: seconds between checks of the other side while waiting (a stuck side is noticed this fast)
_POLL = 0.05


class Mismatch(Exception):  # noqa: N818 - a condition the callers handle, not a failure
    """The FP32 and the INT8 forward called different weighted layers (control flow on values)."""


class Handed(NamedTuple):
    """One planned call of a weighted layer in the FP32 twin."""

    key: SiteKey
    raw: Call
    out: Any


class _Done(NamedTuple):
    error: BaseException | None


class _NotReached(Exception):  # noqa: N818 - internal signal
    """The FP32 forward failed before the first layer: nothing was visited."""


def twin_of(prepared: nn.Module) -> nn.Module:
    """A copy of ``prepared`` to run as the FP32 model (bypass its quantizers while it runs:
    ``quantizer_mode(twin, QuantMode.BYPASS)``)."""
    import qdq

    return qdq.copy_prepared(prepared)


def join_batches(batches: list[Any]) -> Any | None:
    """The batches as one (tensors concatenated along dimension 0), or ``None`` when they cannot
    be joined: other structures, a tensor without a batch dimension, different trailing shapes,
    or other leaves that differ."""
    if len(batches) == 1:
        return batches[0]
    flat = [tree_flatten(b) for b in batches]
    spec = flat[0][1]
    if any(s != spec for _, s in flat[1:]):
        return None
    joined = []
    for leaves in zip(*(f[0] for f in flat), strict=True):
        first = leaves[0]
        if isinstance(first, torch.Tensor):
            if not all(isinstance(t, torch.Tensor) and t.dim() >= 1 for t in leaves):
                return None
            if len({(tuple(t.shape[1:]), t.dtype, t.device) for t in leaves}) != 1:
                return None
            joined.append(torch.cat(leaves))
        elif all(v is first or v == first for v in leaves[1:]):
            joined.append(first)
        else:
            return None
    return tree_unflatten(joined, spec)


#: ``visit(layer, ref, fp32, func, raw, applied) -> output`` at each planned call of a layer in
#: the INT8 forward: ``fp32`` is the twin's call of the same layer, ``raw``/``applied`` the INT8
#: model's arguments before and after its quantizers (:data:`qdq.graph.runtime.Tap`)
Visit = Callable[[Layer, ArgRef, Handed, Any, Call, Call], Any]


def lockstep(prepared: nn.Module, twin: nn.Module, batch: Any, index: Index, visit: Visit) -> bool:
    """Run ``twin`` (FP32) and ``prepared`` (INT8) on ``batch`` in lockstep (module docstring).

    Both run in eval mode without autograd. ``visit`` may raise :class:`~qdq.ptq._layers.Stop`
    to end both forwards (the rest of the model is not needed).

    Returns:
        Whether a layer of ``index`` was reached (``False``: the forwards failed or ended before
        the first one, nothing was visited — the caller may take its other path).

    Raises:
        Mismatch: the two forwards called different layers.
        Exception: what either forward raised after the first layer was reached.
    """
    handed: queue.Queue[Handed | _Done] = queue.Queue(maxsize=1)
    cancel = threading.Event()
    expected = expected_inputs(prepared)
    args, kwargs = batch_arguments(batch, 0, expected)

    def give(item: Handed | _Done) -> None:
        while True:
            if cancel.is_set():
                raise _layers.Stop
            try:
                handed.put(item, timeout=_POLL)
                return
            except queue.Full:
                continue

    def fp32_tap(key: SiteKey, site: Site, func: Any, raw: Call, applied: Call) -> Any:
        out = _layers.invoke(func, applied)
        if _layers.lookup(index, key) is not None:
            give(Handed(key, raw, out))
        return out

    def fp32() -> None:
        error: BaseException | None = None
        try:
            with torch.no_grad(), _layers.tapped(twin, fp32_tap):
                twin(*args, **kwargs)
        except _layers.Stop:
            pass
        except BaseException as err:  # handed to the INT8 side, which raises it
            error = err
        with contextlib.suppress(_layers.Stop):
            give(_Done(error))

    reached = False

    def take() -> Handed | _Done:
        while True:
            try:
                return handed.get(timeout=_POLL)
            except queue.Empty:
                if not worker.is_alive() and handed.empty():
                    return _Done(RuntimeError("the FP32 forward ended without a word"))

    def int8_tap(key: SiteKey, site: Site, func: Any, raw: Call, applied: Call) -> Any:
        nonlocal reached
        hit = _layers.lookup(index, key)
        if hit is None:
            return _layers.invoke(func, applied)
        got = take()
        if isinstance(got, _Done):
            if got.error is not None and not reached:
                raise _NotReached from got.error
            if got.error is not None:
                raise got.error
            raise Mismatch(f"the INT8 forward called {key}, the FP32 forward had ended")
        if got.key != key:
            raise Mismatch(f"the INT8 forward called {key} where the FP32 forward called {got.key}")
        reached = True
        return visit(hit[0], hit[1], got, func, raw, applied)

    worker = threading.Thread(target=fp32, name="qdq-fp32-twin", daemon=True)
    with quantizer_mode(twin, QuantMode.BYPASS), eval_no_grad(twin), eval_no_grad(prepared):
        worker.start()
        try:
            with _layers.tapped(prepared, int8_tap):
                try:
                    prepared(*args, **kwargs)
                except _layers.Stop:
                    return True
                except _NotReached:
                    return False
                except Mismatch:
                    raise
                except Exception:
                    if not reached:
                        return False
                    raise
            end = take()
            if isinstance(end, Handed):
                raise Mismatch(f"the FP32 forward called {end.key} after the INT8 forward ended")
            if end.error is not None:
                raise end.error
            return reached
        finally:
            cancel.set()
            while worker.is_alive():
                with contextlib.suppress(queue.Empty):
                    handed.get(timeout=_POLL)
            worker.join()


def passes(
    prepared: nn.Module,
    ordered: list[Layer],
    batches: list[Any],
    visit: Visit,
    alone: Callable[[Layer], Any],
    done: dict[str, Any],
    notes: list[str],
    what: str,
) -> None:
    """Do the layers ``ordered`` (forward order) in lockstep passes over the joined ``batches``.

    ``visit`` does a layer called once per forward when the INT8 forward reaches it (it records
    the layer in ``done`` and returns the call's output). A layer called several times ends a pass
    (its work needs all its calls, and the layers called in between would see it undone):
    ``done[path] = alone(layer)`` does it on its own, then the next pass runs on, the layers in
    ``done`` passing through. Nothing is done when the batches cannot be joined or the joined
    forward fails before its first layer; when the forwards call different layers a note says so
    (``what`` the layers after it then were, e.g. "corrected one at a time") and the passes end.
    The caller does what is not in ``done`` layer by layer."""
    joined = join_batches(batches)
    if joined is None or not ordered:
        return
    twin = twin_of(prepared)
    index = _layers.index_of(ordered)
    several: list[Layer] = []

    def step(layer: Layer, ref: ArgRef, fp: Handed, func: Any, raw: Call, applied: Call) -> Any:
        if layer.path in done:
            return _layers.invoke(func, applied)
        if layer.calls > 1:
            several.append(layer)
            raise _layers.Stop
        return visit(layer, ref, fp, func, raw, applied)

    while len(done) < len(ordered):
        several.clear()
        try:
            if not lockstep(prepared, twin, joined, index, step):
                return
        except Mismatch as err:
            notes.append(f"the FP32 and INT8 forwards called different layers ({err}): the "
                         f"layers after it were {what}")  # fmt: skip
            return
        if not several:
            return
        done[several[0].path] = alone(several[0])
