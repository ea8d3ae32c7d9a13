"""Every output tensor of a model, INT8 against FP32: its kind, its figures, and the headline.

``qdq quantize`` compares each output tensor of the exported INT8 model (ONNX Runtime) with FP32's
(torch) and reports one row per tensor (``report.json: outputs``): per-sample cosine (mean and
minimum), the relative error ``||int8 - fp32|| / ||fp32||`` over the whole tensor, and the figure
of the tensor's kind: ``top1_agreement`` (a class vector), ``pixel_agreement`` (a class map),
``box_agreement`` (a YOLO-style detection head), ``psnr`` (an image-to-image output, :func:`psnr`)
or ``cosine`` (anything else). The kind is guessed from the FP32 tensor and the model's input
(:mod:`qdq.pipeline.kinds`), or given (``output_kind=``).

The guess can be wrong — a raw feature map returned first is called a class map, a ``(N, T, C)``
sequence of probabilities may be called detections, a 3-class segmentation's logits of an RGB
image at its size an image —, and it is wrong safely: every row also carries the cosine and the
relative error, which mean the same for any tensor, and the kind only decides which figure is
added (and, without labels or a metric, which figure of the first output is the headline).

Example:
    >>> import torch
    >>> output_kind(torch.zeros(8, 10)).figure
    'top1_agreement'
    >>> y = torch.rand(2, 84, 2100)  # YOLOv8 at 320x320: 4 box rows + 80 class scores per anchor
    >>> output_kind(y).name, compare(y, y, output_kind(y))["box_agreement"]
    ('detections', 1.0)
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from qdq.debug.stats import sample_cosines
from qdq.pipeline.kinds import (
    EMBEDDING_NAMES,
    HIDDEN_NAMES,
    OutputKind,
    leaf_key,
    output_kind,
)

__all__ = [
    "EMBEDDING_NAMES",
    "HIDDEN_NAMES",
    "IOU_THRESHOLD",
    "PSNR_CAP",
    "TOP_K",
    "OutputKind",
    "box_agreement",
    "compare",
    "cosines",
    "describe",
    "leaf_key",
    "onnx_output_names",
    "output_kind",
    "output_names",
    "output_table",
    "psnr",
    "recorded_output",
]

#: highest-scoring anchors per sample compared by :func:`box_agreement` (at most; see there)
TOP_K = 100
#: a box agrees when its IoU with FP32's reaches this
IOU_THRESHOLD = 0.5
#: the PSNR of identical outputs (FP32 against itself), in dB: an error 1e-5 of the peak
PSNR_CAP = 100.0


def embedding_output(names: Sequence[str] | None, references: Sequence[torch.Tensor]) -> int | None:
    """The index of the first output named as a pooled embedding (:data:`EMBEDDING_NAMES`) with
    one vector per sample (``(N, D)``), or ``None``."""
    for i, name in enumerate(names or ()):
        if leaf_key(name) in EMBEDDING_NAMES and i < len(references) and references[i].dim() == 2:
            return i
    return None


def cosines(out: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Per-sample cosine similarity (float64; each sample flattened, a ``(N,)`` output's samples
    are scalars), scale-invariant at any magnitude (:func:`qdq.debug.stats.sample_cosines`)."""
    if out.shape != reference.shape:
        raise ValueError(f"output shape {tuple(out.shape)} != FP32 {tuple(reference.shape)}")
    return sample_cosines(out, reference)


