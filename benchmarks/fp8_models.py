"""The rows of ``benchmarks/fp8.py``: the zoo, small transformers and a diffusers UNet, their data.

Imported by qdq's environment (the driver, and ``qdq quantize --model
benchmarks/fp8_models.py:FACTORY``) and by the peer environment (``peers/fp8_peers.py``), so it
imports only numpy and torch at the top; each factory imports its own package (torchvision,
transformers, diffusers) and seeds torch first, so both environments build the same weights.

Rows: the six zoo models on their own data (``time_to_result_models.ROWS``), and, with random
weights (nothing is downloaded):

* ``vit``: torchvision ``VisionTransformer`` at DeiT-Tiny's shape (patch 16, 12 layers, hidden
  192, 3 heads, MLP 768; 5.7 M parameters), its head drawn ``trunc_normal(std=0.02)`` (torchvision
  initializes it to zeros), on qdq's ``skimage-photos`` (224x224 crops, 32 / 128);
* ``swin``: torchvision ``SwinTransformer`` at Swin-T's layout and half its width (patch 4,
  embedding 48, depths 2-2-6-2, heads 3-6-12-24, window 7; 7.1 M), same data;
* ``bert`` / ``distilbert``: sequence classifiers (3 labels, SDPA attention) from their configs
  (``tests/models/real.py``'s ``_hf_config``) at BERT-mini's width (hidden 256, 4 heads, FFN
  1024; BERT 4 layers, DistilBERT 6), 128 random tokens of which 32-128 are real (64 / 128);
* ``gpt2``: ``transformers`` GPT-2 as a sequence classifier (3 labels, SDPA attention, no KV
  cache) at the same width (hidden 256, 4 heads, FFN 1024, 4 layers); its projections are
  ``Conv1D`` (``torch.addmm(b, x, W)`` with ``W`` stored ``[in, out]``); the token ids alone,
  padded with 0 (its ``pad_token_id``: the classifier reads the last real token), 64 / 128;
* ``unet``: diffusers ``UNet2DModel`` (``tests/models/real.py``'s ``unet2d_tiny``: 2 levels of
  32 and 64 channels, self-attention at 16x16) as a denoiser ``(sample, timestep) -> noise``, on
  32x32 photo crops in [-1, 1] noised at a random DDPM step (linear betas 1e-4..0.02; 64 / 128);
  headline: the cosine of the predicted noise with FP32's (``OUTPUT_KIND``).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

_HERE = Path(__file__).resolve()
sys.path.insert(0, str(_HERE.parent))
sys.path.insert(0, str(_HERE.parents[1] / "tests"))

from time_to_result_models import ROWS as TTR_ROWS  # noqa: E402
from time_to_result_models import TOKENS, Row, photo_crops, tokens  # noqa: E402
from time_to_result_models import build as ttr_build  # noqa: E402

ZOO = ("fashion-mnist-resnet", "efficientnet-lite0", "crepe-tiny", "mtcnn-rnet", "mtcnn-onet",
       "ppocr-det")  # fmt: skip
UNET_SIZE, VOCAB = 32, 30522
ROWS: dict[str, Row] = {
    **{n: TTR_ROWS[n] for n in ZOO},
    "vit": Row("vit", "vit", "skimage-photos",
               note="torchvision ViT at DeiT-Tiny's shape (12 layers, hidden 192), 224x224"),
    "swin": Row("swin", "swin", "skimage-photos",
                note="torchvision Swin, Swin-T layout at half width (embedding 48), 224x224"),
    "bert": Row("bert", "bert", "npz", 64, 128,
                note="BERT classifier, 4 layers, hidden 256, 128 random tokens"),
    "distilbert": Row("distilbert", "distilbert", "npz", 64, 128,
                      note="DistilBERT classifier, 6 layers, hidden 256, 128 random tokens"),
    "gpt2": Row("gpt2", "gpt2", "npz", 64, 128,
                note="GPT-2 classifier, 4 layers, hidden 256, Conv1D projections, 128 tokens"),
    "unet": Row("unet", "unet", "npz", 64, 128,
                note="diffusers UNet2DModel denoiser (32/64 channels, attention at 16x16), "
                "noised 32x32 photo crops"),
}  # fmt: skip


#: ``--output-kind`` where qdq's guess is not the headline wanted: the denoiser's output is noise of
#: the input's shape, which qdq takes for an image (PSNR); its headline is the cosine with FP32
OUTPUT_KIND = {"unet": "tensor"}


def model_spec(row: Row) -> str:
    """``--model`` for ``qdq quantize``: the zoo name, or ``this file:factory``."""
    return row.model if row.zoo else f"{_HERE}:{row.model}"


def as_quantize_gets_it(row: Row, data: Path | None) -> Row:
    """The row with its full model spec (``zoo=True`` makes ``time_to_result_models.model_spec``
    return it unchanged) and its ``.npz`` path as the data, for ``time_to_result.prep``."""
    npz = str(data) if row.data == "npz" and data is not None else row.data
    return dataclasses.replace(row, model=model_spec(row), zoo=True, data=npz)


# ------------------------------------------------------------------------------------ factories
def vit() -> nn.Module:
    """torchvision ViT, DeiT-Tiny's shape, random weights; the head drawn as timm draws it."""
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    model = VisionTransformer(image_size=224, patch_size=16, num_layers=12, num_heads=3,
                              hidden_dim=192, mlp_dim=768)  # fmt: skip
    nn.init.trunc_normal_(model.heads.head.weight, std=0.02)
    return model.eval()


