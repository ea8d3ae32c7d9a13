"""The rows of ``benchmarks/time_to_result.py``: model factories, their data, the FP32 export.

Runs in qdq's environment. Three uses:

* ``qdq quantize --model benchmarks/time_to_result_models.py:resnet50`` (and ``yolov8n``,
  ``vit_b_16``, ``bert_base``, ``detr``): the five real architectures at realistic sizes with
  random weights (``torch.manual_seed(0)`` before each build, so every process builds the same
  weights; nothing is downloaded);
* :func:`write_data`: the ``.npz`` of a row whose data is not built into qdq (YOLOv8n at 640 and
  DETR at 128: random square crops of scikit-image's bundled photos, resized, on the 8-bit grid;
  BERT: random token ids, 32–128 real tokens per sample, the rest padding);
* ``python benchmarks/time_to_result_models.py export ROW WORK``: what a peer's user does before
  quantizing: build the float model and export it to ``WORK/fp32.onnx`` (TorchScript exporter,
  opset 17, dynamic batch, outputs in pytree order; the dynamo exporter if TorchScript fails).
  The example input is the first calibration sample of ``WORK/calib.npz``, and
  ``WORK/meta.json`` says whether the inputs are keyword arguments. Prints one JSON line.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
_HERE = Path(__file__).resolve()

YOLO_SIZE, DETR_SIZE, TOKENS = 640, 128, 128
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Row:
    """One benchmark row: what ``qdq quantize`` gets and what the data is.

    Attributes:
        name: row name (``--rows``).
        model: ``--model`` (a zoo name, or ``factory`` of this file).
        data: ``--data``: ``None`` (a zoo model's own), a built-in dataset, or ``"npz"`` (the row's
            file, written by :func:`write_data`).
        calib / evaluate: ``--calib-samples`` / ``--eval-samples`` (``None``: the data's default).
        zoo: a zoo model (its metric is the zoo's).
        note: the row's size in words.
    """

    name: str
    model: str
    data: str | None = None
    calib: int | None = None
    evaluate: int | None = None
    zoo: bool = False
    note: str = ""


ZOO = ("fashion-mnist-resnet", "efficientnet-lite0", "crepe-tiny", "mtcnn-rnet", "mtcnn-onet",
       "ppocr-det")  # fmt: skip
ROWS: dict[str, Row] = {
    **{n: Row(n, n, zoo=True, note="zoo model, its own data") for n in ZOO},
    "resnet50": Row("resnet50", "resnet50", "skimage-photos",
                    note="torchvision ResNet-50, 224x224 (qdq's skimage-photos crops)"),
    "yolov8n": Row("yolov8n", "yolov8n", "npz", 32, 64,
                   note="ultralytics YOLOv8n in its ONNX-export form (BatchNorm statistics of "
                   "8 other crops), 640x640 photo crops"),
    "vit_b_16": Row("vit_b_16", "vit_b_16", "skimage-photos",
                    note="torchvision ViT-B/16 (random head, not zeros), 224x224 (qdq's "
                    "skimage-photos crops)"),
    "bert_base": Row("bert_base", "bert_base", "npz", 32, 64,
                     note="BERT-base sequence classifier (3 labels), 128 random tokens"),
    "detr": Row("detr", "detr", "npz", 32, 64,
                note="DETR, ResNet-50 backbone (no pretrained download), 91 classes, 128x128"),
}  # fmt: skip


def model_spec(row: Row) -> str:
    """``--model`` for ``qdq quantize``."""
    return row.model if row.zoo else f"{_HERE}:{row.model}"


# ------------------------------------------------------------------------------------ factories
def resnet50() -> nn.Module:
    """torchvision ResNet-50, random weights."""
    import torchvision

    torch.manual_seed(0)
    return torchvision.models.resnet50(weights=None).eval()


def vit_b_16() -> nn.Module:
    """torchvision ViT-B/16 at 224, random weights; the head, which torchvision initializes to
    zeros (every logit 0 for every image: nothing to compare), drawn as timm draws it."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.vit_b_16(weights=None)
    nn.init.trunc_normal_(model.heads.head.weight, std=0.02)
    return model.eval()


def yolov8n() -> nn.Module:
    """ultralytics YOLOv8n in the form its ONNX exporter prepares (``tests/models/real.py``),
    at 640, random weights with BatchNorm statistics of 8 other photo crops.

    As initialized (BatchNorm an identity in eval), the signal dies through the SiLU layers: the
    outputs do not depend on the image (their spread over images is 1e-8 of their size) and
    every tool agrees with FP32 trivially. The BatchNorm statistics are measured as in training
    (cumulative averages over one batch of 8 crops that are not benchmark samples) before the
    exporter's ``fuse()`` folds them, so that boxes and classes depend on the image.
    """
    sys.path.insert(0, str(_HERE.parents[1] / "tests"))
    from ultralytics.nn.tasks import DetectionModel

    from models.real import _ultralytics_export_form

    torch.manual_seed(0)
    with contextlib.redirect_stdout(io.StringIO()):
        model = DetectionModel("yolov8n.yaml", verbose=False)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None  # a cumulative average
    images = photo_crops(8, YOLO_SIZE, (0.0,) * 3, (1.0,) * 3, seed=1)
    model.train()
    with torch.no_grad():
        model(torch.from_numpy(images))
    with contextlib.redirect_stdout(io.StringIO()):
        _ultralytics_export_form(model, YOLO_SIZE)
    return model.eval()


def bert_base() -> nn.Module:
    """BERT-base (12 layers, hidden 768) sequence classifier from its config (``bert_base`` of
    ``tests/models/real.py``: 3 labels, SDPA attention), random weights."""
    sys.path.insert(0, str(_HERE.parents[1] / "tests"))
    from models.real import BENCH_ARCHS

    return BENCH_ARCHS["bert_base"].build().model  # seeded by Arch.build


class Detr(nn.Module):
    """``DetrForObjectDetection`` returning its raw tensors ``(logits, pred_boxes)``."""

    def __init__(self) -> None:
        super().__init__()
        import transformers

        config = transformers.DetrConfig(use_pretrained_backbone=False, num_labels=91)
        self.detr = transformers.DetrForObjectDetection(config)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.detr(pixel_values=x)
        return out.logits, out.pred_boxes


def detr() -> nn.Module:
    """DETR (ResNet-50 backbone, 6+6 layers, 100 queries, 91 classes), random weights."""
    torch.manual_seed(0)
    return Detr().eval()


# ----------------------------------------------------------------------------------------- data
def photo_crops(n: int, size: int, mean: tuple[float, ...], std: tuple[float, ...],
                seed: int) -> np.ndarray:  # fmt: skip
    """``n`` random square crops (side ½–1 of the photo's shorter side) of the scikit-image
    photos qdq's ``skimage-photos`` uses, taken from each photo in turn, resized to ``size``
    (bilinear, antialiased), on the 8-bit grid, normalized ``(x - mean) / std``."""
    import skimage.data
    import torch.nn.functional as F

    from qdq.zoo.efficientnet_lite0 import PHOTOS

    rng = np.random.default_rng(seed)
    photos = []
    for name in PHOTOS:
        img = np.asarray(getattr(skimage.data, name)())
        img = np.stack([img] * 3, axis=-1) if img.ndim == 2 else img[..., :3]
        photos.append(torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1).float() / 255)
    crops = []
    for i in range(n):
        img = photos[i % len(photos)]
        h, w = img.shape[1:]
        side = int(rng.integers(min(h, w) // 2, min(h, w) + 1))
        top, left = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
        crop = img[None, :, top : top + side, left : left + side]
        crops.append(F.interpolate(crop, size=(size, size), mode="bilinear", antialias=True))
    pixels = torch.cat(crops).clamp(0, 1).mul(255).round().div(255)
    m, s = torch.tensor(mean).reshape(1, 3, 1, 1), torch.tensor(std).reshape(1, 3, 1, 1)
    return ((pixels - m) / s).numpy().astype(np.float32)


def tokens(n: int, length: int, vocab: int, seed: int) -> dict[str, np.ndarray]:
    """Random token ids (``[CLS]``=101 first, ``[SEP]``=102 last) of 32–``length`` real tokens,
    padded with 0, and their attention mask."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((n, length), dtype=np.int64)
    mask = np.zeros((n, length), dtype=np.int64)
    for i in range(n):
        k = int(rng.integers(32, length + 1))
        ids[i, :k] = rng.integers(1000, vocab, size=k)
        ids[i, 0], ids[i, k - 1] = 101, 102
        mask[i, :k] = 1
    return {"input_ids": ids, "attention_mask": mask}


def write_data(row: Row, path: Path) -> None:
    """The ``.npz`` of a row whose ``data`` is ``"npz"`` (``calib + evaluate`` samples)."""
    n = (row.calib or 0) + (row.evaluate or 0)
    if row.name == "yolov8n":
        arrays = {"x": photo_crops(n, YOLO_SIZE, (0.0,) * 3, (1.0,) * 3, seed=0)}
    elif row.name == "detr":
        arrays = {"x": photo_crops(n, DETR_SIZE, IMAGENET_MEAN, IMAGENET_STD, seed=0)}
    elif row.name == "bert_base":
        arrays = tokens(n, TOKENS, 30522, seed=0)
    else:
        raise ValueError(f"row {row.name!r} has no .npz data")
    np.savez(path, **arrays)


# --------------------------------------------------------------------------------------- export
class _Flat(nn.Module):
    """The model with its inputs by position (or by keyword) and its outputs flattened to a
    tuple of tensors in pytree order, as qdq's export and evaluation order them."""

    def __init__(self, model: nn.Module, keys: list[str] | None) -> None:
        super().__init__()
        self.model, self.keys = model, keys

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from torch.utils._pytree import tree_flatten

        out = self.model(**dict(zip(self.keys, xs, strict=True))) if self.keys else self.model(*xs)
        return tuple(t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))


def build(row: Row) -> nn.Module:
    """The row's float model, in eval mode."""
    if row.zoo:
        from qdq.zoo.registry import get_model

        with contextlib.redirect_stdout(io.StringIO()):
            return get_model(row.name).build().eval()
    return globals()[row.model]()


def export(row: Row, work: Path) -> dict[str, Any]:
    """Build the model and export ``work/fp32.onnx``; ``{"export_s", "exporter", "params_M"}``."""
    meta = json.loads((work / "meta.json").read_text(encoding="utf-8"))
    with np.load(work / "calib.npz") as f:
        names = list(meta["inputs"])
        example = tuple(torch.from_numpy(f[k][:1]) for k in names)
    model = _Flat(build(row), meta["keys"]).eval()
    with torch.no_grad():
        outputs = model(*example)
    out_names = [f"output{i}" for i in range(len(outputs))]
    axes = {k: {0: "batch"} for k in (*names, *out_names)}
    start, tried = time.perf_counter(), []
    for dynamo in (False, True):
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                torch.onnx.export(model, example, str(work / "fp32.onnx"), dynamo=dynamo,
                                  opset_version=17, input_names=names, output_names=out_names,
                                  dynamic_axes=axes)  # fmt: skip
            break
        except Exception as err:
            tried.append(
                f"{'dynamo' if dynamo else 'TorchScript'}: {type(err).__name__}: {err}"[:300]
            )
    else:
        raise RuntimeError("; ".join(tried))
    return {
        "export_s": round(time.perf_counter() - start, 2),
        "exporter": "dynamo" if tried else "TorchScript",
        "params_M": round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
        "fallback": tried,
    }


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "export":
        sys.exit("usage: time_to_result_models.py export ROW WORK")
    print(json.dumps(export(ROWS[sys.argv[2]], Path(sys.argv[3]))), flush=True)