def psnr(out: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Per-sample PSNR of ``out`` against FP32's ``reference``, in dB (float64, ``(N,)``).

    ``10·log10(peak² / MSE)``, each sample flattened: ``MSE`` is the mean of ``(out − FP32)²``
    and ``peak`` FP32's value range over the sample (``max − min``: 1 for an image in ``[0, 1]``,
    2 in ``[-1, 1]``, a noise prediction's own spread), or its largest ``|value|`` when the
    sample is constant. Identical samples (FP32 against itself) score :data:`PSNR_CAP`, and the
    figure is kept within ``±PSNR_CAP`` (an all-zero FP32 sample against a non-zero one scores
    ``-PSNR_CAP``); a sample holding NaN or an infinity scores NaN.

    Example:
        >>> ref = torch.linspace(0, 1, 101).reshape(1, 101)
        >>> [round(v, 2) for v in psnr(ref + 0.01, ref).tolist()]  # range 1, error 0.01
        [40.0]
    """
    if out.shape != reference.shape:
        raise ValueError(f"output shape {tuple(out.shape)} != FP32 {tuple(reference.shape)}")
    a = out.detach().reshape(len(out), -1).double()
    b = reference.detach().reshape(len(reference), -1).double()
    if b.shape[1] == 0:
        return torch.full((len(b),), PSNR_CAP, dtype=torch.float64)
    mse = ((a - b) ** 2).mean(dim=1)
    peak = b.amax(dim=1) - b.amin(dim=1)
    peak = torch.where(peak > 0, peak, b.abs().amax(dim=1))
    db = 10 * torch.log10(peak**2 / mse)  # mse 0: inf (capped); peak 0: -inf (capped)
    db = torch.where((mse == 0) & (peak == 0), PSNR_CAP, db)
    return db.clamp(-PSNR_CAP, PSNR_CAP)  # NaN stays NaN


def compare(out: torch.Tensor, reference: torch.Tensor, kind: OutputKind) -> dict[str, Any]:
    """One output against FP32: cosine mean/min, relative error and the ``kind``'s figure.

    Returns:
        ``cosine_mean``, ``cosine_min``, ``relative_error`` (``None`` when FP32 is all zeros and
        the output is not), ``kind``, ``figure`` (its name), ``value`` (its value) and the figure
        under its own name; detections add ``top_k``, ``topk_overlap`` and ``layout``, an image
        ``psnr_min`` (its figure, ``psnr``, is the mean over samples, in dB).
    """
    cos = cosines(out, reference)
    ref_norm = float(torch.linalg.vector_norm(reference, dtype=torch.float64))
    diff_norm = float(torch.linalg.vector_norm(out - reference, dtype=torch.float64))
    if ref_norm > 0:
        relative: float | None = diff_norm / ref_norm
    else:
        relative = 0.0 if diff_norm == 0 else None
    row: dict[str, Any] = {
        "kind": kind.name,
        "figure": kind.figure,
        "value": float(cos.mean()),
        "cosine_mean": float(cos.mean()),
        "cosine_min": float(cos.min()),
        "relative_error": relative,
    }
    if kind.figure in ("top1_agreement", "pixel_agreement"):
        row["value"] = float((out.argmax(dim=1) == reference.argmax(dim=1)).float().mean())
    elif kind.figure == "box_agreement":
        assert kind.layout is not None
        row.update(box_agreement(out, reference, kind.layout, classes=kind.classes))
        row["value"] = row["box_agreement"]
    elif kind.figure == "psnr":
        db = psnr(out, reference)
        row["value"], row["psnr_min"] = float(db.mean()), float(db.min())
    row[kind.figure] = row["value"]
    return row


def box_agreement(
    out: torch.Tensor,
    reference: torch.Tensor,
    layout: str,
    top_k: int | None = None,
    *,
    classes: int | None = None,
) -> dict[str, Any]:
    """How well INT8 keeps FP32's highest-scoring boxes of a raw YOLO-style head.

    Per sample, each anchor's score is its highest class score (entries ``4:``; a YOLOv5
    objectness column counts as one more class) and its class that arg-max. Of FP32's ``top_k``
    highest-scoring anchors, ``box_agreement`` is the fraction where INT8 picks the same class
    and its box (entries ``:4``, read as ``(cx, cy, w, h)``) has IoU >= :data:`IOU_THRESHOLD`
    with FP32's; ``topk_overlap`` is the fraction of FP32's ``top_k`` anchors that are also among
    INT8's ``top_k``. ``top_k`` defaults to ``min(TOP_K, max(1, A // 10))``.

    Args:
        out: the INT8 output, the same shape as ``reference``.
        reference: the FP32 output, ``(N, 4 + K, A)`` (``layout="rows"``) or ``(N, A, 4 + K)``
            (``"columns"``).
        layout: ``"rows"`` or ``"columns"``.
        top_k: anchors compared per sample.
        classes: the score entries ``4 : 4 + classes`` (default: every entry after the box).

    Returns:
        ``box_agreement``, ``topk_overlap``, ``top_k`` and ``layout``.

    Raises:
        ValueError: a bad ``layout`` or ``top_k``, or shapes that differ or are not 3-D.
    """
    if layout not in ("rows", "columns"):
        raise ValueError(f"layout must be 'rows' or 'columns', got {layout!r}")
    if out.shape != reference.shape or reference.dim() != 3:
        raise ValueError(
            f"box_agreement needs two equal 3-D shapes, got {tuple(out.shape)} and "
            f"{tuple(reference.shape)}"
        )
    if layout == "rows":
        out, reference = out.transpose(1, 2), reference.transpose(1, 2)
    anchors = reference.shape[1]
    k = min(TOP_K, max(1, anchors // 10)) if top_k is None else top_k
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= anchors:
        raise ValueError(f"top_k must be an int in 1..{anchors} (the anchors), got {top_k!r}")
    end = reference.shape[-1] if classes is None else 4 + classes
    if not 5 <= end <= reference.shape[-1]:
        raise ValueError(f"classes must be in 1..{reference.shape[-1] - 4}, got {classes!r}")
    ref_conf, ref_cls = reference[..., 4:end].max(dim=-1)
    out_conf, out_cls = out[..., 4:end].max(dim=-1)
    ref_top = ref_conf.topk(k, dim=1).indices  # (N, k)
    out_top = out_conf.topk(k, dim=1).indices
    same_class = out_cls.gather(1, ref_top) == ref_cls.gather(1, ref_top)
    index = ref_top.unsqueeze(-1).expand(-1, -1, 4)
    iou = _iou_cxcywh(out[..., :4].gather(1, index), reference[..., :4].gather(1, index))
    hits = same_class & (iou >= IOU_THRESHOLD)
    in_ref = torch.zeros_like(ref_conf, dtype=torch.bool).scatter_(1, ref_top, True)
    in_out = torch.zeros_like(out_conf, dtype=torch.bool).scatter_(1, out_top, True)
    overlap = (in_ref & in_out).sum(dim=1).double() / k
    return {
        "box_agreement": float(hits.double().mean()),
        "topk_overlap": float(overlap.mean()),
        "top_k": k,
        "layout": layout,
    }


def _iou_cxcywh(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Element-wise IoU of ``(cx, cy, w, h)`` boxes (|w|, |h|); two equal empty boxes give 1."""
    a, b = a.double(), b.double()
    half_a, half_b = a[..., 2:].abs() / 2, b[..., 2:].abs() / 2
    lo = torch.maximum(a[..., :2] - half_a, b[..., :2] - half_b)
    hi = torch.minimum(a[..., :2] + half_a, b[..., :2] + half_b)
    inter = (hi - lo).clamp(min=0).prod(dim=-1)
    union = (2 * half_a).prod(dim=-1) + (2 * half_b).prod(dim=-1) - inter
    equal = (a == b).all(dim=-1).double()
    return torch.where(union > 0, inter / union.clamp(min=1e-300), equal)


