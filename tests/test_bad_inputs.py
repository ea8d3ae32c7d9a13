"""Bad and unusual inputs: every case fails loudly, names the culprit, and leaves nothing wrong behind.

Issue 18 (export integrity) and issue 16 items 2-3: manifests and their ONNX files, amax shapes,
numeric export checks, data-dependent control flow, calibration arguments and calibration data.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import qdq
from qdq.export import ExportError

pytest.importorskip("onnxruntime")

X = torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(0))


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Conv2d(16, 32, 3)).eval()


def _calibrated(net: nn.Module | None = None) -> nn.Module:
    prepared = qdq.prepare(net if net is not None else _net(), (X,))
    qdq.calibrate(prepared, [X, X * 2], show_progress=False)
    return prepared


@pytest.fixture(scope="module")
def prepared() -> nn.Module:
    return _calibrated()


def _files(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


# ---------------------------------------------------------------- the ONNX + manifest pair


def test_manifest_is_named_after_the_exact_file_and_carries_its_hash(prepared, tmp_path) -> None:
    a = qdq.export_onnx(prepared, (X,), tmp_path / "m.onnx")
    b = qdq.export_onnx(prepared, (X,), tmp_path / "m.bin")
    assert (a.manifest_path.name, b.manifest_path.name) == (
        "m.onnx.manifest.json",
        "m.bin.manifest.json",
    )  # two models with one stem no longer share a manifest
    doc = json.loads(a.manifest_path.read_text())
    import hashlib

    assert doc["onnx"] == {
        "file": "m.onnx",
        "sha256": hashlib.sha256(a.path.read_bytes()).hexdigest(),
    }
    qdq.load_calibration(_calibrated(), a.manifest_path)  # hash checked against m.onnx beside it
    qdq.load_calibration(_calibrated(), b.manifest_path, onnx_path=b.path)


def test_overwrite_false_protects_the_manifest_too(prepared, tmp_path) -> None:
    (tmp_path / "m.onnx.manifest.json").write_text("old manifest")
    with pytest.raises(FileExistsError, match=r"m\.onnx\.manifest\.json exists.*overwrite=True"):
        qdq.export_onnx(prepared, (X,), tmp_path / "m.onnx")
    assert _files(tmp_path) == ["m.onnx.manifest.json"]  # no ONNX written beside it
    assert (tmp_path / "m.onnx.manifest.json").read_text() == "old manifest"
    out = qdq.export_onnx(prepared, (X,), tmp_path / "m.onnx", overwrite=True)
    assert json.loads(out.manifest_path.read_text())["schema"] == "qdq.manifest/1"


@pytest.mark.parametrize("previous", [True, False])
def test_interrupted_export_leaves_the_previous_pair(
    prepared, tmp_path, monkeypatch, previous: bool
) -> None:
    target = tmp_path / "m.onnx"
    if previous:
        qdq.export_onnx(prepared, (X,), target)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    real_replace = os.replace

    def failing_replace(src: Any, dst: Any) -> None:
        if Path(dst).name == "m.onnx.manifest.json" and Path(src).name.endswith(".tmp"):
            raise OSError("disk full (simulated, between the ONNX and the manifest)")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    other = _calibrated(_net().apply(_scale_weights))
    with pytest.raises(OSError, match="simulated"):
        qdq.export_onnx(other, (X,), target, overwrite=True)
    monkeypatch.setattr(os, "replace", real_replace)
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert after == before  # old pair untouched (or still nothing); no temporaries left
    if previous:
        qdq.load_calibration(_calibrated(), target.with_name("m.onnx.manifest.json"))


def _scale_weights(m: nn.Module) -> None:
    if isinstance(m, nn.Conv2d):
        with torch.no_grad():
            m.weight.mul_(2.0)


def test_new_onnx_beside_an_old_manifest_is_refused(prepared, tmp_path) -> None:
    out = qdq.export_onnx(prepared, (X,), tmp_path / "m.onnx")
    other = qdq.export_onnx(_calibrated(_net().apply(_scale_weights)), (X,), tmp_path / "n.onnx")
    with pytest.raises(ValueError, match=r"m\.onnx\.manifest\.json does not describe .*n\.onnx"):
        qdq.load_calibration(_calibrated(), out.manifest_path, onnx_path=other.path)
    os.replace(other.path, out.path)  # a new ONNX beside the old manifest
    with pytest.raises(ValueError, match=r"SHA-256.*the pair was not written together"):
        qdq.load_calibration(_calibrated(), out.manifest_path)


def test_manifest_with_another_channel_count_is_refused(tmp_path) -> None:
    small = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 32, 3)).eval()
    out = qdq.export_onnx(_calibrated(small), (X,), tmp_path / "m.onnx")
    fresh = qdq.prepare(_net(), (X,))  # same quantizer names, 16 channels instead of 8
    amax_before = fresh.get_submodule("0.weight_quantizer").amax.clone()
    with pytest.raises(ValueError, match=r"m\.onnx\.manifest\.json.*'0:weight'.*16 channels"):
        qdq.load_calibration(fresh, out.manifest_path)
    assert torch.equal(fresh.get_submodule("0.weight_quantizer").amax, amax_before)  # untouched


def _edit(path: Path, change: Any) -> Path:
    doc = json.loads(path.read_text())
    change(doc)
    bad = path.with_name("edited.json")
    bad.write_text(json.dumps(doc))
    return bad


def _entry(doc: dict[str, Any], path: str) -> dict[str, Any]:
    return next(e for e in doc["quantizers"] if e["path"] == path)


MALFORMED = {
    "no quantizers": (lambda d: d.pop("quantizers"), r"'quantizers' must be a list"),
    "null quantizers": (lambda d: d.update(quantizers=None), r"'quantizers' must be a list"),
    "entry not an object": (
        lambda d: d["quantizers"].append(3),
        r"quantizers\[\d+\] must be an object",
    ),
    "no path": (lambda d: d["quantizers"][0].pop("path"), r"quantizers\[0\] has no 'path'"),
    "no amax": (
        lambda d: _entry(d, "0.input_quantizer").pop("amax"),
        "'0.input_quantizer' has no 'amax'",
    ),
    "null amax": (
        lambda d: _entry(d, "0.input_quantizer").update(amax=None),
        "'0.input_quantizer': amax must be",
    ),
    "string amax": (
        lambda d: _entry(d, "0.input_quantizer").update(amax="1.5"),
        "'0.input_quantizer': amax must be",
    ),
    "string in a list": (
        lambda d: _entry(d, "0.weight_quantizer")["amax"].__setitem__(2, "x"),
        "'0.weight_quantizer': amax must be",
    ),
    "per-channel amax as a number": (
        lambda d: _entry(d, "0.weight_quantizer").update(amax=1.0),
        "'0.weight_quantizer' is per-channel",
    ),
    "negative amax": (
        lambda d: _entry(d, "0.input_quantizer").update(amax=-1.0),
        "'0.input_quantizer': amax has negative",
    ),
    "three values for 16 channels": (
        lambda d: _entry(d, "0.weight_quantizer").update(amax=[1.0, 2.0, 3.0], channels=3),
        "'0:weight' is per-channel .*16 channels.* 3 amax values",
    ),
    "other axis": (
        lambda d: _entry(d, "0.weight_quantizer").update(axis=1),
        "'0.weight_quantizer' has axis=1 in the manifest but axis=0",
    ),
    "no axis": (
        lambda d: _entry(d, "2.input_quantizer").pop("axis"),
        "'2.input_quantizer' has no 'axis'",
    ),
    "extra quantizer": (
        lambda d: d["quantizers"].append({**d["quantizers"][0], "path": "ghost"}),
        r"the model does not have \['ghost'\]",
    ),
    "bad onnx entry": (lambda d: d.update(onnx="m.onnx"), "malformed 'onnx' entry"),
    "not an object": (lambda d: d.clear(), "expected schema"),
}


@pytest.fixture(scope="module")
def manifest(prepared, tmp_path_factory) -> Path:
    return qdq.export_onnx(prepared, (X,), tmp_path_factory.mktemp("pair") / "m.onnx").manifest_path


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_manifest_entries_are_value_errors(manifest, case: str) -> None:
    change, message = MALFORMED[case]
    bad = _edit(manifest, change)
    fresh = qdq.prepare(_net(), (X,))
    with pytest.raises(ValueError, match=message) as info:
        qdq.load_calibration(fresh, bad)
    assert type(info.value) is ValueError and "edited.json" in str(info.value)


def test_manifest_that_is_not_json(prepared, tmp_path) -> None:
    bad = tmp_path / "m.onnx.manifest.json"
    bad.write_bytes(b"\xff\x00 not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        qdq.load_calibration(prepared, bad)


# ---------------------------------------------------------------- amax shapes


def test_set_amax_with_the_wrong_channel_count() -> None:
    p = qdq.prepare(_net(), (X,))
    q = p.get_submodule("0.weight_quantizer")
    assert q.channels == 16  # known from the weight at insertion
    with pytest.raises(ValueError, match=r"'0:weight' is per-channel \(axis 0, 16 channels\)"):
        q.set_amax(torch.ones(3))
    with pytest.raises(ValueError, match="16 channels.* 1 amax values"):
        q.set_amax(1.0)
    with pytest.raises(ValueError, match="is per-tensor"):
        p.get_submodule("0.input_quantizer").set_amax(torch.ones(3))
    free = qdq.Quantizer(qdq.QuantSpec(axis=0), name="free")
    free.set_amax(torch.ones(4))  # records the channel count
    assert free.channels == 4
    with pytest.raises(ValueError, match="4 channels"):
        free.set_amax(torch.ones(5))
    with pytest.raises(ValueError, match="channels must be"):
        qdq.Quantizer(qdq.QuantSpec(), name="t", channels=4)


def test_state_dict_with_the_wrong_amax_shape(prepared) -> None:
    state = {k: v.clone() for k, v in prepared.state_dict().items()}
    state["0.weight_quantizer.amax"] = torch.ones(3)
    fresh = qdq.prepare(_net(), (X,))
    with pytest.raises(ValueError, match=r"0\.weight_quantizer\.amax.*'0:weight'.*16 channels"):
        fresh.load_state_dict(state)
    state["0.weight_quantizer.amax"] = torch.ones(16)
    state["2.input_quantizer.amax"] = torch.ones(2)
    with pytest.raises(ValueError, match="'2:input' is per-tensor"):
        fresh.load_state_dict(state)


def test_per_channel_amax_replaced_by_one_value_is_not_exported(tmp_path) -> None:
    p = _calibrated()
    p.get_submodule("0.weight_quantizer").amax = torch.tensor(0.5)  # bypasses set_amax
    for exporter in ("dynamo", "torchscript"):
        with pytest.raises(ValueError, match=r"'0:weight' has 1 amax values but its tensor has 16"):
            qdq.export_onnx(p, (X,), tmp_path / "m.onnx", exporter=exporter)
    assert _files(tmp_path) == []


def test_scale_shape_is_checked_while_exporting() -> None:
    from qdq.quant import ScaleShapeError

    q = qdq.Quantizer(qdq.QuantSpec(axis=0), name="w")
    with pytest.raises(ScaleShapeError, match="'w': scale of shape \\(1,\\) does not match"):
        q._check_export_scale(torch.ones(8, 3), torch.ones(1))


# ---------------------------------------------------------------- numbers, not only names


class Branchy(nn.Module):
    """The model of issue 18: Python control flow on a tensor value; a trace bakes in one branch."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, 3)
        self.conv2 = nn.Conv2d(channels, channels, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.conv1(x).mean() > 0:
            return self.conv2(self.conv1(x))
        return -self.conv2(self.conv1(x))


def _branchy(channels: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = Branchy(channels).eval()
    with torch.no_grad():
        model.conv1.bias.zero_()
    x = torch.randn(2, 3, 12, 12) + 1.0
    other = -x
    assert bool(model.conv1(x).mean() > 0) != bool(model.conv1(other).mean() > 0)
    prepared = qdq.prepare(model, (x,))  # recorded: the plan notes the tensor-valued branch
    assert any("control flow in <root>" in n for n in qdq.plan_of(prepared).notes)
    qdq.calibrate(prepared, [x, other], show_progress=False)
    return prepared, x, other


@pytest.fixture(scope="module")
def branchy() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    return _branchy(8)  # 8-channel convs stay float (H01), so TorchScript can trace the model


@pytest.mark.parametrize("exporter", ["auto", "torchscript", "dynamo"])
def test_data_dependent_control_flow_is_refused(branchy, tmp_path, exporter: str) -> None:
    prepared, x, _ = branchy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # auto: the dynamo failure is a warning
        with pytest.raises(ExportError, match=r"Python boolean.*allow_specialization=True"):
            qdq.export_onnx(prepared, (x,), tmp_path / "m.onnx", exporter=exporter)
    assert _files(tmp_path) == []


def test_data_dependent_control_flow_with_quantized_convs_writes_nothing(tmp_path) -> None:
    # with 16 channels the convs are quantized; dynamo cannot export the branch and the
    # TorchScript trace would bake it in: refused, nothing is written
    prepared, x, _ = _branchy(16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ExportError, match=r"Python boolean.*allow_specialization=True"):
            qdq.export_onnx(prepared, (x,), tmp_path / "m.onnx")
    assert _files(tmp_path) == []


def test_specialization_allowed_on_request_and_checked_on_other_inputs(branchy, tmp_path) -> None:
    prepared, x, other = branchy
    with pytest.warns(UserWarning, match="specialized on the example input"):
        out = qdq.export_onnx(
            prepared, (x,), tmp_path / "m.onnx", exporter="torchscript", allow_specialization=True
        )
    assert out.path.exists() and out.manifest_path.exists()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ExportError, match=r"output 'output' differs.*check batch 1"):
            qdq.export_onnx(
                prepared, (x,), tmp_path / "n.onnx", exporter="torchscript",
                allow_specialization=True, check_inputs=[other],
            )  # fmt: skip
    assert not (tmp_path / "n.onnx").exists()


def test_numeric_check_names_the_diverging_output(prepared, tmp_path) -> None:
    from qdq.export.verify import verify_numerics

    other = _calibrated(_net().apply(_scale_weights))
    data = qdq.export_onnx(other, (X,), tmp_path / "o.onnx").path.read_bytes()
    with pytest.raises(ExportError, match="output '.+' differs from torch"):
        verify_numerics(data, prepared, [(X,)], to_model=lambda a: a, fp16=False, error=ExportError)
    (check,) = verify_numerics(
        data, other, [(X,)], to_model=lambda a: a, fp16=False, error=ExportError
    )
    assert check.ort_vs_torch <= check.tolerance(1e-4)


def test_export_argument_types(prepared, tmp_path) -> None:
    with pytest.raises(TypeError, match="verify must be a bool"):
        qdq.export_onnx(prepared, (X,), tmp_path / "m.onnx", verify="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"check_inputs\[1\] must be a tensor"):
        qdq.export_onnx(prepared, (X,), tmp_path / "m.onnx", check_inputs=[X, "x"])
    assert _files(tmp_path) == []


# ---------------------------------------------------------------- calibration arguments


class _Untouchable:
    """Calibration data that fails the test if anything reads it."""

    def __iter__(self) -> Any:
        raise AssertionError("calibration data was read before the arguments were checked")


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"method": "maximum"}, ValueError, "unknown calibration method 'maximum'"),
        ({"method": "max", "percentile": 50}, ValueError, "only used by method='percentile'"),
        ({"method": "entropy", "percentile": 99.0}, ValueError, "not method='entropy'"),
        ({"percentile": 50}, ValueError, "no quantizer calibrates by percentile"),
        ({"method": "percentile", "percentile": 0}, ValueError, r"in \(0, 100\], got 0"),
        ({"method": "percentile", "percentile": 100.5}, ValueError, r"in \(0, 100\]"),
        ({"method": "percentile", "percentile": "99"}, TypeError, "must be a number"),
        ({"num_batches": 0}, ValueError, "num_batches must be an int >= 1"),
    ],
)
def test_calibration_arguments_checked_before_any_batch(kwargs, error, message) -> None:
    p = qdq.prepare(_net(), (X,))
    with pytest.raises(error, match=message):
        qdq.calibrate(p, _Untouchable(), show_progress=False, **kwargs)
    if "num_batches" not in kwargs:
        with pytest.raises(error, match=message):
            qdq.recompute_amax(p, **kwargs)


