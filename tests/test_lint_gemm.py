"""GEMMs the linter does not count as float runtime GEMMs (issue 34's transformer rows): one whose
input is computed from constants and shapes only -- Swin-V2's position-bias MLP on its fixed
coordinate table, ConViT's positional projection of fixed relative indices expanded to the batch --
is folded at build time (P01 INFO, no engine layer); one with K or N < 16 left float is P14 INFO.
Both are what qdq's planner decides for them (P01 / P14 skips)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from lint_graphs import G
from qdq.lint import lint
from qdq.lint.graph import LintGraph

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))


def _weight(g: G, k: int, n: int, quantized: bool) -> str:
    w = g.const(g.rng.normal(size=(k, n)).astype(np.float32), "w")
    if not quantized:
        return w
    s = g.const(np.full(n, 0.01, np.float32), "ws")
    z = g.const(np.zeros(n, np.int8), "wz")
    return g.op("DequantizeLinear", [g.op("QuantizeLinear", [w, s, z], axis=1), s, z], axis=1)


def _tokens(table_from_shape: bool) -> onnx.ModelProto:
    """x (1, 16, 32) -> INT8 GEMM, plus a bias computed by a 2-GEMM MLP from a fixed table (or
    from fixed indices expanded to the batch through ``Shape(x)``), added to its output."""
    g = G()
    y = g.op("MatMul", [g.qdq("x"), _weight(g, 32, 32, True)])
    table = g.const(np.random.default_rng(1).normal(size=(1, 16, 3)).astype(np.float32), "t")
    if table_from_shape:  # ConViT: rel_indices.expand(B, -1, -1)
        batch = g.op("Slice", [g.op("Shape", ["x"]), g.const([0]), g.const([1])])
        shape = g.op("Concat", [batch, g.const(np.array([16, 3], np.int64))], axis=0)
        table = g.op("Expand", [table, shape])
    hidden = g.op("Relu", [g.op("Add", [g.op("MatMul", [table, _weight(g, 3, 32, False)]),
                                        g.const(np.zeros(32, np.float32))])])  # fmt: skip
    bias = g.op("MatMul", [hidden, _weight(g, 32, 32, False)])
    out = g.op("Add", [y, bias])
    return g.model([out], shape=(1, 16, 32))


def _small_head() -> onnx.ModelProto:
    """An INT8 GEMM, then a float 32 -> 4 head and a float 32 -> 32 GEMM."""
    g = G()
    y = g.op("MatMul", [g.qdq("x"), _weight(g, 32, 32, True)])
    head = g.op("MatMul", [y, _weight(g, 32, 4, False)])
    wide = g.op("MatMul", [y, _weight(g, 32, 32, False)])
    return g.model([head, wide], shape=(1, 16, 32))


def _matmuls(model: onnx.ModelProto) -> list[str]:
    return [n.name for n in model.graph.node if n.op_type == "MatMul"]


def test_gemms_on_a_fixed_table_are_folded_not_float() -> None:
    for from_shape in (False, True):
        model = _tokens(from_shape)
        int8, mlp1, mlp2 = _matmuls(model)
        g = LintGraph(model)
        assert [g.folded_node(n) for n in g.nodes if n.op_type == "MatMul"] == [False, True, True]
        report = lint(model)
        assert int8 in report.int8_layers
        layer_nodes = {n for ly in report.layers for n in ly.nodes}
        assert mlp1 not in layer_nodes and mlp2 not in layer_nodes  # no engine layer
        assert not any("Relu" in n for n in layer_nodes)  # its epilogue is folded with it
        folded = [f for f in report.findings if f.rule == "P01"]
        assert [(f.severity, f.nodes) for f in folded] == [("INFO", (mlp1,)), ("INFO", (mlp2,))]
        assert "folded at build time" in folded[0].effect
        s = report.summary
        assert (s["weighted_layers"], s["int8_weighted_layers"]) == (1, 1)
        assert s["folded_weighted_layers"] == 2 and s["int8_flops_percent"] == 100
        assert "folded at build time 2" in report.format()


def test_small_float_gemm_is_p14_info_and_a_wide_one_is_not() -> None:
    model = _small_head()
    _, head, wide = _matmuls(model)
    report = lint(model)
    p14 = [f for f in report.findings if f.rule == "P14"]
    assert [(f.severity, f.nodes) for f in p14] == [("INFO", (head,))]
    assert "K=32, N=4" in p14[0].message
    assert not any(wide in f.nodes for f in report.findings if f.rule in ("P01", "P14"))
    g = LintGraph(model)
    assert [g.gemm_kn(n) for n in g.nodes if n.op_type == "MatMul"] == [(32, 32), (32, 4), (32, 32)]


def test_gemm_kn_reads_a_transposed_gemm_weight() -> None:
    g = G()
    w = g.const(np.zeros((8, 32), np.float32), "w")  # Linear(32 -> 8) as Gemm(transB=1)
    y = g.op("Gemm", ["x", w], transB=1)
    model = g.model([y], shape=(1, 32))
    (gemm,) = LintGraph(model).nodes
    assert LintGraph(model).gemm_kn(gemm) == (32, 8)


def test_sweep_counts_folded_and_small_gemms_apart(tmp_path: Path) -> None:
    import zoo_sweep

    path = tmp_path / "m.onnx"
    g = G()
    y = g.op("MatMul", [g.qdq("x"), _weight(g, 32, 32, True)])
    table = g.const(np.ones((16, 3), np.float32), "t")
    bias = g.op("MatMul", [table, _weight(g, 3, 32, False)])
    head = g.op("MatMul", [g.op("Add", [y, bias]), _weight(g, 32, 4, False)])
    attn = g.op("MatMul", [y, g.op("Transpose", [y], perm=[0, 2, 1])])
    onnx.save(g.model([head, attn], shape=(1, 16, 32)), path)
    extra = zoo_sweep.lint_extra(path)
    assert (extra["gemms_int8"], extra["gemms"]) == (1, 2)
    assert (extra["gemms_folded"], extra["gemms_small"]) == (1, 1)
    cell = {"ok": True, "lint": {"ok": True, **extra}}
    row = {"name": "t:m", "kind": "transformer", "export": {"dynamo": cell}}
    assert not zoo_sweep._all_int8(row, "gemms_int8", "gemms")
    assert zoo_sweep._all_int8(row, "gemms_int8", "gemms", "gemms_small")


def test_value_info_free_shape_graph_is_still_folded() -> None:
    """A Shape of a runtime tensor is a build-time value (static shapes), as for Reshape targets."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Cast", ["s"], ["f"], to=1)]
    graph = helper.make_graph(nodes, "t", [x], [helper.make_tensor_value_info("f", 1, None)])
    g = LintGraph(helper.make_model(graph))
    assert "f" in g.folded and all(g.folded_node(n) for n in g.nodes)
    assert "x" not in g.folded


