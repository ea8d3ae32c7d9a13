"""Attention in INT8 (rule P16): SDPA seen as its two products, exported and linted as TensorRT's
fused MHA."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qdq
from qdq.backends.onnxruntime import parity
from qdq.graph.attention import attention_math
from qdq.lint import lint


@pytest.mark.parametrize(
    "case", ["plain", "scale", "causal", "bool_mask", "float_mask", "gqa", "cross"]
)
def test_attention_math_is_sdpa(case: str) -> None:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 6, 8, generator=gen)
    k = torch.randn(2, 4, 6, 8, generator=gen)
    v = torch.randn(2, 4, 6, 8, generator=gen)
    kwargs: dict[str, object] = {
        "plain": {},
        "scale": {"scale": 0.3},
        "causal": {"is_causal": True},
        "bool_mask": {"attn_mask": torch.rand(6, 6, generator=gen) > 0.3},
        "float_mask": {"attn_mask": torch.randn(2, 1, 6, 6, generator=gen)},
        "gqa": {"enable_gqa": True},
        "cross": {},
    }[case]
    if case == "gqa":
        k, v = k[:, :2], v[:, :2]
    if case == "cross":
        k, v = k[:, :, :4], v[:, :, :4]
    if case == "bool_mask":
        kwargs["attn_mask"][:, 0] = True  # type: ignore[index]  # no row fully masked
    ours = attention_math(q, k, v, **kwargs)  # type: ignore[arg-type]
    ref = F.scaled_dot_product_attention(q, k, v, **kwargs)  # type: ignore[arg-type]
    assert torch.allclose(ours, ref, atol=1e-5), (ours - ref).abs().max()


class Block(nn.Module):
    """A pre-norm transformer block as timm writes it (fused attention)."""

    def __init__(self, dim: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        h = self.qkv(self.norm(x))
        q, k, v = h.reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(y.transpose(1, 2).reshape(b, n, c))
        return self.head(x.mean(1))


@pytest.fixture(scope="module")
def calibrated() -> tuple[nn.Module, nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(8, 16, 32)
    prepared = qdq.prepare(model, (x[:1],))
    qdq.calibrate(prepared, [x], show_progress=False)
    return model, prepared, x


def test_prepared_attention_quantizes_both_products(calibrated) -> None:
    model, prepared, x = calibrated
    quantizers = set(qdq.quantizers_of(prepared))
    assert {"matmul_input0_quantizer", "matmul_input1_quantizer"} <= quantizers
    assert "matmul_1_input0_quantizer" in quantizers  # the probabilities
    with torch.no_grad():
        cos = F.cosine_similarity(model(x).flatten(), prepared(x).flatten(), dim=0)
    assert cos > 0.99
    names = [name for name, _ in model.named_modules()]  # the user's model is not touched
    assert not any("quantizer" in name for name in names)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_attention_exports_as_int8_mha(calibrated, tmp_path: Path, exporter: str) -> None:
    _, prepared, x = calibrated
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = qdq.export_onnx(prepared, (x[:1],), tmp_path / "m.onnx", exporter=exporter)
    report = parity(prepared, out.path, [x], per_layer=True)
    assert report.min_cosine > 0.9999 and report.first_unexplained is None
    assert all(lp.qdq_mismatches == 0 for lp in report.layers.values())
    assert "matmul_1_input0_quantizer" in report.layers  # the probabilities' Q/DQ, compared too
    result = lint(out.path)
    (attention,) = [ly for ly in result.layers if ly.kind == "attention"]
    assert attention.input_precision == "int8" and attention.output_precision == "int8"
    assert any("Softmax" in n for n in attention.nodes)
    # P14 only on the 10-class head (a GEMM too small for INT8, left float), not on attention
    p14 = [n for f in result.findings if f.rule == "P14" for n in f.nodes]
    assert len(p14) == 1 and "head" in p14[0] and "K=32, N=10" in str(result.findings)
    standalone = [ly.name for ly in result.layers if ly.kind == "qdq"]
    assert not any("matmul_1_input0" in n for n in standalone)  # internal to the MHA kernel


# ------------------------------------------------------------ nn.MultiheadAttention
class _MHANet(nn.Module):
    """torch.nn's own transformer modules, as torchvision's ViT and DETR-style code use them."""

    def __init__(self, batch_first: bool, need_weights: bool) -> None:
        super().__init__()
        self.need_weights = need_weights
        self.embed = nn.Linear(32, 64)
        self.enc = nn.TransformerEncoderLayer(64, 4, 128, batch_first=batch_first)
        self.attn = nn.MultiheadAttention(64, 4, batch_first=batch_first)
        self.head = nn.Linear(64, 16)

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        h = self.enc(self.embed(x), src_key_padding_mask=padding)
        a, _ = self.attn(h, h, h, key_padding_mask=padding, need_weights=self.need_weights)
        return self.head(a + h)


def _mha_inputs(batch_first: bool) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 16, 32, generator=g)
    padding = torch.zeros(2, 16, dtype=torch.bool)
    padding[1, 11:] = True  # the second sequence is 11 tokens long
    return (x if batch_first else x.transpose(0, 1)), padding


@pytest.mark.parametrize(
    ("mask", "need_weights", "average"),
    [("none", False, True), ("bool", True, True), ("float", True, False), ("both", False, True)],
)
def test_multi_head_attention_math_is_torch(mask: str, need_weights: bool, average: bool) -> None:
    from qdq.graph.attention import multi_head_attention_math

    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4).eval()
    x = torch.randn(6, 3, 16)
    attn_mask = padding = None
    if mask in ("bool", "both"):
        attn_mask = torch.rand(6, 6) > 0.7
        attn_mask.fill_diagonal_(False)
    if mask == "float":
        attn_mask = torch.randn(3 * 4, 6, 6)
    if mask == "both":
        padding = torch.zeros(3, 6, dtype=torch.bool)
        padding[2, 4:] = True
    kwargs = dict(key_padding_mask=padding, need_weights=need_weights, attn_mask=attn_mask,
                  average_attn_weights=average)  # fmt: skip
    with torch.no_grad():
        ref, ref_w = mha(x, x, x, **kwargs)
        out = multi_head_attention_math(
            x, x, x, 16, 4, mha.in_proj_weight, mha.in_proj_bias, None, None, False, 0.0,
            mha.out_proj.weight, mha.out_proj.bias, training=False, **kwargs,
        )  # fmt: skip
    assert out is not None
    torch.testing.assert_close(out[0], ref, atol=1e-5, rtol=1e-5)
    if need_weights:
        torch.testing.assert_close(out[1], ref_w, atol=1e-6, rtol=1e-5)
    else:
        assert out[1] is None and ref_w is None


def test_multi_head_attention_outside_the_math_runs_as_one_op() -> None:
    from qdq.graph.attention import multi_head_attention_math

    mha = nn.MultiheadAttention(16, 4, add_bias_kv=True).eval()  # bias_k / bias_v
    x = torch.randn(6, 3, 16)
    args = (x, x, x, 16, 4, mha.in_proj_weight, mha.in_proj_bias, mha.bias_k, mha.bias_v, False,
            0.0, mha.out_proj.weight, mha.out_proj.bias)  # fmt: skip
    assert multi_head_attention_math(*args, training=False) is None
    assert multi_head_attention_math(x, x, torch.randn(6, 3, 16), *args[3:]) is None  # cross

    class SelfAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mha = mha

        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return self.mha(t, t, t)[0]

    prepared = qdq.prepare(SelfAttention(), (x,))  # still prepares, the attention in float
    cov = {c.module: c for c in qdq.plan_of(prepared).coverage}
    assert cov["mha.out_proj"].status == "not reached" and "fused op" in cov["mha.out_proj"].reason


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_and_transformer_layers_are_seen_into(batch_first: bool) -> None:
    torch.manual_seed(0)
    model = _MHANet(batch_first, need_weights=False).eval()
    x, padding = _mha_inputs(batch_first)
    with torch.no_grad():
        ref = model(x, padding)  # torch's native fast path
    prepared = qdq.prepare(model, (x, padding))
    plan = qdq.plan_of(prepared)
    assert {c.module: c.status for c in plan.coverage} == dict.fromkeys(
        ["embed", "enc.self_attn.out_proj", "enc.linear1", "enc.linear2", "attn.out_proj", "head"],
        "int8",
    )
    p16 = [p for p in plan.points if p.rule == "P16" and p.quantized]
    assert len(p16) == 8  # both operands of Q·Kᵀ and softmax·V, in both attentions
    packed = [p for p in plan.points if p.kind == "weight" and p.owner.endswith("linear")]
    assert {p.owner for p in packed} == {"enc.self_attn.linear", "attn.linear"}  # in_proj GEMMs
    with qdq.quantizer_mode(prepared, "bypass"), torch.no_grad():
        torch.testing.assert_close(prepared(x, padding), ref, atol=1e-5, rtol=1e-4)
    assert all(isinstance(m, nn.MultiheadAttention) for m in (model.attn, model.enc.self_attn))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_multihead_attention_exports_int8(exporter: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _MHANet(batch_first=True, need_weights=False).eval()
    x, padding = _mha_inputs(True)
    prepared = qdq.prepare(model, (x, padding))
    qdq.calibrate(prepared, [(x, padding), (torch.randn_like(x), padding)], show_progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = qdq.export_onnx(prepared, (x, padding), tmp_path / "m.onnx", exporter=exporter)
    report = parity(prepared, out.path, [(x, padding)], per_layer=True)
    assert all(lp.qdq_mismatches == 0 and lp.unexplained_codes == 0
               for lp in report.layers.values())  # fmt: skip
    assert report.min_cosine > 0.9999
    lr = lint(out.path)
    assert lr.summary["int8_weighted_layers"] == lr.summary["weighted_layers"] == 8
    assert lr.rules("WARN") == set(), lr.format()


# ------------------------------------------------------------ the value-first form
class _PSAAttention(nn.Module):
    """ultralytics' ``Attention`` (YOLO's PSA block): a conv makes q, k and v, the scores are
    ``qᵀ @ k``, the context ``v @ probsᵀ`` (the probabilities the second operand, transposed)."""

    def __init__(self, c: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads, self.key_dim, self.head_dim = heads, 8, c // heads
        self.scale = self.key_dim**-0.5
        self.qkv = nn.Conv2d(c, c + 2 * self.key_dim * heads, 1)
        self.pe = nn.Conv2d(c, c, 3, 1, 1, groups=c)
        self.proj = nn.Conv2d(c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        qkv = self.qkv(x).view(b, self.heads, 2 * self.key_dim + self.head_dim, h * w)
        q, k, v = qkv.split([self.key_dim, self.key_dim, self.head_dim], dim=2)
        attn = ((q.transpose(-2, -1) @ k) * self.scale).softmax(dim=-1)
        y = (v @ attn.transpose(-2, -1)).view(b, c, h, w) + self.pe(v.reshape(b, c, h, w))
        return self.proj(y)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_value_first_attention_is_one_int8_mha(exporter: str, tmp_path: Path) -> None:
    """The planner quantizes both products (P16) with the Q/DQ on the transposed probabilities;
    the linter follows the layout ops around that Q/DQ and predicts one INT8 MHA, as planned."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, 1, 1), _PSAAttention(), nn.Conv2d(32, 8, 1)).eval()
    x = torch.randn(2, 3, 6, 6)
    prepared = qdq.prepare(model, (x[:1],))
    p16 = [pt for pt in qdq.plan_of(prepared).points if pt.rule == "P16"]
    assert len(p16) == 4 and all(pt.quantized for pt in p16)
    qdq.calibrate(prepared, [x], method="max", show_progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = qdq.export_onnx(prepared, (x[:1],), tmp_path / "m.onnx", exporter=exporter)
    assert parity(prepared, out.path, [x]).min_cosine > 0.9999
    result = lint(out.path)
    (attention,) = [ly for ly in result.layers if ly.kind == "attention"]
    assert attention.input_precision == "int8"
    assert any("Softmax" in n for n in attention.nodes)
    assert any("Transpose" in n for n in attention.nodes)
    assert "P14" not in {f.rule for f in result.findings}, result.format()
