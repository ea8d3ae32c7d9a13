"""The linter acceptance graphs T01–T23 of the rule specification (§8), built with ``onnx.helper``.

``CASES`` maps a case id to (builder, target, the exact set of WARN/ERROR rule ids expected, INFO
rule ids that must also fire). A builder returns an ``onnx.ModelProto``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class G:
    """A tiny ONNX graph builder (opset 13, NCHW, 64 channels unless told otherwise)."""

    def __init__(self, c: int = 64) -> None:
        self.nodes: list = []
        self.inits: dict[str, np.ndarray] = {}
        self.n = 0
        self.c = c
        self.rng = np.random.default_rng(0)

    def _id(self, p: str) -> str:
        self.n += 1
        return f"{p}{self.n}"

    def const(self, value: Any, p: str = "c") -> str:
        name = self._id(p)
        self.inits[name] = np.asarray(value)
        return name

    def op(self, op: str, inputs: list[str], **attrs: Any) -> str:
        out = self._id(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=out + "_node", **attrs))
        return out

    def q(self, x: str, scale: float, zp: Any = None) -> tuple[str, str, str]:
        s = self.const(np.float32(scale), "s")
        z = self.const(np.int8(0) if zp is None else zp, "z")
        return self.op("QuantizeLinear", [x, s, z]), s, z

    def qdq(self, x: str, scale: float = 0.02) -> str:
        return self.dq_of(self.q(x, scale))

    def dq_of(self, q_out: tuple[str, str, str]) -> str:
        qo, s, z = q_out
        return self.op("DequantizeLinear", [qo, s, z])

    def conv(self, x: str, cin: int | None = None, cout: int | None = None, k: int = 3,
             qw: bool = True, stride: int = 1, op: str = "Conv", n_scales: int | None = None,
             scale: float = 0.01) -> str:  # fmt: skip
        cin, cout = cin or self.c, cout or self.c
        shape = (cout, cin, k, k) if op == "Conv" else (cin, cout, k, k)
        w = self.const(self.rng.normal(size=shape).astype(np.float32), "w")
        if qw:
            n = n_scales or (shape[0] if op == "Conv" else shape[1])
            axis = 0 if op == "Conv" else 1
            s = self.const(np.full(n, scale, np.float32), "ws")
            z = self.const(np.zeros(n, np.int8), "wz")
            wq = self.op("QuantizeLinear", [w, s, z], axis=axis)
            w = self.op("DequantizeLinear", [wq, s, z], axis=axis)
        pad = (k - 1) // 2 if op == "Conv" else 0
        return self.op(op, [x, w], pads=[pad] * 4, strides=[stride, stride])

    def bn(self, x: str, c: int | None = None) -> str:
        c = c or self.c
        ones, zeros = np.ones(c, np.float32), np.zeros(c, np.float32)
        return self.op(
            "BatchNormalization",
            [x, self.const(ones), self.const(zeros), self.const(zeros), self.const(ones)],
        )

    def model(self, outputs: list[str], shape: tuple[int, ...] = (1, 64, 8, 8),
              opset: int = 13) -> onnx.ModelProto:  # fmt: skip
        graph = helper.make_graph(
            self.nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
            initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in self.inits.items()],
        )  # fmt: skip
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def block_input(g: G) -> str:
    """A previous block's Relu output (INT8-capable producer)."""
    return g.op("Relu", [g.bn(g.conv(g.qdq("x")))])


# ------------------------------------------------------------------ residual blocks
def t01() -> onnx.ModelProto:
    g = G()
    x = block_input(g)
    y = g.op("Relu", [g.bn(g.conv(g.qdq(g.op("Relu", [g.bn(g.conv(g.qdq(x)))]))))])
    y = g.op("Relu", [g.op("Add", [g.bn(g.conv(g.qdq(y))), x])])
    return g.model([g.conv(g.qdq(y))])


