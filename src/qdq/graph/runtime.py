"""The runtime that applies a plan at the call sites of the user's own modules.

:class:`SiteRuntime` lives on the prepared model (a deep copy of the user's model, same class,
same attributes). It sees every call through the machinery of :mod:`qdq.graph.calls` and, at the
keys the plan names, replaces arguments with their quantized values:

* an activation argument → ``quantizer(x)`` (a tensor read by several quantized consumers is
  quantized once and shared, as one Q with one scale — rule S01; the shared copy is kept only as
  long as the model keeps the tensor itself);
* the weight of a planned Conv/Linear/MatMul call → ``weight_quantizer(weight)``, and, when
  that quantizer holds a bias correction (:mod:`qdq.ptq.bias`), the call's bias (third argument
  of ``F.conv*``/``F.linear``, or ``bias=``) → ``weight_quantizer.corrected_bias(bias, weight)``.

Because it acts on calls, not on a traced graph, the prepared model keeps everything the float one
had: its ``forward`` signature and outputs, ``train()``/``eval()`` branches, attributes
(``model.stride``, ``model.names``), hooks, ``state_dict`` (plus the quantizers' ``amax``), and it
works under ``torch.export``, the TorchScript tracer, ``deepcopy`` and pickling.

Under ``torch.compile`` dynamo traces this runtime with the model's code (``fullgraph=True`` where
the float model allows it). What dynamo cannot trace is eager-only (:func:`compiling`): the
share-once cache (tensor identities, weakrefs and version counters; in the graph every reader
quantizes and the compiler merges the identical nodes), the hit counts, and the bytecode look-up
that tells ``x += y`` from ``x.add_(y)`` (in a functional graph writing the result into ``x`` is
exactly Python's semantics for both).
"""

from __future__ import annotations

import dis
import functools
import os
import sys
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from qdq.graph.calls import PARTS, CallTracker, LeafCalls, SiteKey, compiling, is_leaf
from qdq.quant import Quantizer

__all__ = ["ArgRef", "Call", "Site", "SiteRuntime", "Tap", "runtime_of"]

#: where an argument sits: a position, a keyword, or ``(position, index)`` inside a list argument
ArgRef = int | str | tuple[int, int]
#: the arguments of one call: ``(args, kwargs)``
Call = tuple[tuple[Any, ...], dict[str, Any]]
_RUNTIME_ATTR = "qdq_runtime"


@dataclass
class Site:
    """What to quantize at one call site: ``(argument, quantizer)`` pairs."""

    actions: list[tuple[ArgRef, nn.Module]] = field(default_factory=list)
    hits: int = 0


#: an observer of planned calls (:attr:`SiteRuntime.tap`): ``tap(key, site, func, raw, applied)``
#: runs the call itself and returns its result; ``raw`` are the arguments as the model passed
#: them, ``applied`` the ones with the quantizers applied
Tap = Callable[[SiteKey, Site, Callable[..., Any], Call, Call], Any]


def _forget(cache: dict[Any, Any], key: Any) -> Callable[[weakref.ref[Any]], None]:
    """A weakref callback that drops ``cache[key]`` when its tensor dies (if the entry is still
    the one made with that weakref: the key's id may be reused by a later tensor)."""

    def drop(ref: weakref.ref[Any]) -> None:
        hit = cache.get(key)
        if hit is not None and hit[0] is ref:
            del cache[key]

    return drop


#: one action of a site as the runtime runs it: ``(kind, where, index, quantizer, cached)``:
#: kind 0 a position (``where``), 1 a keyword (``where``), 2 item ``index`` of a list argument
#: at position ``where``; ``cached``: the quantizer acts at more than one call of a forward, so
#: its output is kept for the next reader of the same tensor
_Action = tuple[int, Any, int, nn.Module, bool]


