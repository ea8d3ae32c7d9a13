"""Property tests: the linter returns a full report on every valid Q/DQ graph.

Random DAGs of Conv (dense, depthwise, strided, quantized or float weights), BatchNormalization,
Relu, Sigmoid, SiLU (Sigmoid + Mul), residual Adds over several parallel conv branches, Concat,
MaxPool, AveragePool, GlobalAveragePool and Resize, with Q/DQ pairs on arbitrary edges (per-tensor
activations, per-channel weights, scales shared or not), each accepted by ``onnx.checker``. Every
lint must produce a report without an internal (``L00``) finding, and the predicted layers must hold
every compute node exactly once. Also every acceptance graph and the ONNX files that onnx and ONNX
Runtime ship.
"""

from __future__ import annotations

import glob
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from lint_graphs import CASES
from qdq.lint import LintReport, lint

_QDQ = ("QuantizeLinear", "DequantizeLinear")
_SCALES = (0.01, 0.02, 0.05)
_NOT_LAYERS = frozenset({"Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity",
                         "Cast", "Shape", "Constant"})  # fmt: skip


class _Builder:
    """Grows a random valid graph; ``shapes`` maps each float tensor to (channels, height=width)."""

    def __init__(self, draw: Callable[[Any], Any], channels: int) -> None:
        self.draw = draw
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.shapes: dict[str, tuple[int, int]] = {"x": (channels, 8)}
        self.tensors = ["x"]  # op outputs a later op may read (not DQ outputs)
        self.read: set[str] = set()
        self.quantizers: dict[str, tuple[str, str, str]] = {}
        self.n = 0

    def _name(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def const(self, value: np.ndarray, prefix: str = "c") -> str:
        name = self._name(prefix)
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def op(self, op: str, inputs: list[str], shape: tuple[int, int], **attrs: Any) -> str:
        out = self._name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"{out}_node", **attrs))
        self.read.update(inputs)
        self.shapes[out] = shape
        if op not in _QDQ:
            self.tensors.append(out)
        return out

    def qdq(self, t: str) -> str:
        """``t`` through Quantize -> Dequantize, reusing an earlier quantizer of ``t`` or not."""
        if t in self.quantizers and self.draw(st.booleans()):
            q, s, z = self.quantizers[t]
        else:
            s = self.const(np.float32(self.draw(st.sampled_from(_SCALES))), "s")
            z = self.const(np.int8(0), "z")
            q = self._name("quantizelinear")
            self.nodes.append(helper.make_node("QuantizeLinear", [t, s, z], [q], name=f"{q}_node"))
            self.read.add(t)
            self.quantizers[t] = (q, s, z)
        return self.op("DequantizeLinear", [q, s, z], self.shapes[t])

    def use(self, t: str, p: float = 0.5) -> str:
        """Read ``t`` in float or through Q/DQ."""
        return self.qdq(t) if self.draw(st.floats(0, 1)) < p else t

    def pick(self, same_as: str | None = None, same_height: bool = False) -> str:
        pool = self.tensors
        if same_as is not None:
            c, h = self.shapes[same_as]
            pool = [t for t in pool if self.shapes[t][1] == h and (same_height or t != same_as)]
            if not same_height:
                pool = [t for t in pool if self.shapes[t][0] == c] or [same_as]
        return str(self.draw(st.sampled_from(pool[-6:])))  # recent tensors: deeper graphs

    # ------------------------------------------------------------------ ops
    def conv(self, t: str, cout: int | None = None, stride: int = 1) -> str:
        cin, h = self.shapes[t]
        cout = cout or self.draw(st.sampled_from([4, 8, 16]))
        k = self.draw(st.sampled_from([1, 3]))
        group = cin if cout == cin and self.draw(st.booleans()) else 1
        w = self.const(np.random.default_rng(self.n).normal(size=(cout, cin // group, k, k))
                       .astype(np.float32), "w")  # fmt: skip
        if self.draw(st.floats(0, 1)) < 0.85:  # per-channel weights, axis 0
            s = self.const(np.full(cout, self.draw(st.sampled_from(_SCALES)), np.float32), "ws")
            z = self.const(np.zeros(cout, np.int8), "wz")
            wq = self._name("quantizelinear")
            self.nodes.append(
                helper.make_node("QuantizeLinear", [w, s, z], [wq], name=f"{wq}_node", axis=0)
            )
            w = self.op("DequantizeLinear", [wq, s, z], (cout, k), axis=0)
        inputs = [self.use(t, 0.8), w]
        if self.draw(st.booleans()):
            inputs.append(self.const(np.zeros(cout, np.float32), "b"))
        pad = k // 2
        out_h = (h + 2 * pad - k) // stride + 1
        return self.op("Conv", inputs, (cout, out_h), kernel_shape=[k, k], pads=[pad] * 4,
                       strides=[stride, stride], group=group)  # fmt: skip

    def bn(self, t: str) -> str:
        c, h = self.shapes[t]
        ones, zeros = np.ones(c, np.float32), np.zeros(c, np.float32)
        params = [self.const(v) for v in (ones, zeros, zeros, ones)]
        return self.op("BatchNormalization", [self.use(t, 0.2), *params], (c, h))

    def unary(self, t: str, op: str) -> str:
        return self.op(op, [self.use(t, 0.3)], self.shapes[t])

    def silu(self, t: str) -> str:
        sig = self.op("Sigmoid", [self.use(t, 0.2)], self.shapes[t])
        return self.op("Mul", [self.use(t, 0.3), self.use(sig, 0.1)], self.shapes[t])

    def add(self, t: str) -> str:
        other = self.pick(same_as=t)
        return self.op("Add", [self.use(t), self.use(other)], self.shapes[t])

    def branches(self, t: str) -> str:
        """A re-parameterizable multi-branch block: sum of 2-3 conv(+BN) branches of ``t``,
        optionally plus a BN identity, summed left to right."""
        cin, _ = self.shapes[t]
        cout = self.draw(st.sampled_from([cin, 8]))
        outs = []
        for _ in range(self.draw(st.integers(2, 3))):
            y = self.conv(t, cout)
            outs.append(self.bn(y) if self.draw(st.booleans()) else y)
        if cout == cin and self.draw(st.booleans()):
            outs.append(self.bn(t))
        total = outs[0]
        for y in outs[1:]:
            total = self.op("Add", [self.use(total, 0.3), self.use(y, 0.3)], self.shapes[y])
        return self.unary(total, "Relu") if self.draw(st.booleans()) else total

    def concat(self, t: str) -> str:
        others = [
            self.pick(same_as=t, same_height=True) for _ in range(self.draw(st.integers(1, 2)))
        ]
        parts = [t, *others]
        c = sum(self.shapes[p][0] for p in parts)
        return self.op("Concat", [self.use(p) for p in parts], (c, self.shapes[t][1]), axis=1)

    def pool(self, t: str, op: str) -> str:
        c, h = self.shapes[t]
        stride = self.draw(st.sampled_from([1, 2])) if h > 1 else 1
        out_h = (h + 2 - 3) // stride + 1
        return self.op(op, [self.use(t)], (c, out_h), kernel_shape=[3, 3], pads=[1] * 4,
                       strides=[stride, stride])  # fmt: skip

    def gap(self, t: str) -> str:
        return self.op("GlobalAveragePool", [self.use(t)], (self.shapes[t][0], 1))

    def resize(self, t: str) -> str:
        c, h = self.shapes[t]
        scales = self.const(np.array([1, 1, 2, 2], np.float32), "scales")
        mode = self.draw(st.sampled_from(["nearest", "linear"]))
        return self.op("Resize", [self.use(t), "", scales], (c, 2 * h), mode=mode)

    def model(self) -> onnx.ModelProto:
        outs = [t for t in self.tensors if t not in self.read and t != "x"] or [self.tensors[-1]]
        if self.draw(st.booleans()):  # a Q/DQ right before a graph output
            outs[-1] = self.qdq(outs[-1])
        c0, _ = self.shapes["x"]
        info = [helper.make_tensor_value_info(t, TensorProto.FLOAT, [1, self.shapes[t][0],
                self.shapes[t][1], self.shapes[t][1]]) for t in outs]  # fmt: skip
        graph = helper.make_graph(
            self.nodes,
            "fuzz",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c0, 8, 8])],
            info,
            initializer=self.inits,
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


