"""Block-format markers → the ONNX forms TensorRT's parser builds (issue 60, export).

A block-format quantizer writes one ``qdq.internal::BlockQDQ`` marker while torch exports
(:func:`qdq.quant.onnx_qdq.emit_block`); :func:`expand_blocks` rewrites every marker, so no
marker reaches a saved file. Weights (``role="weight"``, ``x`` an initializer or ``Constant``)
become pre-quantized initializers read by ``DequantizeLinear``; activations go through TensorRT's
dynamic block quantize operators (domain ``trt``):

* NVFP4 weight: ``FLOAT4E2M1`` initializer ``w``, ``FLOAT8E4M3FN`` block scales ``sb``, float32
  per-tensor scale ``gs``: ``DequantizeLinear(w, DequantizeLinear(sb, gs), axis, block_size=16)``.
* NVFP4 activation: ``trt::TRT_FP4DynamicQuantize(x, gs){axis, block_size=16, scale_type=17}``
  → ``(x_f4, sb)``; ``DequantizeLinear(x_f4, DequantizeLinear(sb, gs), axis, block_size=16)``.
  ``gs`` is a constant, ``amax / 2688`` computed by :func:`qdq.quant.blocks.block_scales`.
* MXFP8 weight: ``FLOAT8E4M3FN`` initializer and ``FLOAT8E8M0`` scales,
  ``DequantizeLinear(w, s, axis, block_size=32, output_dtype=FLOAT)``.
* MXFP8 activation: ``trt::TRT_MXFP8DynamicQuantize(x){axis, block_size=32, output_dtype=17}``
  → ``(x_e4m3, s_e8m0)``; ``DequantizeLinear(x_e4m3, s_e8m0, axis, block_size=32,
  output_dtype=FLOAT)``.
* MXFP8 with ``block_form="trt"`` (:mod:`qdq.export.blocks_trt`, TensorRT Model Optimizer's
  form for TensorRT 10.12..10.x): the same E4M3 values with ``UINT8`` exponent bytes (the E8M0
  bits) read by ``trt::TRT_MXFP8DequantizeLinear(w, s){axis, block_size=32,
  output_dtype=FLOAT}``, activations ``TRT_MXFP8DynamicQuantize`` →
  ``trt::TRT_MXFP8DequantizeLinear``. The codes are the ``"onnx"`` form's bit for bit.
* INT4 weight: ``INT4`` initializer and float32 scales ``amax / 7``,
  ``DequantizeLinear(w, s, axis, block_size)`` (per channel: 1-D scales, no ``block_size``).

The codes are computed with :mod:`qdq.quant.blocks`' own functions, and each weight's
dequantized values are checked equal, bit for bit, to :func:`~qdq.quant.blocks.block_fake_quant`
before they are written. No zero points (TensorRT requires them zero; ONNX makes them optional).
The ``axis`` attributes are written negative when the rank is known (``-1``, as ModelOpt does).

A weight marker whose ``x`` is not a constant (a weight computed in ``forward`` from an input):
INT4 gets ``QuantizeLinear`` → ``DequantizeLinear`` with ``block_size`` (the standard ops, exact:
round half to even, saturating, the same scales); NVFP4 and MXFP8 are refused with a
``ValueError`` naming the quantizer (TensorRT builds FP4/MX GEMMs from constant weights; a
dynamic quantize there would be an activation×activation product TensorRT has no kernels for).

**Opset.** ``FLOAT4E2M1`` ``DequantizeLinear`` exists from opset 23 (IR 11), ``FLOAT8E8M0``
scales from opset 24 (IR 12; ``DequantizeLinear``-24 adds them and ``output_dtype``), INT4 from
opset 21 (IR 10). The graph is raised to the least opset its tensors need (21 INT4 only, 23 with
NVFP4, 24 with MXFP8 in the ``"onnx"`` form, 19 in the ``"trt"`` form: ``FLOAT8E4M3FN``, IR 9;
never lowered) with ``onnx.version_converter`` (the dynamo exporter writes
18: the ops between 18 and 24 change only in the types they accept, except GroupNormalization-21
and DFT-20, which the converter rewrites), so ``onnx.checker`` validates every standard node.
TensorRT's parser reads ``DequantizeLinear`` by its inputs' types whatever the opset (ModelOpt
exports NVFP4 at opset 20 and MXFP8 weights with a ``trt::TRT_MXFP8DequantizeLinear`` of
``UINT8`` exponents); TensorRT 10.x parses opsets up to 22-24 by release and 11.x up to 25
(docs.nvidia.com ONNX opset guide), so TensorRT 10.8 needs a release whose parser knows opset 23
for NVFP4 here; MXFP8 in the ``"onnx"`` form needs TensorRT 11's parser (opset 24), in the
``"trt"`` form 10.12+ (the first with MX kernels): the linter's ``min_opset`` rows say the same.

Example:
    >>> import numpy as np
    >>> from onnx import TensorProto, helper, numpy_helper
    >>> w = numpy_helper.from_array(np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32), "w")
    >>> amax = numpy_helper.from_array(np.array(1.0, np.float32), "amax")
    >>> marker = helper.make_node("BlockQDQ", ["w", "amax"], ["wq"], domain="qdq.internal",
    ...     name="fc.weight_quantizer/BlockQDQ", format="nvfp4", axis=1, block_size=16,
    ...     role="weight")
    >>> g = helper.make_graph([marker], "g", [], [helper.make_tensor_value_info(
    ...     "wq", TensorProto.FLOAT, [2, 32])], [w, amax])
    >>> m = expand_blocks(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18),
    ...     helper.make_opsetid("qdq.internal", 1)]))
    >>> [n.op_type for n in m.graph.node], m.opset_import[0].version
    (['DequantizeLinear', 'DequantizeLinear'], 23)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from qdq.export.blocks_trt import check_block_form, mx_activation, mx_weight
from qdq.quant.blocks import (
    BLOCK_FORMATS,
    INT4_MAX,
    INT4_MIN,
    BlockFormat,
    block_fake_quant,
    block_scales,
)
from qdq.quant.blocks_fp4 import e2m1_round, e4m3_round, e8m0_scale
from qdq.quant.onnx_qdq import BLOCK_DOMAIN, BLOCK_OP

__all__ = [
    "FP4_DYNAMIC",
    "MX_DYNAMIC",
    "OPSETS",
    "TRT_DOMAIN",
    "TRT_OPSETS",
    "FreshNames",
    "expand_blocks",
    "has_markers",
    "required_opset",
]

#: TensorRT's domain and its dynamic block quantize operators.
TRT_DOMAIN, FP4_DYNAMIC, MX_DYNAMIC = "trt", "TRT_FP4DynamicQuantize", "TRT_MXFP8DynamicQuantize"
#: The least (opset, IR version) whose tensors hold each format.
OPSETS = {"int4": (21, 10), "nvfp4": (23, 11), "mxfp8": (24, 12)}
#: ... in TensorRT's form (``block_form="trt"``, :mod:`qdq.export.blocks_trt`): MXFP8's E4M3
#: values and UINT8 exponents need only opset 19's FLOAT8E4M3FN (the other formats as above)
TRT_OPSETS = {**OPSETS, "mxfp8": (19, 9)}
_FLOAT, _E4M3 = 1, 17  # TensorProto.FLOAT, TensorProto.FLOAT8E4M3FN


@dataclass(frozen=True)
class _Marker:
    node: Any
    quantizer: str
    fmt: BlockFormat
    axis: int
    role: str


def has_markers(model: Any) -> bool:
    """Whether ``model`` (an ``onnx.ModelProto``) holds a ``qdq.internal::BlockQDQ`` marker."""
    return any(_is_marker(n) for n in model.graph.node)


def required_opset(formats: set[str], block_form: str = "onnx") -> tuple[int, int]:
    """The least (opset, IR version) for a graph holding the block ``formats`` in ``block_form``
    (``"onnx"``: MXFP8 scales ``FLOAT8E8M0``, opset 24; ``"trt"``: UINT8 exponents, opset 19).

    Example:
        >>> required_opset({"int4"}), required_opset({"int4", "nvfp4"}), required_opset({"mxfp8"})
        ((21, 10), (23, 11), (24, 12))
        >>> required_opset({"mxfp8"}, "trt"), required_opset({"mxfp8", "nvfp4"}, "trt")
        ((19, 9), (23, 11))
    """
    table = TRT_OPSETS if check_block_form(block_form) == "trt" else OPSETS
    need = [table[f] for f in formats]
    return (max(o for o, _ in need), max(i for _, i in need)) if need else (0, 0)


def expand_blocks(model: Any, block_form: str = "onnx") -> Any:
    """Rewrite every block-format marker of ``model`` into TensorRT's form, in place; return it.

    ``block_form``: MXFP8 as ONNX's ``DequantizeLinear`` of ``FLOAT8E8M0`` scales (``"onnx"``,
    opset 24, TensorRT 11) or as ``trt::TRT_MXFP8DequantizeLinear`` of ``UINT8`` exponents
    (``"trt"``, opset 19, TensorRT 10.12+: :mod:`qdq.export.blocks_trt`); the other formats are
    written alike in both. A model without markers is returned unchanged. Raises ``ValueError``
    naming the quantizer for a malformed marker, a non-constant NVFP4/MXFP8 weight, or a missing
    or misshapen amax, and naming ``block_form`` for an unknown one.
    """
    check_block_form(block_form)
    graph = model.graph
    markers = [_read(n) for n in graph.node if _is_marker(n)]
    if not markers:
        return model
    _raise_opset(model, {m.fmt.name for m in markers}, block_form)  # before the trt nodes exist
    graph = model.graph
    markers = [_read(n) for n in graph.node if _is_marker(n)]
    consts = _constants(graph)
    ranks, types = _tensor_info(model)
    taken = {o for n in graph.node for o in n.output} | {i.name for i in graph.initializer}
    names = FreshNames(taken)
    replaced: dict[int, list[Any]] = {}
    new_inits: list[Any] = []
    for m in markers:
        x = m.node.input[0]
        amax = _amax(m, consts)
        rank = ranks.get(x)
        if m.role == "weight" and x in consts:
            nodes, inits = _weight(m, consts[x], amax, names, block_form)
        elif m.role == "weight" and m.fmt.name != "int4":
            raise ValueError(
                f"quantizer {m.quantizer!r}: its {m.fmt.name.upper()} weight {x!r} is computed in "
                "the graph, not a constant; TensorRT builds FP4/MX GEMMs from constant weights "
                "only. Export a model whose weight is a parameter (or use INT4 / FP8 there)"
            )
        else:
            nodes, inits = _dynamic(m, amax, rank, types.get(x, _FLOAT), names, block_form)
        replaced[id(m.node)] = nodes
        new_inits.extend(inits)
    out = []
    for n in graph.node:
        out.extend(replaced.get(id(n), [n]))
    del graph.node[:]
    graph.node.extend(out)
    graph.initializer.extend(new_inits)
    _drop_unread(graph, {i for m in markers for i in m.node.input})
    _set_domains(model, {m.fmt.name for m in markers}, block_form)
    return model


def _is_marker(node: Any) -> bool:
    return bool(node.domain == BLOCK_DOMAIN and node.op_type == BLOCK_OP)


def _read(node: Any) -> _Marker:
    from onnx import helper

    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    name = node.name.rsplit("/", 1)[0] if "/" in node.name else node.name
    where = f"block quantizer marker {node.name!r}"
    fmt_name = attrs.get("format", b"")
    fmt_name = fmt_name.decode() if isinstance(fmt_name, bytes) else str(fmt_name)
    role = attrs.get("role", b"")
    role = role.decode() if isinstance(role, bytes) else str(role)
    axis, block = attrs.get("axis"), attrs.get("block_size")
    if fmt_name not in BLOCK_FORMATS:
        raise ValueError(f"{where}: format {fmt_name!r} is not one of {sorted(BLOCK_FORMATS)}")
    if role not in ("weight", "activation"):
        raise ValueError(f"{where}: role {role!r} is not 'weight' or 'activation'")
    if not isinstance(axis, int) or axis < 0 or not isinstance(block, int) or block < 0:
        raise ValueError(f"{where}: axis {axis!r} and block_size {block!r} must be ints >= 0")
    if not 1 <= len(node.input) <= 2 or len(node.output) != 1:
        raise ValueError(f"{where}: expected inputs (x[, amax]) and one output")
    fixed = BLOCK_FORMATS[fmt_name].block_size
    if fmt_name != "int4" and block != fixed:
        raise ValueError(
            f"quantizer {name!r}: {fmt_name.upper()} blocks are {fixed} elements in TensorRT's "
            f"kernels, got block_size={block}"
        )
    try:
        fmt = BLOCK_FORMATS[fmt_name].with_block_size(block or None)
    except ValueError as err:
        raise ValueError(f"quantizer {name!r}: {err}") from None
    return _Marker(node, name, fmt, axis, role)


def _constants(graph: Any) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    out = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    for n in graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            out[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    return out


def _tensor_info(model: Any) -> tuple[dict[str, int], dict[str, int]]:
    """Rank and element type of every tensor the graph (or ONNX shape inference) declares."""
    import onnx

    graph = model.graph
    infos = [*graph.value_info, *graph.input, *graph.output]
    with contextlib.suppress(Exception):  # shapes are a convenience; the declared ones remain
        infos += list(onnx.shape_inference.infer_shapes(model).graph.value_info)
    ranks: dict[str, int] = {}
    types: dict[str, int] = {}
    for v in infos:
        tt = v.type.tensor_type
        if tt.elem_type:
            types.setdefault(v.name, tt.elem_type)
        if tt.HasField("shape"):
            ranks.setdefault(v.name, len(tt.shape.dim))
    for i in graph.initializer:
        ranks[i.name], types[i.name] = len(i.dims), i.data_type
    return ranks, types


def _amax(m: _Marker, consts: dict[str, np.ndarray]) -> torch.Tensor | None:
    if len(m.node.input) < 2 or not m.node.input[1]:
        if m.fmt.name == "nvfp4" and m.role == "activation":
            raise ValueError(f"quantizer {m.quantizer!r}: an NVFP4 activation needs its amax")
        if m.fmt.name == "int4" and m.role == "activation":
            raise ValueError(f"quantizer {m.quantizer!r}: an INT4 activation needs its amax")
        return None
    name = m.node.input[1]
    if name not in consts:
        raise ValueError(f"quantizer {m.quantizer!r}: amax {name!r} is not a constant")
    if m.fmt.name == "mxfp8":
        raise ValueError(f"quantizer {m.quantizer!r}: MXFP8 has no amax (its scales are dynamic)")
    return torch.from_numpy(np.asarray(consts[name], dtype=np.float32).copy())


class FreshNames:
    """Fresh tensor and node names of a graph being rewritten: ``base``, else ``base_1``, ...

    Example:
        >>> names = FreshNames({"w"})
        >>> names("w"), names("w"), names("s")
        ('w_1', 'w_2', 's')
    """

    def __init__(self, taken: set[str]) -> None:
        self.taken = taken

    def __call__(self, base: str) -> str:
        name, k = base, 0
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name


def _neg(axis: int, rank: int | None) -> int:
    return axis - rank if rank is not None and axis < rank else axis


def _weight(
    m: _Marker, value: np.ndarray, amax: torch.Tensor | None, names: FreshNames, block_form: str
) -> tuple[list[Any], list[Any]]:
    """Pre-quantized initializers and their DequantizeLinear nodes for a constant weight."""
    import ml_dtypes
    from onnx import helper, numpy_helper

    fmt, ax, q = m.fmt, m.axis, m.quantizer
    x = torch.from_numpy(np.asarray(value, dtype=np.float32).copy())
    if not 0 <= ax < x.dim():
        raise ValueError(f"quantizer {q!r}: axis {ax} out of range for weight {tuple(x.shape)}")
    try:
        want = block_fake_quant(x, fmt, amax, ax)
        sb, gs = block_scales(x, fmt, amax, ax)
    except ValueError as err:
        raise ValueError(f"quantizer {q!r}: {err}") from None
    if fmt.name == "nvfp4":
        assert gs is not None
        scale = sb * gs
    elif fmt.name == "mxfp8":
        scale = e8m0_scale(sb)
    else:
        scale = sb
    if fmt.block_size is None:
        shape = [1] * x.dim()
        shape[ax] = -1
        s = scale.reshape(shape)
    else:
        s = scale.repeat_interleave(fmt.block_size, dim=ax)
    scaled = x / s
    if fmt.name == "nvfp4":
        codes = e2m1_round(scaled)
    elif fmt.name == "mxfp8":
        codes = e4m3_round(scaled)
    else:
        codes = scaled.round().clamp(INT4_MIN, INT4_MAX)
    got = codes * s + (0.0 if fmt.name == "int4" else -0.0)  # -0.0: keeps a -0 code's sign
    if not torch.equal(got.view(torch.int32), want.view(torch.int32)):
        bad = int((got.view(torch.int32) != want.view(torch.int32)).sum())
        raise RuntimeError(  # pragma: no cover - a bug in this module, never input
            f"quantizer {q!r}: {bad} dequantized {fmt.name} weight values differ from "
            "block_fake_quant"
        )
    base, out = m.node.name.rsplit("/", 1)[0] if "/" in m.node.name else q, m.node.output[0]
    axis = _neg(ax, x.dim())
    block: dict[str, Any] = {} if fmt.block_size is None else {"block_size": fmt.block_size}
    dq = f"{base}/DequantizeLinear"
    inits = []
    if fmt.name == "nvfp4":
        assert gs is not None
        w, sbn, gsn, sf = (names(f"{q}.{s}") for s in ("w_f4", "w_e4m3_scale", "w_scale", "ws"))
        inits += [
            numpy_helper.from_array(codes.numpy().astype(ml_dtypes.float4_e2m1fn), w),
            numpy_helper.from_array(sb.numpy().astype(ml_dtypes.float8_e4m3fn), sbn),
            numpy_helper.from_array(gs.numpy().astype(np.float32), gsn),
        ]
        nodes = [
            helper.make_node("DequantizeLinear", [sbn, gsn], [sf], name=f"{dq}_scale"),
            helper.make_node("DequantizeLinear", [w, sf], [out], name=dq, axis=axis, **block),
        ]
    elif fmt.name == "mxfp8" and block_form == "trt":  # TensorRT's: UINT8 exponents
        assert fmt.block_size is not None
        nodes, inits = mx_weight(codes, sb, q, dq, out, axis, fmt.block_size, names, scale)
    elif fmt.name == "mxfp8":
        w, sn = names(f"{q}.w_e4m3"), names(f"{q}.w_e8m0")
        inits += [
            numpy_helper.from_array(codes.numpy().astype(ml_dtypes.float8_e4m3fn), w),
            numpy_helper.from_array(scale.numpy().astype(ml_dtypes.float8_e8m0fnu), sn),
        ]
        nodes = [helper.make_node("DequantizeLinear", [w, sn], [out], name=dq, axis=axis,
                                  output_dtype=_FLOAT, **block)]  # fmt: skip
    else:
        w, sn = names(f"{q}.w_int4"), names(f"{q}.w_scale")
        inits += [
            numpy_helper.from_array(codes.to(torch.int8).numpy().astype(ml_dtypes.int4), w),
            numpy_helper.from_array(scale.numpy().astype(np.float32), sn),
        ]
        nodes = [helper.make_node("DequantizeLinear", [w, sn], [out], name=dq, axis=axis, **block)]
    if value.dtype != np.float32:  # a float16 graph: DequantizeLinear in float32, cast back
        _cast_back(nodes, out, value.dtype, f"{base}/Cast", names)
    return nodes, inits


def _cast_back(nodes: list[Any], out: str, dtype: Any, name: str, names: FreshNames) -> None:
    from onnx import helper
    from onnx.helper import np_dtype_to_tensor_dtype

    inner = names(f"{out}_f32")
    nodes[-1].output[0] = inner
    to = np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes.append(helper.make_node("Cast", [inner], [out], name=name, to=to))


def _dynamic(
    m: _Marker,
    amax: torch.Tensor | None,
    rank: int | None,
    elem: int,
    names: FreshNames,
    block_form: str,
) -> tuple[list[Any], list[Any]]:
    """TensorRT's dynamic block quantize (NVFP4, MXFP8), or Q/DQ (INT4), for a run-time tensor."""
    from onnx import helper, numpy_helper

    fmt, q, x, out = m.fmt, m.quantizer, m.node.input[0], m.node.output[0]
    base = m.node.name.rsplit("/", 1)[0] if "/" in m.node.name else q
    if rank is not None and not 0 <= m.axis < rank:
        raise ValueError(f"quantizer {q!r}: axis {m.axis} out of range for a rank-{rank} tensor")
    axis = _neg(m.axis, rank)
    nodes: list[Any] = []
    inits: list[Any] = []
    if elem != _FLOAT:  # computed in float32, as block_fake_quant does
        x32 = names(f"{x}_f32")
        nodes.append(helper.make_node("Cast", [x], [x32], name=f"{base}/Cast_in", to=_FLOAT))
        x = x32
    block: dict[str, Any] = {} if fmt.block_size is None else {"block_size": fmt.block_size}
    if fmt.name == "nvfp4":
        assert amax is not None
        if amax.numel() != 1:
            raise ValueError(f"quantizer {q!r}: an NVFP4 amax is one number, got {amax.numel()}")
        _, gs = block_scales(torch.zeros(1, fmt.block_size or 16), fmt, amax.reshape(()))
        assert gs is not None
        gsn, x4, s8, sf = (names(f"{q}.{s}") for s in ("gs", "x_f4", "x_e4m3_scale", "xs"))
        inits.append(numpy_helper.from_array(gs.numpy().astype(np.float32), gsn))
        nodes += [
            helper.make_node(FP4_DYNAMIC, [x, gsn], [x4, s8], name=f"{base}/{FP4_DYNAMIC}",
                             domain=TRT_DOMAIN, axis=axis, scale_type=_E4M3, **block),
            helper.make_node("DequantizeLinear", [s8, gsn], [sf], name=f"{base}/DequantizeLinear_scale"),
            helper.make_node("DequantizeLinear", [x4, sf], [out], name=f"{base}/DequantizeLinear",
                             axis=axis, **block),
        ]  # fmt: skip
    elif fmt.name == "mxfp8" and block_form == "trt":  # TensorRT's: UINT8 exponents
        assert fmt.block_size is not None
        nodes += mx_activation(x, q, base, out, axis, fmt.block_size, MX_DYNAMIC, names)
    elif fmt.name == "mxfp8":
        x8, se = names(f"{q}.x_e4m3"), names(f"{q}.x_e8m0")
        nodes += [
            helper.make_node(MX_DYNAMIC, [x], [x8, se], name=f"{base}/{MX_DYNAMIC}",
                             domain=TRT_DOMAIN, axis=axis, output_dtype=_E4M3, **block),
            helper.make_node("DequantizeLinear", [x8, se], [out], name=f"{base}/DequantizeLinear",
                             axis=axis, output_dtype=_FLOAT, **block),
        ]  # fmt: skip
    else:
        if amax is None:
            raise ValueError(
                f"quantizer {q!r}: an INT4 tensor computed in the graph needs its amax"
            )
        scale = _int4_scale(m, amax)
        sn, zp, xq = names(f"{q}.scale"), names(f"{q}.zero_point"), names(f"{q}.x_int4")
        import ml_dtypes

        inits += [
            numpy_helper.from_array(scale.numpy().astype(np.float32), sn),
            numpy_helper.from_array(np.zeros(scale.shape, dtype=ml_dtypes.int4), zp),
        ]
        nodes += [
            helper.make_node("QuantizeLinear", [x, sn, zp], [xq], name=f"{base}/QuantizeLinear",
                             axis=axis, **block),
            helper.make_node("DequantizeLinear", [xq, sn, zp], [out],
                             name=f"{base}/DequantizeLinear", axis=axis, **block),
        ]  # fmt: skip
    if elem != _FLOAT:
        _cast_back(nodes, out, _np_dtype(elem), f"{base}/Cast_out", names)
    return nodes, inits


