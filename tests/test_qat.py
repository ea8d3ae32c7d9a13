"""qdq.qat: train-ready preparation, learned amax, BatchNorm handling, recipe, distillation,
fine-tuning with checkpoint/resume, and the export of what was trained."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qdq
from qdq.qat import CheckpointError, Distiller, finetune, has_distill_hooks, qat_state, recipe


class Net(nn.Module):
    """Conv-BN-ReLU twice, a residual add, pooled into a Linear classifier (every rule fires)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)) + y)
        return self.fc(y.mean(dim=(2, 3)))


def _batches(n: int, seed: int = 0, size: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(size, 3, 8, 8, generator=g), torch.randint(0, 8, (size,), generator=g))
            for _ in range(n)]  # fmt: skip


@pytest.fixture(scope="module")
def calibrated() -> nn.Module:
    torch.manual_seed(0)
    net = Net()
    with torch.no_grad():  # non-trivial BatchNorm statistics and affine parameters
        for bn in (net.bn1, net.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.2, 0.2)
    net.eval()
    m = qdq.prepare(net, (torch.randn(1, 3, 8, 8),))
    qdq.calibrate(m, [b[0] for b in _batches(3, seed=9)], method="max", show_progress=False)
    return m


def _ce(out: torch.Tensor, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(out, batch[1])


def _amax(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: q.amax.detach().clone() for n, q in qdq.quantizers_of(model).items()}


# ------------------------------------------------------------------------------ prepare
def test_prepare_copies_and_trains_with_frozen_amax(calibrated: nn.Module) -> None:
    before = {k: v.clone() for k, v in calibrated.state_dict().items()}
    qat = qdq.qat.prepare(calibrated)
    assert qat.training and qat is not calibrated
    assert qat_state(qat) is not None and qat_state(calibrated) is None
    amax0 = _amax(qat)
    bn_stats = qat.bn1.running_mean.clone()
    w0 = qat.conv1.weight.detach().clone()
    opt = torch.optim.SGD(qat.parameters(), lr=0.05)
    for batch in _batches(3):
        loss = _ce(qat(batch[0]), batch)
        opt.zero_grad()
        loss.backward()
        assert qat.conv1.weight.grad is not None and bool(qat.conv1.weight.grad.abs().sum() > 0)
        opt.step()
    assert not torch.equal(qat.conv1.weight.detach(), w0)
    for name, value in _amax(qat).items():
        assert torch.equal(value, amax0[name]), name  # frozen by default
    assert torch.equal(qat.bn1.running_mean, bn_stats)  # BatchNorm frozen by default
    for key, value in calibrated.state_dict().items():  # the model passed in is untouched
        assert torch.equal(value, before[key]), key
    assert not any(p.requires_grad for n, p in qat.named_parameters() if n.endswith("amax"))


def test_prepare_refuses_bad_input(calibrated: nn.Module) -> None:
    with pytest.raises(ValueError, match="qdq.prepare"):
        qdq.qat.prepare(Net())
    with pytest.raises(ValueError, match="learn_amax"):
        qdq.qat.prepare(calibrated, learn_amax="lsqq")
    with pytest.raises(ValueError, match="bn must be"):
        qdq.qat.prepare(calibrated, bn="merge")
    with pytest.raises(ValueError, match="example_inputs"):
        qdq.qat.prepare(calibrated, bn="fold")
    with pytest.raises(ValueError, match="already prepared"):
        qdq.qat.prepare(qdq.qat.prepare(calibrated))
    raw = qdq.prepare(Net().eval(), (torch.randn(1, 3, 8, 8),))
    with pytest.raises(ValueError, match="calibrate"):
        qdq.qat.prepare(raw)


def test_bn_train_mode_updates_statistics(calibrated: nn.Module) -> None:
    qat = qdq.qat.prepare(calibrated, bn="train")
    stats = qat.bn1.running_mean.clone()
    qat(_batches(1)[0][0])
    assert not torch.equal(qat.bn1.running_mean, stats)


@pytest.mark.parametrize("how", ["lsq", "pact"])
def test_learned_amax_trains_and_state_dict_round_trips(calibrated: nn.Module, how: str) -> None:
    qat = qdq.qat.prepare(calibrated, learn_amax=how)
    amax0 = _amax(qat)
    learned = [q for q in qdq.quantizers_of(qat).values() if q.amax_grad == how]
    assert learned and all(isinstance(q.amax, nn.Parameter) for q in learned)
    opt = torch.optim.SGD(qdq.qat.parameter_groups(qat), lr=0.05)
    for batch in _batches(4):
        loss = _ce(qat(batch[0]), batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
    moved = [n for n, v in _amax(qat).items() if not torch.equal(v, amax0[n])]
    assert moved  # some clipping range was trained
    assert all(bool((q.amax > 0).all()) for q in learned)
    frozen = qdq.qat.prepare(calibrated)  # same keys: a learned-amax checkpoint loads into it
    frozen.load_state_dict(qat.state_dict())
    for n, v in _amax(frozen).items():
        assert torch.equal(v, _amax(qat)[n])


def test_learn_scope_activations_only(calibrated: nn.Module) -> None:
    qat = qdq.qat.prepare(calibrated, learn_amax="lsq", learn_scope="activations")
    for q in qdq.quantizers_of(qat).values():
        assert (q.amax_grad is None) == q.name.endswith(":weight")


def test_pact_gradient_only_from_clipped_values() -> None:
    amax = torch.tensor(1.0, requires_grad=True)
    x = torch.tensor([0.3, -0.7, 2.0, -3.0])
    qdq.quant.fake_quant_unchecked(x, amax, amax_grad="pact").sum().backward()
    assert amax.grad is not None
    # inside values contribute nothing; +2.0 → q=127/127, -3.0 → q=-128/127
    assert float(amax.grad) == pytest.approx((127 - 128) / 127)


def test_ptq_state_is_dropped_with_a_warning(calibrated: nn.Module) -> None:
    m = qdq.qat.prepare(calibrated)  # a copy we may change
    src = qdq.prepare(Net().eval(), (torch.randn(1, 3, 8, 8),))
    qdq.calibrate(src, [b[0] for b in _batches(2)], method="max", show_progress=False)
    q = src.conv1.weight_quantizer
    q.set_bias_delta(torch.zeros(16), src.conv1.weight, {"error": "output"})
    with pytest.warns(UserWarning, match="dropped"):
        qat = qdq.qat.prepare(src)
    assert not qat.conv1.weight_quantizer.learned
    state = qat_state(qat)
    assert state is not None and state.dropped_ptq == ["conv1.weight_quantizer"]
    assert qat_state(m) is not None and qat_state(m).dropped_ptq == []


# ------------------------------------------------------------------------------ BatchNorm fold
def test_bn_fold_is_exact_in_float_and_in_int8(calibrated: nn.Module) -> None:
    x = torch.randn(4, 3, 8, 8)
    qat = qdq.qat.prepare(calibrated, bn="fold", example_inputs=(x,))
    state = qat_state(qat)
    assert state is not None
    assert state.folded == [("conv1", "bn1"), ("conv2", "bn2")]
    assert isinstance(qat.bn1, nn.Identity) and qat.conv2.bias is not None
    qat.eval()
    with (
        torch.no_grad(),
        qdq.quantizer_mode(qat, "bypass"),
        qdq.quantizer_mode(calibrated, "bypass"),
    ):
        torch.testing.assert_close(qat(x), calibrated(x), rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # per-channel weight scales: folding keeps the INT8 model's output
        cos = F.cosine_similarity(qat(x).flatten(), calibrated(x).flatten(), dim=0)
    assert float(cos) > 0.999
    w = qat.conv1.weight.detach()
    assert torch.equal(qat.conv1.weight_quantizer.amax, w.abs().amax(dim=(1, 2, 3)))


class Tapped(nn.Module):
    """The conv output feeds its BatchNorm and is also returned: it must not be folded."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.conv(x)
        return self.bn(y), y


def test_bn_fold_undone_when_the_conv_output_has_other_readers() -> None:
    torch.manual_seed(0)
    net = Tapped().eval()
    with torch.no_grad():
        net.bn.running_var.fill_(4.0)
    x = torch.randn(2, 3, 8, 8)
    m = qdq.prepare(net, (x,))
    qdq.calibrate(m, [x], method="max", show_progress=False)
    qat = qdq.qat.prepare(m, bn="fold", example_inputs=(x,))
    state = qat_state(qat)
    assert state is not None and state.folded == []
    assert state.not_folded and state.not_folded[0][0] == "bn"
    assert isinstance(qat.bn, nn.BatchNorm2d)
    qat.eval()
    with torch.no_grad():
        for a, b in zip(qat(x), m(x), strict=True):
            assert torch.equal(a, b)


# ------------------------------------------------------------------------------ recipe
def test_recipe_schedule() -> None:
    net = nn.Linear(4, 2)
    opt, sched, plan = recipe(net, original_epochs=300, original_lr=0.01, steps_per_epoch=10)
    assert (plan.epochs, plan.total_steps) == (30, 300)
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-4)
    for _ in range(plan.total_steps):
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-6)
    with pytest.raises(ValueError, match="original_epochs"):
        recipe(net, original_epochs=0, original_lr=0.1, steps_per_epoch=1)
    with pytest.raises(ValueError, match="optimizer"):
        recipe(net, original_epochs=10, original_lr=0.1, steps_per_epoch=1, optimizer="lion")


def test_recipe_puts_learned_amax_in_its_own_group(calibrated: nn.Module) -> None:
    qat = qdq.qat.prepare(calibrated, learn_amax="lsq")
    opt, _, plan = recipe(
        qat, original_epochs=10, original_lr=0.1, steps_per_epoch=5, weight_decay=1e-4
    )
    assert [g["weight_decay"] for g in opt.param_groups] == [1e-4, 0.0]
    assert all(p.dim() <= 1 for p in opt.param_groups[1]["params"])
    state = qat_state(qat)
    assert state is not None and state.recipe == plan.to_dict()


# ------------------------------------------------------------------------------ distillation
def test_distiller_features_and_hooks_removed(calibrated: nn.Module, tmp_path: Path) -> None:
    qat = qdq.qat.prepare(calibrated)
    x = torch.randn(4, 3, 8, 8)
    d = Distiller(qat, output="kl", features="quantized")
    assert set(d.features) == {"conv1", "conv2"}  # fc (8 outputs) stays float: H02
    assert has_distill_hooks(qat)
    loss = d.loss(qat(x), x)
    assert float(loss.detach()) > 0
    loss.backward()
    assert qat.conv1.weight.grad is not None
    with pytest.raises(ValueError, match="Distiller is still attached"):
        qdq.export_onnx(qat, (x,), tmp_path / "m.onnx", verify=False)
    d.close()
    assert not has_distill_hooks(qat) and not d.active
    qdq.export_onnx(qat, (x,), tmp_path / "m.onnx", verify=False)


def test_distiller_teacher_is_the_float_model(calibrated: nn.Module) -> None:
    qat = qdq.qat.prepare(calibrated)
    x = torch.randn(4, 3, 8, 8)
    with Distiller(qat, output="mse") as d:
        with torch.no_grad(), qdq.quantizer_mode(qat, "bypass"):
            float_out = qat(x)
        assert float(d.loss(float_out, x)) == pytest.approx(0.0, abs=1e-10)
        assert float(d.loss(qat(x), x).detach()) > 0
    with pytest.raises(ValueError, match="not a module"):
        Distiller(qat, features=["nope"])
    with pytest.raises(ValueError, match="no term"):
        Distiller(qat, output=None)


# ------------------------------------------------------------------------------ finetune
def test_finetune_needs_a_qat_model(calibrated: nn.Module) -> None:
    with pytest.raises(ValueError, match="qdq.qat.prepare"):
        finetune(calibrated, _batches(1), _ce)
    qat = qdq.qat.prepare(calibrated)
    with pytest.raises(ValueError, match="one-shot iterator"):
        finetune(qat, iter(_batches(2)), _ce, epochs=2)
    with pytest.raises(ValueError, match="epochs"):
        finetune(qat, _batches(2), _ce, epochs=0)


def test_finetune_distillation_reduces_the_gap(calibrated: nn.Module) -> None:
    qat = qdq.qat.prepare(calibrated)
    data = _batches(6)
    result = finetune(qat, data, epochs=3, lr=3e-3, show_progress=False)
    assert result.steps == 18 and result.epochs == 3
    assert sum(result.losses[-6:]) < sum(result.losses[:6])
    state = qat_state(qat)
    assert state is not None and state.steps == 18 and state.distill is not None
    assert not has_distill_hooks(qat)


class _KilledError(Exception):
    pass


def test_finetune_resumes_at_the_same_step_with_the_same_losses(
    calibrated: nn.Module, tmp_path: Path
) -> None:
    data = _batches(5)
    kw = dict(epochs=2, lr=1e-3, checkpoint_every=3, show_progress=False)
    full = finetune(qdq.qat.prepare(calibrated, learn_amax="lsq"), data, _ce, **kw)
    assert full.steps == 10
    run = qdq.qat.prepare(calibrated, learn_amax="lsq")

    def kill(step: int, loss: float) -> None:
        if step == 7:  # after the checkpoint of step 6, mid-epoch 2
            raise _KilledError

    with pytest.raises(_KilledError):
        finetune(run, data, _ce, checkpoint_dir=tmp_path, on_step=kill, **kw)
    fresh = qdq.qat.prepare(calibrated, learn_amax="lsq")  # a new process would rebuild it
    resumed = finetune(fresh, data, _ce, checkpoint_dir=tmp_path, **kw)
    assert resumed.resumed_from == 6
    assert resumed.losses == full.losses  # bit for bit: same data order, state and RNG
    for (n, a), b in zip(fresh.state_dict().items(), full.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), n
    with pytest.raises(CheckpointError, match="epochs"):
        finetune(fresh, data, _ce, checkpoint_dir=tmp_path, **{**kw, "epochs": 3})


def test_finetune_checkpoint_is_safe_to_load(calibrated: nn.Module, tmp_path: Path) -> None:
    qat = qdq.qat.prepare(calibrated)
    result = finetune(qat, _batches(2), _ce, checkpoint_dir=tmp_path, show_progress=False)
    assert result.checkpoint == tmp_path / "qat-last.pt"
    state = qdq.qat.load_checkpoint(result.checkpoint)  # weights_only=True inside
    assert state["step"] == 2
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        qdq.qat.load_checkpoint(tmp_path / "bad.pt")
    assert not list(tmp_path.glob("*.tmp*"))


def test_finetune_rejects_a_diverging_loss(calibrated: nn.Module) -> None:
    qat = qdq.qat.prepare(calibrated)
    with pytest.raises(RuntimeError, match="QAT step 0"):
        finetune(qat, _batches(1), lambda out, b: out.sum() * float("inf"), show_progress=False)


# ------------------------------------------------------------------------------ export
def test_export_after_qat_matches_torch_and_records_the_training(
    calibrated: nn.Module, tmp_path: Path
) -> None:
    pytest.importorskip("onnxruntime")
    x = torch.randn(4, 3, 8, 8)
    qat = qdq.qat.prepare(calibrated, learn_amax="lsq", bn="fold", example_inputs=(x,))
    finetune(qat, _batches(4), _ce, lr=1e-3, show_progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no floored or stale amax
        result = qdq.export_onnx(qat, (x,), tmp_path / "qat.onnx")  # verify=True: ORT vs torch
    doc = json.loads(result.manifest_path.read_text())
    assert doc["qat"]["learn_amax"] == "lsq" and doc["qat"]["steps"] == 4
    assert doc["qat"]["folded"] == [["conv1", "bn1"], ["conv2", "bn2"]]
    assert all(e.get("amax_grad") == "lsq" for e in doc["quantizers"])
    import numpy as np
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    sess = ort.InferenceSession(str(result.path), opts, providers=["CPUExecutionProvider"])
    qat.eval()
    with torch.no_grad():
        want = qat(x).numpy()
    got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    manifest_amax = {e["path"]: e["amax"] for e in doc["quantizers"]}
    for path, q in qdq.quantizers_of(qat).items():
        assert np.allclose(manifest_amax[path], q.amax.detach().numpy().tolist())


def test_qat_exports_the_same_qdq_set_as_ptq(calibrated: nn.Module, tmp_path: Path) -> None:
    x = torch.randn(2, 3, 8, 8)
    ptq = qdq.export_onnx(calibrated, (x,), tmp_path / "ptq.onnx", verify=False)
    qat = qdq.qat.prepare(calibrated, learn_amax="pact")
    finetune(qat, _batches(2), _ce, lr=1e-3, show_progress=False)
    trained = qdq.export_onnx(qat, (x,), tmp_path / "qat.onnx", verify=False)
    assert (trained.num_quantize, trained.num_dequantize) == (ptq.num_quantize, ptq.num_dequantize)
    docs = [json.loads(r.manifest_path.read_text()) for r in (ptq, trained)]
    keys = [[(e["path"], e["group"], tuple(e["members"])) for e in d["quantizers"]] for d in docs]
    assert keys[0] == keys[1]
    fresh = qdq.prepare(Net().eval(), (x,))  # a trained manifest loads like any other
    qdq.load_calibration(fresh, trained.manifest_path)
    for path, q in qdq.quantizers_of(fresh).items():
        assert torch.equal(q.amax, qat.get_submodule(path).amax.detach()), path


def test_quantizer_learn_amax_round_trip_and_errors() -> None:
    q = qdq.Quantizer(name="x")
    with pytest.raises(ValueError, match="calibrate before learning"):
        q.learn_amax("lsq")
    q.set_amax(2.0)
    with pytest.raises(ValueError, match="learn_amax how"):
        q.learn_amax("sgd")
    q.learn_amax("lsq")
    param = q.amax
    assert isinstance(param, nn.Parameter) and "amax" in dict(q.named_parameters())
    q.set_amax(3.0)  # the optimizer's parameter object is kept
    assert q.amax is param and float(q.amax.detach()) == 3.0
    with torch.no_grad():
        q.amax.fill_(-1.0)  # an optimizer step past zero
    y = q(torch.tensor([0.5, -0.5]))  # the forward floors amax, no NaN, no negative scale
    assert torch.isfinite(y).all() and float(q.amax.detach()) > 0
    q.learn_amax(None)
    assert "amax" in dict(q.named_buffers()) and q.amax_grad is None
