"""Per-image detection lists (torchvision's R-CNNs after NMS), INT8 against FP32.

A model in *per-image mode* (:mod:`qdq.pipeline.per_image`) returns, per image, a dict of tensors
whose dimension 0 counts that image's detections, varying from image to image:
``boxes`` ``(k, 4)`` as ``(x0, y0, x1, y1)``, ``scores`` ``(k,)``, optionally ``labels`` ``(k,)``
and per-detection extras (Keypoint R-CNN's ``keypoints`` ``(k, 17, 3)`` and
``keypoints_scores``). One image's detections are a :data:`Detections` (its ``{key: tensor}``).

Two lists are compared by **greedy matching** (:func:`match`): FP32's detections in decreasing
score order each take the not yet matched INT8 detection of the same label (any, when there are no
labels) with the highest IoU, if that IoU is at least :data:`~qdq.pipeline.outputs.IOU_THRESHOLD`
(0.5). From the matches (:func:`detection_agreement`, mean over images):

* ``detection_f1`` — the headline: ``2 m / (k_int8 + k_fp32)`` per image (``m`` matches); two
  empty lists agree fully (1.0), an empty list against a non-empty one not at all (0.0);
* ``recall`` — ``m / k_fp32`` (FP32's detections that INT8 keeps; 1.0 when FP32 has none),
  ``precision`` — ``m / k_int8`` (1.0 when INT8 has none);
* ``top10_recall`` — the share of FP32's 10 highest-scoring detections that are matched;
* ``mean_iou`` and ``score_delta`` (mean ``|score_int8 - score_fp32|``) over all matched
  pairs, ``None`` without a match;
* ``keypoint_error`` — with ``keypoints``: the mean distance in pixels between the matched
  pairs' keypoints (``x, y``), ``None`` without;
* ``detections_fp32`` / ``detections_int8`` — the mean detection count per image.

Example:
    >>> import torch
    >>> a = {"boxes": torch.tensor([[0.0, 0, 10, 10]]), "scores": torch.tensor([0.9])}
    >>> detection_agreement([a], [a])["detection_f1"]
    1.0
    >>> empty = {"boxes": torch.zeros(0, 4), "scores": torch.zeros(0)}
    >>> f1 = lambda out, ref: detection_agreement([out], [ref])["detection_f1"]
    >>> f1(empty, a), f1(a, empty), f1(empty, empty)
    (0.0, 0.0, 1.0)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import torch

from qdq.pipeline.outputs import IOU_THRESHOLD

__all__ = [
    "Detections",
    "Match",
    "box_iou",
    "detection_agreement",
    "is_detection_dict",
    "match",
]

#: one image's detections: ``{"boxes": (k, 4), "scores": (k,), ...}``
Detections: TypeAlias = dict[str, torch.Tensor]

#: FP32's highest-scoring detections counted by ``top10_recall``
TOP_RECALL = 10


def is_detection_dict(value: Any) -> bool:
    """Whether ``value`` is one image's detections: a dict of tensors with ``boxes`` ``(k, 4)``
    and ``scores`` ``(k,)``, every other tensor also ``k`` long."""
    if not isinstance(value, dict) or not all(isinstance(v, torch.Tensor) for v in value.values()):
        return False
    boxes, scores = value.get("boxes"), value.get("scores")
    if boxes is None or scores is None or boxes.dim() != 2 or boxes.shape[1] != 4:
        return False
    k = boxes.shape[0]
    return scores.shape == (k,) and all(v.dim() >= 1 and v.shape[0] == k for v in value.values())


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of every ``(x0, y0, x1, y1)`` box of ``a`` ``(n, 4)`` with every one of ``b``
    ``(m, 4)``: ``(n, m)``, float64; a pair of equal empty boxes has IoU 1."""
    a, b = a.double(), b.double()
    area_a = (a[:, 2] - a[:, 0]).clamp(min=0) * (a[:, 3] - a[:, 1]).clamp(min=0)
    area_b = (b[:, 2] - b[:, 0]).clamp(min=0) * (b[:, 3] - b[:, 1]).clamp(min=0)
    lo = torch.maximum(a[:, None, :2], b[None, :, :2])
    hi = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (hi - lo).clamp(min=0).prod(dim=-1)
    union = area_a[:, None] + area_b[None, :] - inter
    equal = (a[:, None, :] == b[None, :, :]).all(dim=-1).double()
    return torch.where(union > 0, inter / union.clamp(min=1e-300), equal)


