"""Fused GPU kernels (Triton, which ships with CUDA builds of torch) for the hot elementwise paths.

On a GPU, the torch formulation of a fake quantization is four passes over the activation
(``x / scale``, ``round``, ``clamp``, ``q * scale``) and its straight-through backward three more;
the calibration histogram is five (``aminmax``, ``* factor``, ``abs``, a cast, ``bincount``) plus
two host synchronisations per call (the batch maximum decides the grid; ``torch.bincount`` reads
its input's range on the host). Each pass over a ResNet-50 batch moves gigabytes: the kernels here
do each job in one pass, and never ask the host for a value.

* :func:`fake_quant` — per-tensor ``QuantizeLinear`` → ``DequantizeLinear`` of a dense tensor (or
  per channel along axis 0 of a contiguous one: a Conv/Linear weight, :func:`per_channel`) with
  the numerics contract of :mod:`qdq.quant.primitives` bit for bit: IEEE division (``div_rn``, not
  a multiplication by the inverse), round half to even (``rint``), saturation with NaN kept, no
  ``-0.0``, computed in float32 and stored in the input's dtype;
* :func:`ste_grad` — its straight-through gradient: ``grad`` where ``|x| <= amax``, else 0;
* :func:`abs_histogram` — the int64 counts of ``floor(|x| · 2**(log2(grid) - e))`` over ``grid``
  bins (the top value in the last bin), with ``e`` the batch's own grid exponent, computed on the
  device from the batch maximum; returns the counts and ``(max|x|, e)`` as device tensors, so that
  :class:`~qdq.calib.HistogramCalibrator` merges batches later with one synchronisation for many.

:func:`usable` says whether they serve a tensor: a CUDA tensor, dense (contiguous or channels-last),
outside ``torch.compile`` / tracing (inductor fuses the torch formulation itself), Triton importable,
``QDQ_KERNELS`` not ``0``, and the first use on each device passed a self-check against the torch
formulation on tensors built to hit every rounding tie, saturation, signed zero, NaN, infinity and
half-precision edge (:func:`self_check`). A failed check warns once and that device keeps the torch
path: a kernel can cost speed, never a wrong number.

The check itself lives above this module, in :mod:`qdq.kernel_check`: its references are the torch
paths of :mod:`qdq.quant.primitives` and :mod:`qdq.calib.histogram`, which call the kernels here,
so this module imports neither (the numeric constants the kernels share with them come from
:mod:`qdq._numerics`, below all three). ``qdq.kernel_check`` registers the check on import
(:func:`register_check`), and ``import qdq`` imports it. Without a registered check no device is
served: the first use of each warns and keeps the torch path, as after a failed check.

``TRITON_INTERPRET=1`` runs the kernels on the CPU (Triton's interpreter), which is how the tests
check them without a GPU.
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import torch

from qdq._numerics import HISTOGRAM_MIN_EXP, MIN_SCALE

__all__ = [
    "abs_histogram",
    "fake_quant",
    "may_serve",
    "per_channel",
    "register_check",
    "self_check",
    "ste_grad",
    "usable",
]

#: elements per program of the elementwise kernels
_BLOCK = 2048
#: elements per tile of the histogram kernel (each program loops over many tiles)
_HIST_BLOCK = 1024

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
#: the dtypes served; Triton's CPU interpreter rounds float32 → bfloat16 by truncation (the GPU
#: compiler rounds to nearest even, as torch), so there bfloat16 keeps the torch path
_DTYPES = (
    (torch.float32, torch.float16) if _INTERPRET else (torch.float32, torch.float16, torch.bfloat16)
)
#: whether the kernels serve each device: its first use's self-check passed (or a block of
#: :func:`_serving` says so)
_CHECKED: dict[tuple[str, int | None], bool] = {}
#: the self-check a device must pass before the kernels serve it (:func:`register_check`)
_check: Callable[[torch.device], str | None] | None = None


@functools.cache
def _triton() -> Any:
    """The jitted kernels (:mod:`qdq._triton_kernels`) and the constants they take from
    :mod:`qdq._numerics`, as the torch paths do (the smallest scale, the histogram grid's lowest
    exponent), or ``None`` when Triton cannot be imported."""
    try:
        from qdq import _triton_kernels as kernels
    except Exception:  # absent, or broken for this torch: fall back
        return None
    return SimpleNamespace(
        fq_fwd=kernels.fq_fwd,
        ste_bwd=kernels.ste_bwd,
        fq_fwd_pc=kernels.fq_fwd_pc,
        ste_bwd_pc=kernels.ste_bwd_pc,
        abs_hist=kernels.abs_hist,
        min_scale=MIN_SCALE,
        min_exp=HISTOGRAM_MIN_EXP,
    )


def _dense(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements fill its storage span exactly once, in the order of another
    tensor made by ``torch.empty_like`` (then a kernel may walk the memory linearly)."""
    if t.is_contiguous():
        return True
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        return True
    return t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d)


