"""A graph in TensorRT's block forms, rewritten into standard ops ONNX Runtime runs exactly.

ONNX Runtime 1.31 on the CPU has no kernel for a ``FLOAT4E2M1`` ``DequantizeLinear`` (opset 23:
NOT_IMPLEMENTED), none for ``FLOAT8E8M0`` scales, and none for TensorRT's dynamic block quantize
operators (``trt::TRT_FP4DynamicQuantize``, ``trt::TRT_MXFP8DynamicQuantize``).
:func:`runnable` returns a copy of such a graph (:mod:`qdq.export.blocks_onnx` writes them) in
which:

* every ``FLOAT4E2M1`` and ``FLOAT8E8M0`` initializer (and each ``FLOAT8E4M3FN`` one a rewritten
  ``DequantizeLinear`` reads) is decoded to float32 (an exact widening: every code is a float32);
* every ``DequantizeLinear`` of those, or of a dynamic quantize output, becomes ``x · scale`` with
  the scale repeated over its block (Reshape to ``[-1, block]``, one float32 ``Mul`` per element:
  the product ``DequantizeLinear`` defines);
* ``TRT_FP4DynamicQuantize(x, gs)`` becomes, per block of 16 along its axis,
  ``sb = e4m3(min(amax_b / (gs·6), 448))`` (``Cast`` to ``FLOAT8E4M3FN``: round to nearest even;
  0 → 1) and ``e2m1(x / (sb·gs))`` written as :func:`qdq.quant.blocks_fp4.e2m1_round` computes it
  (``Abs``, ``Min``, ``Round`` half to even of ``2a``, ``a``, ``a/2``, ``Where``, the sign copied
  from ``x``, a ``-0`` included);
* ``TRT_MXFP8DynamicQuantize(x)`` becomes, per block of 32, ``e = ceil(log2(amax_b / 448))``
  (estimated with ``Log`` and corrected exactly by comparing ``2**e`` and ``2**(e-1)`` with the
  ratio, so the estimate's rounding never shows; clamped to [-127, 127]) and
  ``e4m3(x / 2**e)``.

TensorRT Model Optimizer's own forms (ModelOpt 0.47, at opset 20) are read too:

* ``trt::TRT_MXFP8DequantizeLinear(x, s)`` (its MXFP8 weights and activations) becomes the same
  ``x · scale`` with ``scale = 2**(byte - 127)`` for its ``UINT8`` E8M0 exponent bytes (decoded
  with ``numpy.ldexp``: exact, ``2**-127`` a float32 subnormal, byte 255 NaN), or the
  ``2**e`` the rewritten ``TRT_MXFP8DynamicQuantize`` writes;
* ``trt::DequantizeLinear`` (its INT4 weights, blocked at opset 20 where ONNX's takes no
  ``block_size``) becomes ``x · scale`` the same way, the INT4 initializer decoded to float32.

Their output has the type the graph declares for it (ModelOpt declares float32 where its
``output_dtype`` attribute says FLOAT16), else ``output_dtype``, else float32; an ``E4M3·2**k``
value is exact in either float type within its range.

INT4 ``DequantizeLinear`` (native in ONNX Runtime) and every other node are left as they are.
The values equal :func:`qdq.quant.blocks.block_fake_quant` bit for bit on finite inputs (ties,
saturation, zero blocks, E4M3 block-scale rounding, E8M0 powers of two: tests/test_export_blocks.py);
a NaN in a block gives NaN there as in torch.

Example:
    >>> from qdq.export.blocks_onnx import expand_blocks  # doctest: +SKIP
    >>> sess = qdq.backends.ort_session.session(runnable(expand_blocks(model)))  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["for_session", "needs_reference", "runnable"]

_TRT = "trt"
_FP4_DYN, _MX_DYN = "TRT_FP4DynamicQuantize", "TRT_MXFP8DynamicQuantize"
#: TensorRT's DequantizeLinear operators (domain ``trt``) in ModelOpt's exports
_MX_DQ, _TRT_DQ = "TRT_MXFP8DequantizeLinear", "DequantizeLinear"
_TRT_OPS = (_FP4_DYN, _MX_DYN, _MX_DQ, _TRT_DQ)
_FLOAT, _UINT8, _FLOAT16, _BFLOAT16 = 1, 2, 10, 16  # TensorProto element types
_E4M3, _E2M1, _E8M0 = 17, 23, 24
_DECODED = (_E2M1, _E8M0)
_E8M0_BIAS = 127


def needs_reference(model: Any) -> bool:
    """Whether ``model`` holds TensorRT's block operators (domain ``trt``: dynamic block quantize,
    ``TRT_MXFP8DequantizeLinear``, ``DequantizeLinear``) or FP4/E8M0 initializers.

    Example:
        >>> from onnx import helper
        >>> needs_reference(helper.make_model(helper.make_graph([], "g", [], [])))
        False
    """
    graph = model.graph
    return any(n.domain == _TRT and n.op_type in _TRT_OPS for n in graph.node) or any(
        i.data_type in _DECODED for i in graph.initializer
    )


def for_session(model: Any) -> Any:
    """What an ONNX Runtime session should load for ``model`` (a path, bytes or
    ``onnx.ModelProto``): ``model`` itself, or :func:`runnable`'s ``ModelProto`` when it holds
    TensorRT's block forms (a path is read with its external data then)."""
    import onnx

    if isinstance(model, (str, Path)):
        if not Path(model).is_file():
            return model  # the session reports the missing file
        if not needs_reference(onnx.load(str(model), load_external_data=False)):
            return model
        return runnable(onnx.load(str(model)))
    proto = onnx.load_from_string(model) if isinstance(model, bytes) else model
    return runnable(proto) if needs_reference(proto) else model


