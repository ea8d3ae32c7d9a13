"""``format="mixed"``: each layer in the format that loses least where the fastest one loses
measurably (issue 49).

A mixed plan (:mod:`qdq.graph.formats`, rule F07) starts from the format TensorRT runs fastest per
layer: convolutions INT8, GEMMs and attention FP8. :func:`choose_formats` then measures, on a
calibrated mixed plan, what each weighted layer that could run either format would lose in each:
the quantization noise of its input (the tensors one calibration batch feeds it; INT8 at its mse
amax, FP8 at the abs-max TensorRT's FP8 recipes use) and of its weight (INT8 per output channel,
FP8 per tensor, or per channel for GEMMs where the target scales FP8 GEMMs so), as an SQNR in dB
of the two together (independent noises add). One Quantize
serves every reader of a tensor (F05), so the choice is per input tensor: it moves to the other
format when each of its readers can and that format is better by :data:`MARGIN_DB` on average
(an INT8 convolution to FP8 where INT8 loses on outliers; an FP8 GEMM to INT8 where FP8's 3-bit
mantissa loses on a well-behaved tensor: CREPE-tiny's classifier head). A
layer under :data:`MIN_DB` in both formats is kept in FP16 (excluded). The outcome is a list of
``Override(format=...)`` / ``Override(exclude=True)`` for :class:`~qdq.config.QuantConfig`, and a
table of what was measured.

With a GPU (``qdq quantize --format mixed --objective speed``: the target's), a tensor where
neither format is better by :data:`MARGIN_DB` (the two equally accurate) takes the format its
readers are predicted faster in (:mod:`qdq.accuracy.format_time`, rule T02): a GEMM planned FP8
moves to INT8 on a GPU whose FP8 runs at half its INT8 rate (GeForce Ada). Where the two are
predicted as fast (Hopper, Blackwell, datacenter Ada: equal INT8 and FP8 peaks) the tensor keeps
its planned format, which adds no format boundary.

On a target with NVFP4 kernels (Blackwell and TensorRT 10.8+, issue 60; ``nvfp4=True``) each GEMM
that can run NVFP4 (K a multiple of 16, N at least 16: rule F11) is measured in NVFP4 too
(:mod:`qdq.accuracy.format_noise`), and a tensor every reader of which is such a GEMM (one Quantize
per tensor, F14) runs NVFP4 when its NVFP4 SQNR is at least the better 8-bit format's on average
over its readers (:data:`NVFP4_MARGIN_DB`, 0 dB): NVFP4 is the faster format on Blackwell's GEMMs
(FP4 tensor cores at twice FP8's rate, half the bytes), so it takes a tie, and only a tie: a 3 dB
margin (INT8 against FP8's) measured 1.6 dB of output SQNR lost on a tiny transformer, below the
best single format, which the accuracy objective must not do. NVFP4 measures about 17.4 dB on a
Gaussian layer against FP8's 28.5 and INT8's 38, so by accuracy it wins only where the 8-bit formats
lose too and NVFP4 does not: weights already on NVFP4's grid (a model trained for NVFP4) are the
case seen. With ``objective="speed"`` a tensor also runs NVFP4 when every reader measures at least
:data:`NVFP4_MIN_DB` in NVFP4 (row rule T02): the floor sits 2.4 dB (noise 1.7x) under NVFP4's
Gaussian figure, so it takes NVFP4 wherever its block scales behave as on well-behaved data and
refuses a layer where they do not; and, with the target's GPU, only where every reader is
predicted faster in NVFP4 than in its faster 8-bit format by more than :data:`TIME_TIE`
(:func:`~qdq.accuracy.format_time.nvfp4_times`, kernel rule K08): a small GEMM whose time is the
launch floor gains nothing for the accuracy it loses. A layer under :data:`MIN_DB` in every
format it was measured in stays FP16, unless the speed objective chose NVFP4 for it by the floor.

With the accuracy objective the same measurement also gives the all-INT8 plan
(:attr:`FormatChoice.uniform`: every tensor that can change format INT8, attention products with
the GEMMs) where it measures less noise than the plan as planned (:attr:`FormatChoice.noise`, the
measured layers' relative noise summed): moves decided tensor by tensor can leave an FP8 island
that costs more reformats than either single format, and the job
(:func:`qdq.pipeline.formats.plan_config`) then takes the single format rather than nothing.

The measure is the layer's own noise, not the network's metric: cheap (one forward of one batch,
no re-calibration) and the same quantity ``qdq debug`` reports per layer. INT8's noise on a
tensor with outliers (a few values far above the rest: the activation outliers of transformers,
some depthwise-heavy ConvNets) is what FP8's logarithmic grid avoids.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from torch import nn

from qdq.accuracy.format_noise import (
    Nvfp4Measure,
    Nvfp4Outcome,
    db,
    inputs_seen,
    noise,
    nvfp4_gemm,
    nvfp4_input_noise,
    nvfp4_weight_noise,
    residual_fusions,
    weight_axes,
    weight_noise,
)
from qdq.accuracy.format_time import TIME_TIE, faster, format_times, nvfp4_times, shape_of
from qdq.config import Override

__all__ = [
    "MARGIN_DB",
    "MIN_DB",
    "NVFP4_MARGIN_DB",
    "NVFP4_MIN_DB",
    "OBJECTIVES",
    "FormatChoice",
    "FormatRow",
    "choose_formats",
]

#: FP8 must beat INT8 by this many dB (its noise at most half INT8's) for a tensor to move
MARGIN_DB = 3.0
#: below this SQNR in both formats a layer is kept in FP16 (its quantization noise is 1 % of the
#: signal's power or more)
MIN_DB = 20.0
#: the accuracy objective takes NVFP4 on a tensor whose NVFP4 SQNR is at least the better 8-bit
#: format's minus this (0: never less accurate than the 8-bit formats it was chosen from)
NVFP4_MARGIN_DB = 0.0
#: ``objective="speed"``: a tensor runs NVFP4 where every reader measures at least this SQNR in
#: NVFP4 (input and weight together). A Gaussian layer measures 17.4 dB (20.4 dB each tensor),
#: heavy tails, uniform and outlier channels 17.1-18.5 dB (:mod:`.format_noise`): the floor is
#: 2.4 dB (noise 1.7x) under the Gaussian figure, so it takes NVFP4 wherever its block scales
#: behave as on such data and refuses a layer where they do not (a calibrated amax so far above
#: the batch's values that its E4M3 block scales run subnormal). It is under MIN_DB: NVFP4's
#: ordinary figure is, so a floor above 20 dB would choose NVFP4 nowhere but on 4-bit weights
NVFP4_MIN_DB = 15.0
#: what :func:`choose_formats` optimises: ``"speed"`` adds the NVFP4 floor (rule T02)
OBJECTIVES = ("accuracy", "speed")


@dataclass(frozen=True)
class FormatRow:
    """One weighted layer of a mixed plan that could run INT8 or FP8 (or NVFP4).

    Attributes:
        layer: the layer (the plan's owner name).
        tensor: the input quantizer it shares with the other readers of its input.
        int8_db / fp8_db: the SQNR of its input and weight quantization together, in each format.
        planned: its format before the measure (F07: convolutions INT8, GEMMs FP8).
        chosen: ``"int8"``, ``"fp8"``, ``"nvfp4"`` or ``"fp16"``.
        reason: one line.
        rule: what decided: ``"F07"`` (the measure), ``"T02"`` (equally accurate: the format
            predicted faster, when a GPU was given; NVFP4 above :data:`NVFP4_MIN_DB` with
            ``objective="speed"``).
        int8_ms / fp8_ms: its predicted time in each format (``None``: not timed).
        nvfp4_db: its SQNR in NVFP4 (``None``: not measured: a target without NVFP4 kernels, or
            a layer that cannot run it).
    """

    layer: str
    tensor: str
    int8_db: float
    fp8_db: float
    planned: str
    chosen: str
    reason: str
    rule: str = "F07"
    int8_ms: float | None = None
    fp8_ms: float | None = None
    nvfp4_db: float | None = None


@dataclass(frozen=True)
class FormatChoice:
    """What :func:`choose_formats` measured and decided."""

    rows: tuple[FormatRow, ...]
    overrides: tuple[Override, ...] = field(default=())
    #: attention products moved to INT8 with the GEMMs (no weighted layer stayed FP8)
    followed: tuple[str, ...] = field(default=())
    #: the reformats (unfused Q/DQ) the linter predicted with the changes and without them,
    #: when the job checked (:func:`qdq.pipeline.formats.plan_config`); ``{}`` when none was made
    reformats: dict[str, int] = field(default_factory=dict)
    #: why the changes were dropped ('' when they were kept or none was made)
    dropped: str = ""
    #: the same measurement with every layer left in its planned format (no move, no FP16):
    #: the plan a job keeps when the changes would cost reformats; ``None`` when none was made
    unchanged: FormatChoice | None = field(default=None, repr=False, compare=False)
    #: the GPU the measured layers were timed on (rule T02; '' when none was given)
    timed_on: str = ""
    #: the same measurement decided without NVFP4 (INT8/FP8/FP16 only): the plan a job keeps
    #: when the NVFP4 changes alone cost reformats; ``None`` when no layer chose NVFP4
    without_nvfp4: FormatChoice | None = field(default=None, repr=False, compare=False)
    #: whether the GEMMs were measured in NVFP4 too (a target with NVFP4 kernels)
    nvfp4: bool = False
    #: the objective the choice was made for (:data:`OBJECTIVES`)
    objective: str = "accuracy"
    #: the same measurement with every tensor that can run INT8 in INT8 (the single-format INT8
    #: plan, attention products with the GEMMs): a candidate of the accuracy objective where it
    #: measures less noise than the plan as planned (:attr:`noise`); ``None`` otherwise
    uniform: FormatChoice | None = field(default=None, repr=False, compare=False)
    #: ``"int8"`` for the all-INT8 plan itself (:attr:`uniform`), ``""`` for a measured choice
    single: str = ""

    @property
    def noise(self) -> float:
        """The measured layers' quantization noise in their chosen formats, summed (relative
        noise; independent noises add, so the lower sum is the more accurate plan by the
        measure; an FP16 layer adds none)."""
        return sum(_row_noise(r) for r in self.rows)

    @property
    def mean_db(self) -> float:
        """:attr:`noise` as the mean SQNR of the measured layers, in dB."""
        return db(self.noise / len(self.rows)) if self.rows else float("inf")

    @property
    def changes(self) -> tuple[FormatRow, ...]:
        """The measured layers that leave their planned format (to the other one, or FP16)."""
        return tuple(r for r in self.rows if r.chosen != r.planned)

    def summary(self) -> str:
        """One line: how many layers went where."""
        if self.single:
            moved = sum(r.chosen != r.planned for r in self.rows)
            return (
                f"{len(self.rows)} layers measured: {moved} moved to {self.single.upper()} with "
                f"every layer that can run it (the all-{self.single.upper()} plan)"
                + (f", {len(self.followed)} attention products with them" if self.followed else "")
                + (f"; {self.dropped}" if self.dropped else "")
            )
        by_noise = [r for r in self.rows if r.rule != "T02"]
        to_fp8 = sum(r.planned == "int8" and r.chosen == "fp8" for r in by_noise)
        to_int8 = sum(r.planned == "fp8" and r.chosen == "int8" for r in by_noise)
        fp16 = sum(r.chosen == "fp16" for r in self.rows)
        timed = [r for r in self.rows if r.rule == "T02" and r.chosen != "nvfp4"]
        return (
            f"{len(self.rows)} layers measured: {to_fp8} moved INT8 -> FP8, {to_int8} FP8 -> INT8 "
            f"(the other format better by >= {MARGIN_DB:g} dB on every reader of their input), "
            f"{fp16} kept in FP16 (< {MIN_DB:g} dB in {'every format' if self.nvfp4 else 'both formats'})"
            + (self._nvfp4_summary() if self.nvfp4 else "")
            + (
                f"; {len(self.followed)} attention products INT8 with them (no FP8 GEMM left)"
                if self.followed
                else ""
            )
            + (
                f"; {len(timed)} by predicted time on {self.timed_on} (T02: equally accurate, "
                f"{sum(r.chosen != r.planned for r in timed)} moved to the faster format)"
                if self.timed_on
                else ""
            )
            + (f"; {self.dropped}" if self.dropped else "")
        )

    def _nvfp4_summary(self) -> str:
        measured = sum(r.nvfp4_db is not None for r in self.rows)
        tie = sum(r.chosen == "nvfp4" and r.rule != "T02" for r in self.rows)
        floor = sum(r.chosen == "nvfp4" and r.rule == "T02" for r in self.rows)
        return (
            f"; {tie + floor} of {measured} NVFP4-capable GEMMs to NVFP4 ({tie} as accurate as "
            "the better 8-bit format"
            + (f", {floor} at >= {NVFP4_MIN_DB:g} dB by --objective speed" if floor else "")
            + ")"
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (the report's ``formats``)."""
        return {
            "summary": self.summary(),
            "rows": [asdict(r) for r in self.rows],
            "followed": list(self.followed),
            "reformats": dict(self.reformats),
            "dropped": self.dropped,
            "timed_on": self.timed_on,
            "nvfp4": self.nvfp4,
            "objective": self.objective,
            "single": self.single,
            "mean_db": round(self.mean_db, 2) if self.noise > 0 else None,
        }

    def mark(self, prepared: nn.Module) -> None:
        """Give the plan points of the layers whose format the predicted time decided (rows of
        rule T02) that format rule and the row's reason (the planner recorded a move as the
        ``USER`` override it is, a kept format as F07/F01). The job calls it on its final plan,
        after the fallback search re-planned."""
        timed = {r.layer: r.reason for r in self.rows if r.rule == "T02"}
        if not timed:
            return
        import qdq

        plan = qdq.plan_of(prepared)
        points = tuple(
            replace(p, format_rule="T02", reason=f"{p.reason}; T02: {timed[p.owner]}")
            if p.owner in timed and p.quantized and p.format_rule in ("USER", "F07", "F01")
            else p
            for p in plan.points
        )
        object.__setattr__(prepared, "qdq_plan", replace(plan, points=points))


