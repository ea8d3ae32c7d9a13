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
    assert "P14" not in {f.rule for f in result.findings}
    standalone = [ly.name for ly in result.layers if ly.kind == "qdq"]
    assert not any("matmul_1_input0" in n for n in standalone)  # internal to the MHA kernel
