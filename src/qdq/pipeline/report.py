"""``report.json`` of ``qdq quantize``: everything an HTML report needs, as plain data.

Stable keys (issue 11): ``metric_name``, ``fp32_metric``, ``int8_metric`` (the headline metric,
:mod:`qdq.pipeline.evaluate`; INT8 is the exported ONNX in ONNX Runtime), ``lint`` (the lint
summary: ``weighted_layers``, ``int8_weighted_layers``, ...), ``skipped_layers`` (every
Conv/ConvTranspose/Linear left in float: ``name``, ``type``, ``rule``, ``reason``), ``timings_s``
(seconds per stage). Also: ``schema``, ``qdq_version``, ``model``, ``data``, ``settings``,
``export``, ``fp32``/``int8``/``int8_torch`` (the headline ``metric``; the first output's
``top1_agreement`` — ``null`` unless it is a class vector or map — and per-sample
``cosine_mean``/``cosine_min`` vs FP32; a task or user metric's named ``figures``; ``fp32`` also
``degenerate``: every problem of FP32's own outputs — ``output``, ``name``, ``problem``
(``non_finite``, ``underflow``, ``constant``), ``detail``, ``headline`` —, each also a warning
that the INT8 figures mean nothing, :mod:`qdq.pipeline.degenerate`; ``[]`` when none),
``calibration_methods`` (per method, torch fake-quant; ``null`` unless asked), ``layers`` (every
weighted layer: status, rule, reason), ``quantizers`` (each quantizer's rule, scale group,
calibration method and amax, per-channel weights as min/max; ``below_floor`` when it saw only
values at or below 2**-24, where every method gives the observed max), ``lint_verdict``,
``lint_findings``, ``predicted_layers`` (the linter's engine prediction), ``plan`` (every Q/DQ
decision, :meth:`qdq.graph.plan.QuantPlan.to_dict`), ``layer_errors`` (the per-layer error,
:meth:`qdq.debug.LayerErrors.to_dict`; ``null`` when not measured), ``fallback`` (what
``--max-drop`` kept in float and why, :meth:`qdq.accuracy.AutoQuantResult.to_dict`; ``null``
without it), ``ptq`` (the PTQ switches that ran — ``steps``, and as a recipe name ``recipe``, which
``--recipe`` replays — and each one's report:
``equalize``, ``method_per_quantizer``, ``kernel_sum``, ``adaround``, ``bias_correction``; ``null``
when none ran), ``qat`` (``--qat-epochs``: steps, losses, seconds, the PTQ metric it started from,
and what :func:`qdq.qat.prepare` did; ``null`` without it), ``warnings``, ``stage_errors`` (every
stage after the INT8 measurement that failed — per-layer error, method comparison, lint, the page's
drawing, plots and engine views —: ``stage``, ``error`` (the exception type), ``message``; the job
still wrote everything, and what that stage would have written is ``null``: ``lint``,
``lint_verdict`` ``"not run"``, ``layer_errors``, ...), ``files`` (names inside OUT),
``latency`` (the predicted engine time against FP16 on the target's GPU,
:mod:`qdq.pipeline.speed`; ``null`` with ``latency_reason`` when the target names no GPU or the
stage failed) and ``objective`` (``name``; for ``speed`` the modules kept in FP16, rule ``T01``).

``data.inputs``: the name, per-sample shape and dtype of every model input (``data.input_shape`` and
``data.input_dtype``: the first one's).

What the headline is, and every output (issue 31):

* ``headline``: ``name`` (= ``metric_name``), ``source`` (``"user"``: ``--metric``;
  ``"task"``: the dataset's task metric; ``"labels"``: top-1 accuracy of the first output;
  ``"output"``: the first output's figure against FP32), ``output`` (the index of the output it
  scores; ``null`` for a metric of every output), ``kind`` (that output's kind) and ``text`` (one
  line for people).
* ``outputs``: one row per output tensor, in pytree order (= the ONNX's output order), the
  exported INT8 in ONNX Runtime against FP32 (:func:`qdq.pipeline.outputs.output_table`):
  ``index``; ``name`` (its pytree path, e.g. ``output[1]['boxes']``); ``onnx_name``; ``shape`` (of
  one sample); ``kind`` (``class_vector``, ``class_map``, ``detections``, ``embedding``,
  ``image`` or ``tensor``, guessed from FP32's tensor and the model's input, or given by
  ``output_kind=``: :mod:`qdq.pipeline.kinds`); ``kind_reason`` (the kind, the shape and why:
  ``"image: (N, 3, 64, 64), the input's 3 channels at its size"``); ``figure`` (the kind's
  figure: ``top1_agreement``, ``pixel_agreement``, ``box_agreement``, ``psnr`` in dB, or
  ``cosine``) and ``value`` (also under the figure's own name); ``cosine_mean``, ``cosine_min``
  (per sample);
  ``relative_error`` (``||int8 - fp32|| / ||fp32||`` over the tensor; ``null`` when FP32 is all
  zeros and INT8 is not); ``headline`` (whether the headline scores this output: its figure, or
  top-1 accuracy against the labels); detections add ``top_k``, ``topk_overlap`` and ``layout``,
  an image ``psnr_min``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from qdq._io import onnx_input_names
from qdq._version import __version__
from qdq.pipeline.inputs import describe, num_samples

__all__ = [
    "LINT_NOT_RUN",
    "SCHEMA",
    "STABLE_KEYS",
    "STAGE_LABELS",
    "build_report",
    "format_label",
    "stage_error",
]

SCHEMA = "qdq.quantize-report/1"
STABLE_KEYS = ("metric_name", "fp32_metric", "int8_metric", "lint", "skipped_layers", "timings_s")
#: human names of the stages in ``timings_s``
STAGE_LABELS = {
    "load_model": "load model",
    "load_data": "load data",
    "check": "check one sample",
    "equalize": "cross-layer equalization",
    "capture_plan": "capture + plan",
    "calibrate": "calibrate",
    "budget": "time budget",
    "recipe_search": "recipe search",
    "refit": "refit, all samples",
    "export": "export",
    "fp32_eval": "FP32 (torch)",
    "int8_eval": "Q/DQ (ONNX Runtime)",
    "layer_errors": "per-layer error",
    "compare_methods": "every method",
    "fallback": "fallback search",
    "ptq": "PTQ improvements",
    "qat": "QAT fine-tuning",
    "lint": "lint",
    "latency": "engine time",
    "speed": "speed objective",
}
_FORMAT_NAMES = {"int8": "INT8", "fp8": "FP8", "nvfp4": "NVFP4", "mxfp8": "MXFP8", "int4": "INT4w"}


def format_label(formats: Mapping[str, int] | None) -> str:
    """The quantized model's name in messages: its formats by quantizer count (``settings.format``
    of ``report.json``), most first; ``"INT8"`` when none is known (``report.json`` keeps the
    quantized model's figures under ``int8`` whatever its format).

    Example:
        >>> format_label({"int8": 40}), format_label({"fp8": 12, "nvfp4": 32}), format_label(None)
        ('INT8', 'NVFP4+FP8', 'INT8')
    """
    ranked = sorted((formats or {}).items(), key=lambda kv: (-kv[1], kv[0]))
    return "+".join(_FORMAT_NAMES.get(f, f.upper()) for f, n in ranked if n > 0) or "INT8"


#: ``lint_verdict`` when the lint stage failed (see ``stage_errors``)
LINT_NOT_RUN = "not run"


def stage_error(stage: str, err: BaseException) -> dict[str, str]:
    """``{"stage", "error", "message"}`` of a failed optional stage, as ``report.json`` keeps it."""
    message = " ".join(str(err).split()) or type(err).__name__
    return {"stage": stage, "error": type(err).__name__, "message": message[:2000]}


def build_report(
    *,
    metric: str,
    headline: dict[str, Any] | None = None,
    outputs: list[dict[str, Any]] | None = None,
    source: Any,
    data: Any,
    prepared: nn.Module,
    exported: Any,
    lint: Any,
    fp32: dict[str, Any],
    int8: dict[str, Any],
    int8_torch: dict[str, Any],
    methods: dict[str, dict[str, Any]] | None,
    layer_errors: dict[str, Any] | None,
    settings: dict[str, Any],
    fallback: dict[str, Any] | None = None,
    ptq: dict[str, Any] | None = None,
    qat: dict[str, Any] | None = None,
    timings: dict[str, float],
    warnings: list[str],
    files: dict[str, str],
    stage_errors: list[dict[str, str]] | None = None,
    per_image: bool = False,
) -> dict[str, Any]:
    """The report as a JSON-serialisable dict (see the module docstring for the keys)."""
    from qdq.api import plan_of, quantizers_of

    plan = plan_of(prepared)
    model = source.module
    zoo = source.zoo
    inputs = describe(data.evaluation)
    lint_dict = (
        lint.to_dict()
        if lint is not None
        else {"target": settings.get("target"), "findings": [], "layers": []}
    )
    layers = [
        {"name": c.module, "type": c.type, "status": c.status, "rule": c.rule, "reason": c.reason}
        for c in plan.coverage
    ]
    return {
        "schema": SCHEMA,
        "qdq_version": __version__,
        "metric_name": metric,
        "fp32_metric": fp32["metric"],
        "int8_metric": int8["metric"],
        "lint": None if lint is None else lint.summary,
        "skipped_layers": [layer for layer in layers if layer["status"] != "int8"],
        "timings_s": dict(timings),
        "total_s": round(sum(timings.values()), 3),
        "model": {
            "spec": source.spec,
            "kind": source.kind,
            "class": type(model).__name__,
            "parameters": sum(p.numel() for p in model.parameters()),
            "zoo": None
            if zoo is None
            else {
                "name": zoo.name,
                "description": zoo.description,
                "task": zoo.task,
                "metric": zoo.metric,
            },
            "static_batch": source.static_batch,
        },
        "data": {
            "source": data.source,
            "split": data.split,
            "input_shape": inputs[0]["shape"],  # the first input's (the only one's)
            "input_dtype": inputs[0]["dtype"],
            "inputs": inputs,
            "calibration_samples": num_samples(data.calibration),
            "evaluation_samples": num_samples(data.evaluation),
            "labelled": data.labels is not None,
        },
        "settings": settings,
        "per_image": per_image,
        "export": {
            "exporter": exported.exporter,
            "opset": exported.opset,
            "num_quantize": exported.num_quantize,
            "num_dequantize": exported.num_dequantize,
            "floored_channels": exported.floored,
            "verified_in_onnxruntime": True,
            # dynamic besides the batch: {ONNX input name: {dimension: name}} (token sequences)
            "dynamic_dims": {
                onnx_input_names(len(inputs))[i]: {str(d): n for d, n in dims.items()}
                for i, dims in getattr(exported, "dynamic_dims", {}).items()
            },
        },
        "headline": headline,
        "outputs": outputs,
        "fp32": fp32,
        "int8": int8,
        "int8_torch": int8_torch,
        "calibration_methods": methods,
        "layers": layers,
        "quantizers": [_quantizer(path, q, plan) for path, q in quantizers_of(prepared).items()],
        "lint_target": lint_dict["target"],
        "lint_verdict": LINT_NOT_RUN if lint is None else lint.verdict,
        "lint_findings": lint_dict["findings"],
        "predicted_layers": lint_dict["layers"],
        "plan": plan.to_dict(),
        "layer_errors": layer_errors,
        "fallback": fallback,
        "ptq": ptq,
        "qat": qat,
        "warnings": sorted(set(warnings)),
        "stage_errors": list(stage_errors or []),
        "files": files,
    }


def _quantizer(path: str, q: Any, plan: Any) -> dict[str, Any]:
    group = next((g for g in plan.groups if g.quantizer == path), None)
    amax = q.amax.detach().float().flatten() if q.is_calibrated else None
    entry: dict[str, Any] = {
        "path": path,
        "name": q.name,
        "kind": "weight" if q.name.endswith(":weight") else "input",
        "group": None if group is None else group.id,
        "members": [] if group is None else list(group.members),
        "rule": None if group is None else plan.point(group.leader).rule,
        "method": q.amax_method or q.calib.method,
        "format": q.spec.format,
        # a block format's elements per scale along the blocked axis (None: INT8, FP8, per channel)
        "block_size": q.spec.block_size,
        "per_channel": q.spec.axis is not None and not q.spec.is_block,
        # every value at or below 2**-24: any method gives the observed max (floored at use)
        "below_floor": bool(getattr(q.calibrator, "below_floor", False)),
    }
    if amax is None:
        entry["amax"] = None
    elif q.spec.axis is None or (amax.numel() == 1 and q.spec.is_block):
        entry["amax"] = float(amax[0])
    else:
        entry["amax"] = {
            "channels": int(amax.numel()),
            "min": float(amax.min()),
            "max": float(amax.max()),
        }
    return entry
