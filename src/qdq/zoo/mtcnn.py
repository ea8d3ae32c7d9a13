"""MTCNN's refine (RNet) and output (ONet) stages with facenet-pytorch's packaged weights, on LFW faces.

:class:`RNet` and :class:`ONet` are qdq's own definitions of the two networks (Conv2d + PReLU +
MaxPool, then Linear heads; no BatchNorm) whose parameter names match the ``state_dict`` files
facenet-pytorch ships as ``facenet_pytorch/data/rnet.pt`` and ``onet.pt``. Only those files are
read (``torch.load`` with ``weights_only=True``); facenet-pytorch's code is never imported — its
metadata pins torch<2.3 and numpy<2, so it is installed without its dependencies:
``pip install --no-deps facenet-pytorch==2.6.0``.

Outputs keep facenet-pytorch's order: RNet returns ``(box_regression (N, 4), probabilities (N, 2))``,
ONet ``(box_regression (N, 4), landmarks (N, 10), probabilities (N, 2))``; column 1 of the
probabilities is p(face).

**Data.** scikit-image's ``lfw_subset`` (bundled, offline): 100 face and 100 non-face 25×25 grayscale
crops. Each is resized (bilinear, antialiased) to the network's input (24×24 for RNet, 48×48 for
ONet), replicated to three channels and normalized as MTCNN does, ``(255 x - 127.5) / 128``. The
input is a standard NCHW tensor. A seeded permutation of each class picks the calibration crops
(half faces, half non-faces); evaluation uses every other crop, so the two never overlap.

**Metric.** ``face_accuracy``: p(face) > 0.5 agrees with the face/non-face label. It sits at
100 % for FP32, so the report also gives the cosine of the box regression (and, for ONet, the
landmarks) with FP32, per sample and averaged, and the mean absolute change of p(face). The box
cosine is also given over the face crops alone (``box_cosine_faces``): MTCNN only uses the box of
a crop it takes for a face, and the regression of a non-face crop is what quantization disturbs
most (RNet at full INT8, mse: 0.9989 on faces, 0.9963 on non-faces).

Example:
    >>> from qdq.zoo import mtcnn  # doctest: +SKIP
    >>> x, faces = mtcnn.lfw_faces(24)  # doctest: +SKIP
    >>> box, prob = mtcnn.load_pretrained("rnet")(x)  # doctest: +SKIP
    >>> float(((prob[:, 1] > 0.5).long() == faces).float().mean())  # doctest: +SKIP
    1.0
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from qdq.zoo._assets import package_file

__all__ = [
    "INSTALL",
    "SIZES",
    "ONet",
    "RNet",
    "check",
    "face_figures",
    "lfw_faces",
    "lfw_split",
    "load_pretrained",
    "score",
]

INSTALL = "pip install --no-deps facenet-pytorch==2.6.0 (qdq reads only its weights files)"
#: input side per network
SIZES = {"rnet": 24, "onet": 48}


def _flatten(x: torch.Tensor) -> torch.Tensor:
    # the weights come from Caffe, whose feature order is (W, H, C)
    return x.permute(0, 3, 2, 1).flatten(1)


class RNet(nn.Module):
    """MTCNN's refine network: ``(N, 3, 24, 24)`` → ``(box (N, 4), probabilities (N, 2))``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.prelu1 = nn.Conv2d(3, 28, 3), nn.PReLU(28)
        self.pool1 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv2, self.prelu2 = nn.Conv2d(28, 48, 3), nn.PReLU(48)
        self.pool2 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv3, self.prelu3 = nn.Conv2d(48, 64, 2), nn.PReLU(64)
        self.dense4, self.prelu4 = nn.Linear(576, 128), nn.PReLU(128)
        self.dense5_1 = nn.Linear(128, 2)
        self.dense5_2 = nn.Linear(128, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.pool1(self.prelu1(self.conv1(x)))
        x = self.pool2(self.prelu2(self.conv2(x)))
        x = self.prelu3(self.conv3(x))
        x = self.prelu4(self.dense4(_flatten(x)))
        return self.dense5_2(x), torch.softmax(self.dense5_1(x), dim=1)


class ONet(nn.Module):
    """MTCNN's output network: ``(N, 3, 48, 48)`` → ``(box (N, 4), landmarks (N, 10), probs (N, 2))``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.prelu1 = nn.Conv2d(3, 32, 3), nn.PReLU(32)
        self.pool1 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv2, self.prelu2 = nn.Conv2d(32, 64, 3), nn.PReLU(64)
        self.pool2 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv3, self.prelu3 = nn.Conv2d(64, 64, 3), nn.PReLU(64)
        self.pool3 = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.conv4, self.prelu4 = nn.Conv2d(64, 128, 2), nn.PReLU(128)
        self.dense5, self.prelu5 = nn.Linear(1152, 256), nn.PReLU(256)
        self.dense6_1 = nn.Linear(256, 2)
        self.dense6_2 = nn.Linear(256, 4)
        self.dense6_3 = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.pool1(self.prelu1(self.conv1(x)))
        x = self.pool2(self.prelu2(self.conv2(x)))
        x = self.pool3(self.prelu3(self.conv3(x)))
        x = self.prelu4(self.conv4(x))
        x = self.prelu5(self.dense5(_flatten(x)))
        return self.dense6_2(x), self.dense6_3(x), torch.softmax(self.dense6_1(x), dim=1)


def load_pretrained(net: str) -> nn.Module:
    """:class:`RNet` (``"rnet"``) or :class:`ONet` (``"onet"``) with facenet-pytorch's weights.

    Raises:
        ValueError: ``net`` is neither, or the weights file does not fit.
        ImportError: facenet-pytorch is not installed (the message gives the pip command).
    """
    if net not in SIZES:
        raise ValueError(f"net must be 'rnet' or 'onet', got {net!r}")
    path = package_file("facenet_pytorch", f"data/{net}.pt", INSTALL, f"mtcnn-{net}")
    state = torch.load(path, map_location="cpu", weights_only=True)
    model: nn.Module = RNet() if net == "rnet" else ONet()
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        raise ValueError(f"{path}: not MTCNN {net} weights ({err})") from None
    return model.eval()


# ------------------------------------------------------------------------------------- data


def lfw_faces(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """All 200 ``lfw_subset`` crops as ``(200, 3, size, size)`` MTCNN inputs and their labels.

    Labels: 1 for the 100 faces (the first half), 0 for the 100 non-faces.

    Raises:
        ImportError: scikit-image is missing.
        ValueError: ``size`` is not a positive int.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be a positive int, got {size!r}")
    try:
        import skimage.data
    except ImportError:
        raise ImportError(
            "the lfw_subset faces need scikit-image: pip install scikit-image "
            "(or pip install 'qdq[zoo]')"
        ) from None
    crops = torch.from_numpy(np.asarray(skimage.data.lfw_subset(), dtype=np.float32))
    x = F.interpolate(crops[:, None] * 255.0, size=(size, size), mode="bilinear", antialias=True)
    x = ((x - 127.5) * 0.0078125).expand(-1, 3, -1, -1).contiguous()
    labels = torch.zeros(len(crops), dtype=torch.int64)
    labels[: len(crops) // 2] = 1
    return x, labels


def lfw_split(
    size: int, calib: int, evaluate: int | None, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Calibration crops, evaluation crops and evaluation labels; the two sets are disjoint.

    Calibration takes ``calib // 2`` faces and ``calib - calib // 2`` non-faces, chosen by a
    permutation of each class seeded with ``seed``; evaluation takes the other crops, faces and
    non-faces interleaved (at most ``evaluate``).

    Raises:
        ValueError: ``calib`` leaves no crop of a class for evaluation.
    """
    x, labels = lfw_faces(size)
    faces, others = torch.nonzero(labels == 1)[:, 0], torch.nonzero(labels == 0)[:, 0]
    n_faces, n_others = calib // 2, calib - calib // 2
    if n_faces >= len(faces) or n_others >= len(others) or calib < 1:
        raise ValueError(
            f"lfw_subset has {len(faces)} faces and {len(others)} non-faces; {calib} calibration "
            "crops leave too few for evaluation"
        )
    generator = torch.Generator().manual_seed(seed)
    faces = faces[torch.randperm(len(faces), generator=generator)]
    others = others[torch.randperm(len(others), generator=generator)]
    cal = torch.cat([faces[:n_faces], others[:n_others]])
    rest_f, rest_o = faces[n_faces:], others[n_others:]
    pairs = torch.stack([rest_f[: len(rest_o)], rest_o[: len(rest_f)]], dim=1).flatten()
    ev = torch.cat([pairs, rest_f[len(rest_o) :], rest_o[len(rest_f) :]])
    if evaluate is not None:
        ev = ev[:evaluate]
    return x[cal], x[ev], labels[ev]


# ----------------------------------------------------------------------------------- metric


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(F.cosine_similarity(a.double(), b.double(), dim=1, eps=1e-12).mean())


def face_figures(
    outputs: Sequence[torch.Tensor], reference: Sequence[torch.Tensor], faces: torch.Tensor
) -> dict[str, float]:
    """Face accuracy and the fidelity of every head with FP32.

    Args:
        outputs: RNet's ``(box, probs)`` or ONet's ``(box, landmarks, probs)``.
        reference: the FP32 model's outputs on the same crops.
        faces: 1 for a face, 0 for a non-face, per crop.
    """
    check(outputs)
    p, p_ref = outputs[-1][:, 1], reference[-1][:, 1]
    figures = {
        "face_accuracy": float(((p > 0.5).long() == faces).double().mean()),
        "box_cosine": _cosine(outputs[0], reference[0]),
        "face_prob_abs_diff": float((p.double() - p_ref.double()).abs().mean()),
    }
    is_face = faces == 1
    if bool(is_face.any()):  # the crops whose box MTCNN keeps (p(face) above its threshold)
        figures["box_cosine_faces"] = _cosine(outputs[0][is_face], reference[0][is_face])
    if len(outputs) == 3:
        figures["landmark_cosine"] = _cosine(outputs[1], reference[1])
    return figures


def score(
    outputs: Sequence[torch.Tensor], reference: Sequence[torch.Tensor], targets: object
) -> dict[str, float]:
    """The zoo metric (:func:`face_figures`); ``targets`` are the face labels."""
    if not isinstance(targets, torch.Tensor):
        raise ValueError("the MTCNN metric needs the face/non-face labels of the evaluation crops")
    return face_figures(outputs, reference, targets)


def check(outputs: Sequence[torch.Tensor]) -> None:
    """Raise ``ValueError`` unless the outputs look like RNet's or ONet's."""
    shapes = [tuple(o.shape[1:]) for o in outputs]
    if shapes not in ([(4,), (2,)], [(4,), (10,), (2,)]):
        raise ValueError(
            "the lfw-faces metric needs MTCNN RNet/ONet outputs (box (N, 4)[, landmarks (N, 10)], "
            f"probabilities (N, 2)), got per-sample shapes {shapes}"
        )
