"""qdq.ptq.adaround (learned weight rounding) and qdq.ptq.bias (bias correction)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from torch import nn

import qdq
from qdq.api import quantizers_of
from qdq.lint import lint
from qdq.ptq.adaround import adaround, clear_rounding
from qdq.ptq.bias import clear_bias_correction, correct_bias
from qdq.quant import QuantMode, StaleStateError, quantizer_mode, scale_from_amax


class Net(nn.Module):
    """Conv → depthwise conv (no bias) → strided conv → Linear (no bias)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False)
        self.conv2 = nn.Conv2d(16, 32, 3, stride=2)
        self.fc = nn.Linear(32, 16, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.dw(x))
        x = torch.relu(self.conv2(x))
        return self.fc(x.mean(dim=(2, 3)))


def _data(n: int = 4, batch: int = 16, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, 3, 12, 12, generator=g) for _ in range(n)]


def _prepared(model: nn.Module, data: list[torch.Tensor]) -> nn.Module:
    m = qdq.prepare(model, (data[0][:2],))
    qdq.calibrate(m, data, method="max", show_progress=False)
    return m


@pytest.fixture
def net() -> nn.Module:
    torch.manual_seed(0)
    return Net().eval()


def _weight_quantizers(m: nn.Module) -> dict[str, qdq.quant.Quantizer]:
    return {p: q for p, q in quantizers_of(m).items() if q.name.endswith(":weight")}


def _float_weight(m: nn.Module, path: str) -> torch.Tensor:
    return m.get_submodule(path.removesuffix(".weight_quantizer")).weight


def _nearest(w: torch.Tensor, q: qdq.quant.Quantizer) -> torch.Tensor:
    s = scale_from_amax(q.amax).reshape(-1, *[1] * (w.dim() - 1))
    return torch.clamp(torch.round(w.detach() / s), -128, 127)


def _mse(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b) ** 2).mean())


