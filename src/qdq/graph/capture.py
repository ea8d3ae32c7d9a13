"""Capture vocabulary shared by the recorder and the planner: which modules are seen through,
the capture error, and node helpers (module path, attribute fetch).

Conv/ConvTranspose/Linear modules (and their subclasses, such as EfficientNet's
``Conv2dStaticSamePadding``) are seen *through*, so every weighted op appears as one functional call
(``F.conv2d``, ``F.linear``, ...) whose weight is a ``get_attr`` node. Module forms, subclasses and
user-written functional calls on parameters are therefore planned by the same rules, and the
parameters keep their original state-dict names. The graph itself is made by
:func:`qdq.graph.record.record`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from torch import nn

__all__ = [
    "COVERED_BY_NAME",
    "TRACE_THROUGH",
    "CaptureError",
    "ForwardError",
    "constant_value",
    "fetch_attr",
    "module_path",
]

#: Module types traced through (their forward becomes functional calls on their parameters).
TRACE_THROUGH: tuple[type[nn.Module], ...] = (
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
    nn.Linear,
)

#: weighted modules of other packages, by class name (the core imports none of them), that the
#: Conv/Linear coverage lists: transformers' ``Conv1D`` (GPT-2's projections, a Linear whose
#: weight is (in, out): ``torch.addmm(bias, x, W)``)
COVERED_BY_NAME = frozenset({"Conv1D"})


class CaptureError(RuntimeError):
    """The model's forward could not be recorded (the message names the model and the error)."""


class ForwardError(CaptureError):
    """The model's own forward raised on the example inputs, with no recorder attached: nothing
    to fall back to (``__cause__`` is the model's error)."""


def module_path(node: fx.Node) -> str:
    """The qualified name of the innermost module that produced ``node`` ("" at top level).

    ``get_attr`` nodes return the owner of the attribute (``layer1.0.conv1`` for
    ``layer1.0.conv1.weight``).
    """
    if node.op == "call_module":
        return str(node.target)
    if node.op == "get_attr":
        return str(node.target).rpartition(".")[0]
    stack = node.meta.get("nn_module_stack")
    if stack:
        path, _ = list(stack.values())[-1]
        return str(path)
    return ""


def fetch_attr(gm: nn.Module, target: str) -> torch.Tensor:
    """The parameter or buffer a ``get_attr`` node refers to (detached)."""
    owner, _, attr = target.rpartition(".")
    value: Any = getattr(gm.get_submodule(owner) if owner else gm, attr)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"get_attr target {target!r} is a {type(value).__name__}, not a tensor")
    return value.detach()


def constant_value(gm: nn.Module, node: fx.Node) -> torch.Tensor:
    """The value of ``node`` when it is computed from parameters, buffers and constants alone (a
    weight that ``forward`` standardizes: timm's ``StdConv2d``), by running the nodes it depends
    on against ``gm``'s current tensors, without gradients (detached).

    Raises ``ValueError`` naming the node when it depends on a graph input.
    """
    order: list[fx.Node] = []
    seen: set[fx.Node] = set()
    stack: list[tuple[fx.Node, bool]] = [(node, False)]
    while stack:  # post-order without recursion: a node after everything it reads
        n, done = stack.pop()
        if done:
            order.append(n)
            continue
        if n in seen:
            continue
        seen.add(n)
        if n.op == "placeholder":
            raise ValueError(
                f"{node.name!r} depends on the graph input {n.target!r}: not a constant"
            )
        stack.append((n, True))
        stack.extend((i, False) for i in n.all_input_nodes if i not in seen)
    env: dict[fx.Node, Any] = {}
    with torch.no_grad():
        for n in order:
            args = fx.node.map_arg(n.args, env.__getitem__)
            kwargs = fx.node.map_arg(n.kwargs, env.__getitem__)
            if n.op == "get_attr":
                env[n] = fetch_attr(gm, str(n.target))
            elif n.op == "call_function":
                env[n] = n.target(*args, **kwargs)  # type: ignore[operator]
            elif n.op == "call_method":
                env[n] = getattr(args[0], str(n.target))(*args[1:], **kwargs)
            elif n.op == "call_module":
                env[n] = gm.get_submodule(str(n.target))(*args, **kwargs)
            else:
                raise ValueError(f"cannot evaluate {n.op} node {n.name!r} of {node.name!r}")
    value = env[node]
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{node.name!r} computes a {type(value).__name__}, not a tensor")
    return value.detach()
