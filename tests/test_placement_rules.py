"""Each TensorRT placement rule on a tiny block: assertions on the plan and the prepared graph."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qdq
from models.attention import TinyAttention
from models.rse import RSEFPN
from qdq import QuantConfig
from qdq.config import Override
from qdq.graph.plan import QuantPlan
from qdq.rules import RULES, explain

torch.manual_seed(0)
SEEN_RULES: set[str] = set()


def plan(model: nn.Module, *shape: int, config: QuantConfig | None = None) -> QuantPlan:
    p = qdq.plan_of(qdq.prepare(model.eval(), (torch.randn(*shape),), config))
    SEEN_RULES.update(pt.rule for pt in p.points)
    SEEN_RULES.update(pt.share_rule for pt in p.points if pt.share_rule)
    SEEN_RULES.update(pt.format_rule for pt in p.points if pt.format_rule)
    return p


def decisions(p: QuantPlan, owner: str) -> dict[str, tuple[str, str]]:
    return {pt.name.split(":")[1]: (pt.decision, pt.rule) for pt in p.points_of(owner)}


def cbr(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()
    )


class Basic(nn.Module):
    def __init__(self, c: int = 32, stride: int = 1, cin: int | None = None) -> None:
        super().__init__()
        cin = cin or c
        self.conv1 = nn.Conv2d(cin, c, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.down = None
        if stride != 1 or cin != c:
            self.down = nn.Sequential(nn.Conv2d(cin, c, 1, stride, bias=False), nn.BatchNorm2d(c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        identity = x if self.down is None else self.down(x)
        return F.relu(out + identity)


class Net(nn.Module):
    def __init__(self, *blocks: nn.Module) -> None:
        super().__init__()
        self.stem = cbr(16, 32)
        self.blocks = nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.stem(x))


# ----------------------------------------------------------------- P01 / S01
def test_p01_conv_input_and_weight_quantized_per_channel() -> None:
    p = plan(Net(Basic()), 1, 16, 8, 8)
    assert decisions(p, "blocks.0.conv1") == {
        "weight": ("quantize", "P01"),
        "input": ("quantize", "P01"),
    }
    w = p.point("blocks.0.conv1:weight")
    assert w.spec is not None and w.spec.axis == 0
    assert p.point("blocks.0.conv1:input").spec.axis is None  # type: ignore[union-attr]


def test_p03_identity_block_quantizes_only_the_skip_and_shares_its_scale() -> None:
    p = plan(Net(Basic()), 1, 16, 8, 8)
    add = decisions(p, "blocks.0.add")
    assert add["input0"] == ("skip", "P03")  # conv2 + bn2 branch: fused
    assert add["input1"][0] == "share"  # identity skip: quantized...
    skip = p.point("blocks.0.add:input1")
    assert skip.rule == "P03" and skip.share_rule == "S01"  # ...with conv1's input scale (S04)
    assert p.group_of("blocks.0.add:input1") == p.group_of("blocks.0.conv1:input")


def test_p03_downsample_block_quantizes_the_short_branch() -> None:
    p = plan(Net(Basic(64, stride=2, cin=32), Basic(64)), 1, 16, 8, 8)
    add = decisions(p, "blocks.0.add")
    assert add == {"input0": ("skip", "P03"), "input1": ("quantize", "P03")}
    assert p.point("blocks.0.add:input1").producer.startswith(
        "blocks_0_down_1"
    )  # downsample BN out
    # downsample conv and conv1 read the same tensor: one quantizer
    assert p.group_of("blocks.0.down.0:input") == p.group_of("blocks.0.conv1:input")


def test_p03_skip_stays_float_when_the_fused_output_stays_float() -> None:
    # the last block: nothing quantized reads its output, so the conv+Add fusion writes float and
    # reads its residual in float (lint P03d); the downsample output, read only by the Add, stays
    # float -- while an identity skip, shared with conv1's quantized input, keeps its Q/DQ
    down = plan(Net(Basic(64, stride=2, cin=32)), 1, 16, 8, 8)
    assert decisions(down, "blocks.0.add") == {"input0": ("skip", "P03"), "input1": ("skip", "P03")}
    assert "stays float" in down.point("blocks.0.add:input1").reason
    same = plan(Net(Basic()), 1, 16, 8, 8)
    assert decisions(same, "blocks.0.add")["input1"] in (("quantize", "P03"), ("share", "P03"))


def test_prepared_model_quantizes_each_tensor_once_for_all_its_readers() -> None:
    prepared = qdq.prepare(Net(Basic()).eval(), (torch.randn(1, 16, 8, 8),))
    qdq.calibrate(prepared, [torch.randn(2, 16, 8, 8)], show_progress=False)
    calls: dict[str, list[torch.Tensor]] = {}
    handles = [
        q.register_forward_hook(lambda m, a, out, n=n: calls.setdefault(n, []).append(out))
        for n, q in qdq.quantizers_of(prepared).items()
    ]
    seen: list[torch.Tensor] = []
    add = prepared.blocks[0]
    handles.append(add.register_forward_hook(lambda m, a, out: seen.append(a[0])))
    prepared(torch.randn(1, 16, 8, 8))
    for h in handles:
        h.remove()
    acts = {n: v for n, v in calls.items() if "weight" not in n}
    # the block input is read by conv1 and by the Add (skip operand): one quantizer call, shared
    assert all(len(v) == 1 for v in acts.values()), {n: len(v) for n, v in acts.items()}
    assert "blocks.0.conv1.input_quantizer" in acts
    assert qdq.plan_of(prepared).group_of("blocks.0.add:input1") == qdq.plan_of(prepared).group_of(
        "blocks.0.conv1:input"
    )


def test_p05_add_without_conv_branch_stays_float() -> None:
    class Gate(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(16, 16, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(x)
            return self.conv(y + torch.sigmoid(x))

    p = plan(Gate(), 1, 16, 8, 8)
    assert {d for d, _ in decisions(p, "add").values()} == {"skip"}
    assert {r for _, r in decisions(p, "add").values()} == {"P05"}


# ---------------------------------------------------------------------- S02
class CSP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cv1 = nn.Sequential(nn.Conv2d(32, 32, 1, bias=False), nn.BatchNorm2d(32), nn.SiLU())
        self.cv2 = nn.Sequential(nn.Conv2d(32, 32, 1, bias=False), nn.BatchNorm2d(32), nn.SiLU())
        self.m = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.SiLU())
        self.cv3 = nn.Conv2d(64 + 16, 32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.cv1(x).chunk(2, dim=1)
        return self.cv3(torch.cat([a, b, self.m(b), self.cv2(x)], dim=1))


def test_s02_concat_inputs_and_consumer_share_one_group() -> None:
    p = plan(CSP(), 1, 32, 8, 8)
    cat_points = [pt for pt in p.points if pt.op == "cat"]
    assert len(cat_points) == 4 and all(pt.quantized for pt in cat_points)
    groups = {pt.group for pt in cat_points} | {p.point("cv3:input").group}
    groups |= {p.point("m.0:input").group}  # b is read by m.0 and the cat: one tensor (S01/S03)
    assert len(groups) == 1
    group = p.group_of("cv3:input")
    assert group is not None and "S02" in group.rules


def test_s02_concat_feeding_only_float_ops_stays_float() -> None:
    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Conv2d(16, 16, 3)
            self.b = nn.Conv2d(16, 16, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.softmax(torch.cat([self.a(x), self.b(x)], 1), dim=1)

    p = plan(Head(), 1, 16, 8, 8)
    assert all(pt.decision == "skip" and pt.rule == "S02" for pt in p.points if pt.op == "cat")


# ---------------------------------------------------------------------- S03
class SPPF(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cv1 = nn.Sequential(nn.Conv2d(32, 16, 1, bias=False), nn.BatchNorm2d(16), nn.SiLU())
        self.pool = nn.MaxPool2d(5, 1, 2)
        self.cv2 = nn.Conv2d(64, 32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        y1 = self.pool(x)
        y2 = self.pool(y1)
        return self.cv2(torch.cat([x, y1, y2, self.pool(y2)], 1))


def test_s03_sppf_maxpools_and_concat_share_one_scale() -> None:
    p = plan(SPPF(), 1, 32, 8, 8)
    cat_groups = {pt.group for pt in p.points if pt.op == "cat"}
    assert len(cat_groups) == 1
    group = p.groups[cat_groups.pop()]  # type: ignore[index]
    assert "pool" in group.crosses and "cv2:input" in group.members


def test_s03_maxpool_stem_feeds_conv_and_skip_with_one_quantizer() -> None:
    class Stem(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = cbr(16, 32)
            self.pool = nn.MaxPool2d(3, 2, 1)
            self.block = Basic()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.block(self.pool(self.conv(x)))

    p = plan(Stem(), 1, 16, 16, 16)
    assert p.group_of("block.add:input1") == p.group_of("block.conv1:input")
    assert p.point("block.conv1:input").producer == "pool"


def test_s03_copy_ops_share_scale_across_reshape() -> None:
    class Flat(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(16, 16, 3, padding=1)
            self.fc = nn.Linear(16 * 4 * 4, 32)
            self.fc2 = nn.Linear(16 * 4 * 4, 32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = F.relu(self.conv(x))
            return self.fc(torch.flatten(y, 1)) + self.fc2(y.view(y.shape[0], -1))

    p = plan(Flat(), 2, 16, 4, 4)
    assert p.group_of("fc:input") == p.group_of("fc2:input")
    assert p.point("fc2:input").share_rule == "S03"


# ---------------------------------------------------------------------- P06
def test_p06_global_average_pool_input_is_quantized() -> None:
    class Cls(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = cbr(16, 32)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(32, 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(torch.flatten(self.pool(self.conv(x)), 1))

    p = plan(Cls(), 2, 16, 8, 8)
    assert decisions(p, "pool") == {"input": ("quantize", "P06")}
    assert p.group_of("pool:input") != p.group_of("fc:input")  # avg pool does not commute


def test_p06_functional_mean_pool_counts_as_average_pool() -> None:
    class Cls(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = cbr(16, 32)
            self.fc = nn.Linear(32, 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.conv(x).mean((2, 3)))

    p = plan(Cls(), 2, 16, 8, 8)
    assert decisions(p, "mean") == {"input": ("quantize", "P06")}


# ---------------------------------------------------------------------- P07
@pytest.mark.parametrize("functional", [False, True])
def test_p07_silu_epilogue_has_no_qdq_inside(functional: bool) -> None:
    class SiluConv(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(16, 32, 3, padding=1, bias=False)
            self.bn = nn.BatchNorm2d(32)
            self.act = nn.SiLU()
            self.conv2 = nn.Conv2d(32, 32, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.bn(self.conv(x))
            y = y * torch.sigmoid(y) if functional else self.act(y)
            return self.conv2(y)

    p = plan(SiluConv(), 1, 16, 8, 8)
    quantized = {pt.name for pt in p.points if pt.quantized}
    assert quantized == {"conv:input", "conv:weight", "conv2:input", "conv2:weight"}
    assert any(pt.rule == "P07" and pt.decision == "skip" for pt in p.points)


# ---------------------------------------------------------------------- P08
def test_p08_quantizer_moves_in_front_of_zero_pad() -> None:
    class SamePad(nn.Conv2d):  # like EfficientNet's Conv2dStaticSamePadding
        def __init__(self) -> None:
            super().__init__(16, 32, 3, stride=2, bias=False)
            self.pad = nn.ZeroPad2d((0, 1, 0, 1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.conv2d(self.pad(x), self.weight, self.bias, self.stride, 0)

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = SamePad()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x)

    p = plan(M(), 1, 16, 9, 9)
    point = p.point("conv:input")
    assert point.rule == "P08" and point.consumer == "conv_pad"  # reads the Pad's input
    assert p.point("conv:weight").decision == "quantize"  # the Conv2d subclass is covered
    assert p.coverage[0].status == "int8"


def test_functional_conv_on_parameters_is_quantized() -> None:
    class Fn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(32, 16, 3, 3))
            self.lw = nn.Parameter(torch.randn(64, 32))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = F.conv2d(x, self.w, padding=1).mean((2, 3))
            return F.linear(y, self.lw)

    p = plan(Fn(), 2, 16, 8, 8)
    assert decisions(p, "conv2d") == {"weight": ("quantize", "P01"), "input": ("quantize", "P01")}
    assert decisions(p, "linear") == {"weight": ("quantize", "P01"), "input": ("quantize", "P01")}


# ------------------------------------------------------------ V12 / P14 / H02
def test_v12_conv_transpose_weights_per_tensor_unless_asked() -> None:
    class Up(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = cbr(16, 32)
            self.up = nn.ConvTranspose2d(32, 32, 4, 2, 1, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.up(self.conv(x))

    w = plan(Up(), 1, 16, 8, 8).point("up:weight")
    assert w.rule == "V12" and w.spec is not None and w.spec.axis is None
    w1 = plan(Up(), 1, 16, 8, 8, config=QuantConfig(conv_transpose_axis=1)).point("up:weight")
    assert w1.spec is not None and w1.spec.axis == 1


def test_p16_attention_products_int8_tiny_gemm_float_weight_matmul_quantized() -> None:
    class Attn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q = nn.Linear(32, 32)
            self.k = nn.Linear(32, 32)
            self.proj = nn.Parameter(torch.randn(32, 64))
            self.tiny = nn.Linear(64, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            att = torch.softmax(self.q(x) @ self.k(x).transpose(-2, -1), dim=-1)
            return self.tiny(torch.matmul(att @ x, self.proj))

    p = plan(Attn(), 2, 8, 32)
    assert decisions(p, "matmul") == {"input0": ("quantize", "P16"), "input1": ("quantize", "P16")}
    assert decisions(p, "matmul_1") == {
        "input0": ("quantize", "P16"),  # the softmax probabilities
        "input1": ("share", "P16"),  # x: the same tensor q and k were computed from (S01)
    }
    proj = p.point("matmul_2:weight")
    assert proj.decision == "quantize" and proj.spec is not None and proj.spec.axis == 1
    assert decisions(p, "tiny")["weight"] == ("skip", "P14")
    off = plan(Attn(), 2, 8, 32, config=QuantConfig.tensorrt(disable=("attention",)))
    assert {d for d, _ in decisions(off, "matmul").values()} == {"skip"}


class SDPA(nn.Module):
    """timm-style attention: qkv Linear, F.scaled_dot_product_attention, output projection."""

    def __init__(self, dim: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, n, c))


def test_p16_sdpa_is_planned_as_its_two_products() -> None:
    p = plan(SDPA(), 2, 8, 32)
    points = {pt.name: (pt.decision, pt.rule) for pt in p.points if pt.rule in ("P16", "P14")}
    assert points == {
        "matmul:input0": ("quantize", "P16"),  # q * scale: the scale multiplies Q before BMM1
        "matmul:input1": ("quantize", "P16"),  # kᵀ
        "matmul_1:input0": ("quantize", "P16"),  # softmax probabilities
        "matmul_1:input1": ("share", "P16"),  # v: a slice of qkv, like k (S03)
    }
    assert "softmax" not in {pt.op for pt in p.points}


def test_p14_activation_matmuls_outside_attention_and_long_sequences_stay_float() -> None:
    class Gram(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x @ x.transpose(-2, -1))

    p = plan(Gram(), 1, 8, 16)
    assert {r for _, r in decisions(p, "matmul").values()} == {"P14"}
    long = plan(SDPA(dim=16), 1, 520, 16)
    assert {pt.rule for pt in long.points if pt.op == "matmul"} == {"P14"}
    assert "520 keys" in long.point("matmul:input0").reason


def test_h02_odd_small_conv_skipped_unless_performance_rules_are_off() -> None:
    class Small(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1 = nn.Conv2d(3, 28, 3)  # MTCNN RNet-like: 28 % 8 != 0
            self.c2 = nn.Conv2d(28, 32, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c2(self.c1(x))

    p = plan(Small(), 1, 3, 12, 12)
    assert decisions(p, "c1")["weight"] == ("skip", "H02")
    p2 = plan(Small(), 1, 3, 12, 12, config=QuantConfig(disabled=frozenset({"performance"})))
    assert decisions(p2, "c1")["weight"] == ("quantize", "P01")


# ------------------------------------------------------------- overrides, families
def test_user_exclusions_by_name_regex_type_and_op() -> None:
    net = Net(Basic(), Basic())
    cfg = QuantConfig.tensorrt().exclude(name="blocks.0.conv1")
    assert decisions(plan(net, 1, 16, 8, 8, config=cfg), "blocks.0.conv1")["weight"] == (
        "skip",
        "USER",
    )
    cfg = QuantConfig.tensorrt().exclude(regex=r"^blocks\.1\.")
    p = plan(net, 1, 16, 8, 8, config=cfg)
    assert all(pt.decision == "skip" for pt in p.points if pt.owner.startswith("blocks.1."))
    cfg = QuantConfig.tensorrt().exclude(module_type=nn.Conv2d)
    assert not any(pt.quantized for pt in plan(net, 1, 16, 8, 8, config=cfg).points)
    cfg = QuantConfig.tensorrt().exclude(op="add")
    assert all(
        r == "USER"
        for _, r in decisions(plan(net, 1, 16, 8, 8, config=cfg), "blocks.0.add").values()
    )


def test_overrides_change_calibration_and_bits() -> None:
    o = qdq.Override(name="blocks.0.conv2", calib=qdq.CalibSpec(method="percentile"), num_bits=6)
    p = plan(Net(Basic()), 1, 16, 8, 8, config=QuantConfig.tensorrt().with_override(o))
    point = p.point("blocks.0.conv2:input")
    assert point.calib is not None and point.calib.method == "percentile"
    assert point.spec is not None and point.spec.num_bits == 6
    assert p.point("blocks.0.conv2:weight").spec.num_bits == 6  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("family", "owner", "rule"), [("residual", "blocks.0.add", "P03"), ("concat", "cat", "S02")]
)
def test_rule_families_can_be_switched_off(family: str, owner: str, rule: str) -> None:
    model = Net(Basic()) if family == "residual" else CSP()
    shape = (1, 16, 8, 8) if family == "residual" else (1, 32, 8, 8)
    p = plan(model, *shape, config=QuantConfig.tensorrt(disable=(family,)))
    assert all(pt.decision == "skip" and pt.rule == rule for pt in p.points_of(owner))


def test_pooling_family_off_gives_separate_scales_across_maxpool() -> None:
    p = plan(SPPF(), 1, 32, 8, 8, config=QuantConfig.tensorrt(disable=("pooling",)))
    cat = [pt for pt in p.points if pt.op == "cat"]
    # the Concat still groups its inputs (S02), but the pools no longer appear as crossed
    assert all(not p.groups[pt.group].crosses for pt in cat if pt.group is not None)


def test_bad_config_values_are_rejected() -> None:
    with pytest.raises(ValueError, match="unknown rule families"):
        QuantConfig.tensorrt(disable=("residuals",))
    with pytest.raises(ValueError, match="needs at least one of"):
        qdq.Override(exclude=True)
    with pytest.raises(ValueError, match="invalid regex"):
        qdq.Override(regex="(", exclude=True)
    with pytest.raises(ValueError, match="conv_transpose_axis"):
        QuantConfig(conv_transpose_axis=0)


# ------------------------------------------------------- squeeze-excitation, stochastic depth
class SE(nn.Module):
    """conv -> x; gate = sigmoid(fc2(relu(fc1(avgpool(x))))); x * gate -> conv. With
    ``act_after`` (ReXNet's block) a ReLU6 sits between the Mul and the conv."""

    def __init__(self, c: int = 32, act_after: bool = False) -> None:
        super().__init__()
        self.conv = cbr(16, c)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(c, 16, 1)
        self.fc2 = nn.Conv2d(16, c, 1)
        self.act = nn.ReLU6() if act_after else nn.Identity()
        self.out = nn.Conv2d(c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        gate = torch.sigmoid(self.fc2(F.relu(self.fc1(self.pool(x)))))
        return self.out(self.act(x * gate))


@pytest.mark.parametrize("act_after", [False, True], ids=["mul-conv", "mul-relu6-conv"])
def test_p04_gating_mul_quantizes_both_operands_sharing_the_pool_scale(act_after: bool) -> None:
    p = plan(SE(act_after=act_after), 1, 16, 8, 8)
    mul = [pt for pt in p.points if pt.op == "mul"]
    assert [(pt.decision, pt.rule) for pt in mul] in (
        [("quantize", "P04"), ("share", "P04")],
        [("share", "P04"), ("quantize", "P04")],
        [("share", "P04"), ("share", "P04")],
    )
    pool = next(pt for pt in p.points if pt.op == "avg_pool")
    x_use = next(pt for pt in mul if pt.producer == pool.producer)
    assert x_use.group == pool.group  # one quantizer on x for the pool and the Mul (S01)
    off = plan(SE(), 1, 16, 8, 8, config=QuantConfig.tensorrt(disable=("fanout",)))
    assert not [pt for pt in off.points if pt.op == "mul" and pt.quantized]


def test_p17_gated_residual_add_and_its_mul_form_one_int8_pointwise_layer() -> None:
    p = plan(RSEFPN(), 1, 16, 16, 16)
    add, mul = decisions(p, "lat2.add"), decisions(p, "lat2.mul")
    assert add["input0"] == ("quantize", "P17") or add["input0"] == ("share", "P17")
    assert add["input1"] == ("skip", "P17")  # the Mul -> Add edge stays inside the PointWise
    assert {d[1] for d in mul.values()} <= {"P17", "P04"} and all(
        d[0] != "skip" for d in mul.values()
    )
    # x has one INT8 version for the SE pool, the Mul and the Add (S01)
    x = p.point("lat2.add:input0").producer
    readers = [pt for pt in p.points if pt.producer == x and pt.quantized]
    assert {pt.owner for pt in readers} == {"lat2.pool", "lat2.mul", "lat2.add"}
    assert len({pt.group for pt in readers}) == 1
    # the FPN top-down Add: both operands quantized, the upsampled level shares its scale
    top_down = decisions(p, "add")
    assert {d for d, _ in top_down.values()} <= {"quantize", "share"}
    assert {r for _, r in top_down.values()} == {"P17"}
    assert p.point("add:input1").group == p.point("out3.in_conv:input").group  # S03 across
    assert not [pt for pt in p.points if pt.op == "add" and pt.rule == "P05"]
    off = plan(RSEFPN(), 1, 16, 16, 16, config=QuantConfig.tensorrt(disable=("residual",)))
    assert not [pt for pt in off.points if pt.rule == "P17"]
    excluded = plan(RSEFPN(), 1, 16, 16, 16, config=QuantConfig.tensorrt().exclude(op="mul"))
    assert decisions(excluded, "lat2.add") == {"input0": ("skip", "P05"), "input1": ("skip", "P05")}


class RepVGGBlock(nn.Module):
    """RepVGG's training form: relu(bn(conv3x3(x)) + bn(conv1x1(x)) + bn(x))."""

    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.kxk = nn.Sequential(nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c))
        self.k1 = nn.Sequential(nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c))
        self.identity = nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_id = self.identity(x)
        y = self.k1(x) + self.kxk(x)
        return F.relu(y + x_id)