# ------------------------------------------------------------------------------------ AdaRound
def test_adaround_changes_codes_only_and_lowers_the_error(net: nn.Module) -> None:
    data = _data()
    m = _prepared(net, data)
    amax = {p: q.amax.clone() for p, q in quantizers_of(m).items()}
    held_out = torch.randn(32, 3, 12, 12, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        fp32 = net(held_out)
        before = _mse(m(held_out), fp32)
        calib_before = [_mse(m(x), net(x)) for x in data]
    report = adaround(m, data, num_samples=64, iters=150, show_progress=False)

    assert [r.name for r in report.rows] == [
        "conv1:weight",
        "dw:weight",
        "conv2:weight",
        "fc:weight",
    ]
    for path, q in quantizers_of(m).items():  # amax, hence every scale, untouched
        assert torch.equal(q.amax, amax[path]), path
    applied = [r for r in report.rows if r.applied]
    assert len(applied) >= 3
    for r in report.rows:
        q = quantizers_of(m)[r.quantizer]
        if r.applied:
            assert r.mse_adaround < r.mse_nearest and 0 < r.changed < 0.5
            codes = q._buffers["rounding_codes"].to(torch.float32)
            diff = codes - _nearest(_float_weight(m, r.quantizer), q)
            assert (
                diff.abs().max() <= 1 and abs(float((diff != 0).float().mean()) - r.changed) < 1e-6
            )
            assert q.learned["rounding"]["method"] == "adaround"
        else:
            assert not q.has_rounding
    with torch.no_grad():
        after = _mse(m(held_out), fp32)
        calib_after = [_mse(m(x), net(x)) for x in data]
    assert sum(calib_after) < sum(calib_before)  # the whole model, on the calibration data
    assert after < before  # and on data it did not see
    text = report.format()
    assert "conv1:weight" in text and report.summary() in text
    json.dumps(report.to_dict())


def test_bypass_is_still_the_fp32_model(net: nn.Module) -> None:
    data = _data(2)
    m = _prepared(net, data)
    floats = {k: v.clone() for k, v in m.state_dict().items() if "quantizer" not in k}
    adaround(m, data, num_samples=16, iters=20, show_progress=False)
    correct_bias(m, data)
    assert any(q.has_rounding for q in _weight_quantizers(m).values())
    assert all(q.has_bias_delta for q in _weight_quantizers(m).values())
    for k, v in m.state_dict().items():
        if k in floats:
            assert torch.equal(v, floats[k]), k
    x = torch.randn(5, 3, 12, 12)
    with torch.no_grad(), quantizer_mode(m, QuantMode.BYPASS):
        assert torch.equal(m(x), net(x))
    with torch.no_grad():  # and the INT8 model is another one
        assert not torch.equal(m(x), net(x))


def test_state_dict_round_trip_deepcopy_and_stale_state(net: nn.Module) -> None:
    data = _data(2)
    m = _prepared(net, data)
    adaround(m, data, num_samples=16, iters=20, show_progress=False)
    correct_bias(m, data)
    x = torch.randn(3, 3, 12, 12)
    with torch.no_grad():
        y = m(x)
    fresh = qdq.prepare(net, (data[0][:2],))
    fresh.load_state_dict(m.state_dict())  # strict: the learned buffers are adopted
    clone = copy.deepcopy(m)
    with torch.no_grad():
        assert torch.equal(fresh(x), y)
        assert torch.equal(clone(x), y)
    # a state_dict without learned state drops it from the model it is loaded into
    plain = _prepared(net, data)
    clone.load_state_dict(plain.state_dict())
    assert not any(q.learned for q in quantizers_of(clone).values())
    with torch.no_grad():
        assert torch.equal(clone(x), plain(x))

    # the user trains the float weights: the learned state no longer fits
    opt = torch.optim.SGD(fresh.parameters(), lr=1e-3)
    fresh(x).sum().backward()
    opt.step()
    with pytest.raises(StaleStateError, match="conv1:weight.*float weight changed"):
        fresh(x)
    with torch.no_grad():  # an amax set afterwards makes the codes stale too
        m.conv2.weight_quantizer.set_amax(m.conv2.weight_quantizer.amax * 1.5)
    with pytest.raises(StaleStateError, match="conv2:weight.*amax changed"):
        m(x)
    m.conv2.weight_quantizer.clear_learned()
    with quantizer_mode(fresh, QuantMode.BYPASS), torch.no_grad():
        fresh(x)  # the FP32 model is never stale
    assert clear_rounding(fresh) and clear_bias_correction(fresh)
    with torch.no_grad():
        fresh(x)


def test_conv1d_conv3d_and_a_shared_module_are_rounded() -> None:
    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1 = nn.Conv1d(8, 16, 3, padding=1)
            self.c3 = nn.Conv3d(8, 16, 3, padding="same")
            self.block = nn.Conv1d(16, 16, 3, padding=1)  # called twice

        def forward(self, x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            y = self.block(torch.relu(self.block(torch.relu(self.c1(x)))))
            return y.mean() + self.c3(v).mean(dim=(2, 3, 4)).sum(dim=1, keepdim=True) + y[:, :, 0]

    torch.manual_seed(0)
    model = Shared().eval()
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(8, 8, 20, generator=g), torch.randn(8, 8, 5, 5, 5, generator=g))
            for _ in range(2)]  # fmt: skip
    m = qdq.prepare(model, data[0])
    qdq.calibrate(m, data, method="max", show_progress=False)
    report = adaround(m, data, num_samples=16, iters=60, show_progress=False)
    rows = {r.name: r for r in report.rows}
    assert set(rows) == {"c1:weight", "block:weight", "c3:weight"}
    assert rows["block:weight"].calls == 2 and rows["block:weight"].applied
    assert all(r.mse_adaround <= r.mse_nearest for r in report.rows)
    bias = {r.name: r for r in correct_bias(m, data).rows}
    assert set(bias) == set(rows) and bias["block:weight"].calls == 2
    assert all(r.sqnr_after_db >= r.sqnr_before_db for r in bias.values())
    with torch.no_grad(), quantizer_mode(m, QuantMode.BYPASS):
        assert torch.equal(m(*data[0]), model(*data[0]))


def test_data_of_another_size_than_the_example(net: nn.Module) -> None:
    data = [torch.randn(8, 3, 16, 16) for _ in range(2)]
    m = qdq.prepare(net, (torch.randn(2, 3, 12, 12),))
    qdq.calibrate(m, data, show_progress=False)
    assert len(adaround(m, data, num_samples=8, iters=5, show_progress=False).rows) == 4
    assert len(correct_bias(m, data).rows) == 4


