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

__all__ = ["TRACE_THROUGH", "CaptureError", "ForwardError", "fetch_attr", "module_path"]

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