def runnable(model: Any) -> Any:
    """A copy of ``model`` in standard ops with the same values (module docstring).

    Raises:
        ValueError: a dynamic quantize or blocked DequantizeLinear whose input rank is unknown
            and whose axis is not -1, a block scale whose shape does not fit its values (ModelOpt's
            INT4 ``Gemm`` weights, ``transB=1``, are written with the other axis), a
            ``trt::DequantizeLinear`` with a zero point, or a ``TRT_MXFP8DequantizeLinear``
            scale that is neither E8M0 exponents (``UINT8`` or ``FLOAT8E8M0``) in an
            initializer nor a ``TRT_MXFP8DynamicQuantize`` output.
    """
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    if not needs_reference(m):
        return m
    graph = m.graph
    ranks = _ranks(m)
    producers = {o: n for n in graph.node for o in n.output}
    inits = {i.name: i for i in graph.initializer}
    taken = {o for n in graph.node for o in n.output} | set(inits) | {i.name for i in graph.input}
    b = _Builder(taken)
    dynamic_out = {
        o
        for n in graph.node
        if n.domain == _TRT and n.op_type in (_FP4_DYN, _MX_DYN)
        for o in n.output
    }
    rewrite = [n for n in graph.node if _is_block_dq(n, inits, dynamic_out)]
    dims = {name: list(i.dims) for name, i in inits.items()}
    for n in rewrite:  # (before any initializer is decoded)
        _check_trt_dq(n, inits, dynamic_out)
        _check_blocks(n, dims)
    declared = {v.name: v.type.tensor_type.elem_type for v in [*graph.value_info, *graph.output]}
    exponents = {n.input[1] for n in rewrite if _mx_exponents(n, inits)}
    decode = {
        n.input[i] for n in rewrite for i in (0, 1) if len(n.input) > i and n.input[i] in inits
    } - exponents
    decode |= {name for name, i in inits.items() if i.data_type in _DECODED}
    for name in decode:
        inits[name].CopyFrom(_decoded(inits[name]))
    scales = {name: _exponent_scale(b, inits[name]) for name in sorted(exponents)}
    targets = {id(n) for n in rewrite}
    out: list[Any] = []
    for n in graph.node:
        b.nodes = []
        if n.domain == _TRT and n.op_type == _FP4_DYN:
            _fp4_dynamic(b, n, _rank_of(n, ranks))
        elif n.domain == _TRT and n.op_type == _MX_DYN:
            _mx_dynamic(b, n, _rank_of(n, ranks))
        elif id(n) in targets:
            rank = ranks.get(n.input[0]) or _rank_from(producers.get(n.input[0]), ranks)
            scale = scales.get(n.input[1], n.input[1])
            _dequantize(b, n, rank, scale, _out_type(n, declared))
        else:
            b.nodes = [n]
        out.extend(b.nodes)
    del graph.node[:]
    graph.node.extend(out)
    read = {x for n in out for x in n.input}
    keep_inits = [i for i in graph.initializer if i.name not in exponents or i.name in read]
    del graph.initializer[:]  # (the exponent bytes, now decoded, unless another node reads them)
    graph.initializer.extend([*keep_inits, *b.inits])
    keep = [o for o in m.opset_import if o.domain != _TRT]
    del m.opset_import[:]
    m.opset_import.extend(keep)
    _retype(graph, dynamic_out | {n.output[0] for n in rewrite} | decode)
    return m


