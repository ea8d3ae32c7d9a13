"""Placement of the block formats (issue 60, rules F11-F17): NVFP4, MXFP8 and INT4 weight-only
plans on tiny models, checked on the plan (points, specs, rules, reasons) without quantizers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from qdq import QuantConfig
from qdq.config import CalibSpec, Override, QuantSpec
from qdq.graph.formats_blocks import block_kernel, int4_block
from qdq.graph.plan import QuantPlan
from qdq.graph.planner import build_plan
from qdq.graph.record import record
from qdq.rules import RULES, explain

torch.manual_seed(0)
SEEN: set[str] = set()
BLOCK_RULES = {"F11", "F12", "F13", "F14", "F15", "F16", "F17"}


def plan(model: nn.Module, x: torch.Tensor, config: QuantConfig) -> QuantPlan:
    rec = record(model.eval(), (x,))
    p = build_plan(rec.graph, rec.root, config, model, rec.unused)
    SEEN.update(pt.rule for pt in p.points)
    SEEN.update(pt.format_rule for pt in p.points if pt.format_rule)
    return p


def fmt(p: QuantPlan, name: str) -> tuple[str, str | None]:
    """``(format, format rule)`` of a quantized point, ``("float", rule)`` of a skipped one."""
    pt = p.point(name)
    if not pt.quantized:
        return "float", pt.rule
    assert pt.spec is not None
    return pt.spec.format, pt.format_rule


class Block(nn.Module):
    """A pre-norm transformer block: LayerNorm -> Q/K/V Linears, attention, output Linear, MLP."""

    def __init__(self, d: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.ln1, self.ln2, self.heads = nn.LayerNorm(d), nn.LayerNorm(d), heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        y = self.ln1(x)
        q, k, v = (
            f(y).view(b, t, self.heads, -1).transpose(1, 2) for f in (self.q, self.k, self.v)
        )
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d)
        x = x + self.o(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class MLP(nn.Module):
    """A residual MLP (no norm: the Add fuses into fc2) and two Linears, one with K=24."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 128), nn.Linear(128, 64)
        self.fc3, self.fc4 = nn.Linear(64, 24), nn.Linear(24, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.fc2(F.relu(self.fc1(x)))
        return self.fc4(F.relu(self.fc3(x)))


class ConvNet(nn.Module):
    """Convolutions (one with 3 input channels), a residual block, a pooled Linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 32, 3, padding=1)
        self.c2 = nn.Conv2d(32, 64, 3, padding=1)
        self.c3 = nn.Conv2d(64, 64, 3, padding=1)
        self.fc = nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.c2(F.relu(self.c1(x))))
        x = x + F.relu(self.c3(x))
        return self.fc(x.mean((2, 3)))


class Weights(nn.Module):
    """MatMuls with parameters: ``x @ W`` (W of [K, N]), ``x @ U.t()`` (U of [N, K]) and
    GPT-2's ``Conv1D``, ``addmm(b, x, C)`` (C of [K, N])."""

    def __init__(self, k: int = 64) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(k, 32))
        self.u = nn.Parameter(torch.randn(48, k))
        self.c, self.b = nn.Parameter(torch.randn(k, 32)), nn.Parameter(torch.zeros(32))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x @ self.w, x @ self.u.t(), torch.addmm(self.b, x, self.c)


