"""PP-OCRv4's text detector (the ONNX model RapidOCR ships) in torch, and rendered text images.

**Model.** ``rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx`` (package
``rapidocr-onnxruntime``; only the file is read, the package is not imported) is converted with
``onnx2torch``.
The ONNX stores its weights as ``Constant`` nodes, which onnx2torch cannot map to parameters, so
they are moved to initializers first (values unchanged); its six nearest-neighbour ``Resize`` nodes
(constant integer scales) become ``nn.Upsample`` so that ``torch.export`` can trace the model (same
values). The result is a ``torch.fx.GraphModule``: DB text detector (PP-LCNet-style backbone with
hard-swish and SE blocks, FPN with Resize and Concat, ConvTranspose head) mapping ``(N, 3, H, W)``
with H and W multiples of 32 to a text probability map ``(N, 1, H, W)``.

**Data.** Seeded 160×320 RGB images rendered with Pillow and the font Pillow bundles
(``ImageFont.load_default(size)``, no system font): a light random background (grey levels 170–255
per channel) with Gaussian pixel noise (σ 6) and 2–4 lines, each one random word of 3–10 letters and
digits in a dark random colour (0–110), font size 11–30 px, at a random position in its own
horizontal band (so lines never touch). The ground truth of every word is its rendered bounding box
(``ImageDraw.textbbox``). Pixels are normalized as RapidOCR does, ``(x / 255 - 0.5) / 0.5``.
Calibration and evaluation images come from independent streams of one seeded generator (no shared
image).

**Metric.** A deliberately simple DB post-processing: threshold the probability map at 0.3, take
8-connected components, drop those whose mean probability is below 0.5 or whose box is under 3 px on
a side, and grow each component's bounding box by DB's unclip distance ``area * r / perimeter`` on
every side (``r = 0.8``). A detection matches a word when their boxes' IoU is at least 0.5 (one to
one, greedily by IoU). Figures: ``recall`` (matched words / words), ``precision`` (matched
detections / detections), their harmonic mean ``detection_f1`` — the metric — and the mean IoU of
the matches. The unclip ratio is 0.8, not RapidOCR's 1.6: the ground truth here is the tight box of
the rendered glyphs, which the FP32 detector's boxes fit best at 0.8 (median IoU 0.87; at 1.6 the
boxes of small words overshoot below IoU 0.5). On this data the FP32 detector finds every word (F1 =
1.0); INT8 losses show in the F1 only when words are lost or split, and earlier in ``mean_iou`` and
the probability-map cosine.

Example:
    >>> from qdq.zoo import ppocr  # doctest: +SKIP
    >>> images, boxes = ppocr.render_set(4, seed=0)  # doctest: +SKIP
    >>> prob = ppocr.load_pretrained()(images)  # doctest: +SKIP
    >>> ppocr.detection_figures(prob, boxes)["recall"]  # doctest: +SKIP
    1.0
"""

from __future__ import annotations

import math
import string
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from qdq.zoo._assets import package_file

__all__ = [
    "INSTALL",
    "SIZE",
    "check",
    "detect",
    "detection_figures",
    "load_pretrained",
    "onnx_path",
    "render_set",
    "score",
]

INSTALL = "pip install rapidocr-onnxruntime==1.4.4 (or pip install 'qdq[zoo]')"
ONNX_FILE = "models/ch_PP-OCRv4_det_infer.onnx"
#: (H, W) of the rendered images
SIZE = (160, 320)
THRESHOLD, BOX_THRESHOLD, UNCLIP_RATIO, MIN_SIDE, MIN_IOU = 0.3, 0.5, 0.8, 3, 0.5
FONT_SIZES, BACKGROUND, INK, NOISE = (11, 30), (170, 256), (0, 110), 6.0
_ALPHABET = string.ascii_letters + string.digits


def onnx_path() -> Path:
    """The detector ONNX inside the installed ``rapidocr-onnxruntime`` package.

    Raises:
        ImportError: the package is not installed.
    """
    return package_file("rapidocr_onnxruntime", ONNX_FILE, INSTALL, "ppocr-det")


