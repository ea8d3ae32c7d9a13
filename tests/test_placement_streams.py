"""Float streams (rule P15) and rolled windows (S03), issue 47: a diffusion UNet's and a VAE
decoder's GroupNorm ResNet blocks, a shifted-window attention block — the planner's decision on
tiny blocks (``tests/models/diffusion.py``) and the linter agreeing on their export with both
exporters (the linter's side on hand-built graphs: ``test_lint_streams.py``).

Before: the UNet linted P04 x7 (+ P03a x2 with dynamo), 31 unfused Q/DQ with TorchScript — the
1x1 ``conv_shortcut`` read INT8 the block input its GroupNorm reads in float, and the skip
Concats ran INT8 for it; the decoder P04 x1; the shifted-window block S02b on the roll's Concat.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import onnx
import pytest
import torch
from torch import nn

import qdq
from models.diffusion import ShiftedWindowBlock, TinyDecoder, TinyUNet
from qdq.backends.parity import parity
from qdq.graph.plan import QuantPlan
from qdq.lint import LintReport, lint

PLACEMENT = {"P03a", "P03d", "P04", "S02b", "S03"}
#: the five 1x1 shortcuts of TinyUNet, each reading a block input its GroupNorm reads
SHORTCUTS = ("down1", "up0.0", "up0.1", "up1.0", "up1.1")


def _unet() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    return TinyUNet().eval(), (torch.randn(1, 4, 16, 16, generator=gen), torch.tensor([10.0]))


def _decoder() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    return TinyDecoder().eval(), (torch.randn(1, 4, 8, 8, generator=gen),)


def _windows() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), ShiftedWindowBlock(), nn.Linear(32, 16)).eval()
    return model, (torch.randn(1, 8, 8, 16, generator=torch.Generator().manual_seed(1)),)


def _plan(model: nn.Module, inputs: tuple[torch.Tensor, ...], **kw: object) -> QuantPlan:
    return qdq.plan_of(qdq.prepare(model, inputs, **kw))  # type: ignore[arg-type]


def _export(
    model: nn.Module, inputs: tuple[torch.Tensor, ...], path: Path, exporter: str
) -> LintReport:
    """Prepare, calibrate, export, check parity per quantizer, lint."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prepared = qdq.prepare(model, inputs)
        qdq.calibrate(prepared, [inputs], method="max", show_progress=False)
        out = qdq.export_onnx(prepared, inputs, path, exporter=exporter)
    report = parity(prepared, out.path, [inputs], per_layer=True)
    assert report.first_unexplained is None, report.first_unexplained
    assert all(lp.qdq_mismatches == 0 for lp in report.layers.values())
    return lint(out.path)


def _placement_warnings(report: LintReport) -> list[str]:
    return sorted(f.rule for f in report.findings if f.severity == "WARN" and f.rule in PLACEMENT)


# --------------------------------------------------------------------------------- planner
def test_p15_unet_shortcuts_read_the_float_stream_and_the_skip_concats_stay_float() -> None:
    p = _plan(*_unet())
    for block in SHORTCUTS:
        point = p.point(f"{block}.conv_shortcut:input")
        weight = p.point(f"{block}.conv_shortcut:weight")
        assert (point.decision, point.rule) == ("skip", "P15"), point
        assert f"{block}.norm1" in point.reason and "float stream" in point.reason
        assert (weight.decision, weight.rule) == ("skip", "P15")
    # the skip Concats (``cat`` is the timestep's sin/cos, read by the time MLP): those read only
    # by a float GroupNorm and a float shortcut stay float (S02); ``cat_3`` joins the upsampler's
    # INT8 output and the block output the downsampler reads INT8, so it runs INT8 (P04's
    # fan-out Concat) and one Dequantize serves its readers
    skips = {pt.name: (pt.quantized, pt.rule) for pt in p.points if pt.op == "cat"}
    for cat in ("cat_1", "cat_2", "cat_4"):
        assert skips[f"{cat}:input0"] == skips[f"{cat}:input1"] == (False, "S02"), skips
    assert skips["cat_3:input0"] == skips["cat_3:input1"] == (True, "P04"), skips
    status = {c.module: c.status for c in p.coverage}
    floats = {m for m, s in status.items() if s != "int8"}
    assert floats == {f"{b}.conv_shortcut" for b in SHORTCUTS}, floats
    # the downsampler, the upsampler, conv_in/conv_out and the time MLP stay INT8
    for owner in ("downsample", "upsample.conv", "conv_in", "conv_out", "mid.time_emb_proj"):
        assert p.point(f"{owner}:input").quantized, owner


def test_time_embedding_add_is_conv1s_epilogue_with_a_float_operand() -> None:
    """``conv1(x) + proj(silu(temb))[:, :, None, None]``: two GEMM branches, conv1 on the longer
    path from the time MLP, fused (P03); the projection operand is float, since the fused output
    feeds GroupNorm (the release pass of P03); the projection itself reads INT8 (P01)."""
    p = _plan(*_unet())
    fused, other = (p.point(f"mid.add:input{i}") for i in (0, 1))
    assert (fused.decision, fused.rule) == ("skip", "P03") and "conv1" in fused.reason
    assert (other.decision, other.rule) == ("skip", "P03") and "stays float" in other.reason
    assert p.point("mid.time_emb_proj:input").quantized


def test_p15_shortcut_follows_the_residual_family_switch() -> None:
    """With the ``residual`` family off (P15 is in it) the shortcut reads INT8 again (P01)."""
    cfg = qdq.QuantConfig.tensorrt(disable=("residual",))
    point = _plan(*_unet(), config=cfg).point("up0.0.conv_shortcut:input")
    assert (point.decision, point.rule) == ("quantize", "P01")