class Joined(nn.Module):
    """Two Linears, their outputs concatenated, a Linear reading the Concat."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.cat([F.relu(self.a(x)), F.relu(self.b(x))], -1))


def _block(config: QuantConfig) -> QuantPlan:
    return plan(Block(), torch.randn(2, 8, 64), config)


# ------------------------------------------------------------------ NVFP4 / MXFP8
@pytest.mark.parametrize(("name", "size"), [("nvfp4", 16), ("mxfp8", 32)])
def test_block_plan_runs_every_gemm_of_a_transformer_block_in_the_block_format(
    name: str, size: int
) -> None:
    p = _block(QuantConfig(format=name))
    gemms = ("q", "k", "v", "o", "fc1", "fc2")
    for g in gemms:
        assert fmt(p, f"{g}:weight") == (name, "F11") and fmt(p, f"{g}:input") == (name, "F11")
        w, x = p.point(f"{g}:weight").spec, p.point(f"{g}:input").spec
        assert w == QuantSpec.block(name, axis=-1) and w.block_size == size
        assert x == QuantSpec.block(name, axis=-1)
    # Q/K/V read one LayerNorm output: one quantizer, one format (S01)
    assert len({p.point(f"{g}:input").group for g in "qkv"}) == 1
    # the attention products stay FP8, the probabilities at the fixed amax 1 (F01, F08)
    assert fmt(p, "matmul:input0") == ("fp8", "F01") and fmt(p, "matmul_1:input0") == ("fp8", "F08")
    # block inputs: per-tensor max (NVFP4) or nothing to calibrate (MXFP8); weights max
    calib = p.point("q:input").calib
    assert calib == CalibSpec(calibrator="max", method="max")
    assert p.point("q:weight").calib == CalibSpec.weights()
    why = p.point("q:input").reason
    assert ("per-tensor amax by max" in why) == (name == "nvfp4")
    assert f"K=64 in blocks of {size}" in p.point("fc1:weight").reason


def test_block_plan_keeps_an_explicit_calibration_method() -> None:
    cfg = QuantConfig.tensorrt(method="percentile")
    p = _block(QuantConfig(activation_calib=cfg.activation_calib, format="nvfp4"))
    assert p.point("q:input").calib.method == "percentile"


def test_gemm_whose_k_is_not_a_multiple_of_the_block_takes_the_fp8_plan() -> None:
    p = plan(MLP(), torch.randn(4, 64), QuantConfig(format="nvfp4"))
    assert fmt(p, "fc4:weight") == ("fp8", "F12") and fmt(p, "fc4:input") == ("fp8", "F12")
    assert "K=24 is not a multiple of the NVFP4 block (16)" in p.point("fc4:input").reason
    assert "FP8 (F01" in p.point("fc4:input").reason  # the FP8 plan's own reason is kept
    assert fmt(p, "fc3:weight") == ("nvfp4", "F11")  # N=24 >= 16
    # MXFP8: K=64 is two blocks of 32, K=24 none
    p = plan(MLP(), torch.randn(4, 64), QuantConfig(format="mxfp8"))
    assert fmt(p, "fc1:weight") == ("mxfp8", "F11") and fmt(p, "fc4:weight") == ("fp8", "F12")


def test_mxfp8_needs_32_where_nvfp4_takes_16() -> None:
    net = nn.Sequential(nn.Linear(48, 64), nn.ReLU(), nn.Linear(64, 64))
    x = torch.randn(4, 48)
    assert fmt(plan(net, x, QuantConfig(format="nvfp4")), "0:weight") == ("nvfp4", "F11")
    p = plan(net, x, QuantConfig(format="mxfp8"))
    assert fmt(p, "0:weight") == ("fp8", "F12") and fmt(p, "2:weight") == ("mxfp8", "F11")
    assert "K=48 is not a multiple of the MXFP8 block (32)" in p.point("0:weight").reason


def test_residual_skip_fused_into_a_block_gemm_stays_float() -> None:
    """F15: ``x + fc2(relu(fc1(x)))`` fuses the Add into fc2; an FP8 plan reads the skip in FP8
    (one quantizer with fc1's input), a block plan reads it float and fc1 keeps NVFP4."""
    fp8 = plan(MLP(), torch.randn(4, 64), QuantConfig(format="fp8"))
    assert fmt(fp8, "add:input0") == ("fp8", "F05")
    p = plan(MLP(), torch.randn(4, 64), QuantConfig(format="nvfp4"))
    assert fmt(p, "add:input0") == ("float", "F15")
    assert "fused into fc2, a NVFP4 GEMM" in p.point("add:input0").reason
    assert fmt(p, "fc1:input") == ("nvfp4", "F11") and fmt(p, "fc2:input") == ("nvfp4", "F11")


def test_convolutions_take_the_fp8_plan_and_the_linear_head_runs_nvfp4() -> None:
    p = plan(ConvNet(), torch.randn(2, 3, 16, 16), QuantConfig(format="nvfp4"))
    assert fmt(p, "c1:weight") == ("int8", "F13")  # 3 input channels: INT8 in the FP8 plan
    assert fmt(p, "c2:weight") == ("fp8", "F13") and fmt(p, "c3:weight") == ("fp8", "F13")
    assert "no NVFP4 convolution" in p.point("c2:weight").reason
    assert p.point("c2:weight").spec.axis is None  # the FP8 plan's per-tensor weight (F06)
    assert fmt(p, "add:input0") == ("fp8", "F05")  # a convolution's residual: the FP8 plan's
    assert fmt(p, "fc:weight") == ("nvfp4", "F11") and fmt(p, "fc:input") == ("nvfp4", "F11")
    # the pool between an FP8 conv and the NVFP4 head runs float (F10)
    assert fmt(p, "mean:input") == ("float", "F10")


def test_a_concat_before_a_block_gemm_runs_float() -> None:
    """Non-weighted points are never a block format: the Concat runs float (F10), and the Linear
    reading it then has its tensor to itself and runs NVFP4."""
    p = plan(Joined(), torch.randn(4, 32), QuantConfig(format="nvfp4"))
    assert fmt(p, "cat:input0") == ("float", "F10") and fmt(p, "cat:input1") == ("float", "F10")
    assert fmt(p, "c:input") == ("nvfp4", "F11") and fmt(p, "a:input") == ("nvfp4", "F11")


def test_matmul_weights_are_blocked_along_their_reduction_axis() -> None:
    p = plan(Weights(), torch.randn(4, 64), QuantConfig(format="nvfp4"))
    assert fmt(p, "matmul:weight") == ("nvfp4", "F11")
    assert p.point("matmul:weight").spec.axis == -2  # W of [K, N]
    assert p.point("matmul_1:weight").spec.axis == -1  # U of [N, K], read as U.t()
    assert p.point("matmul:input").spec.axis == -1
    assert p.point("addmm:weight").spec == QuantSpec.block("nvfp4", axis=-2)
    p = plan(Weights(), torch.randn(4, 64), QuantConfig(format="int4w"))
    assert p.point("matmul:weight").spec == QuantSpec.block("int4", axis=-2, block_size=64)
    assert p.point("matmul_1:weight").spec == QuantSpec.block("int4", axis=-1, block_size=64)


# ------------------------------------------------------------- one format per tensor, overrides
def test_a_reader_in_another_format_takes_the_whole_tensor_to_the_fp8_plan() -> None:
    """F14: K runs FP8 by the user's choice; Q and V read the same LayerNorm output, so they
    take the FP8 plan's format too (one quantize per tensor); the other GEMMs stay NVFP4."""
    cfg = QuantConfig(format="nvfp4", overrides=(Override(name="k", format="fp8"),))
    p = _block(cfg)
    assert fmt(p, "k:input") == ("fp8", "USER")
    assert fmt(p, "q:input") == ("fp8", "F14") and fmt(p, "q:weight") == ("fp8", "F14")
    assert fmt(p, "v:weight") == ("fp8", "F14")
    assert "also read by k" in p.point("q:weight").reason
    assert fmt(p, "o:input") == ("nvfp4", "F11") and fmt(p, "fc1:input") == ("nvfp4", "F11")
    assert len({p.point(f"{g}:input").spec for g in "qkv"}) == 1


def test_two_block_formats_on_one_tensor_settle_to_the_fp8_plan() -> None:
    cfg = QuantConfig(format="nvfp4", overrides=(Override(name="k", format="mxfp8"),))
    p = _block(cfg)
    assert {fmt(p, f"{g}:input") for g in "qkv"} == {("fp8", "F14")}
    assert "in NVFP4" in p.point("q:input").reason and "in MXFP8" in p.point("q:input").reason


def test_override_moves_single_layers_to_a_block_format_where_they_can_take_it() -> None:
    cfg = QuantConfig(
        format="fp8",
        overrides=(Override(name="fc1", format="nvfp4"), Override(name="fc2", format="mxfp8")),
    )
    p = plan(MLP(), torch.randn(4, 64), cfg)
    # fc1's input is also the residual skip fused into fc2, which reads it float (F15)
    assert fmt(p, "fc1:weight") == ("nvfp4", "USER") and fmt(p, "fc1:input") == ("nvfp4", "USER")
    assert fmt(p, "fc2:input") == ("mxfp8", "USER") and fmt(p, "add:input0") == ("float", "F15")
    assert "NVFP4 set by the QuantConfig" in p.point("fc1:weight").reason
    assert fmt(p, "fc3:input") == ("fp8", "F01")  # no override: the FP8 plan
    conv = QuantConfig(format="fp8", overrides=(Override(name="c2", format="nvfp4"),))
    p = plan(ConvNet(), torch.randn(2, 3, 16, 16), conv)
    assert fmt(p, "c2:weight") == ("fp8", "F13") and fmt(p, "c2:input") == ("fp8", "F13")
    assert "Override(format='nvfp4') refused" in p.point("c2:weight").reason
    odd = QuantConfig(format="nvfp4", overrides=(Override(name="fc4", format="nvfp4"),))
    p = plan(MLP(), torch.randn(4, 64), odd)
    assert fmt(p, "fc4:weight") == ("fp8", "F12")
    assert "refused: K=24" in p.point("fc4:weight").reason


def test_override_int4_makes_one_layer_weight_only_in_a_block_plan() -> None:
    cfg = QuantConfig(format="nvfp4", overrides=(Override(name="fc1", format="int4"),))
    p = _block(cfg)
    assert p.point("fc1:weight").spec == QuantSpec.block("int4", axis=-1, block_size=64)
    assert fmt(p, "fc1:weight") == ("int4", "USER") and fmt(p, "fc1:input") == ("float", "F16")
    assert fmt(p, "fc2:input") == ("nvfp4", "F11")


def test_fp8_and_mixed_plans_without_block_overrides_are_unchanged() -> None:
    for f in ("fp8", "mixed"):
        p = _block(QuantConfig(format=f))
        assert all(not pt.spec.is_block for pt in p.points if pt.spec is not None)
        assert not {pt.format_rule for pt in p.points} & BLOCK_RULES


# ------------------------------------------------------------------------------- int4w
def test_int4w_quantizes_gemm_weights_only_with_the_largest_block_dividing_k() -> None:
    net = nn.Sequential(
        nn.Linear(256, 96), nn.ReLU(), nn.Linear(96, 64), nn.ReLU(), nn.Linear(64, 48),
        nn.ReLU(), nn.Linear(48, 24), nn.ReLU(), nn.Linear(24, 32),
    )  # fmt: skip
    p = plan(net, torch.randn(4, 256), QuantConfig(format="int4w"))
    blocks = {n: p.point(f"{n}:weight").spec.block_size for n in ("0", "2", "4", "6")}
    assert blocks == {"0": 128, "2": 32, "4": 64, "6": 16}
    for n in ("0", "2", "4", "6"):
        w = p.point(f"{n}:weight")
        assert w.spec.format == "int4" and w.spec.axis == -1 and w.format_rule == "F16"
        assert w.calib == CalibSpec(calibrator="max", method="max")
        assert fmt(p, f"{n}:input") == ("float", "F16")
    assert fmt(p, "8:weight") == ("float", "F17") and fmt(p, "8:input") == ("float", "F17")
    assert "K=24" in p.point("8:weight").reason
    assert not [pt for pt in p.points if pt.quantized and pt.kind == "input"]


def test_int4w_leaves_convolutions_attention_and_residuals_float() -> None:
    p = plan(ConvNet(), torch.randn(2, 3, 16, 16), QuantConfig(format="int4w"))
    assert {fmt(p, f"c{i}:weight") for i in (1, 2, 3)} == {("float", "F17")}
    assert "no INT4 weight-only convolution" in p.point("c2:weight").reason
    assert fmt(p, "fc:weight") == ("int4", "F16") and fmt(p, "fc:input") == ("float", "F16")
    assert fmt(p, "add:input0") == ("float", "F17")
    p = _block(QuantConfig(format="int4w"))
    assert fmt(p, "matmul:input0") == ("float", "F17")
    assert [pt.name for pt in p.points if pt.quantized] == [
        f"{g}:weight" for g in ("q", "k", "v", "o", "fc1", "fc2")
    ]


class PaddedConvHead(nn.Module):
    """EfficientNet's ``Conv2dStaticSamePadding``: a zero Pad, its convolution, a Linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.pad, self.conv, self.fc = nn.ZeroPad2d(1), nn.Conv2d(8, 16, 3), nn.Linear(16, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(self.pad(x)).mean((2, 3)))


def test_int4w_releases_a_convolution_input_moved_in_front_of_its_pad() -> None:
    """The convolution's input Quantize sits in front of the zero Pad (P08, so Pad+conv fuse);
    F17 releases it under the convolution's name: no INT8 Quantize is left in front of a float
    convolution, and no point appears under the Pad's name (EfficientNet-Lite0 kept 17 INT8
    Q/DQ in its int4w plan)."""
    p = plan(PaddedConvHead(), torch.randn(1, 8, 8, 8), QuantConfig(format="int4w"))
    assert fmt(p, "conv:input") == ("float", "F17")
    assert [pt.name for pt in p.points if pt.quantized] == ["fc:weight"]
    assert "pad:input" not in {pt.name for pt in p.points}
    int8 = plan(PaddedConvHead(), torch.randn(1, 8, 8, 8), QuantConfig())
    assert int8.point("conv:input").rule == "P08" and int8.point("conv:input").quantized


def test_int4w_refuses_other_formats_in_the_reason() -> None:
    cfg = QuantConfig(format="int4w", overrides=(Override(name="q", format="fp8"),))
    p = _block(cfg)
    assert fmt(p, "q:weight") == ("int4", "F16")
    assert "Override(format='fp8') refused in an int4w plan" in p.point("q:weight").reason


# ------------------------------------------------------------------------------- helpers
def test_block_kernel_and_int4_block_decide_by_k_n_and_kind() -> None:
    assert [int4_block(k) for k in (128, 384, 192, 160, 48, 24, 8)] == [
        128, 128, 64, 32, 16, None, None,
    ]  # fmt: skip
    assert block_kernel("nvfp4", "linear", (8, 64))[:2] == (None, "F12")  # N < 16
    assert block_kernel("mxfp8", "matmul", (64, 32))[:2] == ("mxfp8", "F11")
    assert block_kernel("mxfp8", "conv_transpose", (64, 64, 2, 2))[:2] == (None, "F13")
    assert block_kernel("int4", "conv", (64, 64, 3, 3))[:2] == (None, "F17")
    with pytest.raises(ValueError, match="'fp8' is no block format"):
        block_kernel("fp8", "linear", (64, 64))


def test_every_block_rule_has_text_and_is_exercised() -> None:
    ids = {r.id for r in RULES}
    assert ids >= BLOCK_RULES
    for r in BLOCK_RULES:
        assert explain(r).startswith(r)
    assert not BLOCK_RULES - SEEN