def test_method_the_calibrator_cannot_compute_is_refused_up_front() -> None:
    config = qdq.QuantConfig(activation_calib=qdq.CalibSpec("max", "max"))
    p = qdq.prepare(_net(), (X,), config)
    with pytest.raises(ValueError, match="needs a histogram calibrator.*'0.input_quantizer'"):
        qdq.calibrate(p, _Untouchable(), method="entropy", show_progress=False)


def test_zero_amax_is_reported_at_calibration() -> None:
    p = qdq.prepare(_net(), (X,))
    with pytest.warns(UserWarning, match=r"amax 0.*'0.input_quantizer'"):
        qdq.calibrate(p, [torch.zeros_like(X)], show_progress=False)


# ---------------------------------------------------------------- calibration data


def test_batches_as_pairs_dicts_and_lists_of_inputs() -> None:
    class TwoInputs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Conv2d(3, 16, 3)
            self.b = nn.Conv2d(3, 16, 3)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return self.a(x) + self.b(y)

    torch.manual_seed(0)
    net = TwoInputs().eval()
    label = torch.tensor([0, 1])
    shapes = [
        [(X, X, label)],  # inputs first, label ignored
        [[X, X]],
        [((X, X), label)],
        [{"x": X, "y": X, "label": label}],  # keys forward does not take are ignored
    ]
    amax = set()
    for data in shapes:
        p = qdq.prepare(net, (X, X))
        qdq.calibrate(p, data, method="max", show_progress=False)
        amax.add(p.get_submodule("a.input_quantizer").amax.item())
    assert len(amax) == 1
    p = qdq.prepare(net, (X, X))
    with pytest.raises(qdq.CalibrationError, match="batch 0 is one tensor but the model takes 2"):
        qdq.calibrate(p, [X], show_progress=False)
    with pytest.raises(
        qdq.CalibrationError, match=r"batch 1 has 1 item\(s\) but the model takes 2"
    ):
        qdq.calibrate(p, [(X, X), (X,)], show_progress=False)
    with pytest.raises(qdq.CalibrationError, match=r"batch 0 is a dict without .*\['y'\]"):
        qdq.calibrate(p, [{"x": X}], show_progress=False)


