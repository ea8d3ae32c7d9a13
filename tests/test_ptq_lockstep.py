"""Bias correction and AdaRound in lockstep passes (qdq.ptq._lockstep): one FP32 and one INT8
forward for every layer, the same result as the layer-by-layer path, and that path wherever the
lockstep cannot run (batches that cannot be joined, a static batch, control flow on values)."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

import qdq
from qdq.api import quantizers_of
from qdq.ptq import _lockstep
from qdq.ptq.adaround import adaround
from qdq.ptq.bias import correct_bias


class Deep(nn.Module):
    """Convs with residual Adds; optionally one conv module called after some of them (after
    ``shared_at``), or a fixed batch size."""

    def __init__(self, depth: int = 6, shared: bool = False, batch: int | None = None) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.body = nn.ModuleList(nn.Conv2d(16, 16, 3, padding=1) for _ in range(depth))
        self.shared = nn.Conv2d(16, 16, 1) if shared else None
        self.batch = batch
        self.shared_at = (1, 3)
        self.head = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.batch is not None and x.shape[0] != self.batch:
            raise RuntimeError(f"this model takes batches of {self.batch}")
        x = torch.relu(self.stem(x))
        for i, conv in enumerate(self.body):
            x = x + torch.relu(conv(x))
            if self.shared is not None and i in self.shared_at:
                x = torch.relu(self.shared(x))
        return self.head(x.mean((2, 3)))


def _calibrated(model: nn.Module, batches: list[torch.Tensor], example: int = 1) -> nn.Module:
    prepared = qdq.prepare(model.eval(), (batches[0][:example],))
    qdq.calibrate(prepared, batches, show_progress=False)
    return prepared


def _batches(n: int = 3, size: int = 4, hw: int = 10) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(size, 3, hw, hw, generator=gen) for _ in range(n)]


def _forwards(model: nn.Module) -> list[int]:
    """A counter of the model's forwards (a pre-hook on the root)."""
    calls = [0]
    model.register_forward_pre_hook(lambda m, a: calls.__setitem__(0, calls[0] + 1))
    return calls


def _state(prepared: nn.Module, name: str) -> dict[str, torch.Tensor]:
    return {p: q._buffers[name] for p, q in quantizers_of(prepared).items() if name in q._buffers}


def _both(model: nn.Module, batches: list[torch.Tensor], step, monkeypatch):
    """``step`` on two copies of the calibrated model: in lockstep, and layer by layer (the
    batches made unjoinable); each copy's report and forwards."""
    base = _calibrated(model, batches)
    fast, slow = qdq.copy_prepared(base), qdq.copy_prepared(base)
    fast_calls, slow_calls = _forwards(fast), _forwards(slow)
    fast_report = step(fast, batches)
    with monkeypatch.context() as m:
        m.setattr(_lockstep, "join_batches", lambda bs: None)
        slow_report = step(slow, batches)
    return (fast, fast_report, fast_calls[0]), (slow, slow_report, slow_calls[0])


def _same_deltas(a: nn.Module, b: nn.Module) -> None:
    da, db = _state(a, "bias_delta"), _state(b, "bias_delta")
    assert da.keys() == db.keys() and da
    for k in da:
        torch.testing.assert_close(da[k], db[k], rtol=1e-5, atol=1e-7)


def test_bias_correction_in_lockstep_equals_layer_by_layer_in_two_forwards(monkeypatch):
    batches = _batches()
    (fast, fr, fast_calls), (slow, sr, slow_calls) = _both(Deep(depth=8), batches, correct_bias,
                                                            monkeypatch)  # fmt: skip
    _same_deltas(fast, slow)
    assert [r.name for r in fr.rows] == [r.name for r in sr.rows]
    for a, b in zip(fr.rows, sr.rows, strict=True):
        assert a.sqnr_before_db == pytest.approx(b.sqnr_before_db, abs=1e-3)
        assert a.sqnr_after_db == pytest.approx(b.sqnr_after_db, abs=1e-3)
    # the survey, then one forward of the joined batches each for the INT8 model and its FP32
    # twin (a copy: the counting hook came along), where the layer-by-layer path runs two
    # forwards per layer and batch
    assert fast_calls == 3
    assert slow_calls == 1 + 2 * len(sr.rows) * len(batches)


