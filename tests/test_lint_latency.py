"""``qdq lint --latency`` (issue 58 part 3): the lint verdict, then the predicted engine time on the
target's GPU against the FP16 build; ``--shape``, ``--gpu``, the JSON fields and the one-line
errors (exit 3), on tiny Q/DQ graphs built with onnx.helper."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from lint_graphs import G
from qdq.cli.lint import parse_shapes
from qdq.cli.main import main

A100 = "NVIDIA A100 SXM4 40 GB"


def _save(model: onnx.ModelProto, path: Path) -> str:
    onnx.save(model, str(path))
    return str(path)


def _conv(shape: tuple) -> onnx.ModelProto:
    """One quantized 3x3 convolution: the linter says PASS (exit 0)."""
    g = G()
    return g.model([g.conv(g.qdq("x"))], shape=shape)


def _block(shape: tuple = (32, 64, 56, 56)) -> onnx.ModelProto:
    """A residual block whose Add reads a float skip: WARN (exit 1), with standalone Quantize
    nodes that make quantization not pay."""
    g = G()
    x = g.op("Relu", [g.bn(g.conv(g.qdq("x")))])
    x = g.op("Relu", [g.op("Add", [g.bn(g.conv(g.qdq(x))), x])])
    return g.model([g.conv(g.qdq(x))], shape=shape)


def _fp8_conv() -> onnx.ModelProto:
    """A convolution with FP8 (E4M3) Q/DQ on its input and per-tensor weights, opset 19."""
    g = G()
    w = g.qdq(g.const(np.full((64, 64, 3, 3), 0.1, np.float32), "w"), 0.01)
    y = g.op("Conv", [g.qdq("x"), w], pads=[1, 1, 1, 1])
    model = g.model([y], shape=(32, 64, 56, 56), opset=19)
    for k, t in enumerate(model.graph.initializer):
        if t.data_type == TensorProto.INT8:  # the zero points
            n = max(1, int(onnx.numpy_helper.to_array(t).size))
            fp8 = helper.make_tensor(t.name, TensorProto.FLOAT8E4M3FN, t.dims, [0.0] * n)
            model.graph.initializer[k].CopyFrom(fp8)
    return model


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["lint", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("latency")
    return {
        "conv": _save(_conv((32, 64, 56, 56)), d / "conv.onnx"),
        "block": _save(_block(), d / "block.onnx"),
        "dynamic": _save(_conv(("N", 64, 56, 56)), d / "dynamic.onnx"),
        "fp8": _save(_fp8_conv(), d / "fp8.onnx"),
    }


# ------------------------------------------------------------------ text and exit codes
def test_text_follows_the_verdict_and_keeps_its_exit_code(
    capsys: pytest.CaptureFixture[str], models: dict[str, str]
) -> None:
    for name, verdict in (("conv", 0), ("block", 1)):
        plain, plain_out, _ = _run(capsys, models[name], "--target", "trt10-a100")
        code, out, err = _run(capsys, models[name], "--target", "trt10-a100", "--latency")
        assert code == plain == verdict, err
        assert out.startswith(plain_out)  # the lint text unchanged, the latency after it
        extra = out[len(plain_out) :]
        assert f"predicted engine time on {A100} (trt10-a100)" in extra
        assert "Q/DQ engine" in extra and "FP16 build" in extra and "slowest layers" in extra
        assert "predicted engine time" not in plain_out
    _, out, _ = _run(capsys, models["block"], "--target", "trt10-a100", "--latency")
    assert "does not pay" in out  # the float skip's standalone Quantize nodes


def test_a_generation_target_times_its_representative(
    capsys: pytest.CaptureFixture[str], models: dict[str, str]
) -> None:
    code, out, err = _run(capsys, models["conv"], "--target", "trt10-ampere", "--latency")
    assert code == 0, err
    assert f"on {A100} (trt10-ampere)" in out and "representative" in out


# ------------------------------------------------------------------ JSON
def test_json_has_latency_totals_and_each_layers_ms(
    capsys: pytest.CaptureFixture[str], models: dict[str, str]
) -> None:
    _, plain, _ = _run(capsys, models["block"], "--target", "trt10-a100", "--json")
    code, out, err = _run(capsys, models["block"], "--target", "trt10-a100", "--latency", "--json")
    assert code == 1, err
    lint_doc, doc = json.loads(plain), json.loads(out)
    assert "latency" not in lint_doc and "total_ms" not in lint_doc
    lat = doc["latency"]
    assert {"total_ms", "fp16_total_ms", "speedup_vs_fp16", "layers", "not_paying", "gpu",
            "gpu_note"} <= set(lat)  # fmt: skip
    assert lat["gpu"] == "a100-sxm4-40gb" and lat["gpu_note"] == "" and lat["not_paying"]
    for key in ("total_ms", "fp16_total_ms", "speedup_vs_fp16"):
        assert doc[key] == lat[key]
    assert doc["speedup_vs_fp16"] == pytest.approx(doc["fp16_total_ms"] / doc["total_ms"], 1e-3)
    # the lint layers keep their fields and gain their time; the builder's reformats, which the
    # linter does not list, are only in latency.layers
    assert [{k: v for k, v in ly.items() if k != "ms"} for ly in doc["layers"]] == lint_doc[
        "layers"
    ]
    assert all(ly["ms"] > 0 for ly in doc["layers"])
    timed = {ly["name"]: ly["ms"] for ly in lat["layers"]}
    assert all(timed[ly["name"]] == ly["ms"] for ly in doc["layers"])
    reformats = [ly["ms"] for ly in lat["layers"] if ly["type"] == "reformat"]
    assert reformats and len(lat["layers"]) == len(doc["layers"]) + len(reformats)
    total = sum(ly["ms"] for ly in doc["layers"]) + sum(reformats)
    assert total == pytest.approx(doc["total_ms"], rel=1e-4)


# ------------------------------------------------------------------ --shape
def test_parse_shapes() -> None:
    assert parse_shapes([]) == {}
    assert parse_shapes(["x:32x3x224x224", "mask:32X128"]) == {
        "x": (32, 3, 224, 224),
        "mask": (32, 128),
    }
    assert parse_shapes(["input:0:1x3"]) == {"input:0": (1, 3)}  # a TensorFlow-style name
    for spec, message in (
        ("x", "expected NAME:DIMS"),
        (":1x3", "expected NAME:DIMS"),
        ("x:", "expected NAME:DIMS"),
        ("x:1xax3", "'a' is not an integer"),
        ("x:1x3.5", "'3.5' is not an integer"),
        ("x:1xx3", "'' is not an integer"),
        ("x:0x3", "must be positive, got 0"),
        ("x:1x-3", "must be positive, got -3"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_shapes([spec])
    with pytest.raises(ValueError, match="'x' is given twice"):
        parse_shapes(["x:1x3", "x:2x3"])


def test_dynamic_input_needs_a_shape_and_more_work_is_not_faster(
    capsys: pytest.CaptureFixture[str], models: dict[str, str]
) -> None:
    args = (models["dynamic"], "--target", "trt10-a100", "--latency")
    code, out, err = _run(capsys, *args)
    assert code == 3 and out == ""
    assert err.count("\n") == 1 and err.startswith("qdq lint: error: ")
    assert "'x'" in err and "dynamic" in err and "--shape x:" in err
    totals = []
    for batch in (8, 32):
        code, out, err = _run(capsys, *args, "--shape", f"x:{batch}x64x56x56", "--json")
        assert code == 0, err
        totals.append(json.loads(out)["total_ms"])
    assert totals[0] < totals[1]
    _, out, _ = _run(capsys, models["conv"], "--target", "trt10-a100", "--latency", "--json")
    assert json.loads(out)["total_ms"] == pytest.approx(totals[1])  # the static model's size


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ("x:0x64x56x56", "--shape 'x:0x64x56x56': every dimension must be positive"),
        ("x-32x64", "--shape 'x-32x64': expected NAME:DIMS"),
        ("x:32x64x56xq", "dimension 'q' is not an integer"),
        ("y:32x64x56x56", "'y', which is no input"),
        ("x:32x64x56", "3 dims given, the input has 4"),
        ("x:99999999999999999999x64x56x56", "does not fit in 64 bits"),
    ],
)
def test_bad_shapes_are_one_line_errors(
    capsys: pytest.CaptureFixture[str], models: dict[str, str], shape: str, message: str
) -> None:
    code, out, err = _run(
        capsys, models["dynamic"], "--target", "trt10-a100", "--latency", "--shape", shape
    )
    assert code == 3 and out == "" and err.count("\n") == 1
    assert err.startswith("qdq lint: error: ") and message in err and "Traceback" not in err


# ------------------------------------------------------------------ the GPU
def test_gpu_option_and_no_gpu(capsys: pytest.CaptureFixture[str], models: dict[str, str]) -> None:
    code, out, err = _run(capsys, models["conv"], "--target", "trt10", "--latency")
    assert code == 3 and out == "" and err.count("\n") == 1
    assert "'trt10' names no GPU" in err and "trt10-a100" in err and "--gpu" in err
    code, out, err = _run(capsys, models["conv"], "--target", "trt10", "--latency", "--gpu", "l4")
    assert code == 0, err
    assert "on NVIDIA L4 (trt10)" in out
    _, a100, _ = _run(capsys, models["conv"], "--target", "trt10-a100", "--latency", "--json")
    code, l4, err = _run(
        capsys, models["conv"], "--target", "trt10-a100", "--latency", "--gpu", "L4", "--json"
    )
    assert code == 0, err
    assert json.loads(l4)["latency"]["gpu"] == "l4"  # --gpu overrides the target's GPU
    assert json.loads(l4)["total_ms"] > json.loads(a100)["total_ms"]  # L4: a quarter of the bytes/s
    code, out, err = _run(
        capsys, models["conv"], "--target", "trt10", "--latency", "--gpu", "a1000"
    )
    assert code == 3 and out == "" and "unknown GPU 'a1000'" in err and "--list-gpus" in err


def test_shape_and_gpu_need_latency(
    capsys: pytest.CaptureFixture[str], models: dict[str, str]
) -> None:
    for extra in (("--shape", "x:1x64x56x56"), ("--gpu", "a100")):
        code, out, err = _run(capsys, models["conv"], "--target", "trt10-a100", *extra)
        assert code == 3 and out == ""
        assert f"{extra[0]} is only read with --latency" in err


def test_fp8_on_a_gpu_without_fp8(
    capsys: pytest.CaptureFixture[str], models: dict[str, str]
) -> None:
    fp8 = (models["fp8"], "--target", "trt10-a100", "--flags", "int8,fp16,fp8", "--latency")
    code, out, err = _run(capsys, *fp8)
    assert code == 3 and out == "" and err.count("\n") == 1
    assert "no FP8 kernels" in err and "A100" in err and "--gpu" in err
    plain, _, _ = _run(capsys, *fp8[:-1])
    code, out, err = _run(capsys, *fp8, "--gpu", "h100-sxm", "--json")
    assert code == plain == 2, err  # the lint verdict (F01: no FP8 on the A100), timed on an H100
    layers = json.loads(out)["latency"]["layers"]
    assert "fp8" in {ly["precision"] for ly in layers if ly["type"] == "conv"}
