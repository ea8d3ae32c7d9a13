"""``torch.compile`` of prepared and QAT models (issue 32).

The call-site runtime (:mod:`qdq.graph.runtime`) is traced by dynamo like the model's own code:
the plan's quantizers land in one graph (``fullgraph=True``), and the compiled model computes what
the eager one does. Most tests compile with ``aot_eager`` (dynamo + AOTAutograd, eager kernels):
then the compiled model must match the eager one bit for bit, which checks what dynamo captured
(every planned quantizer, in-place ops, shared tensors, attention seen as its parts, the STE and
LSQ gradients) apart from kernel rounding. Inductor's own kernels are checked on the quantizer,
where the numerics contract (``x / scale``, half to even) must survive fusion bit for bit.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qdq
import qdq.qat
from qdq.config import QuantSpec
from qdq.quant import Quantizer, quantizer_mode

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class Block(nn.Module):
    """In-place ops of every kind the runtime sees: an in-place ReLU module, ``z += x``,
    ``F.relu(inplace=True)``, a named ``add_``, and a tensor read by several consumers."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(c, c, 3, padding=1)
        self.bn = nn.BatchNorm2d(c)
        self.c2 = nn.Conv2d(c, c, 3, padding=1)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.bn(self.c1(x)))
        z = self.c2(y)
        z += x
        a = F.relu(z, inplace=True)
        b = a * 1.0
        b.add_(y)
        return a + b


