"""The main job's last stages: export the calibrated model into OUT's staging folder, measure it
(every published figure through the export), lint it, predict its engine time, and write
``report.json`` and ``report.html`` (:func:`export_and_measure`); under ``torchrun`` the other
ranks take rank 0's files (:func:`written_by_rank0`).
"""

from __future__ import annotations

import json
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from qdq.lint.engine_report import EngineReport
from qdq.pipeline import per_image, speed
from qdq.pipeline.budget import Budget
from qdq.pipeline.data import QuantData
from qdq.pipeline.evaluate import measure
from qdq.pipeline.exporting import export_model
from qdq.pipeline.extras import compare_methods, layer_error_count, layer_errors
from qdq.pipeline.formats import method_label, plan_format
from qdq.pipeline.inputs import ForwardInputs, Inputs, num_samples
from qdq.pipeline.models import ModelSource
from qdq.pipeline.outdir import staged_dir
from qdq.pipeline.report import build_report, format_label
from qdq.pipeline.stages import Stages
from qdq.qat import distributed as dist

__all__ = [
    "HTML_FILE",
    "MANIFEST_FILE",
    "ONNX_FILE",
    "REPORT_FILE",
    "JobSettings",
    "QuantizeResult",
    "export_and_measure",
    "written_by_rank0",
]

_log = logging.getLogger(__name__)

ONNX_FILE = "model.qdq.onnx"
MANIFEST_FILE = "manifest.json"
REPORT_FILE = "report.json"
HTML_FILE = "report.html"


@dataclass(frozen=True)
class QuantizeResult:
    """What :func:`quantize` wrote and measured.

    ``report`` is the content of ``report.json``; ``prepared`` the calibrated torch model that was
    exported (fake-quant, amax of the chosen method); ``html_path`` the page of the report.
    """

    out_dir: Path
    onnx_path: Path
    manifest_path: Path
    report_path: Path
    report: dict[str, Any]
    prepared: nn.Module
    html_path: Path

    @property
    def metric_name(self) -> str:
        """The headline metric's name (``top1_accuracy``, ``box_agreement``, ...; ``headline``)."""
        return str(self.report["metric_name"])

    @property
    def fp32_metric(self) -> float:
        """The metric of the float model (torch)."""
        return float(self.report["fp32_metric"])

    @property
    def int8_metric(self) -> float:
        """The metric of the exported INT8 ONNX in ONNX Runtime."""
        return float(self.report["int8_metric"])


@dataclass(frozen=True)
class JobSettings:
    """What the job's last stages need of its options (export, measure, lint, report)."""

    calib: str | None
    percentile: float | None
    exporter: str
    opset: int | None
    target: str
    batch_size: int
    compare_methods: bool
    show_progress: bool
    static: bool
    engine: EngineReport | None = None
    inputs: ForwardInputs | None = None  # how the data meets forward (ONNX input order)
    metric: str | None = None  # the user metric's spec
    output_names: tuple[str, ...] | None = None  # pytree paths of the output tensors
    device: str = "cpu"  # where the torch stages ran
    per_image: tuple[str, ...] | None = None  # the detection keys in per-image mode (batch 1)
    format_choice: dict[str, Any] | None = None  # what --format mixed measured (FormatChoice)
    lint_flags: tuple[str, ...] | None = None  # the build flags linted (FP8: --fp8 added)
    objective: dict[str, Any] | None = None  # report.json: objective (pipeline/speed.py)
    block_form: str = "onnx"  # MXFP8's ONNX form (options.block_form: "trt" below opset 24)


