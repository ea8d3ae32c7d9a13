"""Model outputs in torch and ONNX Runtime, and the metrics ``qdq quantize`` reports.

The metric is the model's first output tensor (in ``torch.utils._pytree`` order, which is also the
exported ONNX's output order):

* with labels: ``top1_accuracy`` (arg-max over dimension 1 equals the label);
* without labels, outputs of shape ``(N, C, ...)`` with ``C >= 2``: ``top1_agreement`` with FP32
  (arg-max over dimension 1, per sample and position); the FP32 model agrees with itself (1.0);
* otherwise: ``cosine`` (mean per-sample cosine similarity with FP32; 1.0 for FP32).

Every score also carries the agreement and the per-sample cosine (mean and minimum) against FP32.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_flatten

from qdq._progress import progress

__all__ = ["batches", "metric_name", "ort_outputs", "score", "torch_outputs"]


def batches(x: torch.Tensor, size: int, static: bool = False) -> Iterator[tuple[torch.Tensor, int]]:
    """``(batch, real)``: chunks of ``x``; with ``static`` the last one is padded to ``size`` by
    repeating its last sample, and ``real`` says how many leading rows are real."""
    for start in range(0, len(x), size):
        chunk = x[start : start + size]
        real = len(chunk)
        if static and real < size:
            chunk = torch.cat([chunk, chunk[-1:].expand(size - real, *chunk.shape[1:])])
        yield chunk, real


def first_tensor(output: Any, what: str) -> torch.Tensor:
    """The first tensor of a model output (tensor, tuple, list or dict)."""
    leaves, _ = tree_flatten(output)
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            return leaf
    raise ValueError(f"{what} returned no tensor (got {type(output).__name__})")


@contextlib.contextmanager
def _eval_no_grad(model: nn.Module) -> Iterator[None]:
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def torch_outputs(
    model: nn.Module, x: torch.Tensor, size: int, *, static: bool, desc: str, show: bool
) -> torch.Tensor:
    """The first output of ``model`` on every sample of ``x`` (eval mode, no grad)."""
    outs = []
    total = -(-len(x) // size)
    with _eval_no_grad(model):
        for b, real in progress(batches(x, size, static), total=total, desc=desc, enabled=show):
            outs.append(first_tensor(model(b), desc)[:real].float())
    return torch.cat(outs)


def ort_outputs(
    path: str | Path, x: torch.Tensor, size: int, *, static: bool, desc: str, show: bool
) -> torch.Tensor:
    """The first output of the ONNX model in ONNX Runtime (CPU, ``ORT_ENABLE_BASIC``)."""
    from qdq.backends.onnxruntime import run, session

    sess = session(path)
    outs = []
    total = -(-len(x) // size)
    for b, real in progress(batches(x, size, static), total=total, desc=desc, enabled=show):
        outs.append(torch.from_numpy(run(sess, [b])[0][:real]).float())
    return torch.cat(outs)


def metric_name(reference: torch.Tensor, labels: torch.Tensor | None) -> str:
    """``top1_accuracy``, ``top1_agreement`` or ``cosine`` (see the module docstring)."""
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
    out: torch.Tensor, reference: torch.Tensor, labels: torch.Tensor | None
) -> dict[str, Any]:
    """The metric of ``out`` (INT8 or FP32) and its agreement and cosine with ``reference``."""
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
