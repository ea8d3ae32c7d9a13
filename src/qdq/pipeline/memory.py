"""In-memory data for :func:`qdq.quantize`: what a Python user already holds, made samples.

``data`` may be:

* **a tensor or NumPy array**: the input samples along dimension 0 (one input, no labels);
* **a dict** of tensors, arrays or lists: the ``.npz`` convention (:mod:`qdq.pipeline.data`): one
  input, or inputs named after ``forward``'s parameters (``input_ids``, ``attention_mask`` ...),
  plus optional integer labels (``labels``/``label``/``y``/...), samples along dimension 0;
* **a tuple of tensors or arrays** of one length along dimension 0 whose shapes differ after it,
  or as many as ``forward`` takes positional inputs: one batch (``(image, token_ids)`` for
  ``forward(image, ids)``, ``(inputs, labels)``), as in a list of batches below;
* **a list, tuple or any iterable of batches** (a ``DataLoader``), each batch in one form:

  * a tensor (one input);
  * a dict as above (a tokenizer's ``BatchEncoding``); a dict whose values are all 1-D or
    scalars is **one sample** (a tokenized row of a dataset: ``input_ids`` of one sequence,
    ``label`` an int), not a batch;
  * a pair ``(inputs, labels)`` whose second item is 1-D integer labels, one per sample;
  * a tuple of tensors: positional inputs.

Batches are joined along dimension 0; they must agree on their keys and on every dimension but
the first (pad token sequences to one length: ``tokenizer(..., padding="max_length",
max_length=N)``). Tensors are copied to the CPU; the user's objects are not modified.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from qdq.pipeline.arrays import LABEL_KEYS, class_labels, named_arrays
from qdq.pipeline.inputs import Inputs, check_inputs, forward_parameters

__all__ = ["from_memory"]


def from_memory(data: Any, model: nn.Module | None) -> tuple[Inputs, torch.Tensor | None, str]:
    """``(inputs, labels or None, a description)`` of in-memory ``data`` (module docstring).

    Raises:
        TypeError: a form that is none of the above, naming it.
        ValueError: batches that disagree (keys, forms, shapes after dimension 0, naming the batch
            and the input), bad labels, no samples.
    """
    if isinstance(data, (torch.Tensor, np.ndarray)):
        inputs, labels = named_arrays({None: _array(data, "data")}, "data", model)
        return inputs, labels, f"a {type(data).__name__} of {_count(inputs)} samples"
    if isinstance(data, Mapping):
        arrays = _mapping(data, "data")
        inputs, labels = named_arrays(dict(arrays), "data", model)
        return inputs, labels, f"a dict of {_count(inputs)} samples"
    if _one_batch(data, model):
        return _batches([data], model)
    if not isinstance(data, Iterable):
        raise TypeError(
            f"data is a {type(data).__name__}: give a data spec (a path or a built-in dataset "
            "name), a tensor or array of samples, a dict of them, or a list/DataLoader of batches"
        )
    return _batches(data, model)


def _batches(
    data: Iterable[Any], model: nn.Module | None
) -> tuple[Inputs, torch.Tensor | None, str]:
    keyed: list[dict[str | None, np.ndarray]] = []
    positional: list[tuple[np.ndarray, ...]] = []
    labels: list[np.ndarray] = []
    for i, batch in enumerate(data):
        where = f"data batch {i}"
        x, y = _split_labels(batch)
        if isinstance(x, (tuple, list)):
            positional.append(tuple(_array(t, f"{where}[{j}]") for j, t in enumerate(x)))
        elif isinstance(x, Mapping):
            arrays = _mapping(x, where)
            if all(a.ndim <= 1 for a in arrays.values()):  # a dataset row: one sample
                arrays = {k: a[None] for k, a in arrays.items()}
            keyed.append(arrays)
        else:
            keyed.append({None: _array(x, where)})
        if y is not None:
            labels.append(_array(y, f"{where} labels"))
        if keyed and positional:
            raise ValueError(f"{where} is in another form than the batches before it")
        if labels and len(labels) != i + 1:
            raise ValueError(f"{where}: some batches carry labels and others do not")
    count = len(keyed) + len(positional)
    if count == 0:
        raise ValueError("data is an empty iterable: no batches")
    y_all = _join([{None: a} for a in labels], "labels")[None] if labels else None
    if positional:
        joined = _join([dict(enumerate(p)) for p in positional], "input")
        tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in joined.values()]
        inputs: Inputs = tuple(t.float() if t.is_floating_point() else t for t in tensors)
        n = check_inputs(inputs, "data")
        y = None if y_all is None else class_labels(y_all, n, "data labels", f"{n} samples")
        return inputs, y, f"{count} batches of {n} samples (positional inputs)"
    arrays = _join(keyed, "input")
    if y_all is not None:
        if any(k in LABEL_KEYS for k in arrays):
            raise ValueError("data batches carry labels twice: as a pair's second item and by name")
        arrays = {"input" if k is None else k: a for k, a in arrays.items()}  # a named input
        arrays["labels"] = y_all
    inputs, y = named_arrays(arrays, "data", model)
    return inputs, y, f"{count} batches of {_count(inputs)} samples"


def _one_batch(data: Any, model: nn.Module | None) -> bool:
    """Whether a tuple of tensors is one batch of several inputs, not batches of one: their
    shapes after dimension 0 differ (they could not be joined), or ``forward`` takes as many
    positional inputs without defaults."""
    if not isinstance(data, tuple) or len(data) < 2:
        return False
    if not all(isinstance(t, (torch.Tensor, np.ndarray)) and t.ndim for t in data):
        return False
    if len({int(t.shape[0]) for t in data}) != 1:
        return False
    return len({tuple(t.shape[1:]) for t in data}) > 1 or _required_inputs(model) == len(data)


def _required_inputs(model: nn.Module | None) -> int:
    """How many positional inputs without defaults ``model.forward`` takes (0: no signature)."""
    params = forward_parameters(model) if model is not None else []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in params if p.kind in kinds and p.default is inspect.Parameter.empty)


def _split_labels(batch: Any) -> tuple[Any, Any]:
    """``(inputs, labels)`` of a pair whose second item is 1-D integer labels, else
    ``(batch, None)``."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        y = batch[1]
        if isinstance(y, (torch.Tensor, np.ndarray)) and y.ndim == 1:
            integer = (
                not y.is_floating_point()
                if isinstance(y, torch.Tensor)
                else (np.issubdtype(y.dtype, np.integer))
            )
            if integer and len(y) == _leading(batch[0]):
                return batch[0], y
    return batch, None