def test_wrong_channel_count_names_batch_and_shapes(capsys) -> None:
    p = qdq.prepare(_net(), (X,))
    bad = [X, torch.randn(2, 5, 12, 12)]
    with pytest.raises(
        qdq.CalibrationError,
        match=r"calibration batch 1: the model expects input: float32 tensor \[N, 3, 12, 12\], "
        r"got input: \[2, 5, 12, 12\]",
    ):
        qdq.calibrate(p, bad, show_progress=False)
    assert "generated forward" not in capsys.readouterr().err  # no dump of generated code
    qdq.calibrate(p, [torch.randn(1, 3, 20, 20)], show_progress=False)  # other sizes are fine


@pytest.mark.parametrize(
    ("batch", "error", "message"),
    [
        (torch.randn(3, 12, 12), qdq.CalibrationError, r"batch 1, input 'input' has rank 3"),
        (X.double(), qdq.CalibrationError, r"batch 1, input 'input' has dtype torch.float64"),
        (X.to("meta"), qdq.CalibrationError, r"batch 1, input 'input' is on meta"),
        (("image", 0), TypeError, r"batch 1, input 'input' is a str; expected input: float32"),
        (3, TypeError, r"batch 1 is a int; expected a tensor, a tuple/list"),
        ((), qdq.CalibrationError, r"batch 1 has 0 item\(s\)"),
    ],
)
def test_bad_calibration_batches(batch: Any, error: type[Exception], message: str) -> None:
    p = qdq.prepare(_net(), (X,))
    with pytest.raises(error, match=message):
        qdq.calibrate(p, [X, batch], show_progress=False)