@dataclass(frozen=True)
class Match:
    """The greedy matching of one image (see the module docstring).

    Attributes:
        pairs: ``(i_out, i_ref)`` per match, in FP32's score order.
        ious: the IoU of each pair.
        count_out: detections of the compared list (INT8).
        count_ref: detections of the reference list (FP32).
    """

    pairs: tuple[tuple[int, int], ...]
    ious: tuple[float, ...]
    count_out: int
    count_ref: int

    @property
    def f1(self) -> float:
        """``2 m / (k_out + k_ref)``; 1.0 for two empty lists."""
        total = self.count_out + self.count_ref
        return 1.0 if total == 0 else 2 * len(self.pairs) / total


def match(out: Detections, ref: Detections, iou_threshold: float = IOU_THRESHOLD) -> Match:
    """Match ``out``'s detections to ``ref``'s: ``ref``'s in decreasing score order each take the
    unmatched ``out`` detection of the same label (when both have ``labels``) with the highest
    IoU, when it reaches ``iou_threshold``."""
    n_out, n_ref = len(out["boxes"]), len(ref["boxes"])
    if n_out == 0 or n_ref == 0:
        return Match((), (), n_out, n_ref)
    iou = box_iou(out["boxes"], ref["boxes"])  # (n_out, n_ref)
    if "labels" in out and "labels" in ref:
        same = out["labels"].reshape(-1, 1) == ref["labels"].reshape(1, -1)
        iou = torch.where(same, iou, torch.full_like(iou, -1.0))
    order = torch.argsort(ref["scores"].double(), descending=True, stable=True)
    taken = torch.zeros(n_out, dtype=torch.bool)
    pairs, ious = [], []
    for j in order.tolist():
        column = iou[:, j].masked_fill(taken, -1.0)
        best = int(column.argmax())
        value = float(column[best])
        if value >= iou_threshold:
            taken[best] = True
            pairs.append((best, j))
            ious.append(value)
    return Match(tuple(pairs), tuple(ious), n_out, n_ref)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def detection_agreement(outs: Sequence[Detections], refs: Sequence[Detections]) -> dict[str, Any]:
    """The figures of the module docstring: ``outs`` (INT8) against ``refs`` (FP32), per image.

    Raises:
        ValueError: the two hold different numbers of images, or none.
    """
    if len(outs) != len(refs) or not refs:
        raise ValueError(f"{len(outs)} INT8 images against {len(refs)} FP32 images")
    f1, recall, precision, top = [], [], [], []
    ious: list[float] = []
    deltas: list[float] = []
    keypoints: list[float] = []
    for out, ref in zip(outs, refs, strict=True):
        m = match(out, ref)
        hits = len(m.pairs)
        f1.append(m.f1)
        recall.append(1.0 if m.count_ref == 0 else hits / m.count_ref)
        precision.append(1.0 if m.count_out == 0 else hits / m.count_out)
        best = torch.argsort(ref["scores"].double(), descending=True, stable=True)[:TOP_RECALL]
        matched_ref = {j for _, j in m.pairs}
        top.append(1.0 if len(best) == 0 else sum(int(j) in matched_ref for j in best) / len(best))
        ious.extend(m.ious)
        for i, j in m.pairs:
            deltas.append(abs(float(out["scores"][i]) - float(ref["scores"][j])))
            if "keypoints" in out and "keypoints" in ref:
                d = out["keypoints"][i, :, :2].double() - ref["keypoints"][j, :, :2].double()
                keypoints.append(float(d.norm(dim=-1).mean()))
    n = len(refs)
    return {
        "detection_f1": sum(f1) / n,
        "recall": sum(recall) / n,
        "precision": sum(precision) / n,
        "top10_recall": sum(top) / n,
        "mean_iou": _mean(ious),
        "score_delta": _mean(deltas),
        "keypoint_error": _mean(keypoints),
        "detections_fp32": sum(len(r["boxes"]) for r in refs) / n,
        "detections_int8": sum(len(o["boxes"]) for o in outs) / n,
    }
