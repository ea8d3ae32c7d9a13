"""Rule P16 only on whole attention cores, as TensorRT fuses them and the linter predicts them:
``BMM1 -> [scale, mask, bias, layout, attn[...] = ...] -> softmax -> [layout] -> BMM2`` (issue 34).

MViTv2 adds its decomposed relative-position bias by writing it back into the scores
(``attn[:, :, sp:, sp:] = attn[...].view(...) + rel_h + rel_w``): still one core, both products INT8.
ConViT's gated positional attention mixes the probabilities before BMM2, and CoaT's factorized
attention takes a softmax over the keys with no BMM1 in front of it: no fused MHA, so neither
product gets Q/DQ (P14) -- before, the half that matched got Q/DQ that ran standalone."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import qdq
from qdq.graph.plan import QuantPlan
from qdq.lint import lint


class RelPosAttention(nn.Module):
    """MViTv2-style: scores, a bias from q written back with ``attn[...] = ...``, softmax, @ v."""

    def __init__(self, dim: int = 32, heads: int = 2, side: int = 4) -> None:
        super().__init__()
        self.heads, self.side = heads, side
        self.qkv = nn.Linear(dim, dim * 3)
        self.rel = nn.Parameter(torch.randn(side, dim // heads) * 0.1)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        h, s = self.heads, self.side
        q, k, v = self.qkv(x).reshape(b, n, 3, h, c // h).permute(2, 0, 3, 1, 4).unbind(0)
        attn = (q * (c // h) ** -0.5) @ k.transpose(-2, -1)
        rel = torch.einsum("bhnc,kc->bhnk", q, self.rel)  # (b, h, n, side)
        attn[:, :, :, :] = (attn.view(b, h, n, s, n // s) + rel.unsqueeze(-1)).view(b, h, n, n)
        y = attn.softmax(dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, n, c))


class GatedAttention(nn.Module):
    """ConViT's GPSA: the probabilities mixed with a positional score before BMM2."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.qk = nn.Linear(dim, dim * 2)
        self.v = nn.Linear(dim, dim)
        self.pos = nn.Parameter(torch.randn(16, 16).softmax(-1))
        self.gate = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k = self.qk(x).chunk(2, dim=-1)
        patch = ((q * 0.2) @ k.transpose(-2, -1)).softmax(dim=-1)
        g = torch.sigmoid(self.gate)
        attn = (1.0 - g) * patch + g * self.pos
        attn = attn / attn.sum(dim=-1, keepdim=True)
        return attn @ self.v(x)


class FactorizedAttention(nn.Module):
    """CoaT's factorized attention: softmax over the keys, kᵀ·v, then q·(kᵀv)."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, dim * 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        kv = k.softmax(dim=1).transpose(-2, -1) @ v
        return (q * 0.2) @ kv


def _plan(model: nn.Module) -> QuantPlan:
    return qdq.plan_of(qdq.prepare(model.eval(), (torch.randn(1, 16, 32),)))


def _products(p: QuantPlan) -> dict[str, tuple[str, str]]:
    return {pt.name: (pt.decision, pt.rule) for pt in p.points if pt.op == "matmul"}


def test_relative_position_bias_written_back_is_still_one_core() -> None:
    products = _products(_plan(RelPosAttention()))
    assert {rule for _, rule in products.values()} == {"P16"}
    assert {n.split(":")[0] for n in products} == {"matmul", "matmul_1"}


@pytest.mark.parametrize("model", [GatedAttention, FactorizedAttention])
def test_half_an_attention_core_gets_no_qdq(model: type[nn.Module]) -> None:
    products = _products(_plan(model()))
    assert len(products) == 4  # two activation products, two operands each
    assert set(products.values()) == {("skip", "P14")}


def _lint_of(model: nn.Module, tmp_path: Path) -> qdq.lint.LintReport:
    torch.manual_seed(0)
    x = torch.randn(4, 16, 32)
    prepared = qdq.prepare(model.eval(), (x[:1],))
    qdq.calibrate(prepared, [x], show_progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = qdq.export_onnx(prepared, (x[:1],), tmp_path / "m.onnx", exporter="dynamo")
    return lint(out.path)


def test_linter_agrees_relative_position_core_is_int8_mha(tmp_path: Path) -> None:
    report = _lint_of(RelPosAttention(), tmp_path)
    (core,) = [ly for ly in report.layers if ly.kind == "attention"]
    assert core.input_precision == "int8" and any("Softmax" in n for n in core.nodes)
    assert not [f for f in report.findings if f.rule == "P14"]


def test_linter_agrees_gated_attention_is_float_without_standalone_qdq(tmp_path: Path) -> None:
    report = _lint_of(GatedAttention(), tmp_path)
    assert not [ly for ly in report.layers if ly.kind == "attention"]
    assert len([f for f in report.findings if f.rule == "P14"]) == 2  # both products, FP16
    assert not [ly for ly in report.layers if ly.kind == "qdq" and "matmul" in ly.name]


class RelLogits(nn.Module):
    """HaloNet's relative-position logits: q @ a transposed parameter table."""

    def __init__(self, k: int = 32) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.rel = nn.Parameter(torch.randn(27, k))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.rel.transpose(-1, -2)


