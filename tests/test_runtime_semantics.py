"""The prepared model computes what the user's code says: in-place ops, first-forward caches, masks.

Each case is a defect found on real-model code and fixed: the fake-quant model (and the ONNX
traced from it) silently computed something else, or a mask got a quantizer.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qdq
from qdq.backends.onnxruntime import run, session
from qdq.graph.runtime import runtime_of

IN_PLACE = ("x.add_(y)", "x.mul_(y)", "x.relu_()", "F.relu(x, inplace=True)", "x += y", "x = x + y")


class InPlace(nn.Module):
    """``x`` is read by ``c2``, changed in place, then read by ``c3``: the change must be seen."""

    def __init__(self, op: str) -> None:
        super().__init__()
        self.c1, self.c2, self.c3 = (nn.Conv2d(16, 16, 3, padding=1) for _ in range(3))
        self.op = op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.c1(x)
        y = self.c2(x)
        if self.op == "x.add_(y)":
            x.add_(y)
        elif self.op == "x.mul_(y)":
            x.mul_(y)
        elif self.op == "x.relu_()":
            x.relu_()
        elif self.op == "F.relu(x, inplace=True)":
            F.relu(x, inplace=True)
        elif self.op == "x += y":
            x += y
        else:
            x = x + y
        return self.c3(x) + y


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("op", IN_PLACE)
def test_an_in_place_change_of_a_quantized_tensor_reaches_its_later_readers(
    op: str, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    net = InPlace(op).eval()
    x = torch.randn(2, 16, 8, 8)
    with torch.no_grad():
        ref = net(x.clone())
    prepared = qdq.prepare(net, (x,))
    with torch.no_grad(), qdq.quantizer_mode(prepared, "bypass"):
        assert torch.equal(prepared(x.clone()), ref)  # x.add_(y) ran out of place: 0.37 off
    data = [torch.randn(2, 16, 8, 8) for _ in range(3)]
    qdq.calibrate(prepared, data, method="max", show_progress=False)
    with torch.no_grad():
        fake = prepared(x.clone())
    # 8-bit noise is ~2 % here; reading the unchanged x (or its stale quantized copy) gave 37-96 %
    assert _rel(fake, ref) < 0.05
    path = tmp_path / "m.onnx"
    qdq.export_onnx(prepared, (x,), path, exporter="torchscript")
    (got,) = run(session(path), [x])
    assert _rel(torch.from_numpy(got), fake) < 1e-5


def test_augmented_assignment_on_a_quantized_tensor_trains() -> None:
    """``x += y`` reaches the runtime as ``add_``, like ``x.add_(y)``; it must not write into
    ``x``, which the quantizer of ``x`` saved for backward (RepVGG's identity Add in QAT)."""
    torch.manual_seed(0)
    x = torch.randn(2, 16, 8, 8)
    prepared = qdq.prepare(InPlace("x += y").eval(), (x,))
    site = runtime_of(prepared).sites[("", "add_", 0)]
    assert 0 in [ref for ref, _ in site.actions]  # x itself is quantized at the +=
    qdq.calibrate(prepared, [x], show_progress=False)
    prepared.train()
    prepared(x).square().mean().backward()  # "modified by an inplace operation" if written into
    assert prepared.c1.weight.grad is not None


class LazyGrid(nn.Module):
    """Builds a grid on its first forward only (as detection heads build anchors) and then adds it
    after a residual add: the first forward makes two more ``add`` calls than every later one."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(4, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
        self.conv3 = nn.Conv2d(16, 16, 1)
        self.grid: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv1(x)
        if self.grid is None:
            self.grid = (torch.arange(y.shape[-1] ** 2, dtype=y.dtype) + 1.0).reshape(
                1, 1, *y.shape[-2:]
            ) * 0.5
        z = self.conv2(y) + y  # residual add: its inputs are quantized
        return self.conv3(z * 3.0 + self.grid)


def test_calls_made_only_by_a_first_forward_do_not_shift_the_planned_sites() -> None:
    x = torch.randn(1, 4, 6, 6)
    data = [torch.randn(1, 4, 6, 6) for _ in range(3)]
    outs, amax = [], []
    for warm in (False, True):
        torch.manual_seed(0)
        net = LazyGrid().eval()
        if warm:
            with torch.no_grad():
                net(x)
        prepared = qdq.prepare(net, (x,))
        if not warm:
            assert net.grid is None  # prepare runs a copy, never the user's model
        qdq.calibrate(prepared, data, method="max", show_progress=False)
        with torch.no_grad():
            outs.append(prepared(x))
        by_name = {q.name: q for q in qdq.quantizers_of(prepared).values()}
        amax.append(float(by_name["conv2:input"].amax))
    # recorded cold, the grid's adds came first and took the residual add's number: conv2's
    # input quantizer then quantized the grid (values up to 18) instead of conv1's output
    assert amax[0] == amax[1] < 10
    assert torch.equal(outs[0], outs[1])


class WindowPad(nn.Module):
    """TinyViT's window padding: ``H + pad`` on sizes before the block's residual Add. Under the
    TorchScript tracer sizes are 0-dim int64 tensors, so that line is a torch ``add``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(4, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 32, 3, padding=1)
        self.conv3 = nn.Conv2d(32, 32, 1)
        self.window = 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        h, w = x.shape[2], x.shape[3]
        pad_b, pad_r = (self.window - h % self.window) % self.window, (-w) % self.window
        y = F.pad(x, (0, pad_r, 0, pad_b))[:, :, : h + pad_b, : w + pad_r]
        return self.conv3(self.conv2(y[:, :, :h, :w]) + x)


def test_size_arithmetic_under_the_tracer_does_not_shift_the_planned_sites(tmp_path: Path) -> None:
    torch.manual_seed(0)
    x = torch.randn(1, 4, 6, 6)
    net = WindowPad().eval()
    prepared = qdq.prepare(net, (x,))
    assert any(pt.op == "add" and pt.quantized for pt in qdq.plan_of(prepared).points)
    qdq.calibrate(prepared, [x], method="max", show_progress=False)
    # the residual Add's quantizer was handed the int64 sum ``h + pad_b`` and raised
    out = qdq.export_onnx(prepared, (x,), tmp_path / "m.onnx", exporter="torchscript")
    with torch.no_grad():
        want = prepared(x).numpy()
    got = run(session(out.path), [x])[0]
    assert abs(got - want).max() < 1e-4


class Masked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv1(x)
        keep = y.abs() < 1.0  # a bool mask computed from the input
        return self.conv2(keep * y)


def test_a_bool_mask_gets_no_quantizer() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    net = Masked().eval()
    prepared = qdq.prepare(net, (x,))
    qdq.calibrate(prepared, [x], show_progress=False)  # a quantizer on the mask raised here
    names = [q.name for q in qdq.quantizers_of(prepared).values()]
    assert not any(n.startswith("mul") for n in names), names
    with torch.no_grad():  # the mask's threshold flips a few values: compare by cosine
        cosine = F.cosine_similarity(prepared(x).flatten(), net(x).flatten(), dim=0)
    assert float(cosine) > 0.99


def test_a_quantizer_names_itself_when_given_a_bool_or_int_tensor() -> None:
    q = qdq.Quantizer(name="head.mul:input0")
    q.mode = "calibrate"
    with pytest.raises(ValueError, match=r"head\.mul:input0.*torch\.bool"):
        # inside Tensor.__mul__ a TypeError turns into "unsupported operand type(s)"
        torch.ones(3) * q(torch.ones(3) > 0)


@pytest.mark.parametrize("op", IN_PLACE)
def test_inference_mode_computes_what_no_grad_computes(op: str) -> None:
    """Under ``torch.inference_mode()`` tensors have no version counter (reading it raised
    "Inference tensors do not track version counter" in the share-once cache): each reader then
    quantizes the tensor itself, and an in-place change is still seen by the later readers."""
    torch.manual_seed(0)
    net = InPlace(op).eval()
    x = torch.randn(2, 16, 8, 8)
    prepared = qdq.prepare(net, (x,))
    qdq.calibrate(prepared, [torch.randn(2, 16, 8, 8) for _ in range(3)], method="max")
    with torch.no_grad():
        want = prepared(x.clone())
    with torch.inference_mode():
        got = prepared(x.clone())
    assert got.is_inference()
    assert torch.equal(got, want)
