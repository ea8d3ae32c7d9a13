"""``qdq.ptq.methods.choose_methods``: the calibration method chosen per quantizer by its layer's
error, never worse than the method it started from, exported through the same Q/DQ ONNX."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qdq
from qdq.backends.parity import parity
from qdq.config import CalibSpec, Override, QuantConfig
from qdq.debug import layer_errors
from qdq.ptq.methods import DEFAULT_CANDIDATES, choose_methods
from qdq.quant import fake_quant_unchecked, quantizer_mode

GLOBAL_METHODS = ("max", "entropy", "mse", "percentile")


class OutlierNet(nn.Module):
    """Convs (one depthwise), a ConvTranspose, an average pool and a Linear called twice; the
    input is heavy-tailed (:func:`_heavy`) and conv2's input carries a fixed spike."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.dw = nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.up = nn.ConvTranspose2d(32, 16, 2, stride=2)
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv1(x))
        spikes = torch.zeros_like(y)
        spikes[:, 0, 0, 0] = 60.0
        y = torch.relu(self.conv2(y + spikes))
        y = self.up(torch.relu(self.dw(y)))
        y = y.mean((2, 3))
        return self.fc(torch.relu(self.fc(y)))


def _heavy(n: int) -> torch.Tensor:
    """Heavy-tailed images: Gaussian scaled by a log-normal factor per value."""
    return torch.randn(n, 3, 10, 10) * torch.exp(0.8 * torch.randn(n, 3, 10, 10))


def _outlier_model(method: str) -> tuple[nn.Module, list[torch.Tensor]]:
    torch.manual_seed(0)
    data = [_heavy(4) for _ in range(3)]
    m = qdq.prepare(OutlierNet().eval(), (data[0][:1],))
    qdq.calibrate(m, data, method=method, show_progress=False)
    return m, data


#: owner module, call index → the activation quantizer of that call (OutlierNet)
CALLS = {
    ("conv1", 0): "conv1.input_quantizer",
    ("conv2", 0): "conv2.input_quantizer",
    ("dw", 0): "dw.input_quantizer",
    ("up", 0): "up.input_quantizer",
    ("fc", 0): "fc.input_quantizer",
    ("fc", 1): "fc.call1_input_quantizer",
}


def _oracle(m: nn.Module, data: list[torch.Tensor], amax: dict[str, float]) -> dict[str, float]:
    """An independent layer-output MSE: FP32 module inputs/outputs from forward hooks, then the
    module's own functional form on the fake-quantized input and weight."""
    seen: dict[tuple[str, int], list[tuple[torch.Tensor, torch.Tensor]]] = {}
    counts: dict[str, int] = {}
    modules = {name: m.get_submodule(name) for name, _ in CALLS}

    def hook(name: str):
        def fn(module, args, out):
            k = counts.get(name, 0)
            counts[name] = k + 1
            seen.setdefault((name, k), []).append((args[0].clone(), out.clone()))

        return fn

    handles = [mod.register_forward_hook(hook(n)) for n, mod in modules.items()]
    try:
        with torch.no_grad(), quantizer_mode(m, "bypass"):
            for x in data:
                counts.clear()
                m(x)
    finally:
        for h in handles:
            h.remove()
    sums: dict[str, list[float]] = {}
    with torch.no_grad():
        for (name, k), pairs in seen.items():
            path = CALLS[(name, k)]
            q, mod = m.get_submodule(path), modules[name]
            wq = mod.weight_quantizer
            w = fake_quant_unchecked(
                mod.weight, wq.amax, axis=wq.spec.axis, narrow_range=wq.spec.narrow_range
            )
            for x, ref in pairs:
                xq = fake_quant_unchecked(
                    x, torch.tensor(amax[path]), narrow_range=q.spec.narrow_range
                )
                if isinstance(mod, nn.ConvTranspose2d):
                    y = F.conv_transpose2d(
                        xq,
                        w,
                        mod.bias,
                        mod.stride,
                        mod.padding,
                        mod.output_padding,
                        mod.groups,
                        mod.dilation,
                    )
                elif isinstance(mod, nn.Conv2d):
                    y = mod._conv_forward(xq, w, mod.bias)
                else:
                    y = F.linear(xq, w, mod.bias)
                acc = sums.setdefault(path, [0.0, 0.0])
                acc[0] += float((y - ref).double().square().sum())
                acc[1] += ref.numel()
    return {p: e / n for p, (e, n) in sums.items()}


