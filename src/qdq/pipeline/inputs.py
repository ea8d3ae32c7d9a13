"""The model inputs of ``qdq quantize``'s data, and how they meet the model's ``forward``.

The samples of :class:`~qdq.pipeline.data.QuantData` are :data:`Inputs`: one tensor (the
model's only input), a tuple of tensors (positional inputs) or a dict of tensors keyed by
``forward``'s parameter names (``{"image": ..., "mask": ...}``, ``{"input_ids": ...,
"attention_mask": ...}``). Every tensor holds the samples along dimension 0, all of the same
length. This module is the one place that counts, slices, pads and batches them.

:func:`qdq.prepare` and :func:`qdq.export_onnx` take positional example inputs, so a dict is laid
out in ``forward``'s order, a parameter the data leaves out in between taking its default
(:class:`ForwardInputs`); the exported ONNX's inputs are the tensors among them, in that order (the
exporter names them ``input``, ``input1``, ...). The model runs in torch (calibration, evaluation)
with the same positional arguments (:meth:`ForwardInputs.arguments`, :func:`call`): a ``.pt2``'s
module takes no keywords. Only a dict that leaves a parameter out in between is passed by keyword
there. Keyword-only parameters (after ``*``) cannot be passed by position and are refused with the
reason.

Example:
    >>> batch = {"image": torch.zeros(5, 3, 4, 4), "mask": torch.ones(5, 1, 4, 4)}
    >>> num_samples(batch), [num_samples(b) for b, _ in batches(batch, 2)]
    (5, [2, 2, 1])
    >>> [(b["image"].shape[0], real) for b, real in batches(batch, 2, static=True)][-1]
    (2, 1)
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeAlias

import torch
from torch import nn

from qdq.calib.batches import forward_parameters

__all__ = [
    "ForwardInputs",
    "Inputs",
    "batches",
    "bind_inputs",
    "call",
    "check_inputs",
    "describe",
    "forward_parameters",
    "forward_text",
    "input_items",
    "num_samples",
    "parameter_names",
    "summary",
    "take",
]

#: one tensor, positional tensors, or keyword tensors; samples along dimension 0
Inputs: TypeAlias = torch.Tensor | tuple[torch.Tensor, ...] | dict[str, torch.Tensor]

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def input_items(inputs: Inputs) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of every input: ``input`` for one tensor, ``input``, ``input1``, ...
    for a tuple (the exporter's ONNX input names), the keys of a dict."""
    if isinstance(inputs, dict):
        return list(inputs.items())
    if isinstance(inputs, tuple):
        return [(f"input{i}" if i else "input", t) for i, t in enumerate(inputs)]
    return [("input", inputs)]


def check_inputs(inputs: Any, what: str) -> int:
    """Check that ``inputs`` are :data:`Inputs` with one sample count; return it.

    Raises:
        TypeError: not a tensor, a tuple of tensors or a dict of tensors with ``str`` keys (naming
            the culprit).
        ValueError: no inputs, a 0-d tensor, or inputs whose sample counts (dimension 0) differ.
    """
    if isinstance(inputs, (list, tuple, dict)) and not inputs:
        raise ValueError(f"{what} holds no inputs")
    if isinstance(inputs, list):
        raise TypeError(f"{what} is a list; pass a tuple of tensors (positional inputs)")
    if isinstance(inputs, dict):
        bad_keys = [k for k in inputs if not isinstance(k, str)]
        if bad_keys:
            raise TypeError(f"{what}: dict keys must be forward's parameter names, got {bad_keys}")
    elif not isinstance(inputs, (torch.Tensor, tuple)):
        raise TypeError(
            f"{what} is a {type(inputs).__name__}; expected a tensor, a tuple of tensors or a dict "
            "of tensors"
        )
    items = input_items(inputs)
    for name, t in items:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what}: input {name!r} is a {type(t).__name__}, not a tensor")
        if t.dim() == 0:
            raise ValueError(f"{what}: input {name!r} is 0-d; expected samples along dimension 0")
    counts = {name: int(t.shape[0]) for name, t in items}
    if len(set(counts.values())) > 1:
        raise ValueError(
            f"{what}: inputs hold different numbers of samples (dimension 0): {counts}"
        )
    return next(iter(counts.values()))


def num_samples(inputs: Inputs) -> int:
    """Samples in ``inputs`` (dimension 0)."""
    return int(input_items(inputs)[0][1].shape[0])


def take(inputs: Inputs, index: slice | torch.Tensor) -> Inputs:
    """The samples ``index`` (a slice or a 1-D index tensor) of every input, in the same form."""
    if isinstance(inputs, dict):
        return {k: v[index] for k, v in inputs.items()}
    if isinstance(inputs, tuple):
        return tuple(t[index] for t in inputs)
    return inputs[index]


def _pad(inputs: Inputs, size: int) -> Inputs:
    """Repeat the last sample of every input until there are ``size`` samples."""

    def pad(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, t[-1:].expand(size - len(t), *t.shape[1:])])

    if isinstance(inputs, dict):
        return {k: pad(v) for k, v in inputs.items()}
    if isinstance(inputs, tuple):
        return tuple(pad(t) for t in inputs)
    return pad(inputs)


def batches(inputs: Inputs, size: int, static: bool = False) -> Iterator[tuple[Inputs, int]]:
    """``(batch, real)``: chunks of ``size`` samples of ``inputs`` (in their form); with
    ``static`` the last one is padded to ``size`` by repeating its last sample, and ``real`` says
    how many leading samples are real."""
    for start in range(0, num_samples(inputs), size):
        chunk = take(inputs, slice(start, start + size))
        real = num_samples(chunk)
        yield (_pad(chunk, size) if static and real < size else chunk), real


