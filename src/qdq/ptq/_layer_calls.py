"""The calls a quantizer acts on, captured during one FP32 forward so they can be re-run alone.

A prepared model applies its quantizers at call sites (:mod:`qdq.graph.runtime`). To measure what
one activation quantizer does to *its layer*, the layer's call is captured in a float forward and
re-run with only that input fake-quantized: upstream stays FP32, the layer's other operands (its
weight) are fake-quantized as in the INT8 model.

:class:`LayerCalls` is a second :class:`~qdq.graph.calls.CallTracker` installed *after* the
runtime, so its torch function mode sits above the runtime's: it sees every call first, exactly as
the runtime does, and counts the same :data:`~qdq.graph.calls.SiteKey`. At every planned site
where a chosen quantizer acts it keeps a :class:`LayerCall`:

* a site that also applies a weight quantizer (``F.conv*``, ``F.conv_transpose*``, ``F.linear``,
  a MatMul with a parameter; a module or a functional call, any ``groups``, any call of a module
  called several times) keeps the function, copies of its tensor arguments and its FP32 output,
  so :meth:`LayerCall.rerun` computes the layer output with any amax;
* any other site (Add, Concat, pooling, activation MatMuls, leaf modules) keeps only the tensors
  the quantizer reads: their error is the error of the Q/DQ itself.

Calling a submodule of the prepared model directly is *not* used: the runtime would then apply the
quantizers of that module's first call, whichever call is meant.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

from qdq.graph.calls import CallTracker, SiteKey
from qdq.graph.runtime import ArgRef, SiteRuntime
from qdq.quant import Quantizer, QuantMode, fake_quant_unchecked

__all__ = [
    "LayerCall",
    "LayerCalls",
    "as_int8",
    "fake_quantize",
    "get_arg",
    "is_weight_quantizer",
    "set_arg",
]


def is_weight_quantizer(q: Quantizer) -> bool:
    """Whether ``q`` quantizes a weight (its point is ``"<op>:weight"``)."""
    return q.name.endswith(":weight")


def fake_quantize(q: Quantizer, x: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """``x`` fake-quantized by ``q``'s spec with ``amax`` (what ``q`` does in QUANTIZE mode)."""
    return fake_quant_unchecked(
        x,
        amax,
        num_bits=q.spec.num_bits,
        axis=q.spec.axis,
        narrow_range=q.spec.narrow_range,
        fmt=q.spec.format,
    )


def as_int8(q: Quantizer, mode: QuantMode, x: Any) -> Any:
    """``x`` as the INT8 model feeds it on: quantized unless ``q`` was set to bypass."""
    if not isinstance(x, torch.Tensor) or mode is QuantMode.BYPASS:
        return x
    return fake_quantize(q, x, q.amax.to(x.device))


def get_arg(args: tuple[Any, ...], kwargs: dict[str, Any], ref: ArgRef) -> Any:
    """The argument at ``ref`` (as :class:`~qdq.graph.runtime.SiteRuntime` reads it), or ``None``."""
    if isinstance(ref, str):
        return kwargs.get(ref)
    if isinstance(ref, tuple):
        pos, index = ref
        seq = kwargs.get("tensors") if pos >= len(args) else args[pos]
        return seq[index] if isinstance(seq, (list, tuple)) and index < len(seq) else None
    return args[ref] if ref < len(args) else None