@pytest.mark.parametrize("method", GLOBAL_METHODS)
def test_never_worse_layer_by_layer(method: str) -> None:
    m, data = _outlier_model(method)
    started = {p: float(q.amax) for p, q in qdq.quantizers_of(m).items() if "weight" not in p}
    choice = choose_methods(m, data, num_batches=3)
    chosen = {r.quantizer: r.amax_chosen for r in choice.rows}
    assert set(chosen) == {*CALLS.values(), "mean_input_quantizer"} and not choice.skipped
    before, after = _oracle(m, data, started), _oracle(m, data, chosen)
    for r in choice.rows:
        assert r.started.split()[0] == method
        assert r.errors[r.chosen] <= r.errors[r.started]
        if r.quantizer == "mean_input_quantizer":  # the pool's input: the Q/DQ'd tensor itself
            assert r.measured == "tensor"
            continue
        assert r.measured == "layer output" and r.note == ""
        # the independent measure agrees with choose_methods's own, and is never worse either
        assert before[r.quantizer] == pytest.approx(r.errors[r.started], rel=1e-6)
        assert after[r.quantizer] == pytest.approx(r.errors[r.chosen], rel=1e-6)
        assert after[r.quantizer] <= before[r.quantizer] * (1 + 1e-9), r.quantizer
        assert float(m.get_submodule(r.quantizer).amax) == pytest.approx(r.amax_chosen)
    assert choice.changed, f"no quantizer changed method from {method}"
    if method == "entropy":  # entropy clips the heavy tails far too much on this model
        assert max(r.gain_db for r in choice.rows) > 10


class SamePadConv(nn.Conv2d):
    """EfficientNet's ``Conv2dStaticSamePadding``: a ZeroPad2d module, then ``F.conv2d``."""

    def __init__(self, channels: int) -> None:
        super().__init__(channels, channels, 3, groups=channels)
        self.static_padding = nn.ZeroPad2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.static_padding(x)
        return F.conv2d(
            x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups
        )


