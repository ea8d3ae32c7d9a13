"""What the call-site runtime decides once per site (issue 48): its books and its compiled frames.

The runtime keys only the calls its plan names (a family no site wants at a module's path is run
as it is), runs the plan's quantizers without tracker hooks of its own, keeps a quantizer's
output for a second reader only where that quantizer acts at more than one call, and its hooks,
where ``torch.compile(prepared)`` makes frames of them, run as plain Python: no guards, no
recompilation the float model has not. Inside a compiled parent they are still traced, so the
parent compiles with ``fullgraph=True``.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

import qdq
from qdq.graph.calls import MODULE
from qdq.graph.runtime import runtime_of
from qdq.quant import QuantMode, quantizer_mode

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class Shared(nn.Module):
    """A tensor read by two quantized consumers (one Q, rule S01), a residual Add and a pool."""

    def __init__(self, c: int = 32) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU())
        self.a = nn.Conv2d(c, c, 1)
        self.b = nn.Conv2d(c, c, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(c, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        y = self.a(x) + self.b(x)
        return self.fc(self.pool(torch.relu(y)).mean((2, 3)))


class Parent(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.inner(x * 2.0)))


@pytest.fixture(scope="module")
def prepared() -> tuple[nn.Module, nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = Shared().eval()
    x = torch.randn(2, 3, 8, 8)
    prep = qdq.prepare(model, (x,))
    qdq.calibrate(prep, [x, torch.randn(2, 3, 8, 8)], method="max", show_progress=False)
    return model, prep, x


def test_the_runtime_keys_only_the_families_its_sites_name(prepared: Any) -> None:
    _, prep, x = prepared
    runtime = runtime_of(prep)
    assert runtime is not None
    wanted = runtime.wanted
    assert wanted is not None
    assert set(wanted) == {key[0] for key in runtime.sites}
    for key in runtime.sites:
        assert key[1] in wanted[key[0]]
    counted: list[tuple[str, str]] = []
    next_key = runtime.next_key

    def spy(family: str, *, path: str | None = None) -> Any:
        key = next_key(family, path=path)
        counted.append(key[:2])
        return key

    runtime.next_key = spy  # type: ignore[method-assign]
    try:
        runtime.reset_hits()
        with torch.no_grad():
            prep(x)
    finally:
        del runtime.next_key
    assert counted and all(family in wanted[path] for path, family in counted)
    assert not runtime.unreached(), "every planned site is still reached"


def test_the_plan_quantizers_carry_no_tracker_hooks_and_other_hooks_still_fire(
    prepared: Any,
) -> None:
    _, prep, x = prepared
    runtime = runtime_of(prep)
    assert runtime is not None
    quantizers = qdq.quantizers_of(prep)
    mine = {id(q) for site in runtime.sites.values() for _, q in site.actions}
    assert mine == {id(q) for q in quantizers.values()}
    for q in quantizers.values():
        hooks = [*q._forward_pre_hooks.values(), *q._forward_hooks.values()]
        assert all(getattr(h, "__self__", None) is not runtime for h in hooks)
    seen: list[str] = []
    handles = [
        q.register_forward_hook(lambda _m, _a, _o, p=p: seen.append(p))
        for p, q in quantizers.items()
    ]
    try:
        with quantizer_mode(prep, QuantMode.BYPASS), torch.no_grad():
            prep(x)
    finally:
        for h in handles:
            h.remove()
    activations = {p for p, q in quantizers.items() if q.calibrator.num_batches > 0}
    assert activations <= set(seen)


def test_a_tensor_read_by_two_quantized_consumers_is_quantized_once(prepared: Any) -> None:
    _, prep, x = prepared
    runtime = runtime_of(prep)
    assert runtime is not None
    shared = {
        id(q)
        for key, site in runtime.sites.items()
        if key[0] in ("a", "b")
        for ref, q in site.actions
        if ref == 0
    }
    assert len(shared) == 1, "a and b read x through one quantizer (S01)"
    (q,) = (q for q in qdq.quantizers_of(prep).values() if id(q) in shared)
    calls: list[int] = []
    handle = q.register_forward_hook(lambda _m, a, _o: calls.append(id(a[0])))
    try:
        with torch.no_grad():
            prep(x)
    finally:
        handle.remove()
    assert len(calls) == 1, calls


def test_a_module_key_is_not_counted_where_no_site_wants_it(prepared: Any) -> None:
    _, prep, _ = prepared
    runtime = runtime_of(prep)
    assert runtime is not None and runtime.wanted is not None
    assert MODULE not in runtime.wanted.get("stem.1", frozenset()), "BatchNorm: nothing planned"


def test_a_prepared_model_compiles_with_fullgraph_inside_a_compiled_parent(prepared: Any) -> None:
    _, prep, x = prepared
    torch._dynamo.reset()
    parent = Parent(copy.deepcopy(prep)).eval()
    graphs: list[int] = []

    def backend(gm: torch.fx.GraphModule, example: list[Any]) -> Any:
        graphs.append(len(gm.graph.nodes))
        return gm.forward

    compiled = torch.compile(parent, backend=backend, fullgraph=True)
    with torch.no_grad():
        want = parent(x)
        assert torch.equal(compiled(x), want)
        assert torch.equal(compiled(x), want)
    assert len(graphs) == 1
    torch._dynamo.reset()


def test_the_hooks_of_a_compiled_prepared_model_are_no_frames_of_dynamo(prepared: Any) -> None:
    """``torch.compile(prepared)`` calls the root's hooks outside the compiled forward: they run
    as plain Python, so dynamo keeps no compiled entry (guards: grad mode, the output's batch
    size) for them, over new batch sizes, a grad-mode change and a ``.train()`` switch."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    from qdq.graph.calls import CallTracker

    _, prep, _ = prepared
    torch._dynamo.reset()
    model = copy.deepcopy(prep)
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with torch.no_grad():
        for batch in (1, 1, 2, 3):
            compiled(torch.randn(batch, 3, 8, 8))
    model.train()
    compiled(torch.randn(2, 3, 8, 8)).sum().backward()
    for hook in (CallTracker._pre, CallTracker._post):
        assert _debug_get_cache_entry_list(hook.__code__) == [], hook.__name__
    torch._dynamo.reset()


