"""Every qdq verb on a model that lives on one device, as checks that take the device.

``test_gpu_contract.py`` runs them on ``cuda`` (skipped without CUDA); ``test_device_contract.py``
runs the cheap ones on ``cpu``, so the same code path is exercised in CI. Each check builds its
model on the device, runs the verb without moving anything by hand, and asserts that every tensor
qdq created or updated (amax, histograms, learned scales, AdaRound/bias-correction state) is on
that device and that the model still runs there.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn

import qdq


def tiny_net(device: str) -> nn.Module:
    """Conv-BN-ReLU, a residual add, pooling and a Linear: every placement rule a CNN needs."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
            self.bn1 = nn.BatchNorm2d(16)
            self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(16, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(self.bn1(self.conv1(x)))
            y = torch.relu(self.conv2(y)) + y
            return self.fc(self.pool(y).flatten(1))

    torch.manual_seed(0)
    return Net().eval().to(device)


def batches(device: str, n: int = 4, size: int = 8, hw: int = 16) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(size, 3, hw, hw, generator=g).to(device) for _ in range(n)]


def qdq_tensors(prepared: nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor the quantizers hold (amax, learned state, calibrator statistics)."""
    out: dict[str, torch.Tensor] = {}
    for path, q in qdq.quantizers_of(prepared).items():
        for name, t in [*q.named_parameters(), *q.named_buffers()]:
            out[f"{path}.{name}"] = t
        for name, value in vars(q.calibrator).items() if q.calibrator is not None else ():
            if isinstance(value, torch.Tensor):
                out[f"{path}.calibrator.{name}"] = value
    return out


def assert_on(prepared: nn.Module, device: str) -> None:
    """Every quantizer tensor, parameter and buffer of ``prepared`` is on ``device``."""
    want = torch.device(device).type
    tensors = {**dict(prepared.named_parameters()), **dict(prepared.named_buffers())}
    tensors.update(qdq_tensors(prepared))
    elsewhere = {k: str(t.device) for k, t in tensors.items() if t.device.type != want}
    assert not elsewhere, f"not on {device}: {elsewhere}"


def calibrated(device: str, method: str = "max", model: nn.Module | None = None) -> nn.Module:
    net = tiny_net(device) if model is None else model
    data = batches(device)
    prepared = qdq.prepare(net, (data[0][:1],))
    qdq.calibrate(prepared, data, method=method, show_progress=False)
    return prepared


def check_calibrate(device: str, method: str) -> None:
    prepared = calibrated(device, method)
    assert_on(prepared, device)
    amax = {p: q.amax.clone() for p, q in qdq.quantizers_of(prepared).items()}
    for other in ("max", "entropy", "mse", "percentile"):  # recompute keeps the device too
        qdq.recompute_amax(prepared, other)
        assert_on(prepared, device)
    qdq.recompute_amax(prepared, method)
    for p, q in qdq.quantizers_of(prepared).items():
        assert torch.equal(q.amax, amax[p]), p
    with torch.no_grad():
        out = prepared(batches(device)[0])
    assert out.device.type == torch.device(device).type and torch.isfinite(out).all()


def check_fake_quant_matches_cpu(device: str) -> None:
    """The fake-quant model on ``device`` computes what its CPU copy computes (float tolerance:
    the convolutions' own rounding differs between devices, the Q/DQ grid does not)."""
    prepared = calibrated(device, "mse")
    on_cpu = copy.deepcopy(prepared).cpu()
    x = batches(device)[1]
    with torch.no_grad():
        a, b = prepared(x).cpu(), on_cpu(x.cpu())
    cos = torch.nn.functional.cosine_similarity(a, b, dim=1)
    assert cos.min() > 0.999, cos


def check_debug_sensitivity_fallback(device: str) -> None:
    from qdq.debug import layer_errors

    prepared = calibrated(device, "entropy")
    data = batches(device)
    errors = layer_errors(prepared, data, num_batches=2)
    assert errors.rows and all(r.score == r.score for r in errors.rows)
    sens = qdq.sensitivity(prepared, data, num_batches=2, show_progress=False)
    assert sens.rows
    assert_on(prepared, device)
    result = qdq.auto_quantize(
        tiny_net(device), (data[0][:1],), data, max_drop=0.0, candidates=2, max_fallback=1,
        num_batches=2, show_progress=False, exporter="torchscript",
    )  # fmt: skip
    assert_on(result.model, device)
    with torch.no_grad():
        assert torch.isfinite(result.model(data[0])).all()


def check_ptq(device: str) -> None:
    from qdq.ptq.adaround import adaround
    from qdq.ptq.bias import correct_bias
    from qdq.ptq.equalize import equalize
    from qdq.ptq.kernel_sums import kernel_sum_rounding

    data = batches(device)
    eq = equalize(tiny_net(device), (data[0][:1],), data)
    assert all(p.device.type == torch.device(device).type for p in eq.model.parameters())
    prepared = calibrated(device, "mse", eq.model)
    kernel_sum_rounding(prepared, data)
    assert_on(prepared, device)
    prepared = calibrated(device, "mse")
    rounding = adaround(prepared, data, num_samples=16, iters=10, show_progress=False)
    assert rounding.to_dict()
    correct_bias(prepared, data, num_batches=2)
    assert_on(prepared, device)
    with torch.no_grad():
        assert torch.isfinite(prepared(data[0])).all()


def check_qat_steps(device: str, dtype: torch.dtype | None, steps: int = 3) -> list[float]:
    """A user's own training loop on a QAT model (learned amax), optionally under autocast
    (``dtype``) with a :class:`torch.amp.GradScaler` for float16; returns the losses."""
    qat = qdq.qat.prepare(calibrated(device, "mse"), learn_amax="lsq")
    qat.train()
    kind = torch.device(device).type
    opt = torch.optim.SGD(qat.parameters(), lr=1e-3, momentum=0.9)
    scaler = torch.amp.GradScaler(kind, enabled=dtype is torch.float16)
    target = torch.randn(8, 10, generator=torch.Generator().manual_seed(2)).to(device)
    losses = []
    for x in batches(device, n=steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(kind, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = torch.nn.functional.mse_loss(qat(x).float(), target)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(float(loss.detach()))
    assert all(v == v and abs(v) != float("inf") for v in losses), losses
    assert_on(qat, device)
    learned = [p for n, p in qat.named_parameters() if "quantizer" in n]
    assert learned and all(p.grad is not None for p in learned)
    return losses


class _KilledError(Exception):
    pass


def check_finetune_resume(device: str, tmp: Path) -> None:
    """finetune interrupted at step 3 resumes from its step-2 checkpoint on the same device with
    the uninterrupted run's loss curve."""

    def run(ckpt: Path | None, kill_at: int | None = None) -> Any:
        def on_step(step: int, loss: float) -> None:
            if step == kill_at:
                raise _KilledError

        qat = qdq.qat.prepare(calibrated(device, "max"))
        return qdq.qat.finetune(
            qat, batches(device), epochs=1, lr=1e-4, checkpoint_dir=ckpt, checkpoint_every=1,
            show_progress=False, on_step=on_step,
        )  # fmt: skip

    full = run(None)
    try:
        run(tmp / "ckpt", kill_at=3)
        raise AssertionError("the run was not interrupted")
    except _KilledError:
        pass
    rest = run(tmp / "ckpt")
    assert rest.resumed_from == 2 and rest.steps == full.steps == 4
    torch.testing.assert_close(torch.tensor(rest.losses), torch.tensor(full.losses),
                               rtol=1e-4, atol=1e-6)  # fmt: skip
    assert_on(rest.model, device)


def check_export_equals_cpu_copy(device: str, exporter: str, tmp: Path) -> None:
    """The ONNX of the model on ``device`` is the ONNX of its CPU copy, graph and weights."""
    import onnx

    prepared = calibrated(device, "mse")
    x = batches(device)[0][:1]
    a = qdq.export_onnx(prepared, (x,), tmp / "dev.onnx", exporter=exporter)
    b = qdq.export_onnx(copy.deepcopy(prepared).cpu(), (x.cpu(),), tmp / "cpu.onnx",
                        exporter=exporter)  # fmt: skip
    assert_on(prepared, device)  # the user's model stays where it is
    ga, gb = onnx.load(a.path).graph, onnx.load(b.path).graph
    assert ga.SerializeToString() == gb.SerializeToString()
    assert (a.num_quantize, a.num_dequantize) == (b.num_quantize, b.num_dequantize) != (0, 0)


def check_parity(device: str, tmp: Path) -> None:
    from qdq.backends.parity import parity

    prepared = calibrated(device, "mse")
    data = batches(device)
    exported = qdq.export_onnx(prepared, (data[0][:1],), tmp / "m.onnx", exporter="torchscript")
    report = parity(prepared, exported.path, [b.cpu() for b in data[:2]], per_layer=True)
    assert report.top1_agreement is not None and report.top1_agreement >= 0.99
    mismatches = {p: lp.qdq_mismatches for p, lp in report.layers.items() if lp.qdq_mismatches}
    assert not mismatches, mismatches


def fp8_net(device: str) -> nn.Module:
    """Convs wide enough for FP8 (F01), a 7x7 conv that stays INT8 (F03:
    a depthwise one would make every conv INT8, F09), a residual Add, a
    pooled Linear head: an FP8 plan with both formats."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Conv2d(3, 32, 3, padding=1)
            self.big = nn.Conv2d(32, 32, 7, padding=3)
            self.pw = nn.Conv2d(32, 64, 1)
            self.conv = nn.Conv2d(64, 64, 3, padding=1)
            self.fc = nn.Linear(64, 32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = torch.relu(self.big(torch.relu(self.stem(x))))
            y = torch.relu(self.pw(x))
            y = torch.relu(self.conv(y)) + y
            return self.fc(y.mean((2, 3)))

    torch.manual_seed(0)
    return Net().eval().to(device)


def check_fp8(device: str, tmp: Path) -> None:
    """An FP8 plan on ``device`` (issue 49): calibrated there, every Q/DQ on ``device`` computes the
    bits of its CPU copy, a QAT step with learned amax under bf16 autocast, ``torch.compile``
    of the prepared model, and an export equal to the CPU copy's, verified in ONNX Runtime."""
    import onnx

    data = batches(device)
    prepared = qdq.prepare(fp8_net(device), (data[0][:1],), qdq.QuantConfig(format="fp8"))
    qdq.calibrate(prepared, data, show_progress=False)  # FP8 layers max, INT8 layers mse
    assert_on(prepared, device)
    quantizers = qdq.quantizers_of(prepared)
    assert {q.spec.format for q in quantizers.values()} == {"int8", "fp8"}
    on_cpu = copy.deepcopy(prepared).cpu()
    cpu_quantizers = qdq.quantizers_of(on_cpu)
    gen = torch.Generator().manual_seed(5)
    for path, q in quantizers.items():  # the Q/DQ grid, bit for bit across devices
        shape = (64, 32, 3, 3) if q.spec.axis is not None else (4096,)
        x = torch.randn(*shape, generator=gen) * float(q.amax.max()) * 1.5
        if q.spec.axis is not None:
            x = x[: q.amax.numel()]
        with torch.no_grad():
            a, b = q(x.to(device)).cpu(), cpu_quantizers[path](x)
        assert torch.equal(a.view(torch.int32), b.view(torch.int32)), path
    x = data[1]
    with torch.no_grad():
        eager = prepared(x)
        compiled = torch.compile(prepared)(x)
    assert torch.allclose(eager, compiled, rtol=1e-4, atol=1e-5)
    qat = qdq.qat.prepare(copy.deepcopy(prepared), learn_amax="lsq")
    qat.train()
    kind = torch.device(device).type
    opt = torch.optim.SGD(qat.parameters(), lr=1e-3)
    for x in data[:2]:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(kind, dtype=torch.bfloat16):
            loss = qat(x).float().square().mean()
        loss.backward()
        opt.step()
        assert torch.isfinite(loss)
    learned = [p for n, p in qat.named_parameters() if "quantizer" in n]
    assert learned and all(p.grad is not None and torch.isfinite(p.grad).all() for p in learned)
    xe = data[0][:1]
    a = qdq.export_onnx(prepared, (xe,), tmp / "dev.onnx")  # verified in ONNX Runtime
    b = qdq.export_onnx(on_cpu, (xe.cpu(),), tmp / "cpu.onnx")
    assert a.opset == b.opset == 19
    assert (
        onnx.load(a.path).graph.SerializeToString() == onnx.load(b.path).graph.SerializeToString()
    )