def test_model_that_is_not_a_graph_module_counts_inputs_from_forward(branchy) -> None:
    prepared, x, other = branchy  # module-replacement fallback: the user's own class
    assert not isinstance(prepared, torch.fx.GraphModule)
    qdq.calibrate(prepared, [(x, torch.tensor([0, 1])), {"x": other}], show_progress=False)
    with pytest.raises(qdq.CalibrationError, match=r"batch 1, input 'x' has rank 2"):
        qdq.calibrate(prepared, [x, torch.randn(3, 3)], show_progress=False)


def test_atomic_writes_get_the_mode_open_would_give(tmp_path) -> None:
    """Not mkstemp's 0600: a written ONNX or manifest is as readable as any file the user makes."""
    import os

    from qdq._io import atomic_write_files, atomic_write_text

    old = os.umask(0o027)
    try:
        one = atomic_write_text(tmp_path / "a.json", "{}")
        (two,) = atomic_write_files({tmp_path / "b.onnx": b"x"})
    finally:
        os.umask(old)
    assert one.stat().st_mode & 0o777 == 0o640
    assert two.stat().st_mode & 0o777 == 0o640


def test_cli_output_closed_by_its_reader_is_no_traceback(tmp_path) -> None:
    # `qdq lint model.onnx --layers --json | head -1`: the reader closes the pipe after a line; qdq
    # stops quietly with 128 + SIGPIPE instead of printing a BrokenPipeError traceback
    import fcntl
    import subprocess
    import sys

    path = tmp_path / "m.onnx"
    net = nn.Sequential(*[nn.Conv2d(8, 8, 3, padding=1) for _ in range(40)]).eval()
    prepared = qdq.prepare(net, (torch.randn(1, 8, 8, 8),))
    qdq.calibrate(prepared, [torch.randn(2, 8, 8, 8)], show_progress=False)
    qdq.export_onnx(prepared, (torch.randn(1, 8, 8, 8),), path, exporter="torchscript")
    cmd = [sys.executable, "-m", "qdq", "lint", str(path), "--layers", "--json"]  # ~10 kB
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    if hasattr(fcntl, "F_SETPIPE_SZ"):  # one page: the layer table no longer fits the pipe
        fcntl.fcntl(proc.stdout.fileno(), fcntl.F_SETPIPE_SZ, 4096)
    proc.stdout.readline()
    proc.stdout.close()  # before qdq has written the rest (the layer table is long)
    err = proc.stderr.read().decode()
    code = proc.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert code in (0, 1, 141)  # 141 when a write met the closed pipe; else the lint verdict