@dataclass(frozen=True)
class _Plan:
    """What :meth:`SiteRuntime.refresh` decided once for one site."""

    site: Site
    actions: tuple[_Action, ...]
    #: a quantizer acts on argument 0 (an in-place call there runs out of place)
    first: bool
    #: quantizers of the weight argument, which may hold a bias correction
    weights: tuple[Quantizer, ...]


class SiteRuntime(CallTracker):
    """Applies :class:`Site` actions at their keys whenever the prepared model runs.

    What can be decided once per site is decided in :meth:`refresh` (at construction): which
    families each module's sites key (the calls of other families are run as they are and not
    counted), where each action reads its argument, which quantizers act at more than one call
    of a forward (only their outputs are kept for a second reader), which quantizers the runtime
    runs itself (their modules carry no tracker hooks). Call :meth:`refresh` after changing
    :attr:`sites`. Which modules carry the tracker's hooks is decided when they are installed
    (:meth:`hooked`).

    Attributes:
        sites: the planned call sites by key.
        unused: after a forward, the planned keys that were not reached (diagnostics).
    """

    def __init__(
        self,
        root: nn.Module,
        sites: dict[SiteKey, Site],
        inputs: tuple[tuple[str, tuple[int, ...], torch.dtype], ...] = (),
        leaf_calls: dict[str, LeafCalls] | None = None,
    ) -> None:
        super().__init__(root)
        self.sites = sites
        #: ``(name, shape, dtype)`` of the example inputs the plan was recorded with
        self.inputs = inputs
        #: what each leaf module did in the recorded forward (:attr:`Recording.leaf_calls
        #: <qdq.graph.record.Recording.leaf_calls>`): which leaves need no hooks (:meth:`hooked`)
        self.leaf_calls = leaf_calls or {}
        #: per forward: ``(id(x), id(quantizer))`` → ``(weakref to x, x._version, quantized x
        #: or None)``
        self._cache: dict[tuple[int, int], tuple[weakref.ref[torch.Tensor], int, Any]] = {}
        #: set by :mod:`qdq.ptq` while it measures layers (inside a try/finally); else ``None``
        self.tap: Tap | None = None
        self._plans: dict[SiteKey, _Plan] = {}
        self.refresh()

    def refresh(self) -> None:
        """Decide, from :attr:`sites`, what each site does (see the class docstring)."""
        uses: dict[int, int] = {}
        for key, site in self.sites.items():
            for _, q in site.actions:  # a wildcard site acts at every call of its family
                uses[id(q)] = uses.get(id(q), 0) + (1 if key[2] is not None else 2)
        plans = {}
        wanted: dict[str, set[str]] = {}
        for key, site in self.sites.items():
            wanted.setdefault(key[0], set()).add(key[1])
            actions: list[_Action] = []
            for ref, q in site.actions:
                cached = uses[id(q)] > 1
                if isinstance(ref, str):
                    actions.append((1, ref, 0, q, cached))
                elif isinstance(ref, tuple):
                    actions.append((2, ref[0], ref[1], q, cached))
                else:
                    actions.append((0, ref, 0, q, cached))
            weights = tuple(
                q for ref, q in site.actions if ref in (1, "weight") and isinstance(q, Quantizer)
            )
            first = any(ref == 0 for ref, _ in site.actions)
            plans[key] = _Plan(site, tuple(actions), first, weights)
        self._plans = plans
        self.wanted = {path: frozenset(families) for path, families in wanted.items()}

    def hooked(self) -> list[nn.Module]:
        """Every module but those whose calls the runtime never keys, unless the plan keys calls
        at their own path: the quantizers it runs itself, the leaf modules that need nothing
        (:meth:`_needs_no_hooks`), and the ``nn.Sequential`` containers below the root whose
        ``forward`` is ``nn.Sequential``'s (it calls its children, each keyed at its own path,
        and no torch function: nothing is keyed at a container's path). The root keeps its
        hooks: its entry is what starts and ends a forward's books."""
        mine = {id(q) for site in self.sites.values() for _, q in site.actions}
        wanted = self.wanted or {}
        return [
            m
            for m, path in self.paths.items()
            if path in wanted
            or not (
                id(m) in mine
                or (path and type(m).forward is nn.Sequential.forward)
                or self._needs_no_hooks(m, path)
            )
        ]

    def _needs_no_hooks(self, module: nn.Module, path: str) -> bool:
        """Whether a leaf module may run without the tracker's hooks (issue 48: a hooked module
        call is the slow path of ``nn.Module.__call__`` and two Python hooks; 115 of
        EfficientNet-B0's 330 per forward need nothing). No site at its path (checked by the
        caller), a ``torch.nn`` module without children (whose forward calls no module), and
        recorded: every torch call its forward made is of a family no site wants at any path
        it was called at, so unhooked, its calls are seen there and counted nowhere, as when
        the hooks marked them as inside a leaf. A leaf the recording never ran keeps its hooks."""
        calls = self.__dict__.get("leaf_calls", {}).get(path)  # absent on runtimes pickled before
        if calls is None or not is_leaf(module) or isinstance(module, torch.jit.ScriptModule):
            return False
        if isinstance(module, Quantizer) or next(iter(module.children()), None) is not None:
            return False
        families, called_at = calls
        wanted = self.wanted or {}
        return PARTS not in families and not any(families & wanted.get(p, set()) for p in called_at)

    # ---------------------------------------------------------------- apply
    def _quantize(self, quantizer: nn.Module, x: Any, cached: bool, eager: bool) -> Any:
        """``quantizer(x)``, shared with the next reader of ``x`` when ``cached``; ``eager``:
        dynamo is not compiling (asked once per call by :meth:`_apply`)."""
        if not isinstance(x, torch.Tensor):
            return x
        if not cached or not eager or x.is_inference():
            # a quantizer that acts at one call of a forward has no second reader to share its
            # output with; under torch.compile every reader quantizes x itself: the values are
            # the same, and the compiler merges the identical fake-quant nodes (tensor
            # identities, weakrefs and version counters are what dynamo cannot trace); an
            # inference-mode tensor has no version counter to tell an in-place change, so it is
            # not cached either
            return quantizer(x)
        key = (id(x), id(quantizer))
        hit = self._cache.get(key)
        # the version counter tells an x changed in place since (x.relu_(), x.add_(y)): its
        # quantized copy is stale then
        if hit is not None and hit[0]() is x and hit[1] == x._version:
            return x if hit[2] is None else hit[2]
        out = quantizer(x)
        # x is held weakly: the entry (and a quantized copy) lives as long as the model keeps x,
        # not to the end of the forward (holding every quantized input until then kept all of
        # them alive at once: EfficientNet-Lite0's calibration took 1.95x its FP32 pass, 1.27x
        # without). A quantizer that returns x itself (bypass, calibrate) stores no reference.
        ref = weakref.ref(x, _forget(self._cache, key))
        self._cache[key] = (ref, x._version, None if out is x else out)
        return out

    def _apply(
        self, plan: _Plan, args: tuple[Any, ...], kwargs: dict[str, Any], fresh: bool = False
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        new_args = list(args)
        new_kwargs = dict(kwargs) if kwargs else {}
        quantize = self._quantize
        eager = not compiling()  # asked once per call, not per action
        for kind, where, index, quantizer, cached in plan.actions:
            if kind == 0:
                if where < len(new_args):
                    new_args[where] = quantize(
                        quantizer, new_args[where], cached and not (fresh and where == 0), eager
                    )
            elif kind == 1:
                if where in new_kwargs:
                    new_kwargs[where] = quantize(quantizer, new_kwargs[where], cached, eager)
            else:
                outside = where >= len(new_args)
                seq = new_kwargs.get("tensors") if outside else new_args[where]
                if isinstance(seq, (list, tuple)) and index < len(seq):
                    items = list(seq)
                    items[index] = quantize(quantizer, items[index], cached, eager)
                    if outside:
                        new_kwargs["tensors"] = items
                    else:
                        new_args[where] = items
        for quantizer in plan.weights:
            if quantizer.has_bias_delta:
                _correct_bias(quantizer, new_args, new_kwargs)
        if eager:  # a counter read under dynamo would be guarded on: a recompile per call
            plan.site.hits += 1
        return tuple(new_args), new_kwargs

    # ------------------------------------------------------------- tracker
    def on_call(
        self,
        func: Callable[..., Any],
        key: SiteKey,
        op: str,
        target: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        plans = self._plans
        plan = plans.get(key) or plans.get((key[0], key[1], None))
        if plan is None:
            return func(*args, **kwargs)
        if plan.first:
            pure = _out_of_place(op, target, kwargs)
            if pure is not None:
                rebinds = str(target) in _AUGMENTED or (not compiling() and _augmented_assignment())
                return self._in_place(plan, pure, args, kwargs, rebinds=rebinds)
        new_args, new_kwargs = self._apply(plan, args, kwargs)
        if self.tap is not None:
            return self.tap(key, plan.site, func, (args, kwargs), (new_args, new_kwargs))
        return func(*new_args, **new_kwargs)

    def _in_place(
        self,
        plan: _Plan,
        pure: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        rebinds: bool,
    ) -> Any:
        """An in-place op (``x.add_(y)``, ``x.relu_()``, ``F.relu(x, inplace=True)``, ``x += y``)
        whose ``x`` is quantized here.

        The op runs out of place on a fresh quantized ``x`` (never the cached copy other readers
        of ``x`` share). ``x += y`` rebinds ``x`` to the result, as Python does (the residual Add
        of ResNet-style code), and leaves the old ``x`` object as it was: a quantizer may have
        saved it for backward, and the exported graph stays that of ``x + y``. A named in-place
        op writes the result into ``x`` and returns ``x``: code that calls ``x.add_(y)`` and then
        reads ``x`` sees the new value, as in the float model. Both reach the runtime as
        ``add_``; the calling instruction tells them apart (:func:`_augmented_assignment`).
        """
        x = args[0]
        args, kwargs = self._apply(plan, args, kwargs, fresh=True)
        out = pure(*args, **kwargs)
        if rebinds or not isinstance(x, torch.Tensor) or out is x:
            return out
        return x.copy_(out)

    def on_leaf_enter(
        self, module: nn.Module, key: SiteKey, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        plans = self._plans
        plan = plans.get(key) or plans.get((key[0], key[1], None))
        if plan is None:
            return None
        # nn.ReLU(inplace=True) and the like change their input: give them a copy of their own,
        # never the quantized x that other readers of x share
        fresh = getattr(module, "inplace", False) is True
        mode = self._mode
        if mode is None or compiling() or not _on_top(mode):
            return self._apply(plan, args, kwargs, fresh=fresh)
        # a hook runs with the tracker's mode on: every tensor method the quantizers call would
        # be a Python call of the mode, passed through (leaf_depth) and counting nothing (723 per
        # EfficientNet-B0 forward). Off, as it is for the quantizers that on_call runs (torch
        # takes a mode off its stack while the mode handles a call). Under dynamo the calls cost
        # nothing at run time, and the stack is left as it is.
        torch._C._pop_torch_function_stack()
        try:
            return self._apply(plan, args, kwargs, fresh=fresh)
        finally:
            torch._C._push_on_torch_function_stack(mode)

    def on_deactivate(self) -> None:
        self._cache.clear()

    def reset_hits(self) -> None:
        """Zero every site's hit count."""
        for site in self.sites.values():
            site.hits = 0

    def unreached(self) -> list[SiteKey]:
        """Planned sites with no hit since :meth:`reset_hits`."""
        return [k for k, s in self.sites.items() if s.hits == 0]


def _on_top(mode: Any) -> bool:
    """Whether ``mode`` is the innermost torch function mode (no other one entered since)."""
    depth = torch._C._len_torch_function_stack()
    return depth > 0 and torch._C._get_function_stack_at(depth - 1) is mode


#: augmented assignments (``x += y``): Python rebinds ``x`` to the result
_AUGMENTED = {"__iadd__": "__add__", "__imul__": "__mul__", "__isub__": "__sub__"}


def _out_of_place(op: str, target: Any, kwargs: dict[str, Any]) -> Callable[..., Any] | None:
    """The pure form of an in-place call (``x.add_`` → ``Tensor.add``, ``F.relu(.., inplace=True)``
    → ``F.relu`` with ``inplace=False``), or ``None`` for a call that changes no argument."""
    if op == "call_method":
        name = str(target)
        if name in _AUGMENTED:
            return getattr(torch.Tensor, _AUGMENTED[name])
        if name.endswith("_") and not name.startswith("_"):
            pure = getattr(torch.Tensor, name[:-1], None)
            return pure if callable(pure) else None
        return None
    if op == "call_function" and kwargs.get("inplace") is True and callable(target):
        return functools.partial(_without_inplace, target)
    return None


_QDQ = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: code that sits between the model's code and the runtime: torch, qdq's call tracking and
#: quantizers (not the rest of qdq: the zoo's models are model code)
_INTERNAL = (
    os.path.join(os.path.dirname(torch.__file__), ""),
    os.path.join(_QDQ, "graph", ""),
    os.path.join(_QDQ, "quant", ""),
)
#: per code object: the bytecode offsets of augmented assignments (``x += y``)
_AUGMENTED_AT: dict[types.CodeType, frozenset[int]] = {}


def _augmented_assignment() -> bool:
    """Whether the model code that made the current call did it with ``x += y`` (``-=``, ``*=``
    ...) rather than a method call such as ``x.add_(y)``: the instruction the first frame
    outside torch and qdq's graph/quant code is executing."""
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL):
        frame = frame.f_back
    if frame is None:
        return False
    code = frame.f_code
    offsets = _AUGMENTED_AT.get(code)
    if offsets is None:
        offsets = frozenset(
            i.offset
            for i in dis.get_instructions(code)
            if i.opname.startswith("INPLACE_")  # Python 3.10
            or (i.opname == "BINARY_OP" and i.argrepr.endswith("="))  # 3.11+: "+=", "*=" ...
        )
        _AUGMENTED_AT[code] = offsets
    return frame.f_lasti in offsets or frame.f_lasti * 2 in offsets


def _without_inplace(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return func(*args, **{**kwargs, "inplace": False})


def _correct_bias(quantizer: Quantizer, args: list[Any], kwargs: dict[str, Any]) -> None:
    """Replace the bias of an ``F.conv*``/``F.linear`` call (third argument or ``bias=``) by the
    weight quantizer's corrected bias (:meth:`~qdq.quant.Quantizer.corrected_bias`)."""
    weight = args[1] if len(args) > 1 else kwargs.get("weight")
    if len(args) > 2:
        args[2] = quantizer.corrected_bias(args[2], weight)
    else:
        bias = quantizer.corrected_bias(kwargs.get("bias"), weight)
        if bias is not None:
            kwargs["bias"] = bias


def runtime_of(prepared: nn.Module) -> SiteRuntime | None:
    """The :class:`SiteRuntime` of a prepared model (``None`` for other models)."""
    rt = getattr(prepared, _RUNTIME_ATTR, None)
    return rt if isinstance(rt, SiteRuntime) else None


def install_runtime(prepared: nn.Module, runtime: SiteRuntime) -> None:
    """Attach ``runtime`` to ``prepared`` and register its hooks."""
    runtime.install()
    object.__setattr__(prepared, _RUNTIME_ATTR, runtime)