def _int4_scale(m: _Marker, amax: torch.Tensor) -> torch.Tensor:
    """INT4 scales ``max(amax / 7, MIN_SCALE)`` from a per-block (``x``'s rank, the blocked axis
    divided) or per-channel amax, as :func:`~qdq.quant.blocks.block_scales` computes them."""
    bs = m.fmt.block_size
    if bs is None:
        fake, ax = torch.zeros(amax.numel()), 0
    elif 0 <= m.axis < amax.dim():
        shape = list(amax.shape)
        shape[m.axis] *= bs
        fake, ax = torch.zeros(shape), m.axis
    else:
        raise ValueError(
            f"quantizer {m.quantizer!r}: a per-block INT4 amax has the rank of its tensor, got "
            f"shape {tuple(amax.shape)} for axis {m.axis}"
        )
    try:
        return block_scales(fake, m.fmt, amax, ax)[0]
    except ValueError as err:
        raise ValueError(f"quantizer {m.quantizer!r}: {err}") from None


def _np_dtype(elem: int) -> Any:
    from onnx.helper import tensor_dtype_to_np_dtype

    return tensor_dtype_to_np_dtype(elem)


def _drop_unread(graph: Any, candidates: set[str]) -> None:
    """Remove the initializers and ``Constant`` nodes among ``candidates`` (the float weights and
    amax constants the markers read) that nothing reads any more."""
    read = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    for n in graph.node:
        for a in n.attribute:
            for sub in [a.g, *a.graphs]:
                read |= {i for sn in sub.node for i in sn.input}
    keep = [i for i in graph.initializer if i.name in read or i.name not in candidates]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    nodes = [
        n
        for n in graph.node
        if n.op_type != "Constant" or n.output[0] not in candidates or n.output[0] in read
    ]
    if len(nodes) != len(graph.node):
        del graph.node[:]
        graph.node.extend(nodes)


def _raise_opset(model: Any, formats: set[str], block_form: str) -> None:
    """Raise the default opset to what ``formats`` need (never lower it)."""
    from onnx import version_converter

    opset, _ = required_opset(formats, block_form)
    current = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if current < opset:
        try:
            converted = version_converter.convert_version(model, opset)
        except Exception as err:  # the converter raises several types
            raise ValueError(
                f"cannot raise the exported graph from opset {current} to {opset}, which "
                f"{'/'.join(sorted(formats)).upper()} tensors need: {err}"
            ) from err
        model.CopyFrom(converted)


def _set_domains(model: Any, formats: set[str], block_form: str) -> None:
    """Import ``trt``, drop the marker domain, set the IR version the tensor types need."""
    from onnx import helper

    _, ir = required_opset(formats, block_form)
    domains = {n.domain for n in model.graph.node}
    keep = [o for o in model.opset_import if o.domain != BLOCK_DOMAIN]
    del model.opset_import[:]
    model.opset_import.extend(keep)
    if TRT_DOMAIN in domains and all(o.domain != TRT_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(TRT_DOMAIN, 1))
    model.ir_version = max(model.ir_version, ir)
