"""How a compat :class:`TensorQuantizer` appears in a ``torch.onnx.export`` (TorchScript exporter).

Inside an export the quantizer does not run its torch arithmetic; it writes ONNX
``QuantizeLinear`` → ``DequantizeLinear`` with the float32 scale ``amax / maxbound`` as a graph
constant (TensorRT needs constant Q/DQ scales):

* with ``TensorQuantizer.use_fb_fake_quant = True`` through torch's own
  ``torch.fake_quantize_per_tensor_affine`` / ``per_channel_affine``, which the exporter maps to
  Q/DQ (also for unsigned quantizers: uint8 zero point);
* otherwise through qdq's Q/DQ emission (:func:`qdq.quant.onnx_qdq.emit_qdq`, int8, or
  ``float8_e4m3fn`` for an E4M3 quantizer; that graph needs opset 19).

The graph divides by the scale where the torch model multiplies by ``maxbound / amax``, and Q/DQ has
no narrow range (it saturates at -128), so the two agree except on values that sit on a rounding
boundary (one code apart) and on values past ``-amax`` with ``narrow_range``.
"""

from __future__ import annotations

import math
import warnings

import torch

from qdq.quant.onnx_qdq import emit_qdq, export_mode
from qdq.quant.primitives import MIN_SCALE

__all__ = ["export_qdq"]

_E4M3_MAX = 448.0


def _scale_constant(amax: torch.Tensor, bound: float) -> tuple[torch.Tensor, list[int]]:
    """The float32 scale ``amax / bound`` as a constant of the traced graph, and amax's shape.

    Under ``torch.export`` (the dynamo ONNX exporter, torch.onnx.export's default since torch 2.9)
    amax is a traced tensor whose values are unknown: the scale is computed from it in the graph
    (the exporter folds the computation on the amax initializer into a constant).
    """
    flat = amax.detach().to(torch.float32).reshape(-1)
    if torch.compiler.is_exporting():
        return torch.clamp(flat / bound, min=MIN_SCALE), [int(n) for n in amax.shape]
    with warnings.catch_warnings():  # amax is fixed at export: a constant is what we want
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        sizes = [int(n) for n in amax.shape]
        values = torch.clamp(flat / bound, min=MIN_SCALE).tolist()
        scale = torch.tensor(values, dtype=torch.float32)
    return scale, sizes


def _channel_axis(inputs: torch.Tensor, sizes: list[int], name: str) -> int | None:
    """The one axis of ``inputs`` along which amax varies, or None (per tensor).

    Raises:
        ValueError: amax varies along several axes (ONNX Q/DQ takes one).
    """
    if math.prod(sizes) <= 1:
        return None
    shape = [1] * (inputs.dim() - len(sizes)) + sizes
    axes = [d for d, n in enumerate(shape) if n != 1]
    if len(axes) != 1:
        raise ValueError(
            f"{name}: amax of shape {tuple(sizes)} varies along {len(axes)} axes; ONNX "
            "QuantizeLinear takes one axis (use a per-tensor or single-axis quantizer for export)"
        )
    return axes[0]


def export_qdq(
    inputs: torch.Tensor,
    amax: torch.Tensor,
    num_bits: int | tuple[int, int],
    unsigned: bool,
    use_fb_fake_quant: bool,
    name: str = "TensorQuantizer",
) -> torch.Tensor:
    """Write Q/DQ for ``inputs`` quantized with ``amax`` (called while ``torch.onnx`` traces).

    Args:
        inputs: the tensor being quantized.
        amax: per tensor (one element) or broadcastable along one axis of ``inputs``.
        num_bits: 8, or ``(4, 3)`` for E4M3 (per tensor only).
        unsigned: uint8 codes (needs ``use_fb_fake_quant``).
        use_fb_fake_quant: go through ``torch.fake_quantize_*`` instead of qdq's emission.
        name: the quantizer, for messages.

    Raises:
        ValueError: a width other than 8 / E4M3, a multi-axis or per-channel E4M3 amax, or
            unsigned without ``use_fb_fake_quant``.
    """
    if torch.compiler.is_exporting():  # dynamo: torch.onnx.ops.symbolic Q/DQ nodes
        with export_mode("dynamo"):
            return _export_qdq(inputs, amax, num_bits, unsigned, False, name)
    return _export_qdq(inputs, amax, num_bits, unsigned, use_fb_fake_quant, name)


def _export_qdq(
    inputs: torch.Tensor,
    amax: torch.Tensor,
    num_bits: int | tuple[int, int],
    unsigned: bool,
    use_fb_fake_quant: bool,
    name: str,
) -> torch.Tensor:
    if isinstance(num_bits, tuple):
        scale, sizes = _scale_constant(amax, _E4M3_MAX)
        if math.prod(sizes) != 1:
            raise ValueError(
                f"{name}: E4M3 exports per tensor only (a scalar amax), got amax of shape "
                f"{tuple(sizes)}"
            )
        zero = torch.zeros((), dtype=torch.float8_e4m3fn)
        return emit_qdq(inputs, scale.reshape(()), zero, None, 19)
    if num_bits != 8:
        raise ValueError(
            f"{name}: only 8-bit quantizers export to ONNX Q/DQ, got num_bits={num_bits}"
        )
    maxbound = (1 << (num_bits - 1 + int(unsigned))) - 1
    scale, sizes = _scale_constant(amax, maxbound)
    axis = _channel_axis(inputs, sizes, name)
    if not use_fb_fake_quant:
        if unsigned and not torch.compiler.is_exporting():
            raise ValueError(
                f"{name}: qdq's Q/DQ export is signed int8; set TensorQuantizer.use_fb_fake_quant "
                "= True to export an unsigned quantizer (uint8)"
            )
        zero = torch.zeros(
            scale.shape if axis is not None else (), dtype=torch.uint8 if unsigned else torch.int8
        )
        return emit_qdq(inputs, scale if axis is not None else scale.reshape(()), zero, axis, 13)
    qmin, qmax = (0, 255) if unsigned else (-128, 127)  # Q/DQ has no narrow range
    if axis is None:
        zp = torch.zeros((), dtype=torch.int32)
        return torch.fake_quantize_per_tensor_affine(inputs, scale.reshape(()), zp, qmin, qmax)
    zp = torch.zeros(scale.shape, dtype=torch.int32)
    return torch.fake_quantize_per_channel_affine(inputs, scale, zp, axis, qmin, qmax)