def _is_block_dq(n: Any, inits: dict[str, Any], dynamic_out: set[str]) -> bool:
    if n.domain == _TRT and n.op_type in (_MX_DQ, _TRT_DQ):
        return True  # TensorRT's own: ONNX Runtime has no kernel for the domain
    if n.op_type != "DequantizeLinear" or n.domain not in ("", "ai.onnx"):
        return False
    x = inits.get(n.input[0])
    s = inits.get(n.input[1]) if len(n.input) > 1 else None
    return (
        n.input[0] in dynamic_out
        or (x is not None and x.data_type in (_E2M1, _E4M3))
        or (s is not None and s.data_type == _E8M0)
    )


def _mx_exponents(n: Any, inits: dict[str, Any]) -> bool:
    """Whether ``n`` is a ``TRT_MXFP8DequantizeLinear`` whose scale is ``UINT8`` exponent bytes."""
    s = inits.get(n.input[1]) if len(n.input) > 1 else None
    return n.domain == _TRT and n.op_type == _MX_DQ and s is not None and s.data_type == _UINT8


def _exponent_scale(b: _Builder, t: Any) -> str:
    """A float32 initializer ``2**(byte - 127)`` (NaN for 255) for E8M0 exponent bytes ``t``."""
    from onnx import numpy_helper

    byte = numpy_helper.to_array(t).astype(np.int32)
    value = np.ldexp(np.float32(1.0), np.minimum(byte, 254) - _E8M0_BIAS)  # exact, float32
    name = b.name(f"{t.name}_e8m0")
    b.inits.append(numpy_helper.from_array(np.where(byte == 255, np.float32(np.nan), value), name))
    return name


def _check_trt_dq(n: Any, inits: dict[str, Any], dynamic_out: set[str]) -> None:
    """Refuse a TensorRT DequantizeLinear this reference cannot decode exactly."""
    if n.domain != _TRT:
        return
    if n.op_type == _TRT_DQ and len(n.input) > 2 and n.input[2]:
        raise ValueError(f"{n.name}: trt::DequantizeLinear with a zero point ({n.input[2]!r})")
    s = inits.get(n.input[1])
    exponents = s is not None and s.data_type in (_UINT8, _E8M0)
    if n.op_type == _MX_DQ and not exponents and n.input[1] not in dynamic_out:
        raise ValueError(
            f"{n.name}: TRT_MXFP8DequantizeLinear scale {n.input[1]!r} is neither E8M0 "
            "exponents (UINT8 or FLOAT8E8M0) in an initializer nor a TRT_MXFP8DynamicQuantize "
            "output"
        )


