"""pytorch_quantization compat (issue 59, helper D): QuantLSTM/QuantLSTMCell numerics, the alias over
every upstream module name, the package's documented flows (calibrate, QAT, export with
``use_fb_fake_quant``) checked by qdq's linter and parity, and the lint of LSTM / InstanceNorm /
Clip graphs."""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import qdq.compat
from qdq.compat.pytorch_quantization import calib, quant_modules
from qdq.compat.pytorch_quantization import nn as quant_nn
from qdq.compat.pytorch_quantization.nn.modules.quant_rnn import (
    GRU,
    QuantLSTM,
    QuantLSTMCell,
    QuantRNN,
)
from qdq.compat.pytorch_quantization.tensor_quant import QuantDescriptor

UPSTREAM_MODULES = [
    "", ".version", ".tensor_quant", ".quant_modules", ".calib", ".calib.calibrator", ".calib.max",
    ".calib.histogram", ".nn", ".nn.functional", ".nn._functions", ".nn._functions.quant_rnn",
    ".nn.modules", ".nn.modules._utils", ".nn.modules.tensor_quantizer", ".nn.modules.clip",
    ".nn.modules.quant_conv", ".nn.modules.quant_linear", ".nn.modules.quant_pooling",
    ".nn.modules.quant_rnn", ".nn.modules.quant_instancenorm", ".utils", ".utils.reduce_amax",
    ".utils.quant_logging", ".optim", ".optim.helper", ".cuda_ext",
]  # fmt: skip


# -- the reference: upstream's arithmetic written out by hand ---------------------------------


def _fq(x: torch.Tensor, amax: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """Upstream's fake quant: round(x * (bound/amax)) clamped, / (bound/amax) (narrow_range off)."""
    bound = 2.0 ** (bits - 1) - 1
    scale = torch.tensor(bound) / amax  # tensor / tensor: ``float / tensor`` is reciprocal·float
    return torch.clamp(torch.round(x * scale), -bound - 1, bound) / scale


def _ref_cell(x, h, c, w_ih, w_hh, b_ih, b_hh, in_amax, w_amax):
    xq, hq = _fq(torch.cat([x, h], 1), in_amax).split([x.size(1), h.size(1)], 1)
    wq_ih, wq_hh = _fq(torch.cat([w_ih, w_hh], 1), w_amax).split([w_ih.size(1), w_hh.size(1)], 1)
    gates = nn.functional.linear(xq, wq_ih, b_ih) + nn.functional.linear(hq, wq_hh, b_hh)
    i, f, g, o = gates.chunk(4, 1)
    c2 = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c2), c2


def _set_amax(module: nn.Module, in_amax: float, w_amax: torch.Tensor) -> None:
    for name, q in module.named_modules():
        if isinstance(q, quant_nn.TensorQuantizer):
            q.amax = w_amax if "weight" in name else torch.tensor(in_amax)


def test_lstm_cell_equals_upstream_arithmetic_bit_for_bit() -> None:
    torch.manual_seed(0)
    cell = QuantLSTMCell(5, 7)
    w_amax = torch.rand(28, 1) + 0.05  # per row of [w_ih | w_hh] (axis 0, the default)
    _set_amax(cell, 1.5, w_amax)
    x, h, c = torch.randn(3, 5), torch.randn(3, 7), torch.randn(3, 7)
    got = cell(x, (h, c))
    want = _ref_cell(x, h, c, cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh,
                     torch.tensor(1.5), w_amax)  # fmt: skip
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_lstm_layer_equals_stepwise_reference_bidirectional_two_layers() -> None:
    torch.manual_seed(1)
    lstm = QuantLSTM(4, 6, num_layers=2, bidirectional=True)
    amaxes = {}
    for i in range(4):  # layer·2 + direction
        amaxes[i] = (1.0 + 0.25 * i, torch.rand(24, 1) + 0.1)
        lstm._input_quantizers[i].amax = torch.tensor(amaxes[i][0])
        lstm._weight_quantizers[i].amax = amaxes[i][1]
    x = torch.randn(5, 3, 4)
    h0, c0 = torch.randn(4, 3, 6), torch.randn(4, 3, 6)
    out, (hn, cn) = lstm(x, (h0, c0))

    seq = x
    last_h, last_c = [], []
    for layer in range(2):
        outs = []
        for d in range(2):
            i = layer * 2 + d
            w_ih, w_hh, b_ih, b_hh = lstm.all_weights[i]
            h, c = h0[i], c0[i]
            steps: list[torch.Tensor] = [torch.empty(0)] * 5
            for t in range(4, -1, -1) if d else range(5):
                h, c = _ref_cell(seq[t], h, c, w_ih, w_hh, b_ih, b_hh,
                                 torch.tensor(amaxes[i][0]), amaxes[i][1])  # fmt: skip
                steps[t] = h
            outs.append(torch.stack(steps))
            last_h.append(h)
            last_c.append(c)
        seq = torch.cat(outs, 2)
    assert torch.equal(out, seq)
    assert torch.equal(hn, torch.stack(last_h)) and torch.equal(cn, torch.stack(last_c))


