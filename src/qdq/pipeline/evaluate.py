"""Model outputs in torch and ONNX Runtime, and the metrics ``qdq quantize`` reports.

The headline metric (``metric_name``; :func:`headline` describes it) is, first that applies:

* a user metric (:mod:`qdq.pipeline.metric`) or a built-in dataset's task metric
  (:class:`qdq.zoo.registry.ZooMetric`: CREPE's pitch accuracy, MTCNN's face accuracy, the text
  detector's F1): scored from every output tensor of the model (in ``torch.utils._pytree`` order,
  which is also the exported ONNX's output order) and the labels or the dataset's ground truth;
  its named figures are kept under ``figures``;
* with labels: ``top1_accuracy`` of the first output (arg-max over dimension 1 equals the label);
  with per-token labels ``(N, L)`` and ``(N, L, C)`` logits (token classification),
  ``token_accuracy``: the arg-max over the last dimension against every label but the ignored
  ``-100`` (Hugging Face's padding label);
* without labels, when an output is named as a pooled embedding (``pooler_output``,
  ``sentence_embedding``: :data:`qdq.pipeline.outputs.EMBEDDING_NAMES`): ``embedding_cosine``,
  the mean per-sample cosine of that output against FP32 (:func:`embedding_metric`, bound as a
  task metric so that ``--max-drop`` and ``--compare-methods`` score it too);
* without labels, when the first output's kind is given (``output_kind=``, checked against the
  output) or guessed as an ``image`` (:mod:`qdq.pipeline.kinds`: that needs the model's input),
  that kind's figure of output 0 (``psnr`` for an image), also bound as a task metric
  (:func:`output_metric`);
* otherwise the figure of the first output's kind (:mod:`qdq.pipeline.outputs`) against FP32:
  ``top1_agreement`` (a class vector), ``pixel_agreement`` (a class map), ``box_agreement`` (a
  YOLO-style detection head) or ``cosine`` (mean per-sample cosine); FP32's own is 1.0.

The FP32 evaluation outputs are also checked for degenerate values
(:mod:`qdq.pipeline.degenerate`: not finite, below float16's normal range, constant across the
samples): each problem is a warning and a row of ``fp32["degenerate"]``.

Every score also carries the per-sample cosine (mean and minimum) of the first output against
FP32, and its top-1 agreement when it is a class vector or map (else ``None``).
:func:`qdq.pipeline.outputs.output_table` compares every output.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from qdq._modes import eval_no_grad
from qdq._progress import progress
from qdq.pipeline.data import QuantData
from qdq.pipeline.degenerate import degenerate_outputs, warning
from qdq.pipeline.device import module_device, to_device
from qdq.pipeline.headline import (
    embedding_metric,
    headline,
    metric_name,
    output_kinds,
    output_metric,
)
from qdq.pipeline.inputs import ForwardInputs, Inputs, batches, call, num_samples
from qdq.pipeline.kinds import named_kind
from qdq.pipeline.outputs import compare, cosines, onnx_output_names, output_kind, output_table
from qdq.pipeline.stages import Stages
from qdq.zoo.registry import ZooMetric

__all__ = [
    "Measured",
    "batches",
    "embedding_metric",
    "headline",
    "measure",
    "metric_name",
    "ort_outputs",
    "output_metric",
    "output_tensors",
    "score",
    "torch_outputs",
]


#: the label of a token that is not scored (Hugging Face's padding and sub-word label)
IGNORE_LABEL = -100


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


def check_labels(reference: torch.Tensor, labels: torch.Tensor, source: str) -> None:
    """Labels must fit a classifier's output: ``(N, C)`` logits and labels in ``0..C-1``, or
    ``(N, L, C)`` token logits and ``(N, L)`` labels in ``0..C-1`` or ``-100`` (ignored)."""
    if labels.dim() == 2:
        if reference.dim() != 3 or reference.shape[1] != labels.shape[1]:
            raise ValueError(
                f"{source} has per-token labels (N, {labels.shape[1]}), but the model's output "
                f"has shape {tuple(reference.shape)}, not (N, {labels.shape[1]}, classes): token "
                "accuracy needs a token classifier"
            )
        kept = labels[labels != IGNORE_LABEL]
        if kept.numel() and int(kept.max()) >= reference.shape[2]:
            raise ValueError(
                f"{source} has labels up to {int(kept.max())}, but the model outputs "
                f"{reference.shape[2]} classes per token"
            )
        return
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
    if metric is not None and metric.kind is not None and metric.output == 0:
        kind = named_kind(metric.kind, reference) if metric.kind != kind.name else kind
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
    elif labels is not None and labels.dim() == 2:
        kept = labels != IGNORE_LABEL
        hits = (out.argmax(dim=-1) == labels) & kept
        result["metric"] = float(hits.sum()) / max(int(kept.sum()), 1)
    elif labels is not None:
        result["metric"] = float((out.argmax(dim=1) == labels).float().mean())
    elif kind.figure == "cosine":
        result["metric"] = result["cosine_mean"]
    elif kind.figure in ("box_agreement", "psnr"):
        result["metric"] = compare(out, reference, kind)["value"]
    else:
        result["metric"] = result["top1_agreement"]
    return result


@dataclass(frozen=True)
class Measured:
    """What the ``fp32_eval`` and ``int8_eval`` stages of ``qdq quantize`` measured.

    Attributes:
        reference: FP32's outputs (batch-major tensors; per-image detections in per-image mode,
            :mod:`qdq.pipeline.per_image`).
        fp32, int8, int8_torch: the scores of FP32, the exported INT8 (ONNX Runtime) and torch
            fake-quant (``report.json: fp32, int8, int8_torch``).
        outputs: every output against FP32 (``report.json: outputs``).
        headline: what the headline metric is (``report.json: headline``).
    """

    reference: list[Any]
    fp32: dict[str, Any]
    int8: dict[str, Any]
    int8_torch: dict[str, Any]
    outputs: list[dict[str, Any]]
    headline: dict[str, Any]


def measure(
    stages: Stages,
    prepared: nn.Module,
    float_model: nn.Module,
    qdata: QuantData,
    onnx_path: str | Path,
    *,
    size: int,
    static: bool,
    forward: ForwardInputs | None,
    user: str | None,
    names: Sequence[str] | None,
    show: bool,
    qat: tuple[dict[str, Any], nn.Module] | None,
    label: str = "INT8",
) -> Measured:
    """The ``fp32_eval`` and ``int8_eval`` stages on batch-major outputs: FP32 in torch, the
    export in ONNX Runtime, ``prepared`` in torch fake-quant (and QAT's PTQ model ``qat[1]``,
    whose metric goes to ``qat[0]``), each on ``qdata.evaluation`` in batches of ``size``;
    ``label`` names the quantized model in progress bars and the stage's line
    (:func:`qdq.pipeline.report.format_label`).
    FP32's outputs are kept whole when a task metric scores every one, else only the first."""
    every, task, targets = qdata.metric is not None, qdata.metric, qdata.targets
    with stages("fp32_eval") as st:
        ref = torch_outputs(
            float_model,
            qdata.evaluation,
            size,
            static=static,
            desc="FP32 (torch)",
            show=show,
            every=True,  # FP32 and the exported model: every output, for the table
        )
        fp32 = score(ref, ref, qdata.labels, task, targets)
        st.detail = f"{fp32['metric']:.4f} on {len(ref[0])} samples"
        kinds = output_kinds(ref, names, qdata.evaluation, task)
        top = headline(ref[0], qdata.labels, task, user, kinds[0])
        fp32["degenerate"] = _degenerate(ref, names, top)
        if fp32["degenerate"]:
            problems = ", ".join(f"{d['name']} {d['problem']}" for d in fp32["degenerate"])
            st.detail += f"; the FP32 outputs are DEGENERATE ({problems}): see the warnings"
    with stages("int8_eval") as st:
        ort = ort_outputs(
            onnx_path,
            qdata.evaluation,
            size,
            static=static,
            desc=f"{label} (ONNX Runtime)",
            show=show,
            every=True,
            forward=forward,
        )
        int8 = score(ort, ref, qdata.labels, task, targets)
        outputs = output_table(ort, ref, names, onnx_output_names(onnx_path, len(ref)),
                               top["output"], kinds)  # fmt: skip
        if not every:  # only the first output is scored from here on
            ref, ort = ref[:1], ort[:1]
        fq = torch_outputs(
            prepared,
            qdata.evaluation,
            size,
            static=static,
            desc=f"{label} (torch fake-quant)",
            show=show,
            every=every,
        )
        int8_torch = score(fq, ref, qdata.labels, task, targets)
        int8_torch["vs_onnxruntime"] = score(fq, ort, None)
        if qat is not None:  # the PTQ model QAT started from, for the comparison
            fq_ptq = torch_outputs(qat[1], qdata.evaluation, size, static=static,
                                   desc="PTQ before QAT (torch)", show=show, every=every)  # fmt: skip
            qat[0]["ptq_metric_torch"] = score(fq_ptq, ref, qdata.labels, task, targets)["metric"]
        st.detail = f"{label} {int8['metric']:.4f} (torch fake-quant {int8_torch['metric']:.4f})"
    return Measured(ref, fp32, int8, int8_torch, outputs, top)


def _degenerate(
    references: Sequence[torch.Tensor], names: Sequence[str] | None, top: dict[str, Any]
) -> list[dict[str, Any]]:
    """FP32's degenerate outputs (:mod:`qdq.pipeline.degenerate`) as ``fp32["degenerate"]``
    rows (``headline``: whether the headline scores that output), each also a warning."""
    rows = []
    for found in degenerate_outputs(references, names):
        scored = top["output"] is None or top["output"] == found.output
        warnings.warn(warning(found, scored, top["name"]), stacklevel=2)
        rows.append({**found.to_dict(), "headline": scored})
    return rows
