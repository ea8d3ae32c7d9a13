"""BlockQuantizer (issue 60): a Quantizer in NVFP4, MXFP8 or INT4 whose values are
``block_fake_quant``'s, calibrated per tensor (activations) or from the weight, saved and loaded
with its amax, trained through the STE, and exported as one ``BlockQDQ`` marker by both
exporters."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from qdq.calib import CalibrationError
from qdq.config import CalibSpec, QuantSpec
from qdq.quant import BlockQuantizer, Quantizer, QuantMode, make_quantizer
from qdq.quant.blocks import INT4, MXFP8, NVFP4, block_amax, block_fake_quant, block_scales
from qdq.quant.onnx_qdq import BLOCK_DOMAIN, BLOCK_OP, export_mode


def _weight(rows: int = 4, cols: int = 64, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g) * torch.linspace(0.1, 3.0, cols)


def test_make_quantizer_picks_the_class_by_format() -> None:
    assert type(make_quantizer(QuantSpec(), name="a")) is Quantizer
    assert type(make_quantizer(QuantSpec(format="fp8"), name="a")) is Quantizer
    for fmt in ("nvfp4", "mxfp8"):
        q = make_quantizer(QuantSpec.block(fmt), name="fc:input")
        assert isinstance(q, BlockQuantizer) and q.role == "activation"
    w = make_quantizer(QuantSpec.block("int4", block_size=32), name="fc:weight")
    assert isinstance(w, BlockQuantizer) and w.role == "weight"


@pytest.mark.parametrize(
    ("spec", "fmt"),
    [
        (QuantSpec.block("nvfp4"), NVFP4),
        (QuantSpec.block("mxfp8"), MXFP8),
        (QuantSpec.block("int4", block_size=32), INT4.with_block_size(32)),
        (QuantSpec.block("int4", axis=0, per_channel=True), INT4.with_block_size(None)),
    ],
)
def test_weight_values_are_block_fake_quant(spec: QuantSpec, fmt: object) -> None:
    w = _weight()
    q = BlockQuantizer(spec, name="fc:weight")
    amax = q.calibrate_from(w)
    assert q.mode is QuantMode.QUANTIZE and q.amax_method == "max"
    axis = spec.axis if spec.axis is not None else -1
    if spec.format == "int4":
        assert torch.equal(amax.reshape(-1), block_amax(w, fmt, axis).reshape(-1))  # type: ignore[arg-type]
        expected = block_fake_quant(w, fmt, q.amax, axis=axis)  # type: ignore[arg-type]
    else:
        assert amax.dim() == 0 and float(amax) == float(w.abs().max())
        expected = block_fake_quant(w, fmt, None, axis=axis)  # type: ignore[arg-type]
    assert torch.equal(q(w), expected)
    assert torch.equal(q(w), expected)  # twice: a kept copy is the same


def test_nvfp4_activation_calibrates_its_per_tensor_amax_by_max() -> None:
    q = BlockQuantizer(QuantSpec.block("nvfp4"), CalibSpec(), name="fc:input")
    q.mode = QuantMode.CALIBRATE
    x = torch.randn(8, 32)
    x[0, 0] = 9.0
    assert torch.equal(q(x), x)
    amax = q.load_calib_amax()  # the CalibSpec says mse: the INT8 grid's, so max is used
    assert float(amax) == 9.0 and q.amax_method == "max"
    q.mode = QuantMode.QUANTIZE
    y = torch.randn(3, 32)
    assert torch.equal(q(y), block_fake_quant(y, NVFP4, torch.tensor(9.0)))


def test_mxfp8_needs_no_amax_and_reports_the_observed_max() -> None:
    q = BlockQuantizer(QuantSpec.block("mxfp8"), name="fc:input")
    x = torch.randn(2, 64)
    assert torch.equal(q(x), block_fake_quant(x, MXFP8))  # uncalibrated is fine
    q.mode = QuantMode.CALIBRATE
    q(x)
    assert float(q.load_calib_amax()) == float(x.abs().max())


def test_uncalibrated_nvfp4_is_a_clear_error() -> None:
    q = BlockQuantizer(QuantSpec.block("nvfp4"), name="fc:input")
    with pytest.raises(RuntimeError, match="has no amax"):
        q(torch.ones(1, 16))
    w = BlockQuantizer(QuantSpec.block("int4", block_size=16), name="fc:weight")
    with pytest.raises(CalibrationError, match="no weight was seen"):
        w.load_calib_amax()


def test_bad_specs_and_roles_are_refused() -> None:
    with pytest.raises(ValueError, match="needs a block format"):
        BlockQuantizer(QuantSpec())
    with pytest.raises(ValueError, match="INT4 is a weight format"):
        BlockQuantizer(QuantSpec.block("int4"), name="fc:input")
    q = BlockQuantizer(QuantSpec.block("nvfp4"), name="fc:input")
    with pytest.raises(ValueError, match="per-tensor amax but got shape"):
        q.set_amax(torch.ones(3))
    with pytest.raises(ValueError, match="lsq/pact"):
        q.learn_amax("lsq")
    q.learn_amax(None)  # freezing is a no-op
    w = BlockQuantizer(QuantSpec.block("int4", block_size=16), name="fc:weight")
    w.calibrate_from(_weight(4, 64))
    with pytest.raises(ValueError, match=r"has amax of shape \(4, 4\) but got \(4, 2\)"):
        w.set_amax(torch.ones(4, 2))
    with pytest.raises(ValueError, match="not a multiple of the block size"):
        BlockQuantizer(QuantSpec.block("mxfp8"), name="x:input")(torch.ones(2, 24))
    with pytest.raises(ValueError, match="only floating-point"):
        BlockQuantizer(QuantSpec.block("mxfp8"), name="x:input")(
            torch.ones(2, 32, dtype=torch.int32)
        )


def test_state_dict_round_trip_and_deepcopy() -> None:
    w = _weight(8, 64)
    q = BlockQuantizer(QuantSpec.block("int4", block_size=32), name="fc:weight")
    q.calibrate_from(w)
    fresh = BlockQuantizer(QuantSpec.block("int4", block_size=32), name="fc:weight")
    fresh.load_state_dict(q.state_dict())
    assert torch.equal(fresh.amax, q.amax) and torch.equal(fresh(w), q(w))
    twin = copy.deepcopy(q)
    assert torch.equal(twin(w), q(w))
    assert "int4, block=32" in repr(q) and "amax=[16]" in repr(q)


def test_ste_gradient_passes_inside_the_blocks_range() -> None:
    w = nn.Parameter(_weight(2, 32))
    q = BlockQuantizer(QuantSpec.block("nvfp4"), name="fc:weight")
    q.calibrate_from(w.detach())
    q(w).sum().backward()
    sb, gs = block_scales(w.detach(), NVFP4)
    assert gs is not None
    inside = w.detach().abs() <= (sb * gs).repeat_interleave(16, dim=1) * 6
    assert w.grad is not None and torch.equal(w.grad, inside.float())
    # a block scale rounded down to E4M3 clips its block's largest value: no gradient there
    assert 0 < int((~inside).sum()) < w.numel()


class _Linear(nn.Module):
    def __init__(self, wq: BlockQuantizer, iq: BlockQuantizer | None) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 16, bias=False)
        self.wq, self.iq = wq, iq

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.iq(x) if self.iq is not None else x
        return nn.functional.linear(x, self.wq(self.fc.weight))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8", "int4"])
def test_export_writes_one_marker_per_quantizer(exporter: str, fmt: str, tmp_path: object) -> None:
    onnx = pytest.importorskip("onnx")
    size = 16 if fmt == "int4" else None
    wq = BlockQuantizer(QuantSpec.block(fmt, block_size=size), name="fc:weight")
    iq = None if fmt == "int4" else BlockQuantizer(QuantSpec.block(fmt), name="fc:input")
    model = _Linear(wq, iq).eval()
    wq.calibrate_from(model.fc.weight)
    if iq is not None:
        iq.set_amax(4.0)
    for q in (wq, iq):
        if q is not None and (amax := q.marker_amax()) is not None:
            q.register_buffer("export_amax", amax)
    x = torch.randn(2, 32)
    path = f"{tmp_path}/m.onnx"
    with export_mode(exporter), torch.no_grad():
        if exporter == "dynamo":
            torch.onnx.export(model, (x,), path, dynamo=True, external_data=False)
        else:
            torch.onnx.export(model, (x,), path, dynamo=False, opset_version=17)
    graph = onnx.load(path).graph
    markers = [n for n in graph.node if n.op_type == BLOCK_OP and n.domain == BLOCK_DOMAIN]
    assert len(markers) == (1 if fmt == "int4" else 2)
    for n in markers:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        fmt_attr = (
            attrs["format"].decode() if isinstance(attrs["format"], bytes) else attrs["format"]
        )
        assert fmt_attr == fmt and attrs["axis"] == 1
        assert attrs["block_size"] == (size or {"nvfp4": 16, "mxfp8": 32}[fmt])
        assert len(n.input) == (1 if fmt == "mxfp8" else 2)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8", "int4"])
def test_torch_compile_fullgraph_equals_eager(fmt: str) -> None:
    size = 32 if fmt == "int4" else None
    wq = BlockQuantizer(QuantSpec.block(fmt, block_size=size), name="fc:weight")
    iq = None if fmt == "int4" else BlockQuantizer(QuantSpec.block(fmt), name="fc:input")
    lin = nn.Linear(64, 32)
    wq.calibrate_from(lin.weight)
    if iq is not None:
        iq.set_amax(3.0)

    def f(x: torch.Tensor) -> torch.Tensor:
        x = iq(x) if iq is not None else x
        return nn.functional.linear(x, wq(lin.weight), lin.bias)

    x = torch.randn(8, 64)
    compiled = torch.compile(f, fullgraph=True)  # no graph break: no host sync in the path
    assert torch.equal(compiled(x), f(x))
    xg = x.clone().requires_grad_()
    compiled(xg).sum().backward()
    assert xg.grad is not None and bool(xg.grad.abs().sum() > 0)


def _cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8", "int4"])
def test_block_quantizer_on_cuda_equals_cpu_without_host_syncs(fmt: str) -> None:
    _cuda()
    size = 32 if fmt == "int4" else None
    w = _weight(16, 128)
    x = torch.randn(4, 128) * 3
    outs = {}
    for device in ("cpu", "cuda"):
        wq = BlockQuantizer(QuantSpec.block(fmt, block_size=size), name="fc:weight").to(device)
        wq.calibrate_from(w.to(device))
        iq = None if fmt == "int4" else BlockQuantizer(QuantSpec.block(fmt), name="fc:input")
        if iq is not None:
            iq.to(device).set_amax(5.0)
        torch.cuda.set_sync_debug_mode("error" if device == "cuda" else "default")
        try:
            xq = iq(x.to(device)) if iq is not None else x.to(device)
            outs[device] = (
                (xq.cpu(), wq(w.to(device)).cpu()) if device == "cpu" else (xq, wq(w.to(device)))
            )
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for cpu, cuda in zip(outs["cpu"], outs["cuda"], strict=True):
        assert torch.equal(cpu, cuda.cpu())