def _key(device: torch.device) -> tuple[str, int | None]:
    if device.type == "cuda" and device.index is None:
        return ("cuda", torch.cuda.current_device())
    return (device.type, device.index)


@contextlib.contextmanager
def _serving(device: torch.device | str, on: bool) -> Iterator[None]:
    """Within the block the kernels serve ``device`` (``on``) or do not, whatever its check said
    (restored on exit)."""
    key = _key(torch.device(device))
    saved = _CHECKED.get(key)
    _CHECKED[key] = on
    try:
        yield
    finally:
        if saved is None:
            _CHECKED.pop(key, None)
        else:
            _CHECKED[key] = saved


def unfused(device: torch.device | str) -> contextlib.AbstractContextManager[None]:
    """Within the block the torch path runs on ``device`` (the self-check's reference, and the
    tests' comparisons)."""
    return _serving(device, False)


def may_serve(x: torch.Tensor) -> bool:
    """Whether ``x``'s device is one the kernels may serve (CUDA; the CPU under Triton's
    interpreter): the first check of :func:`usable`, which callers ask once before the others."""
    return x.is_cuda or (_INTERPRET and x.device.type == "cpu")


def usable(x: torch.Tensor) -> bool:
    """Whether the fused kernels serve ``x`` (see the module docstring)."""
    if not may_serve(x):
        return False
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or not _dense(x):
        return False
    if x.dtype not in _DTYPES or type(x) not in (torch.Tensor, torch.nn.Parameter):
        return False
    key = _key(x.device)
    ok = _CHECKED.get(key)
    if ok is None:
        ok = _CHECKED[key] = _first_use(x.device)
    return ok


def densified(x: torch.Tensor) -> torch.Tensor:
    """``x``, or a contiguous copy of it when the copy is what lets the fused kernels serve it
    (a transposed view on a GPU, an attention operand: one copy kernel instead of the torch
    path's several passes)."""
    if _dense(x) or not may_serve(x):
        return x
    y = x.contiguous()
    return y if usable(y) else x


