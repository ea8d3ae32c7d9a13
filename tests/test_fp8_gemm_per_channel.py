"""Per-channel FP8 GEMM weights where the target builds them (issue 49, rule F06): TensorRT scales
FP8 GEMMs per channel from 10.6 on Hopper and 10.7 on Ada. The planner keeps a GEMM's weight axis
with ``QuantConfig(fp8_gemm_per_channel=True)`` (convolutions stay per tensor), the job sets it
from its target, both exporters write per-axis FP8 Q/DQ that ONNX Runtime computes as torch does,
and the linter accepts them on such a target only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import qdq
from device_verbs import fp8_net
from qdq import QuantConfig
from qdq.lint import lint, parse_target

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


class Block(nn.Module):
    """An MLP block on tokens: two Linears and a transformers ``Conv1D``-style ``addmm`` whose
    parameter is (in, out), so its output channels are its last axis."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 64)
        # output channels five decades apart: per tensor, the small ones lose their precision
        scale = torch.logspace(-5, 0, 64)
        self.proj_weight = nn.Parameter(torch.randn(64, 64) * scale / 8)
        self.proj_bias = nn.Parameter(torch.zeros(64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc2(torch.nn.functional.gelu(self.fc1(x))) + x
        flat = y.reshape(-1, 64)
        return torch.addmm(self.proj_bias, flat, self.proj_weight).reshape(y.shape)


WEIGHT = "proj_weight_quantizer"


def _data(n: int = 2) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(4, 16, 64, generator=g) for _ in range(n)]


def _weights(prepared: nn.Module) -> dict[str, qdq.graph.plan.QuantPoint]:
    return {p.owner: p for p in qdq.plan_of(prepared).points if p.kind == "weight"}


def test_targets_that_scale_fp8_gemms_per_channel() -> None:
    yes = ["trt10.6-hopper", "trt10.12-hopper", "trt10.7-ada", "trt10.12-sm89", "trt11-hopper"]
    no = ["trt10-hopper", "trt10.5-hopper", "trt10.6-ada", "trt10", "trt10.12-blackwell"]
    assert [parse_target(t).fp8_gemm_per_channel for t in yes] == [True] * len(yes)
    assert [parse_target(t).fp8_gemm_per_channel for t in no] == [False] * len(no)


def test_the_plan_keeps_gemm_weights_per_channel_and_conv_weights_per_tensor() -> None:
    x = _data(1)[0]
    per_channel = qdq.prepare(Block(), (x,), QuantConfig(format="fp8", fp8_gemm_per_channel=True))
    points = _weights(per_channel)
    assert {name: p.spec.axis for name, p in points.items() if p.spec} == {
        "fc1": 0,
        "fc2": 0,
        "addmm": 1,  # Conv1D: (in, out), per output column
    }
    assert all(p.spec.format == "fp8" and p.format_rule == "F06" for p in points.values() if p.spec)
    assert "per output channel (F06" in points["fc1"].reason
    per_tensor = _weights(qdq.prepare(Block(), (x,), QuantConfig(format="fp8")))
    assert {p.spec.axis for p in per_tensor.values() if p.spec} == {None}
    # TensorRT has no per-channel FP8 convolution weights on any target
    net = fp8_net("cpu")
    image = torch.randn(2, 3, 16, 16)
    conv = _weights(
        qdq.prepare(net, (image,), QuantConfig(format="fp8", fp8_gemm_per_channel=True))
    )
    assert conv["pw"].spec.format == "fp8" and conv["pw"].spec.axis is None
    assert conv["stem"].spec.format == "int8" and conv["stem"].spec.axis == 0


def test_fp8_gemm_per_channel_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="fp8_gemm_per_channel must be True or False, got int"):
        QuantConfig(format="fp8", fp8_gemm_per_channel=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_per_channel_fp8_weights_export_and_match_onnx_runtime(exporter, tmp_path: Path) -> None:
    from qdq.backends.parity import parity

    data = _data()
    prepared = qdq.prepare(
        Block(), (data[0],), QuantConfig(format="fp8", fp8_gemm_per_channel=True)
    )
    qdq.calibrate(prepared, data, show_progress=False)
    path = tmp_path / "m.onnx"
    out = qdq.export_onnx(prepared, (data[0],), path, exporter=exporter)  # verified in ORT
    model = onnx.load(str(path))
    inits = {i.name: i for i in model.graph.initializer}
    per_axis = [
        n
        for n in model.graph.node
        if n.op_type == "DequantizeLinear"
        and n.input[2] in inits
        and inits[n.input[2]].data_type == onnx.TensorProto.FLOAT8E4M3FN
        and len(inits[n.input[2]].dims) == 1
    ]
    assert sorted(inits[n.input[2]].dims[0] for n in per_axis) == [64, 64, 128]
    manifest = json.loads(out.manifest_path.read_text())
    axes = {q["path"]: q["axis"] for q in manifest["quantizers"] if q["kind"] == "weight"}
    assert axes == {"fc1.weight_quantizer": 0, "fc2.weight_quantizer": 0,
                    WEIGHT: 1}  # fmt: skip
    report = parity(prepared, path, _data(), per_layer=True)
    assert report.first_unexplained is None
    assert all(lp.unexplained_codes == 0 for lp in report.layers.values())
    # accepted where TensorRT builds them, an F06 note where it is not known to
    assert not [f for f in lint(path, target="trt10.6-hopper").findings if f.rule == "F06"]
    f06 = [f for f in lint(path, target="trt10-hopper").findings if f.rule == "F06"]
    assert len(f06) == 3 and all("per-channel FP8 GEMM weights" in f.message for f in f06)


def test_per_channel_fp8_weights_are_more_precise_on_uneven_channels() -> None:
    data = _data()
    w = Block().proj_weight.detach()
    sqnr = {}
    for per_channel in (False, True):
        cfg = QuantConfig(format="fp8", fp8_gemm_per_channel=per_channel)
        prepared = qdq.prepare(Block(), (data[0],), cfg)
        qdq.calibrate(prepared, data, show_progress=False)
        with torch.no_grad():
            q = qdq.quantizers_of(prepared)[WEIGHT](w)
        column = 10 * torch.log10(w.square().sum(0) / (q - w).square().sum(0))
        sqnr[per_channel] = float(column.min())
    # the Conv1D's columns span five decades: per tensor, the smallest fall to a few of E4M3's
    # subnormal steps (or to zero); per channel, every column keeps E4M3's ~31 dB
    assert sqnr[True] > 28.0 > 10.0 > sqnr[False]


def test_the_job_takes_per_channel_fp8_gemm_weights_from_its_target(tmp_path: Path) -> None:
    from qdq.backends.parity import parity
    from qdq.export.manifest import config_of

    data = torch.cat(_data(4))
    axes = {}
    for target in ("trt10.12-hopper", "trt10-hopper"):
        res = qdq.quantize(Block(), data, out=tmp_path / target, format="fp8", target=target,
                           ptq="none", show_progress=False)  # fmt: skip
        manifest = json.loads(Path(res.manifest_path).read_text())
        axes[target] = {
            q["path"]: q["axis"] for q in manifest["quantizers"] if q["kind"] == "weight"
        }
        assert res.report["lint_verdict"] == "PASS", target
        # qdq parity plans the model again from the manifest: the same axes, the same codes
        config = config_of(res.manifest_path)
        assert config is not None and config.fp8_gemm_per_channel == (target != "trt10-hopper")
        again = qdq.prepare(Block(), (data[:4],), config)
        qdq.load_calibration(again, res.manifest_path)
        assert parity(again, res.onnx_path, _data(), per_layer=True).first_unexplained is None
    assert set(axes["trt10.12-hopper"].values()) == {0, 1}
    assert set(axes["trt10-hopper"].values()) == {None}