@pytest.mark.parametrize(
    ("layers", "bidirectional", "bias", "batch_first"),
    [(1, False, True, False), (2, True, False, True), (2, False, True, False)],
)
def test_disabled_quantizers_equal_torch_native_lstm(
    layers: int, bidirectional: bool, bias: bool, batch_first: bool
) -> None:
    """Bit for bit with torch's native CPU LSTM (oneDNN's fused LSTM rounds differently)."""
    torch.manual_seed(2)
    q = QuantLSTM(6, 5, num_layers=layers, bidirectional=bidirectional, bias=bias,
                  batch_first=batch_first)  # fmt: skip
    for m in q.modules():
        if isinstance(m, quant_nn.TensorQuantizer):
            m.disable()
    ref = nn.LSTM(6, 5, num_layers=layers, bidirectional=bidirectional, bias=bias,
                  batch_first=batch_first)  # fmt: skip
    ref.load_state_dict(q.state_dict())
    x = torch.randn(3, 4, 6)
    was = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        want = ref(x)
    finally:
        torch.backends.mkldnn.enabled = was
    got = q(x)
    assert torch.equal(got[0], want[0])
    assert torch.equal(got[1][0], want[1][0]) and torch.equal(got[1][1], want[1][1])


def test_packed_sequences_match_padded_runs_per_sequence() -> None:
    torch.manual_seed(3)
    lstm = QuantLSTM(3, 4, bidirectional=True, quant_desc_input=QuantDescriptor(amax=3.0))
    x = torch.randn(5, 3, 3)
    lengths = torch.tensor([2, 5, 3])  # unsorted: torch's permutation is honoured
    out, (hn, _) = lstm(pack_padded_sequence(x, lengths, enforce_sorted=False))
    padded, _ = pad_packed_sequence(out)
    for b, n in enumerate(lengths.tolist()):
        alone, (h1, _) = lstm(x[:n, b : b + 1])
        # equal up to the GEMM's summation order (3 rows at a time vs 1)
        torch.testing.assert_close(padded[:n, b], alone[:, 0], rtol=0, atol=1e-6)
        torch.testing.assert_close(hn[:, b], h1[:, 0], rtol=0, atol=1e-6)
    assert not torch.equal(padded[3:, 0], padded[3:, 1])  # what ends early is zero-padded
    assert (padded[2:, 0] == 0).all()


def test_state_dict_keys_and_quantizer_layout() -> None:
    lstm = QuantLSTM(4, 6, num_layers=2, bidirectional=True, bias=False)
    assert len(lstm._input_quantizers) == 4 and len(lstm._weight_quantizers) == 4
    assert [k for k in lstm.state_dict() if "quantizer" not in k] == list(
        nn.LSTM(4, 6, num_layers=2, bidirectional=True, bias=False).state_dict()
    )
    lstm._input_quantizers[1].amax = 2.0
    assert "_input_quantizers.1._amax" in lstm.state_dict()
    assert lstm._weight_quantizers[0]._axis == 0  # QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW
    cell = QuantLSTMCell(4, 6)
    cell._weight_quantizer.amax = torch.ones(24, 1)
    assert "_weight_quantizer._amax" in cell.state_dict()