class PadThenConv(nn.Conv2d):
    """``F.pad`` with zeros in front of the conv."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.pad(x, (1, 2, 1, 0)))


@pytest.mark.parametrize(
    "layer",
    [
        nn.Conv2d(16, 32, 3),
        nn.Conv2d(32, 32, 3, groups=32),
        nn.ConvTranspose2d(16, 16, 2, stride=2),
        nn.Linear(32, 32),
        SamePadConv(32),
        PadThenConv(16, 32, 3),
    ],
    ids=["conv", "depthwise", "conv_transpose", "linear", "same_pad_module", "functional_pad"],
)
def test_a_one_layer_model_measures_its_own_int8_output(layer: nn.Module) -> None:
    """The layer output is re-run with the fake-quantized weight: on a one-layer model, each
    candidate's error is the INT8 model's own output error with that amax."""
    torch.manual_seed(0)
    shape = (4, 32) if isinstance(layer, nn.Linear) else (4, layer.in_channels, 8, 8)
    data = [torch.randn(*shape) * 2 for _ in range(2)]
    m = qdq.prepare(nn.Sequential(layer).eval(), (data[0],))
    qdq.calibrate(m, data, method="max", show_progress=False)
    q = m[0].input_quantizer
    choice = choose_methods(m, data)
    row = choice.row("0.input_quantizer")
    assert row.measured == "layer output" and len(choice.rows) == 1
    if not isinstance(layer, (SamePadConv, PadThenConv)):
        assert qdq.plan_of(m).point("0:input").rule == "P01"
    else:  # the quantizer sits in front of the pad (P08); its layer is still the conv
        assert qdq.plan_of(m).point("0:input").rule == "P08"
    for label, amax in (("max", row.amax_started), (row.chosen, row.amax_chosen)):
        q.set_amax(amax)
        with torch.no_grad():
            err = sum(float((m(x) - layer(x)).double().square().sum()) for x in data)
        assert err / sum(layer(x).numel() for x in data) == pytest.approx(
            row.errors[label], rel=1e-6
        )


class ResNetish(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.conv1 = nn.Conv2d(16, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
        self.down = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.stem(x)))
        y = self.conv2(torch.relu(self.conv1(x)))
        x = torch.relu(x + y)
        x = torch.relu(self.down(x))
        return self.fc(torch.flatten(self.gap(x), 1))


def test_end_to_end_output_export_and_manifest(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = ResNetish().eval()
    calib = [_heavy(8) for _ in range(3)]
    evaluation = [_heavy(8) for _ in range(2)]
    example = (calib[0][:2],)
    prepared = qdq.prepare(model, example)
    qdq.calibrate(prepared, calib, show_progress=False)
    sqnr = {}
    for method in GLOBAL_METHODS:  # calibrate once, every global method from the same histograms
        qdq.recompute_amax(prepared, method)
        sqnr[method] = layer_errors(prepared, evaluation, histograms=0).output.sqnr_db
    worst = min(sqnr, key=lambda k: sqnr[k])
    qdq.recompute_amax(prepared, worst)
    choice = choose_methods(prepared, calib)
    per_quantizer = layer_errors(prepared, evaluation, histograms=0).output.sqnr_db
    print(f"\noutput SQNR dB, global: { {k: round(v, 2) for k, v in sqnr.items()} }; per quantizer "
          f"from {worst}: {per_quantizer:.2f} ({choice.summary()})")  # fmt: skip
    assert per_quantizer >= sqnr[worst] and choice.changed
    assert {r.measured for r in choice.rows} >= {"layer output", "tensor"}  # the pool: tensor
    assert choice.row("conv1:input").measured == "layer output + tensor"  # the residual skip

    # torchscript: the quicker exporter (both write the same Q/DQ; tests/test_export.py has both)
    out = qdq.export_onnx(prepared, example, tmp_path / "m.onnx", exporter="torchscript")
    report = parity(prepared, out.path, evaluation, per_layer=True)  # ORT at ORT_ENABLE_BASIC
    print(f"ORT vs torch: cosine {report.min_cosine:.7f}, max rel diff {report.max_rel_diff:.2e}")
    assert report.min_cosine > 0.99999 and report.max_rel_diff < 5e-3
    assert all(lp.qdq_mismatches == 0 for lp in report.layers.values())

    entries = {e["path"]: e for e in json.loads(out.manifest_path.read_text())["quantizers"]}
    for r in choice.rows:
        method, _, pct = r.chosen.partition(" ")
        assert entries[r.quantizer]["method"] == method
        assert entries[r.quantizer].get("percentile") == (float(pct) if pct else None)
    fresh = qdq.load_calibration(qdq.prepare(model, example), out.manifest_path)
    for path, q in qdq.quantizers_of(prepared).items():
        loaded = fresh.get_submodule(path)
        assert torch.equal(loaded.amax, q.amax), path
        assert (loaded.amax_method, loaded.amax_percentile) == (q.amax_method, q.amax_percentile)


def test_modes_training_flag_and_report() -> None:
    m, data = _outlier_model("max")
    m.train()
    m.conv1.input_quantizer.mode = "bypass"
    modes = {p: q.mode for p, q in qdq.quantizers_of(m).items()}
    choice = choose_methods(m, data, num_batches=1)
    assert m.training and {p: q.mode for p, q in qdq.quantizers_of(m).items()} == modes
    assert choice.batches == 1 and choice.samples == 4
    assert choice.skipped == ("conv1.input_quantizer",) and "bypass" in choice.notes[0]
    assert set(choice.candidates) == {"max", "entropy", "mse", "percentile 99.9",
                                      "percentile 99.99", "percentile 99.999"}  # fmt: skip
    assert len(DEFAULT_CANDIDATES) == 6
    row = choice.row("conv2:input")
    assert set(row.errors) == set(choice.candidates) and row.owner == "conv2"
    assert choice.summary().startswith(
        f"method per quantizer: {len(choice.changed)} of 6 changed; "
    )
    assert choice.summary().endswith("; 1 skipped")
    table = choice.format(top=2)
    best = max(choice.rows, key=lambda r: r.gain_db)
    lines = table.splitlines()
    assert lines[2].startswith(best.name) and len(lines) == 5 and lines[-1].startswith("note: ")
    doc = json.loads(choice.to_json())
    assert doc["rows"][0]["errors"] and doc["skipped"] == ["conv1.input_quantizer"]


def test_ties_keep_the_started_amax_and_candidates_can_be_restricted() -> None:
    m, data = _outlier_model("percentile")
    before = {p: q.amax.clone() for p, q in qdq.quantizers_of(m).items()}
    choice = choose_methods(m, data, candidates=[("percentile", 99.99)])
    assert not choice.changed  # the only candidate is the started amax itself
    assert all(set(r.errors) == {"percentile 99.99"} for r in choice.rows)
    assert all(torch.equal(q.amax, before[p]) for p, q in qdq.quantizers_of(m).items())
    assert all(q.amax_method == "percentile" for q in qdq.quantizers_of(m).values()
               if "input" in q.name)  # fmt: skip


def test_a_max_calibrator_is_skipped_with_a_note() -> None:
    torch.manual_seed(0)
    cfg = QuantConfig.tensorrt().with_override(
        Override(name="conv2", calib=CalibSpec(calibrator="max", method="max"))
    )
    data = [_heavy(4) for _ in range(2)]
    m = qdq.prepare(OutlierNet().eval(), (data[0][:1],), cfg)
    qdq.calibrate(m, data, show_progress=False)
    amax = m.conv2.input_quantizer.amax.clone()
    choice = choose_methods(m, data)
    assert choice.skipped == ("conv2.input_quantizer",)
    assert "no histogram" in choice.notes[0] and len(choice.rows) == 6
    assert torch.equal(m.conv2.input_quantizer.amax, amax)


def test_errors() -> None:
    m, data = _outlier_model("mse")
    with pytest.raises(ValueError, match="not returned by qdq.prepare"):
        choose_methods(OutlierNet(), data)
    with pytest.raises(ValueError, match="run qdq.calibrate first"):
        choose_methods(qdq.prepare(OutlierNet(), (data[0][:1],)), data)
    with pytest.raises(ValueError, match="the data is empty"):
        choose_methods(m, [])
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match="num_batches"):
            choose_methods(m, data, num_batches=bad)
    with pytest.raises(ValueError, match="unknown calibration method"):
        choose_methods(m, data, candidates=[("kl", None)])
    with pytest.raises(ValueError, match="needs a percentile"):
        choose_methods(m, data, candidates=[("percentile", None)])
    with pytest.raises(ValueError, match="only 'percentile'"):
        choose_methods(m, data, candidates=[("mse", 99.9)])
    with pytest.raises(ValueError, match="empty"):
        choose_methods(m, data, candidates=[])
    with pytest.raises(TypeError, match="pair"):
        choose_methods(m, data, candidates=["mse"])
    with pytest.raises(TypeError, match="iterable of batches"):
        choose_methods(m, lambda model: model(data[0]))
    amax = {p: q.amax.clone() for p, q in qdq.quantizers_of(m).items()}
    assert all(torch.equal(q.amax, amax[p]) for p, q in qdq.quantizers_of(m).items())


def test_a_loaded_calibration_has_no_histograms(tmp_path: Path) -> None:
    m, data = _outlier_model("mse")
    out = qdq.export_onnx(m, (data[0][:1],), tmp_path / "m.onnx", exporter="torchscript")
    fresh = qdq.load_calibration(
        qdq.prepare(OutlierNet().eval(), (data[0][:1],)), out.manifest_path
    )
    with pytest.raises(ValueError, match="not the histograms"):
        choose_methods(fresh, data)


def test_a_layer_that_cannot_be_re_run_is_measured_on_its_tensor(monkeypatch) -> None:
    m, data = _outlier_model("max")

    def broken(self, amax):
        raise RuntimeError("no re-run")

    monkeypatch.setattr("qdq.ptq._layer_calls.LayerCall.rerun", broken)
    choice = choose_methods(m, data)
    for r in choice.rows:
        assert r.measured == "tensor" and r.errors[r.chosen] <= r.errors[r.started]
        if r.owner != "mean":
            assert "could not be re-run (RuntimeError: no re-run)" in r.note


def test_the_module_replacement_fallback(monkeypatch) -> None:
    """Without a recording, sites match every call of a module (one input quantizer for both
    calls of ``conv``), and the pool is a leaf module: the same choice works."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(16, 16, 3, padding=1)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(16, 32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(self.conv(x))
            y = y + self.conv(y)
            return self.fc(torch.flatten(self.pool(y), 1))

    def broken(*args, **kwargs):
        raise RuntimeError("recorder failure")

    monkeypatch.setattr("qdq.graph.record._Recorder.on_call", broken)
    with pytest.warns(UserWarning, match="could not be recorded"):
        m = qdq.prepare(Net().eval(), (torch.randn(1, 16, 8, 8),))
    monkeypatch.undo()
    torch.manual_seed(0)
    data = [torch.randn(4, 16, 8, 8) * torch.exp(torch.randn(4, 16, 8, 8)) for _ in range(2)]
    qdq.calibrate(m, data, method="entropy", show_progress=False)
    choice = choose_methods(m, data)
    rows = {r.quantizer: r for r in choice.rows}
    assert set(rows) == {"conv.input_quantizer", "fc.input_quantizer", "pool.input_quantizer"}
    assert rows["conv.input_quantizer"].measured == "layer output"
    assert rows["pool.input_quantizer"].measured == "tensor"
    assert all(r.errors[r.chosen] <= r.errors[r.started] for r in choice.rows) and choice.changed
