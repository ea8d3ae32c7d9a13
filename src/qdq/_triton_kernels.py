"""The Triton kernels of :mod:`qdq.kernels` (imported on first use: Triton resolves a kernel's
names in its module's globals, and importing Triton costs time that a CPU user need not pay).
The docstrings and the contract are in :mod:`qdq.kernels`."""

# ruff: noqa: N803  (Triton's compile-time constants are upper-case by convention)
from __future__ import annotations

import triton
import triton.language as tl

#: 1.5 * 2**23: adding and subtracting it rounds a small float32 to an integer, half to even
_ROUNDER: tl.constexpr = tl.constexpr(12582912.0)


@triton.jit
def fq_fwd(x_ptr, out_ptr, amax_ptr, n, qmin, qmax, min_scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    amax = tl.load(amax_ptr).to(tl.float32)
    scale = tl.maximum(tl.div_rn(amax, qmax), min_scale)
    # round half to even as float32 addition does it: for |v| <= 2**22, v + 1.5·2**23 lands where
    # the spacing is 1 and the constant is even, so the sum rounds to 1.5·2**23 + rint(v);
    # clipping to one step beyond the code range first keeps |v| small (and NaN as NaN)
    v = tl.clamp(tl.div_rn(x, scale), qmin - 1.0, qmax + 1.0, propagate_nan=tl.PropagateNan.ALL)
    q = (v + _ROUNDER) - _ROUNDER
    q = tl.clamp(q, qmin, qmax, propagate_nan=tl.PropagateNan.ALL)
    out = tl.where(q == 0.0, 0.0, q * scale)  # +0.0 for every zero code, as DequantizeLinear
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def ste_bwd(x_ptr, g_ptr, out_ptr, amax_ptr, n, qmax, min_scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0)
    amax = tl.load(amax_ptr).to(tl.float32)
    bound = tl.maximum(tl.div_rn(amax, qmax), min_scale) * qmax  # the floored amax
    out = tl.where(tl.abs(x) <= bound, g, tl.zeros_like(g))
    tl.store(out_ptr + offs, out, mask=mask)


@triton.jit
def fq_fwd_pc(x_ptr, out_ptr, amax_ptr, n, inner, qmin, qmax, min_scale, BLOCK: tl.constexpr):
    """:func:`fq_fwd` per channel along axis 0 of a contiguous tensor (``inner`` elements per
    channel): each element's amax is its channel's."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    amax = tl.load(amax_ptr + offs // inner, mask=mask, other=1.0).to(tl.float32)
    scale = tl.maximum(tl.div_rn(amax, qmax), min_scale)
    v = tl.clamp(tl.div_rn(x, scale), qmin - 1.0, qmax + 1.0, propagate_nan=tl.PropagateNan.ALL)
    q = (v + _ROUNDER) - _ROUNDER
    q = tl.clamp(q, qmin, qmax, propagate_nan=tl.PropagateNan.ALL)
    out = tl.where(q == 0.0, 0.0, q * scale)
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def ste_bwd_pc(x_ptr, g_ptr, out_ptr, amax_ptr, n, inner, qmax, min_scale, BLOCK: tl.constexpr):
    """:func:`ste_bwd` per channel along axis 0 (as :func:`fq_fwd_pc`)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0)
    amax = tl.load(amax_ptr + offs // inner, mask=mask, other=1.0).to(tl.float32)
    bound = tl.maximum(tl.div_rn(amax, qmax), min_scale) * qmax
    out = tl.where(tl.abs(x) <= bound, g, tl.zeros_like(g))
    tl.store(out_ptr + offs, out, mask=mask)


@triton.jit
def abs_hist(
    x_ptr, lo_ptr, hi_ptr, part_ptr, stat_ptr, n, tiles,
    GRID: tl.constexpr, LOG2_GRID: tl.constexpr, MIN_EXP: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    lo = tl.load(lo_ptr).to(tl.float32)
    hi = tl.load(hi_ptr).to(tl.float32)
    top = tl.maximum(-lo, hi)  # max|x|, NaN if any
    # the smallest e with 2**e >= top, from the float32 bits (exact): E - 127 for a power
    # of two, E - 126 otherwise; at least MIN_EXP (zero, subnormals, and below the floor)
    bits = top.to(tl.int32, bitcast=True)
    biased = (bits >> 23) & 0xFF
    exp = tl.where((bits & 0x7FFFFF) == 0, biased - 127, biased - 126)
    exp = tl.where(top > 0.0, tl.maximum(exp, MIN_EXP), MIN_EXP)
    # factor = 2**(LOG2_GRID - e), built from its bits (inf/NaN batches: clamped, and the
    # calibrator raises on their maximum before these counts are used)
    k = tl.minimum(tl.maximum(LOG2_GRID - exp, -126), 127)
    factor = ((k + 127) << 23).to(tl.float32, bitcast=True)
    if pid == 0:
        tl.store(stat_ptr, top)
        tl.store(stat_ptr + 1, exp.to(tl.float32))
    acc = tl.zeros([GRID], dtype=tl.int32)
    for i in range(tiles):
        tile = (pid + i * nprog).to(tl.int64)
        offs = tile * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
        idx = (tl.abs(x) * factor).to(tl.int32)  # exact product; truncation == floor
        idx = tl.minimum(tl.maximum(idx, 0), GRID - 1)  # the top value 2**e: last bin
        acc += tl.histogram(idx, GRID)  # masked lanes count in bin 0: subtracted later
    tl.store(part_ptr + pid * GRID + tl.arange(0, GRID), acc)