def choose_formats(
    prepared: nn.Module,
    batch: Any,
    *,
    gpu: Any = None,
    nvfp4: bool = False,
    objective: str = "accuracy",
) -> FormatChoice:
    """Measure the INT8 convolutions of a calibrated mixed plan (rule F07) in INT8 and FP8 on one
    calibration ``batch``; return the layers that move and the overrides that move them (and,
    when any layer changes, :attr:`FormatChoice.unchanged` from the same measurement).

    Args:
        prepared: a model prepared by ``QuantConfig(format="mixed")`` and calibrated.
        batch: one calibration batch (what the model's forward takes).
        gpu: a :class:`~qdq.lint.speed.gpus.GPU`: a tensor equally accurate in INT8 and FP8 takes
            the format its readers are predicted faster in (rule T02, the module docstring).
        nvfp4: the target has NVFP4 kernels (Blackwell, TensorRT 10.8+): measure the GEMMs that
            can run NVFP4 in it too, and move a tensor's readers to NVFP4 where it is as accurate
            as the better 8-bit format (:data:`NVFP4_MARGIN_DB`; ``Override(format="nvfp4")``).
        objective: ``"accuracy"`` or ``"speed"`` (NVFP4 also where every reader measures at
            least :data:`NVFP4_MIN_DB` in it).

    Raises:
        ValueError: ``prepared`` is not a calibrated plan of ``QuantConfig(format="mixed")``, or
            ``objective`` is not one of :data:`OBJECTIVES`.

    Example:
        >>> import qdq, torch
        >>> net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
        >>> x = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
        >>> prepared = qdq.prepare(net.eval(), (x[:1],), qdq.QuantConfig(format="mixed"))
        >>> _ = qdq.calibrate(prepared, [x], show_progress=False)
        >>> choice = choose_formats(prepared, x, nvfp4=True)
        >>> sorted((r.layer, r.chosen, r.nvfp4_db is not None) for r in choice.rows)
        [('0', 'int8', True), ('2', 'int8', True)]
    """
    import qdq

    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    plan = qdq.plan_of(prepared)
    quantizers = qdq.quantizers_of(prepared)
    candidates = sorted(  # INT8 convs (F07) and FP8 GEMMs (F06 weights): both formats possible
        {p.owner for p in plan.points if p.format_rule in ("F06", "F07") and p.kind == "weight"}
    )
    planned = {
        p.owner: p.spec.format for p in plan.points if p.kind == "weight" and p.spec is not None
    }
    if not any(p.format_rule for p in plan.points):
        raise ValueError("choose_formats needs a plan of QuantConfig(format='mixed')")
    reads: dict[str, str] = {}  # layer -> its input quantizer
    weights: dict[str, str] = {}  # layer -> its weight quantizer
    axes: dict[str, tuple[int | None, int | None]] = {}  # weight quantizer -> INT8, FP8 axis
    readers: dict[str, list[str]] = {}  # input quantizer -> every weighted layer reading it
    ops: dict[str, str] = {}  # layer -> its op
    owners = {p.name: p.owner for p in plan.points}
    members: dict[str, frozenset[str]] = {}  # input quantizer -> the owners of its group
    for p in plan.points:
        group = plan.groups[p.group] if p.group is not None else None
        if group is None or not p.format_rule:
            continue
        if p.kind == "weight":
            weights[p.owner] = group.quantizer
            axes[group.quantizer] = weight_axes(p)
            ops[p.owner] = p.op
        elif p.op in ("conv", "conv_transpose", "linear", "matmul"):
            reads[p.owner] = group.quantizer
            readers.setdefault(group.quantizer, []).append(p.owner)
            members[group.quantizer] = frozenset(owners.get(m, m) for m in group.members)
    wanted = {reads[c] for c in candidates if c in reads} | {weights[c] for c in candidates}
    modules = (
        {} if gpu is None else {c: m for c in candidates if (m := _module(prepared, c)) is not None}
    )
    outputs: dict[str, tuple[int, ...]] = {}
    seen = inputs_seen(prepared, {path: quantizers[path] for path in wanted}, batch, modules,
                       outputs)  # fmt: skip
    measured: dict[str, tuple[float, float]] = {}
    fp4: dict[str, float] = {}  # layer -> its NVFP4 relative noise (the GEMMs that can run it)
    for layer in candidates:
        if layer not in reads or reads[layer] not in seen or weights[layer] not in seen:
            continue
        act, w = reads[layer], weights[layer]
        a8, af = noise(quantizers[act], seen[act])
        w8, wf = weight_noise(seen[w], *axes[w])
        measured[layer] = (a8 + w8, af + wf)
        red = nvfp4_gemm(ops.get(layer, ""), seen[act], seen[w], axes[w]) if nvfp4 else None
        if red is not None:
            fp4[layer] = nvfp4_input_noise(quantizers[act], seen[act]) + nvfp4_weight_noise(
                seen[w], red
            )
    times: dict[str, tuple[float, float]] = {}
    label = ""
    slower: frozenset[str] = frozenset()
    if gpu is not None:
        shapes = {
            layer: shape
            for layer in measured
            if (shape := shape_of(modules.get(layer), tuple(seen[reads[layer]].shape),
                                  tuple(seen[weights[layer]].shape), outputs.get(layer)))
        }  # fmt: skip
        times, label = format_times(shapes, gpu), str(gpu.label)
        if nvfp4:  # T02: the speed floor takes NVFP4 only where it is predicted faster
            fp4_ms = nvfp4_times({x: shapes[x] for x in fp4 if x in shapes}, gpu)
            slower = frozenset(
                x for x, ms in fp4_ms.items() if x in times and ms >= min(times[x]) * (1 - TIME_TIE)
            )
    fused = residual_fusions(plan.points, set(fp4))
    speed = objective == "speed"
    four = None
    if nvfp4:
        four = Nvfp4Measure(fp4, members, speed, NVFP4_MARGIN_DB, MIN_DB, NVFP4_MIN_DB, fused,
                            slower, label)  # fmt: skip
    choice = _decide(plan, planned, readers, measured, change=True, times=times, gpu=label,
                     nvfp4=four)  # fmt: skip
    choice = replace(choice, nvfp4=nvfp4, objective=objective)
    unchanged = _decide(plan, planned, readers, measured, change=False, times=times, gpu=label,
                        nvfp4=four)  # fmt: skip
    unchanged = replace(unchanged, nvfp4=nvfp4, objective=objective)
    n4 = {r.layer: r.nvfp4_db for r in choice.rows}

    def alternative(other: FormatChoice) -> FormatChoice:
        """A plan decided without NVFP4 (all INT8, or the 8-bit changes alone), given each
        row's NVFP4 SQNR as measured and the plan as planned (``unchanged``)."""
        rows = tuple(replace(r, nvfp4_db=n4.get(r.layer)) for r in other.rows)
        return replace(other, rows=rows, nvfp4=nvfp4, objective=objective, unchanged=unchanged)

    if objective == "accuracy":  # the single-format INT8 plan, where it measures less noise
        uniform = _all_int8(plan, planned, readers, measured)
        if uniform.overrides and uniform.noise < unchanged.noise:
            choice = replace(choice, uniform=alternative(uniform))
    if not choice.changes:
        return choice
    eight = None
    if any(r.chosen == "nvfp4" for r in choice.rows):
        eight = alternative(
            _decide(plan, planned, readers, measured, change=True, times=times, gpu=label)
        )
    return replace(choice, unchanged=unchanged, without_nvfp4=eight)


