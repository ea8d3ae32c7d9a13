"""Calibrators: reference equality, streaming invariance, exact counts, errors, properties."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qdq.calib.histogram as histogram_module
from qdq.calib import (
    CalibrationError,
    HistogramCalibrator,
    MaxCalibrator,
    entropy_amax,
    make_calibrator,
    mse_amax,
    percentile_amax,
)
from qdq.config import CalibSpec, QuantSpec
from reference_calib import (
    entropy_reference,
    mse_exhaustive,
    mse_reference,
    percentile_reference,
    random_histogram,
)

METHODS = ("max", "entropy", "mse", "percentile")


def _activations(seed: int = 0, n: int = 200_000) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.relu(torch.randn(n, generator=g)) * 1.7
    x[:20] = torch.rand(20, generator=g) * 20  # a few outliers
    return x


# ------------------------------------------------------------------------ max
def test_max_calibrator_per_tensor_and_per_channel() -> None:
    cal = MaxCalibrator()
    cal.collect(torch.tensor([1.0, -4.0]))
    cal.collect(torch.tensor([3.0, 2.0]))
    assert cal.compute_amax().item() == 4.0
    per = MaxCalibrator(axis=1)
    per.collect(torch.tensor([[1.0, -5.0, 0.0], [2.0, 1.0, 0.5]]))
    per.collect(torch.tensor([[-3.0, 1.0, 0.0], [0.0, 0.0, 0.0]]))
    assert per.compute_amax().tolist() == [3.0, 5.0, 0.5]
    assert per.num_batches == 2


def test_max_calibrator_rejects_changed_channel_count() -> None:
    cal = MaxCalibrator(axis=0)
    cal.collect(torch.ones(3, 2))
    with pytest.raises(CalibrationError, match="batch 1 has 4 channels"):
        cal.collect(torch.ones(4, 2))


@pytest.mark.parametrize("make", [MaxCalibrator, lambda: MaxCalibrator(axis=0),
                                  HistogramCalibrator])  # fmt: skip
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nan_and_inf_batches_name_the_batch(make, bad) -> None:
    """The first batch with NaN or inf is named, at the latest when amax is read (a GPU reads
    nothing back while collecting, whatever came after it)."""
    cal = make()
    cal.collect(torch.ones(2, 3))
    with pytest.raises(CalibrationError, match="batch 1 contains NaN or inf"):
        cal.collect(torch.tensor([[1.0, bad, 0.0], [0.0, 0.0, 0.0]]))
        cal.collect(torch.tensor([[bad, 2.0, 0.0], [0.0, 0.0, 0.0]]))
        cal.collect(torch.ones(2, 3))
        cal.compute_amax()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_device_that_reads_nothing_back_names_the_bad_batch_when_amax_is_read(
    bad, monkeypatch
) -> None:
    """The histogram's path for a device where reading back waits for it (a GPU without the
    fused kernels), run on the CPU: NaN and inf are binned into range, the same counts as the
    CPU path otherwise, and the first bad batch named when amax is read."""
    from qdq.calib import histogram

    monkeypatch.setattr(histogram, "reads_free", lambda device: False)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(300, generator=g) * s for s in (0.01, 3.0, 1e-9, 40.0)]
    device_path = HistogramCalibrator()
    for b in batches:
        device_path.collect(b)
    monkeypatch.undo()
    cpu_path = HistogramCalibrator()
    for b in batches:
        cpu_path.collect(b)
    for a, b in zip(device_path.histogram(), cpu_path.histogram(), strict=True):
        assert (a == b).all()
    assert device_path.observed_max == cpu_path.observed_max
    monkeypatch.setattr(histogram, "reads_free", lambda device: False)
    cal = HistogramCalibrator()
    cal.collect(torch.ones(2, 3))
    cal.collect(torch.tensor([1.0, bad, -2.0]))
    cal.collect(torch.tensor([bad, 5.0]))
    with pytest.raises(CalibrationError, match="batch 1 contains NaN or inf"):
        cal.compute_amax("mse")


@pytest.mark.parametrize("reads_free", [True, False])
def test_batches_merged_many_at_a_time_give_the_counts_of_one_batch(
    reads_free, monkeypatch
) -> None:
    """Batches wait to be merged, ``MERGE_EVERY`` at a time (issue 48: a fixed cost per merge
    instead of one per batch): over several merges, with ranges that grow and shrink between
    and within them, the counts, the maximum and every method's amax are those of one batch of
    everything; the first bad batch is named by its index, also when it comes after a merge and
    when a later merge adds another."""
    from qdq.calib import histogram

    monkeypatch.setattr(histogram, "reads_free", lambda device: reads_free)
    g = torch.Generator().manual_seed(1)
    n = 2 * histogram.MERGE_EVERY + 3
    scales = [10.0 ** ((7 * i) % 9 - 4) for i in range(n)]  # 1e-4 .. 1e4, not monotonic
    batches = [torch.randn(257, generator=g) * s for s in scales]
    merged, whole = HistogramCalibrator(), HistogramCalibrator()
    for b in batches:
        merged.collect(b)
    whole.collect(torch.cat(batches))
    for a, b in zip(merged.histogram(), whole.histogram(), strict=True):
        assert (a == b).all()
    assert merged.observed_max == whole.observed_max
    for method in HistogramCalibrator.methods:
        assert merged.compute_amax(method) == whole.compute_amax(method), method
    if reads_free:
        return  # the CPU path names a bad batch as it comes (the test above)
    bad = HistogramCalibrator()
    first = histogram.MERGE_EVERY + 3  # after a merge, and after an empty batch
    for i, b in enumerate(batches):
        if i == first - 2:
            b = torch.empty(0)
        bad.collect(b if i not in (first, n - 1) else torch.tensor([1.0, float("nan")]))
    with pytest.raises(CalibrationError, match=f"batch {first} contains NaN or inf"):
        bad.compute_amax("max")


@pytest.mark.parametrize("cal", [MaxCalibrator(), HistogramCalibrator()])
def test_empty_calibration_is_an_error(cal) -> None:
    with pytest.raises(CalibrationError, match="no data"):
        cal.compute_amax("max")


def test_unknown_method_and_misplaced_percentile() -> None:
    cal = HistogramCalibrator()
    cal.collect(torch.randn(100))
    with pytest.raises(ValueError, match="unknown calibration method 'kl'"):
        cal.compute_amax("kl")
    with pytest.raises(ValueError, match="only used by method='percentile'"):
        cal.compute_amax("entropy", percentile=99.0)
    with pytest.raises(ValueError, match=r"percentile must be in \(0, 100\]"):
        cal.compute_amax("percentile", percentile=120.0)
    with pytest.raises(ValueError, match="unknown calibration method 'entropy'"):
        MaxCalibrator().compute_amax("entropy")


@pytest.mark.parametrize("bins", [100, 128, 3000])
def test_histogram_bins_must_be_power_of_two(bins: int) -> None:
    with pytest.raises(ValueError, match="power of two"):
        HistogramCalibrator(bins)


def test_collect_rejects_non_tensors_and_integers() -> None:
    with pytest.raises(TypeError, match="torch.Tensor"):
        HistogramCalibrator().collect([1.0, 2.0])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="floating-point"):
        MaxCalibrator().collect(torch.ones(3, dtype=torch.int64))


# ----------------------------------------------------------------- histogram
def test_streaming_gives_identical_histogram_and_amax() -> None:
    x = _activations()
    # make the first batch small so a frozen-first-batch histogram would be badly off
    order = torch.argsort(x)
    x = torch.cat([x[order[:1000]], x[order[1000:]][torch.randperm(x.numel() - 1000)]])
    one = HistogramCalibrator()
    one.collect(x)
    many = HistogramCalibrator()
    for chunk in torch.chunk(x, 50):
        many.collect(chunk)
    assert many.num_batches == 50
    c1, e1 = one.histogram()
    c2, e2 = many.histogram()
    assert np.array_equal(c1, c2) and np.array_equal(e1, e2)
    for method in METHODS:
        assert torch.equal(one.compute_amax(method), many.compute_amax(method)), method


def test_histogram_resolution_and_range() -> None:
    cal = HistogramCalibrator(256)
    cal.collect(torch.tensor([0.0, 0.3, 5.0]))
    counts, edges = cal.histogram()
    assert edges[0] == 0.0 and edges[-1] >= 5.0
    assert len(counts) > 256  # at least num_bins bins span [0, max]
    assert counts.sum() == 3
    cal.collect(torch.tensor([1000.0]))  # grows by merging, nothing lost
    counts, edges = cal.histogram()
    assert counts.sum() == 4 and edges[-1] >= 1000.0
    assert cal.observed_max == 1000.0


def test_huge_tensor_counts_are_exact() -> None:
    n = (1 << 25) + 7  # more than float32 can count exactly in one bin
    x = torch.zeros(n)
    x[-1] = 1.0
    cal = HistogramCalibrator()
    cal.collect(x)
    counts, _ = cal.histogram()
    assert int(counts[0]) == n - 1 and int(counts.sum()) == n


@pytest.fixture
def torch_threads() -> Iterator[Callable[[int], None]]:
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_counts_equal_a_direct_floor_count(
    dtype: torch.dtype, threads: int, torch_threads: Callable[[int], None]
) -> None:
    # several chunks of the CPU kernels (one thread: torch.bincount; three: scatter_add_ rows, the
    # last piece padded), signs, bin edges hit exactly, the range top itself and a non-contiguous
    # view: every value lands in bin floor(|x| / width), the top value in the last
    torch_threads(threads)
    g = torch.Generator().manual_seed(3)
    n = histogram_module._SCATTER_CHUNK + 3 * histogram_module._CPU_CHUNK + 11
    x = (torch.randn(n, generator=g, dtype=dtype) * 3).clamp(-3.9, 3.9)
    x[:64] = torch.arange(64, dtype=dtype) / 512 - 1 / 16  # exact multiples of the bin width
    x[64] = -4.0  # = 2**e: the top of the range
    view = x.view(-1, 1).expand(-1, 2).t()[0]  # strided: every value once
    for data in (view, x.abs()):  # signed, and non-negative (no abs pass)
        cal = HistogramCalibrator(num_bins=2048)
        cal.collect(data)
        counts, edges = cal.histogram()
        width = edges[1]
        assert edges[-1] == 4.0 and width == 4.0 / 4096
        ref = np.floor(np.abs(x.numpy().astype(np.float64)) / width).astype(np.int64)
        ref = np.minimum(ref, 4095)
        assert np.array_equal(counts, np.bincount(ref, minlength=4096)[: len(counts)])
        assert int(counts.sum()) == x.numel()


def test_all_zero_data_gives_zero_amax() -> None:
    cal = HistogramCalibrator()
    cal.collect(torch.zeros(10))
    for method in METHODS:
        assert cal.compute_amax(method).item() == 0.0


def test_histogram_methods_are_capped_at_observed_max() -> None:
    cal = HistogramCalibrator()
    cal.collect(_activations(1))
    top = cal.compute_amax("max").item()
    for method in METHODS:
        assert 0 < cal.compute_amax(method).item() <= top
    assert cal.compute_amax("percentile", percentile=100.0).item() == top


def test_reset_forgets_everything() -> None:
    cal = HistogramCalibrator()
    cal.collect(torch.ones(5))
    cal.reset()
    assert cal.num_batches == 0
    with pytest.raises(CalibrationError):
        cal.histogram()


def test_half_precision_and_float64_batches() -> None:
    cal = HistogramCalibrator()
    cal.collect(torch.linspace(-2, 2, 1001, dtype=torch.float16))
    cal.collect(torch.linspace(-3, 3, 1001, dtype=torch.float64))
    assert cal.compute_amax("max").item() == 3.0


# -------------------------------------------------- methods vs reference loops
def _calibrated_histogram(x: torch.Tensor) -> tuple[np.ndarray, np.ndarray, float]:
    cal = HistogramCalibrator(256)
    cal.collect(x)
    counts, edges = cal.histogram()
    return counts, edges, cal.observed_max


@pytest.mark.parametrize("seed", range(3))
def test_entropy_matches_reference_on_real_histograms(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    data = [
        _activations(seed),
        torch.randn(100_000, generator=g),
        torch.distributions.Laplace(0.0, 1.0).sample((100_000,)),
        torch.randint(0, 256, (50_000,), generator=g).float() / 255,  # 8-bit image pixels
    ]
    for x in data:
        counts, edges, _ = _calibrated_histogram(x)
        expected, _ = entropy_reference(counts, edges)
        assert entropy_amax(counts, edges) == expected


def test_entropy_matches_reference_on_a_2048_bin_histogram() -> None:
    x = _activations(7)
    counts, edges = np.histogram(x.numpy(), bins=2048, range=(0.0, float(x.max())))
    expected, _ = entropy_reference(counts, edges)
    assert entropy_amax(counts, edges) == expected


def _random_histogram(rng: np.random.Generator, kind: int, n: int) -> np.ndarray:
    j = np.arange(n)
    if kind == 0:
        return rng.integers(0, 5, size=n)
    if kind == 1:
        return rng.poisson(1e6 * np.exp(-j / rng.uniform(10, 80)))
    if kind == 2:
        return rng.integers(0, 2, size=n) * rng.integers(1, 10**9, size=n)
    c = np.zeros(n, dtype=np.int64)  # a few isolated spikes, some near zero
    idx = rng.choice(n, size=int(rng.integers(2, 20)), replace=False)
    c[idx] = rng.integers(1, 1000, size=idx.size)
    c[int(rng.integers(0, 3))] += 5
    return c


def test_entropy_matches_reference_on_random_histograms() -> None:
    rng = np.random.default_rng(1)
    checked = 0
    for t in range(120):
        n = int(rng.integers(130, 300))
        counts = _random_histogram(rng, t % 4, n)
        edges = np.linspace(0.0, 1.0, n + 1)
        expected, div = entropy_reference(counts, edges)
        if np.isnan(div).any():
            continue  # the documented NaN case, tested below
        assert entropy_amax(counts, edges) == expected, f"case {t}"
        checked += 1
    assert checked >= 100


def test_entropy_options_match_reference() -> None:
    counts, edges, _ = _calibrated_histogram(_activations(3))
    for kw in ({"num_bits": 7}, {"unsigned": True}, {"start_bin": 200, "stride": 3}):
        expected, _ = entropy_reference(counts, edges, **kw)
        assert entropy_amax(counts, edges, **kw) == expected, kw


def test_entropy_documented_deviation_when_the_first_bins_are_empty() -> None:
    # all mass beyond bin 200: the reference's KL is 0/0 = NaN for small candidates, and its
    # argmin selects a NaN candidate, clipping every value; we treat those candidates as infinite
    counts = np.zeros(300, dtype=np.int64)
    counts[250:] = 100
    edges = np.linspace(0.0, 1.0, 301)
    reference, div = entropy_reference(counts, edges)
    assert np.isnan(div).any() and reference <= edges[250]
    assert entropy_amax(counts, edges) > edges[250]


def test_entropy_needs_enough_bins() -> None:
    with pytest.raises(ValueError, match="at least"):
        entropy_amax(np.ones(100, dtype=np.int64), np.linspace(0, 1, 101))


@pytest.mark.parametrize("seed", range(3))
def test_mse_matches_reference(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for x in (_activations(seed, 50_000), torch.randn(50_000, generator=g)):
        cal = HistogramCalibrator(256)
        cal.collect(x)
        counts, edges = cal.histogram()
        expected = mse_reference(counts, edges, cal.observed_max)
        assert mse_amax(counts, edges, observed_max=cal.observed_max) == expected
        assert cal.compute_amax("mse").item() == pytest.approx(min(expected, cal.observed_max))


@pytest.mark.parametrize("seed", range(4))
def test_mse_bounded_search_equals_the_exhaustive_one(seed: int) -> None:
    # dense, sparse, decaying, spiky and huge counts; power-of-two and other bin widths, other
    # bit widths, an observed max inside the top bin or none: the same amax, bit for bit
    rng = np.random.default_rng(seed)
    for trial in range(60):
        counts, edges, top = random_histogram(rng, trial)
        bits = int(rng.choice([8, 4, 2]))
        expected = mse_exhaustive(counts, edges, top, bits)
        assert mse_amax(counts, edges, observed_max=top, num_bits=bits) == expected


def test_mse_tries_the_plain_maximum() -> None:
    # one repeated value: every bin edge below it clips it, only 1.0 x max does not
    cal = HistogramCalibrator()
    cal.collect(torch.full((1000,), 0.7))
    assert cal.compute_amax("mse").item() == pytest.approx(0.7)
    assert cal.compute_amax("mse").item() == cal.compute_amax("max").item()


def test_mse_on_uniform_data_clips_a_little() -> None:
    # for U(0, 1) the expected error (a/127)**2/12 + (1-a)**3/3 is smallest at a ~ 0.9968
    cal = HistogramCalibrator()
    cal.collect(torch.linspace(0.0, 1.0, 100_001))
    assert 0.993 < cal.compute_amax("mse").item() < 1.0


@pytest.mark.parametrize("p", [50.0, 99.0, 99.9, 99.99, 99.999, 100.0])
def test_percentile_matches_reference(p: float) -> None:
    counts, edges, _ = _calibrated_histogram(_activations(5))
    assert percentile_amax(counts, edges, p) == percentile_reference(counts, edges, p)


def test_percentile_bounds_the_fraction_of_clipped_values() -> None:
    x = _activations(2)
    cal = HistogramCalibrator()
    cal.collect(x)
    for p in (99.0, 99.99):
        amax = cal.compute_amax("percentile", percentile=p).item()
        assert int((x <= amax).sum()) * 100 >= p * x.numel()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 10_000), min_size=4, max_size=300),
    st.floats(0.01, 100.0),
    st.floats(0.01, 100.0),
)
def test_percentile_is_monotonic(counts: list[int], p1: float, p2: float) -> None:
    c = np.array(counts, dtype=np.int64)
    if c.sum() == 0:
        c[-1] = 1
    edges = np.linspace(0.0, 3.0, len(c) + 1)
    lo, hi = sorted((p1, p2))
    assert percentile_amax(c, edges, lo) <= percentile_amax(c, edges, hi)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 50), st.integers(0, 2**31 - 1))
def test_any_batching_gives_the_same_amax(num_batches: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(5000, generator=g) * torch.rand(1, generator=g) * 10
    whole = HistogramCalibrator(256)
    whole.collect(x)
    parts = HistogramCalibrator(256)
    for chunk in torch.chunk(x[torch.randperm(5000, generator=g)], num_batches):
        parts.collect(chunk)
    for method in METHODS:
        assert torch.equal(whole.compute_amax(method), parts.compute_amax(method))


# ---------------------------------------------------------------- factory
def test_make_calibrator_matches_spec() -> None:
    assert isinstance(make_calibrator(QuantSpec(axis=0), CalibSpec.weights()), MaxCalibrator)
    assert isinstance(make_calibrator(QuantSpec(), CalibSpec()), HistogramCalibrator)
    with pytest.raises(ValueError, match="needs calibrator='max'"):
        make_calibrator(QuantSpec(axis=0), CalibSpec())


@pytest.mark.gpu
def test_histogram_stays_on_cuda() -> None:
    x = _activations().cuda()
    cal = HistogramCalibrator()
    cal.collect(x)
    cpu = HistogramCalibrator()
    cpu.collect(x.cpu())
    for method in METHODS:
        amax = cal.compute_amax(method)
        assert amax.device.type == "cuda"
        assert amax.item() == cpu.compute_amax(method).item()


def test_mse_drops_the_candidates_that_clip_too_much_and_keeps_the_answer() -> None:
    from qdq.calib import methods

    cal = HistogramCalibrator()
    cal.collect(_activations(0, 200_000))
    counts, edges = cal.histogram()
    centers = (edges[:-1] + edges[1:]) / 2
    w = counts.astype(np.float64)
    cands = np.concatenate([edges[128 : counts.size], [cal.observed_max]])
    low = methods._clipped_too_much(cands, centers, w, 127.0, methods._suffix_sums(w, centers))
    assert 0 < low < cands.size  # most small candidates clip more error than the best probe
    best = mse_amax(counts, edges, observed_max=cal.observed_max)
    assert best == mse_exhaustive(counts, edges, cal.observed_max, 8) and best >= cands[low]


# ----------------------------------------------------------------- below the 2**-24 floor (issue 31)
def test_below_the_floor_every_method_gives_the_observed_max() -> None:
    """Vanishing activations (random-weight MobileNetV3 / YOLO reach 1e-10) fill only the first
    bins of the [0, 2**-24] grid: entropy used to refuse them ("needs 128 bins, got 10")."""
    from qdq.calib.histogram import FLOOR
    from qdq.quant import MIN_AMAX

    assert FLOOR == MIN_AMAX  # the grid's floor is the amax floor of quantization
    cal = HistogramCalibrator()
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)).abs() * 1e-10
    cal.collect(x)
    counts, _ = cal.histogram()
    assert len(counts) < 128 and cal.below_floor
    for method in ("max", "entropy", "mse", "percentile"):
        assert float(cal.compute_amax(method)) == pytest.approx(float(x.max()), rel=1e-6)


def test_just_above_the_floor_the_methods_search_again() -> None:
    cal = HistogramCalibrator()
    x = torch.randn(1 << 14, generator=torch.Generator().manual_seed(1)) * 2.0**-22
    cal.collect(x)
    assert not cal.below_floor and len(cal.histogram()[0]) > 2048
    entropy = float(cal.compute_amax("entropy"))
    assert 0 < entropy < float(x.abs().max())


def test_recompute_amax_on_vanishing_activations_warns_and_never_raises() -> None:
    import qdq

    net = torch.nn.Sequential(
        torch.nn.Conv2d(16, 32, 3), torch.nn.ReLU(), torch.nn.Conv2d(32, 32, 3), torch.nn.ReLU()
    ).eval()
    with torch.no_grad():
        net[2].weight.mul_(1e-12)  # the second conv's output vanishes: its consumers see ~1e-12
        net[2].bias.mul_(1e-12)
    x = torch.rand(8, 16, 12, 12, generator=torch.Generator().manual_seed(0))
    prepared = qdq.prepare(torch.nn.Sequential(net, torch.nn.Conv2d(32, 16, 1)).eval(), (x[:1],))
    with pytest.warns(UserWarning, match=r"only values at or below 2\*\*-24"):
        qdq.calibrate(prepared, [x], method="entropy", show_progress=False)
    for method in ("max", "mse", "percentile"):
        with pytest.warns(UserWarning, match="vanishing"):
            qdq.recompute_amax(prepared, method)
    quantizers = qdq.quantizers_of(prepared).values()
    tiny = [q for q in quantizers if getattr(q.calibrator, "below_floor", False)]
    assert tiny and all(float(q.amax) == q.calibrator.observed_max for q in tiny)