def output_table(
    outs: Sequence[torch.Tensor],
    references: Sequence[torch.Tensor],
    names: Sequence[str | None] | None = None,
    onnx_names: Sequence[str | None] | None = None,
    headline: int | None = None,
    kinds: Sequence[OutputKind] | None = None,
) -> list[dict[str, Any]]:
    """One row per output tensor (``report.json: outputs``), INT8 ``outs`` against FP32.

    Each row: ``index``, ``name`` (its pytree path, :func:`output_names`), ``onnx_name`` (the
    exported graph's output), ``shape`` (one sample's), ``headline`` (whether the headline
    metric scores this output: ``index == headline``), ``kind_reason`` (the kind, the shape and
    why: ``"image: (N, 3, 64, 64), the input's 3 channels at its size"``) and :func:`compare`'s
    figures. ``kinds``: every output's kind (default: :func:`output_kind`'s guess from FP32's
    tensor alone).
    """
    if len(outs) != len(references):
        raise ValueError(f"{len(outs)} outputs but {len(references)} FP32 outputs")
    if kinds is not None and len(kinds) != len(references):
        raise ValueError(f"{len(kinds)} kinds for {len(references)} outputs")
    rows = []
    for i, (out, ref) in enumerate(zip(outs, references, strict=True)):
        kind = (
            kinds[i]
            if kinds is not None
            else output_kind(ref, first=i == 0, name=row_name(names, i))
        )
        rows.append(
            {
                "index": i,
                "name": None if names is None else names[i],
                "onnx_name": None if onnx_names is None else onnx_names[i],
                "shape": list(ref.shape[1:]),
                "headline": i == headline,
                "kind_reason": kind.describe(ref.shape[1:]),
                **compare(out, ref, kind),
            }
        )
    return rows


