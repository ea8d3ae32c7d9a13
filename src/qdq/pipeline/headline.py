"""What the headline of ``qdq quantize`` is, and the kind of every output it compares.

:func:`headline` describes the headline metric (``report.json: headline``); :func:`metric_name`
names it. At the ``check`` stage, :func:`output_metric` binds the headline that one sample's
outputs decide when neither labels nor a metric do — the kind given by ``output_kind=``, an
encoder's pooled embedding (:func:`embedding_metric`), an image-to-image output's PSNR — as a task
metric, so that every stage scores it. :func:`output_kinds` gives every output's kind for the
outputs table (:mod:`qdq.pipeline.kinds`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from qdq.pipeline.data import QuantData
from qdq.pipeline.inputs import Inputs, input_items
from qdq.pipeline.kinds import OutputKind, image_input, named_kind
from qdq.pipeline.outputs import compare, cosines, embedding_output, output_kind, row_name
from qdq.zoo.registry import ZooMetric

__all__ = [
    "embedding_metric",
    "headline",
    "kind_metric",
    "kind_refused",
    "metric_name",
    "output_kinds",
    "output_metric",
]


def metric_name(
    reference: torch.Tensor, labels: torch.Tensor | None, metric: ZooMetric | None = None
) -> str:
    """The headline metric's name: the task (or user) metric's, else ``top1_accuracy``, else the
    figure of the first output's guessed kind (``top1_agreement``, ``pixel_agreement``,
    ``box_agreement``, ``cosine``; an image's ``psnr`` and a given kind's figure come bound as
    ``metric``, :func:`output_metric`); ``reference`` is FP32's first output."""
    if metric is not None:
        return metric.name
    if labels is not None:
        return "token_accuracy" if labels.dim() == 2 else "top1_accuracy"
    return output_kind(reference).figure


def headline(
    reference: torch.Tensor,
    labels: torch.Tensor | None,
    metric: ZooMetric | None = None,
    user: str | None = None,
    kind: OutputKind | None = None,
) -> dict[str, Any]:
    """What the headline metric is (``report.json: headline``).

    Args:
        reference: FP32's first output.
        labels: the evaluation labels, if any.
        metric: the task metric (a user metric is bound as one).
        user: the user metric's spec, when ``metric`` is one.
        kind: the first output's kind (default: :func:`output_kind`'s guess from ``reference``).

    Returns:
        ``name`` (= ``metric_name``), ``source`` (``"user"``, ``"task"``, ``"labels"`` or
        ``"output"``), ``output`` (the index of the output it scores, ``None`` for a metric of
        every output), ``kind`` (that output's kind, or ``None``) and ``text`` (one line).
    """
    name = metric_name(reference, labels, metric)
    if metric is not None and metric.text is not None:
        return {"name": name, "source": "output", "output": metric.output,
                "kind": metric.kind, "text": metric.text}  # fmt: skip
    if metric is not None:
        source = "task" if user is None else "user"
        text = (
            f"{name}, the dataset's task metric (from every output and its ground truth)"
            if user is None
            else f"{name}, from the user metric {user} (every output and the labels)"
        )
        return {"name": name, "source": source, "output": None, "kind": None, "text": text}
    kind = output_kind(reference) if kind is None else kind
    shape = "x".join(str(d) for d in reference.shape[1:]) or "scalar"
    if labels is not None and labels.dim() == 2:
        text = f"token accuracy of output 0 ({shape}) against the labels (-100 ignored)"
        source = "labels"
    elif labels is not None:
        text = (
            f"top-1 accuracy of output 0 against the labels; {kind.describe(reference.shape[1:])}"
        )
        source = "labels"
    else:
        text = f"{name} of output 0 with FP32; {kind.describe(reference.shape[1:])}"
        source = "output"
    return {"name": name, "source": source, "output": 0, "kind": kind.name, "text": text}


def embedding_metric(
    names: Sequence[str] | None, references: Sequence[torch.Tensor]
) -> ZooMetric | None:
    """``embedding_cosine``: the mean per-sample cosine against FP32 of the first output named as
    a pooled embedding (``(N, D)``; :func:`qdq.pipeline.outputs.embedding_output`), for an
    encoder without a head and data without labels; ``None`` when no output is one."""
    index = embedding_output(names, references)
    if index is None or names is None:
        return None
    i = index

    def scored(
        outs: Sequence[torch.Tensor], refs: Sequence[torch.Tensor], _targets: object
    ) -> dict[str, float]:
        cos = cosines(outs[i], refs[i])
        return {"embedding_cosine": float(cos.mean()), "embedding_cosine_min": float(cos.min())}

    width = references[i].shape[1]
    text = (
        f"embedding_cosine: cosine of output {i} ({names[i]}, {width}) with FP32, mean per sample"
    )
    return ZooMetric("embedding_cosine", scored, lambda outputs: None, output=i, text=text,
                     kind="embedding")  # fmt: skip


