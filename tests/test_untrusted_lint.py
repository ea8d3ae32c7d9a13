"""``qdq lint`` on ONNX files from others (issue 57): external data checked before it is read,
linear time in the graph's size, invalid graphs as findings, names printed safely, and a fuzz
over mutated Q/DQ models that ends in a verdict or a LintInputError, never another exception."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdq.lint import LintInputError, lint
from qdq.lint.graph import LintGraph
from qdq.lint.text import printable

ESC_NAME = "conv\x1b[2J\x1b]0;owned\x07\x1b]8;;http://x\x1b\\link"


def _qdq_conv(name: str = "conv", opset: int = 17) -> onnx.ModelProto:
    """x -> Q/DQ -> Conv(Q/DQ weight) -> Relu -> y."""
    w = np.full((8, 4, 1, 1), 0.1, np.float32)
    inits = [
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(np.float32(0.02), "s"),
        numpy_helper.from_array(np.int8(0), "z"),
        numpy_helper.from_array(np.full(8, 0.01, np.float32), "ws"),
        numpy_helper.from_array(np.zeros(8, np.int8), "wz"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="xq_Q"),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xdq"], name="xdq_DQ"),
        helper.make_node("QuantizeLinear", ["w", "ws", "wz"], ["wq"], name="wq_Q", axis=0),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wdq"], name="wdq_DQ", axis=0),
        helper.make_node("Conv", ["xdq", "wdq"], ["c"], name=name),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "g", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``qdq lint ARGS`` in this process: (exit code, stdout, stderr)."""
    from qdq.cli.lint import run_lint

    model, flags = args[0], set(args[1:])
    code = run_lint(
        model,
        target="trt10",
        as_json="--json" in flags,
        engine=None,
        show_layers="--layers" in flags,
    )
    out = capsys.readouterr()
    return code, out.out, out.err


# ------------------------------------------------------------------ 1. external data
def _external_model(tmp_path: Path, location: str, length: int | None, offset: int = 0) -> Path:
    model = _qdq_conv()
    w = next(t for t in model.graph.initializer if t.name == "w")
    w.ClearField("raw_data")
    w.ClearField("float_data")
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", length)):
        if value is not None:
            entry = w.external_data.add()
            entry.key, entry.value = key, str(value)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    return path


def test_external_data_claiming_8_gib_is_refused_before_it_is_read(tmp_path: Path) -> None:
    with open(tmp_path / "w.bin", "wb") as f:
        f.truncate(8 << 30)  # sparse: no disk used, 8 GiB of zeros to whoever reads it
    path = _external_model(tmp_path, "w.bin", 8 << 30)
    code = textwrap.dedent(
        f"""
        import resource
        from qdq.lint import LintInputError, lint
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            lint({str(path)!r})
        except LintInputError as err:
            print(err)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print((after - before) // 1024)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    message, grown_mb = out.stdout.strip().splitlines()
    assert "tensor 'w'" in message and "w.bin" in message and "needs 128" in message
    assert int(grown_mb) < 256, f"peak memory grew by {grown_mb} MB"  # 8 GiB read before


@pytest.mark.parametrize(
    ("location", "why"),
    [
        ("/etc/passwd", "not a relative path"),
        ("../outside.bin", "not a relative path"),
        ("link.bin", "leads out of the model's folder"),
        ("fifo.bin", "not a regular file"),
        ("missing.bin", "missing"),
    ],
)
def test_external_data_outside_the_folder_is_refused(
    tmp_path: Path, location: str, why: str
) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"\0" * 128)
    (folder / "link.bin").symlink_to(outside)
    os.mkfifo(folder / "fifo.bin")  # opening it would block
    path = _external_model(folder, location, 128)
    with pytest.raises(LintInputError, match=why) as err:
        lint(path)
    assert "'w'" in str(err.value) and "\n" not in str(err.value)


def test_external_data_past_the_end_or_with_a_bad_offset(tmp_path: Path) -> None:
    (tmp_path / "w.bin").write_bytes(b"\0" * 100)
    with pytest.raises(LintInputError, match="past the end of the file"):
        lint(_external_model(tmp_path, "w.bin", None))
    with pytest.raises(LintInputError, match="not a whole number"):
        lint(_external_model(tmp_path, "w.bin", 128, offset=-5))


def test_good_external_data_lints_as_inline(tmp_path: Path) -> None:
    (tmp_path / "w.bin").write_bytes(b"\0" * 16 + np.full(32, 0.1, np.float32).tobytes())
    report = lint(_external_model(tmp_path, "w.bin", 128, offset=16))
    assert report.rules() == lint(_qdq_conv()).rules()
    assert report.summary["int8_weighted_layers"] == 1


# ------------------------------------------------------------------ 2. linear time
def _wide(n: int) -> onnx.ModelProto:
    """A Concat reading one Relu's output n times, beside n Sigmoids reading the input."""
    model = _qdq_conv()
    nodes = list(model.graph.node)
    nodes.append(helper.make_node("Concat", ["y"] * n, ["cat"], name="cat", axis=1))
    nodes += [helper.make_node("Sigmoid", ["x"], [f"g{i}"], name=f"sig{i}") for i in range(n)]
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ["cat", "g0"]]
    graph = helper.make_graph(nodes, "wide", list(model.graph.input), outs, model.graph.initializer)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _deep(n: int) -> onnx.ModelProto:
    """A Q/DQ'd input through n Identity ops then n Relus: long look-through-copies walks."""
    model = _qdq_conv()
    nodes, cur = list(model.graph.node), "xdq"
    for i in range(n):
        nodes.append(helper.make_node("Identity", [cur], [f"i{i}"], name=f"id{i}"))
        cur = f"i{i}"
    for i in range(n):
        nodes.append(helper.make_node("Relu", [cur], [f"r{i}"], name=f"r{i}"))
        cur = f"r{i}"
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ["y", cur]]
    graph = helper.make_graph(nodes, "deep", list(model.graph.input), outs, model.graph.initializer)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("build", [_wide, _deep])