def load_pretrained() -> nn.Module:
    """The PP-OCRv4 detector as a torch ``GraphModule`` (onnx2torch), in eval mode.

    Raises:
        ImportError: ``rapidocr-onnxruntime``, ``onnx`` or ``onnx2torch`` is missing (named).
    """
    path = onnx_path()
    try:
        import onnx
        from onnx import TensorProto
    except ImportError:
        raise ImportError("ppocr-det needs onnx: pip install 'qdq[onnx]'") from None
    try:
        import onnx2torch
    except ImportError:
        raise ImportError(
            "ppocr-det needs onnx2torch: pip install onnx2torch (or pip install 'qdq[zoo]')"
        ) from None
    model = onnx.load(str(path))
    nodes = []
    for node in model.graph.node:
        attrs = {a.name: a for a in node.attribute}
        if node.op_type == "Constant" and set(attrs) == {"value"}:
            tensor = TensorProto()
            tensor.CopyFrom(attrs["value"].t)
            tensor.name = node.output[0]
            model.graph.initializer.append(tensor)
        else:
            nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    graph_module = onnx2torch.convert(model)
    _static_upsampling(graph_module)
    return graph_module.eval()


def _static_upsampling(gm: torch.fx.GraphModule) -> None:
    """Replace onnx2torch's ``Resize`` modules by ``nn.Upsample`` with the same constant scale.

    onnx2torch reads the scales tensor with ``.tolist()`` at every call, which ``torch.export``
    cannot trace (the export then falls back to the TorchScript tracer). Every Resize of this
    model is nearest-neighbour (asymmetric, floor) by a constant integer factor on H and W, which
    ``nn.Upsample(scale_factor=k, mode="nearest")`` computes exactly.
    """
    for node in gm.graph.nodes:
        if node.op != "call_module" or len(node.args) != 3:
            continue
        module = gm.get_submodule(node.target)
        scales_node = node.args[2]
        if type(module).__name__ != "OnnxResize" or getattr(module, "onnx_mode", "") != "nearest":
            continue
        if not isinstance(scales_node, torch.fx.Node) or scales_node.op != "get_attr":
            continue
        owner, _, attr = str(scales_node.target).rpartition(".")
        scales = [float(v) for v in getattr(gm.get_submodule(owner), attr).tolist()]
        if len(scales) != 4 or scales[:2] != [1.0, 1.0] or scales[2] != scales[3]:
            continue
        if not scales[2].is_integer() or scales[2] < 1:
            continue
        gm.add_submodule(node.target, nn.Upsample(scale_factor=scales[2], mode="nearest"))
        node.args = (node.args[0],)
    gm.graph.eliminate_dead_code()
    gm.delete_all_unused_submodules()
    gm.recompile()


# ------------------------------------------------------------------------------------- data


def _word(rng: np.random.Generator) -> str:
    return "".join(rng.choice(list(_ALPHABET), size=int(rng.integers(3, 11))))


