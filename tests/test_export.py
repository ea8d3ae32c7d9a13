"""Q/DQ ONNX export: parity with ONNX Runtime, structure, manifest, bad input."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from torch import nn

import qdq
from qdq.backends.onnxruntime import parity, run, session
from qdq.export import ExportError, find_manifest, graph_summary

pytest.importorskip("onnxruntime")
fm = pytest.importorskip("qdq.zoo.fashion_mnist")


@pytest.fixture(scope="module")
def fashion() -> tuple[nn.Module, nn.Module, torch.Tensor]:
    model = fm.load_pretrained()
    images, _ = fm.load_split("test")
    prepared = qdq.prepare(model, (images[:2],))
    qdq.calibrate(prepared, fm.calibration_batches(), show_progress=False)
    return model, prepared, images[:1000]


def _step(prepared: nn.Module, path: str) -> float:
    return float(prepared.get_submodule(path).amax.max()) / 127


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("opset", [13, 17])
def test_parity_with_onnx_runtime(fashion, tmp_path: Path, exporter: str, opset: int) -> None:
    _, prepared, images = fashion
    out = qdq.export_onnx(
        prepared, (images[:2],), tmp_path / "m.onnx", exporter=exporter, opset=opset
    )
    assert out.exporter == exporter and out.opset == opset
    assert onnx.load(str(out.path)).opset_import[0].version == opset
    report = parity(
        prepared, out.path, [images[i : i + 250] for i in range(0, 1000, 250)], per_layer=True
    )
    assert report.top1_agreement is not None and report.top1_agreement >= 0.998
    assert report.min_cosine > 0.99999 and report.max_rel_diff < 5e-3
    layers = report.layers
    # every activation quantizer compared by name (fc stays float by P14, and with it layer3's
    # downsample skip: the last block's fused output is float, P03)
    assert len(layers) == 8
    # the first quantizer reads the network input: bit-identical, 0 differing codes
    assert layers["conv1.input_quantizer"].differing_codes == 0
    assert layers["layer1.conv1.input_quantizer"].differing_codes == 0
    for path, lp in layers.items():
        assert lp.qdq_mismatches == 0, path  # every Q/DQ is bit-exact given the same input
        # after float ops the frameworks accumulate in different orders: values within float
        # rounding of a code boundary land on the neighbouring code, and such flips propagate a
        # little downstream; they stay rare and a few steps at most
        assert lp.max_abs_diff <= 4 * _step(prepared, path) * 1.001, path
        assert lp.code_mismatch_rate < 1e-3, path


def test_single_layer_is_exact(tmp_path: Path) -> None:
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 36, 32)
    ).eval()
    x = torch.randn(8, 3, 8, 8)
    prepared = qdq.prepare(model, (x,))
    qdq.calibrate(prepared, [torch.randn(8, 3, 8, 8) for _ in range(3)], show_progress=False)
    out = qdq.export_onnx(prepared, (x,), tmp_path / "m.onnx")
    report = parity(prepared, out.path, [x], per_layer=True)
    assert report.layers["0.input_quantizer"].differing_codes == 0
    assert report.max_rel_diff < 1e-5


def test_structure_names_and_dynamic_batch(fashion, tmp_path: Path) -> None:
    _, prepared, images = fashion
    out = qdq.export_onnx(prepared, (images[:2],), tmp_path / "m.onnx")
    model = onnx.load(str(out.path))
    names = {n.name for n in model.graph.node}
    assert {"layer1.conv1/Conv", "layer1.conv1.input_quantizer/QuantizeLinear"} <= names
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            assert inits[node.input[2]].dtype == np.int8 and not inits[node.input[2]].any()
            assert (inits[node.input[1]] > 0).all()
            if "weight_quantizer" in node.name:
                assert node.attribute[0].name == "axis" and node.attribute[0].i == 0
    consumers: dict[str, int] = {}
    for node in model.graph.node:
        for i in node.input:
            consumers[i] = consumers.get(i, 0) + 1
    dq_outputs = [n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"]
    assert all(consumers[o] == 1 for o in dq_outputs)  # one DQ per consumer
    assert out.num_quantize == 17 and out.num_dequantize == 20
    sess = session(out.path)
    for batch in (1, 3, 5):
        assert run(sess, [images[:batch]])[0].shape == (batch, 10)


def test_manifest_round_trip(fashion, tmp_path: Path) -> None:
    model, prepared, images = fashion
    out = qdq.export_onnx(prepared, (images[:2],), tmp_path / "m.onnx")
    doc = json.loads(out.manifest_path.read_text())
    assert doc["schema"] == "qdq.manifest/1" and doc["opset"] == 17
    entries = {e["path"]: e for e in doc["quantizers"]}
    conv1 = entries["layer1.conv1.input_quantizer"]
    assert conv1["rule"] == "P01" and conv1["members"] == [
        "layer1.conv1:input",
        "layer1.add:input1",
    ]
    assert conv1["onnx_nodes"][0] == "layer1.conv1.input_quantizer/QuantizeLinear"
    assert len(entries["layer1.conv1.weight_quantizer"]["amax"]) == 16
    fresh = qdq.prepare(model, (images[:2],))
    qdq.load_calibration(fresh, out.manifest_path)
    assert torch.equal(fresh(images[:50]), prepared(images[:50]))


def test_manifest_records_the_method_behind_each_amax(fashion, tmp_path: Path) -> None:
    """Calibrated with the default (mse), then switched: the manifest names the method that
    produced the amax it stores, and a loaded calibration carries that record on."""
    model, prepared, images = fashion
    path = "layer1.conv1.input_quantizer"
    try:
        qdq.recompute_amax(prepared, "percentile", percentile=99.9)
        out = qdq.export_onnx(prepared, (images[:2],), tmp_path / "m.onnx")
        entries = {e["path"]: e for e in json.loads(out.manifest_path.read_text())["quantizers"]}
        assert entries[path]["method"] == "percentile" and entries[path]["percentile"] == 99.9
        assert entries["layer1.conv1.weight_quantizer"]["method"] == "max"
        fresh = qdq.load_calibration(qdq.prepare(model, (images[:2],)), out.manifest_path)
        q = fresh.get_submodule(path)
        assert (q.amax_method, q.amax_percentile) == ("percentile", 99.9)
        qdq.recompute_amax(prepared, "max")
        assert prepared.get_submodule(path).amax_method == "max"
        prepared.get_submodule(path).set_amax(1.0)
        assert prepared.get_submodule(path).amax_method == "set"
    finally:
        qdq.recompute_amax(prepared)  # the module fixture's own calibration (mse)
    assert prepared.get_submodule(path).amax_method == "mse"


def test_manifest_path_and_find_manifest(fashion, tmp_path: Path) -> None:
    model, prepared, images = fashion
    out = qdq.export_onnx(
        prepared, (images[:2],), tmp_path / "a.onnx", manifest_path=tmp_path / "manifest.json"
    )
    assert out.manifest_path == tmp_path / "manifest.json"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.onnx", "manifest.json"]
    assert find_manifest(out.path) == tmp_path / "manifest.json"
    fresh = qdq.load_calibration(qdq.prepare(model, (images[:2],)), out.manifest_path)
    assert torch.equal(fresh(images[:20]), prepared(images[:20]))
    # a manifest.json naming another file is not taken; X.onnx.manifest.json comes first
    (tmp_path / "b.onnx").write_bytes(out.path.read_bytes())
    with pytest.raises(FileNotFoundError, match=r"b\.onnx\.manifest\.json nor .*manifest\.json"):
        find_manifest(tmp_path / "b.onnx")
    own = qdq.export_onnx(prepared, (images[:2],), tmp_path / "b.onnx", overwrite=True)
    assert find_manifest(tmp_path / "b.onnx") == own.manifest_path
    with pytest.raises(ValueError, match="must lie in the directory"):
        qdq.export_onnx(prepared, (images[:2],), tmp_path / "c.onnx",
                        manifest_path=tmp_path / "sub" / "manifest.json")  # fmt: skip


def test_manifest_errors(fashion, tmp_path: Path) -> None:
    _, prepared, images = fashion
    with pytest.raises(FileNotFoundError):
        qdq.load_calibration(prepared, tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "other/9"}))
    with pytest.raises(ValueError, match="expected schema"):
        qdq.load_calibration(prepared, bad)
    other = qdq.prepare(nn.Sequential(nn.Conv2d(1, 16, 3)), (images[:1],))
    qdq.calibrate(other, [images[:8]], show_progress=False)
    res = qdq.export_onnx(other, (images[:1],), tmp_path / "o.onnx")
    with pytest.raises(ValueError, match="belongs to another model"):
        qdq.load_calibration(prepared, res.manifest_path)


def test_bad_input(fashion, tmp_path: Path) -> None:
    model, prepared, images = fashion
    args = (images[:2],)
    with pytest.raises(ValueError, match="opset must be an int in 13..21"):
        qdq.export_onnx(prepared, args, tmp_path / "a.onnx", opset=12)
    with pytest.raises(ValueError, match="exporter must be one of"):
        qdq.export_onnx(prepared, args, tmp_path / "a.onnx", exporter="tvm")
    with pytest.raises(ValueError, match="before calibration"):
        qdq.export_onnx(qdq.prepare(model, args), args, tmp_path / "a.onnx")
    broken = qdq.prepare(model, args)
    state = {k: v.clone() for k, v in prepared.state_dict().items()}
    state["layer2.conv1.input_quantizer.amax"] = torch.tensor(float("nan"))
    broken.load_state_dict(state)
    with pytest.raises(ValueError, match="'layer2.conv1.input_quantizer' amax has non-finite"):
        qdq.export_onnx(broken, args, tmp_path / "a.onnx")
    (tmp_path / "exists.onnx").write_bytes(b"old")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        qdq.export_onnx(prepared, args, tmp_path / "exists.onnx")
    assert (tmp_path / "exists.onnx").read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exists.onnx"]  # nothing half-written
    with pytest.raises(ValueError, match="not returned by qdq.prepare"):
        qdq.export_onnx(model, args, tmp_path / "a.onnx")


def test_dead_channels_are_floored_with_a_warning(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Conv2d(3, 16, 3)).eval()
    with torch.no_grad():
        model[0].weight[5].zero_()
        model[0].weight[9].zero_()
    x = torch.randn(2, 3, 8, 8)
    prepared = qdq.prepare(model, (x,))
    qdq.calibrate(prepared, [x], show_progress=False)
    with pytest.warns(UserWarning, match=r"0.weight_quantizer: channels \[5, 9\]"):
        out = qdq.export_onnx(prepared, (x,), tmp_path / "m.onnx")
    assert out.floored == {"0.weight_quantizer": [5, 9]}
    scales = [
        numpy_helper.to_array(i)
        for i in onnx.load(str(out.path)).graph.initializer
        if "scale" in i.name
    ]
    assert all((s > 0).all() for s in scales)
    assert parity(prepared, out.path, [x]).max_rel_diff < 1e-5


def test_structural_check_catches_a_missing_dequantize(fashion, tmp_path: Path) -> None:
    from qdq.export.validate import validate_export

    _, prepared, images = fashion
    out = qdq.export_onnx(prepared, (images[:2],), tmp_path / "m.onnx")
    model = onnx.load(str(out.path))
    conv = next(n for n in model.graph.node if n.name == "layer2.conv2/Conv")
    dq = next(n for n in model.graph.node if n.output[0] == conv.input[0])
    q = next(n for n in model.graph.node if n.output[0] == dq.input[0])
    conv.input[0] = q.input[0]  # bypass the activation Q/DQ
    with pytest.raises(
        ExportError, match="layer2.conv2: layer2.conv2/Conv reads a float activation"
    ):
        validate_export(model, qdq.plan_of(prepared))


def test_validation_runs_strict_type_checked_shape_inference() -> None:
    """One pass (``check_model(full_check=True)``) type-checks and shape-infers strictly: a
    declared output type that contradicts what the graph computes is refused."""
    from onnx import TensorProto, helper

    from qdq.export.validate import validate_export

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ExportError, match="shape inference failed.*elem type differs"):
        validate_export(model, None)  # refused before the plan is read


def test_graph_summary_lists_dq_inputs(fashion, tmp_path: Path) -> None:
    _, prepared, images = fashion
    out = qdq.export_onnx(prepared, (images[:2],), tmp_path / "m.onnx", exporter="torchscript")
    text = graph_summary(onnx.load(str(out.path)))
    assert "layer1.conv1/Conv  Conv  in=[DQ, DQ" in text
    assert text.startswith("ops: ") and "QuantizeLinear 17" in text


@pytest.mark.parametrize(("exporter", "opset"), [("dynamo", 17), ("torchscript", 19)])
def test_fp16_remainder(fashion, tmp_path: Path, exporter: str, opset: int) -> None:
    _, prepared, images = fashion
    out = qdq.export_onnx(
        prepared, (images[:2],), tmp_path / "m.onnx", exporter=exporter, opset=opset, fp16=True
    )
    model = onnx.load(str(out.path))
    fp16 = onnx.TensorProto.FLOAT16
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT  # I/O kept
    bn = [i for i in model.graph.initializer if i.name.endswith("running_var")]
    assert bn and all(i.data_type == fp16 for i in bn)  # the float remainder is FP16
    scales = [i for i in model.graph.initializer if i.name.endswith("export_scale")]
    expected = fp16 if opset >= 19 else onnx.TensorProto.FLOAT
    assert scales and all(i.data_type == expected for i in scales)
    report = parity(prepared, out.path, [images[i : i + 250] for i in range(0, 1000, 250)])
    assert report.min_cosine > 0.9999 and report.top1_agreement >= 0.99  # type: ignore[operator]


def test_torchscript_names_survive_equal_scales(tmp_path: Path) -> None:
    # TorchScript de-duplicates equal initializers, so scale names cannot identify quantizers
    model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Conv2d(16, 16, 3)).eval()
    x = torch.randn(2, 3, 10, 10)
    prepared = qdq.prepare(model, (x,))
    qdq.calibrate(prepared, [x], show_progress=False)
    for path in ("0.input_quantizer", "2.input_quantizer"):
        prepared.get_submodule(path).set_amax(2.0)
    out = qdq.export_onnx(prepared, (x,), tmp_path / "m.onnx", exporter="torchscript")
    names = [n.name for n in onnx.load(str(out.path)).graph.node if n.op_type == "QuantizeLinear"]
    assert names == [
        "0.input_quantizer/QuantizeLinear",
        "0.weight_quantizer/QuantizeLinear",
        "2.input_quantizer/QuantizeLinear",
        "2.weight_quantizer/QuantizeLinear",
    ]
    report = parity(prepared, out.path, [x], per_layer=True)
    assert all(lp.qdq_mismatches == 0 for lp in report.layers.values())


class _ListScaledUp(nn.Module):
    """Upsampling by a buffer read as Python numbers, as onnx2torch's Resize does: torch.export
    fails inside this module, the TorchScript tracer does not."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scales", torch.tensor([1.0, 1.0, 2.0, 2.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scales = self.scales.tolist()
        return nn.functional.interpolate(x, scale_factor=scales[2:])


def test_fallback_after_a_failed_dynamo_export_keeps_every_quantizer(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), _ListScaledUp(), nn.Conv2d(32, 32, 3, padding=1)
    ).eval()
    x = torch.randn(2, 16, 8, 8)
    prepared = qdq.prepare(model, (x[:1],))
    qdq.calibrate(prepared, [x], method="max", show_progress=False)
    depth = torch._C._len_torch_function_stack()
    with pytest.warns(UserWarning, match="dynamo export failed"):
        out = qdq.export_onnx(prepared, (x[:1],), tmp_path / "m.onnx", exporter="auto")
    # before the fix, the failed torch.export left the call tracker active and the fallback
    # trace lost the weight quantizers ("weight DequantizeLinear does not feed a Conv")
    assert out.exporter == "torchscript" and out.num_quantize == 4
    assert torch._C._len_torch_function_stack() == depth
    ref = prepared(x)
    got = torch.from_numpy(run(session(out.path), [x])[0])
    assert torch.allclose(got, ref, atol=1e-5)


class _ShapeOnlyProjection(nn.Module):
    """A conv reading a tensor computed from the input's shape only (EdgeNeXt's positional
    encoding): exporters fold that branch into a constant."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 32, 3, padding=1)
        self.proj = nn.Conv2d(16, 32, 1)
        self.out = nn.Conv2d(32, 32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        b, _, h, w = y.shape
        pos = torch.ones(b, h, w, 8).cumsum(1)
        pos = torch.cat([pos.sin(), pos.cos()], dim=-1).permute(0, 3, 1, 2)
        return self.out(y + self.proj(pos))


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_a_conv_on_a_shape_only_input_stays_float_and_exports(exporter: str, tmp_path) -> None:
    torch.manual_seed(0)
    x = torch.randn(1, 3, 8, 8)
    prepared = qdq.prepare(_ShapeOnlyProjection().eval(), (x,))
    point = qdq.plan_of(prepared).point("proj:weight")
    assert not point.quantized and "shapes and constants only" in point.reason
    assert qdq.plan_of(prepared).point("out:weight").quantized
    qdq.calibrate(prepared, [torch.randn(2, 3, 8, 8)], show_progress=False)
    # with a weight Q/DQ planned there, the export was refused: "reads a float activation"
    result = qdq.export_onnx(prepared, (x,), tmp_path / "m.onnx", exporter=exporter)
    with torch.no_grad():
        want = prepared(x)
    (got,) = run(session(result.path), [x])
    assert np.allclose(got, want.numpy(), atol=1e-5)


class _TwinBranches(nn.Module):
    """Two identical depthwise branches on one input, as YOLOv10 builds its one-to-one head
    (``copy.deepcopy`` of the one-to-many head, identical until trained)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, padding=1)
        self.a = nn.Sequential(nn.Conv2d(32, 32, 3, padding=1, groups=32), nn.ReLU())
        self.b = copy.deepcopy(self.a)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        return torch.cat([self.a(x), self.b(x)], 1)


def test_auto_falls_back_when_an_exporter_drops_planned_qdq(tmp_path) -> None:
    torch.manual_seed(0)
    x = torch.randn(1, 3, 16, 16)
    prepared = qdq.prepare(_TwinBranches().eval(), (x,))
    qdq.calibrate(prepared, [torch.randn(2, 3, 16, 16)], show_progress=False)
    # the dynamo exporter merges the two identical Q/DQ + Conv chains (torch 2.14): b's are gone
    with pytest.raises(ExportError, match=r"b\.0: weight DequantizeLinear does not feed"):
        qdq.export_onnx(prepared, (x,), tmp_path / "d.onnx", exporter="dynamo")
    with pytest.warns(UserWarning, match="dynamo export failed"):
        result = qdq.export_onnx(prepared, (x,), tmp_path / "m.onnx")  # exporter="auto"
    assert result.exporter == "torchscript"
    with torch.no_grad():
        want = prepared(x)
    (got,) = run(session(result.path), [x])
    assert float(np.abs(got - want.numpy()).max()) < 0.02  # a rare one-code rounding flip
