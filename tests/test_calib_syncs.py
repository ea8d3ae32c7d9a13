"""Computing every amax after calibration reads the device back O(1) times, not per quantizer.

:func:`qdq.calib.batched.read_back` reads what every calibrator needs in one transfer, and
:func:`qdq.quant.primitives.batched_amax_checks` checks every amax (and reads the largest entry of
each, for the warnings) in one more (issue 48: 4-5 host syncs per activation quantizer before).
The amax must be those of the per-quantizer path, bit for bit, and so must the warnings and errors.
Host syncs are counted with the probes of ``benchmarks/gpu_proxy_probes.py``.
"""

from __future__ import annotations

import copy
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import qdq
from qdq.calib import CalibrationError, HistogramCalibrator, MaxCalibrator, histogram
from qdq.calib.batched import read_back
from qdq.calib.methods import entropy_amax, mse_amax, percentile_amax
from qdq.config import CalibSpec, QuantConfig
from qdq.quant.primitives import batched_amax_checks, check_amax_values

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_proxy_probes as probes

METHODS = ("max", "entropy", "mse", "percentile")
C = 32


def _chain(blocks: int, channels: int) -> nn.Module:
    torch.manual_seed(blocks)
    layers: list[nn.Module] = []
    for _ in range(blocks):
        layers += [nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU()]
    return nn.Sequential(*layers).eval()


