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

The measure is the layer's own noise, not the network's metric: cheap (one forward of one batch,
no re-calibration) and the same quantity ``qdq debug`` reports per layer. INT8's noise on a
tensor with outliers (a few values far above the rest: the activation outliers of transformers,
some depthwise-heavy ConvNets) is what FP8's logarithmic grid avoids.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
from torch import nn

from qdq.accuracy.format_time import TIME_TIE, faster, format_times, shape_of
from qdq.calib.batches import expected_inputs, run_batch
from qdq.config import Override
from qdq.graph.plan import QuantPoint
from qdq.quant import Quantizer, QuantMode, fake_quant

__all__ = ["MARGIN_DB", "MIN_DB", "FormatChoice", "FormatRow", "choose_formats"]

#: FP8 must beat INT8 by this many dB (its noise at most half INT8's) for a tensor to move
MARGIN_DB = 3.0
#: below this SQNR in both formats a layer is kept in FP16 (its quantization noise is 1 % of the
#: signal's power or more)
MIN_DB = 20.0


@dataclass(frozen=True)
class FormatRow:
    """One weighted layer of a mixed plan that could run INT8 or FP8.

    Attributes:
        layer: the layer (the plan's owner name).
        tensor: the input quantizer it shares with the other readers of its input.
        int8_db / fp8_db: the SQNR of its input and weight quantization together, in each format.
        planned: its format before the measure (F07: convolutions INT8, GEMMs FP8).
        chosen: ``"int8"``, ``"fp8"`` or ``"fp16"``.
        reason: one line.
        rule: what decided: ``"F07"`` (the measure), ``"T02"`` (equally accurate: the format
            predicted faster, when a GPU was given).
        int8_ms / fp8_ms: its predicted time in each format (``None``: not timed).
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

    @property
    def changes(self) -> tuple[FormatRow, ...]:
        """The measured layers that leave their planned format (to the other one, or FP16)."""
        return tuple(r for r in self.rows if r.chosen != r.planned)

    def summary(self) -> str:
        """One line: how many layers went where."""
        by_noise = [r for r in self.rows if r.rule != "T02"]
        to_fp8 = sum(r.planned == "int8" and r.chosen == "fp8" for r in by_noise)
        to_int8 = sum(r.planned == "fp8" and r.chosen == "int8" for r in by_noise)
        fp16 = sum(r.chosen == "fp16" for r in self.rows)
        timed = [r for r in self.rows if r.rule == "T02"]
        return (
            f"{len(self.rows)} layers measured: {to_fp8} moved INT8 -> FP8, {to_int8} FP8 -> INT8 "
            f"(the other format better by >= {MARGIN_DB:g} dB on every reader of their input), "
            f"{fp16} kept in FP16 (< {MIN_DB:g} dB in both formats)"
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

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (the report's ``formats``)."""
        return {
            "summary": self.summary(),
            "rows": [asdict(r) for r in self.rows],
            "followed": list(self.followed),
            "reformats": dict(self.reformats),
            "dropped": self.dropped,
            "timed_on": self.timed_on,
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


def choose_formats(prepared: nn.Module, batch: Any, *, gpu: Any = None) -> FormatChoice:
    """Measure the INT8 convolutions of a calibrated mixed plan (rule F07) in INT8 and FP8 on one
    calibration ``batch``; return the layers that move and the overrides that move them (and,
    when any layer changes, :attr:`FormatChoice.unchanged` from the same measurement).
    ``gpu`` (a :class:`~qdq.lint.speed.gpus.GPU`): a tensor equally accurate in both formats
    takes the one its readers are predicted faster in (rule T02, the module docstring).

    Raises:
        ValueError: ``prepared`` is not a calibrated plan of ``QuantConfig(format="mixed")``.
    """
    import qdq

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
    for p in plan.points:
        group = plan.groups[p.group] if p.group is not None else None
        if group is None or not p.format_rule:
            continue
        if p.kind == "weight":
            weights[p.owner] = group.quantizer
            axes[group.quantizer] = _weight_axes(p)
        elif p.op in ("conv", "conv_transpose", "linear", "matmul"):
            reads[p.owner] = group.quantizer
            readers.setdefault(group.quantizer, []).append(p.owner)
    wanted = {reads[c] for c in candidates if c in reads} | {weights[c] for c in candidates}
    modules = (
        {} if gpu is None else {c: m for c in candidates if (m := _module(prepared, c)) is not None}
    )
    outputs: dict[str, tuple[int, ...]] = {}
    seen = _inputs(prepared, {path: quantizers[path] for path in wanted}, batch, modules, outputs)
    noise: dict[str, tuple[float, float]] = {}
    for layer in candidates:
        if layer not in reads or reads[layer] not in seen or weights[layer] not in seen:
            continue
        act, w = reads[layer], weights[layer]
        a8, af = _noise(quantizers[act], seen[act])
        w8, wf = _weight_noise(seen[w], *axes[w])
        noise[layer] = (a8 + w8, af + wf)
    times: dict[str, tuple[float, float]] = {}
    label = ""
    if gpu is not None:
        shapes = {
            layer: shape
            for layer in noise
            if (shape := shape_of(modules.get(layer), tuple(seen[reads[layer]].shape),
                                  tuple(seen[weights[layer]].shape), outputs.get(layer)))
        }  # fmt: skip
        times, label = format_times(shapes, gpu), str(gpu.label)
    choice = _decide(plan, planned, readers, noise, change=True, times=times, gpu=label)
    if not choice.changes:
        return choice
    unchanged = _decide(plan, planned, readers, noise, change=False, times=times, gpu=label)
    return replace(choice, unchanged=unchanged)


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
) -> FormatChoice:
    """The formats of the measured layers from their ``noise`` (INT8, FP8 relative noise) and,
    where both formats are equally accurate, their predicted ``times`` (INT8, FP8 ms) on ``gpu``;
    ``change=False``: every layer left in its planned format (no move, no FP16)."""
    times = times or {}
    rows, overrides = [], []
    for tensor, layers in sorted(readers.items()):
        measured = [x for x in layers if x in noise]
        if not measured:
            continue
        blocked = [x for x in layers if x not in noise]  # a reader with no FP8 choice
        gains = [_db(noise[x][1]) - _db(noise[x][0]) for x in measured]
        now = {planned[x] for x in measured}
        other = "int8" if now == {"fp8"} else "fp8"
        sign = 1.0 if other == "fp8" else -1.0  # the other format's gain, in dB
        mean = sign * sum(gains) / len(gains)
        better = mean >= MARGIN_DB
        free = not blocked and len(now) == 1  # the tensor can change format
        timed = _by_time(measured, times, other) if free and abs(mean) < MARGIN_DB else None
        move = change and free and (better or timed == other)
        for x, gain in zip(measured, gains, strict=True):
            i8, f8 = _db(noise[x][0]), _db(noise[x][1])
            here, gain = planned[x], sign * gain
            ms = times.get(x)
            rule = "F07"
            if max(i8, f8) < MIN_DB and change:
                chosen, why = "fp16", f"{i8:.1f} dB in INT8, {f8:.1f} dB in FP8: below {MIN_DB:g}"
                overrides.append(Override(name=x, exclude=True))
            elif move:
                chosen = other
                if better:
                    why = f"{other.upper()} {gain:+.1f} dB over {here.upper()} (its input's readers move too)"
                else:
                    why, rule = _timed_why(i8, f8, other, ms, gpu, len(measured)), "T02"
                overrides.append(Override(name=x, format=other))
            elif not change and (max(i8, f8) < MIN_DB or (free and (better or timed == other))):
                chosen = here
                why = (
                    f"{i8:.1f} dB in INT8, {f8:.1f} dB in FP8, but a change of format would cost "
                    "reformats at its format boundaries"
                )
            elif blocked or len(now) > 1:  # a reader that cannot move, or one in the other format
                chosen = here
                stuck = blocked[0] if blocked else next(y for y in measured if planned[y] != here)
                why = f"its input is also read by {stuck}, which cannot change format with it"
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
            i8_ms, f8_ms = (None, None) if ms is None else (round(ms[0], 5), round(ms[1], 5))
            rows.append(FormatRow(x, tensor, round(i8, 2), round(f8, 2), here, chosen, why,
                                  rule, i8_ms, f8_ms))  # fmt: skip
    followed = _attention_follows(plan, planned, rows)
    overrides += [Override(name=owner, format="int8") for owner in followed]
    return FormatChoice(tuple(rows), tuple(overrides), followed, timed_on=gpu if times else "")


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
    if any(fmt == "fp8" for fmt in final.values()):
        return ()
    products = {
        p.owner
        for p in plan.points
        if p.op == "matmul" and p.kind == "input" and p.owner not in planned and p.quantized
        and p.spec is not None and p.spec.format == "fp8"
    }  # fmt: skip
    return tuple(sorted(products))


