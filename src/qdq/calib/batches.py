"""Calibration batches → model arguments, checked up front with messages that name the batch.

A batch may be

* a tensor — the model's only input: ``model(x)``;
* a tuple or list — its first ``n`` items are the model's ``n`` inputs, the rest (labels) are
  ignored: ``(x, y)`` → ``model(x)``; ``[x1, x2, y]`` → ``model(x1, x2)``; a nested first item
  holding all inputs also works: ``((x1, x2), y)`` → ``model(x1, x2)``;
* a dict — keyword arguments; keys that are not parameters of ``forward`` (labels) are ignored.

What the model expects comes from the example inputs recorded at :func:`qdq.prepare` time (the
shapes ``torch.fx`` propagated through the captured graph) or, when nothing was recorded, from the
first batch. Before a batch runs, every input is checked: a tensor, of the expected rank, dtype
(floating inputs: the model's parameter dtype) and device. Other dimensions than the batch dimension
may differ (fully convolutional models take any image size); if the model then fails, the error is a
:class:`~qdq.calib.CalibrationError` that names the batch and the expected and received shapes,
instead of the raw operator error.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import itertools
import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from qdq.calib.base import CalibrationError

__all__ = ["InputSpec", "batch_samples", "expected_inputs", "forward_parameters", "run_batch"]


@dataclass(frozen=True)
class InputSpec:
    """What one positional input of the model looks like (``shape``/``dtype`` ``None``: unknown)."""

    name: str
    shape: tuple[int, ...] | None = None
    dtype: torch.dtype | None = None

    def describe(self) -> str:
        """``"x: float32 tensor [N, 3, 32, 32]"`` (the batch dimension as N)."""
        if self.shape is None:
            return f"{self.name}: a tensor"
        dims = ", ".join(["N", *(str(d) for d in self.shape[1:])]) if self.shape else ""
        dtype = str(self.dtype).replace("torch.", "") if self.dtype is not None else ""
        return f"{self.name}: {dtype} tensor [{dims}]"


@dataclass
class _Expected:
    inputs: list[InputSpec]
    keywords: set[str] | None  # parameter names of forward; None: takes **kwargs
    from_first_batch: bool


def expected_inputs(model: nn.Module) -> _Expected:
    """The model's positional inputs (recorded at prepare time when available) and keywords."""
    params = forward_parameters(model)
    names = [p.name for p in params if p.kind in _POSITIONAL and p.default is p.empty]
    var_keyword = any(p.kind is p.VAR_KEYWORD for p in params)
    keywords = None if var_keyword else {p.name for p in params if p.kind is not p.VAR_POSITIONAL}
    recorded = _recorded_specs(model)
    if recorded:
        return _Expected(recorded, keywords, from_first_batch=False)
    if not names and any(p.kind is p.VAR_POSITIONAL for p in params):
        names = ["input"]  # forward(*args): one input, labels after it ignored
    return _Expected([InputSpec(n) for n in names] or [InputSpec("input")], keywords, True)


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def forward_parameters(model: nn.Module) -> list[inspect.Parameter]:
    """The parameters of ``model.forward`` (empty when it has no signature)."""
    try:
        return list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):  # builtins without a signature
        return []


def _recorded_specs(model: nn.Module) -> list[InputSpec]:
    """The example inputs ``prepare`` recorded the plan with (name, shape, dtype)."""
    from qdq.graph.runtime import runtime_of

    runtime = runtime_of(model)
    if runtime is None:
        return []
    return [InputSpec(name, tuple(shape), dtype) for name, shape, dtype in runtime.inputs]


def _model_dtype_device(model: nn.Module) -> tuple[torch.dtype | None, torch.device | None]:
    for t in itertools.chain(model.parameters(), model.buffers()):  # stops at the first
        if t.is_floating_point():
            return t.dtype, t.device
    return None, None


def batch_samples(batch: Any) -> int:
    """Samples in a batch: dimension 0 of its first tensor (1 for a scalar or no tensor)."""
    leaves = [t for t in tree_flatten(batch)[0] if isinstance(t, torch.Tensor)]
    return int(leaves[0].shape[0]) if leaves and leaves[0].dim() else 1


