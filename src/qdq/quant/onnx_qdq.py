"""How a Quantizer appears in an exported ONNX graph: QuantizeLinear → DequantizeLinear.

:func:`export_mode` is set by :func:`qdq.export_onnx` for the duration of an export. In that mode a
:class:`~qdq.quant.Quantizer` emits the two ONNX ops with its precomputed float32 scale and int8 zero
point (both constants, so they become initializers):

* dynamo exporter (``torch.onnx.export(dynamo=True)``): ``torch.onnx.ops.symbolic`` nodes;
* TorchScript exporter: an ``autograd.Function`` whose ``symbolic`` writes ``g.op(...)``.

A block-format quantizer (NVFP4, MXFP8, INT4: :mod:`qdq.quant.blocks`) emits one marker node
instead, :func:`emit_block`: ``qdq.internal::BlockQDQ(x[, amax])`` with the attributes ``format``
(``"nvfp4"``/``"mxfp8"``/``"int4"``), ``axis`` (the blocked axis, or INT4's channel axis; never
negative), ``block_size`` (0: per channel) and ``role`` (``"weight"``/``"activation"``); its
output has ``x``'s shape and dtype. ``amax`` is a float32 constant: NVFP4's per-tensor amax (0-d),
INT4's per-block (the blocked layout of ``DequantizeLinear``'s scale) or per-channel amax, absent
for MXFP8. The export then rewrites every marker into the form TensorRT builds
(:mod:`qdq.export.blocks_onnx`): both exporters give the same graph.

Outside an export nothing here runs. This module imports only torch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["BLOCK_DOMAIN", "BLOCK_OP", "current_exporter", "emit_block", "emit_qdq", "export_mode"]

#: The marker a block-format quantizer writes (domain, op type); rewritten before the file is saved.
BLOCK_DOMAIN, BLOCK_OP = "qdq.internal", "BlockQDQ"

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


def emit_block(
    x: torch.Tensor,
    amax: torch.Tensor | None,
    fmt: str,
    axis: int,
    block_size: int | None,
    role: str,
    value: Callable[[], torch.Tensor] | None,
) -> torch.Tensor:
    """The ``qdq.internal::BlockQDQ`` marker of a block-format quantizer (module docstring).

    Args:
        x: the tensor quantized (a weight's constant, or an activation).
        amax: NVFP4's per-tensor amax, INT4's per-block or per-channel amax; ``None`` for MXFP8.
        fmt: ``"nvfp4"``, ``"mxfp8"`` or ``"int4"``.
        axis: the blocked (or INT4 channel) axis, non-negative.
        block_size: elements per block; ``None`` per channel (INT4).
        role: ``"weight"`` or ``"activation"``.
        value: computes the fake-quantized ``x``: what the TorchScript exporter's trace carries
            on (called inside an ``autograd.Function``, so its ops are not traced); not needed by
            the dynamo exporter.
    """
    attrs: dict[str, Any] = {
        "format": fmt, "axis": int(axis), "block_size": int(block_size or 0), "role": role,
    }  # fmt: skip
    if _EXPORTER == "dynamo":
        inputs = (x,) if amax is None else (x, amax)
        return torch.onnx.ops.symbolic(
            f"{BLOCK_DOMAIN}::{BLOCK_OP}", inputs, attrs, dtype=x.dtype, shape=x.shape, version=1
        )
    if value is None:
        raise ValueError("the TorchScript exporter needs the fake-quantized value")
    attrs["value"] = value
    out: torch.Tensor = _TorchScriptBlock.apply(x, amax, attrs)
    return out


class _TorchScriptBlock(torch.autograd.Function):
    @staticmethod
    def forward(  # eager value used while the TorchScript exporter traces
        ctx: Any, x: torch.Tensor, amax: torch.Tensor | None, attrs: Any
    ) -> torch.Tensor:
        state = torch._C._get_tracing_state()  # the eager value only: none of its ops traced
        torch._C._set_tracing_state(None)  # type: ignore[attr-defined]
        try:
            out: torch.Tensor = attrs["value"]()
        finally:
            torch._C._set_tracing_state(state)  # type: ignore[attr-defined]
        return out

    @staticmethod
    def symbolic(
        g: Any, x: Any, amax: Any, attrs: dict[str, Any]
    ) -> Any:  # pragma: no cover - runs inside torch.onnx's TorchScript exporter
        kw = {"format_s": attrs["format"], "axis_i": attrs["axis"],
              "block_size_i": attrs["block_size"], "role_s": attrs["role"]}  # fmt: skip
        inputs = [x] if amax is None or _is_none(amax) else [x, amax]
        return g.op(f"{BLOCK_DOMAIN}::{BLOCK_OP}", *inputs, **kw)


def _is_none(value: Any) -> bool:
    node = getattr(value, "node", None)
    return node is not None and callable(node) and node().mustBeNone()