def _render_one(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    from PIL import Image, ImageDraw, ImageFont

    h, w = SIZE
    background = tuple(int(v) for v in rng.integers(*BACKGROUND, 3))
    image = Image.new("RGB", (w, h), background)
    draw = ImageDraw.Draw(image)
    lines = int(rng.integers(2, 5))
    band = h // lines
    boxes = []
    for i in range(lines):
        size = int(rng.integers(FONT_SIZES[0], min(FONT_SIZES[1], band - 6) + 1))
        font = ImageFont.load_default(size=size)
        word = _word(rng)
        while draw.textlength(word, font=font) > w - 24 and len(word) > 3:
            word = word[:-1]
        _, _, right, bottom = (math.ceil(v) for v in draw.textbbox((0, 0), word, font=font))
        x = int(rng.integers(8, max(9, w - 8 - right)))
        y = i * band + int(rng.integers(2, max(3, band - 2 - bottom)))
        colour = tuple(int(v) for v in rng.integers(*INK, 3))
        draw.text((x, y), word, fill=colour, font=font)
        boxes.append(draw.textbbox((x, y), word, font=font))
    pixels = np.asarray(image, dtype=np.float32) + rng.normal(0.0, NOISE, (h, w, 3))
    return np.clip(pixels, 0, 255), np.asarray(boxes, dtype=np.float64).reshape(-1, 4)


def render_set(n: int, seed: int = 0, stream: int = 1) -> tuple[torch.Tensor, list[np.ndarray]]:
    """``n`` rendered images ``(n, 3, 160, 320)`` (normalized) and each one's word boxes.

    Args:
        n: number of images.
        seed: the generator's seed.
        stream: ``0`` for calibration, ``1`` for evaluation (independent streams).

    Returns:
        The images and, per image, a float array ``(words, 4)`` of ``(x0, y0, x1, y1)`` boxes.

    Raises:
        ValueError: ``n`` is not a positive int.
        ImportError: Pillow is missing.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"the number of images must be a positive int, got {n!r}")
    try:
        import PIL  # noqa: F401
    except ImportError:
        raise ImportError("ppocr-det's text images need Pillow: pip install pillow") from None
    rng = np.random.default_rng([seed, stream])
    rendered = [_render_one(rng) for _ in range(n)]
    pixels = np.stack([p for p, _ in rendered]).transpose(0, 3, 1, 2)
    images = torch.from_numpy((pixels / 255.0 - 0.5) / 0.5).float().contiguous()
    return images, [b for _, b in rendered]


# ----------------------------------------------------------------------------------- metric


def detect(prob: np.ndarray) -> np.ndarray:
    """Text boxes ``(k, 4)`` (x0, y0, x1, y1) from one ``(H, W)`` probability map (see module doc)."""
    from scipy import ndimage

    labels, count = ndimage.label(prob > THRESHOLD, structure=np.ones((3, 3)))
    if count == 0:
        return np.zeros((0, 4))
    means = ndimage.mean(prob, labels, index=np.arange(1, count + 1))
    boxes = []
    for mean, found in zip(means, ndimage.find_objects(labels), strict=True):
        rows, cols = found
        bh, bw = rows.stop - rows.start, cols.stop - cols.start
        if mean < BOX_THRESHOLD or min(bh, bw) < MIN_SIDE:
            continue
        grow = bh * bw * UNCLIP_RATIO / (2.0 * (bh + bw))
        boxes.append(
            (
                max(0.0, cols.start - grow),
                max(0.0, rows.start - grow),
                min(float(prob.shape[1]), cols.stop + grow),
                min(float(prob.shape[0]), rows.stop + grow),
            )
        )
    return np.asarray(boxes, dtype=np.float64).reshape(-1, 4)


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(axis=2)
    area_a = (a[:, 2:] - a[:, :2]).prod(axis=1)
    area_b = (b[:, 2:] - b[:, :2]).prod(axis=1)
    return inter / (area_a[:, None] + area_b[None, :] - inter)


def _matches(pred: np.ndarray, truth: np.ndarray) -> list[float]:
    """IoUs of the one-to-one matches (IoU >= 0.5), taken greedily by IoU."""
    if len(pred) == 0 or len(truth) == 0:
        return []
    iou = _iou(pred, truth)
    matched = []
    while iou.size and iou.max() >= MIN_IOU:
        i, j = np.unravel_index(int(iou.argmax()), iou.shape)
        matched.append(float(iou[i, j]))
        iou[i, :], iou[:, j] = -1.0, -1.0
    return matched


def detection_figures(prob: torch.Tensor, boxes: Sequence[np.ndarray]) -> dict[str, float]:
    """Recall, precision and F1 of :func:`detect` on every map against the rendered word boxes.

    Args:
        prob: ``(N, 1, H, W)`` probability maps.
        boxes: per image, the true ``(words, 4)`` boxes.

    Raises:
        ValueError: the shapes do not fit.
    """
    if prob.dim() != 4 or prob.shape[1] != 1:
        raise ValueError(f"the detector metric needs (N, 1, H, W) maps, got {tuple(prob.shape)}")
    if len(boxes) != len(prob):
        raise ValueError(f"{len(boxes)} box lists for {len(prob)} maps")
    maps = prob[:, 0].double().numpy()
    found = [detect(m) for m in maps]
    ious = [iou for p, t in zip(found, boxes, strict=True) for iou in _matches(p, t)]
    tp = len(ious)
    words, detections = sum(len(t) for t in boxes), sum(len(p) for p in found)
    recall = tp / words if words else 1.0
    precision = tp / detections if detections else float(words == 0)
    f1 = 2 * recall * precision / (recall + precision) if recall + precision else 0.0
    return {
        "detection_f1": f1,
        "recall": recall,
        "precision": precision,
        "mean_iou": float(np.mean(ious)) if ious else 0.0,
        "detections": float(detections),
        "words": float(words),
    }


def score(
    outputs: Sequence[torch.Tensor], reference: Sequence[torch.Tensor], targets: object
) -> dict[str, float]:
    """The zoo metric (:func:`detection_figures`); ``targets`` are the rendered word boxes."""
    del reference  # scored against the rendered ground truth, FP32 the same way
    if not isinstance(targets, list):
        raise ValueError("the text-detection metric needs the word boxes of the evaluation images")
    return detection_figures(outputs[0], targets)


def check(outputs: Sequence[torch.Tensor]) -> None:
    """Raise ``ValueError`` unless the first output is a ``(N, 1, H, W)`` probability map."""
    if outputs[0].dim() != 4 or outputs[0].shape[1] != 1:
        raise ValueError(
            "the rendered-text metric needs a text detector that outputs (N, 1, H, W) "
            f"probability maps, got {tuple(outputs[0].shape)}"
        )