def _check_blocks(n: Any, dims: dict[str, list[int]]) -> None:
    """A blocked DequantizeLinear's scale shape fits its values (both initializers), whole blocks."""
    a = _attrs(n)
    block = int(a.get("block_size", 0))
    x, s = dims.get(n.input[0]), dims.get(n.input[1]) if len(n.input) > 1 else None
    if not block or x is None or s is None:
        return
    ax = int(a.get("axis", -1 if n.op_type == _MX_DQ else 1)) % max(len(x), 1)
    want = [d // block if i == ax else d for i, d in enumerate(x)]
    if len(s) != len(x) or x[ax] % block or s != want:
        raise ValueError(
            f"{n.name}: block scale {s} does not fit values {x} blocked by {block} along axis "
            f"{ax} (want {want}, whole blocks)"
        )


def _out_type(n: Any, declared: dict[str, int]) -> int:
    """The float type a TensorRT DequantizeLinear's output has: declared, else ``output_dtype``,
    else float32 (float32 for ONNX's, as before)."""
    if n.domain != _TRT:
        return _FLOAT
    floats = (_FLOAT, _FLOAT16, _BFLOAT16)
    if declared.get(n.output[0]) in floats:
        return declared[n.output[0]]
    attr = int(_attrs(n).get("output_dtype", _FLOAT))
    return attr if attr in floats else _FLOAT


def _decoded(t: Any) -> Any:
    """``t`` as float32 values (FP4, E8M0 and E4M3 codes all widen exactly)."""
    from onnx import numpy_helper

    return numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name)


def _ranks(model: Any) -> dict[str, int]:
    import onnx

    graph = model.graph
    infos = [*graph.value_info, *graph.input, *graph.output]
    with contextlib.suppress(Exception):  # ranks are needed only for a non-last blocked axis
        infos += list(onnx.shape_inference.infer_shapes(model).graph.value_info)
    ranks = {
        v.name: len(v.type.tensor_type.shape.dim)
        for v in infos
        if v.type.tensor_type.HasField("shape")
    }
    ranks.update({i.name: len(i.dims) for i in graph.initializer})
    return ranks


def _rank_of(n: Any, ranks: dict[str, int]) -> int | None:
    return ranks.get(n.input[0])


def _rank_from(producer: Any, ranks: dict[str, int]) -> int | None:
    """The rank of a dynamic quantize output: its input's."""
    return ranks.get(producer.input[0]) if producer is not None and producer.input else None


def _attrs(n: Any) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in n.attribute}


class _Builder:
    """Nodes and constants of the rewrite, with fresh names."""

    def __init__(self, taken: set[str]) -> None:
        from qdq.export.blocks_onnx import FreshNames

        self.taken = taken
        self.name = FreshNames(taken)  # a fresh name from a base: base, base_1, ...
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self._consts: dict[tuple[str, bytes], str] = {}

    def const(self, value: Any, dtype: Any = np.float32) -> str:
        from onnx import numpy_helper

        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str + str(arr.shape), arr.tobytes())
        if key not in self._consts:
            name = self.name("qdq_blocks_const")
            self.inits.append(numpy_helper.from_array(arr, name))
            self._consts[key] = name
        return self._consts[key]

    def op(self, op: str, *inputs: str, out: str | None = None, **attrs: Any) -> str:
        from onnx import helper

        name = out if out is not None else self.name(f"qdq_blocks_{op}")
        self.nodes.append(
            helper.make_node(op, list(inputs), [name], name=self.name(f"{name}/{op}"), **attrs)
        )
        return name


def _layout(b: _Builder, x: str, axis: int, rank: int | None, where: str) -> tuple[str, Any]:
    """``x`` with the blocked axis last (a Transpose unless it already is); the inverse perm."""
    if axis == -1 or (rank is not None and axis == rank - 1):
        return x, None
    if rank is None:
        raise ValueError(f"{where}: blocked axis {axis} of a tensor of unknown rank")
    ax = axis % rank
    perm = [d for d in range(rank) if d != ax] + [ax]
    inverse = [perm.index(d) for d in range(rank)]
    return b.op("Transpose", x, perm=perm), inverse


