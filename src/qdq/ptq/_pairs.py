"""Where cross-layer equalization applies: producer → consumers pairs on the recorded graph.

A pair (:class:`Pair`) is a Conv/Linear call on a module's own, unshared weight (the producer)
whose output reaches one or more Conv (``groups=1``) / Linear calls (the consumers) only through ops
that commute with a positive per-channel scale and keep the channel count: ReLU, LeakyReLU, PReLU,
max and average pooling, zero padding, dropout, identity, and BatchNorm, which then becomes what
is scaled (its affine weight and bias) in place of the producer. See :mod:`qdq.ptq.equalize`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from qdq.graph.capture import TRACE_THROUGH, module_path
from qdq.graph.patterns import conv_groups, op_kind, tensor_inputs, weight_arg

__all__ = ["Pair", "find_pairs", "label", "weight_of"]

#: modules that commute with a positive per-channel scale on channel dimension 1
_CHANNEL_MODULES: tuple[type[nn.Module], ...] = (
    nn.ReLU,
    nn.LeakyReLU,
    nn.PReLU,
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.MaxPool3d,
    nn.AdaptiveMaxPool1d,
    nn.AdaptiveMaxPool2d,
    nn.AdaptiveMaxPool3d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AvgPool3d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveAvgPool3d,
    nn.Identity,
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
)
#: elementwise ones commute on any channel dimension (a Linear's last)
_ELEMENTWISE_MODULES: tuple[type[nn.Module], ...] = (
    nn.ReLU,
    nn.LeakyReLU,
    nn.Identity,
    nn.Dropout,
)
_ELEMENTWISE_FUNCTIONS: frozenset[Any] = frozenset({F.relu, torch.relu, F.leaky_relu, F.dropout})
_POOL_FUNCTIONS: frozenset[Any] = frozenset({
    F.max_pool1d, F.max_pool2d, F.max_pool3d, F.avg_pool1d, F.avg_pool2d, F.avg_pool3d,
    F.adaptive_avg_pool1d, F.adaptive_avg_pool2d, F.adaptive_avg_pool3d,
})  # fmt: skip
_ELEMENTWISE_METHODS = frozenset({"relu", "relu_"})
_BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
#: op kinds worth a note when they alone keep two layers apart (ReLU6, SiLU, ... stop a pair)
_BLOCKING_KINDS = frozenset({"act", "silu", "hardswish", "gelu", "sigmoid"})


@dataclass
class Pair:
    """A producer, what is scaled for it, the ops between and the consumers."""

    producer: fx.Node  # the Conv/Linear call
    scaled: str  # module path of what gets divided (the producer's module or its BatchNorm)
    through: list[fx.Node]
    consumers: list[fx.Node]
    channel_dim: int


def _param_node(node: fx.Node, position: int, keyword: str) -> fx.Node | None:
    value = node.args[position] if len(node.args) > position else node.kwargs.get(keyword)
    return value if isinstance(value, fx.Node) and value.op == "get_attr" else None


def _weighted(node: fx.Node, modules: dict[str, nn.Module]) -> str | None:
    """``"conv"``/``"linear"`` for a Conv/Linear call on a module's own, unshared weight."""
    kind = op_kind(node, modules)
    if kind not in ("conv", "linear"):
        return None
    found = weight_arg(node)
    if found is None or len(found[1].users) != 1:
        return None
    path = module_path(node)
    owner = modules.get(path)
    if not isinstance(owner, TRACE_THROUGH) or str(found[1].target) != f"{path}.weight":
        return None
    source = node.args[0] if node.args else None
    if kind == "conv" and (
        not isinstance(source, fx.Node) or _rank(source) != weight_of(owner).dim()
    ):
        return None  # an unbatched conv input: dimension 1 is not the channels
    bias = _param_node(node, 2, "bias")
    if bias is not None and len(bias.users) != 1:
        return None
    return kind


def _shape(node: fx.Node) -> Any:
    """The recorded shape of ``node``'s tensor (``None`` when it is not one tensor)."""
    return getattr(node.meta.get("tensor_meta"), "shape", None)