def test_p04_repvgg_identity_bn_reads_int8_and_its_add_runs_int8() -> None:
    p = plan(nn.Sequential(RepVGGBlock(), RepVGGBlock()), 1, 16, 8, 8)
    bn = p.point("1.identity:input")
    assert bn.rule == "P04" and bn.quantized
    conv_in = p.point("1.k1.0:input")
    assert bn.group == conv_in.group  # the block input's one INT8 version (S01)
    adds = {pt.name: (pt.decision, pt.rule) for pt in p.points if pt.owner == "1.add_1"}
    assert adds == {"1.add_1:input0": ("quantize", "P04"), "1.add_1:input1": ("skip", "P05")}
    assert p.point("0.identity:input").rule == "P04"  # the network input is read by convs too
    off = plan(RepVGGBlock(), 1, 16, 8, 8, config=QuantConfig.tensorrt(disable=("fanout",)))
    assert not [pt for pt in off.points if pt.rule == "P04"]


def test_stochastic_depth_is_the_identity_for_the_residual_rule() -> None:
    tvops = pytest.importorskip("torchvision.ops")

    class Block(Basic):
        def __init__(self) -> None:
            super().__init__()
            self.sd = tvops.StochasticDepth(0.2, "row")

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.sd(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))
            return F.relu(out + x)

    p = plan(Net(Block()), 1, 16, 8, 8)
    add = [pt for pt in p.points if pt.op == "add"]
    assert {pt.rule for pt in add} == {"P03"}
    assert sorted(pt.decision for pt in add) == ["share", "skip"]


