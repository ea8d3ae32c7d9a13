"""What :mod:`qdq.ptq.bias` and :mod:`qdq.ptq.adaround` share: the weighted layers they can work
on, a tap on the call-site runtime that sees each layer's calls, and the arguments of those calls.

A *weighted layer* is a weight :class:`~qdq.quant.Quantizer` in ``QUANTIZE`` mode whose call sites
are ``F.conv1d``/``conv2d``/``conv3d`` or ``F.linear`` (``nn.Conv*d``, ``nn.Linear``, their
subclasses and functional uses), with the weight per output channel (axis 0) or per tensor.
ConvTranspose (output channels on axis 1 of its weight) and MatMul weights are skipped with a note.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from qdq.api import plan_of, quantizers_of
from qdq.calib import CalibrationError
from qdq.calib.batches import expected_inputs, run_batch
from qdq.graph.calls import SiteKey
from qdq.graph.runtime import ArgRef, Call, Site, Tap, runtime_of
from qdq.quant import Quantizer, QuantMode

__all__ = [
    "SUPPORTED",
    "Index",
    "Layer",
    "Stop",
    "batch_size",
    "bias_of",
    "channel_dim",
    "check_ready",
    "conv_params",
    "find_layers",
    "index_of",
    "invoke",
    "lookup",
    "replace_weight_bias",
    "run_batches",
    "survey",
    "tapped",
    "weight_of",
]

#: call families (``SiteKey[1]``) whose weight is ``(out, in/groups, *kernel)`` and bias the third
#: argument: the ones bias correction and AdaRound handle
SUPPORTED = ("conv1d", "conv2d", "conv3d", "linear")
_CONV_ARGS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")


class Stop(CalibrationError):  # noqa: N818 - a control-flow signal, not an error
    """Raised by a tap to end a forward early (everything it needs was seen).

    An ``Exception`` (so that ``nn.Module`` still runs the call trackers' always-called exit
    hooks while it unwinds) and a :class:`~qdq.calib.CalibrationError`, which
    :func:`~qdq.calib.batches.run_batch` passes through unchanged (it rewords other exceptions
    when the batch's shape differs from the example's).
    """


@dataclass
class Layer:
    """One weighted layer: its weight quantizer, call sites and what a survey forward saw."""

    path: str
    quantizer: Quantizer
    family: str
    sites: list[tuple[SiteKey, ArgRef]] = field(default_factory=list)
    #: position of the first call in the forward (``None``: not reached by the survey)
    order: int | None = None
    #: calls per forward
    calls: int = 0
    #: the float weight the model passed at the last call seen
    weight: torch.Tensor | None = None

    @property
    def name(self) -> str:
        """The quantizer's name (``"layer1.conv1:weight"``)."""
        return self.quantizer.name


def check_ready(prepared: nn.Module, what: str) -> None:
    """Raise ``ValueError`` unless ``prepared`` is a calibrated call-site prepared model."""
    plan_of(prepared)
    if runtime_of(prepared) is None:
        raise ValueError(
            f"{what} needs a model prepared at call sites; this one was prepared by module "
            "replacement (qdq.prepare could not record it)"
        )
    missing = [
        p
        for p, q in quantizers_of(prepared).items()
        if q.mode is QuantMode.QUANTIZE and not q.is_calibrated
    ]
    if missing:
        raise ValueError(f"quantizers without amax: {missing[:5]}; run qdq.calibrate first")


def find_layers(prepared: nn.Module) -> tuple[list[Layer], list[str]]:
    """The supported weighted layers of ``prepared`` and a note for each skipped weight."""
    runtime = runtime_of(prepared)
    assert runtime is not None
    paths = {id(q): p for p, q in quantizers_of(prepared).items()}
    layers: dict[str, Layer] = {}
    skipped: dict[str, str] = {}
    for key, site in runtime.sites.items():
        for ref, q in site.actions:
            if not isinstance(q, Quantizer) or not q.name.endswith(":weight"):
                continue
            path = paths[id(q)]
            if q.mode is not QuantMode.QUANTIZE:
                skipped[path] = f"{q.name}: its quantizer is set to {q.mode.value}"
            elif key[1] not in SUPPORTED:
                skipped[path] = f"{q.name}: {key[1]} weights are not supported"
            elif q.spec.axis not in (None, 0):
                skipped[path] = f"{q.name}: weight quantized along axis {q.spec.axis}"
            elif path in layers and layers[path].family != key[1]:
                skipped[path] = f"{q.name}: called as {layers[path].family} and {key[1]}"
            else:
                layers.setdefault(path, Layer(path, q, key[1])).sites.append((key, ref))
    for path in skipped:
        layers.pop(path, None)
    return list(layers.values()), [f"skipped {text}" for text in skipped.values()]