def test_quantize_of_a_further_view_of_an_int8_gemm_output_is_not_standalone() -> None:
    """HaloNet's q: a GEMM whose layer absorbed a Reshape + Transpose writes INT8 after them; a
    further view of that tensor, quantized with the same scale for another GEMM, reads INT8 too
    (the walk back through copy ops stops at the layer's INT8 output, not past it)."""
    g = G()
    y = g.op("MatMul", [g.qdq("x"), _weight(g, 32, 32, True)])
    t = g.op(
        "Transpose", [g.op("Reshape", [y, g.const(np.array([1, 4, 4, 32]))])], perm=[0, 2, 1, 3]
    )
    a = g.op("MatMul", [g.qdq(t, 0.05), _weight(g, 32, 32, True)])
    view = g.op("Reshape", [t, g.const(np.array([1, 16, 32]))])
    b = g.op("MatMul", [g.qdq(view, 0.05), _weight(g, 32, 32, True)])
    report = lint(g.model([a, b], shape=(1, 16, 32)))
    first = next(ly for ly in report.layers if ly.kind == "weighted")
    assert first.output_precision == "int8" and any("transpose" in n for n in first.nodes)
    standalone = [ly for ly in report.layers if ly.kind == "qdq"]
    assert [ly.reason for ly in standalone] == ["quantizes the network input"]


def test_sweep_runs_a_row_end_to_end(tmp_path: Path) -> None:
    """One sweep row in this process, as its child runs it: the row is entered where
    ``real_models.bench`` looks it up (a row missing there crashed every row of the sweep)."""
    pytest.importorskip("timm")
    import zoo_sweep

    row = zoo_sweep.run_row("timm:test_byobnet", tmp_path)
    assert zoo_sweep.outcome(row) == "ok", row.get("status")
    assert row["kind"] == "conv" and row["prepare"]["capture"] == "recorded"
    assert all(row["export"][e]["ok"] for e in ("dynamo", "torchscript")), row["export"]
    assert "timm:test_byobnet" not in zoo_sweep.ARCHS  # entered for the row only


def test_sweep_comparison_marks_rows_better_worse_or_same() -> None:
    import zoo_sweep

    def row(name: str, p04: int, unfused: int) -> dict:
        lint = {"ok": True, "verdict": "WARN" if p04 else "PASS", "unfused_qdq": unfused,
                "int8_flops_percent": 100, "warn_rules": {"P04": p04} if p04 else {}}  # fmt: skip
        cell = {"ok": True, "parity": {"ok": True}, "lint": lint}
        return {"name": name, "kind": "conv", "status": "ok", "build": {"ok": True},
                "prepare": {"ok": True}, "calibrate": {"ok": True},
                "export": {"dynamo": cell, "torchscript": cell}}  # fmt: skip

    before = [row("t:a", 3, 9), row("t:b", 0, 4), row("t:c", 0, 4), row("t:gone", 0, 1)]
    after = [row("t:a", 0, 6), row("t:b", 1, 4), row("t:c", 0, 4), row("t:new", 0, 1)]
    text = zoo_sweep.render_comparison(before, after)
    lines = {
        line.split()[0]: line.split()[-1] for line in text.splitlines() if line.startswith("t:")
    }
    assert lines == {"t:a": "better", "t:b": "worse", "t:c": "same"}
    assert "3 rows in both runs" in text and "2/3 before, 2/3 after" in text