def call(model: nn.Module, batch: Inputs) -> Any:
    """``model(x)``, ``model(*inputs)``, or a dict as :meth:`ForwardInputs.arguments` lays it out
    for ``model``'s forward (positionally in its order, by keyword if it leaves a parameter out)."""
    if isinstance(batch, dict):
        batch = bind_inputs(model, batch).arguments(batch)
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, tuple):
        return model(*batch)
    return model(batch)


def describe(inputs: Inputs) -> list[dict[str, Any]]:
    """Name, per-sample shape and dtype of every input (``report.json``'s ``data.inputs``)."""
    return [
        {"name": name, "shape": list(t.shape[1:]), "dtype": str(t.dtype).replace("torch.", "")}
        for name, t in input_items(inputs)
    ]


def summary(inputs: Inputs) -> str:
    """``input (3, 8, 8)`` or ``inputs image (3, 8, 8), mask (1, 8, 8)`` (shapes per sample)."""
    items = input_items(inputs)
    if isinstance(inputs, torch.Tensor):
        return f"input {tuple(inputs.shape[1:])}"
    return "inputs " + ", ".join(f"{n} {tuple(t.shape[1:])}" for n, t in items)


def parameter_names(model: nn.Module) -> list[str]:
    """The names ``forward``'s inputs can be given by (not ``*args``/``**kwargs``), in order."""
    var = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [p.name for p in forward_parameters(model) if p.kind not in var]


def forward_text(model: nn.Module) -> str:
    """``Net.forward(x, mask=None, *, scale)``, without annotations (for messages)."""
    plain = [p.replace(annotation=p.empty) for p in forward_parameters(model)]
    return f"{type(model).__name__}.forward{inspect.Signature(plain)}"


@dataclass(frozen=True)
class ForwardInputs:
    """How one form of :data:`Inputs` is passed to ``forward`` positionally.

    Attributes:
        kind: ``"tensor"``, ``"tuple"`` or ``"dict"``.
        slots: for a dict, ``forward``'s positional parameters up to the last one the data
            gives, each with its default (used when the data leaves it out).
    """

    kind: str
    slots: tuple[tuple[str, Any], ...] = ()

    def arguments(self, batch: Inputs) -> Inputs:
        """``batch`` as the model runs on it in torch (a calibration batch, :func:`call`): a
        dict becomes the tuple of its tensors in ``forward``'s order, unless it leaves out a
        parameter in between (then a dict in that order, passed by keyword)."""
        if not isinstance(batch, dict):
            return batch
        if all(name in batch for name, _ in self.slots):
            return tuple(batch[name] for name, _ in self.slots)
        return {name: batch[name] for name, _ in self.slots if name in batch}

    def positional(self, batch: Inputs) -> tuple[Any, ...]:
        """The positional arguments of ``forward`` for ``batch`` (for prepare and export)."""
        if isinstance(batch, dict):
            return tuple(batch.get(name, default) for name, default in self.slots)
        if isinstance(batch, tuple):
            return batch
        return (batch,)

    def tensors(self, batch: Inputs) -> list[torch.Tensor]:
        """The exported ONNX model's inputs for ``batch``, in order."""
        return [a for a in self.positional(batch) if isinstance(a, torch.Tensor)]


def bind_inputs(model: nn.Module, inputs: Inputs) -> ForwardInputs:
    """Match ``inputs`` to ``model.forward``; a dict's keys must be its parameters.

    Raises:
        ValueError: a key that names no parameter (listing ``forward``'s), a keyword-only
            parameter, or a required positional parameter the dict leaves out.

    Example:
        >>> class Net(nn.Module):
        ...     def forward(self, ids, mask=None, types=None):
        ...         return ids
        >>> bound = bind_inputs(Net(), {"types": torch.zeros(2, 3), "ids": torch.ones(2, 3)})
        >>> [n for n, _ in bound.slots], bound.positional({"ids": 1, "types": 2})
        (['ids', 'mask', 'types'], (1, None, 2))
    """
    if isinstance(inputs, torch.Tensor):
        return ForwardInputs("tensor")
    if isinstance(inputs, tuple):
        return ForwardInputs("tuple")
    params = forward_parameters(model)
    by_name = {p.name: p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    unknown = [k for k in inputs if k not in by_name]
    if unknown:
        raise ValueError(
            f"inputs {unknown} name no parameter of {forward_text(model)}; name the "
            "inputs after its parameters"
        )
    keyword_only = [k for k in inputs if by_name[k].kind is inspect.Parameter.KEYWORD_ONLY]
    if keyword_only:
        raise ValueError(
            f"input(s) {keyword_only} are keyword-only parameters of {forward_text(model)}: "
            "qdq.prepare and the ONNX export pass inputs by position; make them positional "
            "parameters (before the *)"
        )
    positional = [p for p in params if p.kind in _POSITIONAL]
    required = [p.name for p in positional if p.default is p.empty and p.name not in inputs]
    if required:
        raise ValueError(
            f"{forward_text(model)} needs input(s) {required}; the data has {sorted(inputs)}"
        )
    last = max(i for i, p in enumerate(positional) if p.name in inputs)
    return ForwardInputs("dict", tuple((p.name, p.default) for p in positional[: last + 1]))