def run_batch(model: nn.Module, batch: Any, index: int, expected: _Expected) -> Any:
    """Check ``batch`` against ``expected``, run ``model`` on it and return its output.

    Raises:
        TypeError: the batch (or one of its inputs) is not a tensor / tuple / list / dict.
        CalibrationError: wrong number of inputs, rank, dtype or device; or the model fails on a
            batch whose shape differs from the expected one (naming the batch and both shapes).
    """
    args, kwargs = _arguments(batch, index, expected)
    tensors = [(expected.inputs[i] if i < len(expected.inputs) else InputSpec(f"input{i}"), a)
               for i, a in enumerate(args)]  # fmt: skip
    dtype, device = _model_dtype_device(model)
    for spec, value in tensors:
        _check_tensor(spec, value, index, dtype, device)
    if expected.from_first_batch and index == 0:
        expected.inputs = [
            InputSpec(spec.name, tuple(v.shape), v.dtype) for spec, v in tensors
        ]  # later batches are compared with the first one
    deviates = [
        (spec, v)
        for spec, v in tensors
        if spec.shape is not None and tuple(v.shape[1:]) != spec.shape[1:]
    ]
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stderr(buffer):  # fx prints the generated code on errors
            output = model(*args, **kwargs)
    except CalibrationError:
        raise
    except Exception as err:
        if not deviates:
            sys.stderr.write(buffer.getvalue())
            raise
        got = "; ".join(f"{s.name}: {list(v.shape)}" for s, v in deviates)
        want = "; ".join(s.describe() for s, _ in deviates)
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise CalibrationError(
            f"calibration batch {index}: the model expects {want}, got {got}; it fails on this "
            f"shape ({type(err).__name__}: {first_line})"
        ) from None
    sys.stderr.write(buffer.getvalue())
    return output


def batch_arguments(
    batch: Any, index: int, expected: _Expected
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The model's ``(args, kwargs)`` in ``batch`` (labels dropped), as :func:`run_batch` calls it."""
    return _arguments(batch, index, expected)


def _arguments(
    batch: Any, index: int, expected: _Expected
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    n = len(expected.inputs)
    want = ", ".join(s.describe() for s in expected.inputs)
    if isinstance(batch, torch.Tensor):
        if n > 1:
            raise CalibrationError(
                f"calibration batch {index} is one tensor but the model takes {n} inputs ({want}); "
                "pass (x1, x2, ...) tuples"
            )
        return (batch,), {}
    if isinstance(batch, dict):
        if expected.keywords is None:
            return (), dict(batch)
        kwargs = {k: v for k, v in batch.items() if k in expected.keywords}
        missing = [s.name for s in expected.inputs if s.name not in kwargs]
        if missing:
            raise CalibrationError(
                f"calibration batch {index} is a dict without the model input(s) {missing} "
                f"(keys: {sorted(map(str, batch))})"
            )
        return (), kwargs
    if isinstance(batch, (tuple, list)):
        items = list(batch)
        if n > 1 and items and isinstance(items[0], (tuple, list)) and len(items[0]) == n:
            items = list(items[0])  # ((x1, x2), y)
        if len(items) < n:
            raise CalibrationError(
                f"calibration batch {index} has {len(items)} item(s) but the model takes {n} "
                f"inputs ({want})"
            )
        return tuple(items[:n]), {}
    raise TypeError(
        f"calibration batch {index} is a {type(batch).__name__}; expected a tensor, a tuple/list "
        f"(inputs first, labels ignored) or a dict of inputs ({want}); pass a forward_loop(model) "
        "callable for anything else"
    )


def _check_tensor(
    spec: InputSpec,
    value: Any,
    index: int,
    model_dtype: torch.dtype | None,
    model_device: torch.device | None,
) -> None:
    where = f"calibration batch {index}, input {spec.name!r}"
    if not isinstance(value, torch.Tensor):
        if spec.shape is None and spec.dtype is None and not isinstance(value, (list, tuple)):
            return  # nothing recorded: a non-tensor input (a flag, an int) may be intended
        raise TypeError(f"{where} is a {type(value).__name__}; expected {spec.describe()}")
    if spec.shape is not None and value.dim() != len(spec.shape):
        raise CalibrationError(
            f"{where} has rank {value.dim()} (shape {list(value.shape)}); expected "
            f"{spec.describe()}"
        )
    allowed = {spec.dtype} if spec.dtype is not None else set()
    if model_dtype is not None and (
        (spec.dtype is None and value.is_floating_point())
        or (spec.dtype is not None and spec.dtype.is_floating_point)
    ):
        allowed.add(model_dtype)  # floating inputs follow the model (e.g. after .half())
    allowed.discard(None)
    if allowed and value.dtype not in allowed:
        want_dtype = model_dtype if model_dtype in allowed else spec.dtype
        raise CalibrationError(
            f"{where} has dtype {value.dtype}; expected {want_dtype} ({spec.describe()}); "
            f"convert it with .to({want_dtype})"
        )
    if model_device is not None and value.device != model_device:
        raise CalibrationError(
            f"{where} is on {value.device} but the model is on {model_device}; move it with "
            f".to({str(model_device)!r})"
        )
