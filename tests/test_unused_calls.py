"""Calls whose results reach no output (a head that a wrapper computes and drops: DETR's box head
when only the logits are returned) are left out of the plan, as the exporters leave them out of
the graph; a model whose ``forward`` takes ``*inputs`` exports with a dynamic batch.

Before: the dropped head's quantizers were planned, so the TorchScript export had fewer
QuantizeLinear nodes than quantizer calls, every quantizer after it was named by scope, and the
export failed ("weight DequantizeLinear does not feed a Conv/Gemm/MatMul") on layers that were
there; the dynamo exporter refused ``forward(self, *inputs)`` ("Detected mismatch between the
structure of `inputs` and `dynamic_shapes`")."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import qdq
from qdq.backends.onnxruntime import run, session
from qdq.graph.grouping import UNUSED_REASON


class Heads(nn.Module):
    """A backbone and two heads; ``forward(*inputs)`` returns the first head only."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 16, 3)
        self.cls = nn.Linear(16, 16)
        self.box = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        feat = self.conv(inputs[0]).mean((2, 3))
        self.box(feat)  # computed, dropped
        return self.cls(feat) + inputs[1]


def _inputs(n: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return torch.randn(n, 3, 12, 12), torch.randn(n, 16)


def test_a_dropped_head_is_not_planned_and_its_coverage_says_why() -> None:
    plan = qdq.plan_of(qdq.prepare(Heads().eval(), _inputs(1)))
    assert not [p for p in plan.points if p.owner.startswith("box")]
    status = {c.module: (c.status, c.reason) for c in plan.coverage}
    assert status["box.0"] == ("not reached", UNUSED_REASON)
    assert status["box.2"] == ("not reached", UNUSED_REASON)
    assert status["cls"][0] == "int8" and status["conv"][0] == "int8"


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_model_with_a_dropped_head_and_varargs_exports(exporter: str, tmp_path: Path) -> None:
    x = _inputs(6)
    prepared = qdq.prepare(Heads().eval(), _inputs(1))
    qdq.calibrate(prepared, [x], show_progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = qdq.export_onnx(prepared, _inputs(1), tmp_path / "m.onnx", exporter=exporter)
    assert out.exporter == exporter
    ours = run(session(out.path), list(_inputs(3)))[0]  # another batch size: dynamic batch
    with torch.no_grad():
        ref = prepared(*_inputs(3)).numpy()
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


class WritesIntoAView(nn.Module):
    """A layer whose only reader is an in-place write into a view of the returned buffer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(x.shape[0], 32)
        part = out[:, :16]
        part.copy_(self.fc(x))
        return out


def test_a_layer_written_in_place_into_the_output_is_kept() -> None:
    plan = qdq.plan_of(qdq.prepare(WritesIntoAView().eval(), (torch.randn(2, 16),)))
    assert plan.point("fc:weight").decision == "quantize"
    assert {c.module: c.status for c in plan.coverage} == {"fc": "int8"}


@dataclasses.dataclass
class Boxes:
    scores: torch.Tensor


class OpaqueOutput(nn.Module):
    """Returns its tensors inside an object the recording does not look into."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> Boxes:
        return Boxes(self.fc(x))


def test_nothing_is_called_unused_when_the_output_hides_its_tensors() -> None:
    plan = qdq.plan_of(qdq.prepare(OpaqueOutput().eval(), (torch.randn(2, 16),)))
    assert plan.point("fc:weight").decision == "quantize"


class TakesMore(nn.Module):
    """ultralytics' signature: ``forward(self, x, *args, **kwargs)``, called with ``x`` alone."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        return self.fc(x)


def test_varargs_that_collect_nothing_export_with_dynamo(tmp_path: Path) -> None:
    x = torch.randn(4, 16)
    prepared = qdq.prepare(TakesMore().eval(), (x[:1],))
    qdq.calibrate(prepared, [x], show_progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = qdq.export_onnx(prepared, (x[:1],), tmp_path / "m.onnx", exporter="dynamo")
    assert out.exporter == "dynamo"
    assert run(session(out.path), [x])[0].shape == (4, 16)