def _restore(b: _Builder, y: str, inverse: Any, out: str | None) -> str:
    if inverse is None:
        return b.op("Identity", y, out=out) if out is not None else y
    return b.op("Transpose", y, perm=inverse, out=out)


def _blocked_shape(b: _Builder, xt: str) -> str:
    """The shape of ``xt`` with its last dimension divided by the block size (``-1``)."""
    shape = b.op("Shape", xt)
    head = b.op("Slice", shape, b.const([0], np.int64), b.const([-1], np.int64))
    return b.op("Concat", head, b.const([-1], np.int64), axis=0)


def _dequantize(b: _Builder, n: Any, rank: int | None, scale: str, to: int) -> None:
    """``x · scale`` for a DequantizeLinear, the scale repeated over its block or broadcast (a
    scalar, or one per channel along ``axis``), cast to ``to`` when that is not float32."""
    a = _attrs(n)
    x, out = n.input[0], n.output[0]
    final = out if to == _FLOAT else None
    block = int(a.get("block_size", 0))
    axis = int(a.get("axis", -1 if n.op_type == _MX_DQ else 1))
    x = b.op("Cast", x, to=_FLOAT)
    s = b.op("Cast", scale, to=_FLOAT)
    if not block:
        if rank is not None and rank > 1:  # s [C] along axis, or a scalar (NVFP4's DQ(sb, gs))
            ax = axis % rank
            s = b.op("Reshape", s, b.const([1] * ax + [-1] + [1] * (rank - ax - 1), np.int64))
        y = b.op("Mul", x, s, out=final)
    else:
        xt, inverse = _layout(b, x, axis, rank, n.name)
        st, _ = _layout(b, s, axis, rank, n.name)
        xb = b.op("Reshape", xt, b.const([-1, block], np.int64))
        sb = b.op("Reshape", st, b.const([-1, 1], np.int64))
        y = b.op("Reshape", b.op("Mul", xb, sb), b.op("Shape", xt))
        y = _restore(b, y, inverse, final)
    if to != _FLOAT:
        b.op("Cast", y, to=to, out=out)


def _blocks(b: _Builder, n: Any, rank: int | None, size: int) -> tuple[str, Any, str, str]:
    """``(xt, inverse, xb, amax)``: ``x`` with the blocked axis last, as rows of one block, and
    each row's abs max ``[-1, 1]``."""
    a = _attrs(n)
    if int(a.get("block_size", size)) != size:
        raise ValueError(f"{n.name}: {n.op_type} takes blocks of {size}, got {a['block_size']}")
    xt, inverse = _layout(b, b.op("Cast", n.input[0], to=_FLOAT), int(a.get("axis", -1)), rank,
                          n.name)  # fmt: skip
    xb = b.op("Reshape", xt, b.const([-1, size], np.int64))
    amax = b.op("ReduceMax", b.op("Abs", xb), b.const([1], np.int64), keepdims=1)
    # ONNX Runtime's ReduceMax skips NaN; torch's amax (and so the block) is NaN
    nan = b.op("ReduceMax", b.op("Cast", b.op("IsNaN", xb), to=_FLOAT), b.const([1], np.int64),
               keepdims=1)  # fmt: skip
    amax = b.op("Where", b.op("Greater", nan, b.const(0.0)), b.const(float("nan")), amax)
    return xt, inverse, xb, amax


def _e4m3(b: _Builder, v: str) -> str:
    """``v`` on the E4M3FN grid, saturating at ±448 (the Cast rounds to nearest even)."""
    clipped = b.op("Clip", v, b.const(-448.0), b.const(448.0))
    return b.op("Cast", b.op("Cast", clipped, to=_E4M3), to=_FLOAT)


