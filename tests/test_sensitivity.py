"""``qdq.sensitivity`` and ``qdq.auto_quantize``: rank the fragile unit first, fall back only it."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

import qdq
from qdq.accuracy import agreement_metric, units_of, units_off, units_only


class Fragile(nn.Module):
    """conv2's input carries a channel of huge spikes that conv2 ignores (zero weights): in FP32 they
    change nothing, but conv2's per-tensor max-calibrated scale crushes every other channel."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 32, 3, padding=1)
        self.conv3 = nn.Conv2d(32, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 36, 16)
        with torch.no_grad():
            self.conv2.weight[:, 0] = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv1(x))
        spikes = torch.zeros_like(y)
        spikes[:, 0, 0, 0] = 200.0
        y = torch.relu(self.conv2(y + spikes))
        y = torch.relu(self.conv3(y))
        return self.fc(nn.functional.avg_pool2d(y, 2).flatten(1))


@pytest.fixture(scope="module")
def setup() -> tuple[nn.Module, list[torch.Tensor], list[torch.Tensor]]:
    torch.manual_seed(0)
    net = Fragile().eval()
    data = [torch.randn(16, 3, 12, 12) for _ in range(4)]
    evaluation = [torch.randn(32, 3, 12, 12) for _ in range(4)]
    return net, data, evaluation


def _calibrated(net: nn.Module, data: list[torch.Tensor]) -> nn.Module:
    m = qdq.prepare(net, (data[0][:1],))
    qdq.calibrate(m, data, method="max", show_progress=False)
    return m


def test_units_pair_each_conv_input_with_its_weight(setup) -> None:
    net, data, _ = setup
    m = _calibrated(net, data)
    units = {u.name: u for u in units_of(m)}
    assert set(units) == {
        "conv1:input",
        "conv2:input",
        "conv3:input",
        "fc:input",
        "avg_pool2d:input",
    }
    assert units["conv2:input"].quantizers == ("conv2.input_quantizer", "conv2.weight_quantizer")
    assert units["avg_pool2d:input"].owners == ("avg_pool2d",)
    modes = {n: q.mode for n, q in qdq.quantizers_of(m).items()}
    with units_off(m, [units["conv2:input"]]):
        off = {n for n, q in qdq.quantizers_of(m).items() if q.mode.value == "bypass"}
        assert off == {"conv2.input_quantizer", "conv2.weight_quantizer"}
    with units_only(m, [units["conv2:input"]]):
        on = {n for n, q in qdq.quantizers_of(m).items() if q.mode.value == "quantize"}
        assert on == {"conv2.input_quantizer", "conv2.weight_quantizer"}
    assert {n: q.mode for n, q in qdq.quantizers_of(m).items()} == modes


@pytest.mark.parametrize("mode", ["one-off", "one-on"])
def test_the_fragile_unit_ranks_first_by_proxy_and_by_metric(setup, mode: str) -> None:
    net, data, evaluation = setup
    m = _calibrated(net, data)
    m.train()
    proxy = qdq.sensitivity(m, data, mode=mode, show_progress=False)
    assert m.training and all(q.mode.value == "quantize" for q in qdq.quantizers_of(m).values())
    assert proxy.rows[0].name == "conv2:input" and proxy.scored_by == "output_sqnr_db"
    assert proxy.rows[0].damage > 100 * abs(proxy.rows[1].damage)
    assert proxy.samples == 64 and proxy.evaluations == 6 and math.isinf(proxy.fp32)
    if mode == "one-off":  # everything but conv2 INT8: far closer to FP32 than full INT8
        assert proxy.rows[0].score > proxy.int8 + 15
    else:  # conv2 alone INT8 does (almost) all the damage of full INT8
        assert proxy.rows[0].score == pytest.approx(proxy.int8, abs=1.0)
    scored = qdq.sensitivity(m, metric=agreement_metric(net, evaluation), mode=mode,
                             show_progress=False)  # fmt: skip
    assert scored.scored_by == "metric" and scored.fp32 == 1.0 and scored.int8 < 0.85
    assert scored.rows[0].name == "conv2:input"
    assert scored.rows[0].damage > 0.2 and all(r.damage < 0.05 for r in scored.rows[1:])
    d = json.loads(scored.to_json())
    assert d["rows"][0]["owners"] == ["conv2"] and "conv2:input" in scored.format(top=1)
    assert scored.row("conv2") == scored.rows[0]


def test_a_user_bypassed_quantizer_stays_float_in_every_configuration(setup) -> None:
    net, data, _ = setup
    m = _calibrated(net, data)
    qdq.quantizers_of(m)["conv2.input_quantizer"].mode = "bypass"
    s = qdq.sensitivity(m, data, mode="one-on", show_progress=False)
    conv2 = s.row("conv2:input")  # only its weight quantizer left: per-channel, harmless
    assert conv2.score > 35 and s.rows[0].name != "conv2:input"
    assert qdq.quantizers_of(m)["conv2.input_quantizer"].mode.value == "bypass"