def set_arg(
    args: tuple[Any, ...], kwargs: dict[str, Any], ref: ArgRef, value: Any
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """New ``(args, kwargs)`` with the argument at ``ref`` replaced by ``value``."""
    new_args, new_kwargs = list(args), dict(kwargs)
    if isinstance(ref, str):
        new_kwargs[ref] = value
    elif isinstance(ref, tuple):
        pos, index = ref
        items = list(new_kwargs["tensors"] if pos >= len(new_args) else new_args[pos])
        items[index] = value
        if pos >= len(new_args):
            new_kwargs["tensors"] = items
        else:
            new_args[pos] = items
    else:
        new_args[ref] = value
    return tuple(new_args), new_kwargs


@dataclass
class LayerCall:
    """One call at a planned site, seen by one quantizer (``quantizer``) in the FP32 forward.

    Attributes:
        key: the site's key.
        quantizer: the quantizer whose amax is being chosen.
        refs: where it acts in this call.
        args, kwargs: the call's arguments (tensors copied, parameters by reference).
        func: the function to re-run, ``None`` when only the tensors at ``refs`` are kept.
        output: the FP32 output of ``func`` (its first tensor).
        others: the site's other quantizers and where they act (the weight quantizer ...).
        superseded: the quantizer's layer is a later call (the conv after a zero pad): do not
            measure this one.
    """

    key: SiteKey
    quantizer: Quantizer
    refs: tuple[ArgRef, ...]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    func: Callable[..., Any] | None = None
    output: torch.Tensor | None = None
    others: tuple[tuple[ArgRef, Quantizer], ...] = ()
    superseded: bool = False

    def tensors(self) -> list[torch.Tensor]:
        """The FP32 tensors the quantizer reads in this call."""
        found = (get_arg(self.args, self.kwargs, ref) for ref in self.refs)
        return [t for t in found if isinstance(t, torch.Tensor) and t.is_floating_point()]

    def with_others_quantized(self, modes: dict[Quantizer, QuantMode]) -> LayerCall:
        """A copy whose other operands are fake-quantized as in the INT8 model."""
        args, kwargs = self.args, self.kwargs
        for ref, q in self.others:
            args, kwargs = set_arg(
                args, kwargs, ref, as_int8(q, modes[q], get_arg(args, kwargs, ref))
            )
        return LayerCall(self.key, self.quantizer, self.refs, args, kwargs, self.func, self.output)

    def rerun(self, amax: torch.Tensor) -> torch.Tensor:
        """The output of the call with the quantizer's inputs fake-quantized with ``amax``."""
        assert self.func is not None
        args, kwargs = self.args, self.kwargs
        for ref in self.refs:
            x = get_arg(args, kwargs, ref)
            if isinstance(x, torch.Tensor):
                args, kwargs = set_arg(args, kwargs, ref, fake_quantize(self.quantizer, x, amax))
        out = _first_tensor(self.func(*args, **kwargs))
        if out is None:
            raise TypeError(f"{self.func} returned no tensor")
        return out


class LayerCalls(CallTracker):
    """Keeps a :class:`LayerCall` for every call at a site where a ``targets`` quantizer acts.

    Install it (:meth:`install`, default order) on a prepared model after its runtime and run the
    model with every quantizer bypassed; read :attr:`calls`, then clear it for the next batch.

    A quantizer the plan moved in front of a zero Pad (rule P08: ``Conv2dStaticSamePadding``,
    explicit ``F.pad`` before a conv) acts on the pad's input; Q/DQ commutes exactly with zero
    padding, so the weighted call reading the padded tensor is kept as that quantizer's layer, and
    the pad's own record is marked :attr:`LayerCall.superseded`.
    """

    def __init__(self, root: nn.Module, runtime: SiteRuntime, targets: set[Quantizer]) -> None:
        super().__init__(root)
        self.runtime = runtime
        self.targets = targets
        self.calls: list[LayerCall] = []
        #: tensors copied in this forward: id → (tensor, its version when copied, copy)
        self._copies: dict[int, tuple[torch.Tensor, int, torch.Tensor]] = {}
        #: zero-padded outputs of target sites in this forward: id → (tensor, the pad's records)
        self._padded: dict[int, tuple[torch.Tensor, list[LayerCall]]] = {}
        self._pending_pad: tuple[nn.Module, list[LayerCall]] | None = None

    def _actions(self, key: SiteKey) -> list[tuple[ArgRef, Quantizer]]:
        sites = self.runtime.sites
        site = sites.get(key) or sites.get((key[0], key[1], None))
        if site is None:
            return []
        return [(ref, q) for ref, q in site.actions if isinstance(q, Quantizer)]

    def on_call(
        self,
        func: Callable[..., Any],
        key: SiteKey,
        op: str,
        target: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        actions = self._actions(key)
        weighted = any(is_weight_quantizer(q) for _, q in actions)
        if weighted and self._padded:
            actions += self._moved_in_front_of_pad(args)
        if not any(q in self.targets for _, q in actions):
            return func(*args, **kwargs)
        # copied before the call, which may work in place
        if weighted:
            kept_args, kept_kwargs = self._copy_all(args), self._copy_all(kwargs)
        else:
            kept_args, kept_kwargs = self._copy_refs(actions, args, kwargs)
        out = func(*args, **kwargs)
        fp32 = _first_tensor(out) if weighted else None
        if fp32 is not None:
            self._keep(actions, key, kept_args, kept_kwargs, func, fp32.detach().clone())
            return out
        # a weighted call without a tensor output is measured on its input
        calls = self._keep(actions, key, kept_args, kept_kwargs, None, None)
        if isinstance(out, torch.Tensor) and _is_zero_pad_call(func, args, kwargs):
            self._padded[id(out)] = (out, calls)
        return out

    def on_leaf_enter(
        self, module: nn.Module, key: SiteKey, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        actions = self._actions(key)
        if any(q in self.targets for _, q in actions):
            kept_args, kept_kwargs = self._copy_refs(actions, args, kwargs)
            calls = self._keep(actions, key, kept_args, kept_kwargs, None, None)
            if isinstance(module, _CONSTANT_PADS) and float(module.value) == 0.0:
                self._pending_pad = (module, calls)
        return None

    def on_leaf_exit(self, module: nn.Module, output: Any) -> None:
        pending, self._pending_pad = self._pending_pad, None
        if pending is not None and pending[0] is module and isinstance(output, torch.Tensor):
            self._padded[id(output)] = (output, pending[1])

    def on_deactivate(self) -> None:
        self._copies.clear()
        self._padded.clear()
        self._pending_pad = None

    # ---------------------------------------------------------------- helpers
    def _moved_in_front_of_pad(self, args: tuple[Any, ...]) -> list[tuple[ArgRef, Quantizer]]:
        """``(position, quantizer)`` of the arguments that are zero-padded quantized tensors."""
        moved: list[tuple[ArgRef, Quantizer]] = []
        for pos, value in enumerate(args):
            hit = self._padded.get(id(value)) if isinstance(value, torch.Tensor) else None
            if hit is None or hit[0] is not value:
                continue
            for call in hit[1]:
                call.superseded = True
                moved.append((pos, call.quantizer))
        return moved

    def _keep(
        self,
        actions: list[tuple[ArgRef, Quantizer]],
        key: SiteKey,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        func: Callable[..., Any] | None,
        output: torch.Tensor | None,
    ) -> list[LayerCall]:
        kept = []
        for target in dict.fromkeys(q for _, q in actions if q in self.targets):
            refs = tuple(ref for ref, q in actions if q is target)
            others = tuple((ref, q) for ref, q in actions if q is not target)
            kept.append(LayerCall(key, target, refs, args, kwargs, func, output, others))
        self.calls.extend(kept)
        return kept

    def _copy(self, t: torch.Tensor) -> torch.Tensor:
        if isinstance(t, nn.Parameter):
            return t
        hit = self._copies.get(id(t))
        if hit is not None and hit[0] is t and hit[1] == t._version:
            return hit[2]
        copy = t.detach().clone()
        self._copies[id(t)] = (t, t._version, copy)
        return copy

    def _copy_all(self, value: Any) -> Any:
        return tree_map(lambda v: self._copy(v) if isinstance(v, torch.Tensor) else v, value)

    def _copy_refs(
        self, actions: list[tuple[ArgRef, Quantizer]], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``(args, kwargs)`` holding only copies of the tensors the targets read."""

        def blank(value: Any) -> Any:  # a list argument keeps its length, nothing else
            return [None] * len(value) if isinstance(value, (list, tuple)) else None

        kept_args: tuple[Any, ...] = tuple(blank(a) for a in args)
        kept_kwargs: dict[str, Any] = {k: blank(v) for k, v in kwargs.items()}
        for ref, q in actions:
            if q not in self.targets:
                continue
            value = get_arg(args, kwargs, ref)
            if isinstance(value, torch.Tensor):
                kept_args, kept_kwargs = set_arg(kept_args, kept_kwargs, ref, self._copy(value))
        return kept_args, kept_kwargs


_CONSTANT_PADS = (nn.ConstantPad1d, nn.ConstantPad2d, nn.ConstantPad3d)  # ZeroPad*d included


def _is_zero_pad_call(
    func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> bool:
    """``F.pad(x, pad)`` with constant zeros (Q/DQ commutes with it exactly)."""
    if func is not F.pad:
        return False
    mode = kwargs.get("mode", args[2] if len(args) > 2 else "constant")
    value = kwargs.get("value", args[3] if len(args) > 3 else None)
    return mode == "constant" and not value


def _first_tensor(value: Any) -> torch.Tensor | None:
    return next((t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)), None)
