"""Model outputs in torch and ONNX Runtime, and the metrics ``qdq quantize`` reports.

Data from a built-in dataset with a task metric (:class:`qdq.zoo.registry.ZooMetric`: CREPE's pitch
accuracy, MTCNN's face accuracy, the text detector's F1) is scored by that metric, from every output
tensor of the model (in ``torch.utils._pytree`` order, which is also the exported ONNX's output
order) and the dataset's ground truth; its named figures are kept under ``figures``. Otherwise the
metric is computed on the model's first output tensor:

* with labels: ``top1_accuracy`` (arg-max over dimension 1 equals the label);
* without labels, outputs of shape ``(N, C, ...)`` with ``C >= 2``: ``top1_agreement`` with FP32
  (arg-max over dimension 1, per sample and position); the FP32 model agrees with itself (1.0);
* otherwise: ``cosine`` (mean per-sample cosine similarity with FP32; 1.0 for FP32).

Every score also carries the agreement and the per-sample cosine (mean and minimum) against FP32.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_flatten

from qdq._modes import eval_no_grad
from qdq._progress import progress
from qdq.pipeline.inputs import ForwardInputs, Inputs, batches, call, num_samples
from qdq.zoo.registry import ZooMetric

__all__ = ["batches", "metric_name", "ort_outputs", "output_tensors", "score", "torch_outputs"]


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
    with eval_no_grad(model):
        for b, real in progress(batches(x, size, static), total=total, desc=desc, enabled=show):
            tensors = output_tensors(call(model, b), desc)
            parts.append([t[:real].float() for t in (tensors if every else tensors[:1])])
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
    """The task metric's name, else ``top1_accuracy``, ``top1_agreement`` or ``cosine``."""
    if metric is not None:
        return metric.name
    if labels is not None:
        return "top1_accuracy"
    if reference.dim() >= 2 and reference.shape[1] >= 2:
        return "top1_agreement"
    return "cosine"


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
    """The metric of ``outs`` (INT8 or FP32) and its agreement and cosine with ``references``.

    Agreement and cosine are those of the first outputs. With a task ``metric``, ``metric`` is
    its figure and ``figures`` all of them (scored from every output and the ``targets``).
    """
    result = _generic(outs[0], references[0], labels)
    if metric is not None:
        figures = metric.score(outs, references, targets)
        result["metric"] = float(figures[metric.name])
        result["figures"] = {k: float(v) for k, v in figures.items()}
    return result


def _generic(
    out: torch.Tensor, reference: torch.Tensor, labels: torch.Tensor | None
) -> dict[str, Any]:
    if out.shape != reference.shape:
        raise ValueError(f"output shape {tuple(out.shape)} != FP32 {tuple(reference.shape)}")
    cos = F.cosine_similarity(out.flatten(1).double(), reference.flatten(1).double(), dim=1)
    result: dict[str, Any] = {
        "cosine_mean": float(cos.mean()),
        "cosine_min": float(cos.min()),
        "top1_agreement": None,
    }
    if out.dim() >= 2 and out.shape[1] >= 2:
        same = out.argmax(dim=1) == reference.argmax(dim=1)
        result["top1_agreement"] = float(same.float().mean())
    name = metric_name(reference, labels)
    if name == "top1_accuracy":
        assert labels is not None
        result["metric"] = float((out.argmax(dim=1) == labels).float().mean())
    elif name == "top1_agreement":
        result["metric"] = result["top1_agreement"]
    else:
        result["metric"] = result["cosine_mean"]
    return result