def test_a_layer_called_twice_ends_a_pass_and_is_corrected_on_its_own(monkeypatch):
    batches = _batches()
    (fast, fr, fast_calls), (slow, _, slow_calls) = _both(Deep(shared=True), batches,
                                                          correct_bias, monkeypatch)  # fmt: skip
    _same_deltas(fast, slow)
    assert next(r for r in fr.rows if r.name.startswith("shared")).calls == 2
    # a second pass after the shared layer (and its own two forwards per batch)
    assert fast_calls == 1 + 2 + 2 * len(batches) + 2
    assert fast_calls < slow_calls


def test_forwards_that_call_different_layers_fall_back_to_layer_by_layer(monkeypatch):
    """Control flow on values can make the FP32 and the INT8 forward call different layers: the
    layers before the first difference are corrected in lockstep, the rest layer by layer, and
    the result is the layer-by-layer one."""
    batches = _batches()
    model = Deep(depth=4, shared=True)
    (_, _, _), (slow, _, _) = _both(model, batches, correct_bias, monkeypatch)
    fast = qdq.copy_prepared(_calibrated(model, batches))
    make_twin = _lockstep.twin_of

    def rerouted(prepared):  # the twin calls one more layer after body.1
        twin = make_twin(prepared)
        twin.shared_at = (0, 1, 3)
        return twin

    monkeypatch.setattr(_lockstep, "twin_of", rerouted)
    report = correct_bias(fast, batches)
    assert any("called different layers" in n for n in report.notes)
    _same_deltas(fast, slow)


def test_batches_that_cannot_be_joined_and_a_static_batch_take_the_layer_by_layer_path():
    mixed = [torch.randn(4, 3, 10, 10), torch.randn(4, 3, 12, 12)]
    assert _lockstep.join_batches(mixed) is None
    assert _lockstep.join_batches([(torch.ones(2, 3), 1), (torch.ones(2, 3), 2)]) is None
    joined = _lockstep.join_batches([{"x": torch.ones(2, 3)}, {"x": torch.zeros(1, 3)}])
    assert joined["x"].shape == (3, 3)
    batches = _batches(n=2, size=4)
    prepared = _calibrated(Deep(batch=4), batches, example=4)
    calls = _forwards(prepared)
    report = correct_bias(prepared, batches)  # the joined batch of 8 fails before a layer
    assert len(report.rows) == 8 and not report.notes
    # the survey, the failed try (both forwards), then two forwards per layer and batch
    assert calls[0] == 1 + 2 + 2 * 8 * len(batches)


def test_adaround_in_lockstep_learns_the_same_codes(monkeypatch):
    batches = _batches(n=2, size=4)

    def step(p, b):
        return adaround(p, b, num_samples=8, iters=30, show_progress=False)

    (fast, fr, fast_calls), (slow, sr, _) = _both(Deep(depth=4), batches, step, monkeypatch)
    codes_a, codes_b = _state(fast, "rounding_codes"), _state(slow, "rounding_codes")
    assert codes_a.keys() == codes_b.keys() and codes_a
    for k in codes_a:
        assert torch.equal(codes_a[k], codes_b[k])
    assert [(r.name, r.applied) for r in fr.rows] == [(r.name, r.applied) for r in sr.rows]
    assert fast_calls == 3


def test_an_error_inside_a_layer_ends_both_forwards_and_the_twin_thread():
    batches = _batches(n=2)
    prepared = _calibrated(Deep(depth=3), batches).train()
    twin = _lockstep.twin_of(prepared)
    from qdq.ptq import _layers

    layers, _ = _layers.find_layers(prepared)
    before = threading.active_count()

    def visit(layer, ref, fp, func, raw, applied):
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        _lockstep.lockstep(prepared, twin, batches[0], _layers.index_of(layers), visit)
    assert threading.active_count() == before
    assert prepared.training and twin.training  # modes restored
    with torch.no_grad():
        torch.testing.assert_close(prepared.eval()(batches[0]), twin(batches[0]))