def swin() -> nn.Module:
    """torchvision Swin, Swin-T's layout at half width, random weights (no stochastic depth)."""
    from torchvision.models.swin_transformer import SwinTransformer

    torch.manual_seed(0)
    return SwinTransformer(patch_size=[4, 4], embed_dim=48, depths=[2, 2, 6, 2],
                           num_heads=[3, 6, 12, 24], window_size=[7, 7],
                           stochastic_depth_prob=0.0).eval()  # fmt: skip


def _encoder(family: str, layers: int) -> nn.Module:
    import transformers

    from models.real import _hf_config

    torch.manual_seed(0)
    config = _hf_config(family, True, hidden_size=256, num_hidden_layers=layers,
                        num_attention_heads=4, intermediate_size=1024, num_labels=3)  # fmt: skip
    cls = {"bert": "BertForSequenceClassification",
           "distilbert": "DistilBertForSequenceClassification"}[family]  # fmt: skip
    return getattr(transformers, cls)._from_config(config, attn_implementation="sdpa").eval()


def bert() -> nn.Module:
    """BERT sequence classifier (4 layers, hidden 256, 3 labels), random weights."""
    return _encoder("bert", 4)


def distilbert() -> nn.Module:
    """DistilBERT sequence classifier (6 layers, hidden 256, 3 labels), random weights."""
    return _encoder("distilbert", 6)


def gpt2() -> nn.Module:
    """GPT-2 sequence classifier (4 layers, hidden 256, 3 labels), random weights, no KV cache."""
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=256, n_layer=4, n_head=4, n_inner=1024,
                                     n_positions=TOKENS, vocab_size=VOCAB, num_labels=3,
                                     pad_token_id=0, use_cache=False)  # fmt: skip
    model = transformers.GPT2ForSequenceClassification._from_config(
        config, attn_implementation="sdpa"
    )
    return model.eval()


def unet() -> nn.Module:
    """The diffusers pixel UNet of ``tests/models/real.py`` (``unet2d_tiny``) as a denoiser."""
    from models.real import BENCH_ARCHS

    return BENCH_ARCHS["unet2d_tiny"].build().model  # seeded by Arch.build


def build(row: Row) -> nn.Module:
    """The row's float model, in eval mode (a zoo model from qdq's registry: its ``src`` must be
    importable)."""
    return ttr_build(row) if row.zoo else globals()[row.model]()


# ----------------------------------------------------------------------------------------- data
def noised_crops(n: int, seed: int) -> dict[str, np.ndarray]:
    """``n`` 32x32 photo crops in [-1, 1], each noised at a random DDPM step as a denoiser sees
    it during sampling: ``sqrt(a) x + sqrt(1 - a) eps`` with ``a`` the cumulative product of
    linear betas 1e-4..0.02 over 1000 steps; the step as a float per sample."""
    rng = np.random.default_rng(seed)
    x = photo_crops(n, UNET_SIZE, (0.5,) * 3, (0.5,) * 3, seed=seed)
    steps = rng.integers(0, 1000, n)
    alpha = np.cumprod(1 - np.linspace(1e-4, 0.02, 1000))[steps].reshape(n, 1, 1, 1)
    noise = rng.standard_normal(x.shape)
    sample = np.sqrt(alpha) * x + np.sqrt(1 - alpha) * noise
    return {"sample": sample.astype(np.float32), "timestep": steps.astype(np.float32)}


def write_data(row: Row, path: Path) -> None:
    """The ``.npz`` of a row whose ``data`` is ``"npz"`` (``calib + evaluate`` samples), its
    arrays named after the model's ``forward`` parameters."""
    n = (row.calib or 0) + (row.evaluate or 0)
    if row.name in ("bert", "distilbert"):
        arrays = tokens(n, TOKENS, VOCAB, seed=0)
    elif row.name == "gpt2":  # its second parameter is past_key_values: the ids alone
        arrays = {"input_ids": tokens(n, TOKENS, VOCAB, seed=0)["input_ids"]}
    elif row.name == "unet":
        arrays = noised_crops(n, seed=0)
    else:
        raise ValueError(f"row {row.name!r} has no .npz data")
    np.savez(path, **arrays)