_OPS = ("conv", "conv", "bn", "relu", "sigmoid", "silu", "add", "branches", "branches", "concat",
        "maxpool", "avgpool", "gap", "resize")  # fmt: skip


@st.composite
def qdq_graphs(draw: Callable[[Any], Any]) -> onnx.ModelProto:
    """A random valid Q/DQ ONNX graph (opset 13, NCHW, 8x8 input)."""
    b = _Builder(draw, draw(st.sampled_from([3, 8, 16])))
    for _ in range(draw(st.integers(1, 10))):
        t = b.pick()
        kind = draw(st.sampled_from(_OPS))
        h = b.shapes[t][1]
        if kind == "conv":
            b.conv(t, stride=2 if h >= 4 and draw(st.booleans()) else 1)
        elif kind in ("relu", "sigmoid"):
            b.unary(t, kind.capitalize())
        elif kind in ("maxpool", "avgpool"):
            b.pool(t, "MaxPool" if kind == "maxpool" else "AveragePool")
        elif kind == "resize" and h > 8:
            b.conv(t)
        else:
            getattr(b, kind)(t)
    return b.model()


def _check_report(model: onnx.ModelProto, report: LintReport) -> None:
    """No internal finding; every compute node in exactly one predicted layer, every Q/DQ in at
    most one; the report serialises."""
    assert "L00" not in report.rules(), report.format()
    layers = Counter(n for ly in report.layers if ly.kind != "qdq" for n in ly.nodes)
    qdq_layers = Counter(n for ly in report.layers if ly.kind == "qdq" for n in ly.nodes)
    names = {n.name or n.output[0]: n.op_type for n in model.graph.node}
    compute = {k for k, op in names.items() if op not in _QDQ and op not in _NOT_LAYERS}
    assert set(layers) == compute, (compute ^ set(layers), report.format(True))
    assert max(layers.values(), default=1) == 1, layers.most_common(2)
    assert set(qdq_layers) <= {k for k, op in names.items() if op in _QDQ}
    assert max(qdq_layers.values(), default=1) == 1
    assert report.to_json() and report.format(show_layers=True)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=qdq_graphs(), target=st.sampled_from(["trt10", "trt8.6", "trt11"]))
def test_random_qdq_graphs_always_give_a_full_report(model: onnx.ModelProto, target: str) -> None:
    onnx.checker.check_model(model, full_check=True)
    _check_report(model, lint(model, target=target))


@pytest.mark.parametrize("case", list(CASES))
def test_every_acceptance_graph_gives_a_full_report(case: str) -> None:
    build, target, _, _ = CASES[case]
    model = build()
    _check_report(model, lint(model, target=target))


def _shipped_onnx() -> list[str]:
    roots = [Path(onnx.__file__).parent / "backend" / "test" / "data"]
    try:
        import onnxruntime

        roots.append(Path(onnxruntime.__file__).parent / "datasets")
    except ImportError:
        pass
    return sorted(f for r in roots for f in glob.glob(str(r / "**" / "*.onnx"), recursive=True))


def test_every_onnx_file_shipped_with_onnx_and_onnxruntime_lints() -> None:
    files = _shipped_onnx()
    if not files:
        pytest.skip("onnx ships no test models here")
    failed = {}
    for f in files:
        report = lint(f)  # float models: L01, never an exception
        if "L00" in report.rules():
            failed[f] = [x.message for x in report.findings if x.rule == "L00"]
    assert not failed, failed
