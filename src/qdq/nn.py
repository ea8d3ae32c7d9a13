"""Building blocks for models torch.fx cannot trace (the module-replacement path).

:func:`qdq.prepare` places Q/DQ automatically on any traceable model. When a model has data-dependent
control flow, ``prepare`` falls back to replacing modules: every Conv/ConvTranspose/Linear becomes a
:class:`QuantWeighted` and every average pool a :class:`QuantInput`. What needs the graph — residual
Adds (rule P03), Concat scale groups (S02), MaxPool sharing (S03) — is then up to the model's author,
with :class:`QuantAdd` and :class:`QuantConcat` in its ``forward``.

Example:
    >>> add = QuantAdd()  # quantizes the skip operand only (TensorRT rule P03)
    >>> add.skip_quantizer.set_amax(1.0)
    >>> add(torch.zeros(2), torch.tensor([0.3, 2.0]))
    tensor([0.2992, 1.0000])
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.func import functional_call

from qdq.config import CalibSpec, QuantSpec
from qdq.quant import Quantizer

__all__ = ["QuantAdd", "QuantConcat", "QuantInput", "QuantWeighted"]


class QuantWeighted(nn.Module):
    """A Conv/ConvTranspose/Linear (or subclass) with an input and a weight quantizer.

    The wrapped module runs its own ``forward`` with the fake-quantized weight (via
    ``torch.func.functional_call``), so subclasses with custom forwards keep their behaviour.
    The weight quantizer is calibrated from the weight on construction.
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        name: str,
        weight_spec: QuantSpec,
        input_spec: QuantSpec | None = None,
        input_calib: CalibSpec | None = None,
    ) -> None:
        super().__init__()
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"{name}: {type(module).__name__} has no weight tensor to quantize")
        self.module = module
        self.input_quantizer = Quantizer(
            input_spec or QuantSpec(), input_calib, name=f"{name}:input"
        )
        self.weight_quantizer = Quantizer(weight_spec, CalibSpec.weights(), name=f"{name}:weight")
        self.weight_quantizer.calibrate_from(weight)

    def forward(self, x: torch.Tensor, *args: object) -> torch.Tensor:
        wq = self.weight_quantizer(self.module.weight)
        out: torch.Tensor = functional_call(
            self.module, {"weight": wq}, (self.input_quantizer(x), *args)
        )
        return out


class QuantInput(nn.Module):
    """Quantize the (first) input of a module, e.g. an average pool (rule P06)."""

    def __init__(self, module: nn.Module, *, name: str, calib: CalibSpec | None = None) -> None:
        super().__init__()
        self.module = module
        self.input_quantizer = Quantizer(QuantSpec(), calib, name=f"{name}:input")

    def forward(self, x: torch.Tensor, *args: object) -> torch.Tensor:
        out: torch.Tensor = self.module(self.input_quantizer(x), *args)
        return out


class QuantAdd(nn.Module):
    """``a + b`` with the residual skip ``b`` quantized (rule P03); ``a`` is the fused conv branch.

    Args:
        quantize_both: also quantize ``a`` (the yolov7 recipe's choice; TensorRT then runs the Add as
            a separate INT8 layer instead of fusing it into the conv).
        calib: calibration of the quantizers.
    """

    def __init__(
        self, *, quantize_both: bool = False, calib: CalibSpec | None = None, name: str = "add"
    ) -> None:
        super().__init__()
        self.skip_quantizer = Quantizer(QuantSpec(), calib, name=f"{name}:skip")
        self.branch_quantizer = (
            Quantizer(QuantSpec(), calib, name=f"{name}:branch") if quantize_both else None
        )

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.branch_quantizer is not None:
            a = self.branch_quantizer(a)
        return a + self.skip_quantizer(b)


class QuantConcat(nn.Module):
    """``torch.cat`` whose inputs all pass through one shared quantizer (rule S02).

    Quantize the consumers of the output with the same quantizer (pass ``quantizer``) to complete
    the group TensorRT needs to eliminate the Concat.
    """

    def __init__(self, dim: int = 1, *, calib: CalibSpec | None = None, name: str = "cat") -> None:
        super().__init__()
        self.dim = dim
        self.quantizer = Quantizer(QuantSpec(), calib, name=f"{name}:inputs")

    def forward(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        return torch.cat([self.quantizer(t) for t in tensors], dim=self.dim)