def test_conv_transpose_is_skipped_with_a_note() -> None:
    model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.ConvTranspose2d(16, 16, 2, stride=2))
    data = _data(2)
    m = _prepared(model.eval(), data)
    report = adaround(m, data, num_samples=16, iters=10, show_progress=False)
    assert [r.name for r in report.rows] == ["0:weight"]
    assert any("2:weight" in n and "conv_transpose2d" in n for n in report.notes)
    bias = correct_bias(m, data)
    assert [r.name for r in bias.rows] == ["0:weight"] and bias.notes


def test_bad_arguments(net: nn.Module) -> None:
    data = _data(1)
    m = qdq.prepare(net, (data[0][:2],))
    with pytest.raises(ValueError, match="calibrate first"):
        adaround(m, data, show_progress=False)
    qdq.calibrate(m, data, show_progress=False)
    with pytest.raises(ValueError, match="iters must be an int"):
        adaround(m, data, iters=0)
    with pytest.raises(ValueError, match="num_batches"):
        correct_bias(m, data, num_batches=0)
    with pytest.raises(ValueError, match="error must be one of"):
        correct_bias(m, data, error="input")
    with pytest.raises(ValueError, match="no batches"):
        correct_bias(m, [])
    with pytest.raises(ValueError, match="not returned by qdq.prepare"):
        adaround(net, data)


# ------------------------------------------------------------------------------ bias correction
def _biased_depthwise() -> nn.Module:
    """A depthwise conv whose weights all sit 0.45 steps above a code: nearest rounding rounds
    every one down, a shift of the output mean per channel (inputs are positive)."""
    g = torch.Generator().manual_seed(1)
    conv = nn.Conv2d(16, 16, 3, groups=16)
    s = torch.rand(16, 1, 1, 1, generator=g) * 0.01 + 0.005
    codes = torch.randint(-60, 60, (16, 1, 3, 3), generator=g).float() + 0.45
    codes[:, :, 0, 0] = 127.0  # amax = 127·s: the scale is s
    with torch.no_grad():
        conv.weight.copy_(codes * s)
        conv.bias.uniform_(-0.1, 0.1, generator=g)
    return nn.Sequential(conv).eval()


@pytest.mark.parametrize("error", ["output", "weight"])
def test_bias_correction_removes_a_biased_quantization_error(error: str) -> None:
    model = _biased_depthwise()
    g = torch.Generator().manual_seed(2)
    data = [torch.rand(16, 16, 10, 10, generator=g) for _ in range(4)]
    test = torch.rand(32, 16, 10, 10, generator=g)
    m = _prepared(model, data)

    def channel_mean_error() -> torch.Tensor:
        with torch.no_grad():
            return (m(test) - model(test)).mean(dim=(0, 2, 3)).abs()

    before = channel_mean_error()
    report = correct_bias(m, data, num_batches=4, error=error)
    after = channel_mean_error()
    assert after.mean() < 0.1 * before.mean()
    (row,) = report.rows
    assert row.name == "0:weight" and row.channels == 16 and not row.added_bias
    assert row.sqnr_after_db > row.sqnr_before_db + 3
    assert row.mean_abs_delta > 0 and report.batches == 4 and report.samples == 64
    info = m[0].weight_quantizer.learned["bias_correction"]
    assert info["method"] == "empirical" and info["num_batches"] == 4 and info["error"] == error
    assert report.error == error and report.to_dict()["error"] == error
    assert "0:weight" in report.format() and json.loads(json.dumps(report.to_dict()))["rows"]
    again = correct_bias(m, data, num_batches=4, error=error)  # a second run replaces the delta
    assert abs(again.rows[0].mean_abs_delta - row.mean_abs_delta) < 1e-3 * row.mean_abs_delta
    assert again.rows[0].sqnr_before_db == pytest.approx(row.sqnr_after_db, abs=0.05)