def test_fallback_brings_the_metric_within_budget_keeping_everything_else_int8(setup) -> None:
    net, data, evaluation = setup
    before = {k: v.clone() for k, v in net.state_dict().items()}
    res = qdq.auto_quantize(
        net,
        (data[0][:1],),
        data,
        eval_data=evaluation,
        max_drop=0.02,
        method="max",
        exporter="torchscript",
        show_progress=False,
    )
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())  # not mutated
    assert res.fallback == ("conv2",) and res.within_budget
    assert res.fp32_metric == 1.0 and res.full_int8_metric < 0.85 and res.int8_metric >= 0.98
    plan = qdq.plan_of(res.model)
    for p in plan.points:
        if p.owner == "conv2":
            assert p.decision == "skip" and p.rule == "USER"
    others = [p for p in plan.points if p.op in ("conv", "linear") and p.owner != "conv2"]
    assert others and all(p.quantized for p in others)  # everything else stays INT8
    assert any("auto_quantize kept in float" in n for n in plan.notes)
    kept = [s for s in res.steps if s.kept]
    assert [s.unit for s in kept] == ["conv2:input"] and kept[0].confirmed_gain > 0.2
    assert kept[0].cost is not None and kept[0].cost.int8_layers_lost == 1
    assert res.cost is not None and res.cost.int8_layers_lost == 1
    assert res.sensitivity is not None and res.sensitivity.rows[0].name == "conv2:input"
    text = res.format()
    assert "conv2:input: float" in text and "weighted layer leaves INT8" in text
    assert json.loads(res.to_json())["fallback"] == ["conv2"]
    # the final model exports and its plan matches the export (no bypassed quantizer left)
    assert all(q.mode.value == "quantize" for q in qdq.quantizers_of(res.model).values())


def test_no_fallback_when_the_budget_holds(setup) -> None:
    net, data, evaluation = setup
    res = qdq.auto_quantize(net, (data[0][:1],), data, eval_data=evaluation, max_drop=0.5,
                            method="max", show_progress=False)  # fmt: skip
    assert res.fallback == () and res.steps == () and res.sensitivity is None
    assert res.int8_metric == res.full_int8_metric and res.within_budget


def test_a_budget_that_cannot_be_met_is_reported_not_hidden(setup) -> None:
    net, data, _ = setup

    def metric(model: nn.Module) -> float:  # float scores 1, anything quantized at most 0.5
        quantizing = any(q.mode.value == "quantize" for q in qdq.quantizers_of(model).values())
        return 0.5 if quantizing else 1.0

    res = qdq.auto_quantize(net, (data[0][:1],), data, metric=metric, max_drop=0.1, method="max",
                            max_fallback=2, lint_cost=False, show_progress=False)  # fmt: skip
    assert not res.within_budget and "NOT within" in res.format()
    assert 1 <= len(res.steps) <= 2 and res.int8_metric == 0.5


def test_bad_arguments(setup) -> None:
    net, data, _ = setup
    m = _calibrated(net, data)
    with pytest.raises(ValueError, match="unknown mode"):
        qdq.sensitivity(m, data, mode="leave-one-out")
    with pytest.raises(ValueError, match="needs data"):
        qdq.sensitivity(m)
    with pytest.raises(ValueError, match="must return a number"):
        qdq.sensitivity(m, metric=lambda model: "high", show_progress=False)
    with pytest.raises(ValueError, match="must be finite"):
        qdq.sensitivity(m, metric=lambda model: float("nan"), show_progress=False)
    with pytest.raises(ValueError, match="no batches"):
        qdq.sensitivity(m, [], show_progress=False)
    with pytest.raises(ValueError, match="not returned by qdq.prepare"):
        qdq.sensitivity(net, data)
    fresh = qdq.prepare(net, (data[0][:1],))
    with pytest.raises(ValueError, match="run qdq.calibrate first"):
        qdq.sensitivity(fresh, data)
    with pytest.raises(ValueError, match="one-shot iterator"):
        qdq.auto_quantize(net, (data[0][:1],), iter(data))
    with pytest.raises(ValueError, match="max_drop"):
        qdq.auto_quantize(net, (data[0][:1],), data, max_drop=-0.1)
    with pytest.raises(ValueError, match="holds no batch"):
        qdq.auto_quantize(net, (data[0][:1],), [])


def test_the_search_puts_back_in_int8_what_the_budget_does_not_need(setup) -> None:
    from qdq.accuracy.fallback import _Search

    net, data, _ = setup
    m = _calibrated(net, data)
    units = {u.name: u for u in units_of(m)}
    proxy = qdq.sensitivity(m, data, show_progress=False)

    def metric(model: nn.Module) -> float:  # only conv2 in float matters
        return (
            1.0 if qdq.quantizers_of(model)["conv2.input_quantizer"].mode.value == "bypass" else 0.5
        )

    search = _Search(m, units, metric, fp32=1.0, full=0.5, max_drop=0.1)
    steps, off = search.run(["conv1:input", "fc:input", "conv2:input", "conv3:input"], proxy, {},
                            patience=5, show_progress=False)  # fmt: skip
    assert [u.name for u in off] == ["conv2:input"]
    assert [(s.unit, s.kept, s.restored) for s in steps] == [
        ("conv1:input", False, True),  # the metric did not get worse: kept for now, then put back
        ("fc:input", False, True),
        ("conv2:input", True, False),  # within budget: the search stops here
    ]
    patient = _Search(m, units, lambda model: 0.5, fp32=1.0, full=0.5, max_drop=0.1)
    steps, off = patient.run(list(units), proxy, {}, patience=2, show_progress=False)
    assert len(steps) == 2 and off == []  # two units without a gain: stop; neither stays float
    assert all(s.restored for s in steps)