def test_gradients_reach_input_and_weights_straight_through() -> None:
    torch.manual_seed(4)
    lstm = QuantLSTM(3, 4, quant_desc_input=QuantDescriptor(amax=10.0))
    x = torch.randn(2, 2, 3, requires_grad=True)
    out, _ = lstm(x)
    out.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in lstm.parameters())


def test_rnn_constructor_errors_and_other_modes() -> None:
    with pytest.raises(ValueError, match="proj_size is not supported"):
        QuantLSTM(3, 4, proj_size=2)
    with pytest.raises(ValueError, match="dropout should be a number"):
        QuantLSTM(3, 4, dropout=True)
    with pytest.raises(ValueError, match="only supported for LSTM"):
        QuantRNN(3, 4, proj_size=1)
    with pytest.raises(ValueError, match="Unknown nonlinearity"):
        QuantRNN(3, 4, nonlinearity="gelu")
    with pytest.raises(RuntimeError, match="input.size\\(-1\\) must be equal to input_size"):
        QuantLSTM(3, 4)(torch.randn(2, 1, 5))
    with pytest.raises(RuntimeError, match=r"Expected hidden\[0\] size \(1, 1, 4\), got"):
        QuantLSTM(3, 4)(torch.randn(2, 1, 3), (torch.zeros(1, 2, 4), torch.zeros(1, 1, 4)))
    with pytest.warns(UserWarning, match="non-zero dropout expects num_layers greater than 1"):
        QuantLSTM(3, 4, dropout=0.5)
    out, h = GRU(3, 4)(torch.randn(2, 1, 3))
    assert out.shape == (2, 1, 4) and h.shape == (1, 1, 4)
    out, h = QuantRNN(3, 4, nonlinearity="relu")(torch.randn(2, 1, 3))
    assert (out >= 0).all()


# -- the alias ---------------------------------------------------------------------------------


@pytest.fixture
def alias() -> Iterator[None]:
    qdq.compat.install_alias()
    try:
        yield
    finally:
        qdq.compat.uninstall_alias()


def test_alias_registers_every_upstream_module(alias: None) -> None:
    for suffix in UPSTREAM_MODULES:
        mod = importlib.import_module("pytorch_quantization" + suffix)
        assert mod is sys.modules["qdq.compat.pytorch_quantization" + suffix], suffix
    import pytorch_quantization
    from pytorch_quantization import nn as pq_nn
    from pytorch_quantization import utils

    assert pytorch_quantization.enable_onnx_export is quant_modules.enable_onnx_export
    assert pytorch_quantization.initialize is quant_modules.initialize
    assert pytorch_quantization.deactivate is quant_modules.deactivate
    assert utils.reduce_amax.__name__ == "reduce_amax"
    for name in ["QuantLSTM", "QuantLSTMCell", "LSTM", "LSTMCell", "QuantInstanceNorm1d",
                 "QuantInstanceNorm2d", "QuantInstanceNorm3d", "Clip", "TensorQuantizer"]:  # fmt: skip
        assert hasattr(pq_nn, name), name
    assert pq_nn.functional.clip is not None and pq_nn._functions.quant_rnn.RNN is not None


def test_alias_resolves_unlisted_submodules_and_uninstalls_cleanly() -> None:
    qdq.compat.install_alias()
    qdq.compat.install_alias()  # twice: harmless
    mod = importlib.import_module("pytorch_quantization.nn.modules._quantizer_export")
    assert mod.__name__ == "qdq.compat.pytorch_quantization.nn.modules._quantizer_export"
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("pytorch_quantization.no_such_module")
    qdq.compat.uninstall_alias()
    assert not [k for k in sys.modules if k.split(".")[0] == "pytorch_quantization"]
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("pytorch_quantization")


