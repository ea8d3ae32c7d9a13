"""Engine layer-information reader on real trtexec reports (the in-repository fixtures,
``tests/fixtures/trt-engines/``) and synthetic ones."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from qdq.lint.engine_report import (
    DTYPES,
    EngineReport,
    load_engine_report,
    normalize_dtype,
    parse_engine_report,
)
from trt_engines import FILES, KINDS, PREFIXES, TIMED, TRT_ENGINES, engine_file

# the fixtures' README: sum of per-layer median times, ResNet-18, A100, batch 32
README_MS = {"resnet18-a100-fp32": 2.12, "resnet18-a100-fp16": 1.02, "resnet18-a100-qat": 1.10}


def _load(prefix: str) -> EngineReport:
    return load_engine_report(
        engine_file(prefix),
        engine_file(prefix, "profile"),
        engine_file(prefix, "build.metadata"),
    )


def _dtypes(report: EngineReport) -> set[str | None]:
    tensors = [t for x in report.layers for t in (*x.inputs, *x.outputs)]
    return {t.dtype for t in tensors} | {x.weights_dtype for x in report.layers if x.weights_dtype}


def test_the_fixtures_are_in_the_repository() -> None:
    # every engine's three files and the README (their origin) ship with the tests, so no test
    # that reads them can skip on a fresh clone; a missing one raises instead of skipping
    assert TRT_ENGINES.is_relative_to(Path(__file__).resolve().parent)
    expected = {f"{p}.{k}.json" for p in PREFIXES for k in KINDS} | {"README.md"}
    assert expected <= {*FILES, "README.md"}
    assert {x.name for x in TRT_ENGINES.iterdir()} == {*FILES, "README.md"}
    assert all((TRT_ENGINES / f"{p}.graph.json").is_file() for p in TIMED)
    assert all(engine_file(p, k).stat().st_size > 0 for p in PREFIXES for k in KINDS)
    with pytest.raises(FileNotFoundError, match="missing from the repository"):
        engine_file("resnet18-a100-int4")


@pytest.mark.parametrize("prefix", PREFIXES)
def test_every_fixture_parses(prefix: str) -> None:
    report = _load(prefix)
    raw = json.loads(engine_file(prefix).read_text())
    assert [x.name for x in report.layers] == [x["Name"] for x in raw["Layers"]]
    assert report.schema == "trt8-10"
    assert _dtypes(report) <= set(DTYPES)  # every tensor's format string understood
    assert [t.mode for t in report.io_tensors] == ["input", "output"]
    assert report.io_tensors[0].dtype == report.io_tensors[1].dtype == "fp32"
    assert report.unmatched_timings == {}  # every profile record names a layer
    assert report.build_precision is not None and report.build_precision.startswith("FP32")
    for layer in report.layers:
        assert layer.onnx_nodes, layer.name
        assert layer.is_qdq_reformat == (layer.is_reformat and layer.origin == "QDQ")


def test_resnet18_qat_engine() -> None:
    report = _load("resnet18-a100-qat")
    qdq = report.qdq_reformats()
    assert len(qdq) == 10
    assert all(x.name.startswith("QuantizeLinear_") for x in qdq)
    assert len(report.reformats()) == 12  # README: 12 reformats, 10 of them unfused Q/DQ
    assert len(report.reformats("REFORMAT")) == 2 and report.reformats("qdq") == qdq
    # the naive placement leaves the residual adds in FP16: fused into the conv, fed INT8 by the
    # conv input and FP16 by the skip branch, writing FP16
    adds = [x for x in report.layers if any(n.startswith("Add_") for n in x.onnx_nodes)]
    assert len(adds) == 8
    for layer in adds:
        assert layer.output_precision == "fp16", layer.name
        assert layer.input_precision == "int8", layer.name
        assert [t.dtype for t in layer.inputs] == ["int8", "fp16"]
        assert "i8f16" in (layer.tactic or "")
    convs = report.weighted_layers()
    assert len(convs) == 21 and all(x.input_precision == "int8" for x in convs)
    assert all(x.weights_dtype == "int8" for x in convs)
    assert set(report.int8_layers()) == set(convs)
    by_in = {k: len(v) for k, v in report.layers_by_precision().items()}
    by_out = {k: len(v) for k, v in report.layers_by_precision("output").items()}
    assert by_in == {"fp32": 4, "int8": 22, "fp16": 11}
    assert by_out == {"int8": 19, "fp32": 4, "fp16": 14}
    fp16_out_convs = {x.name.split(" + ")[0] for x in convs if x.output_precision == "fp16"}
    assert fp16_out_convs == {
        *(f"layer{i}.{j}.conv2.weight" for i in (1, 2, 3, 4) for j in (0, 1)),
        *(f"layer{i}.0.downsample.0.weight" for i in (2, 3, 4)),
    }


@pytest.mark.parametrize("prefix", ["resnet18-a100-qat", "mobilenet-qat"])
def test_fused_residual_input_has_the_output_precision(prefix: str) -> None:
    """What the linter's P03d rests on: every conv with a fused residual Add reads the residual
    operand in the precision it writes (FP16 in ResNet-18, FP16 or FP32 in MobileNetV2, including
    layer4.1, the last block before the float pool), so a quantized residual of a float-output
    fusion needs a standalone Dequantize. (No fixture has a quantized residual with a float
    output; the naive placement leaves every residual float.)"""
    fused = [
        x
        for x in _load(prefix).weighted_layers()
        if any(n.startswith("Add_") for n in x.onnx_nodes) and len(x.inputs) == 2
    ]
    assert len(fused) == (8 if prefix.startswith("resnet") else 10)
    assert all(x.inputs[1].dtype == x.output_precision != "int8" for x in fused)
    assert any(x.name.startswith("layer4.1.conv2") for x in fused) or prefix == "mobilenet-qat"


@pytest.mark.parametrize("prefix", ["resnet18-a100-fp32", "resnet18-a100-fp16"])
def test_float_builds_have_no_int8(prefix: str) -> None:
    report = _load(prefix)
    assert "int8" not in _dtypes(report)
    assert report.qdq_reformats() == () and report.int8_layers() == ()
    want = "fp32" if prefix.endswith("fp32") else "fp16"
    convs = report.weighted_layers()
    assert len(convs) == 21
    assert {(x.input_precision, x.output_precision, x.weights_dtype) for x in convs} == {
        (want,) * 3
    }


def test_mobilenet_qat_engine() -> None:
    report = _load("mobilenet-qat")
    assert len(report.qdq_reformats()) == 17 and len(report.reformats("REFORMAT")) == 1
    convs = report.weighted_layers()
    assert len(convs) == 53 and all(x.input_precision == "int8" for x in convs)
    assert report.profile_count == 6610


@pytest.mark.parametrize("prefix", sorted(README_MS))
def test_median_time_sum_matches_readme(prefix: str) -> None:
    total = _load(prefix).total_median_ms()
    assert total == pytest.approx(README_MS[prefix], rel=0.02)


def test_qat_is_slower_than_fp16() -> None:
    fp16, qat = _load("resnet18-a100-fp16"), _load("resnet18-a100-qat")
    assert qat.total_median_ms() > fp16.total_median_ms()


def test_find_maps_onnx_nodes_to_fused_layers() -> None:
    report = _load("resnet18-a100-qat")
    conv = report.find("Conv_34")
    assert conv is not None
    assert conv.name == "layer1.0.conv2.weight + QuantizeLinear_32 + Conv_34 + Add_36 + Relu_37"
    assert report.find("Relu_37") is conv and report.find("QuantizeLinear_32") is conv
    q = report.find("QuantizeLinear_40")
    assert q is not None and q.is_qdq_reformat
    assert report.find("Conv_0") is None
    clip = _load("mobilenet-qat").find("Clip_16")  # inside PWN(...)
    assert clip is not None and clip.name.endswith("Conv_12 + PWN(Clip_16)")
    assert _load("resnet18-a100-fp32").find("Gemm_48") is not None


# TRT 11 writes the format and the data type as separate fields
_VEC = "wide channel vectorized row major format"
_SPLIT = {
    "Row major linear FP32": ("Row major linear format (kLINEAR)", "Float"),
    "Four wide channel vectorized row major Int8 format": (f"Four {_VEC} (kCHW4)", "Int8"),
    "Thirty-two wide channel vectorized row major Int8 format": (f"Thirty-two {_VEC} (kCHW32)", "Int8"),
    "Thirty-two wide channel vectorized row major FP16 format": (f"Thirty-two {_VEC} (kCHW32)", "Half"),
    "Two wide channel vectorized row major FP16 format": (f"Two {_VEC} (kCHW2)", "Half"),
}  # fmt: skip


def _as_trt11(raw: dict[str, Any]) -> list[dict[str, Any]]:
    layers = copy.deepcopy(raw["Layers"])
    for layer in layers:
        for tensor in (*layer["Inputs"], *layer["Outputs"]):
            fmt, dtype = _SPLIT[tensor.pop("Format/Datatype")]
            tensor["Format"], tensor["DataType"] = fmt, dtype
    return layers


def _signature(report: EngineReport) -> list[tuple[Any, ...]]:
    return [
        (x.name, x.layer_type, x.input_precision, x.output_precision, x.is_qdq_reformat,
         tuple(t.dtype for t in x.inputs), tuple(t.dims for t in x.outputs), x.onnx_nodes)
        for x in report.layers
    ]  # fmt: skip


def test_trt11_schema_parses_the_same(tmp_path: Path) -> None:
    raw = json.loads(engine_file("resnet18-a100-qat").read_text())
    layers = _as_trt11(raw)
    io = [
        {"Name": "input.1", "IOMode": "Input", "DataType": "Float", "Dimensions": [32, 3, 224, 224],
         "Location": "Device", "IsShapeInferenceIO": False,
         "ProfileInfo": [{"MinShape": [32, 3, 224, 224], "OptShape": [32, 3, 224, 224],
                          "MaxShape": [32, 3, 224, 224],
                          "Format": "Row major linear FP32 format (kLINEAR)"}]},
        {"Name": "422", "IOMode": "Output", "DataType": "Float", "Dimensions": [32, 1000],
         "Location": "Device", "IsShapeInferenceIO": False, "ProfileInfo": []},
    ]  # fmt: skip
    (tmp_path / "obj.json").write_text(json.dumps({"Layers": layers, "I/O Tensors": io}))
    (tmp_path / "list.json").write_text(json.dumps(layers))
    profile = engine_file("resnet18-a100-qat", "profile")
    original = _load("resnet18-a100-qat")
    for name in ("obj.json", "list.json"):
        report = load_engine_report(tmp_path / name, profile)
        assert report.schema == "trt11"
        assert _signature(report) == _signature(original)
        assert len(report.qdq_reformats()) == 10
        assert report.total_median_ms() == pytest.approx(original.total_median_ms())
    report = load_engine_report(tmp_path / "obj.json")
    assert [(t.name, t.mode, t.dims, t.dtype) for t in report.io_tensors] == [
        ("input.1", "input", (32, 3, 224, 224), "fp32"),
        ("422", "output", (32, 1000), "fp32"),
    ]
    assert report.io_tensors[0].format.endswith("(kLINEAR)")


def test_metadata_horizontal_fusion_profiles_and_scale_qdq() -> None:
    half = {"Name": "h", "Dimensions": [1, 8], "Format/Datatype": "Half"}
    int8 = {"Name": "q", "Dimensions": [1, 8], "Format/Datatype": "Int8"}
    layers = [
        {"Name": "__myl_MulAdd_0", "LayerType": "kgen", "Inputs": [half], "Outputs": [half],
         "Metadata": "[ONNX Layer: /blocks.0/Mul]\x1e[ONNX Layer: /blocks.0/Add]\x1f[ONNX Layer: /x]"},
        {"Name": "Conv_1 || Conv_2", "LayerType": "CaskConvolution", "ParameterType": "Convolution",
         "Inputs": [int8], "Outputs": [int8], "Weights": {"Type": "Int8", "Count": 8}},
        {"Name": "Conv_1 || Conv_2 [profile 1]", "LayerType": "CaskConvolution",
         "Inputs": [int8], "Outputs": [int8]},
        {"Name": "QuantizeLinear_3", "LayerType": "Scale", "ParameterType": "Scale",
         "Inputs": [half], "Outputs": [int8]},
        {"Name": "PWN(PWN(Sigmoid_4), Mul_5)", "LayerType": "PointWiseV2",
         "Inputs": [half], "Outputs": [half]},
        {"Name": "gemm", "LayerType": "gemm", "Inputs": [int8, {"Name": "w", "Format/Datatype": "Int8"}],
         "Outputs": [half], "Constants": [{"Name": "q", "Format/Datatype": "Int8"}]},
        {"Name": "DequantizeLinear_6", "LayerType": "Scale", "Inputs": [int8], "Outputs": [half]},
    ]  # fmt: skip
    report = parse_engine_report({"Layers": layers})
    assert report.layers[0].onnx_nodes == ("__myl_MulAdd_0", "/blocks.0/Mul", "/blocks.0/Add", "/x")
    assert report.find("/blocks.0/Add") is report.layers[0]
    assert report.find("Conv_2") is report.layers[1]
    assert report.find("Conv_2", profile=1) is report.layers[2]
    assert report.layers[2].profile == 1 and report.layers[2].onnx_nodes == ("Conv_1", "Conv_2")
    scales = (report.layers[3], report.layers[6])
    assert report.qdq_reformats() == scales  # trex QDQLinter: Scale whose input XOR output is Int8
    assert report.layers[4].onnx_nodes == ("Sigmoid_4", "Mul_5")
    assert report.find("Mul_5") is report.layers[4]
    gemm = report.layers[5]
    assert gemm.is_weighted and [t.name for t in gemm.compute_inputs] == ["w"]
    assert report.weighted_layers() == (report.layers[1], report.layers[2], gemm)
    assert report.int8_layers() == report.weighted_layers()  # not the DQ Scale reading INT8
    assert not report.has_timings
    with pytest.raises(ValueError, match="no timings"):
        report.total_median_ms()


@pytest.mark.parametrize(
    ("text", "dtype"),
    [
        ("Row major linear FP32", "fp32"),
        ("Channel major FP16 format where channel % 8 == 0", "fp16"),
        ("Row major linear BFloat16 format", "bf16"),
        ("Row major linear UInt8 format", "uint8"),
        ("Row major linear FP8 format", "fp8"),
        ("Row major linear Int64 format", "int64"),
        ("Row major linear BOOL", "bool"),
        ("Float", "fp32"),
        ("FP4", "fp4"),
        ("Int4", "int4"),
        ("kINT32", "int32"),
        ("DataType.HALF", "fp16"),
        ("Unknown format", None),
        (None, None),
    ],
)
def test_normalize_dtype(text: str | None, dtype: str | None) -> None:
    assert normalize_dtype(text) == dtype


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_engine_report(tmp_path / "nope.json")
    graph = engine_file("resnet18-a100-qat")
    with pytest.raises(FileNotFoundError, match="profile JSON"):
        load_engine_report(graph, tmp_path / "missing.profile.json")
    names_only = tmp_path / "names.json"
    names_only.write_text(json.dumps({"Layers": ["Conv_0 + Relu_1", "MaxPool_2"], "Bindings": []}))
    with pytest.raises(ValueError, match=r"profilingVerbosity=detailed"):
        load_engine_report(names_only)
    broken = tmp_path / "broken.json"
    broken.write_text('{"Layers": [')
    with pytest.raises(ValueError, match="not valid JSON"):
        load_engine_report(broken)
    with pytest.raises(ValueError, match="not valid JSON"):
        load_engine_report(graph, broken)
    with pytest.raises(ValueError, match="'Layers' list"):
        parse_engine_report({"layers": []})
    with pytest.raises(ValueError, match="must be JSON objects"):
        parse_engine_report([1, 2])
    with pytest.raises(ValueError, match="profile JSON must be a list"):
        parse_engine_report([], profile={"count": 1})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not JSON"):
        parse_engine_report("{")
