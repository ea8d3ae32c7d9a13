"""Checks of :mod:`qdq.kernels` shared by the CPU tests (Triton's interpreter, in a subprocess with
``TRITON_INTERPRET=1``) and the GPU tests: each fused path gives the bits of the torch path."""

from __future__ import annotations

import math

import torch

from qdq import kernels
from qdq.calib import CalibrationError, HistogramCalibrator
from qdq.quant.primitives import fake_quant_unchecked

_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(_VIEW[t.dtype]).cpu()


def check_fake_quant_and_grad(device: str, dtypes: tuple[torch.dtype, ...]) -> int:
    """The fused forward and STE backward against the torch path, per dtype and layout; returns
    how many cases ran fused."""
    dev = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    fused = 0
    for dtype in dtypes:
        for shape, channels_last in (((3, 5, 7, 9), False), ((2, 8, 6, 6), True), ((4097,), False)):
            x = (torch.randn(shape, generator=gen) * 3).to(dev, dtype)
            x.view(-1)[:3] = torch.tensor([math.nan, math.inf, -0.0])
            if channels_last:
                x = x.to(memory_format=torch.channels_last)
            x.requires_grad_()
            amax = torch.tensor(2.5, device=dev)
            grad = torch.randn(shape, generator=gen).to(dev, dtype)
            fused += kernels.usable(x)
            y = fake_quant_unchecked(x, amax)
            y.backward(grad)
            got_y, got_g = _bits(y), _bits(x.grad)
            assert y.stride() == x.stride()
            x.grad = None
            with kernels.unfused(dev):
                want = fake_quant_unchecked(x, amax)
                want.backward(grad)
            assert torch.equal(got_y, _bits(want)), (dtype, shape)
            assert torch.equal(got_g, _bits(x.grad)), (dtype, shape)
    return fused


def check_views(device: str, dtypes: tuple[torch.dtype, ...]) -> int:
    """A transposed view (an attention operand) is copied dense and takes the fused path: the
    forward and the STE backward give the torch path's bits; returns how many ran fused."""
    dev = torch.device(device)
    gen = torch.Generator().manual_seed(3)
    fused = 0
    for dtype in dtypes:
        base = (torch.randn(2, 4, 6, 5, generator=gen) * 3).to(dev, dtype)
        base.view(-1)[:3] = torch.tensor([math.nan, math.inf, -0.0])
        x = base.transpose(-1, -2).detach().requires_grad_()  # not dense as laid out
        amax = torch.tensor(2.5, device=dev)
        grad = torch.randn(x.shape, generator=gen).to(dev, dtype)
        fused += (not kernels.usable(x)) and kernels.usable(kernels.densified(x))
        y = fake_quant_unchecked(x, amax)
        y.backward(grad)
        got_y, got_g = _bits(y), _bits(x.grad)
        x.grad = None
        with kernels.unfused(dev):
            want = fake_quant_unchecked(x, amax)
            want.backward(grad)
        assert torch.equal(got_y, _bits(want)), dtype
        assert torch.equal(got_g, _bits(x.grad)), dtype
    return fused


def check_per_channel_weights(device: str, dtypes: tuple[torch.dtype, ...]) -> int:
    """The fused per-channel forward and STE backward (a QAT weight: axis 0, one amax per
    output channel, narrow range) against the torch path; returns how many cases ran fused."""
    dev = torch.device(device)
    gen = torch.Generator().manual_seed(2)
    fused = 0
    for dtype in dtypes:
        for shape in ((16, 3, 3, 3), (10, 7), (1, 5)):
            w = (torch.randn(shape, generator=gen) * 0.2).to(dev, dtype)
            w.view(-1)[:3] = torch.tensor([math.inf, -0.0, 1e-30])  # a weight has no NaN
            amax = w.detach().float().abs().reshape(shape[0], -1).nan_to_num(0.0).amax(1) * 0.9
            amax[0] = 0.0  # a dead channel: the floored scale
            w.requires_grad_()
            grad = torch.randn(shape, generator=gen).to(dev, dtype)
            fused += kernels.usable(w) and kernels.per_channel(w, amax, 0)
            y = fake_quant_unchecked(w, amax, axis=0, narrow_range=True)
            y.backward(grad)
            got_y, got_g = _bits(y), _bits(w.grad)
            w.grad = None
            with kernels.unfused(dev):
                want = fake_quant_unchecked(w, amax, axis=0, narrow_range=True)
                want.backward(grad)
            assert torch.equal(got_y, _bits(want)), (dtype, shape)
            assert torch.equal(got_g, _bits(w.grad)), (dtype, shape)
            with torch.no_grad():  # the path without an autograd node
                assert torch.equal(_bits(fake_quant_unchecked(w, amax, axis=0, narrow_range=True)),
                                   got_y)  # fmt: skip
    return fused


def check_histogram(device: str) -> None:
    """Device-binned batches (growing range, a half batch, zeros, values below the floor) give
    the counts, maximum and amax of the torch path; a NaN batch is reported by its index."""
    dev = torch.device(device)
    gen = torch.Generator().manual_seed(1)
    data = [torch.randn(3, 50, generator=gen) * s for s in (0.01, 1.0, 0.5, 40.0, 3.0)]
    data += [torch.zeros(5), torch.rand(7, generator=gen) * 1e-30]
    data += [(torch.randn(2, 3, 4, 4, generator=gen) * 8).half()]
    data += [torch.randn(20, generator=gen) * 2.0**k for k in range(-3, 30, 2)]  # > 16 pending

    def collect() -> HistogramCalibrator:
        cal = HistogramCalibrator(256)
        for i, batch in enumerate(data):
            cal.collect(batch.to(dev))
            if i == 2:
                assert cal.observed_max > 0  # a merge midway
        return cal

    fused = collect()
    with kernels.unfused(dev):
        plain = collect()
    (ca, ea), (cb, eb) = fused.histogram(), plain.histogram()
    assert ca.tolist() == cb.tolist() and ea.tolist() == eb.tolist()
    assert fused.observed_max == plain.observed_max
    for method in ("max", "entropy", "mse", "percentile"):
        assert torch.equal(fused.compute_amax(method), plain.compute_amax(method)), method
    for first in (1, 19):  # 19: after a merge of the first 16 (qdq.calib.histogram.MERGE_EVERY)
        cal = HistogramCalibrator()
        for i in range(first + 6):
            batch = torch.randn(10, device=dev) * (i + 1)
            if i in (first, first + 4):  # the first bad batch is named, not a later one
                batch[3] = math.nan if i == first else math.inf
            cal.collect(batch)
        try:
            cal.compute_amax("max")
        except CalibrationError as err:
            assert f"batch {first} " in str(err), err
        else:
            raise AssertionError("a NaN batch was not reported")


def main() -> None:
    """The interpreter run (``TRITON_INTERPRET=1`` on the CPU): bfloat16 keeps the torch path
    there (the interpreter truncates float32 → bfloat16), so it is not among the dtypes."""
    assert kernels.self_check("cpu") is None
    assert check_fake_quant_and_grad("cpu", (torch.float32, torch.float16)) == 6
    assert check_per_channel_weights("cpu", (torch.float32, torch.float16)) == 6
    assert check_views("cpu", (torch.float32, torch.float16)) == 2
    assert not kernels.usable(torch.randn(4, dtype=torch.bfloat16))
    check_histogram("cpu")
    print("kernel checks passed")


if __name__ == "__main__":
    main()
