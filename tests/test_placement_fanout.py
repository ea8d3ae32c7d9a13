"""Fan-out placement (rule P04) through identity aliases, layer scales and dense Concats: the
planner's decision on small graphs, and the linter agreeing on their export."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import qdq
import qdq.lint
from test_placement_rules import decisions, plan


class RepGhost(nn.Module):
    """RepGhostNet's module in training form: ``cheap(x1) + bn(fusion(x1))`` with an identity
    ``fusion``, then a conv reading the block's output (``after=False``: the block's output is
    the model's)."""

    def __init__(self, c: int, out: int, after: bool = True) -> None:
        super().__init__()
        self.primary = nn.Sequential(nn.Conv2d(16, c, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU())
        self.fusion = nn.Identity()
        self.fusion_bn = nn.BatchNorm2d(c)
        self.cheap = nn.Sequential(
            nn.Conv2d(c, c, 3, 1, 1, groups=c, bias=False), nn.BatchNorm2d(c)
        )
        self.after = nn.Conv2d(c, out, 1) if after else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = self.primary(x)
        return self.after(F.relu(self.cheap(x1) + self.fusion_bn(self.fusion(x1))))


def _lint(model: nn.Module, x: torch.Tensor, path: Path) -> qdq.lint.LintReport:
    prepared = qdq.prepare(model.eval(), (x[:1],))
    qdq.calibrate(prepared, [x], method="max", show_progress=False)
    return qdq.lint.lint(qdq.export_onnx(prepared, (x[:1],), path, exporter="torchscript").path)


def test_p04_bn_behind_an_identity_reads_the_int8_version(tmp_path: Path) -> None:
    """The BatchNorm reads ``fusion(x1)``, an identity alias of the ``x1`` the cheap conv
    quantizes: it reads the same INT8 version (one quantizer), and the export lints clean."""
    p = plan(RepGhost(32, 32), 1, 16, 8, 8)
    bn, cheap = p.point("fusion_bn:input"), p.point("cheap.0:input")
    assert (bn.decision, bn.rule) == ("quantize", "P04") or (bn.decision, bn.rule) == (
        "share",
        "P04",
    )
    assert bn.group == cheap.group  # one scale on the one exported tensor (S01)
    torch.manual_seed(0)
    report = _lint(RepGhost(32, 32), torch.randn(4, 16, 8, 8), tmp_path / "ghost.onnx")
    assert not {"P04", "P05", "S01"} & set(report.rules()), report.format()


def test_p04_bn_whose_output_stays_float_reads_float() -> None:
    """When the block's output is the model's (float), the fused Add writes float, its skip is
    released (P03) and the BatchNorm reads float too: INT8 in and float out would be a
    standalone Dequantize (P05) in place of the producer's float copy."""
    p = plan(RepGhost(20, 12, after=False), 1, 16, 8, 8)
    bn = p.point("fusion_bn:input")
    assert (bn.decision, bn.rule) == ("skip", "P04") and "stays float" in bn.reason
    assert p.point("cheap.0:input").quantized  # the depthwise conv still runs INT8


def test_h02_small_conv_after_a_fused_add_with_an_int8_skip_runs_int8(tmp_path: Path) -> None:
    """A small conv after the block (20 -> 12 channels: float on its own, H02) reads the output
    of a conv+Add fused with an INT8 skip, which writes INT8 at no cost: it reads INT8, so the
    skip stays INT8 and the block's input is read in one precision (no P04, no P03d)."""
    p = plan(RepGhost(20, 12), 1, 16, 8, 8)
    after = p.point("after:input")
    assert after.quantized and "H02" in after.reason and "conv+Add" in after.reason, after
    assert p.point("fusion_bn:input").quantized and p.point("cheap.0:input").quantized
    torch.manual_seed(0)
    report = _lint(RepGhost(20, 12), torch.randn(4, 16, 8, 8), tmp_path / "ghost.onnx")
    assert not {"P03d", "P04", "P05", "S01"} & set(report.rules()), report.format()


class DenseBlock(nn.Module):
    """RDNet's block on the stage's features: conv, an effective-SE gate, a layer scale."""

    def __init__(self, cin: int, growth: int = 16) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, growth, 1)
        self.fc = nn.Conv2d(growth, growth, 1)
        self.gamma = nn.Parameter(torch.full((1, growth, 1, 1), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        y = y * F.hardsigmoid(self.fc(y.mean((2, 3), keepdim=True)))
        return y * self.gamma


class DenseStage(nn.Module):
    """``features += [block(cat(features))]`` three times; the stage's output ``cat(features)``
    goes through a channel LayerNorm (float) to the next conv."""

    def __init__(self, c: int = 32, growth: int = 16) -> None:
        super().__init__()
        self.stem = nn.Conv2d(16, c, 3, 1, 1)
        self.blocks = nn.ModuleList(DenseBlock(c + i * growth, growth) for i in range(3))
        self.norm = nn.LayerNorm(c + 3 * growth)
        self.head = nn.Conv2d(c + 3 * growth, 32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [self.stem(x)]
        for block in self.blocks:
            features.append(block(torch.cat(features, 1)))
        out = torch.cat(features, 1)
        return self.head(self.norm(out.permute(0, 2, 3, 1)).permute(0, 3, 1, 2))


def test_p04_dense_stage_concat_runs_int8_and_its_gates_too(tmp_path: Path) -> None:
    """Every feature is INT8 for the inner Concats, so the stage's last Concat (read by a float
    LayerNorm) is quantized as well (P04, one scale with them) rather than every feature written
    twice; the last block's gate, whose output only that Concat reads, then runs INT8 (P04)
    through its layer scale."""
    p = plan(DenseStage(), 1, 16, 8, 8)
    last = decisions(p, "cat_3")
    assert len(last) == 4 and {d for d, _ in last.values()} <= {"quantize", "share"}, last
    assert {r for _, r in last.values()} == {"P04"}
    assert p.point("cat_3:input0").group == p.point("cat:input").group  # S02 across the stage
    for i in range(3):
        gate = decisions(p, f"blocks.{i}.mul")
        assert gate and {r for _, r in gate.values()} == {"P04"}, gate
        assert {d for d, _ in gate.values()} <= {"quantize", "share"}
    torch.manual_seed(0)
    report = _lint(DenseStage(), torch.randn(4, 16, 8, 8), tmp_path / "dense.onnx")
    assert not {"P04", "P05", "S02b"} & set(report.rules()), report.format()
    assert report.summary["int8_weighted_layers"] == report.summary["weighted_layers"]


class InceptionMixer(nn.Module):
    """InceptionNeXt's block: split the channels into an identity slice and three depthwise
    branches, concatenate, BatchNorm, a 1x1 conv, a residual Add."""

    def __init__(self, c: int = 64, gc: int = 16) -> None:
        super().__init__()
        self.stem = nn.Conv2d(16, c, 3, 1, 1)
        self.splits = (c - 3 * gc, gc, gc, gc)
        self.hw = nn.Conv2d(gc, gc, 3, 1, 1, groups=gc)
        self.w = nn.Conv2d(gc, gc, (1, 5), 1, (0, 2), groups=gc)
        self.h = nn.Conv2d(gc, gc, (5, 1), 1, (2, 0), groups=gc)
        self.norm = nn.BatchNorm2d(c)
        self.fc = nn.Conv2d(c, c, 1)
        self.head = nn.Conv2d(c, 32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x_id, x_hw, x_w, x_h = torch.split(x, self.splits, dim=1)
        y = torch.cat((x_id, self.hw(x_hw), self.w(x_w), self.h(x_h)), dim=1)
        return self.head(self.fc(self.norm(y)) + x)


def test_p04_split_slices_concatenated_before_a_bn_run_int8(tmp_path: Path) -> None:
    """The depthwise branches read their slices INT8; the identity slice goes into the Concat,
    which a standalone BatchNorm reads before the 1x1 conv. The BN reads INT8 (P04), so the
    Concat runs INT8 (S02) and every slice of the Split is INT8: the producer writes INT8 once
    (no P04) and the fused residual Add's output is INT8 (no P03d)."""
    p = plan(InceptionMixer(), 1, 16, 8, 8)
    bn = p.point("norm:input")
    assert bn.quantized and bn.rule == "P04" and "Split" in bn.reason
    cat = decisions(p, "cat")
    assert len(cat) == 4 and {d for d, _ in cat.values()} <= {"quantize", "share"}, cat
    torch.manual_seed(0)
    report = _lint(InceptionMixer(), torch.randn(4, 16, 8, 8), tmp_path / "mixer.onnx")
    assert not {"P03d", "P04", "P05", "S02b"} & set(report.rules()), report.format()


class PreActBlock(nn.Module):
    """NF-ResNet/NF-RegNet's block: ``out = conv2(act(conv1(act(x) * beta)))``, an SE gate with a
    gain before the last activation, ``out * alpha + x`` (no normalization: the scales are
    constants)."""

    def __init__(self, c: int, act: type[nn.Module]) -> None:
        super().__init__()
        self.act1, self.act2, self.act3 = act(), act(), act()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)
        self.fc = nn.Conv2d(c, c, 1)
        self.conv3 = nn.Conv2d(c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(self.act1(x) * 0.9)
        out = self.conv2(self.act2(out))
        out = out * torch.sigmoid(self.fc(out.mean((2, 3), keepdim=True)))
        out = self.conv3(self.act3(out * 2.0))
        return out * 0.2 + x


class PreActNet(nn.Module):
    def __init__(self, act: type[nn.Module]) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, padding=1)
        self.blocks = nn.Sequential(
            PreActBlock(32, act), PreActBlock(32, act), PreActBlock(32, act)
        )
        self.head = nn.Conv2d(32, 32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


def test_p04_preactivation_reads_the_int8_residual(tmp_path: Path) -> None:
    """A block's input ``x`` is the next Add's INT8 skip and, through ``act(x) * beta``, conv1's
    input: the activation reads the same INT8 version (its PointWise layer with the scale runs
    between Q/DQ), so the fused conv+Add writes INT8 once; the SE gate's product reaches its conv
    through a gain and a SiLU and runs INT8. ReLU (NF-ResNet) and SiLU (NF-RegNet) alike."""
    for act in (nn.ReLU, nn.SiLU):
        p = plan(PreActNet(act), 1, 3, 8, 8)
        for i in (1, 2):
            point = p.point(f"blocks.{i}.act1:input")
            assert point.quantized and point.rule == "P04", (act, point)
            assert point.group == p.point(f"blocks.{i}.add:input1").group  # one scale (S01)
            gate = p.point(f"blocks.{i}.mul_1:input1")  # x * sigmoid(fc(mean(x)))
            assert gate.quantized and gate.rule == "P04", (act, gate)
        torch.manual_seed(0)
        report = _lint(PreActNet(act), torch.randn(4, 3, 8, 8), tmp_path / f"{act.__name__}.onnx")
        assert not {"P03a", "P03d", "P04", "P05"} & set(report.rules()), report.format()


class FocalModulation(nn.Module):
    """FocalNet's modulation: focal levels of depthwise conv + GELU, each level read by the next
    level's conv and by its gate, summed with a gated global context into the modulator that the
    1x1 conv ``h`` reads (timm's ``FocalModulation``, two levels)."""

    def __init__(self, c: int = 32, levels: int = 2) -> None:
        super().__init__()
        self.c, self.levels = c, levels
        self.f = nn.Conv2d(c, 2 * c + levels + 1, 1)
        self.focal = nn.ModuleList(
            nn.Sequential(nn.Conv2d(c, c, 3, 1, 1, groups=c, bias=False), nn.GELU())
            for _ in range(levels)
        )
        self.act = nn.GELU()
        self.h = nn.Conv2d(c, c, 1)
        self.proj = nn.Conv2d(c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, ctx, gates = torch.split(self.f(x), (self.c, self.c, self.levels + 1), 1)
        ctx_all = 0
        for level, layer in enumerate(self.focal):
            ctx = layer(ctx)
            ctx_all = ctx_all + ctx * gates[:, level : level + 1]
        ctx_global = self.act(ctx.mean((2, 3), keepdim=True))
        ctx_all = ctx_all + ctx_global * gates[:, self.levels :]
        return self.proj(q * self.h(ctx_all))


def test_p17_gated_sum_of_focal_levels_is_one_int8_pointwise_layer(tmp_path: Path) -> None:
    """Each focal level is read by the next level's INT8 conv and by its gate product: the
    products and their sum are one PointWise layer reading every level and gate in INT8 (P17), so
    no level is also read in float (P04); the global pool of the last level runs INT8 in and out
    (P06), its GELU alone on the pooled vector; the linter predicts the layer INT8."""
    p = plan(FocalModulation(), 1, 32, 8, 8)
    terms = [pt for pt in p.points if pt.owner.startswith("mul") and pt.kind == "input"]
    assert len(terms) == 6 and all((pt.quantized, pt.rule) == (True, "P17") for pt in terms)
    inside = [pt for pt in p.points if pt.owner.startswith("add")]
    assert inside and all((pt.quantized, pt.rule) == (False, "P17") for pt in inside)
    level0 = p.point("focal.1.0:input")
    reads0 = [pt for pt in terms if pt.producer == level0.producer]
    assert len(reads0) == 1 and reads0[0].group == level0.group  # one INT8 version of level 0
    pool, act = [pt for pt in p.points if pt.rule == "P06"]
    assert pool.quantized and act.quantized and act.owner == "act"
    torch.manual_seed(0)
    report = _lint(FocalModulation(), torch.randn(4, 32, 8, 8), tmp_path / "focal.onnx")
    assert not {"P04", "P05", "S01", "S02b"} & set(report.rules()), report.format()
    pointwise = [ly for ly in report.layers if ly.kind == "pointwise" and ly.name.count("Mul") == 3]
    assert len(pointwise) == 1 and pointwise[0].input_precision == "int8", report.format()
    assert pointwise[0].output_precision == "int8"


class NasCell(nn.Module):
    """A NASNet normal cell in small: ``x`` (the previous cell's Concat) through ReLU-conv-BN,
    then a separable branch plus the identity skip, a sum of two average pools, and the Concat of
    both that the next cell reads through its own ReLU."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.pre = nn.Sequential(nn.ReLU(), nn.Conv2d(2 * c, c, 1, bias=False), nn.BatchNorm2d(c))
        self.branch = nn.Sequential(
            nn.ReLU(), nn.Conv2d(c, c, 3, 1, 1, groups=c), nn.Conv2d(c, c, 1), nn.BatchNorm2d(c)
        )
        self.avg_a = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        self.avg_b = nn.AvgPool2d(3, 1, 1, count_include_pad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        left = self.pre(x)
        comb0 = self.branch(left) + left
        comb1 = self.avg_a(left) + self.avg_b(left)
        return torch.cat([comb0, comb1], 1)


class NasNet(nn.Module):
    def __init__(self, c: int = 32) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 2 * c, 3, 1, 1)
        self.cells = nn.Sequential(NasCell(c), NasCell(c))
        self.head = nn.Sequential(nn.ReLU(), nn.Conv2d(2 * c, 8, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.cells(self.stem(x)))


def test_s02_cell_concat_read_through_relus_runs_int8(tmp_path: Path) -> None:
    """Each cell's Concat is read only by ReLUs before convs (pre-activation): every ReLU reads it
    in INT8 and runs as an INT8 PointWise layer (S02), so the Concat runs INT8 and the cell's
    conv+Add writes INT8 with its skip quantized (P03); the Add of two average pools of an INT8
    tensor is one INT8 PointWise layer, the pools INT8 (P17, P06). The linter agrees."""
    p = plan(NasNet(), 1, 3, 8, 8)
    for relu in ("cells.1.pre.0", "head.0"):
        point = p.point(f"{relu}:input")
        assert (point.quantized, point.rule) == (True, "S02"), point
    for cell in ("cells.0", "cells.1"):
        assert all(pt.quantized for pt in p.points_of(f"{cell}.cat"))
        skip = p.point(f"{cell}.add:input1")
        assert (skip.quantized, skip.rule) == (True, "P03")
        pools = [p.point(f"{cell}.{pool}:input") for pool in ("avg_a", "avg_b")]
        assert all((pt.quantized, pt.rule) == (True, "P06") for pt in pools)
        assert all(pt.quantized and pt.rule == "P17" for pt in p.points_of(f"{cell}.add_1"))
    torch.manual_seed(0)
    report = _lint(NasNet(), torch.randn(4, 3, 8, 8), tmp_path / "nas.onnx")
    assert not {"P03a", "P03d", "P04", "P05", "S02b"} & set(report.rules()), report.format()


class DualPathHead(nn.Module):
    """DPN's last block and head in small: the dual-path Concat of a conv+Add and a conv, read
    by ``silu(bn(x))`` (no conv before it), then the global pool and the classifier; and
    RepViT's head, ``linear(bn1d(x.mean((2, 3))))`` twice (classifier and distillation)."""

    def __init__(self, c: int = 32, repvit: bool = False) -> None:
        super().__init__()
        self.repvit = repvit
        self.stem = nn.Conv2d(3, c, 3, 1, 1)
        self.conv_a = nn.Conv2d(c, c, 3, 1, 1)
        self.conv_b = nn.Conv2d(c, c, 1)
        self.bn = nn.BatchNorm2d(2 * c)
        self.fc = nn.Linear(2 * c, 16)
        self.bn_head = nn.BatchNorm1d(2 * c)
        self.bn_dist = nn.BatchNorm1d(2 * c)
        self.fc_dist = nn.Linear(2 * c, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem(x))
        y = torch.cat([self.conv_a(x) + x, self.conv_b(x)], 1)
        if self.repvit:
            pooled = y.mean((2, 3))
            return (self.fc(self.bn_head(pooled)) + self.fc_dist(self.bn_dist(pooled))) / 2
        return self.fc(F.silu(self.bn(y)).mean((2, 3)))


def test_s02_p06_heads_after_the_last_concat_or_pool_read_int8(tmp_path: Path) -> None:
    """DPN: the last Concat is read only by ``silu(bn(x))`` before the pooled classifier: the
    BatchNorm reads it in INT8 and BN + SiLU run as one INT8 PointWise layer (S02), so the
    conv+Add writes INT8 (no P03d) and its skip is not also read in float. RepViT: each
    BatchNorm1d on the pooled vector reads it in INT8 (P06), so the pool and the last conv+Add
    run INT8; the two BatchNorm1d run on a C-element vector."""
    p = plan(DualPathHead(), 1, 3, 8, 8)
    assert (p.point("bn:input").quantized, p.point("bn:input").rule) == (True, "S02")
    assert all(pt.quantized for pt in p.points_of("cat"))
    torch.manual_seed(0)
    report = _lint(DualPathHead(), torch.randn(4, 3, 8, 8), tmp_path / "dpn.onnx")
    assert not {"P03a", "P03d", "P04", "P05", "S02b"} & set(report.rules()), report.format()
    pw = [ly for ly in report.layers if ly.kind == "pointwise" and "BatchNormalization" in ly.name]
    assert pw and pw[0].input_precision == pw[0].output_precision == "int8", report.format()

    p = plan(DualPathHead(repvit=True).eval(), 1, 3, 8, 8)
    for bn in ("bn_head", "bn_dist"):
        point = p.point(f"{bn}:input")  # P04 where the fan-out BatchNorm step saw it first
        assert point.quantized and point.rule in ("P06", "P04"), point
    assert p.point("mean:input").quantized
    report = _lint(DualPathHead(repvit=True), torch.randn(4, 3, 8, 8), tmp_path / "repvit.onnx")
    assert not {"P03a", "P03d", "P04", "P05", "S02b"} & set(report.rules()), report.format()


class PartialConv(nn.Module):
    """FasterNet's block: a small 3x3 conv on the first channels of a Split, the Concat with the
    untouched ones, an MLP, the residual Add."""

    def __init__(self, c: int = 32, part: int = 8) -> None:
        super().__init__()
        self.part = part
        self.pconv = nn.Conv2d(part, part, 3, 1, 1, bias=False)  # 8 -> 8 channels: H02
        self.mlp = nn.Sequential(
            nn.Conv2d(c, 2 * c, 1, bias=False), nn.BatchNorm2d(2 * c), nn.ReLU(),
            nn.Conv2d(2 * c, c, 1, bias=False),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1, x2 = torch.split(x, [self.part, x.shape[1] - self.part], 1)
        return x + self.mlp(torch.cat([self.pconv(x1), x2], 1))


def test_h02_small_conv_reading_an_int8_tensor_runs_int8(tmp_path: Path) -> None:
    """The partial conv has 8 channels (H02: float on its own), but it reads a slice of the block
    input, which is INT8 for the residual Add already: it reads that INT8 version, so the Split,
    the Concat and the previous block's conv+Add run INT8 (no P04, no P03d), one scale per
    Concat (S02)."""
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, 1, 1), PartialConv(), PartialConv(), nn.Conv2d(32, 8, 1)
    )
    p = plan(model, 1, 3, 8, 8)
    for block in ("1", "2"):
        point = p.point(f"{block}.pconv:input")
        assert point.quantized and "H02" in point.reason, point
    torch.manual_seed(0)
    report = _lint(model, torch.randn(4, 3, 8, 8), tmp_path / "partial.onnx")
    assert not {"P03a", "P03d", "P04", "P05", "S02", "S02b"} & set(report.rules()), report.format()
    small = [ly for ly in report.layers if ly.kind == "weighted" and "pconv" in ly.name]
    assert len(small) == 2 and all(ly.input_precision == "int8" for ly in small)


class Ghost(nn.Module):
    """GhostNet's module: ``cat(x1, cheap(x1))`` with ``x1`` also read by the cheap depthwise
    conv; here the Concat's reader is a GELU (float) before the next conv."""

    def __init__(self, c: int = 32) -> None:
        super().__init__()
        self.primary = nn.Sequential(nn.Conv2d(3, c, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU())
        self.cheap = nn.Sequential(
            nn.Conv2d(c, c, 3, 1, 1, groups=c, bias=False), nn.BatchNorm2d(c), nn.ReLU()
        )
        self.after = nn.Conv2d(2 * c, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = self.primary(x)
        return self.after(F.gelu(torch.cat([x1, self.cheap(x1)], 1)))


def test_p04_fanout_concat_inputs_share_one_scale(tmp_path: Path) -> None:
    """The Concat has no quantized reader, but ``x1`` is INT8 for the cheap conv and the cheap
    conv (through its BatchNorm and ReLU) writes INT8: the Concat runs INT8 (P04), with one
    scale over its inputs (S02), and its float reader takes one Dequantize."""
    p = plan(Ghost(), 1, 3, 8, 8)
    cat = p.points_of("cat")
    assert len(cat) == 2 and all(pt.quantized and pt.rule == "P04" for pt in cat), cat
    assert len({pt.group for pt in cat}) == 1
    torch.manual_seed(0)
    report = _lint(Ghost(), torch.randn(4, 3, 8, 8), tmp_path / "ghost.onnx")
    assert not {"P04", "S01", "S02", "S02b"} & set(report.rules()), report.format()


class SEGeluHead(nn.Module):
    """FastViT's last block: a conv with a residual branch, squeeze-excitation, then
    ``gelu(x * gate)`` before the pooled classifier."""

    def __init__(self, c: int = 32) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, 1, 1)
        self.conv = nn.Sequential(nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c))
        self.fc1, self.fc2 = nn.Conv2d(c, c // 2, 1), nn.Conv2d(c // 2, c, 1)
        self.head = nn.Linear(c, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = self.conv(x) + x
        gate = torch.sigmoid(self.fc2(F.relu(self.fc1(x.mean((2, 3), keepdim=True)))))
        x = F.gelu(x * gate)
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


def test_p04_gating_mul_through_a_gelu_reads_int8(tmp_path: Path) -> None:
    """The fused conv+Add output is read by the SE pool (INT8) and by the gating Mul, whose
    product reaches the quantized head pool through a GELU: the Mul reads the INT8 version and
    Mul + GELU run as one INT8 PointWise layer, so the conv+Add writes INT8 once (no P04, no
    P03d)."""
    p = plan(SEGeluHead(), 1, 3, 8, 8)
    mul = [pt for pt in p.points if pt.consumer.startswith("mul")]
    assert len(mul) == 2 and all(pt.quantized and pt.rule == "P04" for pt in mul), mul
    torch.manual_seed(0)
    report = _lint(SEGeluHead(), torch.randn(4, 3, 8, 8), tmp_path / "fastvit.onnx")
    assert not {"P03d", "P04", "S01"} & set(report.rules()), report.format()
