"""Model outputs in torch and ONNX Runtime, and the metrics ``qdq quantize`` reports.

The headline metric (``metric_name``; :func:`headline` describes it) is, first that applies:

* a user metric (:mod:`qdq.pipeline.metric`) or a built-in dataset's task metric
  (:class:`qdq.zoo.registry.ZooMetric`: CREPE's pitch accuracy, MTCNN's face accuracy, the text
  detector's F1): scored from every output tensor of the model (in ``torch.utils._pytree`` order,
  which is also the exported ONNX's output order) and the labels or the dataset's ground truth;
  its named figures are kept under ``figures``;
* with labels: ``top1_accuracy`` of the first output (arg-max over dimension 1 equals the label);
* otherwise the figure of the first output's kind (:mod:`qdq.pipeline.outputs`) against FP32:
  ``top1_agreement`` (a class vector), ``pixel_agreement`` (a class map), ``box_agreement`` (a
  YOLO-style detection head) or ``cosine`` (mean per-sample cosine); FP32's own is 1.0.

Every score also carries the per-sample cosine (mean and minimum) of the first output against
FP32, and its top-1 agreement when it is a class vector or map (else ``None``).
:func:`qdq.pipeline.outputs.output_table` compares every output.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from qdq._modes import eval_no_grad
from qdq._progress import progress
from qdq.pipeline.device import module_device, to_device
from qdq.pipeline.inputs import ForwardInputs, Inputs, batches, call, num_samples
from qdq.pipeline.outputs import compare, cosines, output_kind
from qdq.zoo.registry import ZooMetric

__all__ = [
    "batches",
    "headline",
    "metric_name",
    "ort_outputs",
    "output_tensors",
    "score",
    "torch_outputs",
]


def output_tensors(output: Any, what: str) -> list[torch.Tensor]:
    """The tensors of a model output (tensor, tuple, list or dict), in pytree order."""
    leaves, _ = tree_flatten(output)
    tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
    if not tensors:
        raise ValueError(f"{what} returned no tensor (got {type(output).__name__})")
    return tensors


def first_tensor(output: Any, what: str) -> torch.Tensor:
    """The first tensor of a model output (tensor, tuple, list or dict)."""
    return output_tensors(output, what)[0]


def _stack(parts: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    return [torch.cat(outputs) for outputs in zip(*parts, strict=True)]


def torch_outputs(
    model: nn.Module,
    x: Inputs,
    size: int,
    *,
    static: bool,
    desc: str,
    show: bool,
    every: bool = False,
) -> list[torch.Tensor]:
    """The outputs of ``model`` on every sample of ``x`` (eval mode, no grad).

    ``x``: one tensor, a tuple (positional inputs) or a dict (keyword inputs); see
    :mod:`qdq.pipeline.inputs`. Only the first output tensor unless ``every`` (every output, all
    batch-major).
    """
    parts = []
    total = -(-num_samples(x) // size)
    device = module_device(model)  # batches go where the model is; outputs come back to the CPU
    with eval_no_grad(model):
        for b, real in progress(batches(x, size, static), total=total, desc=desc, enabled=show):
            tensors = output_tensors(call(model, to_device(b, device)), desc)
            parts.append([t[:real].float().cpu() for t in (tensors if every else tensors[:1])])
    return _stack(parts)


def ort_outputs(
    path: str | Path,
    x: Inputs,
    size: int,
    *,
    static: bool,
    desc: str,
    show: bool,
    every: bool = False,
    forward: ForwardInputs | None = None,
) -> list[torch.Tensor]:
    """The outputs of the ONNX model in ONNX Runtime (CPU, ``ORT_ENABLE_BASIC``), as
    :func:`torch_outputs` (the first only unless ``every``).

    ``forward``: how ``x`` was laid out for the export (:func:`~qdq.pipeline.inputs.bind_inputs`;
    needed for a dict whose keys leave out a parameter in between). The ONNX model's inputs are
    the tensors among the positional arguments, in order.
    """
    from qdq.backends.onnxruntime import run, session

    layout = forward if forward is not None else _layout(x)
    sess = session(path)
    parts = []
    total = -(-num_samples(x) // size)
    for b, real in progress(batches(x, size, static), total=total, desc=desc, enabled=show):
        arrays = run(sess, layout.tensors(b))
        parts.append(
            [torch.from_numpy(a[:real]).float() for a in (arrays if every else arrays[:1])]
        )
    return _stack(parts)


def _layout(x: Inputs) -> ForwardInputs:
    """A tensor or tuple in order; a dict in its own key order (no parameter left out)."""
    if isinstance(x, dict):
        return ForwardInputs("dict", tuple((k, None) for k in x))
    return ForwardInputs("tuple" if isinstance(x, tuple) else "tensor")


def metric_name(
    reference: torch.Tensor, labels: torch.Tensor | None, metric: ZooMetric | None = None
) -> str:
    """The headline metric's name: the task (or user) metric's, else ``top1_accuracy``, else the
    figure of the first output's kind (``top1_agreement``, ``pixel_agreement``,
    ``box_agreement``, ``cosine``); ``reference`` is FP32's first output."""
    if metric is not None:
        return metric.name
    if labels is not None:
        return "top1_accuracy"
    return output_kind(reference).figure


