"""The self-check of the fused kernels (:mod:`qdq.kernels`): each kernel against the torch path it
replaces, on tensors built to hit every rounding tie, saturation, signed zero, NaN, infinity and
half-precision edge.

The references are the torch formulations of :mod:`qdq.quant.primitives` and
:class:`~qdq.calib.HistogramCalibrator`, which themselves call the kernels: the check lives here,
above all three, so that the imports go one way (down) and the kernels never import the layers
that use them. On import it registers :func:`check` with :func:`qdq.kernels.register_check`;
``qdq/__init__`` imports this module, so the check is registered whenever any part of qdq is. The
kernels run it (through :func:`qdq.kernels.self_check`) on the first use of each device, and serve
no device without it.

The kernels are called through the :mod:`qdq.kernels` module (``kernels.fake_quant``, not a name
imported from it), so that a test which plants a fault there sees the check catch it.
"""

from __future__ import annotations

import math

import torch

from qdq import kernels
from qdq.calib.histogram import HistogramCalibrator
from qdq.quant.primitives import fake_quant_unchecked, quant_range

__all__ = ["check"]


def _probe(device: torch.device) -> torch.Tensor:
    """float32 values that hit every edge at ``amax = 1.27`` (scale 0.01) and at the floored
    scale: rounding ties both ways, saturation, signed zeros, NaN, ±inf, subnormals, and a
    random bulk."""
    scale = torch.tensor(0.01, dtype=torch.float32)
    codes = torch.arange(-140, 141, dtype=torch.float32)
    ties = (codes + 0.5) * scale  # x / scale lands on or next to .5
    near = torch.cat([torch.nextafter(ties, ties + 1), torch.nextafter(ties, ties - 1)])
    special = torch.tensor(
        [0.0, -0.0, 1e-45, -1e-45, 1e-30, -3e-3, 4.9e-3, -5e-3, 5e-3, 1.27, -1.27, 1.28, -1.29,
         1e30, -1e30, math.inf, -math.inf, math.nan, 2.0**-24, -(2.0**-25)]
    )  # fmt: skip
    bulk = torch.randn(5000, generator=torch.Generator().manual_seed(0)) * 0.7
    return torch.cat([codes * scale, ties, near, special, bulk]).to(device)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical, NaN included."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    view = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
    return torch.equal(a.view(view[a.dtype]), b.view(view[b.dtype]))


def check(device: torch.device) -> str | None:
    """Compare each kernel with the torch path it replaces (run with :func:`qdq.kernels.unfused`:
    the very code a device without kernels runs) on ``device``; return what differs, or ``None``
    when every output is bit-identical. Called by :func:`qdq.kernels.self_check`, which turns
    autograd on for it (the gradient comparisons)."""
    probe = _probe(device)
    for amax_value in (1.27, 0.0, 3e-9, 1e20):
        amax = torch.tensor(amax_value, dtype=torch.float32, device=device)
        for dtype in kernels._DTYPES:
            x = probe.to(dtype)
            for bits, narrow in ((8, False), (8, True), (4, False)):
                qmin, qmax = quant_range(bits, narrow)
                with kernels.unfused(device):
                    want = fake_quant_unchecked(x, amax, num_bits=bits, narrow_range=narrow)
                if not _same(kernels.fake_quant(x, amax, qmin, qmax), want):
                    return f"fake_quant differs ({dtype}, amax {amax_value}, [{qmin}, {qmax}])"
            g = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(device, dtype)
            leaf = x.detach().requires_grad_()
            with kernels.unfused(device):
                fake_quant_unchecked(leaf, amax).backward(g)
            assert leaf.grad is not None
            if not _same(kernels.ste_grad(x, amax, 127, g), leaf.grad):
                return f"ste_grad differs ({dtype}, amax {amax_value})"
    # per channel along axis 0 (weights): every amax edge at once, one per channel of a
    # (channels, k) x; no NaN (a weight has none, and the payload of a NaN the torch path makes
    # through a per-channel broadcast is not the fused kernel's: it would fail every kernel)
    amaxes = torch.tensor([1.27, 0.0, 3e-9, 1e20, 0.05, 7.0], dtype=torch.float32, device=device)
    weights = probe[~torch.isnan(probe)]
    width = -(-weights.numel() // amaxes.numel())
    rows = torch.cat([weights, weights[: width * amaxes.numel() - weights.numel()]])
    for dtype in kernels._DTYPES:
        x = rows.reshape(amaxes.numel(), width).to(dtype)
        for bits, narrow in ((8, True), (8, False), (4, False)):
            qmin, qmax = quant_range(bits, narrow)
            with kernels.unfused(device):
                want = fake_quant_unchecked(x, amaxes, num_bits=bits, axis=0, narrow_range=narrow)
            if not _same(kernels.fake_quant(x, amaxes, qmin, qmax), want):
                return f"per-channel fake_quant differs ({dtype}, [{qmin}, {qmax}])"
        g = torch.randn(x.shape, generator=torch.Generator().manual_seed(2)).to(device, dtype)
        leaf = x.detach().requires_grad_()
        with kernels.unfused(device):
            fake_quant_unchecked(leaf, amaxes, axis=0, narrow_range=True).backward(g)
        assert leaf.grad is not None
        if not _same(kernels.ste_grad(x, amaxes, 127, g), leaf.grad):
            return f"per-channel ste_grad differs ({dtype})"
    finite = probe[torch.isfinite(probe)]
    for data in (finite, finite * 1e-12, torch.zeros(7, device=device), finite.abs() * 3e5):
        for num_bins in (256, 2048):
            runs = []
            for on in (True, False):  # the device histogram, then the torch path
                cal = HistogramCalibrator(num_bins)
                with kernels._serving(device, on):
                    cal.collect(data)
                    cal.collect(data * 3)  # the range grows: merged bins
                runs.append((*cal.histogram(), cal.observed_max))
            (ca, ea, ma), (cb, eb, mb) = runs
            if ma != mb or ca.tolist() != cb.tolist() or ea.tolist() != eb.tolist():
                return f"abs_histogram differs ({2 * num_bins} bins, max {mb:g})"
    return None


kernels.register_check(check)
