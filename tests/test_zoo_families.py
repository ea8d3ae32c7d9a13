"""Architecture families of issue 34's zoo sweep, guarded (``benchmarks/zoo_sweep.py``).

One row per block shape the sweep taught the planner: HRNet's multi-resolution fusion (P17
through ReLU, chains of Adds), EfficientFormer's and PoolFormer's pooling mixers (P17 through
Sub/scale; P15 through the functional GroupNorm), ReXNet's ``relu6(x * se(x))`` (P04 through the
activation), YOLO26's value-first PSA attention (P16 as the linter reads it), SKNet's split-input
selective kernel (P04 through a Split), TResNet's SE gate before its residual Add (P17), MViTv2's
relative-position bias written back into the scores (``attn[...] = ...``, P16), the legacy SE-ResNet's
gate (P17), a relative-position MLP on a constant table (folded by the builder, not a float GEMM),
DINOv3's RoPE Concat before the quantized key (S02), NFNet's standardized weights and
pre-activation blocks (P01, P04), FocalNet's gated sum of focal levels (P17, P06), FasterNet's and
InceptionNeXt's small partial convs on an INT8 Split (H02 yields), DPN's last Concat read by
``silu(bn(x))`` (S02), RepViT's BatchNorm1d heads on the pooled vector (P06), GhostNet's and
RepGhostNet's small convs after an INT8 SE gate or fused conv+Add (H02 yields), FastViT's
``gelu(x * se(x))`` before its pooled head (P04), and families clean
from the start that exercise other rules: CSP and DLA aggregation, SelecSLS's concatenated
features, StarNet's star product, VoVNet's one-shot aggregation, HGNetV2's light blocks.

Each row: random weights, batch 1, the smallest input the sweep found; ``qdq.prepare`` takes the
graph path; calibrate, export with the default exporter, compare with ONNX Runtime per quantizer
and lint: no placement warning (P03a, P03d, P04, S02b, S03), every attention MatMul predicted INT8,
and on the transformer rows of ``GEMM_ROWS`` every weighted GEMM the builder runs predicted INT8.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import qdq
from qdq.backends.parity import parity

pytest.importorskip("onnxruntime")

PLACEMENT_RULES = {"P03a", "P03d", "P04", "S02b", "S03"}


def _timm(name: str, size: int, **kwargs: Any) -> Callable[[], tuple[nn.Module, int]]:
    def build() -> tuple[nn.Module, int]:
        timm = pytest.importorskip("timm")
        return timm.create_model(name, pretrained=False, **kwargs), size

    return build


def _yolo(stem: str, size: int) -> Callable[[], tuple[nn.Module, int]]:
    def build() -> tuple[nn.Module, int]:
        pytest.importorskip("ultralytics")
        from ultralytics.nn import tasks

        from models.real import _ultralytics_export_form

        model = tasks.DetectionModel(f"{stem}.yaml", verbose=False)
        _ultralytics_export_form(model, size)
        return model, size

    return build


#: row -> builder of (model, input size)
ROWS: dict[str, Callable[[], tuple[nn.Module, int]]] = {
    "hrnet_w18_small": _timm("hrnet_w18_small", 64),
    "efficientformer_l1": _timm("efficientformer_l1", 224),  # its attention bias is 7x7
    "poolformerv2_s12": _timm("poolformerv2_s12", 64),
    "rexnet_100": _timm("rexnet_100", 64),
    "yolo26n": _yolo("yolo26n", 64),
    "cspresnet50": _timm("cspresnet50", 64),
    "dla34": _timm("dla34", 64),
    "selecsls42": _timm("selecsls42", 64),
    "starnet_s1": _timm("starnet_s1", 64),
    "ese_vovnet19b_dw": _timm("ese_vovnet19b_dw", 64),
    "hgnetv2_b0": _timm("hgnetv2_b0", 64),
    "skresnet18": _timm("skresnet18", 64),
    "tresnet_m": _timm("tresnet_m", 64),
    "mvitv2_tiny": _timm("mvitv2_tiny", 64),  # relative positions written into the scores: P16
    "legacy_seresnet18": _timm("legacy_seresnet18", 64),  # SE gate joins the residual Add: P17
    # a relative-position MLP on a constant table: folded by the builder, not a float GEMM
    "test_vit_relpos": _timm("test_vit_relpos", 64, img_size=64),
    # RoPE: cat([prefix, rope(rest)]).type_as(v) shares the key's quantizer (S02); its
    # forward(x, attn_mask=None, is_causal=False) traces x only (TorchScript)
    "vit_tiny_patch16_dinov3_qkvb": _timm("vit_tiny_patch16_dinov3_qkvb", 64, img_size=64),
    # weights standardized in forward (ScaledStdConv2d), quantized and exported as constants;
    # pre-activation blocks: act(x) * beta reads the INT8 residual (P04), SE gate * gain (P04)
    "test_nfnet": _timm("test_nfnet", 64),
    "nf_resnet26": _timm("nf_resnet26", 64),
    "nf_regnet_b0": _timm("nf_regnet_b0", 64),
    # gated sum of focal levels: one INT8 PointWise layer (P17 over products), its global
    # context pooled INT8 (P06)
    "focalnet_tiny_srf": _timm("focalnet_tiny_srf", 64),
    # small partial convs on a slice of a Split whose input is INT8 already (H02 yields)
    "fasternet_t0": _timm("fasternet_t0", 64),
    "inception_next_atto": _timm("inception_next_atto", 64),
    # the last dual-path Concat read by silu(bn(x)) before the pooled head (S02)
    "dpn48b": _timm("dpn48b", 64),
    # linear(bn1d(x.mean((2, 3)))) heads: the pooled vector quantized (P06)
    "repvit_m1": _timm("repvit_m1", 64),
    # small convs after an SE gate of an INT8 tensor (GhostNet) or after a conv+Add fused with
    # an INT8 skip (RepGhostNet): H02 yields
    "ghostnet_050": _timm("ghostnet_050", 64),
    "repghostnet_050": _timm("repghostnet_050", 64),
    # gelu(x * se(x)) before the pooled head: the gating Mul reads INT8 through the GELU (P04)
    "fastvit_t8": _timm("fastvit_t8", 64),
}
#: rows whose every conv is INT8 (weights computed in forward included), but H02's small ones
CONV_ROWS = {"test_nfnet": 4, "nf_resnet26": 0, "nf_regnet_b0": 0}
#: rows whose every weighted GEMM the builder runs (folded ones aside) must be predicted INT8
GEMM_ROWS = {"mvitv2_tiny", "test_vit_relpos", "vit_tiny_patch16_dinov3_qkvb"}


@pytest.mark.parametrize("name", list(ROWS))
def test_family_takes_the_graph_path_exports_and_lints_clean(name: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, size = ROWS[name]()
    model.eval()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(1, 3, size, size, generator=gen)
    calib = torch.randn(2, 3, size, size, generator=gen)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prepared = qdq.prepare(model, (x,))
        assert qdq.plan_of(prepared).capture == "recorded"
        qdq.calibrate(prepared, [calib], method="max", show_progress=False)
        out = qdq.export_onnx(prepared, (x,), tmp_path / f"{name}.onnx", verify=False)
    # per quantizer: every Q/DQ bit-exact on ORT's own input, and any divergence explained by
    # rounding-boundary flips (random weights: flips cascade, SelecSLS ends at cosine 0.998)
    report = parity(prepared, out.path, [x], per_layer=True)
    assert report.first_unexplained is None, (name, report.first_unexplained)
    assert all(lp.qdq_mismatches == 0 for lp in report.layers.values()), name
    assert report.min_cosine >= 0.99, (name, report.min_cosine)
    lint = qdq.lint.lint(out.path)
    placement = sorted(f.rule for f in lint.findings if f.severity == "WARN")
    assert not PLACEMENT_RULES & set(placement), lint.format()
    attention = [ly for ly in lint.layers if ly.kind == "attention"]
    assert all(ly.input_precision == "int8" for ly in attention)
    assert not [f for f in lint.findings if f.rule == "P14" and "attention" in f.message]
    if name in CONV_ROWS:
        summary = lint.summary
        float_convs = summary["weighted_layers"] - summary["int8_weighted_layers"]
        assert float_convs <= CONV_ROWS[name] + 1, summary  # + the float classifier (P14)
    if name in GEMM_ROWS:
        summary = lint.summary
        assert summary["int8_weighted_layers"] == summary["weighted_layers"], summary