def export_and_measure(
    prepared: nn.Module,
    source: ModelSource,
    qdata: QuantData,
    example: tuple[Any, ...],
    stages: Stages,
    out_dir: Path,
    overwrite: bool,
    s: JobSettings,
    caught: list[warnings.WarningMessage],
    fallback: Any = None,
    ptq: dict[str, Any] | None = None,
    qat: tuple[dict[str, Any], nn.Module] | None = None,
    checks: Inputs | None = None,
    budget: Budget | None = None,
) -> QuantizeResult:
    from qdq.lint import lint

    budget = budget or Budget()

    show, size = s.show_progress, s.batch_size
    with staged_dir(out_dir, overwrite=overwrite) as tmp:
        with stages("export") as st:
            exported, dims = export_model(
                prepared, example, tmp / ONNX_FILE, tmp / MANIFEST_FILE, opset=s.opset,
                exporter=s.exporter, static=s.static, per_image=bool(s.per_image),
                block_form=s.block_form,
            )  # fmt: skip
            st.detail = (
                f"{exported.exporter}, opset {exported.opset}"
                + (f", MXFP8 in {s.block_form} form" if "mxfp8" in plan_format(prepared) else "")
                + f", {exported.num_quantize} Q "
                f"/ {exported.num_dequantize} DQ, verified in ONNX Runtime"
            )
            if dims:
                st.detail += ", dynamic batch and sequence length"
            if s.per_image and s.inputs is not None and checks is not None:
                compared = per_image.check_export(exported.path, prepared, checks, s.inputs)
                st.detail += f" (per quantizer: {compared} on {num_samples(checks)} image(s))"
        label = format_label(plan_format(prepared))
        if s.per_image and s.inputs is not None:
            m = per_image.evaluate(stages, prepared, source.module, exported.path, qdata.evaluation,
                                   s.per_image, s.inputs, s.output_names, show, label)  # fmt: skip
        else:
            m = measure(stages, prepared, source.module, qdata, exported.path, size=size,
                        static=s.static, forward=s.inputs, user=s.metric, names=s.output_names,
                        show=show, qat=qat, label=label)  # fmt: skip
        ref, fp32, int8, int8_torch, outputs, top = (
            m.reference, m.fp32, m.int8, m.int8_torch, m.outputs, m.headline)  # fmt: skip
        errors = None
        # what one evaluation sample cost in torch, the unit of the optional stages' estimates
        forward = stages.timings.get("fp32_eval", 0.0) / max(num_samples(qdata.evaluation), 1)
        budget.observe(stages.timings)  # re-planned by what the stages so far really took
        count = layer_error_count(budget, forward, s)
        if count:
            with stages.optional("layer_errors") as st:
                errors = layer_errors(prepared, qdata, s, count)
                st.detail = f"{len(errors.rows)} quantizers on {errors.samples} samples"
                if errors.rows:
                    worst = errors.rows[0]
                    st.detail += f"; worst {worst.name} {worst.score:.1f} dB"
        methods = None
        if s.compare_methods:
            with stages.optional("compare_methods") as st:
                methods = compare_methods(prepared, qdata, ref, s, budget, forward)
                st.detail = ", ".join(f"{m} {r['metric']:.4f}" for m, r in methods.items())
        report_lint = None
        with stages.optional("lint") as st:
            report_lint = lint(exported.path, target=s.target, flags=s.lint_flags)
            st.detail = f"{report_lint.verdict} ({len(report_lint.findings)} findings)"
        latency = speed.latency_stage(stages, exported.path, s.target, example, size, report_lint)
        timings = stages.timings
        report = build_report(
            metric=top["name"],
            outputs=outputs,
            headline=top,
            source=source,
            data=qdata,
            prepared=prepared,
            exported=exported,
            lint=report_lint,
            fp32=fp32,
            int8=int8,
            int8_torch=int8_torch,
            methods=methods,
            layer_errors=None if errors is None else errors.to_dict(),
            fallback=None if fallback is None else fallback.to_dict(),
            ptq=ptq,
            qat=None if qat is None else qat[0],
            settings={
                "ptq": "none" if ptq is None else ptq["steps"],
                "recipe": "none" if ptq is None else ptq["recipe"],
                "qat_epochs": 0 if qat is None else qat[0]["epochs"],
                "max_drop": None if fallback is None else fallback.max_drop,
                "method": method_label(s.calib, plan_format(prepared)),
                "format": plan_format(prepared),
                "format_choice": s.format_choice,
                "percentile": s.percentile,
                "batch_size": size,
                "target": s.target,
                "exporter": s.exporter,
                "opset": exported.opset,
                # MXFP8's form: "onnx" (FLOAT8E8M0, opset 24) or "trt" (UINT8 exponents)
                "block_form": exported.block_form,
                "device": s.device,
                "world_size": dist.world_size(),  # torchrun: the ranks that calibrated and trained
            },
            per_image=s.per_image is not None,
            timings=timings,
            warnings=[str(w.message) for w in caught],
            stage_errors=stages.errors,
            files={
                "onnx": ONNX_FILE,
                "manifest": MANIFEST_FILE,
                "report": REPORT_FILE,
                "html": HTML_FILE,
            },
        )
        from qdq.report import write_html

        report["budget"] = budget.to_report(stages.timings)
        speed.add_speed(report, latency, s.objective or {"name": "accuracy"})
        # the page first: its own parts that fail (drawing, plots, engine views) are recorded
        # in report.json too, and the page lists every stage that failed
        report = json.loads(json.dumps(report, default=str))
        page_errors: list[dict[str, str]] = []
        write_html(report, tmp / HTML_FILE, onnx_path=tmp / ONNX_FILE, engine=s.engine,
                   failures=page_errors)  # fmt: skip
        report["stage_errors"] = [*report["stage_errors"], *page_errors]
        for e in report["stage_errors"] if stages.callback is None else ():
            _log.warning(
                "qdq quantize: stage %s failed (%s: %s); everything else was written "
                "(report.json: stage_errors)",
                *(e["stage"], e["error"], e["message"][:300]),
            )
        text = json.dumps(report, indent=2) + "\n"
        (tmp / REPORT_FILE).write_text(text, encoding="utf-8")
    return QuantizeResult(
        out_dir=out_dir,
        onnx_path=out_dir / ONNX_FILE,
        manifest_path=out_dir / MANIFEST_FILE,
        report_path=out_dir / REPORT_FILE,
        report=json.loads(text),
        prepared=prepared,
        html_path=out_dir / HTML_FILE,
    )


def written_by_rank0(out_dir: Path, prepared: nn.Module) -> QuantizeResult:
    """Another rank than 0 under ``torchrun``: wait for rank 0's files; its report, this rank's
    model (identical after calibration sync and DDP)."""
    dist.barrier()
    path = out_dir / REPORT_FILE
    if not path.is_file():
        raise RuntimeError(f"rank 0 did not write {path}; its own output has the error")
    return QuantizeResult(
        out_dir=out_dir,
        onnx_path=out_dir / ONNX_FILE,
        manifest_path=out_dir / MANIFEST_FILE,
        report_path=path,
        report=json.loads(path.read_text(encoding="utf-8")),
        prepared=prepared,
        html_path=out_dir / HTML_FILE,
    )