def _read_by(g: G, y: str, tail: str) -> onnx.ModelProto:
    """The model whose block output ``y`` is read by ``tail``: ``conv`` (through Q/DQ), ``pool``
    (a float GlobalAveragePool → Flatten → Q/DQ → Gemm: ResNet's last block before an
    unquantized pool), ``qpool`` (the same pool behind Q/DQ), ``pool-softmax`` (a pool read by a
    float op) or ``output`` (the graph output)."""
    if tail == "conv":
        return g.model([g.conv(g.qdq(y))])
    if tail == "output":
        return g.model([y])
    if tail == "pool-softmax":  # a pool whose reader runs float (ConvNeXt: LayerNorm after it)
        return g.model([g.op("Softmax", [g.op("Flatten", [g.op("GlobalAveragePool", [y])])])])
    flat = g.op("Flatten", [g.op("GlobalAveragePool", [g.qdq(y) if tail == "qpool" else y])])
    w = g.const(np.ones((10, 64), np.float32))
    s, z = g.const(np.full(10, 0.01, np.float32)), g.const(np.zeros(10, np.int8))
    wd = g.op("DequantizeLinear", [g.op("QuantizeLinear", [w, s, z], axis=0), s, z], axis=0)
    return g.model([g.op("Gemm", [g.qdq(flat), wd], transB=1)])


def block(skip_mode: str, tail: str = "conv") -> onnx.ModelProto:
    """T02 (shared), T03 (both), T03b (branch), T04 (other_scale); ``tail``: see :func:`_read_by`."""
    g = G()
    x = block_input(g)
    qa = g.q(x, 0.02)
    h = g.op("Relu", [g.bn(g.conv(g.dq_of(qa)))])
    branch = g.bn(g.conv(g.qdq(h)))
    if skip_mode == "shared":
        skip = g.dq_of(qa)
    elif skip_mode == "other_scale":
        skip = g.qdq(x, 0.05)
    elif skip_mode == "both":
        skip, branch = g.dq_of(qa), g.qdq(branch, 0.03)
    else:  # the conv branch only
        skip, branch = x, g.qdq(branch, 0.03)
    y = g.op("Relu", [g.op("Add", [branch, skip])])
    return _read_by(g, y, tail)


def t23(mode: str, tail: str = "conv") -> onnx.ModelProto:
    g = G()
    x = block_input(g)
    qa = g.q(x, 0.02)
    main = g.bn(g.conv(g.qdq(g.op("Relu", [g.bn(g.conv(g.dq_of(qa), stride=2))]))))
    down = g.bn(g.conv(g.dq_of(qa), k=1, stride=2))
    if mode in ("down", "both"):
        down = g.qdq(down, 0.03)
    if mode in ("main", "both"):
        main = g.qdq(main, 0.04)
    return _read_by(g, g.op("Relu", [g.op("Add", [main, down])]), tail)


# ------------------------------------------------------------------ concat / maxpool
def t05(s1: float, s2: float | None, s3: float) -> onnx.ModelProto:
    """``s2=None``: the second Concat input is float (T05c)."""
    g = G()
    p1 = g.op("Relu", [g.bn(g.conv(g.qdq("x")))])
    p2 = g.op("Relu", [g.bn(g.conv(g.qdq("x")))])
    cat = g.op("Concat", [g.qdq(p1, s1), p2 if s2 is None else g.qdq(p2, s2)], axis=1)
    return g.model([g.conv(g.qdq(cat, s3), cin=128)])


def t06(s_out: float) -> onnx.ModelProto:
    g = G()
    x = block_input(g)
    a = g.conv(g.qdq(x, 0.02))
    b = g.conv(g.qdq(g.op("MaxPool", [x], kernel_shape=[5, 5], pads=[2] * 4), s_out))
    return g.model([a, b])


def t07(b: float | None) -> onnx.ModelProto:
    g = G()
    h = g.op("Relu", [g.conv(g.qdq("x"), cin=3, k=7, stride=2)])
    if b is not None:
        h = g.qdq(h, b)
    pooled = g.op("MaxPool", [h], kernel_shape=[3, 3], strides=[2, 2])
    return g.model([g.conv(g.qdq(pooled, 0.02))], shape=(1, 3, 32, 32))


