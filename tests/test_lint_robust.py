"""The linter never crashes: unreadable inputs are one ``LintInputError`` (exit 3, one line naming
the file), a rule or prediction step that fails becomes an ``L00`` finding while the rest of the
report is still produced, and a model with no Q/DQ is ``L01``, not PASS."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import qdq.lint.placement as placement
import qdq.lint.predict as predict
import qdq.lint.report as report_module
from lint_graphs import G, t01, t05
from qdq.cli.main import main
from qdq.lint import LintInputError, lint
from qdq.lint.graph import LintGraph
from qdq.lint.placement import check_placement


def _float_model() -> onnx.ModelProto:
    g = G()
    w = g.const(np.ones((8, 64, 1, 1), np.float32))
    return g.model([g.op("Relu", [g.op("Conv", ["x", w])])])


def _external_data_missing(tmp: Path) -> Path:
    path = tmp / "ext.onnx"
    onnx.save_model(
        t01(), str(path), save_as_external_data=True, location="ext.data", size_threshold=0
    )
    (tmp / "ext.data").unlink()
    return path


def _undefined_tensor(tmp: Path) -> Path:
    model = t01()
    del model.graph.initializer[:]  # what a cut in the initializer list leaves
    path = tmp / "undefined.onnx"
    onnx.save(model, str(path))
    return path


def _corrupt_initializer(tmp: Path) -> Path:
    model = t01()
    w = next(i for i in model.graph.initializer if len(i.dims) == 4)
    w.raw_data = w.raw_data[:-4]
    path = tmp / "corrupt.onnx"
    onnx.save(model, str(path))
    return path


def _write(name: str, data: bytes) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        (tmp / name).write_bytes(data)
        return tmp / name

    return make


def _truncated(tmp: Path) -> Path:
    data = t01().SerializeToString()
    return _write("truncated.onnx", data[: len(data) // 2])(tmp)


def _directory(tmp: Path) -> Path:
    (tmp / "dir.onnx").mkdir()
    return tmp / "dir.onnx"


BAD_INPUTS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "not-onnx": (_write("notes.onnx", b"this is a text file\n" * 8), "not an ONNX model"),
    "empty": (_write("empty.onnx", b""), "empty file"),
    "truncated": (_truncated, "truncated"),
    "directory": (_directory, "is a directory"),
    "missing": (lambda tmp: tmp / "missing.onnx", "no such file"),
    "external-data-missing": (_external_data_missing, "ext.data is missing"),
    "undefined-tensor": (_undefined_tensor, "which no node, initializer or graph input defines"),
    "corrupt-initializer": (_corrupt_initializer, "corrupt or truncated"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_cli_bad_input_exits_3_with_one_line(case: str, tmp_path: Path, capsys) -> None:
    make, what = BAD_INPUTS[case]
    path = make(tmp_path)
    assert main(["lint", str(path)]) == 3
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"qdq lint: error: {path}") and what in lines[0], lines[0]
    assert "Traceback" not in err


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_api_bad_input_raises_lint_input_error(case: str, tmp_path: Path) -> None:
    make, what = BAD_INPUTS[case]
    path = make(tmp_path)
    with pytest.raises(LintInputError, match=what) as info:
        lint(path)
    assert str(info.value).startswith(str(path))
    assert isinstance(info.value, ValueError)


def test_verbose_cli_logs_the_traceback(tmp_path: Path, capsys, caplog) -> None:
    path = _write("notes.onnx", b"not onnx at all")(tmp_path)
    caplog.set_level(logging.DEBUG)
    assert main(["-v", "lint", str(path)]) == 3
    assert any(r.exc_info for r in caplog.records), "the traceback is logged with -v"
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_lint_rejects_a_non_model() -> None:
    with pytest.raises(TypeError, match="dict"):
        lint({"graph": None})  # type: ignore[arg-type]


def test_empty_model_proto_is_refused() -> None:
    with pytest.raises(LintInputError, match="not an ONNX model"):
        lint(onnx.ModelProto())


# ------------------------------------------------------------------ L01: no Q/DQ at all
def test_float_model_is_not_quantized(tmp_path: Path, capsys) -> None:
    report = lint(_float_model())
    assert report.rules("ERROR") == {"L01"} and report.verdict == "ERROR"
    assert report.exit_code == 2
    path = tmp_path / "float.onnx"
    onnx.save(_float_model(), str(path))
    assert main(["lint", str(path)]) == 2
    assert "not quantized" in capsys.readouterr().out


def test_quantized_models_have_no_l01() -> None:
    assert "L01" not in lint(t01()).rules()
    g = G()  # weights-only Q/DQ still counts as a Q/DQ model (P01 says what is wrong)
    assert "L01" not in lint(g.model([g.conv("x")])).rules()


# ------------------------------------------------------------------ L00: a failing step
def _boom(*args: object) -> None:
    raise RuntimeError("boom: graph shape not modelled")


def _without_l00(findings) -> list[tuple[str, tuple[str, ...]]]:
    return [(f.rule, f.nodes) for f in findings if f.rule != "L00"]


def test_a_broken_placement_rule_is_l00_and_the_rest_still_runs(monkeypatch) -> None:
    model = t05(0.02, 0.05, 0.04)  # S02 fires on its Concat
    clean = lint(model)
    monkeypatch.setattr(placement, "_concat", _boom)
    broken = lint(model)
    (l00,) = [f for f in broken.findings if f.rule == "L00"]
    cat = next(n.name for n in model.graph.node if n.op_type == "Concat")
    assert l00.severity == "ERROR" and l00.nodes == (cat,)
    assert "RuntimeError" in l00.message and "boom" in l00.message and cat in l00.message
    assert l00.extra == {
        "step": "placement rules on Concat",
        "exception": "RuntimeError",
        "detail": "boom: graph shape not modelled",
    }
    # everything else is as before: the other rules, the layers, the summary
    assert _without_l00(broken.findings) == [
        (f.rule, f.nodes) for f in clean.findings if f.rule != "S02"
    ]
    assert broken.layers == clean.layers
    assert broken.summary == {**clean.summary, "scale_mismatches": 0}
    assert broken.exit_code == 2 and broken.verdict == "ERROR"


def test_a_broken_tensor_rule_is_l00_on_that_tensor(monkeypatch) -> None:
    monkeypatch.setattr(placement, "_tensor_rules", _boom)
    report = lint(t01())
    l00 = [f for f in report.findings if f.rule == "L00"]
    assert l00 and all(len(f.nodes) == 1 for f in l00)
    assert "P03a" in report.rules() and report.layers


def test_a_broken_layer_prediction_keeps_every_node(monkeypatch) -> None:
    model = t05(0.02, 0.05, 0.04)
    clean = lint(model)
    monkeypatch.setattr(predict._Predictor, "_plain_layer", _boom)
    broken = lint(model)
    l00 = [f for f in broken.findings if f.rule == "L00"]
    assert [f.nodes for f in l00] == [(n.name,) for n in model.graph.node if n.op_type == "Concat"]
    assert all(f.extra["step"] == "layer prediction (layer)" for f in l00)
    covered = sorted(n for ly in broken.layers if ly.kind != "qdq" for n in ly.nodes)
    assert covered == sorted(n for ly in clean.layers if ly.kind != "qdq" for n in ly.nodes)
    cat = next(ly for ly in broken.layers if ly.nodes == l00[0].nodes)
    assert cat.reason == "not analysed" and not cat.int8


def test_a_failing_prediction_step_still_gives_a_report(monkeypatch) -> None:
    clean = lint(t01())
    monkeypatch.setattr(report_module, "predict_layers", _boom)
    broken = lint(t01())
    assert broken.layers == ()
    (l00,) = [f for f in broken.findings if f.rule == "L00"]
    assert l00.extra["step"] == "layer prediction" and l00.nodes == ()
    assert {"P03a", "P04"} <= broken.rules("WARN")
    assert set(broken.summary) == set(clean.summary)
    assert "L00" in broken.format() and broken.to_json()


def test_cli_reports_l00_with_exit_2(monkeypatch, tmp_path: Path, capsys) -> None:
    path = tmp_path / "t05.onnx"
    onnx.save(t05(0.02, 0.05, 0.04), str(path))
    monkeypatch.setattr(placement, "_concat", _boom)
    assert main(["lint", str(path)]) == 2
    assert "L00" in capsys.readouterr().out


def test_without_a_guard_the_rule_modules_raise(monkeypatch) -> None:
    monkeypatch.setattr(placement, "_concat", _boom)
    with pytest.raises(RuntimeError, match="boom"):
        check_placement(LintGraph(t05(0.02, 0.05, 0.04)))


def test_nameless_nodes_are_named_by_their_output() -> None:
    model = t01()
    for n in model.graph.node:
        n.name = ""
    report = lint(model)
    assert "L00" not in report.rules(), report.format()
    assert all(n for ly in report.layers for n in ly.nodes)


def test_a_node_without_outputs_is_an_input_error() -> None:
    model = t01()
    model.graph.node.append(helper.make_node("Relu", [model.graph.node[-1].output[0]], []))
    with pytest.raises(LintInputError, match="has no output"):
        lint(model)


def test_corrupt_constant_node_is_an_input_error() -> None:
    model = t01()
    t = numpy_helper.from_array(np.ones(4, np.float32), "c")
    t.raw_data = t.raw_data[:-2]
    model.graph.node.insert(0, helper.make_node("Constant", [], ["c_out"], value=t))
    model.graph.output.append(helper.make_tensor_value_info("c_out", TensorProto.FLOAT, None))
    with pytest.raises(LintInputError, match="cannot be read"):
        lint(model)


def test_a_traced_shape_read_through_cast_is_not_a_float_reader() -> None:
    # the TorchScript tracer emits Cast -> Shape for `x.shape` of a quantized tensor (YOLO's head)
    from lint_graphs import G, block_input

    def model(extra_read: str) -> onnx.ModelProto:
        g = G()
        y = block_input(g)
        out = g.conv(g.qdq(y))
        extra = []
        if extra_read == "shape":
            shape = g.op("Shape", [g.op("Cast", [y], to=1)])
            extra = [g.op("Cast", [shape], to=1)]
        elif extra_read == "output":  # the tracer's Cast in front of a returned tensor
            extra = [g.op("Cast", [y], to=1)]
        elif extra_read == "direct":  # the dynamo export returns the tensor itself
            extra = [y]
        return g.model([out, *extra])

    plain = lint(model(""))
    for variant in ("shape", "output", "direct"):
        traced = lint(model(variant))
        assert "P04" not in traced.rules(), (variant, traced.format())
        assert traced.rules("WARN") == plain.rules("WARN"), variant
    assert lint(model("shape")).summary["unfused_qdq"] == plain.summary["unfused_qdq"]
    assert lint(model("output")).summary == lint(model("direct")).summary  # both exporters alike


def test_a_one_input_concat_before_a_quantize_is_no_s02b() -> None:
    # torchvision's traced batching stacks one image: Concat(1 input) -> Q -> conv
    from lint_graphs import G

    def model(second: bool) -> onnx.ModelProto:
        g = G()
        parts = [g.op("Relu", ["x"])] * (2 if second else 1)
        cat = g.op("Concat", parts, axis=1)
        return g.model([g.conv(g.qdq(cat), cin=128 if second else 64)])

    assert "S02b" not in lint(model(False)).rules()
    assert "S02b" in lint(model(True)).rules()  # two float inputs: two Quantize kernels


def test_a_concat_of_float_conv_outputs_before_a_quantize_is_no_s02b_warning() -> None:
    """Res2Net's small 3x3 convs run float (H02): quantizing their outputs for an INT8 Concat
    would take a standalone Quantize each, where the reader's one Quantize after the float
    Concat costs one: an INFO, not a warning. One such input beside an INT8-written one is still
    S02b (its Quantize costs what the reader's would)."""
    from lint_graphs import G

    def model(float_convs: int) -> onnx.ModelProto:
        g = G()
        x = g.qdq("x")
        parts = [g.op("Relu", [g.conv("x", qw=False)]) for _ in range(float_convs)]
        parts += [g.qdq(g.op("Relu", [g.conv(x)])) for _ in range(2 - float_convs)]
        cat = g.op("Concat", parts, axis=1)
        return g.model([g.conv(g.qdq(cat), cin=128)])

    two = lint(model(2))
    assert "S02b" not in two.rules("WARN") and "S02b" in two.rules("INFO"), two.format()
    assert "S02b" in lint(model(1)).rules("WARN")


def test_a_relu_beside_another_reader_is_no_epilogue() -> None:
    # RetinaNet's p6: the head conv and relu(p6) -> p7 conv both read the INT8 p6 (P04)
    from lint_graphs import G, block_input

    def model(head: bool) -> onnx.ModelProto:
        g = G()
        p6 = g.qdq(g.conv(g.qdq(block_input(g))))
        p7 = g.conv(g.qdq(g.op("Relu", [p6]), 0.01))
        return g.model([g.conv(p6), p7] if head else [p7])

    assert "P02" not in lint(model(True)).rules()
    assert "P02" in lint(model(False)).rules()  # alone, the ReLU would fuse into the conv


def test_a_max_pool_whose_shape_is_also_read_is_a_quantized_reader() -> None:
    # FPN's LastLevelMaxPool: p6 = max_pool(p5) feeds the RPN head conv through Q, and the anchor
    # generator reads p6's shape (the tracer's Cast -> Shape)
    from lint_graphs import G, block_input

    def model(float_reader: bool) -> onnx.ModelProto:
        g = G()
        p5 = g.conv(g.qdq(block_input(g)))
        pooled = g.op("MaxPool", [p5], kernel_shape=[1, 1], strides=[2, 2])
        shape = g.op("Shape", [g.op("Cast", [pooled], to=1)])
        outs = [g.conv(g.qdq(p5)), g.conv(g.qdq(pooled)), g.op("Cast", [shape], to=1)]
        if float_reader:
            outs.append(g.op("Sigmoid", [pooled]))
        return g.model(outs)

    assert "P04" not in lint(model(False)).rules()
    assert "P04" in lint(model(True)).rules()  # a real float reader of the pooled tensor