def _rank(node: fx.Node) -> int | None:
    shape = _shape(node)
    return len(shape) if shape is not None else None


def _channels(node: fx.Node, dim: int) -> int | None:
    shape = _shape(node)
    return int(shape[dim]) if shape is not None and len(shape) > 1 else None


def _commutes(node: fx.Node, prev: fx.Node, modules: dict[str, nn.Module], dim: int) -> bool:
    """Whether ``node`` reads only ``prev``, keeps its channels and commutes with a positive
    scale along ``dim``."""
    if [p for _, p in tensor_inputs(node)] != [prev] or node.args[:1] != (prev,):
        return False
    if _channels(node, dim) is None or _channels(node, dim) != _channels(prev, dim):
        return False
    if dim == 1 and op_kind(node, modules) == "pad":  # zero padding (not of the channels)
        return True
    channel_one = dim == 1 or _rank(prev) == 2
    if node.op == "call_module":
        mod = modules.get(str(node.target))
        if isinstance(mod, _ELEMENTWISE_MODULES):
            return True
        if isinstance(mod, nn.PReLU):
            return mod.num_parameters == 1 or channel_one
        return dim == 1 and isinstance(mod, _CHANNEL_MODULES)
    if node.op == "call_function":
        if node.target is F.dropout:
            training = node.kwargs.get("training", node.args[2] if len(node.args) > 2 else True)
            return training is False
        if node.target in _ELEMENTWISE_FUNCTIONS:
            return True
        if node.target in _POOL_FUNCTIONS:
            return dim == 1 and not node.kwargs.get("return_indices", False)
        return False
    return node.op == "call_method" and str(node.target) in _ELEMENTWISE_METHODS


def find_pairs(graph: fx.Graph, modules: dict[str, nn.Module]) -> tuple[list[Pair], list[str]]:
    """Every pair of ``graph`` in forward order, and notes on layers an activation keeps apart."""
    pairs: list[Pair] = []
    notes: list[str] = []
    blocked: list[str] = []
    for node in graph.nodes:
        kind = _weighted(node, modules)
        if kind is None:
            continue
        dim = 1 if kind == "conv" else -1
        scaled = module_path(node)
        through: list[fx.Node] = []
        tap = node
        while len(tap.users) == 1:
            (user,) = tap.users
            if user.op == "call_module" and isinstance(modules.get(str(user.target)), _BATCHNORMS):
                bn = modules[str(user.target)]
                channel_one = dim == 1 or _rank(tap) == 2
                if not (channel_one and bn.affine and tensor_inputs(user) == [(0, tap)]):
                    break
                scaled = str(user.target)
            elif not _commutes(user, tap, modules, dim):
                break
            through.append(user)
            tap = user
        consumers = list(tap.users)
        ok = bool(consumers) and all(
            _weighted(c, modules) == kind
            and c.args[:1] == (tap,)
            and (kind == "linear" or conv_groups(c) == 1)
            for c in consumers
        )
        if not ok:
            stop = consumers[0] if len(consumers) == 1 else None
            if (
                stop is not None
                and op_kind(stop, modules) in _BLOCKING_KINDS
                and any(_weighted(u, modules) for u in stop.users)
            ):  # a Conv/Linear pair that only this activation keeps apart
                blocked.append(f"{module_path(node)} -> {label(stop)}")
            continue
        pairs.append(Pair(node, scaled, through, consumers, dim))
    if blocked:
        shown = ", ".join(blocked[:6]) + (f" (+{len(blocked) - 6})" if len(blocked) > 6 else "")
        notes.append(
            f"{len(blocked)} layer(s) not equalized: an activation that does not commute with "
            f"a per-channel scale follows them: {shown}"
        )
    return pairs, notes


def label(node: fx.Node) -> str:
    """A module path, or a function name with the module it ran in."""
    if node.op == "call_module":
        return str(node.target)
    name = getattr(node.target, "__name__", str(node.target))
    path = module_path(node)
    return f"{path}.{name}" if path else str(name)


def weight_of(module: nn.Module) -> torch.Tensor:
    """``module.weight`` as a tensor."""
    weight = module.weight
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"{type(module).__name__}.weight is not a tensor")
    return weight
