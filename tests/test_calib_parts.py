"""Calibration statistics per part, merged exactly (qdq.calib.parts, qdq.calibrate_parts,
qdq.calibrate_from): a union of parts gives the amax a calibration on its batches gives."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import qdq
from qdq.api import quantizers_of
from qdq.calib import CalibrationError, HistogramCalibrator, MaxCalibrator

METHODS = ("max", "entropy", "mse", "percentile")


def _hist(*batches: torch.Tensor) -> HistogramCalibrator:
    cal = HistogramCalibrator()
    for b in batches:
        cal.collect(b)
    return cal


def test_merged_histograms_equal_one_histogram_of_every_batch():
    gen = torch.Generator().manual_seed(0)
    small = [torch.randn(500, generator=gen) * 1e-3 for _ in range(2)]  # a narrow grid
    large = [torch.randn(700, generator=gen) * 40 for _ in range(3)]  # 2**15 times as wide
    merged = _hist(*small)
    merged.absorb(_hist(*large))
    merged.absorb(HistogramCalibrator())  # a part that saw nothing
    whole = _hist(*large, *small)
    counts, edges = merged.histogram()
    want_counts, want_edges = whole.histogram()
    assert (counts == want_counts).all() and (edges == want_edges).all()
    assert merged.num_batches == 5 and merged.observed_max == whole.observed_max
    for m in METHODS:
        assert torch.equal(merged.compute_amax(m), whole.compute_amax(m))
    # the other way round: a wide grid absorbs a narrow one
    wide = _hist(*large)
    wide.absorb(_hist(*small))
    assert torch.equal(wide.compute_amax("mse"), whole.compute_amax("mse"))


def test_merged_per_channel_maxima_and_refusals():
    a, b = MaxCalibrator(axis=0), MaxCalibrator(axis=0)
    a.collect(torch.tensor([[1.0, -3.0], [0.5, 0.25]]))
    b.collect(torch.tensor([[-2.0, 0.0], [0.1, 0.0]]))
    a.absorb(b)
    assert torch.equal(a.compute_amax(), torch.tensor([3.0, 0.5]))
    with pytest.raises(TypeError, match="cannot merge a HistogramCalibrator"):
        a.absorb(HistogramCalibrator())
    with pytest.raises(TypeError, match="1024 bins"):
        HistogramCalibrator().absorb(HistogramCalibrator(1024))
    c = MaxCalibrator(axis=0)
    c.collect(torch.ones(3, 2))
    with pytest.raises(CalibrationError, match="3 channels"):
        a.absorb(c)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3)
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        return self.fc(y.mean((2, 3)) + y.amax((2, 3)))


def _amax(model: nn.Module) -> dict[str, torch.Tensor]:
    return {p: q.amax.clone() for p, q in quantizers_of(model).items()}


@pytest.mark.parametrize("method", METHODS)
def test_a_union_of_parts_calibrates_as_its_batches_do(method):
    gen = torch.Generator().manual_seed(1)
    data = [torch.randn(4, 3, 10, 10, generator=gen) * (1 + i) for i in range(5)]
    parts = [data[:2], data[2:3], [], data[3:]]
    base = qdq.prepare(Net().eval(), (data[0][:1],))
    collected = qdq.calibrate_parts(base, parts, method, show_progress=False)
    assert collected.batches == (2, 1, 0, 2)
    everything = qdq.calibrate(qdq.copy_prepared(base), data, method, show_progress=False)
    assert _amax(base).keys() == _amax(everything).keys()
    for k, v in _amax(everything).items():
        assert torch.equal(_amax(base)[k], v), k  # calibrated on all parts on return
    for keep in ([0], [1, 3], [0, 1, 2]):
        batches = [b for i in keep for b in parts[i]]
        want = qdq.calibrate(qdq.copy_prepared(base), batches, method, show_progress=False)
        got = qdq.calibrate_from(qdq.copy_prepared(base), collected, keep, method)
        for k, v in _amax(want).items():
            assert torch.equal(_amax(got)[k], v), (keep, k)


def test_calibrate_from_refuses_bad_parts_and_other_models():
    data = [torch.randn(2, 3, 10, 10) for _ in range(2)]
    base = qdq.prepare(Net().eval(), (data[0][:1],))
    collected = qdq.calibrate_parts(base, [data[:1], [], data[1:]], show_progress=False)
    with pytest.raises(ValueError, match="keep must name some of the parts 0..2"):
        qdq.calibrate_from(qdq.copy_prepared(base), collected, [3])
    with pytest.raises(CalibrationError, match=r"parts \[1\] ran no batch"):
        qdq.calibrate_from(qdq.copy_prepared(base), collected, [1])
    other = qdq.prepare(nn.Sequential(nn.Conv2d(3, 16, 3)).eval(), (data[0][:1],))
    with pytest.raises(ValueError, match="other quantizers"):
        qdq.calibrate_from(other, collected)
    with pytest.raises(CalibrationError, match="no batches"):
        qdq.calibrate_parts(qdq.copy_prepared(base), [[], []], show_progress=False)