def headline(
    reference: torch.Tensor,
    labels: torch.Tensor | None,
    metric: ZooMetric | None = None,
    user: str | None = None,
) -> dict[str, Any]:
    """What the headline metric is (``report.json: headline``).

    Args:
        reference: FP32's first output.
        labels: the evaluation labels, if any.
        metric: the task metric (a user metric is bound as one).
        user: the user metric's spec, when ``metric`` is one.

    Returns:
        ``name`` (= ``metric_name``), ``source`` (``"user"``, ``"task"``, ``"labels"`` or
        ``"output"``), ``output`` (the index of the output it scores, ``None`` for a metric of
        every output), ``kind`` (that output's kind, or ``None``) and ``text`` (one line).
    """
    name = metric_name(reference, labels, metric)
    if metric is not None:
        source = "task" if user is None else "user"
        text = (
            f"{name}, the dataset's task metric (from every output and its ground truth)"
            if user is None
            else f"{name}, from the user metric {user} (every output and the labels)"
        )
        return {"name": name, "source": source, "output": None, "kind": None, "text": text}
    kind = output_kind(reference)
    shape = "x".join(str(d) for d in reference.shape[1:]) or "scalar"
    if labels is not None:
        text = f"top-1 accuracy of output 0 ({kind.name}, {shape}) against the labels"
        source = "labels"
    else:
        text = f"{name} of output 0 ({kind.name}, {shape}) with FP32"
        source = "output"
    return {"name": name, "source": source, "output": 0, "kind": kind.name, "text": text}


def check_labels(reference: torch.Tensor, labels: torch.Tensor, source: str) -> None:
    """Labels must fit a classifier's output: ``(N, C)`` logits and labels in ``0..C-1``."""
    if reference.dim() != 2:
        raise ValueError(
            f"{source} has labels, but the model's output has shape {tuple(reference.shape)}, "
            "not (N, classes): top-1 accuracy needs a classifier"
        )
    if int(labels.max()) >= reference.shape[1]:
        raise ValueError(
            f"{source} has labels up to {int(labels.max())}, but the model outputs "
            f"{reference.shape[1]} classes"
        )


def score(
    outs: Sequence[torch.Tensor],
    references: Sequence[torch.Tensor],
    labels: torch.Tensor | None,
    metric: ZooMetric | None = None,
    targets: object = None,
) -> dict[str, Any]:
    """The headline metric of ``outs`` (INT8 or FP32) and its agreement and cosine with
    ``references`` (FP32).

    Agreement and cosine are those of the first outputs. With a task ``metric``, ``metric`` is
    its figure and ``figures`` all of them (scored from every output and the ``targets``).
    """
    out, reference = outs[0], references[0]
    kind = output_kind(reference)
    cos = cosines(out, reference)
    result: dict[str, Any] = {
        "cosine_mean": float(cos.mean()),
        "cosine_min": float(cos.min()),
        "top1_agreement": None,
    }
    if kind.figure in ("top1_agreement", "pixel_agreement"):
        result["top1_agreement"] = float(
            (out.argmax(dim=1) == reference.argmax(dim=1)).float().mean()
        )
    if metric is not None:
        figures = metric.score(outs, references, targets)
        result["metric"] = float(figures[metric.name])
        result["figures"] = {k: float(v) for k, v in figures.items()}
    elif labels is not None:
        result["metric"] = float((out.argmax(dim=1) == labels).float().mean())
    elif kind.figure == "cosine":
        result["metric"] = result["cosine_mean"]
    elif kind.figure == "box_agreement":
        result["metric"] = compare(out, reference, kind)["value"]
    else:
        result["metric"] = result["top1_agreement"]
    return result
