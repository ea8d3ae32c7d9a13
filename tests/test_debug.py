"""``qdq.debug.layer_errors``: accumulated per-layer error against FP32 in one pass."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

import qdq
from qdq.debug import ErrorStats, layer_errors


class Fragile(nn.Module):
    """conv2's input has a few huge outliers, so its per-tensor scale crushes everything else."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 32, 3, padding=1)
        self.conv3 = nn.Conv2d(32, 32, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv1(x))
        spikes = torch.zeros_like(y)
        spikes[:, 0, 0, 0] = 200.0
        y = self.conv2(y + spikes)
        return self.conv3(torch.relu(y))


def _prepared(model: nn.Module) -> tuple[nn.Module, list[torch.Tensor]]:
    torch.manual_seed(0)
    data = [torch.randn(4, 3, 10, 10) for _ in range(3)]
    m = qdq.prepare(model.eval(), (data[0][:1],))
    qdq.calibrate(m, data, method="max", show_progress=False)
    return m, data


def test_the_fragile_layer_ranks_first_and_the_model_is_restored() -> None:
    torch.manual_seed(0)
    m, data = _prepared(Fragile())
    modes = {n: q.mode for n, q in qdq.quantizers_of(m).items()}
    m.train()
    errors = layer_errors(m, data, num_batches=2, histograms=1)
    assert m.training and {n: q.mode for n, q in qdq.quantizers_of(m).items()} == modes
    # accumulated: the damage starts at conv2's input and carries on to conv3's
    assert {r.name for r in errors.rows[:2]} == {"conv2:input", "conv3:input"}
    fragile = errors.row("conv2:input")
    assert fragile.score < 25 and errors.row("conv1:input").score > 35
    assert fragile.upstream is not None and fragile.upstream.sqnr_db > 30  # its own Q/DQ did it
    # isolated (only this Q/DQ, on the FP32 tensor): the fragile point is the worst on its own,
    # and conv3's damage is inherited (accumulated far below isolated)
    iso = {r.name: r.isolated.sqnr_db for r in errors.rows if r.isolated is not None}
    assert min(iso, key=iso.__getitem__) == "conv2:input" and len(iso) == 3
    assert iso["conv3:input"] > errors.row("conv3:input").score + 5
    first = errors.row("conv1:input")  # nothing upstream: isolated is accumulated
    assert first.isolated is not None
    assert first.isolated.sqnr_db == pytest.approx(first.score)
    assert "isolated" in errors.format() and "sqnr_db" in errors.to_dict()["rows"][0]["isolated"]
    assert errors.batches == 2 and errors.samples == 8
    worst = errors.rows[0]
    assert worst.histogram is not None and all(r.histogram is None for r in errors.rows[1:])
    assert worst.histogram.method == "max" and worst.histogram.amax == worst.amax
    assert worst.histogram.methods["max"] == pytest.approx(worst.amax)
    assert sum(worst.histogram.counts) == 3 * 4 * 32 * 10 * 10  # every calibration value
    assert {w.owner for w in errors.weights} == {"conv1", "conv2", "conv3"}
    assert all(w.error.sqnr_db > 35 for w in errors.weights)  # per-channel weights


def test_accumulated_error_of_the_last_layer_is_the_output_error() -> None:
    m, data = _prepared(Fragile())
    errors = layer_errors(m, data)
    last = errors.row("conv3:input")
    assert last.output is not None and errors.output is not None
    assert last.output.sqnr_db == pytest.approx(errors.output.sqnr_db)
    assert last.output.cosine == pytest.approx(errors.output.cosine)
    assert last.weight is not None and last.order == 2 and last.clipped == 0.0


class InPlaceResidual(nn.Module):
    """An identity ``relu`` whose input is quantized, then ``y += x`` written into its output."""

    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.primary = nn.Sequential(nn.Conv2d(c, c, 1), nn.BatchNorm2d(c), nn.ReLU())
        self.cheap = nn.Sequential(nn.Conv2d(c, c, 3, 1, 1, groups=c), nn.BatchNorm2d(c))
        self.fusion_bn = nn.BatchNorm2d(c)
        self.relu = nn.Identity()
        self.head = nn.Conv2d(c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x1 = self.primary(x)
        y = self.relu(self.cheap(x1) + self.fusion_bn(x1))
        y += x
        return self.head(y)


def test_a_module_output_written_in_place_later_is_measured_as_it_left_the_module() -> None:
    """The identity ``relu`` returns its quantizer's output: its output error is that point's
    accumulated error, not the error of the sum ``y += x`` later wrote into the same tensor."""
    m, data = _prepared(InPlaceResidual())
    row = layer_errors(m, data).row("relu:input")
    assert row.output is not None and row.owner == "relu"
    assert row.output.sqnr_db == pytest.approx(row.accumulated.sqnr_db)


def test_a_bypassed_quantizer_adds_no_error() -> None:
    m, data = _prepared(Fragile())
    qdq.quantizers_of(m)["conv2.input_quantizer"].mode = "bypass"
    row = layer_errors(m, data).row("conv2:input")
    assert row.upstream is not None and row.accumulated == row.upstream
    assert qdq.quantizers_of(m)["conv2.input_quantizer"].mode.value == "bypass"


def test_json_and_format() -> None:
    m, data = _prepared(Fragile())
    errors = layer_errors(m, data, num_batches=1)
    d = json.loads(errors.to_json())
    assert [r["name"] for r in d["rows"]] == [r.name for r in errors.rows]
    assert d["rows"][0]["isolated"]["numel"] > 0 and d["rows"][0]["histogram"]["method"] == "max"
    assert d["rows"][-1]["upstream"]["sqnr_db"] is None  # the network input arrives exact
    assert errors.rows[0].name in errors.format(top=1) and "model output" in errors.format()


def test_error_stats() -> None:
    x = torch.tensor([3.0, 4.0])
    assert ErrorStats.between(x, x).sqnr_db == math.inf
    assert ErrorStats.between(x, x).to_dict()["sqnr_db"] is None  # JSON-safe
    s = ErrorStats.between(x, torch.tensor([3.0, 3.0]))
    assert s.sqnr_db == pytest.approx(10 * math.log10(25.0)) and s.rel_mse == pytest.approx(0.04)


def test_bad_arguments() -> None:
    net = nn.Sequential(nn.Conv2d(3, 16, 3))
    m = qdq.prepare(net, (torch.randn(1, 3, 8, 8),))
    with pytest.raises(ValueError, match="run qdq.calibrate first"):
        layer_errors(m, [torch.randn(2, 3, 8, 8)])
    qdq.calibrate(m, [torch.randn(2, 3, 8, 8)], show_progress=False)
    with pytest.raises(ValueError, match="num_batches must be an int >= 1"):
        layer_errors(m, [torch.randn(2, 3, 8, 8)], num_batches=0)
    with pytest.raises(ValueError, match="no batches"):
        layer_errors(m, [])
    with pytest.raises(ValueError, match="not returned by qdq.prepare"):
        layer_errors(net, [torch.randn(2, 3, 8, 8)])
