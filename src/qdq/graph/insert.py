"""Materialise a ``QuantPlan`` on the user's own modules (a deep copy): quantizers + call sites.

One :class:`~qdq.quant.Quantizer` per scale group, registered as a child of the module the op
belongs to (``layer1.0.conv1.input_quantizer``, ``layer1.0.conv1.weight_quantizer``,
``layer1.0.add_input1_quantizer`` on ``layer1.0``), so it is in ``state_dict()``, moves with
``.to()`` and is named after the code it quantizes. Every member point of a group becomes an
action at its consumer's call site (:class:`~qdq.graph.runtime.Site`); all members call the
*same* module, so calibration sees all their data. One weight quantizer per parameter, however
often the module is called. Weight quantizers are calibrated from the weight right away.
"""

from __future__ import annotations

import dataclasses
import itertools

import torch
import torch.fx as fx
from torch import nn

from qdq.graph.calls import LeafCalls, SiteKey
from qdq.graph.capture import constant_value, fetch_attr
from qdq.graph.plan import QuantPlan, QuantPoint, ScaleGroup
from qdq.graph.runtime import ArgRef, Site, SiteRuntime, install_runtime
from qdq.quant import Quantizer, make_quantizer

__all__ = ["materialize"]

_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def materialize(
    root: nn.Module,
    graph: fx.Graph,
    plan: QuantPlan,
    leaf_calls: dict[str, LeafCalls] | None = None,
) -> QuantPlan:
    """Register the plan's quantizers on ``root`` and install the call-site runtime (in place).

    ``leaf_calls``: the recording's (:attr:`~qdq.graph.record.Recording.leaf_calls`), which
    tells the leaf modules that need no runtime hooks. Returns the plan with each group's
    quantizer path filled in.
    """
    nodes = {n.name: n for n in graph.nodes}
    points = {p.name: p for p in plan.points}
    sites: dict[SiteKey, Site] = {}
    groups: list[ScaleGroup] = []
    for group in plan.groups:
        leader = points[group.leader]
        assert leader.spec is not None and leader.calib is not None
        quantizer = make_quantizer(leader.spec, leader.calib, name=leader.name)
        path = _register(root, leader, nodes, quantizer)
        quantizer.to(_device_near(root, path))  # amax lives where the model does (CUDA too)
        groups.append(
            ScaleGroup(group.id, group.leader, group.members, group.rules, group.crosses, path)
        )
        if leader.kind == "weight":
            producer = nodes[leader.producer]
            quantizer.calibrate_from(_weight_value(root, producer))
            # computed in forward: the export reads torch's value (onnx_export._computed_weights)
            quantizer.computed_weight = producer.op != "get_attr"
        for name in group.members:
            point = points[name]
            consumer = nodes[point.consumer]
            key = consumer.meta["qdq_site"]
            sites.setdefault(key, Site()).actions.append((_arg_ref(consumer, point.arg), quantizer))
    inputs = tuple(
        (str(n.target), tuple(n.meta["tensor_meta"].shape), n.meta["tensor_meta"].dtype)
        for n in graph.nodes
        if n.op == "placeholder" and "tensor_meta" in n.meta
    )
    install_runtime(root, SiteRuntime(root, sites, inputs, leaf_calls))
    return dataclasses.replace(plan, groups=tuple(groups))


def _weight_value(root: nn.Module, producer: fx.Node) -> torch.Tensor:
    """A weight's float value: the parameter, or what ``forward`` computes from parameters."""
    if producer.op == "get_attr":
        return fetch_attr(root, str(producer.target))
    return constant_value(root, producer)


def _device_near(root: nn.Module, path: str) -> torch.device:
    """The device of the nearest module on ``path`` (from the quantizer's parent up to ``root``)
    that holds a parameter or buffer of its own, else of any tensor of ``root``, else the CPU."""
    parts = path.split(".")[:-1]
    for depth in range(len(parts), -1, -1):
        module = root.get_submodule(".".join(parts[:depth]))
        for t in (*module.parameters(recurse=False), *module.buffers(recurse=False)):
            if t.numel():
                return t.device
    first = next(itertools.chain(root.parameters(), root.buffers()), None)
    return torch.device("cpu") if first is None else first.device


def _arg_ref(consumer: fx.Node, arg: int | str) -> ArgRef:
    """Where the planned argument sits in the call: list items of ``cat`` are ``(0, i)``."""
    if isinstance(arg, str):
        return arg
    if consumer.args and isinstance(consumer.args[0], (list, tuple)):
        return (0, arg)
    if not consumer.args and isinstance(consumer.kwargs.get("tensors"), (list, tuple)):
        return (len(consumer.args), arg)
    return arg


def _register(
    root: nn.Module, point: QuantPoint, nodes: dict[str, fx.Node], quantizer: Quantizer
) -> str:
    """Add ``quantizer`` under a readable path: next to the weight, or on the op's module."""
    label = point.name.rpartition(":")[2]
    producer = nodes[point.producer]
    if point.kind == "weight" and producer.op == "get_attr":
        owner_path, _, attr = str(producer.target).rpartition(".")
        leaf = f"{attr}_quantizer"
    elif point.kind == "weight":  # computed in forward: named after the layer that reads it
        owner_path, leaf = point.owner, "weight_quantizer"
    elif _is_module(root, point.owner):
        owner_path, leaf = point.owner, f"{label}_quantizer"
    else:
        owner_path, _, op = point.owner.rpartition(".")
        leaf = f"{op}_{label}_quantizer"
    owner_path, leaf = _attachable(root, owner_path, leaf)
    owner = root.get_submodule(owner_path) if owner_path else root
    name, i = leaf, 1
    while hasattr(owner, name):
        name, i = f"{leaf}_{i}", i + 1
    owner.add_module(name, quantizer)
    return f"{owner_path}.{name}" if owner_path else name


def _attachable(root: nn.Module, path: str, leaf: str) -> tuple[str, str]:
    """Climb out of containers (a child added to a Sequential would be called by it)."""
    while path:
        module = root.get_submodule(path)
        if not isinstance(module, _CONTAINERS):
            return path, leaf
        path, _, last = path.rpartition(".")
        leaf = f"{last}_{leaf}"
    if isinstance(root, _CONTAINERS):
        raise ValueError(
            f"cannot attach quantizer {leaf!r}: the model is a {type(root).__name__} container "
            "whose children are all called in order; wrap it in a module with its own forward"
        )
    return "", leaf


def _is_module(root: nn.Module, path: str) -> bool:
    try:
        root.get_submodule(path)
    except AttributeError:
        return False
    return True