def test_default_map_has_upstreams_lstm_entries() -> None:
    names = [e.mod_name for e in quant_modules._DEFAULT_QUANT_MAP]
    assert names == ["Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
                     "ConvTranspose3d", "Linear", "LSTM", "LSTMCell", "AvgPool1d", "AvgPool2d",
                     "AvgPool3d", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d"]  # fmt: skip
    quant_modules.initialize()
    try:
        assert isinstance(nn.LSTM(3, 4), QuantLSTM) and isinstance(nn.LSTMCell(3, 4), QuantLSTMCell)
    finally:
        quant_modules.deactivate()
    assert not isinstance(nn.LSTM(3, 4), QuantLSTM)


def test_enable_onnx_export_sets_and_clears_the_flag() -> None:
    with pytest.raises(KeyError), quant_modules.enable_onnx_export():
        assert quant_nn.TensorQuantizer._enable_onnx_export
        raise KeyError
    assert not quant_nn.TensorQuantizer._enable_onnx_export


# -- the documented flows, exported and checked ------------------------------------------------


def _collect_stats(model: nn.Module, batches: list[torch.Tensor]) -> None:
    """The tutorial's collect_stats/compute_amax, as written for the package."""
    for module in model.modules():
        if isinstance(module, quant_nn.TensorQuantizer):
            if module._calibrator is not None:
                module.disable_quant()
                module.enable_calib()
            else:
                module.disable()
    with torch.no_grad():
        for x in batches:
            model(x)
    for module in model.modules():
        if isinstance(module, quant_nn.TensorQuantizer):
            if module._calibrator is not None:
                if isinstance(module._calibrator, calib.MaxCalibrator):
                    module.load_calib_amax()
                else:
                    module.load_calib_amax("percentile", percentile=99.99)
                module.enable_quant()
                module.disable_calib()
            else:
                module.enable()


def _export(model: nn.Module, x: torch.Tensor, path: Path) -> None:
    model.eval()
    quant_nn.TensorQuantizer.use_fb_fake_quant = True
    try:
        with warnings.catch_warnings(), quant_modules.enable_onnx_export():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=13,
                              input_names=["input"], output_names=["output"],
                              do_constant_folding=True)  # fmt: skip
    finally:
        quant_nn.TensorQuantizer.use_fb_fake_quant = False


def _lint_and_parity(model: nn.Module, path: Path, batches: list[torch.Tensor]):
    from qdq.backends.parity import parity
    from qdq.cli.parity import failures
    from qdq.lint import lint

    report = lint(str(path))
    errors = [f for f in report.findings if f.severity == "ERROR"]
    assert not errors, errors
    assert report.exit_code <= 1
    par = parity(model, str(path), batches, reference=True)
    assert failures(par, 0.01) == []
    return report, par


@pytest.fixture
def histogram_inputs() -> Iterator[None]:
    before = (quant_nn.QuantConv2d.default_quant_desc_input,
              quant_nn.QuantLinear.default_quant_desc_input)  # fmt: skip
    desc = QuantDescriptor(calib_method="histogram")
    quant_nn.QuantConv2d.set_default_quant_desc_input(desc)
    quant_nn.QuantLinear.set_default_quant_desc_input(desc)
    try:
        yield
    finally:
        quant_nn.QuantConv2d.default_quant_desc_input = before[0]
        quant_nn.QuantLinear.default_quant_desc_input = before[1]


def test_resnet_calibrate_qat_export_lints_and_matches_ort(
    tmp_path: Path, histogram_inputs: None
) -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    quant_modules.initialize()
    try:
        model = torchvision.models.resnet18(num_classes=10)
    finally:
        quant_modules.deactivate()
    assert isinstance(model.conv1, quant_nn.QuantConv2d) and isinstance(
        model.fc, quant_nn.QuantLinear
    )
    batches = [torch.randn(2, 3, 32, 32) for _ in range(2)]
    model.eval()
    _collect_stats(model, batches)
    assert float(model.conv1._input_quantizer.amax) > 0
    # QAT: a few steps of the tutorial's fine-tuning
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    model.train()
    before = model.fc.weight.detach().clone()
    for x in batches[:1]:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), torch.randint(0, 10, (2,))).backward()
        optimizer.step()
    assert not torch.equal(before, model.fc.weight)
    path = tmp_path / "resnet18.onnx"
    _export(model, batches[0][:1], path)
    report, par = _lint_and_parity(model.eval(), path, [batches[0][:1]])
    assert report.summary["int8_weighted_layers"] == report.summary["weighted_layers"] == 21
    assert par.top1_agreement == 1.0


