"""MXFP8 in TensorRT's own form: ``trt::TRT_MXFP8DequantizeLinear`` of ``UINT8`` exponents
(issue 60, export for TensorRT 10.12..10.x).

ONNX holds MXFP8 block scales as ``FLOAT8E8M0``, a type of opset 24 (IR 12) that only TensorRT
11's ONNX parser reads; TensorRT has MXFP8 kernels since 10.12, whose parser reads up to opset
23. TensorRT Model Optimizer (0.47, measured on its real exports) writes MXFP8 for those
releases with TensorRT's own dequantize operator instead, and :mod:`qdq.export.blocks_onnx`
writes that form when asked for ``block_form="trt"`` (:data:`BLOCK_FORMS`):

* MXFP8 weight: a ``FLOAT8E4M3FN`` initializer ``w`` and ``UINT8`` exponent bytes ``s`` (the
  E8M0 bits: the biased exponent, ``127`` a scale of 1, ``255`` NaN),
  ``trt::TRT_MXFP8DequantizeLinear(w, s){axis, block_size=32, output_dtype=FLOAT}``.
* MXFP8 activation: ``trt::TRT_MXFP8DynamicQuantize(x){axis, block_size=32, output_dtype=17}``
  → ``(x_e4m3, s_uint8)``; ``trt::TRT_MXFP8DequantizeLinear(x_e4m3, s_uint8){axis,
  block_size=32, output_dtype=FLOAT}``.

The codes are those of the ``"onnx"`` form bit for bit: the same E4M3 initializer, and exponent
bytes equal to the ``FLOAT8E8M0`` bits of its scales (checked for every weight before it is
written). The nodes keep the ``"onnx"`` form's names (``<quantizer>/DequantizeLinear``), so
validation, the manifest's node lists and ``qdq parity``'s taps find them alike. No tensor of the
form needs an opset-24 type: a graph whose only block format is MXFP8 is written at opset 19 (IR
9, the first with ``FLOAT8E4M3FN`` tensors; the opset FP8 Q/DQ need too), NVFP4 still raises it
to 23 and INT4 to 21 (:func:`qdq.export.blocks_onnx.required_opset`). NVFP4 and INT4 have one
form, the same under either name. :mod:`qdq.backends.blocks_reference` runs the form in ONNX
Runtime exactly, and the linter reads it (:data:`qdq.lint.formats.TRT_DEQUANTIZE`).

Example:
    >>> import torch
    >>> from onnx import TensorProto
    >>> codes, exps = torch.tensor([[1.0, -0.5]]), torch.tensor([[0.0]])
    >>> nodes, inits = mx_weight(codes, exps, "fc.w", "fc/DequantizeLinear", "wq", -1, 2,
    ...                          lambda base: base)
    >>> [n.op_type for n in nodes], [i.data_type == TensorProto.UINT8 for i in inits]
    (['TRT_MXFP8DequantizeLinear'], [False, True])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

__all__ = [
    "BLOCK_FORMS",
    "MX_DEQUANTIZE",
    "check_block_form",
    "exponent_bytes",
    "form_for",
    "mx_activation",
    "mx_weight",
]

#: the ONNX forms of MXFP8 qdq writes: ONNX's own (``FLOAT8E8M0``, opset 24) or TensorRT's
BLOCK_FORMS = ("onnx", "trt")
#: TensorRT's MXFP8 dequantize operator (domain ``trt``)
MX_DEQUANTIZE = "TRT_MXFP8DequantizeLinear"
_TRT_DOMAIN = "trt"
_FLOAT, _E4M3, _E8M0_BIAS, _NAN_BYTE = 1, 17, 127, 255


#: the first opset with ``FLOAT8E8M0`` (ONNX's form of MXFP8 scales)
E8M0_OPSET = 24


def form_for(fmt: str, max_opset: int | None) -> str:
    """The form to export a ``fmt`` plan in for a TensorRT whose ONNX parser reads up to
    ``max_opset`` (``None``: unknown): ``"trt"`` for MXFP8 below opset 24 (TensorRT 10.12..10.x),
    else ``"onnx"`` (TensorRT 11+, an unknown parser, and every other format, which has one form).

    Example:
        >>> form_for("mxfp8", 23), form_for("mxfp8", 25), form_for("nvfp4", 23)
        ('trt', 'onnx', 'onnx')
    """
    return "trt" if fmt == "mxfp8" and max_opset is not None and max_opset < E8M0_OPSET else "onnx"


def check_block_form(block_form: object) -> str:
    """``block_form`` checked: one of :data:`BLOCK_FORMS`.

    Example:
        >>> check_block_form("trt")
        'trt'

    Raises:
        ValueError: anything else, naming it.
    """
    if not isinstance(block_form, str) or block_form not in BLOCK_FORMS:
        raise ValueError(
            f"block_form must be one of {', '.join(map(repr, BLOCK_FORMS))} (MXFP8 as ONNX's "
            f"FLOAT8E8M0 DequantizeLinear at opset 24, or TensorRT's TRT_MXFP8DequantizeLinear "
            f"of UINT8 exponents), got {block_form!r}"
        )
    return block_form


def exponent_bytes(exponents: torch.Tensor) -> np.ndarray:
    """The E8M0 bytes of MXFP8 block exponents (``block_scales``' ``sb``): ``e + 127``, ``255``
    for NaN.

    Example:
        >>> exponent_bytes(torch.tensor([0.0, -127.0, 127.0, float("nan")])).tolist()
        [127, 0, 254, 255]
    """
    e = exponents.detach().to(torch.float32).cpu()
    nan = torch.isnan(e)
    biased = torch.nan_to_num(e, nan=0.0).to(torch.int32) + _E8M0_BIAS
    return torch.where(nan, torch.full_like(biased, _NAN_BYTE), biased).numpy().astype(np.uint8)


def mx_weight(
    codes: torch.Tensor,
    exponents: torch.Tensor,
    quantizer: str,
    node_name: str,
    out: str,
    axis: int,
    block_size: int,
    names: Callable[[str], str],
    scale: torch.Tensor | None = None,
) -> tuple[list[Any], list[Any]]:
    """An MXFP8 weight's initializers and its ``TRT_MXFP8DequantizeLinear``.

    Args:
        codes: the E4M3 values (float32 on the E4M3 grid).
        exponents: the block exponents, blocked along ``axis``.
        quantizer: the quantizer's path (the initializers' names start with it).
        node_name: the dequantize node's name.
        out: its output.
        axis: the blocked axis as written (negative when the rank is known).
        block_size: 32.
        names: a fresh-name source (:class:`qdq.export.blocks_onnx.FreshNames`).
        scale: the float32 scales ``2**e`` the ``"onnx"`` form writes as ``FLOAT8E8M0``: the
            bytes are checked equal to their E8M0 bits (``None``: not checked).
    """
    import ml_dtypes
    from onnx import helper, numpy_helper

    exps = exponent_bytes(exponents)
    if scale is not None:
        e8m0 = scale.numpy().astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)
        if not np.array_equal(e8m0, exps):
            raise RuntimeError(  # pragma: no cover - a bug in this module, never input
                f"quantizer {quantizer!r}: {int((e8m0 != exps).sum())} exponent bytes differ "
                "from the FLOAT8E8M0 bits of its scales"
            )
    w, sn = names(f"{quantizer}.w_e4m3"), names(f"{quantizer}.w_e8m0_bytes")
    inits = [
        numpy_helper.from_array(codes.numpy().astype(ml_dtypes.float8_e4m3fn), w),
        numpy_helper.from_array(exps, sn),
    ]
    node = helper.make_node(MX_DEQUANTIZE, [w, sn], [out], name=node_name, domain=_TRT_DOMAIN,
                            axis=axis, block_size=block_size, output_dtype=_FLOAT)  # fmt: skip
    return [node], inits


def mx_activation(
    x: str, quantizer: str, base: str, out: str, axis: int, block_size: int, dynamic: str,
    names: Callable[[str], str],
) -> list[Any]:  # fmt: skip
    """``TRT_MXFP8DynamicQuantize`` (op type ``dynamic``) then ``TRT_MXFP8DequantizeLinear`` of
    ``x``, named after the quantizer's node ``base``.

    Example:
        >>> nodes = mx_activation("x", "fc.iq", "fc.iq", "xq", -1, 32, "TRT_MXFP8DynamicQuantize",
        ...                       lambda base: base)
        >>> [(n.op_type, n.name) for n in nodes]  # doctest: +NORMALIZE_WHITESPACE
        [('TRT_MXFP8DynamicQuantize', 'fc.iq/TRT_MXFP8DynamicQuantize'),
         ('TRT_MXFP8DequantizeLinear', 'fc.iq/DequantizeLinear')]
    """
    from onnx import helper

    x8, se = names(f"{quantizer}.x_e4m3"), names(f"{quantizer}.x_e8m0_bytes")
    return [
        helper.make_node(dynamic, [x], [x8, se], name=f"{base}/{dynamic}", domain=_TRT_DOMAIN,
                         axis=axis, block_size=block_size, output_dtype=_E4M3),
        helper.make_node(MX_DEQUANTIZE, [x8, se], [out], name=f"{base}/DequantizeLinear",
                         domain=_TRT_DOMAIN, axis=axis, block_size=block_size,
                         output_dtype=_FLOAT),
    ]  # fmt: skip