def weight_of(call: Call, ref: ArgRef) -> Any:
    """The weight argument of a call (``ref`` as planned: position 1 or ``"weight"``)."""
    args, kwargs = call
    if isinstance(ref, int) and ref < len(args):
        return args[ref]
    return kwargs.get("weight")


def bias_of(call: Call) -> Any:
    """The bias argument of an ``F.conv*``/``F.linear`` call (``None`` when absent)."""
    args, kwargs = call
    return args[2] if len(args) > 2 else kwargs.get("bias")


def invoke(func: Any, call: Call) -> Any:
    """``func(*args, **kwargs)``."""
    return func(*call[0], **call[1])


def replace_weight_bias(call: Call, ref: ArgRef, weight: torch.Tensor, bias: Any) -> Call:
    """``call`` with another weight and bias."""
    args, kwargs = list(call[0]), dict(call[1])
    if isinstance(ref, int) and ref < len(args):
        args[ref] = weight
    else:
        kwargs["weight"] = weight
    if len(args) > 2:
        args[2] = bias
    else:
        kwargs["bias"] = bias
    return tuple(args), kwargs


def conv_params(call: Call, ndim: int) -> dict[str, Any]:
    """``stride``, ``padding``, ``dilation`` (tuples of ``ndim``; padding may be a string) and
    ``groups`` of an ``F.conv*d`` call."""
    args, kwargs = call
    values: dict[str, Any] = {"stride": 1, "padding": 0, "dilation": 1, "groups": 1}
    values.update({k: v for k, v in zip(_CONV_ARGS, args, strict=False) if k in values})
    values.update({k: v for k, v in kwargs.items() if k in values})
    for k in ("stride", "dilation", "padding"):
        v = values[k]
        if isinstance(v, str):
            continue
        values[k] = tuple(int(i) for i in v) if isinstance(v, (tuple, list)) else (int(v),) * ndim
    values["groups"] = int(values["groups"])
    return values


@contextlib.contextmanager
def tapped(prepared: nn.Module, tap: Tap) -> Iterator[None]:
    """Route every planned call of ``prepared`` through ``tap`` inside the block."""
    runtime = runtime_of(prepared)
    assert runtime is not None
    previous = runtime.tap
    runtime.tap = tap
    try:
        yield
    finally:
        runtime.tap = previous


Index = dict[SiteKey, tuple[Layer, ArgRef]]


def index_of(layers: Iterable[Layer]) -> Index:
    """Each planned call site of ``layers`` → ``(layer, weight argument)``."""
    return {key: (layer, ref) for layer in layers for key, ref in layer.sites}


def lookup(index: Index, key: SiteKey) -> tuple[Layer, ArgRef] | None:
    """The layer planned at ``key`` (a site planned for every ordinal matches too)."""
    return index.get(key) or index.get((key[0], key[1], None))


def survey(prepared: nn.Module, batch: Any, layers: list[Layer]) -> None:
    """One forward on ``batch``: each layer's first-call order, calls per forward and weight."""
    index = index_of(layers)
    order = 0

    def tap(key: SiteKey, site: Site, func: Any, raw: Call, applied: Call) -> Any:
        nonlocal order
        hit = lookup(index, key)
        if hit is not None:
            layer, ref = hit
            if layer.order is None:
                layer.order, order = order, order + 1
            layer.calls += 1
            layer.weight = weight_of(raw, ref)
        return invoke(func, applied)

    for layer in layers:
        layer.order, layer.calls, layer.weight = None, 0, None
    with tapped(prepared, tap):
        run_batches(prepared, [batch])


def run_batches(prepared: nn.Module, batches: Iterable[Any]) -> None:
    """Run ``prepared`` on each batch (as :func:`qdq.calibrate` takes them); a :class:`Stop`
    raised by a tap ends that batch's forward."""
    expected = expected_inputs(prepared)
    for i, batch in enumerate(batches):
        with contextlib.suppress(Stop):
            run_batch(prepared, batch, i, expected)


def batch_size(batch: Any) -> int:
    """The leading dimension of the first tensor in ``batch`` (1 without one)."""
    leaves = [t for t in tree_flatten(batch)[0] if isinstance(t, torch.Tensor)]
    return int(leaves[0].shape[0]) if leaves and leaves[0].dim() else 1


def channel_dim(out: torch.Tensor, weight: torch.Tensor, family: str) -> int:
    """The output-channel dimension of a layer's output: 1 for batched convs, 0 unbatched, -1 for
    linear."""
    if family == "linear":
        return out.dim() - 1
    return 1 if out.dim() == weight.dim() else 0