def _inputs(
    prepared: nn.Module,
    quantizers: dict[str, Quantizer],
    batch: Any,
    modules: dict[str, nn.Module] | None = None,
    outputs: dict[str, tuple[int, ...]] | None = None,
) -> dict[str, torch.Tensor]:
    """What each quantizer of ``quantizers`` reads on ``batch`` (its first call); the shape each
    of ``modules`` writes (its first call) into ``outputs``."""
    seen: dict[str, torch.Tensor] = {}
    shapes = {} if outputs is None else outputs

    def post(name: str) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...], out: Any) -> None:
            if name not in shapes and isinstance(out, torch.Tensor):
                shapes[name] = tuple(out.shape)

        return hook

    def hook(path: str) -> Any:
        def pre(module: nn.Module, args: tuple[Any, ...]) -> None:
            if path not in seen and isinstance(args[0], torch.Tensor):
                seen[path] = args[0].detach().float().cpu()

        return pre

    handles = [q.register_forward_pre_hook(hook(p)) for p, q in quantizers.items()]
    handles += [m.register_forward_hook(post(n)) for n, m in (modules or {}).items()]
    was_training = prepared.training
    try:
        prepared.eval()
        with torch.no_grad():
            run_batch(prepared, batch, 0, expected_inputs(prepared))
    finally:
        for h in handles:
            h.remove()
        prepared.train(was_training)
    return seen


