"""``qdq.quantize``: a float model and its data → a verified, linted INT8 Q/DQ ONNX and a report.

Stages (each timed): load the model and the data → check one sample → capture + plan
(:func:`qdq.prepare`) → calibrate (one histogram collection, then the chosen method) → export
(:func:`qdq.export_onnx`) → FP32 metric in torch → INT8 metric in ONNX Runtime (every published
figure is measured through the export) and in torch fake-quant → optionally the metric of every
calibration method (torch fake-quant, amax recomputed from the same collection) → the per-layer error
on a few evaluation batches (:func:`qdq.debug.layer_errors`) → lint.

Output: ``OUT/model.qdq.onnx``, ``OUT/manifest.json`` (the manifest of ``model.qdq.onnx``, which it
names; :func:`qdq.export.find_manifest` finds it), ``OUT/report.json`` (:mod:`qdq.pipeline.report`)
and ``OUT/report.html`` (:mod:`qdq.report`), written in a staging folder inside ``OUT`` and
moved into place, the manifest last; other files in ``OUT`` are kept (:mod:`qdq.pipeline.outdir`).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from qdq.config import CALIBRATION_METHODS
from qdq.pipeline import speed
from qdq.pipeline.budget import Budget, check_budget
from qdq.pipeline.data import DataOptions, QuantData, resolve_data
from qdq.pipeline.degenerate import degenerate_outputs
from qdq.pipeline.device import float32_module, module_on, resolve_device, to_device
from qdq.pipeline.evaluate import check_labels, output_metric
from qdq.pipeline.extras import (
    LAYER_ERROR_SAMPLES,
)
from qdq.pipeline.fallback import fallback_search
from qdq.pipeline.finish import (
    HTML_FILE,
    MANIFEST_FILE,
    ONNX_FILE,
    REPORT_FILE,
    JobSettings,
    QuantizeResult,
    export_and_measure,
    written_by_rank0,
)
from qdq.pipeline.formats import int4_clip, plan_config
from qdq.pipeline.headline import kind_refused
from qdq.pipeline.improve import PtqOptions, QatOptions, run_qat
from qdq.pipeline.inputs import (
    batches,
    bind_inputs,
    num_samples,
    summary,
    take,
)
from qdq.pipeline.kinds import check_kind_name
from qdq.pipeline.metric import MetricFn, load_metric
from qdq.pipeline.models import resolve_model
from qdq.pipeline.options import (
    block_form,
    check_format_target,
    check_method,
    check_options,
    default_target,
)
from qdq.pipeline.outdir import check_out_dir
from qdq.pipeline.outputs import output_names, recorded_output
from qdq.pipeline.per_image import per_image_keys, refuse_options
from qdq.pipeline.recipe import SearchOptions, calibrate_and_improve
from qdq.pipeline.sample import check_batch_major, check_sample
from qdq.pipeline.stages import StageCallback, Stages
from qdq.ptq.search import record_recipe
from qdq.qat import distributed as dist

__all__ = [
    "HTML_FILE",
    "MANIFEST_FILE",
    "ONNX_FILE",
    "OPTIONAL_STAGES",
    "REPORT_FILE",
    "QuantizeResult",
    "quantize",
]

_log = logging.getLogger(__name__)

#: calibration images the export of a per-image model is checked on (:mod:`qdq.pipeline.per_image`)
VERIFY_IMAGES = 1

#: stages that cannot fail the job (what comes after the INT8 measurement): an error there is
#: recorded in ``report.json`` ``stage_errors`` and the page, and everything is still written. The
#: page's own parts (model drawing, engine views, plots) are guarded the same way
#: (:func:`qdq.report.write_html`).
OPTIONAL_STAGES = ("layer_errors", "compare_methods", "lint", "latency", "speed")


def quantize(
    model: str | nn.Module,
    data: object = None,
    *,
    out: str | Path,
    calib: str | None = None,
    percentile: float | None = None,
    exporter: str = "auto",
    opset: int | None = None,
    target: str | None = None,
    data_options: DataOptions | None = None,
    batch_size: int = 32,
    compare_methods: bool = False,
    max_drop: float | None = None,
    ptq: PtqOptions | SearchOptions | str | None = None,
    qat: QatOptions | None = None,
    overwrite: bool = False,
    show_progress: bool = True,
    on_stage: StageCallback | None = None,
    engine_report: str | Path | None = None,
    engine_profile: str | Path | None = None,
    metric: str | MetricFn | None = None,
    device: str | torch.device | None = None,
    output_kind: str | None = None,
    time_budget: float | None = None,
    format: str = "int8",
    trust_model: bool = False,
    objective: str = "accuracy",
) -> QuantizeResult:
    """Quantize ``model`` on ``data``; write ``out/{model.qdq.onnx, manifest.json, report.json,
    report.html}``.

    The user's model is never modified (:func:`qdq.prepare` works on a copy; evaluation restores
    its train/eval mode).

    Args:
        model: an ``nn.Module`` or a model spec (:mod:`qdq.pipeline.models`: a zoo name,
            ``pkg.module:factory``, ``file.py:factory`` — this executes that code —, ``.pt2``,
            ``.onnx``).
        data: a :class:`QuantData` (its samples one tensor, or a dict of keyword or a tuple of
            positional input tensors: :mod:`qdq.pipeline.inputs`), a data spec
            (:mod:`qdq.pipeline.data`), in-memory data (:mod:`qdq.pipeline.memory`: a tensor or
            array of samples, a dict of them, or a list / ``DataLoader`` of batches: tensors,
            dicts such as a tokenizer's output, ``(inputs, labels)`` pairs), or ``None`` for a
            zoo model's own data. Spec and in-memory data are split into calibration and
            evaluation samples by a seeded permutation.
        out: the output directory (created; see ``overwrite``).
        calib: ``"mse"``, ``"entropy"``, ``"percentile"`` or ``"max"`` for every quantizer;
            ``None`` (default): mse, and in an FP8 plan max for its FP8 quantizers (TensorRT's
            FP8 recipes) and mse for its INT8 ones. Entropy has no FP8 meaning (refused there).
        percentile: for ``calib="percentile"`` (default 99.99).
        exporter: ``"auto"`` (dynamo, else TorchScript), ``"dynamo"`` or ``"torchscript"``.
        opset: ONNX opset, 13..21; default 17, or 19 with FP8 quantizers (the first opset with
            FP8 Q/DQ; a lower one is refused).
        target: TensorRT version for the linter (``"trt8.6"``, ``"trt10"``, ``"trt11"`` ...);
            default ``"trt10"``, or ``"trt10.12-blackwell"`` for ``nvfp4``/``mxfp8`` (their
            kernels need Blackwell and TensorRT 10.8/10.12: a target without them is refused).
            MXFP8 is exported in TensorRT's form (``TRT_MXFP8DequantizeLinear`` of UINT8
            exponents, opset 19) where the target's parser cannot read opset 24 (TensorRT
            10.12..10.x), in ONNX's (``FLOAT8E8M0`` scales, opset 24) on TensorRT 11+
            (:func:`qdq.pipeline.options.block_form`; ``settings.block_form`` records it).
        data_options: sample counts, image preprocessing and the split seed (for spec data).
        batch_size: samples per batch for calibration and evaluation (a ``.pt2`` with a static
            batch dimension uses its own).
        compare_methods: also measure every calibration method in torch fake-quant.
        max_drop: keep in float the fewest units (scale groups) that bring the metric's drop
            from FP32 within this budget (metric units: 0.01 is one point of accuracy), chosen
            on the evaluation data in torch fake-quant (:func:`qdq.auto_quantize`); ``None``:
            everything planned stays INT8.
        ptq: the PTQ recipe. ``None`` (default) or a :class:`~qdq.pipeline.SearchOptions`: the
            recipe search holds out a quarter of the calibration samples (a seeded draw), calibrates on
            the rest and keeps the recipe that scores best on them (:mod:`qdq.pipeline.recipe`);
            a recipe name (``"kernel-sum+bias"``, ``"none"``) or a
            :class:`~qdq.pipeline.PtqOptions`: that recipe on every calibration sample, no search. The
            recipe's steps are also applied to every model the fallback search re-plans.
        qat: quantization-aware fine-tuning after PTQ and fallback
            (:class:`~qdq.pipeline.improve.QatOptions`: distillation against the FP32 copy on the
            calibration batches); the exported model is the fine-tuned one.
        overwrite: replace an existing non-empty ``out``.
        show_progress: progress bars.
        on_stage: called after every stage with its name, seconds and a one-line detail.
        engine_report: trtexec ``--exportLayerInfo`` JSON of an engine built from this model's
            export (an earlier run's): ``report.html`` draws it beside the prediction, the layers
            where they disagree marked (read before anything runs).
        engine_profile: its ``--exportProfile`` JSON, for each layer's share of the latency.
        metric: your headline metric, ``fn(outputs, labels)`` → a number or a dict of them (the
            first key is the headline), or its spec ``file.py:fn`` / ``pkg.module:fn`` (this
            executes that code); :mod:`qdq.pipeline.metric`. ``max_drop`` scores with it.
        device: where the model runs for capture, calibration, PTQ, fallback, QAT and the torch
            evaluations (FP32, fake-quant): ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``None`` (CUDA
            when available, else the CPU; :mod:`qdq.pipeline.device`). A model elsewhere is
            copied there (yours is not moved); export and ONNX Runtime run on the CPU.
            ``report.json["settings"]["device"]`` records it.
        output_kind: the kind of the first output instead of the guess (``"image"``,
            ``"class_map"``, ...: :data:`qdq.pipeline.kinds.KINDS`); its figure is the headline.
            Not with labels, a metric or per-image detection lists (they decide the headline).
        time_budget: seconds for the job from capture to the written report
            (:mod:`qdq.pipeline.budget`); ``None``: the default, set after calibration from
            the estimated cost of the stages every job runs. The recipe search, the refit,
            ``compare_methods`` and the per-layer errors fit in it; ``report.json["budget"]``
            says what was planned, spent and left out.
        format: ``"int8"`` (default), ``"fp8"`` (FP8 E4M3 where TensorRT has an FP8 kernel for
            the layer, INT8 where it has none), ``"nvfp4"`` / ``"mxfp8"`` (GEMMs in the block
            format, weights and activations; convolutions and attention as in ``fp8``),
            ``"int4w"`` (GEMMs with INT4 block-wise weights and float activations, the rest
            float; rules F11 on in docs/placement.md) or ``"mixed"`` (each layer the format TensorRT runs
            fastest: convolutions INT8, GEMMs and attention FP8, a convolution moved to FP8 where
            INT8's quantization noise is measurably worse: stage ``formats``,
            :mod:`qdq.pipeline.formats`); ``QuantConfig.format``, rules F01-F09 in
            docs/placement.md. The report counts the quantizers of each format
            (``settings.format``) and, for mixed, what was measured (``settings.format_choice``).
        trust_model: load a ``.pt2`` model spec as ``torch.export.load`` does, unchecked (it may
            run code the file holds); by default an archive that would run code is refused
            (:mod:`qdq.pipeline.model_files`). Only for a file whose sender you trust.
        objective: ``"accuracy"`` (default) or ``"speed"``: also keep in FP16 the layers not worth
            quantizing on the target's GPU (rule T01, before ``max_drop``; :mod:`.speed`).

    Returns:
        The :class:`QuantizeResult`.

    Raises:
        ValueError / FileNotFoundError / TypeError: bad specs, files, options or a model that
            fails on the data (the message names the culprit and, for shapes, both shapes).
        ImportError: jinja2 or matplotlib (the ``report`` extra) is missing (checked first).
        FileExistsError: ``out`` exists, is not empty, and ``overwrite`` is false.
        qdq.export.ExportError: the export fails validation or verification.

    Example:
        >>> res = quantize("fashion-mnist-resnet", out="demo-out", overwrite=True)  # doctest: +SKIP
        >>> res.metric_name, round(res.fp32_metric, 3), round(res.int8_metric, 3)  # doctest: +SKIP
        ('top1_accuracy', 0.921, 0.92)
    """
    ptq = check_options(batch_size, max_drop, ptq)
    user = load_metric(metric)  # a bad metric spec fails before anything runs
    given_budget = check_budget(time_budget)
    if output_kind is not None:
        check_kind_name(output_kind)  # nor an unknown output kind
    calib = check_method(calib, format)
    if target is None:
        target = default_target(format)
    # a bad target fails now, not after the export, and so does FP8 for a GPU without it
    lint_flags = check_format_target(format, target)
    speed.check_objective(objective, target)  # nor --objective speed without a GPU to predict on
    dev = resolve_device(device)  # nor a device that is not there
    from qdq.report import check_dependencies

    check_dependencies()  # nor a missing package of the HTML report
    engine = None
    if engine_report is not None:
        from qdq.lint import load_engine_report

        engine = load_engine_report(engine_report, engine_profile)  # nor a bad engine report
    elif engine_profile is not None:
        raise ValueError("engine_profile needs engine_report (the --exportLayerInfo JSON)")
    out_dir = Path(out)
    check_out_dir(out_dir, overwrite)
    stages = Stages(on_stage)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with stages("load_model") as st:
            source = resolve_model(model, trust_model=trust_model)
            source = replace(
                source, module=float32_module(module_on(source.module, dev), source.spec)
            )
            st.detail = (
                f"{source.kind} {source.spec} ({_params(source.module) / 1e6:.2f}M params) on {dev}"
            )
        with stages("load_data") as st:
            qdata = (
                data
                if isinstance(data, QuantData)
                else resolve_data(data, source.zoo, data_options, model=source.module)
            )
            st.detail = qdata.split
        static = source.static_batch is not None
        size = source.static_batch or batch_size
        with stages("check") as st:
            inputs = bind_inputs(source.module, qdata.calibration)  # how they meet forward
            cal = qdata.calibration
            # one sample; a static-batch model gets one (padded) batch of its size
            sample = next(batches(cal, size, static))[0] if static else take(cal, slice(0, 1))
            # prepare's and the export's example inputs (the export copies them to the CPU)
            example = to_device(inputs.positional(sample), dev)
            with recorded_output(source.module) as seen:
                sample_outs = [t.cpu() for t in check_sample(source, to_device(sample, dev), qdata)]
            names = tuple(output_names(seen.value))
            keys = per_image_keys(seen.value, num_samples(sample))  # detection lists after NMS
            if keys is None:
                check_batch_major(sample_outs, num_samples(sample), names, source.spec)
            else:  # per-image mode: batch 1 from here on (calibration, evaluation, export)
                refuse_options(source.spec, metric=user is not None or qdata.metric is not None,
                               max_drop=max_drop is not None, qat=qat is not None and qat.active)  # fmt: skip
                size, static, sample_outs = 1, True, sample_outs[: len(keys)]
                if qdata.labels is not None:
                    warnings.warn("per-image detection lists: the labels are not used (the "
                                  "headline compares with FP32)", stacklevel=1)  # fmt: skip
            sample_out = sample_outs[0]
            if user is not None:  # the user metric, checked on this sample, scores everything
                qdata = user.bind(qdata, sample_outs)
            elif qdata.labels is not None and keys is None:
                check_labels(sample_out, qdata.labels, qdata.source)
            elif qdata.metric is None and keys is None:  # output_kind, an embedding, an image
                bound = output_metric(names, sample_outs, sample, output_kind)
                if bound is not None:
                    qdata = replace(qdata, metric=bound)
            if output_kind is not None and (qdata.metric is None or qdata.metric.kind is None):
                raise ValueError(kind_refused(output_kind, qdata, user is not None, keys))
            if qdata.metric is not None:
                try:
                    qdata.metric.check(sample_outs)
                except ValueError as err:
                    raise ValueError(f"the model {source.spec} on {qdata.source}: {err}") from None
            st.detail = f"{summary(sample)} → output {tuple(sample_out.shape[1:])}"
            if keys is not None:
                st.detail = (f"{summary(sample)} → per-image detection lists ({', '.join(keys)}): "
                             "batch 1 for calibration, evaluation and export")  # fmt: skip
        # FP32 outputs that underflow or are not finite on the first sample: no recipe can be
        # chosen against them (the FP32 evaluation reports every problem, :mod:`.degenerate`)
        early = [] if keys is not None else [
            d for d in degenerate_outputs(sample_outs, names) if d.problem != "constant"]  # fmt: skip
        no_search = (
            ""
            if not early
            else (
                "not run: the FP32 outputs are degenerate on the first sample ("
                + "; ".join(f"{d.name} {d.problem}: {d.detail}" for d in early)
                + "), so no recipe can be chosen against them"
            )
        )
        n_eval = num_samples(qdata.evaluation)
        budget = Budget(given_budget, eval_samples=n_eval, calib_samples=num_samples(cal),
                        layer_error_samples=1 if keys else min(LAYER_ERROR_SAMPLES, n_eval),
                        methods=len(CALIBRATION_METHODS) if compare_methods else 0,
                        speed_stage=objective == "speed")  # fmt: skip
        config, chosen = plan_config(stages, source.module, example, cal, inputs, size=size,
                                     static=static, device=dev, fmt=format, exporter=exporter,
                                     target=target, objective=objective)  # fmt: skip
        done = calibrate_and_improve(stages, source.module, cal, inputs, example, size=size,
                                     static=static, device=dev, calib=calib,
                                     percentile=percentile, ptq=ptq, per_image=keys,
                                     show_progress=show_progress, budget=budget,
                                     no_search=no_search, config=config)  # fmt: skip
        prepared, config, fast = speed.keep_fp16(objective, stages, done, example, config, calib,
                                                 percentile, exporter, opset, target, size,
                                                 static)  # fmt: skip
        float_model, calib_batches = done.float_model, done.batches
        improve = done.improve
        if not (isinstance(ptq, PtqOptions) and not ptq.active):  # --recipe none: no PTQ step
            clip, clipped = int4_clip(stages, prepared, calib_batches, show_progress)
            if clip is not None:  # the fallback's re-plans clip their INT4 weights too
                improve = _then(improve, clip)
                before = (done.ptq or {}).get("steps", "none")
                steps = "AWQ clip (INT4 weights)" + ("" if before == "none" else f" after {before}")
                done = replace(done, ptq={**(done.ptq or {}), "steps": steps, "awq_clip": clipped})
        fallback = None
        if max_drop is not None:
            with stages("fallback") as st:
                fallback = fallback_search(source, float_model, qdata, example, prepared, calib_batches,
                                     max_drop, calib, percentile, exporter, target, size, static,
                                     show_progress,
                                     improve, config)  # fmt: skip
                prepared = fallback.model
                st.detail = (
                    f"{len(fallback.fallback)} op(s) kept in float, metric "
                    f"{fallback.full_int8_metric:.4f} → {fallback.int8_metric:.4f} (FP32 "
                    f"{fallback.fp32_metric:.4f}, budget {max_drop:g}"
                    f"{'' if fallback.within_budget else ', NOT met'})"
                )
        qat_run = None
        if qat is not None and qat.active:
            with stages("qat") as st:
                trained, qat_report = run_qat(prepared, calib_batches, example, qat, show_progress)
                qat_run, prepared = (qat_report, prepared), trained
                st.detail = qat_report["summary"]
        if fast is not None:  # the fallback's re-plan recorded the exclusions as USER
            fast.mark(prepared)
        if chosen is not None:  # formats the predicted time decided: rule T02, not USER
            chosen.mark(prepared)
        record_recipe(prepared, done.options.recipe, "search" if done.searched else "given")
        if not dist.is_main_process():  # torchrun: rank 0 exports, measures and writes
            return written_by_rank0(out_dir, prepared)
        try:
            result = export_and_measure(
                prepared,
                source,
                qdata,
                example,
                stages,
                out_dir,
                overwrite,
                JobSettings(
                    calib,
                    percentile,
                    exporter,
                    opset,
                    target,
                    size,
                    compare_methods,
                    show_progress,
                    static,
                    engine,
                    inputs,
                    None if user is None else user.spec,
                    names if len(names) == len(sample_outs) else None,
                    str(dev),
                    keys,
                    None if chosen is None else chosen.to_dict(),
                    lint_flags,
                    speed.objective_entry(objective, fast),
                    block_form(format, target),
                ),
                caught,
                fallback,
                done.ptq,
                qat_run,
                take(cal, slice(0, VERIFY_IMAGES)) if keys is not None else None,
                budget,
            )
        finally:
            dist.barrier()  # the other ranks wait for the files (nothing in one process)
    return result


def _params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _then(
    first: Callable[[nn.Module], Any] | None, second: Callable[[nn.Module], Any]
) -> Callable[[nn.Module], None]:
    """``first`` (when there is one), then ``second``, on a prepared model."""

    def both(model: nn.Module) -> None:
        if first is not None:
            first(model)
        second(model)

    return both