# ------------------------------------------------------------------------------------- export
def _qdq_weight(model: onnx.ModelProto, op: onnx.NodeProto) -> tuple[np.ndarray, np.ndarray]:
    """The initializer feeding the weight Q of ``op`` and the Q's scale."""
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    dq = producers[op.input[1]]
    assert dq.op_type == "DequantizeLinear"
    q = producers[dq.input[0]]
    assert q.op_type == "QuantizeLinear" and q.input[0] in inits and q.input[0] not in producers
    return inits[q.input[0]], inits[q.input[1]]


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_export_carries_codes_and_corrected_bias(
    net: nn.Module, tmp_path: Path, exporter: str
) -> None:
    pytest.importorskip("onnxruntime")
    from qdq.backends.onnxruntime import parity

    data = _data(2)
    m = _prepared(net, data)
    plain = qdq.export_onnx(m, (data[0][:2],), tmp_path / "plain.onnx", exporter=exporter)
    adaround(m, data, num_samples=32, iters=40, show_progress=False)
    correct_bias(m, data)
    out = qdq.export_onnx(
        m, (data[0][:2],), tmp_path / "m.onnx", exporter=exporter, check_inputs=[data[1]]
    )  # verify: ORT vs torch fake quant, inside the export
    model = onnx.load(str(out.path))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    ops = [n for n in model.graph.node if n.op_type in ("Conv", "Gemm", "MatMul")]
    assert [n.name.split("/")[0] for n in ops] == ["conv1", "dw", "conv2", "fc"]
    for op in ops:
        path = op.name.split("/")[0]
        q = m.get_submodule(f"{path}.weight_quantizer")
        w, scale = _qdq_weight(model, op)
        shape = (-1,) + (1,) * (w.ndim - 1)
        if op.op_type == "MatMul":  # a transposed Linear weight: channels on the last axis
            w = w.T
        codes = np.clip(np.round(w / scale.reshape(shape)), -128, 127)
        expected = (
            q._buffers["rounding_codes"] if q.has_rounding else _nearest(_float_weight(m, path), q)
        )
        assert np.array_equal(codes, expected.numpy().astype(np.float32)), path
        layer = m.get_submodule(path)
        delta = q._buffers["bias_delta"].numpy()
        want = delta if layer.bias is None else layer.bias.detach().numpy() + delta
        bias = [inits[i] for i in op.input[2:3] if i in inits]
        if op.op_type == "MatMul":  # dynamo writes Linear on 2-D input as Gemm; else MatMul + Add
            (add,) = [n for n in model.graph.node if n.op_type == "Add" and op.output[0] in n.input]
            bias = [inits[i] for i in add.input if i in inits]
        assert len(bias) == 1 and np.array_equal(bias[0], want), path
    assert sum(q.has_rounding for q in _weight_quantizers(m).values()) >= 3
    # ORT at ORT_ENABLE_BASIC runs the torch fake-quant model: every Q/DQ bit-exact on the same
    # input, and with every upstream tensor taken from torch (isolated) no code differs beyond a
    # rounding-boundary flip; the first quantizer reads the network input: not one code differs
    x = torch.randn(8, 3, 12, 12)
    report = parity(m, out.path, [x, data[1]], per_layer=True)
    assert report.min_cosine > 0.9999 and report.top1_agreement == 1.0
    assert report.layers["conv1.input_quantizer"].differing_codes == 0
    for path, lp in report.layers.items():
        assert lp.qdq_mismatches == 0 and lp.unexplained_codes == 0, path
    lint_plain, lint_now = lint(plain.path), lint(out.path)
    assert lint_now.verdict == lint_plain.verdict and lint_now.rules() == lint_plain.rules()
    # the same layers in INT8 (a Linear without bias exports as MatMul, with one as Gemm)
    scopes = [tuple(n.split("/")[0] for n in r.int8_layers) for r in (lint_plain, lint_now)]
    assert scopes[0] == scopes[1]

    # the manifest says what was learned; a model without it cannot load the manifest
    doc = json.loads(out.manifest_path.read_text())
    learned = {e["path"]: e["learned"] for e in doc["quantizers"] if "learned" in e}
    assert set(learned) == set(_weight_quantizers(m))
    assert all(e["bias_correction"]["method"] == "empirical" for e in learned.values())
    assert any(e.get("rounding", {}).get("method") == "adaround" for e in learned.values())
    fresh = qdq.prepare(net, (data[0][:2],))
    with pytest.raises(ValueError, match="manifest records rounding.*state_dict"):
        qdq.load_calibration(fresh, out.manifest_path)
    fresh.load_state_dict(m.state_dict())
    qdq.load_calibration(fresh, out.manifest_path)  # the same learned state: accepted
    with torch.no_grad():
        assert torch.equal(fresh(x), m(x))
    with pytest.raises(ValueError, match="the model has rounding, the manifest records none"):
        qdq.load_calibration(fresh, plain.manifest_path)