def test_a_leaf_module_with_nothing_planned_carries_no_tracker_hook(prepared: Any) -> None:
    """BatchNorm and ReLU modules where no site is planned, and an ``nn.Sequential`` around
    them, run without the runtime's hooks (the slow path of ``nn.Module.__call__``); the root
    keeps them, and every site is still reached, once per call."""
    _, prep, x = prepared
    runtime = runtime_of(prep)
    assert runtime is not None
    hooked = {id(m) for m in runtime.hooked()}
    # BatchNorm2d, ReLU: nothing planned at their paths; the stem's nn.Sequential calls them
    for path in ("stem.1", "stem.2", "stem"):
        module = prep.get_submodule(path)
        assert id(module) not in hooked, path
        hooks = [*module._forward_pre_hooks.values(), *module._forward_hooks.values()]
        assert all(getattr(h, "__self__", None) is not runtime for h in hooks), path
    assert id(prep) in hooked
    runtime.reset_hits()
    with torch.no_grad():
        prep(x)
    assert all(site.hits == 1 for site in runtime.sites.values())


class _TwoRelus(nn.Module):
    """A functional ReLU and an ``nn.ReLU`` module called at the same (root) path."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(3)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x) + torch.relu(self.bn(x))


def test_a_leaf_whose_calls_a_site_wants_where_it_runs_keeps_its_hooks() -> None:
    """Unhooked, ``nn.ReLU``'s own ``relu`` call would be seen at the root and take the key of
    the root's functional ``relu`` after it: it keeps its hooks, the BatchNorm beside it does
    not."""
    from qdq.graph.record import record
    from qdq.graph.runtime import Site, SiteRuntime, install_runtime
    from qdq.quant import Quantizer

    torch.manual_seed(0)
    x = torch.randn(1, 3, 4, 4)
    rec = record(_TwoRelus().eval(), (x,))
    assert rec.leaf_calls is not None
    assert rec.leaf_calls["act"] == (frozenset({"relu"}), frozenset({""}))
    assert "batch_norm" in rec.leaf_calls["bn"][0]
    q = Quantizer(name="relu.input")
    q.set_amax(0.5)
    model = rec.root
    runtime = SiteRuntime(model, {("", "relu", 0): Site([(0, q)])}, (), rec.leaf_calls)
    hooked = [id(m) for m in runtime.hooked()]
    assert id(model.act) in hooked and id(model.bn) not in hooked
    install_runtime(model, runtime)
    with torch.no_grad():
        got = model(x)
        bn = model.bn(x)  # outside a forward of the root: the runtime is not active
        want = torch.relu(x) + torch.relu(q(bn))
    assert torch.equal(got, want)
    assert runtime.sites[("", "relu", 0)].hits == 1