# ------------------------------------------------------------------ epilogues
def t08(variant: str) -> onnx.ModelProto:
    g = G()
    t = g.bn(g.conv(g.qdq("x")))
    if variant == "a":  # the Mul reads t through Q/DQ, the Sigmoid in float
        y = g.op("Mul", [g.qdq(t, 0.03), g.op("Sigmoid", [t])])
    elif variant == "b":  # no Q/DQ inside the SiLU
        y = g.op("Mul", [t, g.op("Sigmoid", [t])])
    else:  # c: one shared Q/DQ in front of both
        qb = g.q(t, 0.03)
        y = g.op("Mul", [g.dq_of(qb), g.op("Sigmoid", [g.dq_of(qb)])])
    return g.model([g.conv(g.qdq(y))])


def t09(group: int) -> onnx.ModelProto:
    g = G()
    y = g.op("Relu", [g.conv(g.qdq("x"), cin=64, cout=32, k=2, op="ConvTranspose")])
    model = g.model([g.conv(g.qdq(y), cin=32)])
    if group > 1:
        node = next(n for n in model.graph.node if n.op_type == "ConvTranspose")
        node.attribute.append(helper.make_attribute("group", group))
    return model


def t14() -> onnx.ModelProto:
    g = G()
    return g.model([g.conv("x")])


def t15() -> onnx.ModelProto:
    g = G()
    return g.model([g.conv(g.qdq(g.op("Relu", [g.bn(g.qdq(g.conv(g.qdq("x"))))])))])


def t16(qdq_first: bool) -> onnx.ModelProto:
    g = G()
    pads = g.const(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))
    if qdq_first:
        return g.model([g.conv(g.op("Pad", [g.qdq("x"), pads]))])
    return g.model([g.conv(g.qdq(g.op("Pad", ["x", pads])))])


def t17(quantize_gap: bool, pool: str = "GlobalAveragePool") -> onnx.ModelProto:
    """``pool``: ``GlobalAveragePool``; ``ReduceMean`` over axes (-1, -2) with keepdims (the dynamo
    exporter's adaptive average pool, axes as an attribute); ``ReduceMean18`` (opset 18, axes as
    an input); ``ReduceMean-nokeep`` (keepdims=0: already flat); ``ReduceMean-C`` (a mean over the
    channels, not a pool)."""
    g = G()
    h = block_input(g)
    pin = g.qdq(h) if quantize_gap else h
    if pool == "GlobalAveragePool":
        gap = g.op(pool, [pin])
    elif pool == "ReduceMean18":
        gap = g.op("ReduceMean", [pin, g.const(np.array([-1, -2], np.int64))], keepdims=1)
    else:
        axes = [1] if pool == "ReduceMean-C" else [-1, -2]
        gap = g.op("ReduceMean", [pin], axes=axes, keepdims=int(pool != "ReduceMean-nokeep"))
    flat = g.op("Flatten", [gap])
    cin = 1 if pool == "ReduceMean-C" else 64
    w = g.const(np.ones((64, cin), np.float32))
    s, z = g.const(np.full(64, 0.01, np.float32)), g.const(np.zeros(64, np.int8))
    wd = g.op("DequantizeLinear", [g.op("QuantizeLinear", [w, s, z], axis=0), s, z], axis=0)
    out = g.op("Gemm", [g.qdq(flat), wd], transB=1)
    return g.model([out], opset=18 if pool == "ReduceMean18" else 13)


def p05() -> onnx.ModelProto:
    """ModelOpt's ResNet tail: Q/DQ on the pool input, but the classifier left float."""
    g = G()
    flat = g.op("Flatten", [g.op("GlobalAveragePool", [g.qdq(block_input(g))])])
    return g.model([g.op("Gemm", [flat, g.const(np.ones((10, 64), np.float32))], transB=1)])


def t18() -> onnx.ModelProto:
    g = G()
    sm = g.op("Softmax", [g.qdq("x")])
    return g.model([g.op("MatMul", [sm, sm])])


def t19(c: int) -> onnx.ModelProto:
    g = G(c)
    h = g.op("Relu", [g.conv(g.qdq(g.op("Relu", [g.conv(g.qdq("x"), cin=64)])))])
    return g.model([g.conv(g.qdq(h), cout=128)])