def _e2m1(b: _Builder, v: str) -> str:
    """:func:`qdq.quant.blocks_fp4.e2m1_round` in ONNX ops (ties to even, ±6, sign kept)."""
    a = b.op("Min", b.op("Abs", v), b.const(6.0))
    fine = b.op("Mul", b.op("Round", b.op("Mul", a, b.const(2.0))), b.const(0.5))
    mid = b.op("Round", a)
    coarse = b.op("Mul", b.op("Round", b.op("Mul", a, b.const(0.5))), b.const(2.0))
    upper = b.op("Where", b.op("Less", a, b.const(4.0)), mid, coarse)
    q = b.op("Where", b.op("Less", a, b.const(2.0)), fine, upper)
    # the sign of v, -0 included (1 / -0 is -inf): torch.copysign
    negative = b.op(
        "Or",
        b.op("Less", v, b.const(0.0)),
        b.op("Less", b.op("Div", b.const(1.0), v), b.const(0.0)),
    )
    # a factor ±1, not Where(negative, -q, q): ONNX Runtime's Where returns +0 for a selected -0
    return b.op("Mul", q, b.op("Where", negative, b.const(-1.0), b.const(1.0)))


def _fp4_dynamic(b: _Builder, n: Any, rank: int | None) -> None:
    """``TRT_FP4DynamicQuantize(x, gs)`` → (E2M1 values, E4M3 block scales) as float32."""
    xt, inverse, xb, amax = _blocks(b, n, rank, 16)
    gs = b.op("Cast", n.input[1], to=_FLOAT)
    ratio = b.op(
        "Div", amax, b.op("Mul", gs, b.const(6.0))
    )  # block_amax / (gs·6): ModelOpt's order
    sb = _e4m3(b, ratio)
    sb = b.op("Where", b.op("Equal", sb, b.const(0.0)), b.const(1.0), sb)
    scale = b.op("Mul", sb, gs)
    q = _e2m1(b, b.op("Div", xb, scale))
    _restore(b, b.op("Reshape", q, b.op("Shape", xt)), inverse, n.output[0])
    _restore(b, b.op("Reshape", sb, _blocked_shape(b, xt)), inverse, n.output[1])


def _mx_dynamic(b: _Builder, n: Any, rank: int | None) -> None:
    """``TRT_MXFP8DynamicQuantize(x)`` → (E4M3 values, E8M0 scales ``2**e``) as float32."""
    xt, inverse, xb, amax = _blocks(b, n, rank, 32)
    v = b.op("Div", amax, b.const(448.0))
    two = b.const(2.0)
    est = b.op("Ceil", b.op("Div", b.op("Log", v), b.const(math.log(2.0))))
    # exact: the least e with 2**e >= v (Pow of 2 to an integer is exact in float32)
    e = b.op("Where", b.op("Less", b.op("Pow", two, est), v), b.op("Add", est, b.const(1.0)), est)
    below = b.op("Sub", e, b.const(1.0))
    e = b.op("Where", b.op("GreaterOrEqual", b.op("Pow", two, below), v), below, e)
    e = b.op("Clip", e, b.const(-127.0), b.const(127.0))
    scale = b.op("Pow", two, e)
    q = _e4m3(b, b.op("Div", xb, scale))
    _restore(b, b.op("Reshape", q, b.op("Shape", xt)), inverse, n.output[0])
    _restore(b, b.op("Reshape", scale, _blocked_shape(b, xt)), inverse, n.output[1])


def _retype(graph: Any, names: set[str]) -> None:
    """Declared types of the rewritten tensors become float32 (shapes kept)."""
    for v in [*graph.value_info, *graph.input, *graph.output]:
        if v.name in names and v.type.tensor_type.elem_type in (_E2M1, _E4M3, _E8M0):
            v.type.tensor_type.elem_type = _FLOAT
