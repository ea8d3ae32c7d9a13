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

With the accuracy objective the single-format INT8 plan is weighed too (issue 60's aim: mixed at
least as accurate as the best single format it chose from, with no more reformats than it). Where
every tensor that can run INT8 in INT8 (attention products with the GEMMs) measures less noise than
the plan as planned (``FormatChoice.uniform``, :attr:`FormatChoice.noise`: the measured layers'
relative noise summed), the plan as planned is never the most accurate single format, so the job
counts the all-INT8 plan's reformats and takes the measured changes over it only when they measure
less noise still and the linter counts no more reformats with them than with one of the two
single-format plans (all INT8, or as planned: ``reformats["all INT8"]``, ``["with changes"]``,
``["without"]``); else the all-INT8 plan (``FormatChoice.single``). GPT-2 measured 15 of its 16
FP8 GEMMs 5-10 dB better in INT8 and the 16th 2.8 dB: the 15 moves left FP8 attention amid INT8
GEMMs (27 unfused Q/DQ against 24), so the one-set check kept all FP8 (cosine 0.99263); the
all-INT8 plan measures 36.2 dB against 28.5 dB as planned at 24 unfused Q/DQ, INT8's cosine
0.99747, in one export instead of two.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from itertools import islice
from typing import Any

from torch import nn

from qdq.accuracy.formats import FormatChoice, FormatRow, choose_formats
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

        def count(plan: FormatChoice) -> int:
            return reformats(model, example, replace(config, overrides=plan.overrides), some[0],
                             exporter, target)  # fmt: skip

        if choice.uniform is not None:
            choice = _most_accurate(choice, count)
        elif choice.unchanged is not None:
            choice = _fewest_reformats(choice, count)
        st.detail = choice.summary()
    return replace(config, overrides=choice.overrides), choice


def _fewest_reformats(choice: FormatChoice, count: Callable[[FormatChoice], int]) -> FormatChoice:
    """The measured changes when the linter counts no more reformats with them than without
    (``choice.unchanged``); else the changes other than NVFP4 when they cost no more; else no
    change."""
    kept = choice.unchanged
    assert kept is not None
    counts = {"with changes": count(choice), "without": count(kept)}
    eight = choice.without_nvfp4 if counts["with changes"] > counts["without"] else None
    if eight is not None:  # the NVFP4 changes may be what costs
        # no other change: the plan without any
        counts["without NVFP4"] = count(eight) if eight.changes else counts["without"]
    if eight is not None and counts["without NVFP4"] <= counts["without"]:
        n4 = sum(r.chosen == "nvfp4" for r in choice.rows)
        why = (
            f"the {n4} NVFP4 change(s) dropped: the linter predicts "
            f"{counts['with changes']} unfused Q/DQ (reformats) with them, "
            f"{counts['without NVFP4']} with the other changes alone, "
            f"{counts['without']} without any"
        )
        return replace(eight, reformats=counts, dropped=why)
    if counts["with changes"] > counts["without"]:
        why = (
            f"the {len(choice.changes)} change(s) dropped: the linter predicts "
            f"{counts['with changes']} unfused Q/DQ (reformats) with them, "
            f"{counts['without']} without"
        )
        return replace(kept, reformats=counts, dropped=why)
    return replace(choice, reformats=counts)


def _most_accurate(choice: FormatChoice, count: Callable[[FormatChoice], int]) -> FormatChoice:
    """The accuracy objective where the all-INT8 plan (``choice.uniform``) measures less noise
    than the plan as planned (``unchanged``), so the plan as planned is never taken: the measured
    changes (then those without NVFP4) when they measure less noise than the all-INT8 plan and
    the linter counts no more reformats with them than with one of the two single-format plans
    (all INT8, or as planned); else the all-INT8 plan."""
    uniform = choice.uniform
    assert uniform is not None and uniform.unchanged is not None
    kept = uniform.unchanged
    counts = {"all INT8": count(uniform)}
    others = [("with changes", choice)]
    if choice.without_nvfp4 is not None:
        others.append(("without NVFP4", choice.without_nvfp4))
    for name, plan in others:
        if set(plan.overrides) == set(uniform.overrides):  # every tensor moved by the measure
            return replace(plan, reformats=counts)
        if not plan.changes or plan.noise >= uniform.noise:
            continue  # no more accurate than the all-INT8 plan: not worth an export
        counts[name] = count(plan)
        if counts[name] > counts["all INT8"] and "without" not in counts:
            counts["without"] = count(kept)  # the other single-format plan's reformats
        if counts[name] <= max(counts["all INT8"], counts.get("without", 0)):
            return replace(plan, reformats=counts)
    why = (
        f"it measures {uniform.mean_db:.1f} dB mean SQNR over the {len(uniform.rows)} measured "
        f"layers against {kept.mean_db:.1f} dB as planned"
        + (
            f", {choice.mean_db:.1f} dB with the {len(choice.changes)} change(s)"
            if choice.changes
            else ""
        )
        + f"; the linter predicts {counts['all INT8']} unfused Q/DQ (reformats) all INT8"
        + "".join(f", {n} {name}" for name, n in counts.items() if name != "all INT8")
    )
    measured = {r.layer: r for r in choice.rows}
    rows = tuple(
        replace(r, reason=r.reason + _not_taken(m, costly="with changes" in counts))
        if (m := measured.get(r.layer)) is not None and m.chosen != r.chosen
        else r
        for r in uniform.rows
    )
    return replace(uniform, rows=rows, reformats=counts, dropped=why, timed_on=choice.timed_on)


def _not_taken(row: FormatRow, *, costly: bool) -> str:
    """Why a measured row's own choice is not in the all-INT8 plan the job took (``costly``:
    the changes were counted and cost more reformats)."""
    outcome = "would cost reformats" if costly else "measures no less noise in all"
    return f"; the measured choice, {row.chosen.upper()} ({row.reason}), {outcome}"


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