class LayerScaleBlock(nn.Module):
    """ConvNeXt's block: depthwise conv, channels-last Linear MLP, LayerScale ``x * gamma``."""

    def __init__(self, c: int = 32) -> None:
        super().__init__()
        self.conv_dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c)
        self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.full((c,), 1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.conv_dw(x).permute(0, 2, 3, 1))
        y = self.fc2(F.gelu(self.fc1(y))).permute(0, 3, 1, 2)
        return y.mul(self.gamma.reshape(1, -1, 1, 1)) + x


def test_p03_layerscale_is_part_of_the_linear_epilogue() -> None:
    # gamma.reshape(...) is computed from a parameter only: a constant operand, not a second
    # activation, so fc2 -> permute -> mul(gamma) is fc2's epilogue and the Add fuses into it
    p = plan(Net(LayerScaleBlock()), 1, 16, 8, 8)
    (add,) = {pt.owner for pt in p.points if pt.op == "add"}
    got = decisions(p, add)
    assert got["input0"] == ("skip", "P03")  # fc2 branch: fused
    assert got["input1"][1] == "P03" and got["input1"][0] in ("quantize", "share")
    assert not [pt for pt in p.points if pt.op == "mul" and pt.quantized]


class PreNormBlock(nn.Module):
    """A transformer block: x + proj(norm(x)), then the next LayerNorm reads the sum."""

    def __init__(self, c: int = 32) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.fc, self.proj = nn.Linear(c, c), nn.Linear(c, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.proj(F.gelu(self.fc(self.norm1(x))))
        return self.norm2(x)


def test_p15_pre_norm_residual_stream_stays_float() -> None:
    p = plan(PreNormBlock(), 1, 8, 32)
    add = [pt for pt in p.points if pt.op == "add"]
    assert add and {(pt.decision, pt.rule) for pt in add} == {("skip", "P15")}
    assert "norm1" in add[0].reason or "norm2" in add[0].reason
    assert decisions(p, "fc")["input"][0] == "quantize"  # the GEMMs themselves stay INT8
    assert decisions(p, "proj")["input"][0] == "quantize"


# ------------------------------------------------------------------- the rule table
def test_in_place_add_on_a_quantized_operand_never_mutates_a_shared_quantized_value() -> None:
    """RepVGG's ``x += identity`` with ``x`` quantized (P04): the in-place op runs out of place on
    a fresh quantized copy; another reader of the same quantized tensor still sees Q(x)."""

    class Shared(RepVGGBlock):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x_id = self.identity(x)
            y = self.k1(x) + self.kxk(x)
            z = y * 1.0
            z += x_id
            return torch.cat([F.relu(z), y], dim=1)

    torch.manual_seed(0)
    model = nn.Sequential(RepVGGBlock(), Shared()).eval()
    x = torch.randn(2, 16, 8, 8)
    prepared = qdq.prepare(model, (x,))
    qdq.calibrate(prepared, [x], show_progress=False)
    with torch.no_grad():
        out = prepared(x)
        again = prepared(x)
    assert torch.equal(out, again)
    with qdq.quantizer_mode(prepared, "bypass"), torch.no_grad():
        assert torch.allclose(prepared(x), model(x), atol=1e-5)


class GhostBottleneck(nn.Module):
    """GhostNet's block without SE: ``cat(x1, cheap(x1))`` with ``x1 = primary(x)`` (the cheap op
    a depthwise conv of ``x1``), sliced to the output width and summed with the identity."""

    def __init__(self, c: int = 64) -> None:
        super().__init__()
        half = c // 2
        self.primary = nn.Sequential(nn.Conv2d(c, half, 1, bias=False), nn.BatchNorm2d(half))
        self.cheap = nn.Sequential(
            nn.Conv2d(half, half, 3, 1, 1, groups=half, bias=False), nn.BatchNorm2d(half)
        )
        self.c = c

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = self.primary(x)
        out = torch.cat([x1, self.cheap(x1)], dim=1)
        return out[:, : self.c] + x


class GhostNetTiny(nn.Module):
    def __init__(self, c: int = 64) -> None:
        super().__init__()
        self.stem = cbr(16, c)
        self.blocks = nn.Sequential(GhostBottleneck(c), GhostBottleneck(c))
        self.head = nn.Conv2d(c, 32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


def test_s02_concat_whose_only_quantized_reader_is_a_p17_add_is_quantized(tmp_path) -> None:
    """The Concat is planned before the float residual Add (P17) quantizes its output: planned
    again once it has that reader, its inputs share the Add's scale, so the primary conv's
    output is INT8 for both its readers (no P04) and no Concat input is float (no S02b)."""
    p = plan(GhostNetTiny(), 1, 16, 16, 16)
    for block in ("blocks.0", "blocks.1"):
        cat, add = decisions(p, f"{block}.cat"), decisions(p, f"{block}.add")
        assert {d for d, _ in cat.values()} <= {"quantize", "share"}, cat
        assert {r for _, r in cat.values()} == {"S02"}
        assert {r for _, r in add.values()} == {"P17"}
        group = p.point(f"{block}.add:input0").group
        assert p.point(f"{block}.cat:input0").group == p.point(f"{block}.cat:input1").group == group
        # x1 has one INT8 version, for the cheap conv and the Concat (S01)
        x1 = p.point(f"{block}.cat:input0").producer
        readers = [pt for pt in p.points if pt.producer == x1 and pt.quantized]
        assert {pt.owner for pt in readers} == {f"{block}.cheap.0", f"{block}.cat"}
        assert len({pt.group for pt in readers}) == 1
    torch.manual_seed(0)
    x = torch.randn(2, 16, 16, 16)
    prepared = qdq.prepare(GhostNetTiny().eval(), (x[:1],))
    qdq.calibrate(prepared, [x], method="max", show_progress=False)
    path = qdq.export_onnx(prepared, (x[:1],), tmp_path / "ghost.onnx", exporter="torchscript").path
    report = qdq.lint.lint(path)
    assert not {"P04", "S02b", "S02"} & set(report.rules()), report.format()
    assert report.summary["int8_weighted_layers"] == report.summary["weighted_layers"]


class GhostBottleneckWrapped(GhostBottleneck):
    """The same block with its Concat wrapped in a one-input Concat (generic code that
    concatenates a list of branches, here of one)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = self.primary(x)
        out = torch.cat([torch.cat([x1, self.cheap(x1)], dim=1)], dim=1)
        return out[:, : self.c] + x


def test_s02_a_one_input_concat_left_float_is_planned_again_too() -> None:
    """A one-input Concat's point is labelled ``input`` when left float as when quantized, so the
    re-planning finds it: both Concats quantized, one point per Concat input."""
    net = nn.Sequential(cbr(16, 64), GhostBottleneckWrapped(), nn.Conv2d(64, 32, 1))
    p = plan(net, 1, 16, 16, 16)
    cats = [pt for pt in p.points if pt.op == "cat"]
    assert sorted(pt.name for pt in cats) == ["1.cat:input0", "1.cat:input1", "1.cat_1:input"]
    assert {(pt.quantized, pt.rule) for pt in cats} == {(True, "S02")}
    assert len({pt.group for pt in cats}) == 1


def _conv_bn(cin: int, cout: int, k: int = 1, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout))


class HRFusion(nn.Module):
    """HRNet's multi-resolution fusion over three branches (widths 16/32/64, each half the
    resolution of the one before): every output sums its own branch, the upsampled 1x1 convs of
    the lower resolutions and the strided 3x3 convs of the higher ones, as a chain of Adds
    (``(x0 + up(x1)) + up(x2)``), then a ReLU; every branch is read by a conv after it."""

    def __init__(self) -> None:
        super().__init__()
        w = (16, 32, 64)
        self.stems = nn.ModuleList([cbr(16, w[0]), cbr(16, w[1], 2), cbr(16, w[2], 4)])
        self.up = nn.ModuleDict({f"{i}{j}": _conv_bn(w[j], w[i]) for i in range(3)
                                 for j in range(i + 1, 3)})  # fmt: skip
        self.down = nn.ModuleDict({f"{i}{j}": _conv_bn(w[j], w[i], 3, 2 ** (i - j))
                                   for i in range(3) for j in range(i)})  # fmt: skip
        self.heads = nn.ModuleList([nn.Conv2d(c, 8, 3, padding=1) for c in w])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        xs = [s(x) for s in self.stems]
        out = []
        for i in range(3):
            y = xs[i] if i == 0 else self.down[f"{i}0"](xs[0])
            for j in range(1, 3):
                if j < i:
                    y = y + self.down[f"{i}{j}"](xs[j])
                elif j == i:
                    y = y + xs[i]
                else:
                    up = self.up[f"{i}{j}"](xs[j])
                    y = y + F.interpolate(up, scale_factor=2 ** (j - i), mode="nearest")
            out.append(self.heads[i](F.relu(y)))
        return out


def test_p17_multi_resolution_fusion_adds_run_int8(tmp_path) -> None:
    """HRNet's fusion Adds: the upsampled branch cannot fuse into a conv (the Resize between), the
    sum is a chain of Adds and a ReLU reads it. The chain is one INT8 PointWise layer (P17: its
    head's output reaches the next conv through the ReLU; the inner Adds are inside it), and a
    conv+Add fused with an INT8 skip (P03) inside the chain writes INT8: no float Add, nothing
    for the linter to warn about (P03a/P03d/P04) and no standalone Q/DQ but the input's."""
    p = plan(HRFusion(), 1, 16, 32, 32)
    adds = [pt for pt in p.points if pt.op == "add"]
    assert adds and not [pt for pt in adds if pt.rule == "P05"], [
        (pt.name, pt.rule) for pt in adds if pt.rule == "P05"
    ]
    inside = [pt for pt in adds if pt.reason.startswith("Add fused with this Add")]
    # y0's (x0 + up(x1)) is inside its chain; y1's and y2's first Adds fuse into a strided conv
    assert len(inside) == 1 and inside[0].decision == "skip"
    assert [pt.rule for pt in adds].count("P03") >= 2
    torch.manual_seed(0)
    x = torch.randn(2, 16, 32, 32)
    prepared = qdq.prepare(HRFusion().eval(), (x[:1],))
    qdq.calibrate(prepared, [x], method="max", show_progress=False)
    path = qdq.export_onnx(prepared, (x[:1],), tmp_path / "hr.onnx", exporter="torchscript").path
    report = qdq.lint.lint(path)
    assert not {"P03a", "P03d", "P04", "S02b", "S03"} & set(report.rules()), report.format()
    assert report.summary["unfused_qdq"] == 1 and report.summary["float_islands"] == 0
    off = plan(HRFusion(), 1, 16, 32, 32, config=QuantConfig.tensorrt(disable=("residual",)))
    assert not [pt for pt in off.points if pt.rule == "P17"]


class PoolMixerBlock(nn.Module):
    """EfficientFormer's / PoolFormer's conv block: a pooling token mixer with LayerScale and
    stochastic depth, ``x + drop(gamma1 * (avg_pool(x) - x))``, then a conv MLP residual."""

    def __init__(self, c: int = 32) -> None:
        super().__init__()
        self.pool = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        self.gamma1 = nn.Parameter(torch.full((c, 1, 1), 0.5))
        self.drop = nn.Identity()
        self.mlp = nn.Sequential(
            nn.Conv2d(c, 2 * c, 1), nn.BatchNorm2d(2 * c), nn.ReLU(),
            nn.Conv2d(2 * c, c, 1), nn.BatchNorm2d(c),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.gamma1 * (self.pool(x) - x))
        return x + self.mlp(x)


def test_p17_pooling_mixer_is_one_int8_pointwise_layer(tmp_path) -> None:
    """The mixer's Sub, LayerScale and stochastic depth join the residual Add's PointWise layer:
    its inputs (``x`` once for the pool, the Sub and the Add; the pool's output) are quantized,
    nothing inside it is, and the pool runs INT8 (P06, planned again once the Sub reads it
    quantized); the block output is INT8 for every reader (no P03d/P04)."""
    net = nn.Sequential(cbr(16, 32), PoolMixerBlock(), PoolMixerBlock(), nn.Conv2d(32, 8, 1))
    p = plan(net, 1, 16, 16, 16)
    for block in ("2",):  # the second block: its input is the first block's fused conv+Add
        inside = [pt for pt in p.points if pt.owner.startswith(block) and "fused with this Add"
                  in pt.reason]  # fmt: skip
        assert len(inside) == 3 and all(pt.decision == "skip" for pt in inside)  # drop, scale, Sub
        assert decisions(p, f"{block}.pool")["input"][0] in ("quantize", "share")
        x = p.point(f"{block}.add:input0").producer
        readers = [pt for pt in p.points if pt.producer == x and pt.quantized]
        assert {pt.rule for pt in readers} <= {"P17", "P06"} and len(readers) == 3
        assert len({pt.group for pt in readers}) == 1
    torch.manual_seed(0)
    x = torch.randn(2, 16, 16, 16)
    prepared = qdq.prepare(net.eval(), (x[:1],))
    qdq.calibrate(prepared, [x], method="max", show_progress=False)
    path = qdq.export_onnx(prepared, (x[:1],), tmp_path / "pool.onnx", exporter="torchscript").path
    report = qdq.lint.lint(path)
    rules = set(report.rules())
    assert not {"P03d", "P04", "S02b", "S03"} & rules, report.format()


class _GroupNorm1(nn.GroupNorm):
    """timm's ``GroupNorm1``: one group, its forward calling ``F.group_norm``."""

    def __init__(self, c: int) -> None:
        super().__init__(1, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)


class PreNormPoolBlock(nn.Module):
    """PoolFormerV2's block: the pooling mixer behind a GroupNorm, ``x + g1 * (pool(n1(x)) -
    n1(x))``, then ``x + g2 * mlp(n2(x))`` (the MLP's conv+Add fuses with the INT8 skip)."""

    def __init__(self, c: int = 32) -> None:
        super().__init__()
        self.norm1, self.norm2 = _GroupNorm1(c), _GroupNorm1(c)
        self.pool = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        self.g1 = nn.Parameter(torch.full((c, 1, 1), 0.5))
        self.mlp = nn.Sequential(nn.Conv2d(c, 2 * c, 1), nn.ReLU(), nn.Conv2d(2 * c, c, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm1(x)
        x = x + self.g1 * (self.pool(y) - y)
        return x + self.mlp(self.norm2(x))


def test_p17_leaves_a_fused_output_float_when_a_norm_reads_it(tmp_path) -> None:
    """A conv+Add fused with an INT8 skip counts as an INT8 operand of a PointWise layer only
    when nothing reads it in float: PoolFormerV2's block output is read by the next block's
    GroupNorm, so quantizing it for the next Add would cost that norm a Dequantize (P04)."""
    net = nn.Sequential(cbr(16, 32), PreNormPoolBlock(), PreNormPoolBlock(), nn.Conv2d(32, 8, 1))
    torch.manual_seed(0)
    x = torch.randn(2, 16, 16, 16)
    prepared = qdq.prepare(net.eval(), (x[:1],))
    assert not [pt for pt in qdq.plan_of(prepared).points if pt.rule == "P17"]
    qdq.calibrate(prepared, [x], method="max", show_progress=False)
    path = qdq.export_onnx(prepared, (x[:1],), tmp_path / "pre.onnx", exporter="torchscript").path
    report = qdq.lint.lint(path)
    # the functional group_norm is a norm: block 2's skip stays float for it (P15), no P04
    assert not {"P03d", "P04", "S02b", "S03"} & set(report.rules()), report.format()


# ------------------------------------------------------------- formats (F01-F06, issue 49)
class _MixedNet(nn.Module):
    """A depthwise-separable stem (a plain 3x3 conv with ``depthwise=False``), a plain residual
    block, an attention-style product and a Linear: every FP8 format rule on one graph."""

    def __init__(self, depthwise: bool = True) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, padding=1)  # 3 input channels: F03
        groups = 32 if depthwise else 1
        self.dw = nn.Conv2d(32, 32, 3, padding=1, groups=groups)  # depthwise: F02
        self.pw = nn.Conv2d(32, 64, 1)  # reads the depthwise output alone: FP8
        self.c2 = nn.Conv2d(64, 64, 3, padding=1)
        self.up = nn.ConvTranspose2d(64, 64, 2, stride=2)  # F02
        self.big = nn.Conv2d(64, 64, 7, padding=3)  # kernel area 49: F03
        self.fc = nn.Linear(64, 64)  # reads the pool, which runs INT8: INT8 (F05)
        self.fc2 = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem(x))
        x = F.relu(self.dw(x))
        y = F.relu(self.pw(x))
        y = y + F.relu(self.c2(y))
        z = F.relu(self.big(F.relu(self.up(y))))
        return self.fc2(F.relu(self.fc(z.mean((2, 3)))))


def _formats(p: QuantPlan) -> dict[str, tuple[str, str | None]]:
    return {
        pt.name: (pt.spec.format, pt.format_rule)
        for pt in p.points
        if pt.quantized and pt.spec is not None
    }


def test_fp8_plan_gives_each_layer_the_format_tensorrt_runs_it_in() -> None:
    p = plan(_MixedNet(depthwise=False), 2, 3, 16, 16, config=QuantConfig(format="fp8"))
    f = _formats(p)
    assert f["stem:input"] == ("int8", "F03") and f["stem:weight"] == ("int8", "F03")
    assert f["up:weight"] == ("int8", "F02") and f["big:weight"] == ("int8", "F03")
    assert f["dw:input"] == ("fp8", "F01") and f["pw:input"] == ("fp8", "F01")
    assert f["pw:weight"] == ("fp8", "F06")
    assert f["c2:input"] == ("fp8", "F01") and f["fc2:input"] == ("fp8", "F01")
    # the head after the global pool reads what the pool writes: INT8 (F05), as TensorRT has no
    # FP8 pooling to write FP8
    assert f["fc:input"] == ("int8", "F05") and f["fc:weight"] == ("int8", "F05")
    assert "a pool that runs INT8" in p.point("fc:input").reason
    # FP8 weights per tensor (F06), INT8 weights stay per channel
    assert p.point("pw:weight").spec.axis is None and p.point("big:weight").spec.axis == 0
    # the residual skip shares c2's input quantizer: one format per tensor (F05)
    assert f["add:input0"] == ("fp8", "F05")
    # FP8 activations calibrate by max (TensorRT's FP8 recipes); INT8 keep mse
    assert p.point("pw:input").calib.method == "max"
    assert p.point("big:input").calib.method == "mse"


def test_fp8_plan_of_a_convnet_with_depthwise_convolutions_keeps_its_convolutions_int8() -> None:
    """F02 on the depthwise conv itself; F09 on every other convolution of the network (TensorRT
    recommends INT8 for ConvNets with grouped/depthwise convolutions); the GEMM stays FP8, and an
    override keeps a convolution FP8."""
    p = plan(_MixedNet(), 2, 3, 16, 16, config=QuantConfig(format="fp8"))
    f = _formats(p)
    assert f["dw:input"] == ("int8", "F02") and f["dw:weight"] == ("int8", "F02")
    assert "no FP8 kernel" in p.point("dw:weight").reason
    assert f["pw:input"] == ("int8", "F09") and f["pw:weight"] == ("int8", "F09")
    assert f["c2:weight"] == ("int8", "F09") and p.point("c2:weight").spec.axis == 0
    assert "grouped/depthwise convolutions (dw)" in p.point("pw:weight").reason
    assert f["stem:weight"] == ("int8", "F03") and f["up:weight"] == ("int8", "F02")
    assert f["fc2:input"] == ("fp8", "F01") and f["fc2:weight"] == ("fp8", "F06")
    forced = QuantConfig(format="fp8", overrides=(Override(name="pw", format="fp8"),))
    f = _formats(plan(_MixedNet(), 2, 3, 16, 16, config=forced))
    assert f["pw:input"] == ("fp8", "USER") and f["pw:weight"] == ("fp8", "F06")
    assert f["c2:weight"] == ("int8", "F09")


class _C2f(nn.Module):
    """YOLOv8's C2f (a conv split in two, a bottleneck with a residual Add, a Concat of all,
    a conv) and a RepVGG block (3x3 + 1x1 + BatchNorm identity, summed): the element-wise and
    data-movement layers between FP8 convolutions."""

    def __init__(self, c: int = 32) -> None:
        super().__init__()
        self.cv1 = nn.Conv2d(c, 2 * c, 1)
        self.m1 = nn.Conv2d(c, c, 3, padding=1)
        self.m2 = nn.Conv2d(c, c, 3, padding=1)
        self.cv2 = nn.Conv2d(3 * c, c, 1)
        self.kxk = nn.Conv2d(c, c, 3, padding=1)
        self.k1 = nn.Conv2d(c, c, 1)
        self.bn_k, self.bn_1, self.identity = (
            nn.BatchNorm2d(c),
            nn.BatchNorm2d(c),
            nn.BatchNorm2d(c),
        )
        self.out = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = F.silu(self.cv1(x)).chunk(2, 1)
        m = b + F.silu(self.m2(F.silu(self.m1(b))))
        x = F.silu(self.cv2(torch.cat([a, b, m], 1)))
        y = self.bn_k(self.kxk(x)) + self.bn_1(self.k1(x))
        return self.out(F.relu(y + self.identity(x)))


def test_fp8_plan_leaves_concats_and_pointwise_layers_between_fp8_convs_float() -> None:
    """F10: TensorRT has no FP8 Concat or PointWise layer, and an FP8 conv cannot write INT8: the
    Concat's inputs and the identity branch's Add stay float where the INT8 plan quantizes them;
    the FP8 readers keep their own Quantize; a residual skip stays quantized in the format of
    the conv its Add fuses into (F05)."""
    int8 = plan(_C2f(), 1, 32, 8, 8)
    assert {pt.name for pt in int8.points if pt.op == "cat" and pt.quantized} == {
        "cat:input0", "cat:input1", "cat:input2"
    }  # fmt: skip
    p = plan(_C2f(), 1, 32, 8, 8, config=QuantConfig(format="fp8"))
    f = _formats(p)
    for name in ("cat:input0", "cat:input1", "cat:input2"):
        assert not p.point(name).quantized and p.point(name).rule == "F10"
    assert "no FP8 Concat" in p.point("cat:input0").reason
    assert f["cv2:input"] == ("fp8", "F01")  # the Concat's reader: its own FP8 Quantize
    skips = [pt for pt in p.points if pt.op == "add" and pt.rule == "P03" and pt.quantized]
    assert skips and all(f[pt.name] == ("fp8", "F05") for pt in skips)
    # the identity branch: the BatchNorm's input and the sum it joins, INT8 PointWise in the
    # INT8 plan, stay float next to FP8 convs
    int8_pw = {pt.name for pt in int8.points if pt.quantized and pt.rule == "P04"}
    assert int8_pw and all(p.point(n).rule == "F10" for n in int8_pw)
    assert "cannot write INT8" in p.point("add_2:input0").reason  # k1 + kxk, FP8, writes it
    assert "runs float" in p.point("identity:input").reason
    assert all(f[n][0] == "fp8" for n in ("m1:input", "m2:input", "kxk:input", "out:input"))


class _RepVgg(nn.Module):
    """Two RepVGG blocks: 3x3 + 1x1 (the first), 3x3 + 1x1 + BatchNorm identity (the second)."""

    def __init__(self, c: int = 32) -> None:
        super().__init__()
        self.k1, self.p1 = nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(c, c, 1)
        self.k2, self.p2 = nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(c, c, 1)
        self.bns = nn.ModuleList(nn.BatchNorm2d(c) for _ in range(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = self.bns
        y = F.relu(b[0](self.k1(x)) + b[1](self.p1(x)))
        return F.relu(b[2](self.k2(y)) + b[3](self.p2(y)) + b[4](y))


def test_fp8_skip_of_an_add_whose_output_a_float_layer_reads_stays_float() -> None:
    """The first block's sum fuses into an FP8 conv; its output is read by the second block's
    FP8 convs and by its identity BatchNorm, which stays float (F10): the fused layer writes
    float, so it reads its skip in float and the skip's Q/DQ goes (an FP8 skip would be a
    standalone Dequantize). In the INT8 plan the identity branch runs INT8 and the skip stays."""
    first = "add:input0", "add:input1"
    int8 = plan(_RepVgg(), 1, 32, 8, 8)
    assert any(int8.point(n).quantized for n in first)
    p = plan(_RepVgg(), 1, 32, 8, 8, config=QuantConfig(format="fp8"))
    assert not any(p.point(n).quantized for n in first)
    skip = next(p.point(n) for n in first if "skip" in p.point(n).reason)
    assert skip.rule == "P03" and "fused into an FP8 layer" in skip.reason
    assert p.point("bns.4:input").rule == "F10"  # the identity BatchNorm


def test_fp8_skip_an_int8_shortcut_writes_stays_int8() -> None:
    """A strided block whose shortcut convolution runs INT8 (16 input channels, F03) and whose
    second convolution runs FP8 with the Add fused: the skip stays INT8, which its writer writes
    at no cost (read in FP8 it would take a standalone Quantize after the shortcut: the
    Fashion-MNIST ResNet's FP8 export went 2 -> 3 unfused Q/DQ that way)."""

    class Strided(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
            self.conv2 = nn.Conv2d(32, 32, 3, padding=1)
            self.shortcut = nn.Conv2d(16, 32, 1, stride=2)
            self.head = nn.Conv2d(32, 32, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.conv2(F.relu(self.conv1(x))) + self.shortcut(x)
            return self.head(F.relu(y))

    p = plan(Strided(), 1, 16, 8, 8, config=QuantConfig(format="fp8"))
    f = _formats(p)
    assert f["shortcut:weight"] == ("int8", "F03") and f["conv2:weight"] == ("fp8", "F06")
    (skip,) = [pt for pt in p.points if pt.op == "add" and pt.quantized]
    assert f[skip.name][0] == "int8"


class _Dense(nn.Module):
    """DenseNet's pre-activation layers: each reads the Concat of all before it through a
    BatchNorm + ReLU (a PointWise layer of its own, no conv's epilogue), then a 1x1 and a 3x3
    convolution; a transition (BatchNorm, ReLU, 1x1 conv, average pool) between two blocks."""

    def __init__(self, c: int = 32, growth: int = 32) -> None:
        super().__init__()
        widths = [c + i * growth for i in range(2)]
        self.norm1 = nn.ModuleList(nn.BatchNorm2d(w) for w in widths * 2)
        self.conv1 = nn.ModuleList(nn.Conv2d(w, 64, 1) for w in widths * 2)
        self.norm2 = nn.ModuleList(nn.BatchNorm2d(64) for _ in range(4))
        self.conv2 = nn.ModuleList(nn.Conv2d(64, growth, 3, padding=1) for _ in range(4))
        self.trans_norm = nn.BatchNorm2d(c + 2 * growth)
        self.trans_conv = nn.Conv2d(c + 2 * growth, c, 1)

    def _block(self, x: torch.Tensor, first: int) -> torch.Tensor:
        feats = [x]
        for i in range(first, first + 2):
            y = self.conv1[i](F.relu(self.norm1[i](torch.cat(feats, 1))))
            feats.append(self.conv2[i](F.relu(self.norm2[i](y))))
        return torch.cat(feats, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._block(x, 0)
        x = F.avg_pool2d(self.trans_conv(F.relu(self.trans_norm(x))), 2)
        return self._block(x, 2)


def test_fp8_plan_leaves_a_pointwise_layer_that_writes_only_fp8_readers_float() -> None:
    """F10: the pre-activation BatchNorm + ReLU before an FP8 1x1 conv, INT8 PointWise layers in
    the INT8 plan, cannot write FP8: they write float, so their INT8 input goes (it would be a
    standalone Quantize and Dequantize: DenseNet-121's FP8 export had 184 unfused Q/DQ, 63 now);
    so does the transition's pool input, which no INT8 layer reads after it."""
    norms = ("norm1.0:input", "norm1.1:input", "norm1.2:input", "norm1.3:input")
    int8 = plan(_Dense(), 1, 32, 8, 8)
    assert all(int8.point(n).quantized for n in (*norms, "trans_norm:input"))
    p = plan(_Dense(), 1, 32, 8, 8, config=QuantConfig(format="fp8"))
    for name in (*norms, "trans_norm:input", "avg_pool2d:input"):
        assert not p.point(name).quantized and p.point(name).rule == "F10", name
    assert "writes only FP8 readers" in p.point("norm1.0:input").reason
    f = _formats(p)
    assert all(f[f"conv{k}.{i}:input"] == ("fp8", "F01") for k in (1, 2) for i in range(4))


class _Res2(nn.Module):
    """A Res2Net block: a 1x1 conv split into four 14-channel parts, each (from the second) a
    3x3 conv of its part plus the previous one's output (14 channels: float, H02), all
    concatenated into a 1x1 conv."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(64, 56, 1)
        self.convs = nn.ModuleList(nn.Conv2d(14, 14, 3, padding=1) for _ in range(3))
        self.conv3 = nn.Conv2d(56, 64, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = torch.split(F.relu(self.conv1(x)), 14, 1)
        outs, sp = [], parts[0]
        for i, conv in enumerate(self.convs):
            sp = F.relu(conv(sp if i == 0 else sp + parts[i]))
            outs.append(sp)
        return self.conv3(torch.cat([*outs, parts[3]], 1)) + x


def test_a_concat_of_float_conv_outputs_stays_float() -> None:
    """S02: three of the Concat's inputs are written by float convs (H02), which cannot write
    INT8 at no cost: quantized, each would be a standalone Quantize (Res2Net-50 14w-8s: 25
    unfused Q/DQ, 4 now), so the Concat stays float and its reader quantizes its output."""
    p = plan(_Res2(), 1, 64, 8, 8)
    cat = [pt for pt in p.points if pt.op == "cat"]
    assert cat and not any(pt.quantized for pt in cat)
    assert "3 of its inputs are written by float layers (convs.0" in cat[0].reason
    assert p.point("conv3:input").quantized
    assert all(p.point(f"convs.{i}:input").rule == "H02" for i in range(3))


def test_a_tensor_read_by_an_int8_layer_makes_its_fp8_readers_int8() -> None:
    """F05: one Quantize per tensor. ``x`` feeds a 7x7 conv (INT8, F03) and a 1x1 conv that could
    run FP8: the 1x1 conv reads the same Quantize, so it becomes INT8, weight included."""

    class Fork(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Conv2d(32, 32, 3, padding=1)
            self.dw = nn.Conv2d(32, 32, 7, padding=3)
            self.pw = nn.Conv2d(32, 32, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = F.relu(self.a(x))
            return torch.cat([self.dw(y), self.pw(y)], dim=1)

    p = plan(Fork(), 1, 32, 8, 8, config=QuantConfig(format="fp8"))
    f = _formats(p)
    assert f["dw:input"] == ("int8", "F03")
    assert f["pw:input"] == ("int8", "F05") and f["pw:weight"] == ("int8", "F05")
    assert p.point("pw:weight").spec.axis == 0
    assert "also read by dw" in p.point("pw:input").reason
    assert f["a:input"][0] == "fp8"  # upstream of the fork: unaffected


def test_small_gemm_stays_int8_in_an_fp8_plan_when_the_performance_rules_are_off() -> None:
    net = nn.Sequential(nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 64))
    cfg = QuantConfig(format="fp8", disabled=frozenset({"performance"}))
    f = _formats(plan(net, 2, 64, config=cfg))
    assert {v for k, v in f.items() if k.startswith("0:")} == {("int8", "F04")}
    assert f["2:input"] == ("int8", "F04")


def test_format_is_validated_and_int8_plans_carry_no_format_rule() -> None:
    with pytest.raises(ValueError, match="unknown format 'fp16'"):
        QuantConfig(format="fp16")
    p = plan(_MixedNet(), 2, 3, 16, 16)
    assert all(pt.format_rule is None for pt in p.points)
    assert {pt.spec.format for pt in p.points if pt.spec is not None} == {"int8"}


def test_mixed_plan_runs_convolutions_int8_and_gemms_fp8() -> None:
    """F07: the format TensorRT runs fastest per layer; the depthwise conv stays INT8 (F02)."""
    p = plan(_MixedNet(), 2, 3, 16, 16, config=QuantConfig(format="mixed"))
    f = _formats(p)
    assert f["pw:input"] == ("int8", "F07") and f["c2:weight"] == ("int8", "F07")
    assert p.point("c2:weight").spec.axis == 0  # INT8 weights per channel
    assert f["dw:input"] == ("int8", "F02") and f["fc2:input"] == ("fp8", "F01")
    assert f["fc2:weight"] == ("fp8", "F06") and f["fc:input"] == ("int8", "F05")


def test_fp8_attention_quantizes_its_softmax_output_at_the_fixed_scale_1_over_448() -> None:
    """F08: BMM2's probabilities operand holds amax 1 from prepare on, whatever calibration sees;
    BMM1's operands and V calibrate as usual, and an INT8 plan keeps calibrating the softmax."""
    net = TinyAttention().eval()
    x = torch.randn(2, 16, 64)
    p = plan(net, 2, 16, 64, config=QuantConfig(format="fp8"))
    fixed = [pt for pt in p.points if pt.calib is not None and pt.calib.fixed_amax is not None]
    assert [(pt.op, pt.format_rule, pt.spec.format) for pt in fixed] == [("matmul", "F08", "fp8")]
    assert "1/448" in fixed[0].reason
    others = [pt for pt in p.points if pt.quantized and pt.op == "matmul" and pt not in fixed]
    assert others and all(pt.calib.fixed_amax is None for pt in others)

    prepared = qdq.prepare(net, (x,), config=QuantConfig(format="fp8"))
    held = [q for q in qdq.quantizers_of(prepared).values() if q.fixed_amax]
    assert len(held) == 1 and float(held[0].amax) == 1.0  # before any calibration
    qdq.calibrate(prepared, [x * 3, x], show_progress=False)
    assert float(held[0].amax) == 1.0 and held[0].amax_method == "fixed"
    assert float(qdq.scale_from_amax(held[0].amax, fmt="fp8")) == pytest.approx(1 / 448)
    calibrated = [q for q in qdq.quantizers_of(prepared).values() if not q.fixed_amax]
    assert all(q.is_calibrated for q in calibrated)
    qdq.recompute_amax(prepared, "percentile", percentile=99.0)
    assert float(held[0].amax) == 1.0
    with qdq.quantizer_mode(prepared, "quantize"):
        assert torch.isfinite(prepared(x)).all()

    int8 = plan(net, 2, 16, 64)
    assert all(pt.calib is None or pt.calib.fixed_amax is None for pt in int8.points)


def test_fixed_amax_is_validated_and_never_learned() -> None:
    with pytest.raises(ValueError, match="fixed_amax must be finite and > 0"):
        qdq.CalibSpec(fixed_amax=0.0)
    with pytest.raises(TypeError, match="fixed_amax must be a number"):
        qdq.CalibSpec(fixed_amax="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="one amax per tensor"):
        fixed = qdq.CalibSpec(calibrator="max", method="max", fixed_amax=1.0)
        qdq.Quantizer(qdq.QuantSpec(axis=0), fixed, name="w")
    q = qdq.Quantizer(qdq.QuantSpec(format="fp8"), qdq.CalibSpec(fixed_amax=1.0), name="p")
    q.learn_amax("lsq")
    assert q.amax_grad is None and "amax" in dict(q.named_buffers())
    assert "calib=fixed" in repr(q)


# ------------------------------------------------------------- engine time (issue 58)
def test_speed_rules_t01_and_t02_mark_the_final_plan() -> None:
    """T01: a module --objective speed kept in FP16 is excluded as the user would (USER), then
    marked with the prediction; T02: a layer whose format the predicted time decided (a move is
    a USER format override) carries that rule (qdq.pipeline.speed, qdq.accuracy.formats)."""
    from qdq.accuracy.formats import FormatChoice, FormatRow
    from qdq.pipeline.speed import Kept, SpeedChoice

    def seen(prepared: nn.Module) -> QuantPlan:
        p = qdq.plan_of(prepared)
        SEEN_RULES.update(pt.rule for pt in p.points)
        SEEN_RULES.update(pt.format_rule for pt in p.points if pt.format_rule)
        return p

    net = nn.Sequential(cbr(16, 32), cbr(32, 32)).eval()
    x = torch.randn(1, 16, 8, 8)
    prepared = qdq.prepare(net, (x,), QuantConfig.tensorrt().exclude(name="1.0"))
    why = "kept FP16 by --objective speed: predicted 0.0500 ms quantized vs 0.0200 ms FP16"
    kept = Kept("1.0", "1.0/Conv + 1.2/Relu", 0.05, 0.02, "T01", why)
    SpeedChoice((kept,), (), {"total_ms": 1.0}).mark(prepared)
    p = seen(prepared)
    assert decisions(p, "1.0") == {"input": ("skip", "T01"), "weight": ("skip", "T01")}
    assert p.point("1.0:weight").reason == why and decisions(p, "0.0")["weight"][1] == "P01"

    gemms = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64)).eval()
    cfg = QuantConfig(format="mixed", overrides=(Override(name="2", format="int8"),))
    prepared = qdq.prepare(gemms, (torch.randn(2, 64),), cfg)
    row = FormatRow("2", "2.input_quantizer", 30.0, 29.0, "fp8", "int8",
                    "INT8 and FP8 equally accurate; INT8 predicted faster", "T02")  # fmt: skip
    FormatChoice((row,), cfg.overrides, timed_on="NVIDIA GeForce RTX 4090").mark(prepared)
    f = {pt.name: (pt.spec.format, pt.format_rule) for pt in seen(prepared).points if pt.quantized}
    assert f["2:input"] == ("int8", "T02") and f["2:weight"] == ("int8", "T02")
    assert f["0:input"] == ("fp8", "F01")  # not timed: the plan's own rule


# last: the rules every test above saw
def test_every_rule_has_text_and_is_exercised_by_these_tests() -> None:
    for r in RULES:
        assert r.title and r.tensorrt and explain(r.id).startswith(r.id)
    # rules a tiny block cannot show: P12 (outputs are never candidates at all); the block
    # formats' F11-F17 are exercised on plans in tests/test_plan_blocks.py
    blocks = {f"F{i}" for i in range(11, 18)}
    assert {r.id for r in RULES} - SEEN_RULES - {"P12", "P02"} - blocks == set()