def _first_use(device: torch.device) -> bool:
    """Whether the kernels may serve ``device`` from now on: Triton importable, ``QDQ_KERNELS``
    not ``0``, and the registered self-check passed (none registered: not served, with a warning,
    as after a failed check)."""
    if os.environ.get("QDQ_KERNELS", "1") == "0" or _triton() is None:
        return False
    try:
        problem = self_check(device)
    except Exception as err:  # a compiler or driver error: fall back, say why
        problem = f"{type(err).__name__}: {str(err).strip()[:300]}"
    if problem:
        warnings.warn(
            f"qdq: the fused Triton kernels failed their self-check on {device} ({problem}); "
            "using the unfused torch path (same numbers, slower)",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    return True


def _launch_1d(n: int) -> tuple[int]:
    return (max(1, -(-n // _BLOCK)),)


def per_channel(x: torch.Tensor, amax: torch.Tensor, axis: int | None) -> bool:
    """Whether the per-channel kernels serve ``x`` quantized along ``axis`` with ``amax``: axis
    0 of a contiguous tensor (a Conv/Linear weight), one float32 amax per channel, on the
    tensor's device (besides :func:`usable`)."""
    return (
        axis == 0
        and x.dim() > 0
        and x.is_contiguous()
        and amax.numel() == x.shape[0]
        and amax.is_contiguous()
        and amax.device == x.device
    )


def fake_quant(x: torch.Tensor, amax: torch.Tensor, qmin: int, qmax: int) -> torch.Tensor:
    """Fake quantization of a dense ``x``: per tensor with a one-element float32 ``amax``, or
    per channel along axis 0 of a contiguous ``x`` with one amax per channel (no check of
    either: callers ask :func:`usable` and :func:`per_channel` first)."""
    k = _triton()
    out = torch.empty_like(x)
    n = x.numel()
    if n and amax.numel() == 1:
        k.fq_fwd[_launch_1d(n)](
            x, out, amax, n, float(qmin), float(qmax), k.min_scale, BLOCK=_BLOCK
        )
    elif n:
        k.fq_fwd_pc[_launch_1d(n)](x, out, amax, n, n // x.shape[0], float(qmin), float(qmax),
                                   k.min_scale, BLOCK=_BLOCK)  # fmt: skip
    return out


def ste_grad(x: torch.Tensor, amax: torch.Tensor, qmax: int, grad: torch.Tensor) -> torch.Tensor:
    """``grad`` where ``|x| <= max(amax/qmax, MIN_SCALE)·qmax``, else 0 (``grad``'s dtype); per
    channel along axis 0 as :func:`fake_quant` when ``amax`` has one value per channel."""
    if grad.shape != x.shape or grad.stride() != x.stride():  # laid out as x (broadcast too)
        grad = torch.empty_like(x, dtype=grad.dtype).copy_(grad)
    k = _triton()
    out = torch.empty_like(grad)
    n = x.numel()
    if n and amax.numel() == 1:
        k.ste_bwd[_launch_1d(n)](x, grad, out, amax, n, float(qmax), k.min_scale, BLOCK=_BLOCK)
    elif n:
        k.ste_bwd_pc[_launch_1d(n)](x, grad, out, amax, n, n // x.shape[0], float(qmax),
                                    k.min_scale, BLOCK=_BLOCK)  # fmt: skip
    return out


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    if device.type != "cuda":
        return 2  # the interpreter
    return torch.cuda.get_device_properties(device).multi_processor_count


def _programs(device: torch.device, tiles: int) -> int:
    """Histogram programs: two per multiprocessor (each loops over its tiles, then writes one
    row of counts), fewer for a small tensor."""
    return max(1, min(tiles, 2 * _multiprocessors(device)))


def abs_histogram(x: torch.Tensor, grid: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Count ``floor(|x| · 2**(log2(grid) - e))`` into ``grid`` bins (values at ``grid`` in the
    last), ``e`` the smallest exponent with ``2**e >= max|x|`` (at least -24).

    Returns ``(counts, stats, pad)``: int64 counts on ``x``'s device, float32 ``[max|x|, e]`` on
    the device (NaN/inf when ``x`` holds any), and the number of padding lanes counted in bin 0
    (to subtract; a host number, so that nothing here waits for the device).
    """
    n = x.numel()
    lo, hi = torch.aminmax(x)
    tiles = max(1, -(-n // _HIST_BLOCK))
    nprog = _programs(x.device, tiles)
    per_prog = -(-tiles // nprog)
    part = torch.empty((nprog, grid), dtype=torch.int32, device=x.device)
    stats = torch.empty(2, dtype=torch.float32, device=x.device)
    k = _triton()
    k.abs_hist[(nprog,)](
        x, lo, hi, part, stats, n, per_prog,
        GRID=grid, LOG2_GRID=grid.bit_length() - 1, MIN_EXP=k.min_exp, BLOCK=_HIST_BLOCK,
    )  # fmt: skip
    counts = part.sum(dim=0, dtype=torch.int64)
    return counts, stats, nprog * per_prog * _HIST_BLOCK - n


# ----------------------------------------------------------------------------- the self-check


def register_check(check: Callable[[torch.device], str | None] | None) -> None:
    """Make ``check`` the self-check that each device must pass before the kernels serve it
    (:mod:`qdq.kernel_check` registers its own on import; ``None`` takes it away). Devices
    already checked are checked again, by the new one, at their next use."""
    global _check
    _check = check
    _CHECKED.clear()


def self_check(device: torch.device | str) -> str | None:
    """Run the registered self-check (:func:`qdq.kernel_check.check`: each kernel against the
    torch path it replaces) on ``device``; return what differs, or ``None`` when every output is
    bit-identical (also when called under ``torch.no_grad``).

    With no check registered it returns that as what differs: nothing was shown bit-identical,
    and a device is served only after a check passed (a kernel may cost speed, never a wrong
    number), so the device keeps the torch path.
    """
    check = _check
    if check is None:
        return "no self-check is registered (qdq.kernel_check registers it when qdq is imported)"
    # the first use comes from wherever a tensor first meets the kernels: calibration and
    # evaluation run under no_grad / inference_mode, where the gradient check cannot run
    with torch.inference_mode(False), torch.enable_grad():
        return check(torch.device(device))