def _module(prepared: nn.Module, owner: str) -> nn.Module | None:
    """The module a plan owner names (``None``: a functional op's owner)."""
    try:
        return prepared.get_submodule(owner)
    except AttributeError:
        return None


def _decide(
    plan: Any,
    planned: dict[str, str],
    readers: dict[str, list[str]],
    noise: dict[str, tuple[float, float]],
    *,
    change: bool,
    times: dict[str, tuple[float, float]] | None = None,
    gpu: str = "",
    nvfp4: Nvfp4Measure | None = None,
) -> FormatChoice:
    """The formats of the measured layers from their ``noise`` (INT8, FP8 relative noise) and,
    where both formats are equally accurate, their predicted ``times`` (INT8, FP8 ms) on ``gpu``;
    ``nvfp4``: the NVFP4 measurement (a target with NVFP4 kernels); ``change=False``: every layer
    left in its planned format (no move, no FP16)."""
    times = times or {}
    rows, overrides = [], []
    fours = nvfp4.outcomes(readers, noise, planned) if nvfp4 else {}
    for tensor, layers in sorted(readers.items()):
        measured = [x for x in layers if x in noise]
        if not measured:
            continue
        blocked = [x for x in layers if x not in noise]  # a reader with no FP8 choice
        gains = [db(noise[x][1]) - db(noise[x][0]) for x in measured]
        now = {planned[x] for x in measured}
        other = "int8" if now == {"fp8"} else "fp8"
        sign = 1.0 if other == "fp8" else -1.0  # the other format's gain, in dB
        mean = sign * sum(gains) / len(gains)
        better = mean >= MARGIN_DB
        free = not blocked and len(now) == 1  # the tensor can change format
        timed = _by_time(measured, times, other) if free and abs(mean) < MARGIN_DB else None
        four = fours.get(tensor, Nvfp4Outcome())
        move = change and free and not four.to and (better or timed == other)
        for x, gain in zip(measured, gains, strict=True):
            i8, f8 = db(noise[x][0]), db(noise[x][1])
            here, gain = planned[x], sign * gain
            ms = times.get(x)
            rule = "F07"
            dbs = f"{i8:.1f} dB in INT8, {f8:.1f} dB in FP8" + (
                f", {four.own[x]:.1f} dB in NVFP4" if x in four.own else ""
            )
            if change and four.to and x in four.keep:
                chosen, why, rule = "nvfp4", four.why(x, i8, f8), four.rule(x)
                overrides.append(Override(name=x, format="nvfp4"))
            elif four.best(x, i8, f8) < MIN_DB and change:
                chosen, why = "fp16", f"{dbs}: below {MIN_DB:g}"
                overrides.append(Override(name=x, exclude=True))
            elif move:
                chosen = other
                if better:
                    why = f"{other.upper()} {gain:+.1f} dB over {here.upper()} (its input's readers move too)"
                else:
                    why, rule = _timed_why(i8, f8, other, ms, gpu, len(measured)), "T02"
                overrides.append(Override(name=x, format=other))
            elif not change and (
                four.best(x, i8, f8) < MIN_DB
                or (free and (better or timed == other))
                or (four.to and x in four.keep)
            ):
                chosen = here
                why = f"{dbs}, but a change of format would cost reformats at its format boundaries"
            elif blocked or len(now) > 1:  # a reader that cannot move, or one in the other format
                chosen, why = here, _held(layers, noise, planned, here)
            elif timed == here:
                chosen = here
                why, rule = _timed_why(i8, f8, here, ms, gpu, len(measured)), "T02"
            else:
                chosen = here
                why = (
                    f"{other.upper()} {gain:+.1f} dB: not {MARGIN_DB:g} dB better on its input's "
                    "readers"
                )
                if timed == "same" and ms is not None:
                    why += (
                        f"; predicted as fast in either format on {gpu} ({ms[0]:.4f} ms INT8, "
                        f"{ms[1]:.4f} ms FP8: within {TIME_TIE:.0%}), so its planned format, "
                        "which adds no format boundary"
                    )
            if chosen != "nvfp4" and x in four.own and (no := four.not_why(x, chosen == "fp16")):
                why += f"; {no}"
            i8_ms, f8_ms = (None, None) if ms is None else (round(ms[0], 5), round(ms[1], 5))
            n4 = round(four.own[x], 2) if x in four.own else None
            rows.append(FormatRow(x, tensor, round(i8, 2), round(f8, 2), here, chosen, why,
                                  rule, i8_ms, f8_ms, n4))  # fmt: skip
    followed = _attention_follows(plan, planned, rows)
    overrides += [Override(name=owner, format="int8") for owner in followed]
    return FormatChoice(tuple(rows), tuple(overrides), followed, timed_on=gpu if times else "")


