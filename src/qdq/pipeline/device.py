"""Where ``qdq quantize`` runs the model: the ``device`` option (``--device``).

The job moves a copy of the float model and every batch to the device for capture, calibration,
PTQ, fallback, QAT and the torch evaluations (FP32 and fake-quant INT8); export and ONNX Runtime
stay on the CPU (:func:`qdq.export_onnx` traces a CPU copy). The user's model is never moved: when
it is not already on the device, the job works on a copy.

Accepted forms: ``None`` (CUDA when ``torch.cuda.is_available()``, else the CPU), ``"cpu"``,
``"cuda"``, ``"cuda:N"`` or a :class:`torch.device` of those types. Under ``torchrun``
(``LOCAL_RANK`` set), plain ``"cuda"`` means this rank's GPU, ``cuda:LOCAL_RANK``.

Example:
    >>> resolve_device("cpu")
    device(type='cpu')
    >>> resolve_device("tpu")
    Traceback (most recent call last):
    ...
    ValueError: unknown device 'tpu': use cpu, cuda or cuda:N
"""

from __future__ import annotations

import copy
import os
import warnings
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

__all__ = [
    "default_device",
    "float32_module",
    "module_device",
    "module_on",
    "resolve_device",
    "to_device",
]

_FORMS = "use cpu, cuda or cuda:N"


def default_device() -> torch.device:
    """CUDA (this rank's GPU under ``torchrun``) when ``torch.cuda.is_available()``, else CPU."""
    if torch.cuda.is_available():
        return resolve_device("cuda")
    return torch.device("cpu")


def resolve_device(value: str | torch.device | None) -> torch.device:
    """The :class:`torch.device` the job runs on (``None``: :func:`default_device`).

    ``"cuda"`` gets its index: ``LOCAL_RANK`` under ``torchrun``, else the current device.

    Raises:
        ValueError: an unknown device type or form, CUDA when ``torch.cuda.is_available()`` is
            false, or a GPU index past the GPUs there are (naming the value).
        TypeError: neither a string, a :class:`torch.device` nor ``None``.
    """
    if value is None:
        return default_device()
    if not isinstance(value, (str, torch.device)):
        raise TypeError(f"device must be a string or a torch.device, got {type(value).__name__}")
    try:
        device = torch.device(value.strip() if isinstance(value, str) else value)
    except (RuntimeError, ValueError):
        raise ValueError(f"unknown device {value!r}: {_FORMS}") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type != "cuda":
        raise ValueError(f"unknown device {str(value)!r}: {_FORMS}")
    if not torch.cuda.is_available():
        why = (
            "this torch was built without CUDA"
            if torch.version.cuda is None
            else "no GPU is visible (check CUDA_VISIBLE_DEVICES and the driver)"
        )
        raise ValueError(f"device {str(value)!r} asked for, but CUDA is not available: {why}; "
                         "use --device cpu (device='cpu')")  # fmt: skip
    index = device.index
    if index is None:
        local = os.environ.get("LOCAL_RANK")
        index = int(local) if local is not None and local.isdigit() else None
    if index is None:
        index = torch.cuda.current_device()
    count = torch.cuda.device_count()
    if index >= count:
        raise ValueError(
            f"device {str(value)!r} is GPU {index}, but {count} GPU(s) are visible (cuda:0.."
            f"cuda:{count - 1})"
        )
    return torch.device("cuda", index)


def module_device(module: nn.Module) -> torch.device:
    """The device of ``module``'s first parameter or buffer (the CPU when it holds none)."""
    for t in (*module.parameters(), *module.buffers()):
        return t.device
    return torch.device("cpu")


def module_on(module: nn.Module, device: torch.device) -> nn.Module:
    """``module`` when every parameter and buffer is on ``device``, else a copy moved there (the
    user's model is never moved)."""
    tensors = (*module.parameters(), *module.buffers())
    if all(t.device == device for t in tensors):
        return module
    return copy.deepcopy(module).to(device)


def float32_module(module: nn.Module, name: str) -> nn.Module:
    """``module`` when no parameter or buffer is float16/bfloat16, else a float32 copy (the user's
    model is never cast) and a warning naming the model ``name`` and the precision it had:
    calibration statistics, the FP32 reference and the Q/DQ ONNX are float32, from which TensorRT
    builds its FP16 layers (a checkpoint saved in half, as ultralytics saves its ``.pt`` files,
    loads as one)."""
    low = next(
        (
            t.dtype
            for t in (*module.parameters(), *module.buffers())
            if t.dtype in (torch.float16, torch.bfloat16)
        ),
        None,
    )
    if low is None:
        return module
    warnings.warn(
        f"{name}: its parameters are {str(low).removeprefix('torch.')}; calibrated, evaluated "
        "and exported from a float32 copy (the model is not changed; TensorRT builds FP16 layers "
        "from the float32 Q/DQ ONNX)",
        stacklevel=2,
    )
    return copy.deepcopy(module).float()


def to_device(value: Any, device: torch.device) -> Any:
    """Every tensor in ``value`` (a tensor, tuple, list or dict of them) moved to ``device``."""

    def move(leaf: Any) -> Any:
        return leaf.to(device) if isinstance(leaf, torch.Tensor) else leaf

    return tree_map(move, value)