def t20() -> onnx.ModelProto:
    """A fully Q/DQ'd backbone with a float detection head (Conv -> Sigmoid -> Mul -> Concat)."""
    g = G()
    feat = g.op("Relu", [g.bn(g.conv(g.qdq("x")))])
    head = g.conv(feat, qw=False, cout=16)
    box = g.op("Mul", [g.op("Sigmoid", [head]), g.const(np.float32(2.0))])
    return g.model([g.op("Concat", [box, head], axis=1)])


# ------------------------------------------------------------------ validity
def t10() -> onnx.ModelProto:
    g = G()
    return g.model([g.conv(g.dq_of(g.q("x", 0.02, np.uint8(128))))])


def t11() -> onnx.ModelProto:
    g = G()
    y = g.conv(g.qdq("x"))
    node = g.nodes[-1]
    bias = g.op("DequantizeLinear", [g.const(np.zeros(64, np.int32)),
                                     g.const(np.full(64, 2e-4, np.float32))])  # fmt: skip
    node.input.append(bias)
    return g.model([y])


def t12() -> onnx.ModelProto:
    g = G()
    s, z = g.const(np.full(64, 0.1, np.float32)), g.const(np.zeros(64, np.int8))
    q = g.op("QuantizeLinear", ["x", s, z], axis=1)
    return g.model([g.conv(g.op("DequantizeLinear", [q, s, z], axis=1))])


def t13(case: str) -> onnx.ModelProto:
    g = G()
    if case == "a":  # 63 scales for 64 output channels
        return g.model([g.conv(g.qdq("x"), n_scales=63)])
    if case == "b":  # a dead channel quantized with scale 0
        y = g.conv(g.qdq("x"))
        scale = next(k for k in reversed(g.inits) if k.startswith("ws"))
        g.inits[scale][7] = 0.0
        return g.model([y])
    w = g.const(np.ones((256, 256), np.float32))  # c: Gemm transB=1 quantized on axis 1
    s, z = g.const(np.full(256, 0.01, np.float32)), g.const(np.zeros(256, np.int8))
    wd = g.op("DequantizeLinear", [g.op("QuantizeLinear", [w, s, z], axis=1), s, z], axis=1)
    return g.model([g.op("Gemm", [g.qdq("x"), wd], transB=1)], shape=(1, 256))


def t21() -> onnx.ModelProto:
    g = G()
    s, z = g.const(np.float32(0.02)), g.const(np.int8(0))
    w = g.const(np.ones((64, 64, 3, 3), np.int8))
    ws, wz = g.const(np.full(64, 0.01, np.float32)), g.const(np.zeros(64, np.int8))
    xq = g.op("QuantizeLinear", ["x", s, z])
    y = g.op("QLinearConv", [xq, s, z, w, ws, wz, s, z], pads=[1] * 4)
    return g.model([g.op("DequantizeLinear", [y, s, z])])


def t22() -> onnx.ModelProto:
    g = G()
    return g.model([g.conv(g.qdq("x"))], opset=11)