def _all_int8(
    plan: Any,
    planned: dict[str, str],
    readers: dict[str, list[str]],
    noise: dict[str, tuple[float, float]],
) -> FormatChoice:
    """The measured layers all INT8 where their input tensor can change format (each reader
    measured, all planned alike), none in FP16 or NVFP4: the single-format plan the accuracy
    objective weighs against the measured changes. Where no weighted layer stays FP8 the
    attention products follow (:func:`_attention_follows`), as in ``format="int8"``."""
    rows, overrides = [], []
    for tensor, layers in sorted(readers.items()):
        measured = [x for x in layers if x in noise]
        if not measured:
            continue
        free = len(measured) == len(layers) and len({planned[x] for x in measured}) == 1
        for x in measured:
            i8, f8 = db(noise[x][0]), db(noise[x][1])
            here = planned[x]
            if here == "int8":
                chosen, why = here, f"INT8 as planned ({i8:.1f} dB in INT8, {f8:.1f} dB in FP8)"
            elif free:
                chosen, why = (
                    "int8",
                    f"INT8 {i8 - f8:+.1f} dB over {here.upper()}: the all-INT8 plan",
                )
                overrides.append(Override(name=x, format="int8"))
            else:
                chosen, why = here, _held(layers, noise, planned, here)
            rows.append(FormatRow(x, tensor, round(i8, 2), round(f8, 2), here, chosen, why))
    followed = _attention_follows(plan, planned, rows)
    overrides += [Override(name=owner, format="int8") for owner in followed]
    return FormatChoice(tuple(rows), tuple(overrides), followed, single="int8")


