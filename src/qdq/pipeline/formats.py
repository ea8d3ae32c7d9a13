"""The stage ``formats`` of ``qdq quantize --format mixed`` (issue 49): the plan's config.

``--format int8`` / ``fp8`` plan with ``QuantConfig(format=...)`` directly. ``mixed`` first plans
each layer in the format TensorRT runs fastest (rule F07: convolutions INT8, GEMMs and attention
FP8), calibrates that plan on a few calibration batches, measures each INT8 convolution's
quantization noise in INT8 and in FP8 (:func:`qdq.accuracy.formats.choose_formats`) and moves to
FP8 the input tensors where INT8 loses; the job then runs with those overrides. With
``--objective speed`` the tensors equally accurate in both formats take the one predicted faster
on the target's GPU (rule T02). On a target with NVFP4 kernels (a Blackwell GPU named and
TensorRT 10.8+: :func:`has_nvfp4`) the GEMMs that can run NVFP4 are measured in it too, and a
tensor runs NVFP4 where it is at least as accurate as the better 8-bit format, or with
``--objective speed`` where every reader measures at least ``NVFP4_MIN_DB`` in it and is predicted
faster in it on the target's GPU (``Override(format="nvfp4")``).

A move (or a layer left FP16) puts format boundaries into the graph: an INT8 layer cannot write the
FP8 tensor its moved reader wants (nor an FP8 one an INT8 tensor), and each boundary is a reformat
TensorRT runs as a standalone Quantize (PP-OCR's detector: two convolutions moved to FP8 cost 25
unfused Q/DQ besides INT8's 25, at the squeeze-excitation Mul/Add layers that wrote their inputs
INT8). So when any layer changed, the plan is exported with the changes and without them (one
calibration batch each; the amax do not change the graph) and the linter counts the unfused Q/DQ of
both: the changes stay only when they cost no reformat more (``FormatChoice.reformats``,
``dropped``). When NVFP4 changes are among them and the whole set costs more, the other changes
alone (``FormatChoice.without_nvfp4``) are counted too and kept when they cost no more: an NVFP4
Q/K/V projection whose output an FP8 attention product quantizes is a format boundary (the
linter's F05), which should not undo an INT8 move that costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from itertools import islice
from typing import Any

from torch import nn

from qdq.accuracy.formats import FormatChoice, choose_formats
from qdq.config import QuantConfig
from qdq.pipeline.device import to_device
from qdq.pipeline.inputs import ForwardInputs, Inputs, batches
from qdq.pipeline.stages import Stages

__all__ = [
    "AWQ_BATCHES",
    "FORMAT_BATCHES",
    "has_nvfp4",
    "int4_clip",
    "method_label",
    "plan_config",
    "plan_format",
    "reformats",
]

#: calibration batches whose inputs the AWQ clip search of INT4 weights reads (stage ``int4_clip``)
AWQ_BATCHES = 2
#: calibration batches the mixed plan's measurement calibrates on (its amax; the noise is
#: measured on the first)
FORMAT_BATCHES = 4


def plan_config(
    stages: Stages,
    model: nn.Module,
    example: tuple[Any, ...],
    cal: Inputs,
    inputs: ForwardInputs,
    *,
    size: int,
    static: bool,
    device: Any,
    fmt: str,
    exporter: str = "auto",
    target: str = "trt10",
    objective: str = "accuracy",
) -> tuple[QuantConfig, FormatChoice | None]:
    """The job's :class:`QuantConfig` for ``fmt``, and for ``"mixed"`` what was measured
    (``exporter`` and ``target``: the job's, for the reformat count of the moves; ``objective``
    ``"speed"``: equally accurate formats broken by the predicted time on the target's GPU, rule
    T02; and on a target with NVFP4 kernels, :func:`has_nvfp4`, NVFP4 where every reader
    measures at least ``NVFP4_MIN_DB`` in it)."""
    import qdq
    from qdq.lint import parse_target

    per_channel = fmt != "int8" and parse_target(target).fp8_gemm_per_channel
    config = QuantConfig(format=fmt, fp8_gemm_per_channel=per_channel)
    if fmt != "mixed":
        return config, None
    with stages("formats") as st:
        prepared = qdq.prepare(model, example, config)
        some = [to_device(inputs.arguments(b), device)
                for b, _ in islice(batches(cal, size, static), FORMAT_BATCHES)]  # fmt: skip
        qdq.calibrate(prepared, some, show_progress=False)
        gpu = _target_gpu(target) if objective == "speed" else None
        choice = choose_formats(prepared, some[0], gpu=gpu, nvfp4=has_nvfp4(target),
                                objective=objective)  # fmt: skip
        kept = choice.unchanged
        if kept is not None:
            counts = {
                "with changes": reformats(model, example,
                                          replace(config, overrides=choice.overrides), some[0],
                                          exporter, target),
                "without": reformats(model, example, replace(config, overrides=kept.overrides),
                                     some[0], exporter, target),
            }  # fmt: skip
            eight = choice.without_nvfp4 if counts["with changes"] > counts["without"] else None
            if eight is not None:  # the NVFP4 changes may be what costs
                counts["without NVFP4"] = (
                    reformats(model, example, replace(config, overrides=eight.overrides), some[0],
                              exporter, target)
                    if eight.changes
                    else counts["without"]  # no other change: the plan without any
                )  # fmt: skip
            if eight is not None and counts["without NVFP4"] <= counts["without"]:
                n4 = sum(r.chosen == "nvfp4" for r in choice.rows)
                why = (
                    f"the {n4} NVFP4 change(s) dropped: the linter predicts "
                    f"{counts['with changes']} unfused Q/DQ (reformats) with them, "
                    f"{counts['without NVFP4']} with the other changes alone, "
                    f"{counts['without']} without any"
                )
                choice = replace(eight, reformats=counts, dropped=why)
            elif counts["with changes"] > counts["without"]:
                why = (
                    f"the {len(choice.changes)} change(s) dropped: the linter predicts "
                    f"{counts['with changes']} unfused Q/DQ (reformats) with them, "
                    f"{counts['without']} without"
                )
                choice = replace(kept, reformats=counts, dropped=why)
            else:
                choice = replace(choice, reformats=counts)
        st.detail = choice.summary()
    return replace(config, overrides=choice.overrides), choice


def reformats(
    model: nn.Module, example: tuple[Any, ...], config: QuantConfig, batch: Any, exporter: str,
    target: str,
) -> int:  # fmt: skip
    """The unfused Q/DQ (reformats) qdq's linter predicts on ``target`` for ``model`` planned by
    ``config``, exported (unverified) to a temporary file after one calibration ``batch``."""
    import tempfile
    from pathlib import Path

    import qdq
    from qdq.lint import lint

    prepared = qdq.prepare(model, example, config)
    qdq.calibrate(prepared, [batch], show_progress=False)
    with tempfile.TemporaryDirectory(prefix="qdq-formats-") as tmp:
        path = Path(tmp) / "plan.onnx"
        qdq.export_onnx(prepared, example, path, exporter=exporter, verify=False)
        return int(lint(path, target=target).summary["unfused_qdq"])


def has_nvfp4(target: str) -> bool:
    """Whether ``target`` runs NVFP4 GEMMs: TensorRT 10.8+ and a Blackwell GPU named (a target
    naming no GPU may lack them, so a mixed plan does not choose NVFP4 there).

    Example:
        >>> has_nvfp4("trt10.8-blackwell"), has_nvfp4("trt10-hopper"), has_nvfp4("trt10.12")
        (True, False, False)
    """
    from qdq.lint import parse_target
    from qdq.lint.blocks import kernels_missing
    from qdq.lint.formats import FORMATS

    try:
        t = parse_target(target)
    except ValueError:  # not a target: the job's own check says so
        return False
    return kernels_missing(t, "nvfp4") == "" and bool(t.runs(FORMATS["nvfp4"].compute_capability))


def method_label(calib: str | None, formats: Iterable[str] = ("fp8", "int8")) -> str:
    """The calibration method as the job prints it (``None``: each quantizer's own, the default
    of a plan that is not INT8 only: max for FP8 layers and for the per-tensor amax of NVFP4 and
    MXFP8 ones, max for INT4 weights, mse for INT8 ones; ``formats``: those in the plan).

    Example:
        >>> method_label(None), method_label("mse"), method_label(None, {"nvfp4": 6, "fp8": 2})
        ('max (FP8) / mse (INT8)', 'mse', 'max (FP8) / max (NVFP4/MXFP8 per-tensor amax)')
    """
    if calib is not None:
        return calib
    present = set(formats)
    parts = [
        label
        for fmts, label in (
            (("fp8",), "max (FP8)"),
            (("nvfp4", "mxfp8"), "max (NVFP4/MXFP8 per-tensor amax)"),
            (("int4",), "max (INT4 weights)"),
            (("int8",), "mse (INT8)"),
        )
        if present & set(fmts)
    ]
    return " / ".join(parts) or "max"


def plan_format(prepared: nn.Module) -> dict[str, int]:
    """How many quantizers of ``prepared`` each format has (``{"int8": n, "fp8": m}``)."""
    from collections import Counter

    import qdq

    counts = Counter(q.spec.format for q in qdq.quantizers_of(prepared).values())
    return dict(sorted(counts.items()))


def _target_gpu(target: str) -> Any:
    from qdq.lint.speed.latency import target_gpu

    try:
        return target_gpu(target)[0]
    except ValueError:  # not a target: the job's own check says so
        return None


def int4_clip(
    stages: Stages, prepared: nn.Module, batches: list[Any], show_progress: bool
) -> tuple[Callable[[nn.Module], Any] | None, dict[str, Any] | None]:
    """The stage ``int4_clip``: the AWQ clip search (:func:`qdq.ptq.awq_model.awq_clip`, AWQ's
    per-block choice by the layer output with a per-row guard against max, no coordinate-descent
    sweep: the sweep gained another 0.8 dB on ViT-tiny but took 9x as long) on every INT4
    weight of ``prepared``, on the first :data:`AWQ_BATCHES` calibration batches. Measured on
    held-out data it gains 1.5-5 dB of layer output SQNR over ``max`` (``benchmarks/
    int4_weights.py``). Returns ``(clip, report)``: ``clip(model)`` runs it again on another
    prepared model (the fallback search's), and its report (``report.json["ptq"]["awq_clip"]``);
    ``(None, None)`` when the plan has no INT4 weight."""
    from qdq.ptq.awq_model import awq_clip
    from qdq.quant import BlockQuantizer, QuantMode, quantizers_of

    if not any(
        isinstance(q, BlockQuantizer) and q.spec.format == "int4" and q.mode is QuantMode.QUANTIZE
        for q in quantizers_of(prepared).values()
    ):
        return None, None

    def clip(model: nn.Module) -> Any:
        return awq_clip(model, batches, num_batches=AWQ_BATCHES, sweeps=0,
                        show_progress=show_progress)  # fmt: skip

    with stages("int4_clip") as st:
        report = clip(prepared)
        st.detail = report.summary()
    return clip, report.to_report()
