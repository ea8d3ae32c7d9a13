"""Real architectures of issue 10, built from their packages with random weights (no downloads).

Each architecture is an :class:`Arch`: a name, a family (``"yolo"``, ``"timm"``, ``"torchvision"``,
``"smp"``, ``"transformers"``, ``"diffusers"``), the packages it needs and a builder.
``Arch.available`` checks the packages with :mod:`importlib` without importing them, so a missing
package skips cleanly; ``Arch.build()`` returns a :class:`RealModel` with the model in eval mode
and its example inputs (batch 1, the smallest input the model takes sensibly, to keep CPU time
low; the diffusers UNets take their timestep, and the text UNet its encoder hidden states, as
further inputs).

The ``*_deploy`` YOLO rows reproduce the preparation steps of ultralytics' own ONNX export
(``ultralytics/engine/exporter.py`` in 8.4): ``requires_grad=False``, ``eval()``, ``float()``,
``fuse()`` (Conv+BN folding, ``forward = forward_fuse`` on the fused blocks), and on the head
``export=True``, ``format="onnx"``, ``dynamic=False``, ``max_det`` clamped to the anchor count,
``xyxy=False``, ``shape=None``; every ``C2f`` (and subclass) gets ``forward = forward_split``;
``end2end`` is switched off (the default ``nms=None`` of the exporter).

Example:
    >>> from models.real import ARCHS
    >>> arch = ARCHS["resnet50"]
    >>> rm = arch.build() if arch.available else None
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["ARCHS", "BENCH_ARCHS", "Arch", "RealModel", "build"]

# Nothing here may reach the network: ultralytics and the Hugging Face hub stay offline.
os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

DETECTOR_SIZE = 160  # YOLO / U-Net / torchvision detectors (multiples of 32)
CLASSIFIER_SIZE = 224

Inputs = tuple[torch.Tensor, ...]
Builder = Callable[[], tuple[nn.Module, Inputs]]


@dataclass(frozen=True)
class RealModel:
    """A built architecture: the model (eval mode, random weights) and its example inputs."""

    name: str
    family: str
    model: nn.Module
    example_inputs: Inputs
    note: str = ""


@dataclass(frozen=True)
class Arch:
    """One row of the real-model matrix.

    Attributes:
        name: row name (``"yolov8n_deploy"``).
        family: ``"yolo"``, ``"timm"``, ``"torchvision"``, ``"smp"``, ``"transformers"`` or
            ``"diffusers"``.
        requires: top-level packages the builder imports.
        builder: returns ``(model, example_inputs)``.
        slow: prepare/export take long enough to mark the test ``slow``.
        note: what the row is (wrappers, preparation steps).
        ranked_outputs: the outputs are the top-k detections after NMS. With random weights the
            scores tie near 1, so any rounding difference reorders them and an end-to-end
            comparison of the outputs cannot decide; export with ``verify=False`` and compare
            per quantizer (ORT parity) instead.
        cascades: with random weights one code flipped at a rounding boundary (ONNX Runtime's
            GroupNorm accumulates in another order than torch's) cascades through every later
            GroupNorm block until the two outputs differ by about as much as quantization
            itself (cosine 0.998 to 1.0, by seed), beyond what the end-to-end check can tell
            from a wrong graph; export with ``verify=False`` and compare per quantizer, where
            every differing code must be explained by accumulation order.
    """

    name: str
    family: str
    requires: tuple[str, ...]
    builder: Builder
    slow: bool = False
    note: str = ""
    ranked_outputs: bool = False
    cascades: bool = False

    @property
    def end_to_end(self) -> bool:
        """Whether the export's end-to-end check (``export_onnx(verify=True)``) applies: not for
        :attr:`ranked_outputs`, nor for :attr:`cascades` (compared per quantizer instead)."""
        return not (self.ranked_outputs or self.cascades)

    @property
    def available(self) -> bool:
        """Whether every required package can be imported (checked without importing it)."""
        return all(importlib.util.find_spec(p) is not None for p in self.requires)

    @property
    def missing(self) -> tuple[str, ...]:
        """The required packages that are not installed."""
        return tuple(p for p in self.requires if importlib.util.find_spec(p) is None)

    def build(self) -> RealModel:
        """Build the model (seeded) in eval mode with its example inputs.

        Raises:
            ImportError: a required package is missing.
        """
        if not self.available:
            raise ImportError(f"{self.name} needs {', '.join(self.missing)} (not installed)")
        torch.manual_seed(0)
        model, inputs = self.builder()
        model.eval()
        return RealModel(self.name, self.family, model, inputs, self.note)


def _image(size: int) -> Inputs:
    return (torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1)),)


# ---------------------------------------------------------------------------------- transformers
#: Hugging Face encoders (issue 35): (config class, model class, small config, base config)
_HF_TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                max_position_embeddings=64, vocab_size=500)  # fmt: skip
_HF_BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                intermediate_size=3072, max_position_embeddings=512, vocab_size=30522)  # fmt: skip
TOKEN_LENGTH = 16  # tokens per sample in the tests; base-size rows in the benchmark take 128
BASE_TOKEN_LENGTH = 128


def _hf_config(family: str, base: bool, **extra: Any) -> Any:
    import transformers

    size = dict(_HF_BASE if base else _HF_TINY)
    size.update({k: extra.pop(k) for k in list(extra) if k in size})  # a shape of its own
    if family == "distilbert":
        size = {"dim": size["hidden_size"], "n_layers": size["num_hidden_layers"],
                "n_heads": size["num_attention_heads"], "hidden_dim": size["intermediate_size"],
                "max_position_embeddings": size["max_position_embeddings"],
                "vocab_size": size["vocab_size"]}  # fmt: skip
    if family == "albert":
        size["embedding_size"] = 128 if base else 32
    if family == "electra":
        size["embedding_size"] = size["hidden_size"]
    if family == "deberta_v2":  # DeBERTa-v3's relative attention
        size.update(relative_attention=True, position_buckets=256 if base else 32,
                    max_relative_positions=-1, pos_att_type=["p2c", "c2p"],
                    norm_rel_ebd="layer_norm", share_att_key=True, position_biased_input=False,
                    type_vocab_size=0)  # fmt: skip
    names = {"bert": "BertConfig", "distilbert": "DistilBertConfig", "roberta": "RobertaConfig",
             "albert": "AlbertConfig", "deberta_v2": "DebertaV2Config",
             "electra": "ElectraConfig"}  # fmt: skip
    return getattr(transformers, names[family])(**size, **extra)


def _tokens(vocab: int, length: int, pad_id: int = 0) -> Inputs:
    """One sample of token ids and its attention mask, the last quarter padded."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(5, vocab, (1, length), generator=gen)
    mask = torch.ones(1, length, dtype=torch.int64)
    mask[:, length - length // 4 :] = 0
    ids[mask == 0] = pad_id
    return ids, mask


def _hf(family: str, head: str = "ForSequenceClassification", base: bool = False) -> Builder:
    """A ``transformers`` encoder with random weights from its config; SDPA attention where the
    family has it (DeBERTa-v2: its own, eager)."""

    def build() -> tuple[nn.Module, Inputs]:
        import transformers

        cls_name = {"bert": "Bert", "distilbert": "DistilBert", "roberta": "Roberta",
                    "albert": "Albert", "deberta_v2": "DebertaV2",
                    "electra": "Electra"}[family] + head  # fmt: skip
        config = _hf_config(family, base, num_labels=3)
        attn = "eager" if family == "deberta_v2" else "sdpa"
        model = getattr(transformers, cls_name)._from_config(config, attn_implementation=attn)
        pad = 1 if family == "roberta" else 0
        length = BASE_TOKEN_LENGTH if base else TOKEN_LENGTH
        return model.eval(), _tokens(config.vocab_size, length, pad)

    return build


def _hf_decoder(family: str) -> Builder:
    """A ``transformers`` decoder-only model as a sequence classifier (no KV cache), random
    weights: GPT-2 (its projections are ``Conv1D``: ``torch.addmm(b, x, W)``), LLaMA (a
    hand-written RMSNorm, rotary embeddings, grouped-query attention)."""

    def build() -> tuple[nn.Module, Inputs]:
        import transformers

        tiny = dict(_HF_TINY)
        if family == "gpt2":
            config = transformers.GPT2Config(
                n_embd=tiny["hidden_size"], n_layer=tiny["num_hidden_layers"],
                n_head=tiny["num_attention_heads"], n_positions=tiny["max_position_embeddings"],
                vocab_size=tiny["vocab_size"], num_labels=3, pad_token_id=0, use_cache=False,
            )  # fmt: skip
            cls = transformers.GPT2ForSequenceClassification
        else:
            config = transformers.LlamaConfig(
                **tiny, num_key_value_heads=2, num_labels=3, pad_token_id=0, use_cache=False
            )
            cls = transformers.LlamaForSequenceClassification
        model = cls._from_config(config, attn_implementation="sdpa")
        ids, mask = _tokens(config.vocab_size, TOKEN_LENGTH)
        # GPT-2's second parameter is past_key_values: the token ids alone (the classifier
        # reads the last token that is not padding)
        return model.eval(), (ids,) if family == "gpt2" else (ids, mask)

    return build


class MeanPooled(nn.Module):
    """A sentence-transformers-style encoder: BERT, then the mask-weighted mean of the last
    hidden state, returned under sentence-transformers' key."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        import transformers

        self.bert = transformers.BertModel(config, add_pooling_layer=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, Any]:
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return {"sentence_embedding": (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)}


def _mean_pooled(base: bool = False) -> Builder:
    def build() -> tuple[nn.Module, Inputs]:
        config = _hf_config("bert", False)
        if base:  # all-MiniLM-L6-v2's shape
            config = _hf_config("bert", True, hidden_size=384, num_hidden_layers=6,
                                intermediate_size=1536)  # fmt: skip
        length = BASE_TOKEN_LENGTH if base else TOKEN_LENGTH
        return MeanPooled(config).eval(), _tokens(config.vocab_size, length)

    return build


# ----------------------------------------------------------------------------------- ultralytics
def _ultralytics(cfg: str, deploy: bool) -> Builder:
    def build() -> tuple[nn.Module, Inputs]:
        from ultralytics.nn.tasks import guess_model_task, yaml_model_load

        task = guess_model_task(yaml_model_load(cfg))
        model = _ultralytics_class(task)(cfg, verbose=False)
        if deploy:
            _ultralytics_export_form(model, DETECTOR_SIZE)
        return model.eval(), _image(DETECTOR_SIZE)

    return build


def _ultralytics_class(task: str) -> type[nn.Module]:
    from ultralytics.nn import tasks

    return {
        "detect": tasks.DetectionModel,
        "segment": tasks.SegmentationModel,
        "pose": tasks.PoseModel,
    }[task]


def _ultralytics_export_form(model: Any, imgsz: int) -> None:
    """The preparation steps of ultralytics 8.4's exporter for ``format="onnx"`` (in place)."""
    from ultralytics.nn.modules import C2f, Detect

    for p in model.parameters():
        p.requires_grad = False
    model.eval()
    model.float()
    if hasattr(model, "end2end"):
        model.end2end = False
    model.fuse(verbose=False, imgsz=imgsz)
    strides = [int(s) for s in model.stride.tolist()]
    for m in model.modules():
        if isinstance(m, Detect):
            m.dynamic = False
            m.export = True
            m.format = "onnx"
            m.max_det = min(300, sum((imgsz // s) ** 2 for s in strides))
            m.agnostic_nms = False
            m.xyxy = False
            m.shape = None
        elif isinstance(m, C2f):
            m.forward = m.forward_split


def _yolov5(deploy: bool) -> Builder:
    """Packaged yolov5 7.0 (``pip install yolov5``); untested here (the package is not installed)."""

    def build() -> tuple[nn.Module, Inputs]:
        import yolov5
        from yolov5.models.yolo import Detect, Model

        model = Model(str(Path(yolov5.__file__).parent / "models" / "yolov5s.yaml"))
        if deploy:  # export.py: attempt_load(fuse=True), eval, Detect.inplace/dynamic/export
            model = model.fuse().eval()
            for m in model.modules():
                if isinstance(m, Detect):
                    m.inplace = False
                    m.dynamic = False
                    m.export = True
        return model.eval(), _image(DETECTOR_SIZE)

    return build


# ------------------------------------------------------------------------------------------ timm
def _timm(name: str, deploy: bool = False) -> Builder:
    def build() -> tuple[nn.Module, Inputs]:
        import timm

        model = timm.create_model(name, pretrained=False)
        if deploy:
            from timm.utils import reparameterize_model

            model = reparameterize_model(model.eval())
        return model.eval(), _image(CLASSIFIER_SIZE)

    return build


# ------------------------------------------------------------------------------------------- smp
def _unet() -> tuple[nn.Module, Inputs]:
    import segmentation_models_pytorch as smp

    return smp.Unet("resnet34", encoder_weights=None, classes=1), _image(DETECTOR_SIZE)


# ------------------------------------------------------------------------------------- diffusers
#: latent (and pixel) size of the diffusion rows: 32x32, attention at the 16x16 level (256 keys)
LATENT_SIZE = 32


class Denoiser(nn.Module):
    """A diffusers UNet as a denoiser: ``forward(sample, timestep[, encoder_hidden_states])``
    returns the predicted noise tensor (the UNet's ``.sample``). The timestep is an input, a
    float per sample, as diffusion pipelines pass it."""

    def __init__(self, unet: nn.Module) -> None:
        super().__init__()
        self.unet = unet

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
        return self.unet(sample, timestep, return_dict=False)[0]


class CrossAttentionDenoiser(Denoiser):
    """:class:`Denoiser` of a text-conditioned UNet: the encoder hidden states (the text
    encoder's output) are a third input."""

    def forward(  # type: ignore[override]
        self, sample: torch.Tensor, timestep: torch.Tensor, encoder_hidden_states: torch.Tensor
    ) -> torch.Tensor:
        return self.unet(sample, timestep, encoder_hidden_states, return_dict=False)[0]


class VAEDecoder(nn.Module):
    """``AutoencoderKL``'s decoding: ``post_quant_conv`` then the decoder, one latent tensor in,
    one image tensor out (the encoder is not kept)."""

    def __init__(self, vae: nn.Module) -> None:
        super().__init__()
        self.post_quant_conv = vae.post_quant_conv
        self.decoder = vae.decoder

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.post_quant_conv(latent))


def _gaussian(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _unet_cond() -> tuple[nn.Module, Inputs]:
    from diffusers import UNet2DConditionModel

    unet = UNet2DConditionModel(
        sample_size=LATENT_SIZE, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(32, 64), down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32,
        attention_head_dim=8, norm_num_groups=8,
    )  # fmt: skip
    size = LATENT_SIZE
    inputs = (_gaussian(1, 4, size, size), torch.tensor([10.0]), _gaussian(1, 8, 32, seed=2))
    return CrossAttentionDenoiser(unet), inputs


def _unet_pixel() -> tuple[nn.Module, Inputs]:
    from diffusers import UNet2DModel

    unet = UNet2DModel(
        sample_size=LATENT_SIZE, in_channels=3, out_channels=3, layers_per_block=1,
        block_out_channels=(32, 64), down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=8,
    )  # fmt: skip
    return Denoiser(unet), (_gaussian(1, 3, LATENT_SIZE, LATENT_SIZE), torch.tensor([10.0]))


def _vae_decoder() -> tuple[nn.Module, Inputs]:
    from diffusers import AutoencoderKL

    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(32, 64), norm_num_groups=8,
    )  # fmt: skip
    return VAEDecoder(vae), (_gaussian(1, 4, LATENT_SIZE, LATENT_SIZE),)


# ----------------------------------------------------------------------------------- torchvision
class RetinaNetHead(nn.Module):
    """RetinaNet without its anchor decoding and NMS: ``backbone`` (ResNet-50 + FPN) then ``head``.

    Returns the head's raw ``cls_logits`` and ``bbox_regression`` (concatenated over the five pyramid
    levels). The postprocessing is data-dependent and not part of a TensorRT Q/DQ network.
    """

    def __init__(self, retinanet: nn.Module) -> None:
        super().__init__()
        self.backbone = retinanet.backbone
        self.head = retinanet.head

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = list(self.backbone(x).values())
        out = self.head(features)
        return out["cls_logits"], out["bbox_regression"]


def _retinanet() -> tuple[nn.Module, Inputs]:
    from torchvision.models.detection import retinanet_resnet50_fpn

    model = retinanet_resnet50_fpn(weights=None, weights_backbone=None)
    return RetinaNetHead(model.eval()), _image(DETECTOR_SIZE)


def _deeplabv3() -> tuple[nn.Module, Inputs]:
    from torchvision.models.segmentation import deeplabv3_resnet50

    return deeplabv3_resnet50(weights=None, weights_backbone=None), _image(DETECTOR_SIZE)


def _rcnn(name: str) -> Builder:
    def build() -> tuple[nn.Module, Inputs]:
        from torchvision.models import detection

        ctor = getattr(detection, name)
        size = DETECTOR_SIZE  # the transform resizes to min_size (800 by default): keep it small
        # random weights score every box low: keep them all (box_score_thresh=0), so that the
        # RoI heads (keypoint head included) see non-empty tensors during calibration
        model = ctor(
            weights=None, weights_backbone=None, min_size=size, max_size=size, box_score_thresh=0.0
        )
        return model, _image(size)

    return build


# -------------------------------------------------------------------------------------- registry
_RCNN_NOTE = "whole model (transform, RPN, NMS, RoI heads); min/max_size 160, box_score_thresh 0"
_DEPLOY_NOTE = "ultralytics ONNX-export form: fuse(), Detect.export=True, C2f.forward_split"
_ROWS: tuple[Arch, ...] = (
    Arch("yolov8n", "yolo", ("ultralytics",), _ultralytics("yolov8n.yaml", False)),
    Arch("yolov8n_deploy", "yolo", ("ultralytics",), _ultralytics("yolov8n.yaml", True), note=_DEPLOY_NOTE),
    Arch("yolo11n", "yolo", ("ultralytics",), _ultralytics("yolo11n.yaml", False)),
    Arch("yolo11n_deploy", "yolo", ("ultralytics",), _ultralytics("yolo11n.yaml", True), note=_DEPLOY_NOTE),
    Arch("yolov8n_seg", "yolo", ("ultralytics",), _ultralytics("yolov8n-seg.yaml", False)),
    Arch(
        "yolov8n_seg_deploy", "yolo", ("ultralytics",), _ultralytics("yolov8n-seg.yaml", True),
        note=_DEPLOY_NOTE,
    ),
    Arch("yolov8n_pose", "yolo", ("ultralytics",), _ultralytics("yolov8n-pose.yaml", False)),
    Arch(
        "yolov8n_pose_deploy", "yolo", ("ultralytics",), _ultralytics("yolov8n-pose.yaml", True),
        note=_DEPLOY_NOTE,
    ),
    Arch("yolov5s", "yolo", ("yolov5",), _yolov5(False), note="packaged yolov5 7.0"),
    Arch(
        "yolov5s_deploy", "yolo", ("yolov5",), _yolov5(True),
        note="yolov5 export.py form: fuse(), Detect.export=True, inplace=False",
    ),
    Arch("resnet50", "timm", ("timm",), _timm("resnet50")),
    Arch("efficientnet_b0", "timm", ("timm",), _timm("efficientnet_b0")),
    Arch("mobilenetv3_large_100", "timm", ("timm",), _timm("mobilenetv3_large_100")),
    Arch("regnety_008", "timm", ("timm",), _timm("regnety_008")),
    Arch("convnext_tiny", "timm", ("timm",), _timm("convnext_tiny"), slow=True),
    Arch("repvgg_a0", "timm", ("timm",), _timm("repvgg_a0")),
    Arch(
        "repvgg_a0_deploy", "timm", ("timm",), _timm("repvgg_a0", deploy=True),
        note="timm reparameterize_model (branches merged into one 3x3 conv)",
    ),
    Arch("vit_tiny_patch16_224", "timm", ("timm",), _timm("vit_tiny_patch16_224")),
    Arch("cspdarknet53", "timm", ("timm",), _timm("cspdarknet53"), slow=True),
    Arch("unet_resnet34", "smp", ("segmentation_models_pytorch",), _unet),
    Arch(
        "retinanet_resnet50_fpn", "torchvision", ("torchvision",), _retinanet, slow=True,
        note="backbone+FPN+head only (RetinaNetHead wrapper): no anchor decoding / NMS",
    ),
    Arch("deeplabv3_resnet50", "torchvision", ("torchvision",), _deeplabv3, slow=True),
    Arch(
        "fasterrcnn_resnet50_fpn", "torchvision", ("torchvision",), _rcnn("fasterrcnn_resnet50_fpn"),
        slow=True, note=_RCNN_NOTE, ranked_outputs=True,
    ),
    Arch(
        "keypointrcnn_resnet50_fpn", "torchvision", ("torchvision",),
        _rcnn("keypointrcnn_resnet50_fpn"), slow=True,
        note=_RCNN_NOTE, ranked_outputs=True,
    ),
    *(
        Arch(f"{f}_tiny", "transformers", ("transformers",), _hf(f),
             note="2 layers, hidden 64, 16 tokens (a quarter padded)")
        for f in ("bert", "distilbert", "roberta", "albert", "deberta_v2", "electra")
    ),
    Arch("gpt2_tiny", "transformers", ("transformers",), _hf_decoder("gpt2"),
         note="GPT-2, 2 layers, hidden 64 (Conv1D projections), 16 tokens, no KV cache"),
    Arch("llama_tiny", "transformers", ("transformers",), _hf_decoder("llama"),
         note="LLaMA, 2 layers, hidden 64, 2 KV heads (RMSNorm, rotary), 16 tokens, no KV cache"),
    Arch("bert_tokens_tiny", "transformers", ("transformers",), _hf("bert", "ForTokenClassification"),
         note="token classification"),
    Arch("meanpool_tiny", "transformers", ("transformers",), _mean_pooled(),
         note="BERT + mask-weighted mean pooling ({'sentence_embedding': ...})"),
    Arch("unet2d_cond_tiny", "diffusers", ("diffusers",), _unet_cond, cascades=True,
         note="UNet2DConditionModel, 2 levels (32, 64), cross-attention at 16x16; inputs: "
              "latent 4x32x32, timestep, 8 text tokens of 32"),
    Arch("unet2d_tiny", "diffusers", ("diffusers",), _unet_pixel, cascades=True,
         note="UNet2DModel, 2 levels (32, 64), self-attention at 16x16; inputs: 3x32x32, "
              "timestep"),
    Arch("vae_decoder_tiny", "diffusers", ("diffusers",), _vae_decoder, cascades=True,
         note="AutoencoderKL's post_quant_conv + decoder, 2 levels (64, 32); latent 4x32x32"),
)  # fmt: skip

#: base-size encoders: rows of benchmarks/real_models.py only (minutes each on a CPU)
_BENCH_ROWS = (
    *(
        Arch(f"{f}_base", "transformers", ("transformers",), _hf(f, base=True), slow=True,
             note="base size (12 layers, hidden 768), 128 tokens")
        for f in ("bert", "distilbert", "roberta", "albert", "deberta_v2", "electra")
    ),
    Arch("minilm_l6_meanpool", "transformers", ("transformers",), _mean_pooled(base=True),
         slow=True, note="all-MiniLM-L6-v2's shape (6 layers, hidden 384), mean pooled"),
)  # fmt: skip

#: every row by name, in table order
ARCHS: dict[str, Arch] = {a.name: a for a in _ROWS}
#: the benchmark's rows: every test row and the base-size ones
BENCH_ARCHS: dict[str, Arch] = {**ARCHS, **{a.name: a for a in _BENCH_ROWS}}


def build(name: str) -> RealModel:
    """Build the architecture called ``name`` (see :data:`ARCHS`)."""
    if name not in ARCHS:
        raise KeyError(f"unknown architecture {name!r}; known: {', '.join(ARCHS)}")
    return ARCHS[name].build()
