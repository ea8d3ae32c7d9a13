"""Quantization primitives with ONNX ``QuantizeLinear``/``DequantizeLinear`` semantics.

The numerics contract (design.md) in one place:

* symmetric, zero-point 0, ``scale = amax / (2**(num_bits-1) - 1)`` computed in float32;
* quantize exactly as ONNX ``QuantizeLinear``: ``x / scale`` (a division, not a multiplication by the
  inverse), round half to even, saturate to ``[-2**(b-1), 2**(b-1)-1]`` (or ``[-(2**(b-1)-1), ...]``
  with ``narrow_range``);
* dequantize exactly as ``DequantizeLinear``: ``q * scale`` in float32;
* float16/bfloat16 inputs are computed in float32 and cast back;
* FP8 (``fmt="fp8"``, E4M3FN) follows the same contract on its own grid: ``scale = amax / 448``;
  ``x / scale`` is saturated to ``[-448, 448]`` and rounded to the nearest float8 value (ties to
  even) by torch's ``float8_e4m3fn`` cast, then multiplied by the scale: ONNX ``QuantizeLinear``
  with a ``float8e4m3fn`` zero point (saturate=1) and ``DequantizeLinear`` bit for bit, signed
  zero, subnormals and NaN included (checked against ONNX Runtime over every finite E4M3 value and
  every rounding midpoint: tests/test_fp8_numerics.py). ±inf saturates to ±448·scale;
* a zero or tiny ``amax`` never produces NaN/inf: the scale is floored at :data:`MIN_SCALE`, the same
  floor the exporter writes, so torch and ONNX Runtime still agree bit for bit.

The straight-through estimator (STE) passes the gradient for ``x`` inside ``[-amax, amax]`` and zeroes
it outside. When ``amax`` requires grad, its gradient is the LSQ one: ``(q - x/scale)`` inside the
range and ``q`` outside, times ``d scale / d amax = 1/qmax``, reduced to ``amax``'s shape; with
``amax_grad="pact"`` only the clipped values contribute (``q/qmax``, about ``±1``: PACT's clip gradient).
:func:`grad_scale` multiplies a gradient without touching the value (LSQ's step-size gradient scale).

On a GPU, a per-tensor fake quantization with a fixed ``amax`` (activations, the default QAT) runs
as one fused Triton pass forward and one backward (:mod:`qdq.kernels`; the same bits, checked on each
device before first use); everything else, and everything under ``torch.compile`` (where inductor
fuses this formulation itself), runs the torch operations below.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from qdq import kernels
from qdq._numerics import MIN_AMAX, MIN_SCALE
from qdq._validate import normalize_axis

__all__ = [
    "AMAX_GRADS",
    "FP8_MAX",
    "MIN_AMAX",
    "MIN_SCALE",
    "AmaxChecks",
    "batched_amax_checks",
    "fake_quant",
    "fake_quant_eager",
    "grad_scale",
    "quant_range",
    "scale_from_amax",
]

# MIN_AMAX (the amax floor) and MIN_SCALE (the scale floor, MIN_AMAX / 127) are written in
# qdq._numerics, below this module and the fused kernels, which floor the scale with the same number.
#: The largest finite float8 E4M3FN value: an FP8 quantizer's ``qmax`` (``scale = amax / 448``).
FP8_MAX = 448.0
#: How a learned ``amax`` gets its gradient: LSQ (rounding error inside, clip outside) or PACT
#: (clipped values only).
AMAX_GRADS = ("lsq", "pact")


def quant_range(
    num_bits: int = 8, narrow_range: bool = False, fmt: str = "int8"
) -> tuple[int, int]:
    """Return the code range ``(qmin, qmax)`` of signed ``num_bits`` quantization, or of FP8
    (``fmt="fp8"``: ``(-448, 448)``, the E4M3FN grid's ends).

    Example:
        >>> quant_range(8)
        (-128, 127)
        >>> quant_range(8, narrow_range=True)
        (-127, 127)
        >>> quant_range(fmt="fp8")
        (-448, 448)
    """
    if fmt == "fp8":
        return -int(FP8_MAX), int(FP8_MAX)
    if fmt != "int8":
        raise ValueError(f"unknown quantization format {fmt!r}; choose 'int8' or 'fp8'")
    _check_num_bits(num_bits)
    qmax = 2 ** (num_bits - 1) - 1
    return (-qmax if narrow_range else -qmax - 1), qmax


def scale_from_amax(amax: torch.Tensor, num_bits: int = 8, fmt: str = "int8") -> torch.Tensor:
    """Return the float32 scale ``amax / qmax`` (``amax / 448`` for FP8), floored at
    :data:`MIN_SCALE`.

    This is the scale the exporter writes into the ONNX graph, so fake quantization in torch and
    ``QuantizeLinear`` in ONNX Runtime use the same float32 number.

    Example:
        >>> scale_from_amax(torch.tensor(127.0)).item()
        1.0
    """
    _, qmax = quant_range(num_bits, fmt=fmt)
    return _scale(amax.to(torch.float32), qmax)


def fake_quant(
    x: torch.Tensor,
    amax: torch.Tensor | float,
    *,
    num_bits: int = 8,
    axis: int | None = None,
    narrow_range: bool = False,
    fmt: str = "int8",
) -> torch.Tensor:
    """Quantize and dequantize ``x`` exactly as ONNX ``QuantizeLinear`` → ``DequantizeLinear``.

    Args:
        x: the tensor to fake-quantize (float32, float16 or bfloat16; computed in float32).
        amax: per-tensor (a number or a tensor with one element) or per-channel (a 1-D tensor with
            ``x.shape[axis]`` elements) clipping magnitude. Must be finite and non-negative.
        num_bits: signed integer width, 2..8.
        axis: the channel axis for per-channel ``amax``; ``None`` for per-tensor.
        narrow_range: saturate to ``[-qmax, qmax]`` instead of ``[-qmax-1, qmax]``.
        fmt: ``"int8"`` (integer codes) or ``"fp8"`` (float8 E4M3FN codes, ``scale = amax/448``;
            ``num_bits`` and ``narrow_range`` do not apply).

    Returns:
        A tensor of ``x``'s shape and dtype holding ``dequantize(quantize(x))``. Differentiable with the
        straight-through estimator described in the module docstring.

    Raises:
        ValueError: negative or non-finite ``amax``, ``axis`` out of range, or an ``amax`` whose size
            does not match ``x.shape[axis]``.
        TypeError: ``x`` is not a floating-point tensor.

    Example:
        >>> fake_quant(torch.tensor([0.5, 1.0, 3.0]), 1.27)
        tensor([0.5000, 1.0000, 1.2700])
        >>> fake_quant(torch.tensor([0.3, 17.0, 500.0]), 448.0, fmt="fp8")
        tensor([  0.3125,  16.0000, 448.0000])
    """
    amax_t = _as_amax_tensor(x, amax, axis)
    check_amax_values(amax_t, what="amax")
    return fake_quant_unchecked(
        x, amax_t, num_bits=num_bits, axis=axis, narrow_range=narrow_range, fmt=fmt
    )


def fake_quant_unchecked(
    x: torch.Tensor,
    amax: torch.Tensor,
    *,
    num_bits: int = 8,
    axis: int | None = None,
    narrow_range: bool = False,
    amax_grad: str = "lsq",
    scale: Callable[[], torch.Tensor] | None = None,
    fmt: str = "int8",
) -> torch.Tensor:
    """:func:`fake_quant` without the value checks on ``amax`` (no host sync, export-friendly).

    For callers that validated ``amax`` once when it was set (the :class:`~qdq.quant.Quantizer`).
    Shapes are still checked, since that costs nothing. ``amax_grad`` picks the gradient of an
    ``amax`` that requires grad (:data:`AMAX_GRADS`); the forward is the same either way.
    ``scale``: returns :func:`scale_from_amax` of this ``amax`` when the caller keeps it (a
    fixed amax: two kernels less per call), asked only where the torch path needs it (the
    fused kernels compute their own); ignored when ``amax`` requires grad.
    """
    if amax_grad not in AMAX_GRADS:
        raise ValueError(f"amax_grad must be one of {AMAX_GRADS}, got {amax_grad!r}")
    amax_t = _as_amax_tensor(x, amax, axis)
    qmin, qmax = quant_range(num_bits, narrow_range, fmt)
    fp8 = fmt == "fp8"
    if not (torch.is_grad_enabled() and (x.requires_grad or amax_t.requires_grad)) and not (
        torch.compiler.is_compiling() or torch.jit.is_tracing()
    ):  # nothing to differentiate: the values alone, without an autograd node (host time)
        return _fake_quant_values(x, amax_t, normalize_axis(axis, x.dim()), qmin, qmax, scale, fp8)
    return _FakeQuantSTE.apply(x, amax_t, axis, qmin, qmax, amax_grad == "pact", scale, fp8)


#: the kept scale of a fixed amax and its clipping bound ``scale·qmax`` (what the backward compares
#: ``|x|`` with), shaped to broadcast against a tensor of ``ndim`` dims: ``kept(ndim)``
Kept = Callable[[int], tuple[torch.Tensor, torch.Tensor]]


def fake_quant_eager(
    x: torch.Tensor,
    amax: torch.Tensor,
    ax: int | None,
    qmin: int,
    qmax: int,
    fp8: bool,
    kept: Kept,
) -> torch.Tensor:
    """:func:`fake_quant_unchecked` as the :class:`~qdq.quant.Quantizer` runs it outside
    ``torch.compile`` and tracing: what those checks, the range and the axis are was decided
    before (once per spec), ``amax`` has its shape (0-d per tensor, ``x.shape[ax]`` values along
    the normalized ``ax``), and ``kept`` serves the scale and the clipping bound, made once per
    amax value (issue 48: host time per call). The same operations, the same bits."""
    if torch.is_grad_enabled() and (x.requires_grad or amax.requires_grad):
        return _FakeQuantSTE.apply(x, amax, ax, qmin, qmax, False, None, fp8, kept)
    return _fake_quant_values(x, amax, ax, qmin, qmax, None, fp8, kept)


def grad_scale(t: torch.Tensor, factor: float) -> torch.Tensor:
    """Return ``t`` unchanged (the same values, bit for bit) whose gradient is multiplied by
    ``factor`` on the way back (LSQ scales its step-size gradient by ``1/sqrt(n·qmax)``).

    Example:
        >>> a = torch.tensor(2.0, requires_grad=True)
        >>> (grad_scale(a, 0.5) * 3).backward()
        >>> a.grad
        tensor(1.5000)
    """
    return _GradScale.apply(t, float(factor))


def check_amax_values(amax: torch.Tensor, *, what: str) -> None:
    """Raise ``ValueError`` if ``amax`` has a negative, NaN or infinite entry (naming ``what``).

    Inside :func:`batched_amax_checks` only an empty ``amax`` raises at once: the values are
    checked when the block ends, with those of every other amax, in one read back.
    """
    if amax.numel() == 0:
        raise ValueError(f"{what} is empty; calibrate first or set amax explicitly")
    pending = _PENDING.checks
    if pending is not None and not torch.compiler.is_compiling():
        pending._checked.append((amax.detach(), what))
        return
    _check_now(amax, what)


def _check_now(amax: torch.Tensor, what: str) -> None:
    bad = ~torch.isfinite(amax.detach())
    if bool(bad.any()):
        idx = bad.flatten().nonzero().flatten()[:8].tolist()
        raise ValueError(f"{what} has non-finite values at index {idx}: amax must be finite")
    neg = amax.detach() < 0
    if bool(neg.any()):
        idx = neg.flatten().nonzero().flatten()[:8].tolist()
        raise ValueError(f"{what} has negative values at index {idx}: amax must be >= 0")


class AmaxChecks:
    """The amax checks deferred by :func:`batched_amax_checks`, and the amax it watches."""

    def __init__(self) -> None:
        self._checked: list[tuple[torch.Tensor, str]] = []
        self._watched: dict[str, torch.Tensor] = {}
        #: after the block: the largest entry of each watched amax, by key (float32 values)
        self.largest: dict[str, float] = {}

    def watch(self, key: str, amax: torch.Tensor) -> None:
        """Read ``max(amax)`` back with the checks, into :attr:`largest` ``[key]``."""
        self._watched[key] = amax.detach()

    def _run(self) -> None:
        """One read back per device of one flag (any NaN/inf/negative entry among the checked
        amax) and the maxima of the watched ones; the first bad amax raises as
        :func:`check_amax_values` would have (read again, the error path only)."""
        devices = {t.device for t, _ in self._checked} | {t.device for t in self._watched.values()}
        bad = False
        for device in devices:
            checked = [t.reshape(-1) for t, _ in self._checked if t.device == device]
            keys = [k for k, t in self._watched.items() if t.device == device]
            parts = []
            if checked:
                v = torch.cat(checked)
                parts.append(((~torch.isfinite(v)) | (v < 0)).any().to(torch.float64).reshape(1))
            parts += [self._watched[k].max().to(torch.float64).reshape(1) for k in keys]
            read = torch.cat(parts).tolist()  # the one read back
            bad = bad or bool(checked and read[0])
            self.largest.update(zip(keys, read[len(read) - len(keys) :], strict=True))
        if bad:
            for t, what in self._checked:
                _check_now(t, what)


class _Pending(threading.local):
    def __init__(self) -> None:
        self.checks: AmaxChecks | None = None


_PENDING = _Pending()


@contextlib.contextmanager
def batched_amax_checks() -> Iterator[AmaxChecks]:
    """Defer :func:`check_amax_values` to the end of the block: then every amax checked inside is
    read back at once (one host sync per device, not two per amax), with the maxima of those
    given to :meth:`AmaxChecks.watch`. The first bad amax raises the error it would have
    raised; when the block itself raises, the amax checked before are checked first (their
    error came first). An amax is stored before it is checked, unlike outside such a block.

    Example:
        >>> with batched_amax_checks() as checks:
        ...     check_amax_values(torch.tensor(2.0), what="a")
        ...     checks.watch("b", torch.tensor([0.5, 3.0]))
        >>> checks.largest
        {'b': 3.0}
    """
    checks = AmaxChecks()
    outer, _PENDING.checks = _PENDING.checks, checks
    try:
        yield checks
    except BaseException:
        _PENDING.checks = outer
        checks._watched.clear()
        checks._run()
        raise
    _PENDING.checks = outer
    checks._run()


def _check_num_bits(num_bits: int) -> None:
    if isinstance(num_bits, bool) or not isinstance(num_bits, int):
        raise TypeError(f"num_bits must be an int, got {type(num_bits).__name__}")
    if not 2 <= num_bits <= 8:
        raise ValueError(f"num_bits must be in 2..8 (signed integer Q/DQ), got {num_bits}")


def _as_amax_tensor(x: torch.Tensor, amax: torch.Tensor | float, axis: int | None) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got dtype {x.dtype}")
    amax_t = amax if isinstance(amax, torch.Tensor) else torch.tensor(float(amax), device=x.device)
    ax = normalize_axis(axis, x.dim())
    if ax is None:
        if amax_t.numel() != 1:
            raise ValueError(
                f"per-tensor fake_quant needs a single amax, got shape {tuple(amax_t.shape)}; "
                "pass axis= for per-channel amax"
            )
        return amax_t.reshape(())
    if amax_t.numel() != x.shape[ax]:
        raise ValueError(
            f"per-channel amax has {amax_t.numel()} values but x.shape[{ax}] is {x.shape[ax]}"
        )
    return amax_t.reshape(-1)


#: float32 scalar constants per (device, value), read (never written) by :func:`_constant`'s callers
_CONSTANTS: dict[tuple[torch.device, float], torch.Tensor] = {}


def _constant(value: float, like: torch.Tensor) -> torch.Tensor:
    """A float32 scalar tensor holding ``value`` on ``like``'s device: made once per device in
    eager mode (on a GPU each new one is a kernel launch per fake-quant call), a constant under
    dynamo (a cache that grows while dynamo traces fails the frame's own guards)."""
    if torch.compiler.is_dynamo_compiling() or torch.jit.is_tracing():
        return torch.full((), value, dtype=torch.float32, device=like.device)
    return _kept_constant(value, like)


def _kept_constant(value: float, like: torch.Tensor) -> torch.Tensor:
    """:func:`_constant` where the caller knows it runs eagerly."""
    key = (like.device, value)
    const = _CONSTANTS.get(key)
    if const is None:
        const = torch.full((), value, dtype=torch.float32, device=like.device)
        if type(const) is torch.Tensor and not const.is_inference():  # not a fake tensor of
            _CONSTANTS[key] = const  # torch.export's tracing, nor an inference-mode one
    return const


def _zero(like: torch.Tensor) -> torch.Tensor:
    """A float32 ``+0.0`` scalar tensor on ``like``'s device (:func:`_constant`)."""
    return _constant(0.0, like)


def _scale(amax32: torch.Tensor, qmax: int) -> torch.Tensor:
    """``max(amax / qmax, MIN_SCALE)`` with an IEEE float32 division on every device.

    The divisor is a tensor on ``amax``'s device, not a Python number: torch's CUDA kernel divides
    by a CPU scalar as a multiplication by its float32 reciprocal, which loses a bit (measured on an
    H200: ``1.27 / 7`` came out one ulp off), so the scale of a CUDA model differed from the one the
    exporter writes (computed on the CPU) for some amax values."""
    return torch.clamp(amax32 / _constant(float(qmax), amax32), min=MIN_SCALE)


def _broadcast_shape(ndim: int, axis: int | None, channels: int) -> list[int]:
    shape = [1] * ndim
    if axis is not None:
        shape[axis] = channels
    return shape


def _fused(x: torch.Tensor, amax32: torch.Tensor, ax: int | None, fp8: bool = False) -> bool:
    """Whether the fused kernels serve this fake quantization (:mod:`qdq.kernels`): INT8 per
    tensor, or per channel along axis 0 of a contiguous tensor (a weight), on the amax's device
    (else the torch path names the device mismatch). FP8 takes the torch path (its cast is one
    kernel there already)."""
    if fp8:
        return False
    if ax is None:
        return amax32.device == x.device and kernels.usable(x)
    return kernels.per_channel(x, amax32, ax) and kernels.usable(x)


def _fake_quant_values(
    x: torch.Tensor,
    amax: torch.Tensor,
    ax: int | None,
    qmin: int,
    qmax: int,
    given_scale: Callable[[], torch.Tensor] | None,
    fp8: bool = False,
    kept: Kept | None = None,
) -> torch.Tensor:
    """The forward of :class:`_FakeQuantSTE` where nothing is differentiated (evaluation,
    calibration's candidates, the recipe search): the same bits, without an autograd node.
    Eager only (its callers ask): nothing here is traced.

    ``amax`` is not detached: nothing records a graph here (grad mode is off, or neither ``x``
    nor ``amax`` requires grad), and a detach is one more op per call."""
    amax32 = amax if amax.dtype == torch.float32 else amax.detach().to(torch.float32)
    if kernels.may_serve(x):  # the device check that densified and usable begin with, once
        dense = kernels.densified(x) if ax is None and not fp8 else x  # a view: one copy, one pass
        if _fused(dense, amax32, ax, fp8):
            return kernels.fake_quant(dense, amax32, qmin, qmax)
    if kept is not None:
        scale = kept(x.dim())[0]
    else:
        scale = given_scale() if given_scale is not None else _scale(amax32, qmax)
        if ax is not None:
            scale = scale.reshape(_broadcast_shape(x.dim(), ax, scale.numel()))
    # float32 input: no .to() call (a no-op that still parses its arguments)
    x32 = x if x.dtype == torch.float32 else x.to(torch.float32)
    if fp8:
        out = _fp8_codes(x32 / scale).mul_(scale)
        return out if out.dtype == x.dtype else out.to(x.dtype)
    q = (x32 / scale).round_().clamp_(qmin, qmax)
    out = torch.addcmul(_kept_constant(0.0, scale), q, scale, out=q)  # see _FakeQuantSTE.forward
    return out if out.dtype == x.dtype else out.to(x.dtype)


class _FakeQuantSTE(torch.autograd.Function):
    """Fake quantization with the straight-through estimator (and LSQ gradient for amax)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        amax: torch.Tensor,
        axis: int | None,
        qmin: int,
        qmax: int,
        pact: bool = False,
        given_scale: Callable[[], torch.Tensor] | None = None,
        fp8: bool = False,
        kept: Kept | None = None,
    ) -> torch.Tensor:
        ax = normalize_axis(axis, x.dim())
        # no detach: a forward runs with grad mode off (one op less per call)
        amax32 = amax if amax.dtype == torch.float32 else amax.to(torch.float32)
        ctx.axis = ax
        ctx.qmax = qmax
        ctx.amax_needs_grad = ctx.needs_input_grad[1]
        ctx.amax_dtype = amax.dtype
        ctx.pact = pact
        ctx.fused = False
        if not ctx.amax_needs_grad and kernels.may_serve(x):
            dense = kernels.densified(x) if ax is None else x
            ctx.fused = _fused(dense, amax32, ax, fp8)
            if ctx.fused:  # one pass on a GPU (qdq.kernels), the same bits as below (a view of
                # an attention operand copied dense first: one copy instead of the torch path's
                # four)
                ctx.save_for_backward(dense, amax32)
                return kernels.fake_quant(dense, amax32, qmin, qmax)
        x32 = x if x.dtype == torch.float32 else x.to(torch.float32)
        # what the backward compares |x| with: the kept bound, or the scale (times qmax there)
        ctx.bounded = kept is not None and not ctx.amax_needs_grad
        if ctx.bounded:
            assert kept is not None
            scale, bound = kept(x.dim())
        else:
            scale = (
                given_scale() if given_scale is not None and not ctx.amax_needs_grad
                else _scale(amax32, qmax)
            )  # fmt: skip
            if ax is not None:
                scale = scale.reshape(_broadcast_shape(x.dim(), ax, scale.numel()))
            bound = scale
        scaled = x32 / scale
        if fp8:  # float8 codes keep their sign on zero, as DequantizeLinear does: q·scale
            q = _fp8_codes(scaled)
            ctx.save_for_backward(
                *((x32, scale, q, scaled) if ctx.amax_needs_grad else (x32, bound))
            )
            out = q * scale
            return out if out.dtype == x.dtype else out.to(x.dtype)
        # 0 + q·scale in one pass: adding +0.0 turns -0.0 into +0.0 (integer codes have no signed
        # zero, so DequantizeLinear never returns -0.0 and neither do we: bit-identical outputs,
        # not just equal values); q·scale is exact-rounded either way (an FMA adds an exact 0)
        if ctx.amax_needs_grad:  # backward reads the unrounded values and the codes
            q = torch.round(scaled).clamp_(qmin, qmax)
            ctx.save_for_backward(x32, scale, q, scaled)
            out = torch.addcmul(_zero(scale), q, scale)
        else:  # nothing else reads scaled: round, clip and dequantize in its own memory (one
            # allocation per call; a fresh large tensor is page faults on a CPU)
            q = scaled.round_().clamp_(qmin, qmax)
            ctx.save_for_backward(x32, bound)
            if torch.compiler.is_dynamo_compiling():  # a graph has no allocations to save
                out = torch.addcmul(_zero(scale), q, scale)
            else:
                out = torch.addcmul(_zero(scale), q, scale, out=q)
        return out if out.dtype == x.dtype else out.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (grad_out,) = grads
        nones = (None,) * 8
        if ctx.fused:
            if not ctx.needs_input_grad[0]:
                return None, *nones
            x, amax32 = ctx.saved_tensors
            grad = kernels.ste_grad(x, amax32, ctx.qmax, grad_out)
            return grad, *nones
        if ctx.amax_needs_grad:
            x32, scale, q, scaled = ctx.saved_tensors
        else:
            x32, scale = ctx.saved_tensors
        # the (floored) amax, broadcast to x: kept with the scale (two ops less per call)
        amax_b = scale if ctx.bounded else scale * ctx.qmax
        inside = x32.abs() <= amax_b  # -amax <= x <= amax (NaN: outside either way)
        grad_x = None
        if ctx.needs_input_grad[0]:
            # a kept float32 zero where the forward ran eagerly and the backward does too (not
            # compiled autograd): 0.0 is one op more per call (aten.scalar_tensor); a 0-dim
            # gradient of another dtype keeps 0.0, which does not promote it
            eager = ctx.bounded and not torch.compiler.is_compiling()
            zero = (
                _kept_constant(0.0, grad_out) if eager and grad_out.dtype == torch.float32 else 0.0
            )
            grad_x = torch.where(inside, grad_out, zero)
        grad_amax = None
        if ctx.amax_needs_grad:
            inner = torch.zeros_like(q) if ctx.pact else q - scaled
            dscale = torch.where(inside, inner, q) * grad_out.to(torch.float32)
            dims = [d for d in range(x32.dim()) if d != ctx.axis]
            red = dscale.sum(dim=dims) if dims else dscale
            grad_amax = (red / ctx.qmax).to(ctx.amax_dtype)
        return grad_x, grad_amax, *nones[1:]


def _fp8_codes(scaled: torch.Tensor) -> torch.Tensor:
    """``scaled`` (float32) on the E4M3FN grid as float32: saturated to ±448 (±inf too; NaN
    stays NaN), then rounded to the nearest float8 value, ties to even (torch's cast, the same
    values as ONNX ``QuantizeLinear`` with saturate=1)."""
    return scaled.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(torch.float32)


class _GradScale(torch.autograd.Function):
    """Identity forward; the gradient is multiplied by a constant."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return t.view_as(t)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, None]:
        (grad,) = grads
        return grad * ctx.factor, None