class _Mixed(nn.Module):
    """Conv -> InstanceNorm -> Clip -> Conv -> LSTM -> LSTMCell -> Linear, all compat modules."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = quant_nn.QuantConv2d(3, 16, 3, padding=1)
        self.norm = quant_nn.QuantInstanceNorm2d(16, affine=True)
        self.clip = quant_nn.Clip(0.0, 6.0, learn_min=True, learn_max=True)
        self.conv2 = quant_nn.QuantConv2d(16, 16, 3, padding=1)
        self.lstm = quant_nn.QuantLSTM(16, 32, batch_first=True)
        self.cell = quant_nn.QuantLSTMCell(32, 32)
        self.fc = quant_nn.QuantLinear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv2(self.clip(self.norm(self.conv(x))))
        out, (h, c) = self.lstm(y.mean(2).transpose(1, 2))
        h2, _ = self.cell(out[:, -1], (h[-1], c[-1]))
        return self.fc(h2)


def test_lstm_instancenorm_clip_graph_lints_int8_and_matches_ort(tmp_path: Path) -> None:
    torch.manual_seed(5)
    model = _Mixed().eval()
    batches = [torch.randn(2, 3, 8, 8) for _ in range(2)]
    _collect_stats(model, batches)
    path = tmp_path / "mixed.onnx"
    _export(model, batches[0], path)
    report, _ = _lint_and_parity(model, path, batches)
    # every GEMM of every step reads its operands through DQ -> Slice: predicted INT8 (rule P10)
    assert report.summary["int8_weighted_layers"] == report.summary["weighted_layers"] == 21
    concat = [f for f in report.findings if f.rule == "S02b"]
    assert len(concat) == 9 and all(f.severity == "INFO" for f in concat)  # 8 steps + the cell


@pytest.mark.gpu
def test_mixed_model_calibrates_trains_and_exports_on_cuda(tmp_path: Path) -> None:
    """The package's flow on a CUDA model: calibration (max and histogram), a QAT step with
    learned Clip bounds, a checkpoint that loads on the CPU, and an export with both exporters."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    onnx = pytest.importorskip("onnx")
    torch.manual_seed(7)
    model = _Mixed().cuda()
    model.conv._input_quantizer = quant_nn.TensorQuantizer(
        QuantDescriptor(calib_method="histogram")
    ).cuda()
    batches = [torch.randn(2, 3, 8, 8, device="cuda") for _ in range(2)]
    model.eval()
    _collect_stats(model, batches)
    amaxes = {
        n: q.amax for n, q in model.named_modules() if isinstance(q, quant_nn.TensorQuantizer)
    }
    assert all(
        a is not None and a.is_cuda and bool(torch.isfinite(a).all()) for a in amaxes.values()
    )
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss = model(batches[0]).square().mean()
    loss.backward()
    assert model.clip.clip_value_max.grad is not None and model.fc.weight.grad is not None
    optimizer.step()
    cpu = _Mixed()
    cpu.conv._input_quantizer = quant_nn.TensorQuantizer(QuantDescriptor(calib_method="histogram"))
    cpu.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    model.eval()
    with torch.no_grad():
        out = model(batches[0])
    assert out.is_cuda and bool(torch.isfinite(out).all())
    path = tmp_path / "mixed_cuda.onnx"
    _export(model, batches[0], path)
    ops = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert ops.count("QuantizeLinear") >= 10
    program = torch.onnx.export(model, (batches[0],), dynamo=True, opset_version=17)
    assert program is not None
    assert [n.op_type for n in program.model_proto.graph.node].count("QuantizeLinear") >= 10