def _held(layers: list[str], noise: dict[str, Any], planned: dict[str, str], here: str) -> str:
    """Why a reader of an input tensor keeps its format ``here``: the tensor's first reader with
    no other format (not measured), else its first reader planned in the other one."""
    stuck = next((y for y in layers if y not in noise), None) or next(
        y for y in layers if planned[y] != here
    )
    return f"its input is also read by {stuck}, which cannot change format with it"


def _row_noise(row: FormatRow) -> float:
    """A row's relative noise in its chosen format (FP16: none)."""
    by = {"int8": row.int8_db, "fp8": row.fp8_db, "nvfp4": row.nvfp4_db}.get(row.chosen)
    return 0.0 if by is None else 10.0 ** (-by / 10.0)


def _by_time(measured: list[str], times: dict[str, tuple[float, float]], other: str) -> str | None:
    """The format ``measured`` (an input tensor's readers) are predicted faster in together:
    ``"int8"``, ``"fp8"``, ``"same"`` within :data:`~qdq.accuracy.format_time.TIME_TIE`, or
    ``None`` when one of them was not timed (no GPU given, its shapes not seen)."""
    if not times or any(x not in times for x in measured):
        return None
    fast = faster(sum(times[x][0] for x in measured), sum(times[x][1] for x in measured))
    return fast or "same"