def _calibrated(blocks: int, calibrator: str = "histogram", fmt: str = "int8") -> nn.Module:
    """A chain of convolutions of ``C`` channels (fewer stay float: rules H02, F03), calibrated
    on 3 batches."""
    calib = CalibSpec(calibrator=calibrator, method="max" if calibrator == "max" else "mse")
    config = QuantConfig(activation_calib=calib, format=fmt)
    x = torch.randn(2, C, 8, 8, generator=torch.Generator().manual_seed(1))
    prepared = qdq.prepare(_chain(blocks, C), (x[:1],), config=config)
    data = [torch.randn(2, C, 8, 8, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qdq.calibrate(prepared, data, method="max", show_progress=False)
    return prepared


def _activations(prepared: nn.Module) -> dict[str, qdq.Quantizer]:
    return {n: q for n, q in qdq.quantizers_of(prepared).items() if not q.name.endswith(":weight")}


def _amax_syncs(prepared: nn.Module, method: str) -> int:
    def run() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            qdq.recompute_amax(prepared, method)

    return len(probes.count(run, host_reads=True).syncs)


# ------------------------------------------------------------------------------ same amax
@pytest.mark.parametrize("fmt", ["int8", "fp8"])
def test_every_method_gives_the_per_quantizer_amax_bit_for_bit(fmt: str) -> None:
    prepared = _calibrated(4, fmt=fmt)
    acts = _activations(prepared)
    assert len(acts) >= 4
    for method in (m for m in METHODS if not (fmt == "fp8" and m == "entropy")):
        alone = copy.deepcopy(prepared)
        expected = {}
        for n, q in _activations(alone).items():
            cal = q.calibrator
            assert isinstance(cal, HistogramCalibrator)
            cal._read, cal._host_counts = None, None  # as collected: each one reads its own
            assert cal.fmt == fmt
            expected[n] = cal.compute_amax(method)
            counts, edges = cal.histogram()
            top = cal.observed_max
            if method == "max":
                value = top
            elif method == "entropy":
                value = min(entropy_amax(counts, edges), top)
            elif method == "mse":
                value = min(mse_amax(counts, edges, observed_max=top, fmt=fmt), top)
            else:
                value = min(percentile_amax(counts, edges, 99.99), top)
            assert expected[n].item() == np.float32(value), (method, n)
        qdq.recompute_amax(prepared, method)
        for n, q in acts.items():
            assert torch.equal(q.amax, expected[n]), (method, n)
            assert q.amax_method == method


def test_max_calibrators_give_the_same_amax() -> None:
    prepared = _calibrated(3, calibrator="max")
    alone = copy.deepcopy(prepared)
    expected = {n: q.calibrator.compute_amax("max") for n, q in _activations(alone).items()}
    qdq.recompute_amax(prepared, "max")
    for n, q in _activations(prepared).items():
        assert isinstance(q.calibrator, MaxCalibrator)
        assert torch.equal(q.amax, expected[n])


def test_read_back_hands_each_calibrator_its_own_state() -> None:
    cals = [HistogramCalibrator(256) for _ in range(3)] + [MaxCalibrator(), MaxCalibrator(axis=0)]
    for i, cal in enumerate(cals):
        for b in range(2):
            cal.collect(torch.randn(3, 50, generator=torch.Generator().manual_seed(10 * i + b)))
    alone = copy.deepcopy(cals)
    methods = ["mse", "max", "percentile", "max", "max"]
    assert read_back(zip(cals, methods, strict=True)) == 1
    for cal, ref, method in zip(cals, alone, methods, strict=True):
        assert torch.equal(cal.compute_amax(method), ref.compute_amax(method))
    hist = cals[0]
    assert isinstance(hist, HistogramCalibrator)
    for a, b in zip(hist.histogram(), alone[0].histogram(), strict=True):  # type: ignore[union-attr]
        np.testing.assert_array_equal(a, b)
    hist.collect(torch.full((10,), 100.0))  # a new batch: read again, never the stale copy
    assert hist.observed_max == 100.0 and hist.histogram()[0].sum() == 310


# ------------------------------------------------------------------------------ O(1) syncs
@pytest.mark.parametrize("calibrator", ["histogram", "max"])
def test_host_syncs_computing_amax_do_not_grow_with_the_quantizers(
    calibrator: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2 in all (the calibrators' statistics; the amax checks with the largest entries), for 2
    or 8 activation quantizers (before: 5 per quantizer, 24 and 64 on tiny_cnn and tiny_vit)."""
    monkeypatch.setattr(histogram, "reads_free", lambda device: False)  # a GPU's path
    small, large = _calibrated(2, calibrator), _calibrated(8, calibrator)
    assert len(_activations(large)) >= 4 * len(_activations(small))
    methods = METHODS if calibrator == "histogram" else ("max",)
    for method in methods:
        assert _amax_syncs(small, method) == _amax_syncs(large, method) <= 2, method


def test_a_whole_calibration_of_one_batch_syncs_twice_on_a_device_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(histogram, "reads_free", lambda device: False)
    prepared = _calibrated(6)
    data = [torch.randn(2, C, 8, 8)]
    probe = probes.count(
        lambda: qdq.calibrate(prepared, data, show_progress=False), host_reads=True
    )
    assert len(probe.syncs) == 2, probe.sync_sites()


# ------------------------------------------------------------------------------ errors, warnings
@pytest.mark.parametrize("calibrator", ["histogram", "max"])
def test_a_bad_batch_is_named_with_its_quantizer_after_the_batched_read(
    calibrator: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(histogram, "reads_free", lambda device: False)  # nothing read collecting
    prepared = _calibrated(3, calibrator)
    names = list(_activations(prepared))
    q = _activations(prepared)[names[1]]
    q.calibrator.collect(torch.full((5,), float("nan")))
    with pytest.raises(CalibrationError, match=rf"quantizer '{q.name}': calibration batch 3 .*NaN"):
        qdq.recompute_amax(prepared, "max")


def test_batched_checks_raise_the_first_bad_amax_as_one_check_would() -> None:
    values = [torch.tensor(1.0), torch.tensor([0.5, -2.0]), torch.tensor(float("inf"))]
    with pytest.raises(ValueError) as one:
        check_amax_values(values[1], what="b")
    with pytest.raises(ValueError) as batched, batched_amax_checks():
        for what, v in zip("abc", values, strict=True):
            check_amax_values(v, what=what)  # nothing raised here
    assert (
        str(batched.value)
        == str(one.value)
        == ("b has negative values at index [1]: amax must be >= 0")
    )
    with pytest.raises(ValueError, match="empty"), batched_amax_checks():
        check_amax_values(torch.empty(0), what="e")  # at once


def test_batched_checks_keep_the_watched_maxima_and_the_body_error_first_checks() -> None:
    with batched_amax_checks() as checks:
        checks.watch("x", torch.tensor([0.0, 2.5]))
        checks.watch("y", torch.tensor(0.0))
    assert checks.largest == {"x": 2.5, "y": 0.0}
    with pytest.raises(ValueError, match="non-finite"), batched_amax_checks():
        check_amax_values(torch.tensor(float("nan")), what="n")
        raise KeyError("later")  # the amax checked before it failed first


def test_zero_and_vanishing_amax_warn_by_name_from_the_one_read() -> None:
    prepared = _calibrated(3)
    acts = _activations(prepared)
    names = list(acts)
    acts[names[0]].calibrator.reset()
    acts[names[0]].calibrator.collect(torch.zeros(10))
    acts[names[2]].calibrator.reset()
    acts[names[2]].calibrator.collect(torch.full((10,), 1e-9))
    with pytest.warns(UserWarning) as record:
        qdq.recompute_amax(prepared, "mse")
    messages = [str(w.message) for w in record]
    assert len(messages) == 2
    assert messages[0].startswith(f"1 quantizer(s) have amax 0 (they saw only zeros during "
                                  f"calibration): {[names[0]]}")  # fmt: skip
    assert messages[1].startswith(
        f"1 quantizer(s) saw only values at or below 2**-24 (largest {1e-9:.3g}; vanishing "
        f"activations, e.g. random weights): {[names[2]]}"
    )


@pytest.mark.gpu
def test_on_cuda_every_method_gives_the_cpu_amax_with_two_host_syncs() -> None:
    on_cpu = _calibrated(4)
    on_gpu = copy.deepcopy(on_cpu).cuda()
    data = [torch.randn(2, C, 8, 8, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    for prepared, device in ((on_cpu, "cpu"), (on_gpu, "cuda")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            qdq.calibrate(prepared, [x.to(device) for x in data], show_progress=False)
    for method in METHODS:
        assert _amax_syncs(on_gpu, method) <= 2, method
        qdq.recompute_amax(on_cpu, method)
        gpu = _activations(on_gpu)
        for n, q in _activations(on_cpu).items():
            assert gpu[n].amax.device.type == "cuda"
            assert torch.equal(q.amax, gpu[n].amax.cpu()), (method, n)


@pytest.mark.gpu
def test_on_cuda_calibration_batches_never_wait_for_the_device() -> None:
    """Forwards in calibration mode over more batches than the histograms keep pending
    (``MERGE_EVERY``: a merge happens in between), under CUDA's sync debug mode set to raise:
    no batch and no merge synchronises (a copy of host numbers to the device would), and the
    amax are the CPU's."""
    on_cpu = _calibrated(2)
    on_gpu = copy.deepcopy(on_cpu).cuda()
    gen = torch.Generator().manual_seed(5)
    data = [torch.randn(2, C, 8, 8, generator=gen) * (1 + i % 5) for i in range(20)]
    for prepared, device in ((on_cpu, "cpu"), (on_gpu, "cuda")):
        batches = [x.to(device) for x in data]
        torch.cuda.synchronize()
        acts = _activations(prepared)
        for q in acts.values():
            q.calibrator.reset()
            q.mode = "calibrate"
        torch.cuda.set_sync_debug_mode("error" if device == "cuda" else "default")
        try:
            with torch.no_grad():
                for x in batches:
                    prepared(x)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            for q in acts.values():
                q.mode = "quantize"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            qdq.recompute_amax(prepared, "mse")
    gpu = _activations(on_gpu)
    for n, q in _activations(on_cpu).items():
        assert torch.equal(q.amax, gpu[n].amax.cpu()), n
