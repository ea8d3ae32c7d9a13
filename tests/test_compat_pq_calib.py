"""qdq.compat.pytorch_quantization.calib: upstream's calibrators, value for value.

The references below are plain loops written from upstream's documented procedures (KL search with
scipy's entropy, centre MSE with upstream's fake-quant arithmetic, CDF percentile, histc/np.histogram
grids); the calibrators must match them bit for bit on seeded data. All on CPU, small histograms.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from torch import nn

from qdq.compat.pytorch_quantization import calib
from qdq.compat.pytorch_quantization.calib._amax import (
    _compute_amax_entropy,
    _compute_amax_mse,
    _compute_amax_percentile,
)

scipy_stats = pytest.importorskip("scipy.stats")


# ---------------------------------------------------------------- references (upstream's steps)
def _ref_entropy(hist: np.ndarray, edges: np.ndarray, num_bits: int, unsigned: bool,
                 stride: int = 1, start_bin: int = 128) -> float:  # fmt: skip
    bins = hist.copy()
    bins[0] = bins[1]
    nlevels = 1 << (num_bits - 1 + int(unsigned))
    divs = []
    for i in range(start_bin, len(bins) + 1, stride):
        level = np.digitize(range(i), np.linspace(0, i, num=nlevels + 1)) - 1
        level[bins[:i] == 0] = -1
        sums = np.zeros(nlevels, dtype=np.float64)
        for j, lv in enumerate(level):
            if lv != -1:
                sums[lv] += bins[j]
        for lv, n in Counter(level).items():
            if lv != -1:
                sums[lv] /= n
        q = np.zeros(i, dtype=np.float64)
        for j, lv in enumerate(level):
            if lv != -1:
                q[j] = sums[lv]
        p = np.array(bins[:i])
        p[-1] += np.sum(bins[i:])
        divs.append(scipy_stats.entropy(p, q))
    d = np.array(divs)
    last = len(d) - 1 - int(np.argmin(d[::-1]))
    return float(edges[last * stride + start_bin])


def _ref_fake_quant(
    x: torch.Tensor, amax: torch.Tensor, num_bits: int, unsigned: bool
) -> torch.Tensor:
    bound = torch.tensor(2.0 ** (num_bits - 1 + int(unsigned)) - 1.0)
    scale = bound / amax
    if amax <= 2.0**-24:
        scale = torch.zeros_like(scale)
    lo = 0.0 if unsigned else -float(bound)
    q = torch.clamp((x * scale).round(), lo, float(bound))
    return q / (torch.ones_like(scale) if amax <= 2.0**-24 else scale)


def _ref_mse(hist: np.ndarray, edges: np.ndarray, num_bits: int, unsigned: bool,
             stride: int = 1, start_bin: int = 128) -> float:  # fmt: skip
    counts = torch.from_numpy(hist).float()
    e = torch.from_numpy(edges).float()
    centres = (e[1:] + e[:-1]) / 2
    best, best_i = None, None
    for i in range(start_bin, len(centres), stride):
        err = (
            (_ref_fake_quant(centres, centres[i], num_bits, unsigned) - centres) ** 2 * counts
        ).mean()
        if best is None or float(err) < best:
            best, best_i = float(err), i
    assert best_i is not None
    return float(centres[best_i])


def _ref_percentile(hist: np.ndarray, edges: np.ndarray, p: float) -> float:
    cdf = np.cumsum(hist / hist.sum())
    return float(edges[np.searchsorted(cdf, p / 100)])


def _batches(seed: int, n: int = 3, size: int = 4000) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(size, generator=g) * (1.0 + 0.6 * k) for k in range(n)]


def _np_hist(cal: calib.HistogramCalibrator) -> tuple[np.ndarray, np.ndarray]:
    hist, edges = cal._calib_hist, cal._calib_bin_edges
    if isinstance(hist, torch.Tensor):
        return hist.to(torch.int64).numpy(), edges.numpy()
    return hist.copy(), edges


# ---------------------------------------------------------------- MaxCalibrator
def test_max_per_tensor_and_axes():
    g = torch.Generator().manual_seed(1)
    x1, x2 = torch.randn(4, 5, 6, generator=g), torch.randn(4, 5, 6, generator=g)
    whole = calib.MaxCalibrator(8, None, False)
    for axis, kept in ((0, (0,)), (-1, (2,)), ((0, 2), (0, 2)), (None, ())):
        cal = calib.MaxCalibrator(8, axis, False)
        cal.collect(x1)
        cal.collect(x2)
        reduce = tuple(d for d in range(3) if d not in kept)
        want = torch.maximum(x1.abs(), x2.abs()).amax(dim=reduce, keepdim=True)
        got = cal.compute_amax()
        assert torch.equal(got, want.reshape(()) if not kept else want)
    whole.collect(torch.tensor([-7, 3]))  # integers keep their dtype
    assert whole.compute_amax().dtype == torch.int64 and int(whole.compute_amax()) == 7
    whole.reset()
    assert whole.compute_amax() is None


def test_max_shape_change_track_amax_and_printing():
    cal = calib.MaxCalibrator(8, 0, False, track_amax=True)
    a, b = torch.rand(3, 2), torch.rand(3, 2) + 1
    cal.collect(a)
    cal.collect(b)
    assert [x.tolist() for x in cal.amaxs] == [a.amax(1, keepdim=True).tolist(),
                                               b.amax(1, keepdim=True).tolist()]  # fmt: skip
    assert isinstance(cal.amaxs[0], np.ndarray)
    with pytest.raises(RuntimeError, match="shape changed"):
        cal.collect(torch.rand(4, 2))
    assert str(cal) == "MaxCalibrator(track_amax=True)"
    assert repr(cal).startswith("MaxCalibrator(num_bits=8 axis=0 unsigned=False calib_amax=")
    with pytest.raises(AttributeError, match="track_amax"):
        _ = calib.MaxCalibrator(8, None, False).amaxs
    assert calib.MaxCalibrator(8, None, True).unsigned is True


# ---------------------------------------------------------------- histogram collection
def test_torch_and_numpy_grids_agree_and_grow_by_first_width():
    g = torch.Generator().manual_seed(2)
    x1 = torch.rand(1023, generator=g)
    x1[0] = 0
    x2 = torch.rand(1023, generator=g) + 1  # past the first range: bins are appended
    th = calib.HistogramCalibrator(8, None, False, num_bins=19, torch_hist=True)
    nph = calib.HistogramCalibrator(8, None, False, num_bins=19, torch_hist=False)
    for x in (x1, x2, x1, x2):
        th.collect(x)
        nph.collect(x)
        assert th._calib_hist.numel() == th._calib_bin_edges.numel() - 1
        np.testing.assert_array_equal(nph._calib_hist, th._calib_hist.numpy())
        np.testing.assert_array_almost_equal(nph._calib_bin_edges, th._calib_bin_edges.numpy())
    width = float(x1.max()) / 19
    edges = th._calib_bin_edges.numpy()
    assert np.allclose(np.diff(edges), width, rtol=1e-5)
    assert edges[-1] >= float(x2.max()) and int(th._calib_hist.sum()) == 4 * 1023
    first = torch.histc(x1, bins=19, min=0, max=float(x1.max()))
    fresh = calib.HistogramCalibrator(8, None, False, num_bins=19)
    fresh.collect(x1)
    assert torch.equal(fresh._calib_hist, first)
    assert torch.equal(fresh._calib_bin_edges, torch.linspace(0, float(x1.max()), 20))


def test_integer_tensors_skip_zeros_and_grow_method():
    cal = calib.HistogramCalibrator(8, None, False, skip_zeros=True, grow_method="stretch")
    cal.collect(torch.tensor([0, 0, 0, 0, 0, 1, 2, 3, 4, 5]))
    cal.collect(torch.tensor([0, 0, 0, 0, 0, 6, 7, 8, 9, 10]))
    assert int(cal._calib_hist.sum()) == 10  # the zeros were left out
    amax = cal.compute_amax("percentile", percentile=50)
    assert float((amax - 5.0).abs()) < 10 / 2048
    signed = calib.HistogramCalibrator(8, None, False, torch_hist=False)
    signed.collect(torch.tensor([-3, 1, 2], dtype=torch.int32))  # |x|, counted as floats
    assert signed._calib_hist.sum() == 3 and float(signed._calib_bin_edges[-1]) == 3.0
    with pytest.raises(RuntimeError, match="only zeros"):
        calib.HistogramCalibrator(8, None, False, skip_zeros=True).collect(torch.zeros(4))


# ---------------------------------------------------------------- amax, bit for bit
@pytest.mark.parametrize("torch_hist", [True, False])
@pytest.mark.parametrize("unsigned", [False, True])
def test_entropy_matches_reference(torch_hist, unsigned):
    cal = calib.HistogramCalibrator(8, None, unsigned, num_bins=320, torch_hist=torch_hist)
    for x in _batches(3 + unsigned):
        cal.collect(x.abs() if unsigned else x)
    hist, edges = _np_hist(cal)
    for kw in ({}, {"stride": 3, "start_bin": 150}):
        want = _ref_entropy(hist, edges, 8, unsigned, **kw)
        got = cal.compute_amax("entropy", **kw)
        assert got.dtype == torch.float32 and float(got) == np.float32(want)


def test_entropy_with_ties_and_an_outlier():
    hist = np.zeros(300, dtype=np.int64)
    hist[:200] = 5  # flat: many equal divergences, the last minimum wins
    hist[299] = 1
    edges = np.linspace(0, 3, 301, dtype=np.float32)
    assert float(_compute_amax_entropy(hist.copy(), edges, 8, False)) == np.float32(
        _ref_entropy(hist, edges, 8, False)
    )
    assert _compute_amax_entropy(None, None, 8, False) is None


@pytest.mark.parametrize("torch_hist", [True, False])
@pytest.mark.parametrize("unsigned", [False, True])
def test_mse_and_percentile_match_reference(torch_hist, unsigned):
    cal = calib.HistogramCalibrator(8, None, unsigned, num_bins=400, torch_hist=torch_hist)
    for x in _batches(5):
        cal.collect(x)
    hist, edges = _np_hist(cal)
    for kw in ({}, {"stride": 7, "start_bin": 60}):
        got = cal.compute_amax("mse", **kw)
        assert got.dtype == torch.float32 and float(got) == _ref_mse(hist, edges, 8, unsigned, **kw)
    for p in (0.0, 50.0, 99.0, 99.99, 100.0):
        got = cal.compute_amax("percentile", percentile=p)
        assert float(got) == np.float32(_ref_percentile(hist, edges, p))


def test_numpy_grid_entropy_changes_bin_zero_like_upstream():
    cal = calib.HistogramCalibrator(8, None, False, num_bins=256, torch_hist=False)
    cal.collect(torch.cat([torch.zeros(500), torch.rand(1000)]))
    before = cal._calib_hist.copy()
    cal.compute_amax("entropy")
    assert cal._calib_hist[0] == before[1] != before[0]  # upstream's in-place bins[0] = bins[1]


# ---------------------------------------------------------------- errors
def test_errors_are_upstreams():
    with pytest.raises(NotImplementedError, match="per tensor"):
        calib.HistogramCalibrator(8, 0, False)
    cal = calib.HistogramCalibrator(8, None, False)
    assert cal.compute_amax("entropy") is None and cal.compute_amax("mse") is None
    cal.collect(torch.arange(100))
    with pytest.raises(TypeError, match="Unknown calibration method"):
        cal.compute_amax("max")
    for p in (-10, 200):
        with pytest.raises(ValueError, match="range"):
            cal.compute_amax("percentile", percentile=p)
    hist, edges = _np_hist(cal)
    with pytest.raises(TypeError, match="num_bits"):
        _compute_amax_mse(hist, edges, (5, 2), False)
    with pytest.raises(ValueError, match="start_bin"):
        _compute_amax_mse(hist, edges, 8, False, start_bin=5000)
    with pytest.raises(ValueError, match="range"):
        _compute_amax_percentile(None, None, 101)
    with pytest.raises(ValueError, match="grid"):
        calib.HistogramCalibrator(8, None, False, grid="fancy")


def test_printing():
    cal = calib.HistogramCalibrator(8, None, True)
    assert str(cal) == "HistogramCalibrator(calib_bin_edges=None)"
    cal.collect(torch.arange(11))
    assert str(cal) == "HistogramCalibrator(calib_bin_edges=[0.000, ..., 10.000](2049))"
    assert repr(cal).startswith("HistogramCalibrator(num_bits=8 axis=None unsigned=True ")


# ---------------------------------------------------------------- calibrate_weights
class _Net(nn.Module):
    def __init__(self) -> None:
        from qdq.compat.pytorch_quantization import nn as quant_nn

        super().__init__()
        self.conv = quant_nn.QuantConv2d(2, 6, 3)
        self.up = quant_nn.QuantConvTranspose2d(6, 4, 2)
        self.fc = quant_nn.QuantLinear(8, 5)


def test_calibrate_weights_values_and_shapes():
    torch.manual_seed(7)
    net = _Net()
    calib.calibrate_weights(net, method="max")
    assert torch.equal(
        net.conv.weight_quantizer.amax, net.conv.weight.detach().abs().amax((1, 2, 3), True)
    )
    assert net.up.weight_quantizer.amax.shape == (
        1,
        4,
        1,
        1,
    )  # transposed: output channels on dim 1
    calib.calibrate_weights(
        net, method="percentile", perchannel=True, percentile=99.0, num_bins=256
    )
    w = net.fc.weight.detach()[3].abs().numpy()
    hist, edges = np.histogram(w, bins=256, range=(0, w.max()))
    assert float(net.fc.weight_quantizer.amax[3, 0]) == np.float32(
        _ref_percentile(hist, edges, 99.0)
    )
    torch.manual_seed(7)
    flat = _Net()
    calib.calibrate_weights(flat, method="mse", perchannel=False)
    ref = calib.HistogramCalibrator(8, None, False)
    ref.collect(flat.conv.weight.detach())
    assert torch.equal(flat.conv.weight_quantizer.amax.reshape(()), ref.compute_amax("mse"))
    with pytest.raises(TypeError, match="Unsupported calibration method"):
        calib.calibrate_weights(flat, method="entropy")


# ---------------------------------------------------------------- qdq's grid (opt-in)
def test_qdq_grid_does_not_depend_on_batch_order():
    data = _batches(9, n=4)
    fwd = calib.HistogramCalibrator(8, None, False, grid="qdq")
    rev = calib.HistogramCalibrator(8, None, False, grid="qdq")
    for x in data:
        fwd.collect(x)
    for x in reversed(data):
        rev.collect(x)
    for method in ("entropy", "mse", "percentile", "max"):
        assert torch.equal(fwd.compute_amax(method), rev.compute_amax(method))
    assert torch.equal(fwd._calib_hist, rev._calib_hist)
    up_fwd, up_rev = (
        calib.HistogramCalibrator(8, None, False),
        calib.HistogramCalibrator(8, None, False),
    )
    for x in data:
        up_fwd.collect(x)
    for x in reversed(data):
        up_rev.collect(x)
    assert not torch.equal(
        up_fwd._calib_bin_edges, up_rev._calib_bin_edges[: len(up_fwd._calib_bin_edges)]
    )
    fwd.reset()
    assert fwd.compute_amax("entropy") is None


@pytest.mark.gpu
def test_histogram_on_cuda_matches_cpu_counts():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    x = torch.randn(5000, generator=torch.Generator().manual_seed(4))
    cpu, gpu = calib.HistogramCalibrator(8, None, False), calib.HistogramCalibrator(8, None, False)
    cpu.collect(x)
    gpu.collect(x.cuda())
    cpu.collect(x * 2)
    gpu.collect(x.cuda() * 2)
    assert gpu._calib_hist.is_cuda and gpu.compute_amax("mse").is_cuda
    assert int(gpu._calib_hist.sum()) == int(cpu._calib_hist.sum()) == 10000
    width = float(cpu._calib_bin_edges[1])  # histc may round a boundary value differently on CUDA
    for method in ("mse", "percentile"):
        assert abs(float(cpu.compute_amax(method)) - float(gpu.compute_amax(method))) <= 4 * width
    assert 0 < float(gpu.compute_amax("entropy")) <= float(gpu._calib_bin_edges[-1])
    mx = calib.MaxCalibrator(8, 0, False)
    mx.collect(x.reshape(50, 100).cuda())
    assert mx.compute_amax().is_cuda
