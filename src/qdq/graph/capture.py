"""Capture: a torch.fx graph of a *copy* of the model, with module paths on every node.

Conv/ConvTranspose/Linear modules (and their subclasses, such as EfficientNet's
``Conv2dStaticSamePadding``) are traced *through*, so every weighted op appears as one functional call
(``F.conv2d``, ``F.linear``, ...) whose weight is a ``get_attr`` node. Module forms, subclasses and
user-written functional calls on parameters are therefore planned by the same rules, and the
parameters keep their original state-dict names. Every other ``torch.nn`` module stays a leaf.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
from torch import nn

__all__ = ["CaptureError", "capture", "fetch_attr", "module_path"]

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


class CaptureError(RuntimeError):
    """torch.fx could not trace the model (data-dependent control flow, unsupported Python)."""


class _Tracer(fx.Tracer):
    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        from qdq.quant import Quantizer

        if isinstance(m, Quantizer):  # user-placed qdq.nn blocks keep their quantizers
            return True
        if isinstance(m, TRACE_THROUGH):
            return False
        return super().is_leaf_module(m, module_qualified_name)


def capture(model: nn.Module, example_inputs: Sequence[Any] | None = None) -> fx.GraphModule:
    """Trace a deep copy of ``model`` into a ``GraphModule`` (``model`` is never modified).

    Args:
        model: the float model.
        example_inputs: optional inputs; when given, the traced module is run once on them and must
            reproduce the model's output (a cheap check that tracing kept the semantics), and shapes
            are recorded in ``node.meta["tensor_meta"]``.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        CaptureError: tracing failed; the message names the module and the reason.

    Example:
        >>> gm = capture(torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.ReLU()))
        >>> [n.op for n in gm.graph.nodes]
        ['placeholder', 'get_attr', 'get_attr', 'call_function', 'call_module', 'output']
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    clone = copy.deepcopy(model)
    clone.eval()
    try:
        graph = _Tracer().trace(clone)
    except Exception as err:  # fx raises many types; name the model and keep the cause
        raise CaptureError(
            f"torch.fx cannot trace {type(model).__name__}: {type(err).__name__}: {err}"
        ) from err
    gm = fx.GraphModule(clone, graph, class_name=f"Captured{type(model).__name__}")
    if example_inputs is not None:
        from torch.fx.passes.shape_prop import ShapeProp

        inputs = tuple(example_inputs)
        with torch.no_grad():
            ShapeProp(gm).propagate(*inputs)
    return gm


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


def fetch_attr(gm: fx.GraphModule, target: str) -> torch.Tensor:
    """The parameter or buffer a ``get_attr`` node refers to (detached)."""
    owner, _, attr = target.rpartition(".")
    value: Any = getattr(gm.get_submodule(owner) if owner else gm, attr)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"get_attr target {target!r} is a {type(value).__name__}, not a tensor")
    return value.detach()