def output_metric(
    names: Sequence[str] | None,
    references: Sequence[torch.Tensor],
    inputs: Inputs,
    kind: str | None = None,
) -> ZooMetric | None:
    """The headline decided at the ``check`` stage from one sample's FP32 outputs, when neither
    labels nor a metric decide it, bound as a task metric so that every stage (``--max-drop``,
    ``--compare-methods``, QAT) scores it:

    * ``kind`` given (``output_kind=``): that kind's figure of output 0
      (:func:`qdq.pipeline.kinds.named_kind`, which checks that the output fits it);
    * an output named as a pooled embedding: ``embedding_cosine`` (:func:`embedding_metric`);
    * the first output guessed as an ``image`` from the model's ``inputs``: ``psnr`` of output 0;
    * else ``None``: the first output's guessed figure, scored by :func:`score`.

    Raises:
        ValueError: an unknown ``kind``, or one that output 0 does not fit.
    """
    if kind is not None:
        return kind_metric(named_kind(kind, references[0]), tuple(references[0].shape[1:]))
    embedding = embedding_metric(names, references)
    if embedding is not None:
        return embedding
    shape = image_input([t for _, t in input_items(inputs)])
    guessed = output_kind(references[0], name=row_name(names, 0), image_input=shape)
    if guessed.name == "image":
        return kind_metric(guessed, tuple(references[0].shape[1:]))
    return None


def kind_metric(kind: OutputKind, shape: tuple[int, ...], index: int = 0) -> ZooMetric:
    """The figure of ``kind`` for output ``index`` (one sample's ``shape``) as a task metric:
    ``figures`` holds the figure and the cosine (a PSNR adds ``psnr_min``, detections
    ``topk_overlap``, a cosine ``cosine_min``)."""

    def scored(
        outs: Sequence[torch.Tensor], refs: Sequence[torch.Tensor], _targets: object
    ) -> dict[str, float]:
        row = compare(outs[index], refs[index], kind)
        figures = {kind.figure: float(row["value"])}
        extra = {"psnr": "psnr_min", "box_agreement": "topk_overlap", "cosine": "cosine_min"}
        if kind.figure in extra:
            figures[extra[kind.figure]] = float(row[extra[kind.figure]])
        if kind.figure != "cosine":
            figures["cosine"] = float(row["cosine_mean"])
        return figures

    text = f"{kind.figure} of output {index} with FP32"
    if kind.figure == "psnr":
        text += " (dB, mean per sample; peak: FP32's value range per sample)"
    text += f"; {kind.describe(shape)}"
    return ZooMetric(kind.figure, scored, lambda outputs: None, output=index, text=text,
                     kind=kind.name)  # fmt: skip


def output_kinds(
    references: Sequence[torch.Tensor],
    names: Sequence[str] | None,
    inputs: Inputs,
    metric: ZooMetric | None = None,
) -> list[OutputKind]:
    """Every output's kind for the outputs table: guessed from FP32's tensor and the model's
    ``inputs`` (:func:`qdq.pipeline.kinds.output_kind`), but the kind of the output a bound
    ``metric`` scores (:func:`output_metric`: ``output_kind=``) where the guess differs."""
    shape = image_input([t for _, t in input_items(inputs)])
    kinds = [
        output_kind(r, first=i == 0, name=row_name(names, i), image_input=shape)
        for i, r in enumerate(references)
    ]
    given = None if metric is None else metric.kind
    i = None if metric is None else metric.output
    if given is not None and i is not None and i < len(kinds) and kinds[i].name != given:
        kinds[i] = named_kind(given, references[i], index=i)
    return kinds


def kind_refused(kind: str, qdata: QuantData, user: bool, per_image: object) -> str:
    """Why ``output_kind=kind`` cannot set the headline: what decides it instead (``user``: a
    ``--metric``; ``per_image``: the detection keys in per-image mode, else ``None``)."""
    if per_image is not None:
        what = "per-image detection lists (detection_f1 against FP32)"
    elif user:
        what = "the metric you gave (--metric / metric=)"
    elif qdata.labels is not None:
        what = "the labels (top-1 accuracy)"
    elif qdata.metric is not None:
        what = f"the dataset's task metric {qdata.metric.name}"
    else:
        what = "something else"
    return (
        f"output_kind {kind!r} sets the kind of output 0, whose figure is then the headline, but "
        f"{what} decides the headline here: drop --output-kind / output_kind= (the outputs "
        "table still guesses the kind of every output)"
    )
