"""What :func:`qdq.accuracy.formats.choose_formats` measures: a weighted layer's quantization noise
in INT8, FP8 and (on targets with NVFP4 kernels, issue 60) NVFP4.

Each figure is a relative noise (noise power over signal power) of one tensor on one calibration
batch; a layer's figure in a format is its input's plus its weight's (independent noises add),
shown as an SQNR in dB (:func:`db`).

* INT8: the input at its mse amax (the calibrated one, or mse on INT8's grid from the FP8
  quantizer's histogram), the weight per output channel.
* FP8: the input at the abs max of every calibration batch (TensorRT's FP8 recipes), the weight
  per tensor (or per channel where the target scales FP8 GEMMs so).
* NVFP4 (GEMMs whose K is a multiple of 16 and N at least 16, :func:`nvfp4_gemm`): the input in
  blocks of 16 along its last axis under the same abs max as its per-tensor amax (what an NVFP4
  input calibrates: its block scales are dynamic), the weight in blocks of 16 along its reduction
  axis under its own abs max, as :func:`qdq.quant.blocks.block_fake_quant` computes them (the
  exported graph's arithmetic).

Measured on 256 x 768 tensors (input and weight together, Gaussian weight): a Gaussian layer
measures about 17.4 dB in NVFP4 (20.4 dB each tensor), 28.5 dB in FP8 and 38 dB in INT8;
Laplace, Student-t (3 degrees of freedom), uniform and outlier-channel (x60, x300) inputs
17.1-18.5 dB in NVFP4, whose per-block scales keep it near 20 dB per tensor where INT8 per tensor
falls to 15-19 dB. Under a per-tensor amax far above the batch's values (a spike in another
calibration batch) FP8's fixed grid runs out of range first: amax 10^4 times the batch's, FP8
24.8 dB and NVFP4 20.4 dB on the tensor; 10^5, FP8 4.8 dB and NVFP4 17.7 dB (its E4M3 block
scales turn subnormal). The GEMMs of ``tests/test_mixed_nvfp4.py``'s tiny transformer measure
17.0-18.4 dB in NVFP4.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from qdq.calib.batches import expected_inputs, run_batch
from qdq.graph.plan import QuantPoint
from qdq.quant import Quantizer, QuantMode, fake_quant
from qdq.quant.blocks import NVFP4, block_fake_quant

__all__ = [
    "Nvfp4Measure",
    "Nvfp4Outcome",
    "db",
    "inputs_seen",
    "noise",
    "nvfp4_gemm",
    "nvfp4_input_noise",
    "nvfp4_weight_noise",
    "residual_fusions",
    "stat",
    "weight_axes",
    "weight_noise",
]

#: the least output width of an NVFP4 GEMM (TensorRT's FP4 tensor-core tile; rule F11)
NVFP4_MIN_N = 16


def db(relative: float) -> float:
    """A relative noise as an SQNR in dB (``inf`` for none).

    Example:
        >>> db(0.01), db(0.0)
        (20.0, inf)
    """
    return math.inf if relative <= 0.0 else -10.0 * math.log10(relative)


def nvfp4_gemm(
    op: str, x: torch.Tensor, w: torch.Tensor, axes: tuple[int | None, int | None]
) -> int | None:
    """The weight's reduction axis (negative) when the GEMM ``op`` (``"linear"`` or ``"matmul"``)
    reading ``x`` with weight ``w`` can run NVFP4 (rules F11/F12: K a multiple of 16, N at least
    16); ``None`` when it cannot (a convolution, K or N off, a weight whose reduction axis is not
    found). ``axes``: the weight's INT8 and FP8 axes (:func:`weight_axes`), which tell a square
    MatMul parameter's output axis.

    Example:
        >>> nvfp4_gemm("linear", torch.zeros(2, 64), torch.zeros(32, 64), (0, None))
        -1
        >>> nvfp4_gemm("linear", torch.zeros(2, 40), torch.zeros(32, 40), (0, None)) is None
        True
    """
    if op not in ("linear", "matmul") or x.dim() < 1 or w.dim() < 2:
        return None
    k = int(x.shape[-1])
    if op == "linear":
        red = -1
    else:
        fits = [a for a in (-2, -1) if int(w.shape[a]) == k]
        out = axes[0]
        if len(fits) == 2 and out is not None and w.dim() == 2:
            red = -1 if out % 2 == 0 else -2  # the axis that is not the output column
        elif fits:
            red = fits[0]
        else:
            return None
    if int(w.shape[red]) != k or k % int(NVFP4.block_size or 16):
        return None
    n = w.numel() // max(k, 1)
    return red if n >= NVFP4_MIN_N else None


def nvfp4_input_noise(q: Quantizer, x: torch.Tensor) -> float:
    """The relative noise of an activation ``x`` in NVFP4 (blocks of 16 along its last axis)
    under the per-tensor amax an NVFP4 input calibrates (max over every calibration batch)."""
    power = float(x.square().mean())
    if power == 0.0 or q.mode is not QuantMode.QUANTIZE or not q.is_calibrated:
        return 0.0
    top = stat(q, "max", x.abs().max())
    out = block_fake_quant(x, NVFP4, top, -1)
    return float((x - out).square().mean()) / power


def nvfp4_weight_noise(w: torch.Tensor, axis: int) -> float:
    """The relative noise of a weight in NVFP4, blocked along its reduction ``axis``."""
    power = float(w.square().mean())
    if power == 0.0:
        return 0.0
    return float((w - block_fake_quant(w, NVFP4, None, axis)).square().mean()) / power


def inputs_seen(
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


def weight_axes(p: QuantPoint) -> tuple[int | None, int | None]:
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


def weight_noise(
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


def noise(q: Quantizer, x: torch.Tensor) -> tuple[float, float]:
    """The relative quantization noise (noise power over signal power) of an activation ``x`` by
    ``q`` in INT8 and in FP8, whichever format ``q`` is: INT8 at its mse amax (the calibrated
    one, or mse on INT8's grid from the same histogram) and FP8 at the abs-max of every
    calibration batch."""
    power = float(x.square().mean())
    if power == 0.0 or q.mode is not QuantMode.QUANTIZE or not q.is_calibrated:
        return 0.0, 0.0
    top = stat(q, "max", x.abs().max())
    calibrated = q.amax.detach().float().cpu().reshape(())
    int8 = fake_quant(x, calibrated if q.spec.format == "int8" else _int8_mse(q, top))
    fp8 = fake_quant(x, top, fmt="fp8")
    return float((x - int8).square().mean()) / power, float((x - fp8).square().mean()) / power


def stat(q: Quantizer, method: str, default: torch.Tensor) -> torch.Tensor:
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


def residual_fusions(points: Any, gemms: set[str]) -> dict[str, str]:
    """Each residual Add whose skip is quantized (rule P03) -> the GEMM of ``gemms`` it fuses
    into: the one its fused operand's point (skipped, P03) names as its branch."""
    by_site: dict[str, list[QuantPoint]] = {}
    for p in points:
        if p.op == "add" and p.kind == "input" and p.rule == "P03":
            by_site.setdefault(p.consumer, []).append(p)
    out = {}
    for site in by_site.values():
        skipped = [p for p in site if p.decision == "skip"]
        if len(site) != 2 or len(skipped) != 1:
            continue
        named = [
            g
            for g in gemms
            if re.search(rf"(?<![\w.]){re.escape(g)}(?!\w|\.\w)", skipped[0].reason)
        ]
        if len(named) == 1:
            out[skipped[0].owner] = named[0]
    return out


# ----------------------------------------------------------------- the NVFP4 choice per tensor
@dataclass(frozen=True)
class Nvfp4Measure:
    """What :func:`qdq.accuracy.formats.choose_formats` weighs NVFP4 by.

    Attributes:
        noise: each NVFP4-capable layer's relative noise in NVFP4 (input and weight).
        members: each input quantizer -> the owners of its scale group (one Quantize per
            tensor: NVFP4 only when all of them can run it, F14).
        speed: ``objective="speed"``: the floor applies.
        margin / min_db / floor: the mixed plan's ``MARGIN_DB``, ``MIN_DB`` and
            ``NVFP4_MIN_DB``.
        fused: a residual Add whose skip shares a tensor's Quantize -> the GEMM it fuses into
            (:func:`residual_fusions`): the skip reads float beside that GEMM when it runs
            NVFP4 (F15), so the tensor may run NVFP4 when that GEMM does.
        slower: the layers predicted no faster in NVFP4 than in the faster 8-bit format on the
            target's GPU (:func:`qdq.accuracy.format_time.nvfp4_times`): the speed floor does not
            take a tensor any of them reads (T02: NVFP4 for speed only where it is faster).
        gpu: that GPU's name, for the reasons.
    """

    noise: dict[str, float]
    members: dict[str, frozenset[str]]
    speed: bool
    margin: float
    min_db: float
    floor: float
    fused: dict[str, str] = field(default_factory=dict)
    slower: frozenset[str] = frozenset()
    gpu: str = ""

    def outcomes(
        self,
        readers: dict[str, list[str]],
        noise: dict[str, tuple[float, float]],
        planned: dict[str, str],
    ) -> dict[str, Nvfp4Outcome]:
        """:meth:`outcome` of every input tensor (``readers``: tensor -> its weighted readers;
        ``noise``: the measured ones' INT8 and FP8 noise; ``planned``: their formats), then to a
        fixed point: a tensor that shares its Quantize with a residual Add fused into a GEMM
        runs NVFP4 only when that GEMM does."""
        out = {}
        for tensor, layers in readers.items():
            measured = [x for x in layers if x in noise]
            blocked = [x for x in layers if x not in noise]
            free = not blocked and len({planned[x] for x in measured}) == 1
            if measured:
                out[tensor] = self.outcome(tensor, measured, noise, blocked, free)
        while True:
            nvfp4 = {x for o in out.values() for x in o.keep}
            late = {
                t: o for t, o in out.items() if o.keep and any(g not in nvfp4 for _, g in o.needs)
            }
            if not late:
                return out
            for t, o in late.items():
                add, gemm = next((a, g) for a, g in o.needs if g not in nvfp4)
                why = (
                    f"its Quantize is also read by {add}, a residual Add fused into {gemm}, "
                    "which does not run NVFP4 (F14, F15)"
                )
                out[t] = Nvfp4Outcome(own=o.own, blocker=why, measure=self)

    def outcome(
        self,
        tensor: str,
        measured: list[str],
        noise: dict[str, tuple[float, float]],
        blocked: list[str],
        free: bool,
    ) -> Nvfp4Outcome:
        """Whether ``tensor`` (read by ``measured``, whose INT8 and FP8 relative ``noise`` is
        given, and by ``blocked`` that cannot change format; ``free``: its readers can change
        format together) runs NVFP4: when it can (every reader an NVFP4-capable GEMM, its scale
        group theirs alone), NVFP4 within ``margin`` of the better 8-bit format on average over
        its readers (those not under ``min_db`` in every format: FP16), or (speed) at least
        ``floor`` dB on each and none of them predicted slower in NVFP4 (:attr:`slower`)."""
        own = {x: db(self.noise[x]) for x in measured if x in self.noise}
        if not own:
            return Nvfp4Outcome()
        missing = [x for x in measured if x not in self.noise]
        others = self.members.get(tensor, frozenset()) - set(measured)
        needs = tuple(sorted((a, self.fused[a]) for a in others if a in self.fused))
        shared = sorted(a for a in others if a not in self.fused)
        blocker = (
            f"its input is also read by {blocked[0]}, which cannot change format with it"
            if blocked
            else "its input's readers are planned in different formats"
            if not free
            else f"its input is also read by {missing[0]}, which cannot run NVFP4 (K not a "
            "multiple of 16 or N < 16)"
            if missing
            else f"its Quantize is also read by {shared[0]}, which cannot run NVFP4 (F14)"
            if shared
            else ""
        )
        if blocker:
            return Nvfp4Outcome(own=own, blocker=blocker, measure=self)
        i8 = {x: db(noise[x][0]) for x in measured}
        f8 = {x: db(noise[x][1]) for x in measured}
        fine = tuple(x for x in measured if max(i8[x], f8[x], own[x]) >= self.min_db)
        pool = fine or tuple(measured)
        m8 = {f: sum(v[x] for x in pool) / len(pool) for f, v in (("int8", i8), ("fp8", f8))}
        ref = max(m8.items(), key=lambda kv: kv[1])
        mean4 = sum(own[x] for x in pool) / len(pool)
        tie = fine if fine and mean4 >= ref[1] - self.margin else ()
        slow = tuple(x for x in measured if x in self.slower)
        floor = self.speed and min(own.values()) >= self.floor and not slow
        keep = tuple(measured) if floor else tie
        return Nvfp4Outcome(own, own, keep, tie, "", ref, mean4, self, needs, slow)


@dataclass(frozen=True)
class Nvfp4Outcome:
    """One input tensor's NVFP4 outcome (:meth:`Nvfp4Measure.outcome`).

    Attributes:
        own: each NVFP4-capable reader's SQNR in NVFP4.
        n4: every reader's, when the tensor can run NVFP4 (``{}`` when it cannot).
        keep: the readers that run NVFP4 (none: the tensor stays 8-bit).
        tie: the readers NVFP4 takes by accuracy (within the margin; the rest of ``keep``: by
            the speed floor).
        blocker: why the tensor cannot run NVFP4 ('' when it can).
        ref: the better 8-bit format and its mean SQNR over the readers; ``mean4``: NVFP4's.
        needs: ``(residual Add, GEMM)``: the tensor runs NVFP4 only if each GEMM does (F15).
        slow: the readers predicted no faster in NVFP4 (:attr:`Nvfp4Measure.slower`).
    """

    own: dict[str, float] = field(default_factory=dict)
    n4: dict[str, float] = field(default_factory=dict)
    keep: tuple[str, ...] = ()
    tie: tuple[str, ...] = ()
    blocker: str = ""
    ref: tuple[str, float] = ("int8", 0.0)
    mean4: float = 0.0
    measure: Nvfp4Measure | None = None
    needs: tuple[tuple[str, str], ...] = ()
    slow: tuple[str, ...] = ()

    @property
    def to(self) -> bool:
        """Whether the tensor runs NVFP4."""
        return bool(self.keep)

    def best(self, x: str, i8: float, f8: float) -> float:
        """``x``'s best SQNR in a format its input can run."""
        return max(i8, f8, self.n4.get(x, -math.inf))

    def rule(self, x: str) -> str:
        """F07: NVFP4 by accuracy; T02: by the speed floor alone."""
        return "F07" if x in self.tie else "T02"

    def why(self, x: str, i8: float, f8: float) -> str:
        """Why ``x`` runs NVFP4."""
        assert self.measure is not None
        on = f"predicted faster on {self.measure.gpu}" if self.measure.gpu else "the faster format"
        fast = f"{on} on Blackwell's GEMMs (INT8 {i8:.1f}, FP8 {f8:.1f} dB)"
        if x not in self.tie:
            return (
                f"--objective speed: NVFP4 {self.n4[x]:.1f} dB, at least "
                f"{self.measure.floor:g} dB on every reader of its input: {fast}"
            )
        fmt, ref = self.ref
        how = "better than" if self.mean4 >= ref else f"within {self.measure.margin:g} dB of"
        return (
            f"NVFP4 {self.n4[x]:.1f} dB, {how} {fmt.upper()} on its input's readers "
            f"({self.mean4:.1f} vs {ref:.1f} dB on average): {fast}"
        )

    def not_why(self, x: str, fp16: bool) -> str:
        """Why ``x``, measured in NVFP4, does not run it (``fp16``: it stays FP16, which its
        row says already); '' when there is nothing to add."""
        assert self.measure is not None
        m, here = self.measure, f"NVFP4 {self.own[x]:.1f} dB"
        if self.blocker:
            return f"{here}, but {self.blocker}"
        if fp16:
            return f"{here}: under the {m.floor:g} dB floor too" if m.speed else ""
        fmt, ref = self.ref
        short = "less accurate than" if m.margin == 0 else f"not within {m.margin:g} dB of"
        if m.speed and self.slow and min(self.own.values()) >= m.floor:
            tail = (f", and {self.slow[0]} is predicted no faster in NVFP4 on {m.gpu} "
                    "(T02)")  # fmt: skip
        else:
            tail = f" nor >= {m.floor:g} dB on each" if m.speed else ""
        return (
            f"{here}: {short} {fmt.upper()} on its input's readers "
            f"({self.mean4:.1f} vs {ref:.1f} dB on average){tail}"
        )