def test_matmul_on_a_transposed_parameter_quantizes_the_parameter(tmp_path: Path) -> None:
    """HaloNet's ``q @ rel_k.transpose(-1, -2)``: a weighted MatMul (P01), the weight quantized
    per output column on the parameter itself (its axis 0) before the transpose, which TensorRT
    folds into the GEMM's weights: the linter predicts it INT8; a K=8 table stays float (P14)."""
    p = _plan(RelLogits())
    weight = p.point("matmul:weight")
    assert (weight.decision, weight.rule) == ("quantize", "P01")
    assert weight.spec is not None and weight.spec.axis == 0 and weight.producer == "rel"
    assert p.point("matmul:input").decision == "quantize"
    small = qdq.plan_of(qdq.prepare(RelLogits(k=8).eval(), (torch.randn(1, 16, 8),)))
    assert {pt.rule for pt in small.points} == {"P14"}
    torch.manual_seed(0)
    x = torch.randn(4, 16, 32)
    prepared = qdq.prepare(RelLogits().eval(), (x[:1],))
    qdq.calibrate(prepared, [x], show_progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = qdq.export_onnx(prepared, (x[:1],), tmp_path / "m.onnx", exporter="dynamo")
    report = lint(out.path)
    (gemm,) = [ly for ly in report.layers if ly.kind == "weighted"]
    assert gemm.input_precision == "int8"
    with torch.no_grad():  # the same table (seeded): INT8 follows float
        cos = torch.nn.functional.cosine_similarity(
            prepared(x).flatten(), RelLogits().eval()(x).flatten(), dim=0
        )
    assert cos > 0.999


class RopeAttention(nn.Module):
    """timm's EVA / DINOv3 rotary attention: the prefix token sliced off unrotated, the rest
    rotated, ``cat(...).type_as(v)`` into the products."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, dim * 3)
        self.register_buffer("sin", torch.randn(15, dim))
        self.register_buffer("cos", torch.randn(15, dim))

    def _rope(self, t: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        rest = t[:, 1:]
        a, b = rest.chunk(2, dim=-1)
        rotated = (rest * self.cos + torch.cat([-b, a], dim=-1) * self.sin).to(torch.float32)
        return torch.cat([t[:, :1], rotated], dim=1).type_as(v)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k = self._rope(q, v), self._rope(k, v)
        return ((q * 0.2) @ k.transpose(-2, -1)).softmax(dim=-1) @ v


def test_rope_concat_shares_the_key_quantizer(tmp_path: Path) -> None:
    """The key's Concat reaches BMM1's quantized input through ``type_as`` (a cast that keeps
    the dtype: the identity) and a transpose: its inputs share that scale (S02) so the Concat
    runs INT8, and the linter finds no float Concat before a Quantize (S02b) nor a scale split."""
    p = _plan(RopeAttention())
    cats = [pt for pt in p.points if pt.op == "cat" and pt.decision != "skip"]
    assert len(cats) == 2 and {pt.rule for pt in cats} == {"S02"}
    key = p.point("matmul:input1")
    assert {pt.group for pt in cats} == {key.group}
    report = _lint_of(RopeAttention(), tmp_path)
    assert not [f for f in report.findings if f.rule in ("S02", "S02b")]
