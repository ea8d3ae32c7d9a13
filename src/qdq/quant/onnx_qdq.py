"""How a Quantizer appears in an exported ONNX graph: QuantizeLinear → DequantizeLinear.

:func:`export_mode` is set by :func:`qdq.export_onnx` for the duration of an export. In that mode a
:class:`~qdq.quant.Quantizer` emits the two ONNX ops with its precomputed float32 scale and int8 zero
point (both constants, so they become initializers):

* dynamo exporter (``torch.onnx.export(dynamo=True)``): ``torch.onnx.ops.symbolic`` nodes;
* TorchScript exporter: an ``autograd.Function`` whose ``symbolic`` writes ``g.op(...)``.

Outside an export nothing here runs. This module imports only torch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["current_exporter", "emit_qdq", "export_mode"]

_EXPORTER: str | None = None


@contextlib.contextmanager
def export_mode(exporter: str) -> Iterator[None]:
    """Make quantizers emit Q/DQ ops for ``exporter`` (``"dynamo"`` or ``"torchscript"``)."""
    global _EXPORTER
    if exporter not in ("dynamo", "torchscript"):
        raise ValueError(f"exporter must be 'dynamo' or 'torchscript', got {exporter!r}")
    previous = _EXPORTER
    _EXPORTER = exporter
    try:
        yield
    finally:
        _EXPORTER = previous


def current_exporter() -> str | None:
    """The exporter in effect, or ``None`` outside :func:`export_mode`."""
    return _EXPORTER


def emit_qdq(
    x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, axis: int | None, opset: int
) -> torch.Tensor:
    """``DequantizeLinear(QuantizeLinear(x))`` as ONNX ops for the current exporter.

    When ``x`` and ``scale`` differ in dtype (a float16 graph with float32 scales below opset 19,
    where QuantizeLinear only takes float32), ``x`` is cast to the scale's dtype and the result
    back to ``x``'s dtype. The zero point's dtype is the format: ``int8``, or ``float8_e4m3fn``
    (FP8 Q/DQ, opset >= 19: the quantized tensor between the two ops is float8).
    """
    if x.dtype != scale.dtype:
        return emit_qdq(x.to(scale.dtype), scale, zero_point, axis, opset).to(x.dtype)
    if _EXPORTER == "dynamo":
        attrs: dict[str, Any] = {} if axis is None else {"axis": axis}
        q = torch.onnx.ops.symbolic(
            "QuantizeLinear", (x, scale, zero_point), attrs, dtype=zero_point.dtype,
            shape=x.shape, version=opset,
        )  # fmt: skip
        return torch.onnx.ops.symbolic(
            "DequantizeLinear", (q, scale, zero_point), attrs, dtype=scale.dtype, shape=x.shape,
            version=opset,
        )  # fmt: skip
    out: torch.Tensor = _TorchScriptQDQ.apply(x, scale, zero_point, axis)
    return out


class _TorchScriptQDQ(torch.autograd.Function):
    @staticmethod
    def forward(  # eager value used while the TorchScript exporter traces
        ctx: Any, x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, axis: int | None
    ) -> torch.Tensor:
        shape = [1] * x.dim()
        if axis is not None:
            shape[axis] = -1
        s = scale.reshape(shape) if axis is not None else scale
        scaled = x.to(torch.float32) / s
        if zero_point.dtype == torch.float8_e4m3fn:  # saturate, round to nearest even
            return (scaled.clamp(-448.0, 448.0).to(zero_point.dtype).to(torch.float32) * s).to(
                scale.dtype
            )
        q = torch.clamp(torch.round(scaled), -128, 127) + 0.0
        return (q * s).to(scale.dtype)

    @staticmethod
    def symbolic(
        g: Any, x: Any, scale: Any, zero_point: Any, axis: int | None
    ) -> Any:  # pragma: no cover - runs inside torch.onnx's TorchScript exporter
        attrs = {} if axis is None else {"axis_i": axis}
        q = g.op("QuantizeLinear", x, scale, zero_point, **attrs)
        return g.op("DequantizeLinear", q, scale, zero_point, **attrs)
