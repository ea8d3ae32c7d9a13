"""A fixed weight is fake-quantized once, not at every forward, and never served stale.

Outside autograd (``no_grad``, ``inference_mode``, frozen weights) a weight quantizer keeps the
fake-quantized copy of a parameter keyed on its storage and version counter, the amax's and the
spec (:meth:`qdq.quant.Quantizer._weight_key`). Every way qdq or a training loop changes a weight
or an amax must reach the next forward.
"""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest
import torch
from torch import nn

import qdq
import qdq.qat
from qdq.quant import primitives, quantizer_mode


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x).mean((2, 3)))


@pytest.fixture
def prepared() -> nn.Module:
    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(2, 16, 8, 8)
    model = qdq.prepare(net, (x,))
    qdq.calibrate(model, [x, torch.randn(2, 16, 8, 8)], method="max")
    return model


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many per-channel (weight) fake-quant computations run."""
    seen: list[int] = []
    real = primitives.fake_quant_unchecked
    real_eager = primitives.fake_quant_eager

    def counting(x: torch.Tensor, amax: torch.Tensor, **kw: Any) -> torch.Tensor:
        if kw.get("axis") is not None:
            seen.append(1)
        return real(x, amax, **kw)

    def counting_eager(x: torch.Tensor, amax: torch.Tensor, ax: int | None, *rest: Any) -> Any:
        if ax is not None:
            seen.append(1)
        return real_eager(x, amax, ax, *rest)

    # the generic path (learned state, tracing) and the eager one (Quantizer._fake_quant_eager)
    monkeypatch.setattr("qdq.quant.quantizer.fake_quant_unchecked", counting)
    monkeypatch.setattr("qdq.quant.quantizer.fake_quant_eager", counting_eager)
    return seen


def _reference(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The forward with every weight quantized afresh (the cache dropped first)."""
    for q in qdq.quantizers_of(model).values():
        q._weight_cache = None
    with torch.no_grad():
        return model(x)


def test_a_fixed_weight_is_quantized_once_outside_autograd(
    prepared: nn.Module, calls: list[int]
) -> None:
    x = torch.randn(2, 16, 8, 8)
    with torch.no_grad():
        first = prepared(x)
        assert len(calls) == 2  # conv and fc
        for _ in range(3):
            assert torch.equal(prepared(x), first)
    with torch.inference_mode():
        assert torch.equal(prepared(x), first)
    assert len(calls) == 2


def test_a_forward_that_builds_a_graph_quantizes_every_time(
    prepared: nn.Module, calls: list[int]
) -> None:
    x = torch.randn(2, 16, 8, 8)
    prepared(x).sum().backward()
    prepared(x).sum().backward()
    assert len(calls) == 4
    assert prepared.conv.weight.grad is not None


def test_an_optimizer_step_reaches_the_next_forward(prepared: nn.Module) -> None:
    x = torch.randn(2, 16, 8, 8)
    model = qdq.qat.prepare(prepared)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    with torch.no_grad():
        before = model(x)
    model(x).square().mean().backward()
    opt.step()
    with torch.no_grad():
        after = model(x)
    assert not torch.equal(after, before)
    assert torch.equal(after, _reference(model, x))


@pytest.mark.parametrize(
    "change",
    [
        "copy_",
        "no_grad mul_",
        "load_state_dict",
        "set_amax",
        "amax copy_",
        "new parameter",
        "bypass",
    ],
)
def test_every_change_of_a_weight_or_amax_is_seen(prepared: nn.Module, change: str) -> None:
    x = torch.randn(2, 16, 8, 8)
    with torch.no_grad():
        before = prepared(x)
        weight = prepared.conv.weight
        wq = prepared.conv.weight_quantizer
        if change == "copy_":
            weight.copy_(torch.randn_like(weight))
        elif change == "no_grad mul_":
            weight.mul_(1.5)
        elif change == "load_state_dict":
            state = {k: v.clone() for k, v in prepared.state_dict().items()}
            state["conv.weight"] = torch.randn_like(weight)
            prepared.load_state_dict(state)
        elif change == "set_amax":
            wq.set_amax(wq.amax * 0.5)
        elif change == "amax copy_":
            wq.amax.copy_(wq.amax * 0.5)
        elif change == "new parameter":
            prepared.conv.weight = nn.Parameter(torch.randn_like(weight))
        if change == "bypass":
            with quantizer_mode(prepared, "bypass"):
                after = prepared(x)
        else:
            after = prepared(x)
    assert not torch.equal(after, before), change
    if change != "bypass":
        assert torch.equal(after, _reference(prepared, x)), change


def test_copies_and_pickles_leave_the_cache_behind(prepared: nn.Module) -> None:
    x = torch.randn(2, 16, 8, 8)
    with torch.no_grad():
        want = prepared(x)
    assert prepared.conv.weight_quantizer._weight_cache is not None
    for copied in (copy.deepcopy(prepared), pickle.loads(pickle.dumps(prepared))):
        assert copied.conv.weight_quantizer._weight_cache is None
        with torch.no_grad():
            assert torch.equal(copied(x), want)
