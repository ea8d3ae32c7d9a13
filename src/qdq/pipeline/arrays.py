"""Named arrays made model inputs and labels: the ``.npz`` convention of
:mod:`qdq.pipeline.data`, which in-memory data (:mod:`qdq.pipeline.memory`) follows too. One
input array (unnamed, or named one of :data:`INPUT_KEYS`), or arrays named after the parameters
of the model's ``forward``; plus optional integer labels named one of :data:`LABEL_KEYS`."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from qdq.pipeline.inputs import Inputs, check_inputs, forward_text, parameter_names

__all__ = ["INPUT_KEYS", "LABEL_KEYS", "class_labels", "named_arrays"]

#: the names of the one input array of a multi-array file
INPUT_KEYS = ("x", "images", "inputs", "input", "data")
#: the names of the labels array
LABEL_KEYS = ("y", "labels", "label", "targets", "target")


def named_arrays(
    arrays: dict[str | None, np.ndarray], where: str, model: nn.Module | None
) -> tuple[Inputs, torch.Tensor | None]:
    """Inputs and labels from named arrays (a ``.npz``'s, or in-memory data's; key ``None``: one
    unnamed array): one input array, or arrays named after ``forward``'s parameters, plus
    optional labels (:data:`LABEL_KEYS`); ``where`` names the data in messages."""
    if len(arrays) == 1:
        x_key, y_key, names = next(iter(arrays)), None, None
    else:
        y_key = next((k for k in LABEL_KEYS if k in arrays), None)
        rest = [k for k in arrays if k is not None and k != y_key]
        params = parameter_names(model) if model is not None else []
        x_key = rest[0] if len(rest) == 1 and rest[0] in INPUT_KEYS else None
        names = None if x_key is not None else sorted(rest, key=_order(params))
        unmatched = [k for k in rest if k not in params] if x_key is None else []
        more_labels = [k for k in unmatched if k in LABEL_KEYS]
        if more_labels:
            raise ValueError(f"{where} holds more than one label array: {[y_key, *more_labels]}")
        if unmatched:
            forward = forward_text(model) if model is not None else "the model's forward"
            raise ValueError(
                f"{where} holds arrays {list(arrays)}: {unmatched} match no "
                f"parameter of {forward} and are not labels; expected one input array named one "
                f"of {'/'.join(INPUT_KEYS)} or arrays named after the parameters of {forward}, "
                f"and optionally labels named one of {'/'.join(LABEL_KEYS)}"
            )
    if names is None:
        inputs: Inputs = _tensor(arrays[x_key], where if x_key is None else f"{where}[{x_key}]")
    else:
        inputs = {k: _tensor(arrays[k], f"{where}[{k}]") for k in names}
    n = check_inputs(inputs, where)
    if y_key is None:
        return inputs, None
    what = repr(x_key) if names is None else "each input"
    return inputs, class_labels(arrays[y_key], n, f"{where}[{y_key}]", f"{n} samples in {what}")


def class_labels(y: np.ndarray, n: int, where: str, samples: str) -> torch.Tensor:
    """``y`` as int64 class labels, checked: integer, one per sample (``n``; ``samples`` says
    where they were counted) -- 1-D, non-negative, or 2-D (one per token: token classification),
    non-negative or ``-100`` (Hugging Face's label of a token that is not scored)."""
    if y.ndim not in (1, 2) or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(
            f"{where} must be integer class labels, 1-D (one per sample) or 2-D (one per token), "
            f"got {y.dtype} of shape {y.shape}"
        )
    if len(y) != n:
        raise ValueError(f"{where}: {len(y)} labels but {samples}")
    bad = y[(y < 0) & (y != -100)] if y.ndim == 2 else y[y < 0]
    if bad.size:
        ignored = " (-100 marks a token that is not scored)" if y.ndim == 2 else ""
        raise ValueError(f"{where} holds negative labels ({int(bad[0])}){ignored}")
    return torch.from_numpy(y.astype(np.int64))


def _order(params: list[str]) -> Callable[[str], int]:
    """Sort key: the position of a parameter in ``forward``."""
    return lambda name: params.index(name) if name in params else len(params)


def _tensor(array: np.ndarray, where: str) -> torch.Tensor:
    """Samples along axis 0; floating arrays become float32, others keep their dtype."""
    if array.ndim == 0 or array.shape[0] == 0:
        raise ValueError(f"{where} has shape {array.shape}: expected samples along axis 0")
    t = torch.from_numpy(np.ascontiguousarray(array))
    return t.to(torch.float32) if t.is_floating_point() else t