class Net(nn.Module):
    """Convolutions, residuals, ``nn.MultiheadAttention`` and ``F.scaled_dot_product_attention``."""

    def __init__(self, c: int = 32) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.b1 = Block(c)
        self.b2 = Block(c)
        self.attn = nn.MultiheadAttention(c, 2, batch_first=True)
        self.q = nn.Linear(c, c)
        self.k = nn.Linear(c, c)
        self.v = nn.Linear(c, c)
        self.fc = nn.Linear(c, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.b2(self.b1(self.stem(x)))
        t = x.flatten(2).transpose(1, 2)
        t = t + self.attn(t, t, t, need_weights=False)[0]
        q, k, v = (f(t)[:, None] for f in (self.q, self.k, self.v))
        s = F.scaled_dot_product_attention(q, k, v)[:, 0]
        return self.fc((t + s).mean(1))


class Graphs:
    """A dynamo backend that counts the graphs it is given and runs them with AOTAutograd on eager
    kernels (the forward and backward dynamo and AOTAutograd captured, nothing else)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd

        self.count += 1
        return aot_autograd(fw_compiler=lambda g, _: make_boxed_func(g.forward))(gm, example_inputs)


@pytest.fixture(scope="module")
def calibrated() -> tuple[nn.Module, nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(4, 3, 8, 8)
    prepared = qdq.prepare(net, (x,))
    qdq.calibrate(prepared, [x, torch.randn(4, 3, 8, 8)], method="max")
    return net, prepared, x


def _fresh(model: nn.Module) -> nn.Module:
    torch._dynamo.reset()
    return copy.deepcopy(model)


def test_the_fixture_quantizes_what_the_test_needs(calibrated: Any) -> None:
    _, prepared, _ = calibrated
    names = list(qdq.quantizers_of(prepared))
    for part in ("stem.", "b1.c2.", "attn.", "q."):  # convs, MHA, the SDPA projections
        assert any(n.startswith(part) for n in names), (part, names)
    plan = qdq.plan_of(prepared)
    assert any(p.rule == "P16" for p in plan.points), "attention products are planned INT8"


def test_compiled_prepared_model_is_one_graph_and_matches_eager(calibrated: Any) -> None:
    net, prepared, x = calibrated
    model = _fresh(prepared)
    graphs = Graphs()
    compiled = torch.compile(model, backend=graphs, fullgraph=True)
    other = torch.randn(4, 3, 8, 8)
    with torch.no_grad():
        want, want_other = model(x), model(other)
        assert torch.equal(compiled(x), want)
        assert torch.equal(compiled(x), want)
        assert torch.equal(compiled(other), want_other)
        assert not torch.equal(want, net(x)), "the compiled model must quantize"
    assert graphs.count == 1, "no recompilation between calls of the same shape"


def test_compiled_model_follows_modes_and_new_amax(calibrated: Any) -> None:
    _, prepared, x = calibrated
    model = _fresh(prepared)
    compiled = torch.compile(model, backend=Graphs(), fullgraph=True)
    with torch.no_grad():
        quantized = compiled(x)
        with quantizer_mode(model, "bypass"):
            assert torch.equal(compiled(x), model(x))
            assert not torch.equal(compiled(x), quantized)
        assert torch.equal(compiled(x), quantized)
        for q in qdq.quantizers_of(model).values():
            if q.amax.dim() == 0:
                q.set_amax(q.amax * 0.5)
        halved = compiled(x)
        assert torch.equal(halved, model(x))
        assert not torch.equal(halved, quantized)


def test_compiled_qat_step_matches_eager_with_learned_amax(calibrated: Any) -> None:
    _, prepared, x = calibrated
    eager = qdq.qat.prepare(_fresh(prepared), learn_amax="lsq")
    model = copy.deepcopy(eager)
    graphs = Graphs()
    compiled = torch.compile(model, backend=graphs, fullgraph=True)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.05)
    opt_c = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(3):
        for net, opt in ((eager, opt_e), (compiled, opt_c)):
            opt.zero_grad()
            loss = net(x).square().mean()
            loss.backward()
            opt.step()
        # AOTAutograd's backward sums gradients in its own order: the parameters drift apart by
        # float rounding (checked below), not by what the forward computes. With the compiled
        # model's parameters, eager computes its output bit for bit.
        twin = copy.deepcopy(eager)
        twin.load_state_dict(model.state_dict())
        assert torch.equal(twin(x), compiled(x))
        assert torch.allclose(eager(x), compiled(x), rtol=1e-5, atol=1e-6)
    want = dict(eager.named_parameters())
    got = dict(model.named_parameters())
    amax = [n for n in want if n.endswith("amax")]
    assert len(amax) == len(qdq.quantizers_of(eager)) > 10
    for name, param in want.items():
        assert param.grad is not None, name
        assert torch.allclose(got[name].grad, param.grad, rtol=1e-5, atol=1e-8), name
        assert torch.allclose(got[name], param, rtol=1e-6, atol=1e-8), name
    assert graphs.count == 1


def test_compiled_model_under_bf16_autocast_matches_eager(calibrated: Any) -> None:
    _, prepared, x = calibrated
    model = qdq.qat.prepare(_fresh(prepared))
    compiled = torch.compile(model, backend=Graphs(), fullgraph=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = model(x)
        got = compiled(x)
    assert got.dtype == want.dtype == torch.bfloat16
    assert torch.equal(got, want)


def test_learned_rounding_and_bias_correction_compile(calibrated: Any) -> None:
    _, prepared, x = calibrated
    model = _fresh(prepared)
    from qdq.ptq.bias import correct_bias
    from qdq.ptq.kernel_sums import kernel_sum_rounding

    assert len(kernel_sum_rounding(model, [x]).rows) > 0
    assert len(correct_bias(model, [x], num_batches=1).rows) > 0
    compiled = torch.compile(model, backend=Graphs(), fullgraph=True)
    with torch.no_grad():
        assert torch.equal(compiled(x), model(x))


def test_calibration_through_a_compiled_model_matches_eager(calibrated: Any) -> None:
    """Statistics are host-side work: under ``torch.compile`` the quantizer collects outside
    the graph (a graph break), and the amax is the eager calibration's."""
    net, _, x = calibrated
    torch._dynamo.reset()
    model = qdq.prepare(net, (x,))
    compiled = torch.compile(model, backend=Graphs())
    with torch.no_grad(), quantizer_mode(model, "calibrate"):
        compiled(x)
        compiled(torch.randn(4, 3, 8, 8).mul_(0.1))
    eager = qdq.prepare(net, (x,))
    qdq.calibrate(eager, [x, torch.randn(4, 3, 8, 8).mul_(0.1)], method="max")
    for name, q in qdq.quantizers_of(model).items():
        if q.spec.axis is None:
            assert torch.equal(q.load_calib_amax("max"), qdq.quantizers_of(eager)[name].amax), name


@pytest.mark.parametrize("axis", [None, 0])
def test_inductor_keeps_the_quantizer_bit_exact(axis: int | None) -> None:
    """Inductor fuses the fake-quant chain; ``x / scale`` (not ``x * (1 / scale)``) and rounding
    half to even must survive it: codes on exact halves and values at the clip edges included."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    q = Quantizer(QuantSpec(axis=axis), name="q", channels=None if axis is None else 16)
    amax = torch.rand(16) + 0.5 if axis is not None else torch.tensor(2.3)
    q.set_amax(amax)
    scale = (amax / 127).reshape(-1, 1) if axis is not None else amax / 127
    halves = (torch.arange(-130, 130).float() + 0.5) * scale  # every code boundary, both signs
    x = torch.cat([torch.randn(16, 3000) * 2, halves.expand(16, -1)], dim=1)
    compiled = torch.compile(q, fullgraph=True)
    assert torch.equal(compiled(x), q(x))


@pytest.mark.gpu
def test_inductor_on_cuda_compiles_the_prepared_and_the_qat_model(calibrated: Any) -> None:
    """Triton kernels through torch: the fake-quant model and a QAT step (bf16 autocast, as users
    train) compile in one graph and stay within a few INT8 steps of eager (the convolutions'
    accumulation order differs between kernels, and a flipped code moves a value by one step)."""
    _, prepared, x = calibrated
    model = _fresh(prepared).cuda()
    xc = x.cuda()
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        want, got = model(xc), compiled(xc)
    assert torch.allclose(got, want, rtol=0.05, atol=0.05 * float(want.abs().max()))
    qat = qdq.qat.prepare(model, learn_amax="lsq")
    step = torch.compile(qat, fullgraph=True)
    opt = torch.optim.SGD(qat.parameters(), lr=0.01)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = step(xc).float().square().mean()
    loss.backward()
    opt.step()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for n, p in qat.named_parameters() if n.endswith("amax"))
    assert {q.amax.device.type for q in qdq.quantizers_of(qat).values()} == {"cuda"}