def _timed_why(
    i8: float, f8: float, fast: str, ms: tuple[float, float] | None, gpu: str, readers: int
) -> str:
    """A T02 row's reason: equally accurate, ``fast`` predicted faster on ``gpu``."""
    assert ms is not None
    mine, theirs = (ms[0], ms[1]) if fast == "int8" else (ms[1], ms[0])
    slow = "FP8" if fast == "int8" else "INT8"
    return (
        f"INT8 and FP8 equally accurate ({i8:.1f} vs {f8:.1f} dB: neither {MARGIN_DB:g} dB "
        f"better); {fast.upper()} predicted faster on {gpu}: {mine:.4f} vs {theirs:.4f} ms "
        f"{slow}" + (f" (its input's {readers} readers together)" if readers > 1 else "")
    )


def _attention_follows(
    plan: Any, planned: dict[str, str], rows: list[FormatRow]
) -> tuple[str, ...]:
    """The FP8 attention products (rule F01, no weight) that go INT8 with the GEMMs: when no
    weighted layer stays FP8, FP8 attention would be an island whose every operand and output
    crosses a format boundary (a reformat each; ViT-tiny: 86 unfused Q/DQ against the INT8 plan's
    74). The INT8 placement already quantized these products, so INT8 runs them (P16)."""
    final = dict(planned)
    final.update({r.layer: r.chosen for r in rows})
    if any(fmt in ("fp8", "nvfp4") for fmt in final.values()):  # NVFP4 plans: FP8 attention
        return ()
    products = {
        p.owner
        for p in plan.points
        if p.op == "matmul" and p.kind == "input" and p.owner not in planned and p.quantized
        and p.spec is not None and p.spec.format == "fp8"
    }  # fmt: skip
    return tuple(sorted(products))