def test_p15_decoder_shortcut_after_the_upsampler_reads_float() -> None:
    p = _plan(*_decoder())
    point = p.point("last.conv_shortcut:input")
    assert (point.decision, point.rule) == ("skip", "P15") and "last.norm1" in point.reason
    assert p.point("upsample.conv:input").quantized and p.point("last.conv1:input").quantized


def test_s03_roll_is_data_movement_that_the_qkv_quantizer_reads_through() -> None:
    p = _plan(*_windows())
    qkv = p.point("1.qkv:input")
    assert qkv.quantized and qkv.rule == "P01" and "cyclic shift 1.roll" in qkv.reason
    group = p.group_of(qkv.name)
    assert group is not None and "1.roll" in group.crosses


# ------------------------------------------------------------------------- export and lint
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_unet_exports_and_lints_without_placement_warnings(exporter: str, tmp_path: Path) -> None:
    report = _export(*_unet(), tmp_path / "unet.onnx", exporter)
    assert not _placement_warnings(report), report.format()
    assert report.summary["int8_weighted_layers"] == report.summary["weighted_layers"] - 5
    # the five 1x1 shortcuts are 4 % of the FLOPs, counted alike for both exports (TorchScript's
    # GroupNorm Reshapes take computed shapes: shape inference propagates their values)
    assert report.summary["int8_flops_percent"] == 96, report.summary


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_decoder_exports_and_lints_without_placement_warnings(
    exporter: str, tmp_path: Path
) -> None:
    report = _export(*_decoder(), tmp_path / "decoder.onnx", exporter)
    assert not _placement_warnings(report), report.format()


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_shifted_windows_export_with_the_roll_as_slices_and_concats_and_lint_clean(
    exporter: str, tmp_path: Path
) -> None:
    """Both exporters write ``torch.roll`` as Slices and a Concat per rolled axis, the qkv GEMM's
    Quantize after them: data movement, no S02b on the Concat."""
    report = _export(*_windows(), tmp_path / "windows.onnx", exporter)
    model = onnx.load(str(tmp_path / "windows.onnx"))
    assert sum(n.op_type == "Concat" for n in model.graph.node) >= 2
    assert not _placement_warnings(report), report.format()
    assert report.summary["int8_weighted_layers"] == report.summary["weighted_layers"]


# ------------------------------------------------------- normalizations written as arithmetic
class RMSNorm(nn.Module):
    """T5's / LLaMA's RMSNorm as ``transformers`` writes it."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        variance = h.pow(2).mean(-1, keepdim=True)
        return self.weight * (h * torch.rsqrt(variance + 1e-6))


class ChannelsFirstLayerNorm(nn.Module):
    """ConvNeXt's channels-first LayerNorm: ``u = x.mean(1, keepdim=True)``, ``x - u``..."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        return self.weight[:, None, None] * ((x - u) / torch.sqrt(s + 1e-6))


class PreNormBlock(nn.Module):
    """``x + mlp(norm(x))`` twice, with a hand-written normalization."""

    def __init__(self, norm: type[nn.Module], dim: int = 32) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(dim, dim)
        self.norms = nn.ModuleList([norm(dim), norm(dim)])
        self.fcs = nn.ModuleList([nn.Linear(dim, dim), nn.Linear(dim, dim)])
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for norm, fc in zip(self.norms, self.fcs, strict=True):
            x = x + fc(torch.relu(norm(x)))
        return self.out(x)


def _channels_first_block() -> nn.Module:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.stem = nn.Conv2d(3, 32, 3, padding=1)
            self.norm = ChannelsFirstLayerNorm(32)
            self.conv = nn.Conv2d(32, 32, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.stem(x)
            return x + self.conv(self.norm(x))

    return Block().eval()


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_p15_a_hand_written_rmsnorm_reads_the_residual_stream_in_float(
    exporter: str, tmp_path: Path
) -> None:
    """The residual Adds of a pre-norm block whose RMSNorm is arithmetic (``x.pow(2).mean(-1)``,
    T5, LLaMA) stay float (P15), as with ``nn.LayerNorm``: quantizing their skip for the Add
    (P03) made the stream a standalone Quantize beside the norm's float read (lint P04 per
    block: T5 encoder, 2 layers, 12 -> 4 unfused Q/DQ, WARN -> PASS)."""
    model = PreNormBlock(RMSNorm).eval()
    inputs = (torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(1)),)
    plan = _plan(model, inputs)
    adds = [p for p in plan.points if p.op == "add"]
    assert adds and {(p.decision, p.rule) for p in adds} == {("skip", "P15")}
    assert "norms.0" in adds[0].reason
    assert _placement_warnings(_export(model, inputs, tmp_path / "m.onnx", exporter)) == []


def test_p15_a_channels_first_layernorm_written_as_arithmetic_is_a_float_reader() -> None:
    """ConvNeXt's ``u = x.mean(1, keepdim=True); x - u``: the 1x1 conv's residual Add keeps its
    skip float, as beside ``nn.LayerNorm``; a mean that nothing subtracts from its input (a
    pooling) is no normalization."""
    model = _channels_first_block()
    inputs = (torch.randn(1, 3, 8, 8),)
    (add,) = [p for p in _plan(model, inputs).points if p.op == "add" and p.arg == 0]
    assert (add.decision, add.rule) == ("skip", "P15")