def test_lint_work_grows_linearly(build, monkeypatch: pytest.MonkeyPatch) -> None:
    """Count the readers every ``float_uses`` list is built from: the quadratic linter built one
    per reader (10^4 readers: 10^8 entries, 34 s); now each tensor's once."""
    built = {"entries": 0}
    original = LintGraph.shape_only

    def counting(self: LintGraph, node) -> bool:
        built["entries"] += 1
        return original(self, node)

    monkeypatch.setattr(LintGraph, "shape_only", counting)
    counts = []
    for n in (2000, 8000):
        built["entries"] = 0
        report = lint(build(n))
        assert "L00" not in report.rules(), report.format()
        counts.append(built["entries"])
    assert counts[1] < 6 * counts[0], counts  # x4 nodes: x4 work, not x16


# ------------------------------------------------------------------ 3. invalid graphs
def _with_nodes(nodes: list, **kw) -> onnx.ModelProto:
    model = _qdq_conv()
    x = list(model.graph.input)
    y = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    graph = helper.make_graph(nodes, "g", x, y, model.graph.initializer)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), *kw.get("ops", [])])


def test_cycle_and_self_loop_are_errors() -> None:
    base = list(_qdq_conv().graph.node)
    cycle = [
        *base[:4],
        helper.make_node("Add", ["xdq", "b"], ["a"], name="A"),
        helper.make_node("Relu", ["a"], ["b"], name="B"),
        helper.make_node("Conv", ["a", "wdq"], ["y"], name="conv"),
    ]
    loop = [
        *base[:4],
        helper.make_node("Add", ["xdq", "s1"], ["s1"], name="self"),
        helper.make_node("Conv", ["s1", "wdq"], ["y"], name="conv"),
    ]
    for nodes, text in ((cycle, "has a cycle"), (loop, "'self' reads its own output")):
        report = lint(_with_nodes(nodes))
        assert report.verdict == "ERROR" and "V14" in report.rules("ERROR")
        assert any(text in f.message for f in report.findings)


def test_unsorted_acyclic_graph_lints_as_sorted() -> None:
    model = _qdq_conv()
    shuffled = list(reversed(model.graph.node))
    assert lint(_with_nodes(shuffled)).rules() == lint(model).rules()


def test_ir_version_999_is_an_error() -> None:
    model = _qdq_conv()
    model.ir_version = 999
    report = lint(model)
    assert "V15" in report.rules("ERROR") and report.verdict == "ERROR"


