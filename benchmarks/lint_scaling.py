"""How ``qdq lint``'s time grows with the graph: a node of N inputs, a graph of N nodes.

Prints seconds per shape and size (no assertion; tests/test_untrusted_lint.py checks the same
graphs by counting work, not time). Usage: ``python benchmarks/lint_scaling.py [N ...]``
(default 1000 10000 100000).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper


def _model(nodes: list, inits: list, outputs: list[str]) -> ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
    graph = helper.make_graph(nodes, "scaling", [x], outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _qdq(prefix: str, src: str) -> tuple[list, list, str]:
    s, z = f"{prefix}_s", f"{prefix}_z"
    inits = [numpy_helper.from_array(np.float32(0.02), s), numpy_helper.from_array(np.int8(0), z)]
    nodes = [
        helper.make_node("QuantizeLinear", [src, s, z], [f"{prefix}_q"], name=f"{prefix}_Q"),
        helper.make_node("DequantizeLinear", [f"{prefix}_q", s, z], [f"{prefix}_dq"], name=f"{prefix}_DQ"),
    ]  # fmt: skip
    return nodes, inits, f"{prefix}_dq"


def wide_same(n: int) -> ModelProto:
    """One Concat reading the same tensor ``n`` times (``torch.cat([relu(x)] * n)``)."""
    nodes, inits, dq = _qdq("x", "x")
    nodes.append(helper.make_node("Relu", [dq], ["r"], name="relu"))
    nodes.append(helper.make_node("Concat", ["r"] * n, ["y"], name="cat", axis=1))
    return _model(nodes, inits, ["y"])


def wide_distinct(n: int) -> ModelProto:
    """One Concat of ``n`` distinct tensors, each a Relu of the input through Q/DQ."""
    nodes, inits, dq = _qdq("x", "x")
    names = []
    for i in range(n):
        nodes.append(helper.make_node("Relu", [dq], [f"r{i}"], name=f"relu{i}"))
        names.append(f"r{i}")
    nodes.append(helper.make_node("Concat", names, ["y"], name="cat", axis=1))
    return _model(nodes, inits, ["y"])


def conv_chain(n: int) -> ModelProto:
    """``n`` nodes: Q/DQ -> Conv(Q/DQ weight) -> Relu blocks in a chain (about n/6 blocks)."""
    w = np.full((4, 4, 1, 1), 0.1, np.float32)
    nodes: list = []
    inits = [numpy_helper.from_array(w, "w")]
    wq, wi, wdq = _qdq("w", "w")
    nodes += wq
    inits += wi
    cur = "x"
    for i in range(max(1, n // 6)):
        qn, qi, dq = _qdq(f"a{i}", cur)
        nodes += qn
        inits += qi
        nodes.append(helper.make_node("Conv", [dq, wdq], [f"c{i}"], name=f"conv{i}"))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"))
        nodes.append(helper.make_node("Add", [f"r{i}", dq], [f"s{i}"], name=f"add{i}"))
        cur = f"s{i}"
    return _model(nodes, inits, [cur])


def copy_chain(n: int) -> ModelProto:
    """Q/DQ, then ``n`` Identity ops in a row, then a Relu (deep look-through-copies walks)."""
    nodes, inits, cur = _qdq("x", "x")
    for i in range(n):
        nodes.append(helper.make_node("Identity", [cur], [f"i{i}"], name=f"id{i}"))
        cur = f"i{i}"
    nodes.append(helper.make_node("Relu", [cur], ["y"], name="relu"))
    return _model(nodes, inits, ["y"])


def fan_out(n: int) -> ModelProto:
    """One quantized tensor read by ``n`` Relus and one Concat of them (a tensor of n readers)."""
    nodes, inits, dq = _qdq("x", "x")
    for i in range(n):
        nodes.append(helper.make_node("Sigmoid", ["x"], [f"g{i}"], name=f"sig{i}"))
    nodes.append(helper.make_node("Relu", [dq], ["y"], name="relu"))
    return _model(nodes, inits, ["y"] + [f"g{i}" for i in range(n)])


SHAPES: dict[str, Callable[[int], ModelProto]] = {
    "wide_same": wide_same,
    "wide_distinct": wide_distinct,
    "conv_chain": conv_chain,
    "copy_chain": copy_chain,
    "fan_out": fan_out,
}


def main(sizes: list[int]) -> None:
    from qdq.lint import lint

    for name, build in SHAPES.items():
        for n in sizes:
            model = build(n)
            start = time.perf_counter()
            report = lint(model)
            took = time.perf_counter() - start
            print(
                f"{name:<14} n={n:>7}  {took:8.2f} s  {report.verdict:<5} "
                f"rules {sorted(report.rules())}",
                flush=True,
            )


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1000, 10000, 100000])