def _weight_axes(p: QuantPoint) -> tuple[int | None, int | None]:
    """The axis of a weight point in INT8 and in FP8 (``None``: per tensor): its own in its
    format; in the other, what the plan gives it there. An INT8 convolution (F07) would be FP8
    per tensor (F06). FP8 GEMM weights per channel (``fp8_gemm_per_channel``) keep INT8's axis;
    per tensor, INT8's is the output axis: 0 for a Linear, the last for a MatMul's parameter."""
    assert p.spec is not None
    axis = p.spec.axis
    if p.spec.format == "int8":
        return axis, None
    if axis is not None:
        return axis, axis
    return (0 if p.op == "linear" else -1), None


def _weight_noise(
    x: torch.Tensor, int8_axis: int | None, fp8_axis: int | None
) -> tuple[float, float]:
    """The relative quantization noise (noise power over signal power) of a weight in INT8 and
    in FP8, each at its abs-max along its axis (``None``: per tensor)."""
    power = float(x.square().mean())
    if power == 0.0:
        return 0.0, 0.0
    out = []
    for fmt, axis in (("int8", int8_axis), ("fp8", fp8_axis)):
        if axis is None or x.dim() < 2:
            q = fake_quant(x, x.abs().max(), fmt=fmt)
        else:
            ax = axis % x.dim()
            amax = x.abs().amax(dim=[d for d in range(x.dim()) if d != ax])
            q = fake_quant(x, amax, axis=ax, fmt=fmt)
        out.append(float((x - q).square().mean()) / power)
    return out[0], out[1]


def _noise(q: Quantizer, x: torch.Tensor) -> tuple[float, float]:
    """The relative quantization noise (noise power over signal power) of an activation ``x`` by
    ``q`` in INT8 and in FP8, whichever format ``q`` is: INT8 at its mse amax (the calibrated
    one, or mse on INT8's grid from the same histogram) and FP8 at the abs-max of every
    calibration batch."""
    power = float(x.square().mean())
    if power == 0.0 or q.mode is not QuantMode.QUANTIZE or not q.is_calibrated:
        return 0.0, 0.0
    top = _stat(q, "max", x.abs().max())
    calibrated = q.amax.detach().float().cpu().reshape(())
    int8 = fake_quant(x, calibrated if q.spec.format == "int8" else _int8_mse(q, top))
    fp8 = fake_quant(x, top, fmt="fp8")
    return float((x - int8).square().mean()) / power, float((x - fp8).square().mean()) / power


def _stat(q: Quantizer, method: str, default: torch.Tensor) -> torch.Tensor:
    """``q``'s calibrator's amax by ``method`` over every calibration batch (``default`` when it
    kept no statistics)."""
    try:
        return q.calibrator.compute_amax(method).detach().float().cpu().reshape(())
    except (ValueError, TypeError, AttributeError):
        return default.reshape(())


def _int8_mse(q: Quantizer, top: torch.Tensor) -> torch.Tensor:
    """The amax INT8's mse would choose from an FP8 quantizer's histogram."""
    from qdq.calib.methods import mse_amax

    histogram = getattr(q.calibrator, "histogram", None)
    if histogram is None:
        return top
    try:
        counts, edges = histogram()
    except ValueError:
        return top
    return torch.tensor(mse_amax(counts, edges, observed_max=float(top)), dtype=torch.float32)


def _db(relative: float) -> float:
    return math.inf if relative <= 0.0 else -10.0 * math.log10(relative)
