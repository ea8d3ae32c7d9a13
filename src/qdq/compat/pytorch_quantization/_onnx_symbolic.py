"""ONNX for the compat autograd Functions when a script calls them directly inside
``torch.onnx.export(..., dynamo=False)`` (a hand-written quantized forward, as upstream allows).

A :class:`~.nn.TensorQuantizer` exports through :mod:`.nn.modules._quantizer_export`; these are
the ``symbolic`` methods of ``FakeTensorQuantFunction``, ``TensorQuantFunction`` and
``ScaledE4M3Function``, with upstream's private names. They write ``QuantizeLinear`` →
``DequantizeLinear`` with the float32 scale ``amax / bound`` as a Constant (TensorRT needs constant
scales, so amax must be a constant of the traced graph: a number, or a tensor that is not a buffer or
parameter), int8 (uint8 when unsigned) or float8 E4M3 zero points, and casts around them for
float16/bfloat16 inputs (Q/DQ below opset 19 take float32).

Q/DQ has no narrow range: a ``narrow_range`` quantizer's graph saturates at -128 where torch
saturates at -127 (upstream refuses to export it; the compat quantizer exports it the same way).

Example:
    >>> import io, torch
    >>> from qdq.compat.pytorch_quantization import tensor_quant
    >>> class M(torch.nn.Module):
    ...     def forward(self, x):
    ...         return tensor_quant.fake_tensor_quant(x, torch.tensor(2.0), 8, False, False)
    >>> f = io.BytesIO()
    >>> torch.onnx.export(M(), (torch.randn(3),), f, dynamo=False, opset_version=13)
"""

from __future__ import annotations

from typing import Any

import torch
from torch.onnx import symbolic_helper

__all__ = ["_onnx_fp8_dequantize", "_onnx_fp8_quantize", "_onnx_int8_helper"]

_FLOAT = 1  # onnx.TensorProto.FLOAT
_LOW_PRECISION = {"Half": 10, "BFloat16": 16}  # onnx.TensorProto.FLOAT16 / BFLOAT16


def _constant_amax(amax: Any) -> torch.Tensor:
    value = symbolic_helper._maybe_get_const(amax, "t")
    if not isinstance(value, torch.Tensor):
        if isinstance(value, (int, float)):
            return torch.tensor(float(value))
        raise ValueError(
            "fake_tensor_quant inside torch.onnx.export needs a constant amax (TensorRT takes "
            "constant Q/DQ scales); quantize through a TensorQuantizer, whose amax is read at "
            "export time"
        )
    return value


def _onnx_int8_helper(
    g: Any, inputs: Any, amax: Any, num_bits: int, unsigned: bool, narrow_range: bool
) -> Any:
    """QuantizeLinear → DequantizeLinear for an 8-bit quantization with ``amax``."""
    del narrow_range  # Q/DQ saturates at the full range (module docstring)
    if num_bits != 8:
        raise ValueError(f"only 8-bit quantization exports to ONNX Q/DQ, got num_bits={num_bits}")
    bound = 255 if unsigned else 127
    amax_t = _constant_amax(amax).detach().to(torch.float32)
    axis = None
    if amax_t.numel() > 1:
        sizes = list(amax_t.shape)
        kept = [d for d, n in enumerate(sizes) if n != 1]
        if len(kept) != 1:
            raise ValueError(
                f"amax of shape {tuple(sizes)} varies along {len(kept)} axes; ONNX Q/DQ takes one"
            )
        axis = kept[0]
        amax_t = amax_t.reshape(-1)
    else:
        amax_t = amax_t.reshape(())
    scale = amax_t / bound
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    zero = torch.zeros(scale.shape, dtype=torch.uint8 if unsigned else torch.int8)
    attrs = {} if axis is None else {"axis_i": axis}
    return _qdq(g, inputs, scale, zero, attrs)


def _qdq(
    g: Any, inputs: Any, scale: torch.Tensor, zero: torch.Tensor, attrs: dict[str, Any]
) -> Any:
    low = _LOW_PRECISION.get(inputs.type().scalarType())
    x = g.op("Cast", inputs, to_i=_FLOAT) if low is not None else inputs
    s = g.op("Constant", value_t=scale)
    z = g.op("Constant", value_t=zero)
    out = g.op("DequantizeLinear", g.op("QuantizeLinear", x, s, z, **attrs), s, z, **attrs)
    return g.op("Cast", out, to_i=low) if low is not None else out


