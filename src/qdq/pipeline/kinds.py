"""The kind of a model's output tensor: what it looks like, the figure that compares it with FP32,
and why it was taken for that kind.

The kind is guessed from the FP32 tensor (samples along dimension 0) and, for a 4-D output, the
model's first 4-D input ``(N, C_in, H_in, W_in)`` (:func:`image_input`):

* ``class_vector`` — ``(N, C)`` with ``C >= 2``: ``top1_agreement``, the fraction of samples
  whose arg-max over ``C`` is FP32's.
* ``image`` — an image-to-image output (a denoiser's or a diffusion UNet's noise prediction, a
  VAE decoder's or a super-resolution model's image, a depth or probability map): a 4-D
  ``(N, C, H, W)`` with ``C <= 4`` (:data:`IMAGE_CHANNELS`) at the input's spatial size or a
  whole multiple ``k`` of it (``H = k·H_in``, ``W = k·W_in``), which has one channel, or the
  input's channel count, or ``k > 1``; not when every pixel's ``C >= 2`` values are
  probabilities (in ``[0, 1]``, summing to 1: a softmax segmentation). ``psnr``
  (:func:`qdq.pipeline.outputs.psnr`). A 2- to 4-class segmentation's *logits* at the input's
  size with as many classes as input channels (3 classes of an RGB image) cannot be told from
  an image: pass ``output_kind="class_map"`` (``--output-kind class_map``).
* ``class_map`` — any other ``(N, C, H, W)`` with ``C >= 2`` as the *first* output (a
  segmentation head): ``pixel_agreement``, the fraction of pixels whose arg-max over ``C`` is
  FP32's. A later 4-D output is a ``tensor``: detectors return their feature maps after the head
  (YOLO's ``feats``), and the arg-max over a feature map's channels means nothing.
* ``detections`` — a raw YOLO-style head, ``(N, 4 + K + E, A)`` (YOLOv8 and later) or
  ``(N, A, 4 + K + E)`` (YOLOv5): 4 box entries, ``K >= 1`` scores — the longest run of entries
  after the box whose FP32 values all lie in ``[0, 1]`` —, then ``E >= 0`` extra entries
  (YOLO-seg's 32 mask coefficients, YOLO-pose's keypoints), with at least ``4 + K`` anchors
  ``A``: ``box_agreement``. When both layouts fit, the one with more anchors wins, and
  ``(N, 4 + K + E, A)`` on a tie.
* ``embedding`` — an output *named* as a pooled embedding (its pytree path's last key:
  :data:`EMBEDDING_NAMES`), whatever its shape: ``cosine``. A hidden state
  (:data:`HIDDEN_NAMES`) is a ``tensor``. An unnamed ``(N, D)`` embedding cannot be told from
  logits and is taken for a class vector.
* ``tensor`` — anything else: ``cosine`` (the mean per-sample cosine).

:func:`named_kind` gives the kind a user names instead of the guess (``output_kind=``), checking
that the tensor fits it.

Example:
    >>> import torch
    >>> kind = output_kind(torch.zeros(2, 3, 32, 32), image_input=(3, 32, 32))
    >>> kind.name, kind.figure, kind.describe((3, 32, 32))
    ('image', 'psnr', "image: (N, 3, 32, 32), the input's 3 channels at its size")
    >>> output_kind(torch.zeros(2, 21, 32, 32), image_input=(3, 32, 32)).reason
    "21 channels at the input's size, the first output"
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "EMBEDDING_NAMES",
    "FIGURES",
    "HIDDEN_NAMES",
    "IMAGE_CHANNELS",
    "KINDS",
    "OutputKind",
    "check_kind_name",
    "image_input",
    "leaf_key",
    "named_kind",
    "output_kind",
    "shape_text",
]

#: every kind and the figure that compares it with FP32
FIGURES = {
    "class_vector": "top1_agreement",
    "class_map": "pixel_agreement",
    "detections": "box_agreement",
    "embedding": "cosine",
    "image": "psnr",
    "tensor": "cosine",
}
KINDS = tuple(FIGURES)
#: the most channels an ``image`` output has (grey, RGB, RGBA, a latent diffusion model's 4)
IMAGE_CHANNELS = 4
#: names (a pytree path's last key) of pooled embeddings, compared by cosine
EMBEDDING_NAMES = frozenset(
    {
        "pooler_output",
        "pooled_output",
        "sentence_embedding",
        "sentence_embeddings",
        "embedding",
        "embeddings",
        "text_embeds",
        "image_embeds",
    }
)
#: names of hidden states: tensors, whatever their values look like
HIDDEN_NAMES = frozenset({"last_hidden_state", "hidden_states", "encoder_last_hidden_state"})
#: how far from 1 a pixel's values may sum and still be class probabilities
_PROBABILITY_SUM_TOLERANCE = 1e-3


@dataclass(frozen=True)
class OutputKind:
    """What an output tensor looks like, the figure that compares it with FP32, and why.

    Attributes:
        name: one of :data:`KINDS`.
        figure: its figure (:data:`FIGURES`): ``"top1_agreement"``, ``"pixel_agreement"``,
            ``"box_agreement"``, ``"psnr"`` or ``"cosine"``.
        layout: for detections, ``"rows"`` (``(N, 4 + K, A)``) or ``"columns"``
            (``(N, A, 4 + K)``); else ``None``.
        classes: for detections, ``K``: the score entries after the 4 box entries (more entries
            may follow: YOLO-seg's mask coefficients, YOLO-pose's keypoints); else ``None``.
        reason: why the tensor is of this kind (``"21 channels at the input's size, the first
            output"``; ``"as given (output_kind='image')"``).
    """

    name: str
    figure: str
    layout: str | None = None
    classes: int | None = None
    reason: str = ""

    def describe(self, shape: Sequence[int]) -> str:
        """The kind with one sample's ``shape`` and the reason:
        ``"class_map: (N, 21, 64, 64), 21 channels at the input's size, the first output"``."""
        return f"{self.name}: {shape_text(shape)}, {self.reason}"


def shape_text(shape: Sequence[int]) -> str:
    """``(N, 3, 32, 32)`` for one sample's shape ``(3, 32, 32)``."""
    return "(" + ", ".join(["N", *(str(d) for d in shape)]) + ")"


def _kind(
    name: str, reason: str, layout: str | None = None, classes: int | None = None
) -> OutputKind:
    return OutputKind(name, FIGURES[name], layout, classes, reason)


def check_kind_name(name: object) -> str:
    """``name`` when it is one of :data:`KINDS`.

    Raises:
        ValueError: naming the unknown kind and every known one.
    """
    if not isinstance(name, str) or name not in FIGURES:
        raise ValueError(f"unknown output kind {name!r}; choose one of {', '.join(KINDS)}")
    return name


def image_input(inputs: Sequence[torch.Tensor]) -> tuple[int, ...] | None:
    """One sample's shape ``(C, H, W)`` of the first 4-D tensor among a model's ``inputs``
    (samples along dimension 0), or ``None``: what an ``image`` output's size is compared with."""
    return next((tuple(t.shape[1:]) for t in inputs if t.dim() == 4), None)


def output_kind(
    reference: torch.Tensor,
    *,
    first: bool = True,
    name: str | None = None,
    image_input: tuple[int, ...] | None = None,
) -> OutputKind:
    """The kind of an FP32 output (samples along dimension 0; see the module docstring).

    Args:
        reference: FP32's output.
        first: whether it is the model's first output (only that one can be a class map).
        name: its pytree path (:func:`qdq.pipeline.outputs.output_names`), when known.
        image_input: one sample's shape ``(C, H, W)`` of the model's first 4-D input
            (:func:`image_input`), when it has one: only then can an output be an ``image``.
    """
    key = leaf_key(name)
    if key in EMBEDDING_NAMES:
        return _kind("embedding", f"named {key} (a pooled embedding)")
    if key in HIDDEN_NAMES:
        return _kind("tensor", f"named {key} (a hidden state)")
    if reference.dim() == 2 and reference.shape[1] >= 2:
        return _kind("class_vector", f"{reference.shape[1]} class scores per sample")
    if reference.dim() == 4:
        return _map_kind(reference, first, image_input)
    if reference.dim() == 3:
        fit = _detections(reference)
        if fit is not None:
            layout, classes = fit
            why = f"4 box entries + {classes} scores in [0, 1] per anchor ({layout})"
            return _kind("detections", why, layout, classes)
    return _kind("tensor", "no other kind fits")


def _map_kind(
    reference: torch.Tensor, first: bool, image_input: tuple[int, ...] | None
) -> OutputKind:
    """An ``(N, C, H, W)`` output: an image, a class map or a tensor."""
    channels, height, width = reference.shape[1:]
    scale = _scale(height, width, image_input)
    probabilities = channels >= 2 and _probabilities(reference)
    if image_input is not None and scale is not None and channels <= IMAGE_CHANNELS:
        size = "the input's size" if scale == 1 else f"{scale}x the input's size"
        if probabilities:
            pass  # a softmax over 2 to 4 classes: a class map (below), whatever its size
        elif channels == 1:
            return _kind("image", f"one channel at {size}")
        elif channels == image_input[0]:
            own = "its size" if scale == 1 else f"{scale}x its size"
            return _kind("image", f"the input's {channels} channels at {own}")
        elif scale > 1:
            return _kind("image", f"{channels} channels at {size}")
    if channels < 2:
        return _kind("tensor", "one channel (no arg-max over channels)")
    if not first:
        return _kind("tensor", "a 4-D output after the first (a feature map: no arg-max)")
    parts = [f"{channels} channels"]
    if probabilities:
        parts.append("per-pixel class probabilities")
    if scale == 1:
        parts[0] += " at the input's size"
    return _kind("class_map", ", ".join([*parts, "the first output"]))


def _scale(height: int, width: int, image_input: tuple[int, ...] | None) -> int | None:
    """``k`` when ``(height, width)`` is ``k`` times the input's spatial size (``k >= 1``)."""
    if image_input is None or len(image_input) != 3:
        return None
    h_in, w_in = image_input[1], image_input[2]
    if h_in < 1 or w_in < 1 or height % h_in or width % w_in or height // h_in != width // w_in:
        return None
    k = height // h_in
    return k if k >= 1 else None


def _probabilities(reference: torch.Tensor) -> bool:
    """Every pixel's values over dimension 1 lie in [0, 1] and sum to 1 (a softmax)."""
    if reference.numel() == 0 or not bool(((reference >= 0) & (reference <= 1)).all()):
        return False
    sums = reference.double().sum(dim=1)
    return bool(((sums - 1).abs() <= _PROBABILITY_SUM_TOLERANCE).all())


def named_kind(name: str, reference: torch.Tensor, *, index: int = 0) -> OutputKind:
    """The kind ``name`` for FP32's output ``reference`` (output ``index``), as the user gave it
    instead of the guess; ``reason`` says so.

    Raises:
        ValueError: an unknown kind, or a tensor that does not fit it (a class vector is
            ``(N, C)``, a class map ``(N, C, ...)`` with ``C >= 2``, detections a 3-D YOLO-style
            head with scores in [0, 1]), naming the output and its shape.
    """
    check_kind_name(name)
    why = f"as given (output_kind={name!r})"
    dims, shape = reference.dim(), shape_text(reference.shape[1:])
    need = None
    if name == "class_vector" and not (dims == 2 and reference.shape[1] >= 2):
        need = "a class vector is (N, C) with C >= 2"
    elif name == "class_map" and not (dims >= 3 and reference.shape[1] >= 2):
        need = "a class map is (N, C, ...) with C >= 2 (the arg-max over C)"
    elif name == "detections":
        fit = _detections(reference) if dims == 3 else None
        if fit is None:
            need = (
                "detections are (N, 4 + K, A) or (N, A, 4 + K): 4 box entries, then K >= 1 "
                "scores in [0, 1], with A >= 4 + K anchors"
            )
        else:
            return _kind("detections", why, *fit)
    if need is not None:
        raise ValueError(
            f"output_kind {name!r} does not fit output {index} of shape {shape}: {need}"
        )
    return _kind(name, why)


def leaf_key(name: str | None) -> str | None:
    """The last key of a pytree path: ``"pooler_output"`` of ``"output['pooler_output']"``,
    ``None`` for an index or no name."""
    if not name or not name.endswith("']"):
        return None
    return name[: -len("']")].rpartition("['")[2]


def _detections(reference: torch.Tensor) -> tuple[str, int] | None:
    """``(layout, K)`` of a 3-D output read as a YOLO-style head, or ``None``."""
    rows, cols = reference.shape[1], reference.shape[2]
    fits = []
    for layout, entries, anchors in (("rows", rows, cols), ("columns", cols, rows)):
        classes = _score_entries(reference, layout, entries)
        if classes >= 1 and anchors >= 4 + classes:
            fits.append((layout, anchors - 4 - classes, classes))
    if not fits:
        return None
    layout, _, classes = max(fits, key=lambda f: f[1])  # more anchors than entries first
    return layout, classes  # "rows" (listed first) on a tie


def _score_entries(reference: torch.Tensor, layout: str, entries: int) -> int:
    """How many entries after the 4 box entries are scores: the longest run of them whose FP32
    values all lie in [0, 1] (YOLO-seg's 32 mask coefficients and YOLO-pose's keypoints follow
    the class scores and are not)."""
    if entries < 5 or reference.numel() == 0:
        return 0
    scores = reference[:, 4:, :] if layout == "rows" else reference[:, :, 4:].transpose(1, 2)
    ok = (scores >= 0) & (scores <= 1)  # NaN fails both
    in_range = ok.transpose(0, 1).reshape(entries - 4, -1).all(dim=1)
    bad = (~in_range).nonzero()
    return int(bad[0, 0]) if len(bad) else entries - 4
