"""A ``.pt2`` gets the placement of the eager model it was exported from (issue 31).

``torch.export``'s default IR keeps the eager code's in-place ops (``aten.add_`` of ``out +=
identity``, ``aten.relu_``) and ``aten.batch_norm``, which the planner did not know: a ``.pt2``
ResNet-18's 8 residual Adds were planned as nothing (lint P03a on all 8, P04 on 5).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import qdq
from qdq.pipeline.models import resolve_model

tv = pytest.importorskip("torchvision")


def _resnet18() -> torch.nn.Module:
    torch.manual_seed(0)
    return tv.models.resnet18(num_classes=10).eval()


def _plan_counts(model: torch.nn.Module, x: torch.Tensor) -> tuple[int, int, dict[str, int]]:
    plan = qdq.plan_of(qdq.prepare(model, (x,)))
    rules: dict[str, int] = {}
    for p in plan.points:
        rules[f"{p.decision}:{p.rule}"] = rules.get(f"{p.decision}:{p.rule}", 0) + 1
    return len(plan.points), len(plan.groups), rules


def test_a_pt2_resnet_is_planned_like_the_eager_model(tmp_path: Path) -> None:
    model = _resnet18()
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    path = tmp_path / "r18.pt2"
    torch.export.save(torch.export.export(model, (x,)), str(path))
    loaded = resolve_model(str(path)).module
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))  # the mapped graph computes the same
    points, groups, rules = _plan_counts(loaded, x)
    assert rules.get("quantize:P03", 0) + rules.get("skip:P03", 0) >= 8  # every residual Add
    assert (points, groups, rules) == _plan_counts(model, x)


def test_an_in_place_op_whose_input_is_read_later_is_left_alone() -> None:
    from torch import fx

    from qdq.pipeline.models import _aten_to_torch

    graph = fx.Graph()
    a = graph.placeholder("a")
    b = graph.placeholder("b")
    add_ = graph.call_function(torch.ops.aten.add_.Tensor, (a, b))
    later = graph.call_function(torch.ops.aten.mul.Tensor, (a, add_))  # reads the mutated a
    graph.output(later)
    gm = fx.GraphModule(torch.nn.Module(), graph)
    _aten_to_torch(gm)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets == [torch.ops.aten.add_.Tensor, torch.mul]
    x, y = torch.ones(2), torch.full((2,), 2.0)
    assert torch.equal(gm(x.clone(), y), torch.full((2,), 9.0))  # (1+2) * (1+2)