Case = tuple[Callable[[], onnx.ModelProto], str, set[str], set[str]]
CASES: dict[str, Case] = {
    # id: (builder, target, exact WARN/ERROR rules, INFO rules that must fire)
    "T01": (t01, "trt10", {"P03a", "P04"}, set()),
    "T02": (lambda: block("shared"), "trt10", set(), set()),
    "T03": (lambda: block("both"), "trt10", {"P03b", "P02"}, set()),
    "T03b": (lambda: block("branch"), "trt10", {"P03c", "P02", "P04"}, set()),
    "T04": (lambda: block("other_scale"), "trt10", {"S04"}, set()),
    "T05": (lambda: t05(0.02, 0.05, 0.04), "trt10", {"S02"}, set()),
    "T05b": (lambda: t05(0.04, 0.04, 0.04), "trt10", set(), set()),
    "T05c": (lambda: t05(0.04, None, 0.04), "trt10", {"S02b"}, set()),
    "T06": (lambda: t06(0.05), "trt10", {"S03"}, set()),
    "T06-same-scale": (lambda: t06(0.02), "trt10", set(), set()),
    "T07": (lambda: t07(0.05), "trt10", {"S03"}, {"P13", "H02"}),
    "T07-same-scale": (lambda: t07(0.02), "trt10", set(), {"P10", "P13", "H02"}),
    "T07-no-qdq": (lambda: t07(None), "trt10", set(), {"P13", "H02"}),
    "T08": (lambda: t08("a"), "trt10", {"P07", "P04"}, set()),
    "T08b": (lambda: t08("b"), "trt10", set(), set()),
    "T08c": (lambda: t08("c"), "trt10", set(), {"P07"}),
    "T09-trt8.6": (lambda: t09(1), "trt8.6", {"V12", "P09"}, set()),
    "T09-trt10.5": (lambda: t09(1), "trt10.5", {"P09"}, {"V12"}),
    "T09b": (lambda: t09(2), "trt10.5", {"V12", "P09"}, set()),
    "T10": (t10, "trt10", {"V01", "V02"}, set()),
    "T11": (t11, "trt10", {"V06"}, set()),
    "T12": (t12, "trt10", {"V05"}, set()),
    "T13a": (lambda: t13("a"), "trt10", {"V04"}, set()),
    "T13b": (lambda: t13("b"), "trt10", {"V03"}, set()),
    "T13c": (lambda: t13("c"), "trt10", {"V04b"}, set()),
    "T14": (t14, "trt10", {"P01"}, set()),
    "T15": (t15, "trt10", {"P02"}, set()),
    "T16": (lambda: t16(False), "trt10", {"P08"}, set()),
    "T16-qdq-before-pad": (lambda: t16(True), "trt10", set(), set()),
    "T17": (lambda: t17(False), "trt10", {"P06"}, set()),
    "T17-quantized-gap": (lambda: t17(True), "trt10", set(), set()),
    "T17-reducemean": (lambda: t17(False, "ReduceMean"), "trt10", {"P06"}, set()),
    "T17-reducemean-quantized": (lambda: t17(True, "ReduceMean"), "trt10", set(), set()),
    "T17-reducemean18-quantized": (lambda: t17(True, "ReduceMean18"), "trt10", set(), set()),
    "T17-reducemean-nokeep": (lambda: t17(False, "ReduceMean-nokeep"), "trt10", {"P06"}, set()),
    "T18": (t18, "trt10", {"P12"}, {"P14"}),
    "P05-quantized-pool-into-float-gemm": (p05, "trt10", {"P05"}, set()),
    "T19-72": (lambda: t19(72), "trt10", set(), {"H01"}),
    "T19-20": (lambda: t19(20), "trt10", set(), {"H01"}),
    "T19-18": (lambda: t19(18), "trt10", {"H01"}, set()),
    "T20": (t20, "trt11", {"B02"}, {"V11"}),
    "T21": (t21, "trt10", {"V08"}, set()),
    "T22": (t22, "trt10", {"V07"}, set()),
    "T23-down": (lambda: t23("down"), "trt10", set(), set()),
    # a fusion whose output stays float reads its quantized residual behind a standalone DQ
    "P03d-block-into-float-pool": (
        lambda: block("shared", "pool"),
        "trt10",
        {"P03d", "P06"},
        set(),
    ),
    "P03d-block-into-quantized-pool": (lambda: block("shared", "qpool"), "trt10", set(), set()),
    "P03d-block-into-output": (lambda: block("shared", "output"), "trt10", set(), {"P03d"}),
    "P03d-block-into-pool-read-float": (
        lambda: block("shared", "pool-softmax"),
        "trt10",
        set(),
        {"P03d"},
    ),
    "P03d-downsample-into-output": (lambda: t23("down", "output"), "trt10", {"P03d"}, set()),
    "T23-main": (lambda: t23("main"), "trt10", set(), set()),
    "T23-both": (lambda: t23("both"), "trt10", {"P03b"}, set()),
    "T23-neither": (lambda: t23("neither"), "trt10", {"P03a"}, set()),
}