def _onnx_fp8_quantize(g: Any, inputs: Any, scale_inv: float) -> Any:
    """QuantizeLinear to float8 E4M3 with the scale ``scale_inv`` (opset 19)."""
    s = g.op("Constant", value_t=torch.tensor(float(scale_inv), dtype=torch.float32))
    z = g.op("Constant", value_t=torch.zeros((), dtype=torch.float8_e4m3fn))
    low = _LOW_PRECISION.get(inputs.type().scalarType())
    x = g.op("Cast", inputs, to_i=_FLOAT) if low is not None else inputs
    return g.op("QuantizeLinear", x, s, z, saturate_i=1)


def _onnx_fp8_dequantize(g: Any, inputs: Any, scale_inv: float, otype: str | None = None) -> Any:
    """DequantizeLinear of a float8 tensor with ``scale_inv``, cast to ``otype`` (a torch
    scalar-type name such as ``"Half"``) when given."""
    s = g.op("Constant", value_t=torch.tensor(float(scale_inv), dtype=torch.float32))
    z = g.op("Constant", value_t=torch.zeros((), dtype=torch.float8_e4m3fn))
    out = g.op("DequantizeLinear", inputs, s, z)
    low = _LOW_PRECISION.get(otype or "")
    return g.op("Cast", out, to_i=low) if low is not None else out


def e4m3_symbolic(g: Any, inputs: Any, amax: Any = None, E: int = 4, M: int = 3) -> Any:  # noqa: N803
    """``ScaledE4M3Function.symbolic``: Q/DQ to float8 with the scale ``amax / 448``."""
    if E != 4 or M != 3:
        raise NotImplementedError("Only support E=4 & M=3 for now.")
    if symbolic_helper._is_none(amax):
        scale_inv = 1.0
    else:
        value = _constant_amax(amax).detach().to(torch.float32)
        if value.numel() != 1:
            raise ValueError(
                f"E4M3 exports per tensor only, got amax of shape {tuple(value.shape)}"
            )
        scale_inv = float(value) / 448.0 if float(value) != 0 else 1.0
    q = _onnx_fp8_quantize(g, inputs, scale_inv)
    return _onnx_fp8_dequantize(g, q, scale_inv, inputs.type().scalarType())


@symbolic_helper.parse_args("v", "v", "i", "b", "b")
def codes_symbolic(
    g: Any, inputs: Any, amax: Any, num_bits: int = 8, unsigned: bool = False,
    narrow_range: bool = True,
) -> tuple[Any, Any]:  # fmt: skip
    """``TensorQuantFunction.symbolic``: the codes (QuantizeLinear, cast to float) and upstream's
    scale ``bound / amax`` as a constant."""
    del narrow_range
    if num_bits != 8:
        raise ValueError(f"only 8-bit quantization exports to ONNX Q/DQ, got num_bits={num_bits}")
    bound = 255 if unsigned else 127
    amax_t = _constant_amax(amax).detach().to(torch.float32)
    if amax_t.numel() != 1:
        raise ValueError("tensor_quant exports per tensor only (a scalar amax)")
    step = amax_t.reshape(()) / bound
    step = torch.where(step == 0, torch.ones_like(step), step)
    zero = torch.zeros((), dtype=torch.uint8 if unsigned else torch.int8)
    x = inputs
    low = _LOW_PRECISION.get(inputs.type().scalarType())
    if low is not None:
        x = g.op("Cast", inputs, to_i=_FLOAT)
    q = g.op("QuantizeLinear", x, g.op("Constant", value_t=step), g.op("Constant", value_t=zero))
    codes = g.op("Cast", q, to_i=low if low is not None else _FLOAT)
    return codes, g.op("Constant", value_t=(1.0 / step).to(torch.float32))


@symbolic_helper.parse_args("v", "v", "i", "b", "b")
def int8_symbolic(
    g: Any, inputs: Any, amax: Any, num_bits: int = 8, unsigned: bool = False,
    narrow_range: bool = True,
) -> Any:  # fmt: skip
    """``FakeTensorQuantFunction.symbolic`` / ``TensorQuantFunction.symbolic``."""
    return _onnx_int8_helper(g, inputs, amax, num_bits, unsigned, narrow_range)