def row_name(names: Sequence[str | None] | None, i: int) -> str | None:
    return None if names is None or i >= len(names) else names[i]


@dataclass
class _Seen:
    value: Any = None


@contextlib.contextmanager
def recorded_output(module: nn.Module) -> Iterator[_Seen]:
    """Keep what ``module`` returns while inside (``seen.value``): a forward hook, removed on exit."""
    seen = _Seen()

    def hook(_module: nn.Module, _args: Any, output: Any) -> None:
        seen.value = output

    handle = module.register_forward_hook(hook)
    try:
        yield seen
    finally:
        handle.remove()


def output_names(output: Any) -> list[str]:
    """The pytree path of every tensor of a model output, as Python would index it (``[]``
    when a container of the output has no key paths).

    Example:
        >>> import torch
        >>> output_names((torch.zeros(1), {"boxes": torch.zeros(1), "n": 3}))
        ['output[0]', "output[1]['boxes']"]
        >>> output_names(torch.zeros(1))
        ['output']
    """
    from torch.utils._pytree import keystr, tree_flatten_with_path

    try:
        leaves, _ = tree_flatten_with_path(output)
    except (TypeError, ValueError):  # a pytree node registered without key paths
        return []
    return [f"output{keystr(path)}" for path, leaf in leaves if isinstance(leaf, torch.Tensor)]


def onnx_output_names(path: str | Path, count: int) -> list[str | None]:
    """The output names of an ONNX graph; ``None`` each when it has not ``count`` outputs."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    names = [o.name for o in graph.output]
    return names if len(names) == count else [None] * count


def describe(row: dict[str, Any]) -> str:
    """One line of a row, e.g. ``"output[0] (detections, 84x2100): box_agreement 0.9700, ..."``
    (a PSNR in dB: ``"psnr 41.20 dB (min 38.02)"``)."""
    name = row["name"] or f"output {row['index']}"
    shape = "x".join(str(d) for d in row["shape"]) or "scalar"
    rel = row["relative_error"]
    text = f"{name} ({row['kind']}, {shape}): "
    if row["figure"] == "psnr":
        text += f"psnr {row['value']:.2f} dB (min {row['psnr_min']:.2f}), "
    elif row["figure"] != "cosine":
        text += f"{row['figure']} {row['value']:.4f}, "
    text += f"cosine {row['cosine_mean']:.6f} (min {row['cosine_min']:.6f})"
    text += ", relative error " + ("-" if rel is None or not math.isfinite(rel) else f"{rel:.4f}")
    return text