def _leading(x: Any) -> int | None:
    """Dimension 0 of a tensor, or of a dict's/tuple's first tensor."""
    if isinstance(x, Mapping):
        x = next(iter(x.values()), None)
    elif isinstance(x, (tuple, list)):
        x = x[0] if x else None
    return int(x.shape[0]) if isinstance(x, (torch.Tensor, np.ndarray)) and x.ndim else None


def _mapping(data: Mapping[Any, Any], where: str) -> dict[str | None, np.ndarray]:
    out: dict[str | None, np.ndarray] = {}
    for k, v in data.items():
        if not isinstance(k, str):
            raise TypeError(f"{where} has the key {k!r}: keys name forward's parameters (str)")
        out[k] = _array(v, f"{where}[{k!r}]")
    if not out:
        raise ValueError(f"{where} is an empty dict")
    return out


def _array(value: Any, where: str) -> np.ndarray:
    """``value`` (a tensor, an array, a number or a nested list of numbers) as an array."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        return (t.float() if t.dtype in (torch.bfloat16, torch.float16) else t).numpy().copy()
    try:
        array = np.asarray(value)
    except ValueError as err:  # ragged lists
        raise ValueError(
            f"{where}: rows of different lengths ({err}); pad them to one length"
        ) from err
    if array.dtype == object or not (
        np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_
    ):
        raise TypeError(f"{where} is a {type(value).__name__}, not a tensor or numbers")
    return array


def _join(parts: list[dict[Any, np.ndarray]], what: str) -> dict[Any, np.ndarray]:
    """Concatenate along dimension 0, key by key, after checking keys and trailing shapes."""
    first = parts[0]
    for i, part in enumerate(parts[1:], start=1):
        if list(part) != list(first):
            raise ValueError(
                f"data batch {i} has {what}s {_names(part)}, batch 0 has {_names(first)}"
            )
        for key, a in part.items():
            b = first[key]
            if a.ndim == 0 or a.shape[1:] != b.shape[1:]:
                raise ValueError(
                    f"data batch {i}: {what} {_name(key)} has shape {tuple(a.shape)}, batch 0 "
                    f"{tuple(b.shape)}; every dimension but the first must agree (pad token "
                    "sequences to one length: padding='max_length', max_length=N)"
                )
    return {k: np.concatenate([p[k] for p in parts]) for k in first}


def _name(key: Any) -> str:
    return "(unnamed)" if key is None else repr(key)


def _names(part: dict[Any, np.ndarray]) -> list[str]:
    return [_name(k) for k in part]


def _count(inputs: Inputs) -> int:
    return check_inputs(inputs, "data")