def test_unknown_domain_op_needs_a_plugin_and_is_no_fp16_layer() -> None:
    base = list(_qdq_conv().graph.node)
    nodes = [*base[:5], helper.make_node("FancyAct", ["c"], ["y"], name="fancy", domain="acme")]
    report = lint(_with_nodes(nodes, ops=[helper.make_opsetid("acme", 1)]))
    assert "V16" in report.rules("WARN") and report.verdict != "PASS"
    (layer,) = [ly for ly in report.layers if "fancy" in ly.nodes]
    assert layer.kind == "plugin" and layer.input_precision == "plugin"
    assert "fancy" not in report.float_layers


def test_if_subgraph_is_reported_unread() -> None:
    base = list(_qdq_conv().graph.node)
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    branch = helper.make_graph([helper.make_node("Relu", ["c"], ["y"])], "b", [], [out])
    cond = numpy_helper.from_array(np.array(True), "cond")
    nodes = [
        *base[:5],
        helper.make_node("If", ["cond"], ["y"], name="if", then_branch=branch, else_branch=branch),
    ]
    model = _with_nodes(nodes)
    model.graph.initializer.append(cond)
    report = lint(model)
    assert "V17" in report.rules("WARN") and report.verdict != "PASS"


# ------------------------------------------------------------------ 4. terminal escapes
def test_escape_sequences_in_names_are_printed_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_qdq_conv(ESC_NAME), str(path))
    for extra in ((), ("--layers",)):
        code, out, _ = _run_cli(capsys, str(path), *extra)
        assert "\x1b" not in out and "\x07" not in out, out
        assert code in (0, 1, 2) and "\\x1b" in out
    doc = json.loads(_run_cli(capsys, str(path), "--json")[1])  # JSON escapes it itself
    assert any(ESC_NAME in ly["nodes"] for ly in doc["layers"])


def test_escape_sequences_in_an_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run_cli(capsys, "/nonexistent/\x1b[2Jevil.onnx")
    assert code == 3 and "\x1b" not in err and "\\x1b" in err


def test_printable() -> None:
    assert printable("a\x1b]0;t\x07\u202e\r") == "a\\x1b]0;t\\x07\\u202e\\x0d"
    assert printable("Conv_1/ré") == "Conv_1/ré"


# ------------------------------------------------------------------ 5. fuzz
def _mutate(model: onnx.ModelProto, rng: random.Random) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    nodes = m.graph.node
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(10)
        node = nodes[rng.randrange(len(nodes))] if len(nodes) else None
        names = [o for n in nodes for o in n.output] + ["x", "w", "s", "z", "", "nope"]
        if kind == 0 and node is not None and len(node.input):
            node.input[rng.randrange(len(node.input))] = rng.choice(names)
        elif kind == 1 and node is not None and len(node.output):
            node.output[0] = rng.choice(names)
        elif kind == 2 and node is not None:
            node.op_type = rng.choice(["Conv", "Relu", "Concat", "Foo", "QuantizeLinear", "If"])
        elif kind == 3 and node is not None:
            node.domain = rng.choice(["", "acme", "com.microsoft"])
        elif kind == 4 and len(nodes):
            del nodes[rng.randrange(len(nodes))]
        elif kind == 5:
            t = m.graph.initializer[rng.randrange(len(m.graph.initializer))]
            t.dims.append(rng.choice([0, 2, -1, 1 << 40]))
        elif kind == 6:
            t = m.graph.initializer[rng.randrange(len(m.graph.initializer))]
            t.data_type = rng.choice([0, 3, 8, 17, 99])
        elif kind == 7:
            m.ir_version = rng.choice([0, 1, 999])
        elif kind == 8 and node is not None:
            node.input.append(rng.choice(names))
        elif kind == 9 and len(nodes):
            copy = nodes.add()
            copy.CopyFrom(nodes[rng.randrange(len(nodes) - 1)] if len(nodes) > 1 else copy)
    return m


def test_fuzz_mutated_models_end_in_a_verdict_or_a_lint_input_error() -> None:
    rng = random.Random(57)
    base = _qdq_conv()
    verdicts: dict[str, int] = {}
    for _ in range(300):
        model = _mutate(base, rng)
        try:
            verdict = lint(model).verdict
        except LintInputError as err:
            assert "\n" not in str(err)
            verdict = "input error"
        verdicts[verdict] = verdicts.get(verdict, 0) + 1
    assert len(verdicts) >= 3 and verdicts.get("input error", 0) < 250, verdicts
