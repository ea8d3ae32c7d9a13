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
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from qdq.graph.calls import CallTracker, SiteKey
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


class SiteRuntime(CallTracker):
    """Applies :class:`Site` actions at their keys whenever the prepared model runs.

    Attributes:
        sites: the planned call sites by key.
        unused: after a forward, the planned keys that were not reached (diagnostics).
    """

    def __init__(
        self,
        root: nn.Module,
        sites: dict[SiteKey, Site],
        inputs: tuple[tuple[str, tuple[int, ...], torch.dtype], ...] = (),
    ) -> None:
        super().__init__(root)
        self.sites = sites
        #: ``(name, shape, dtype)`` of the example inputs the plan was recorded with
        self.inputs = inputs
        #: per forward: ``(id(x), id(quantizer))`` → ``(weakref to x, quantized x or None)``
        self._cache: dict[tuple[int, int], tuple[weakref.ref[torch.Tensor], Any]] = {}
        #: set by :mod:`qdq.ptq` while it measures layers (inside a try/finally); else ``None``
        self.tap: Tap | None = None

    # ---------------------------------------------------------------- apply
    def _quantize(self, quantizer: nn.Module, x: Any, fresh: bool = False) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        if fresh:
            return quantizer(x)
        key = (id(x), id(quantizer))
        hit = self._cache.get(key)
        if hit is not None and hit[0]() is x:
            return x if hit[1] is None else hit[1]
        out = quantizer(x)
        # x is held weakly: the entry (and a quantized copy) lives as long as the model keeps x,
        # not to the end of the forward (holding every quantized input until then kept all of
        # them alive at once: EfficientNet-Lite0's calibration took 1.95x its FP32 pass, 1.27x
        # without). A quantizer that returns x itself (bypass, calibrate) stores no reference.
        self._cache[key] = (weakref.ref(x, _forget(self._cache, key)), None if out is x else out)
        return out

    def _apply(
        self, site: Site, args: tuple[Any, ...], kwargs: dict[str, Any], fresh: bool = False
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        new_args = list(args)
        new_kwargs = dict(kwargs)
        for ref, quantizer in site.actions:
            if isinstance(ref, str):
                if ref in new_kwargs:
                    new_kwargs[ref] = self._quantize(quantizer, new_kwargs[ref])
            elif isinstance(ref, tuple):
                pos, index = ref
                seq = new_kwargs.get("tensors") if pos >= len(new_args) else new_args[pos]
                if isinstance(seq, (list, tuple)) and index < len(seq):
                    items = list(seq)
                    items[index] = self._quantize(quantizer, items[index])
                    if pos >= len(new_args):
                        new_kwargs["tensors"] = items
                    else:
                        new_args[pos] = items
            elif ref < len(new_args):
                new_args[ref] = self._quantize(quantizer, new_args[ref], fresh and ref == 0)
        for ref, quantizer in site.actions:
            if (
                ref in (1, "weight")
                and isinstance(quantizer, Quantizer)
                and quantizer.has_bias_delta
            ):
                _correct_bias(quantizer, new_args, new_kwargs)
        site.hits += 1
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
        site = self.sites.get(key) or self.sites.get((key[0], key[1], None))
        if site is None:
            return func(*args, **kwargs)
        if _in_place(op, target) and any(ref == 0 for ref, _ in site.actions):
            # x += y / x.add_(y) with x quantized here: the quantized x is a fresh tensor (never
            # the cached one another reader of x gets) and the op runs out of place on it, so no
            # quantizer output is mutated. x += y rebinds x to the result as usual; x itself is
            # left as it was (code that calls x.add_(y) and then reads x would see the old x)
            args, kwargs = self._apply(site, args, kwargs, fresh=True)
            return getattr(torch.Tensor, _OUT_OF_PLACE[str(target)])(*args, **kwargs)
        new_args, new_kwargs = self._apply(site, args, kwargs)
        if self.tap is not None:
            return self.tap(key, site, func, (args, kwargs), (new_args, new_kwargs))
        return func(*new_args, **new_kwargs)

    def on_leaf_enter(
        self, module: nn.Module, key: SiteKey, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        site = self.sites.get(key) or self.sites.get((key[0], key[1], None))
        if site is None:
            return None
        return self._apply(site, args, kwargs)

    def on_deactivate(self) -> None:
        self._cache.clear()

    def reset_hits(self) -> None:
        """Zero every site's hit count."""
        for site in self.sites.values():
            site.hits = 0

    def unreached(self) -> list[SiteKey]:
        """Planned sites with no hit since :meth:`reset_hits`."""
        return [k for k, s in self.sites.items() if s.hits == 0]


#: in-place Tensor methods the plan may quantize the ``self`` operand of, and their pure forms
_OUT_OF_PLACE = {
    "add_": "add",
    "__iadd__": "__add__",
    "mul_": "mul",
    "__imul__": "__mul__",
    "sub_": "sub",
    "__isub__": "__sub__",
}


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


def _in_place(op: str, target: Any) -> bool:
    return op == "call_method" and str(target) in _OUT_OF_PLACE


def runtime_of(prepared: nn.Module) -> SiteRuntime | None:
    """The :class:`SiteRuntime` of a prepared model (``None`` for other models)."""
    rt = getattr(prepared, _RUNTIME_ATTR, None)
    return rt if isinstance(rt, SiteRuntime) else None


def install_runtime(prepared: nn.Module, runtime: SiteRuntime) -> None:
    """Attach ``runtime`` to ``prepared`` and register its hooks."""
    runtime.install()
    object.__setattr__(prepared, _RUNTIME_ATTR, runtime)
