"""Models past protobuf's 2 GB limit: the export writes the weights to ``m.onnx.data`` beside the
ONNX (:mod:`qdq.export.external`). The threshold is lowered so a tiny model takes that path."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import qdq
import qdq.export.external as external
from qdq.export import ExportError

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

X = torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(0))


def _net(scale: float = 1.0) -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Conv2d(16, 32, 3)).eval()
    with torch.no_grad():
        net[2].weight.mul_(scale)
    return net


def _calibrated(scale: float = 1.0) -> nn.Module:
    prepared = qdq.prepare(_net(scale), (X,))
    qdq.calibrate(prepared, [X, X * 2], show_progress=False)
    return prepared


@pytest.fixture(scope="module")
def prepared() -> nn.Module:
    torch.set_num_threads(1)
    return _calibrated()


def _make_large(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every model counts as past the protobuf limit, and every initializer goes to the data
    file (per-channel scales of wide layers do: regnet_y_128gf's 528-channel scales at 1 KiB)."""
    monkeypatch.setattr(external, "EXTERNAL_DATA_THRESHOLD", 0)
    monkeypatch.setattr(external, "SIDECAR_MIN_BYTES", 0)


@pytest.fixture(name="large")
def _large(monkeypatch: pytest.MonkeyPatch) -> None:
    _make_large(monkeypatch)


def _files(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_large_model_is_written_with_external_data(prepared, tmp_path, large, exporter) -> None:
    from qdq.backends.onnxruntime import run, session

    out = qdq.export_onnx(prepared, (X,), tmp_path / "m.onnx", exporter=exporter, verify=True)
    assert _files(tmp_path) == ["m.onnx", "m.onnx.data", "m.onnx.manifest.json"]  # no staging
    assert out.external_data == tmp_path / "m.onnx.data"
    assert out.external_data.stat().st_mode == out.path.stat().st_mode  # not onnx's 0600
    skeleton = onnx.load(str(out.path), load_external_data=False)
    locations = {
        e.value for t in skeleton.graph.initializer for e in t.external_data if e.key == "location"
    }
    assert locations == {"m.onnx.data"}  # relative: the pair can move together
    onnx.checker.check_model(str(out.path), full_check=True)
    full = onnx.load(str(out.path))  # the weights come back from the data file
    weight = next(
        t for t in full.graph.initializer if t.dims and t.dims[0] == 32 and len(t.dims) == 4
    )
    assert onnx.numpy_helper.to_array(weight).shape == (32, 16, 3, 3)
    ours = prepared(X).detach().numpy()
    theirs = run(session(out.path), [X])[0]
    assert np.abs(theirs - ours).max() < 1e-3 * np.abs(ours).max()
    doc = json.loads(out.manifest_path.read_text())
    assert doc["onnx"]["external_data"] == {
        "file": "m.onnx.data",
        "sha256": external.sha256_of_file(out.external_data),
    }
    qdq.load_calibration(_calibrated(), out.manifest_path)  # both hashes match


def test_lint_and_parity_read_the_external_data(prepared, tmp_path, large, monkeypatch) -> None:
    import qdq.lint.load as load
    from qdq.backends.parity import parity
    from qdq.lint import lint

    out = qdq.export_onnx(prepared, (X,), tmp_path / "m.onnx", exporter="torchscript")
    report = lint(out.path)
    monkeypatch.undo()  # the same model as one file
    one = qdq.export_onnx(prepared, (X,), tmp_path / "one" / "m.onnx", exporter="torchscript")
    assert one.external_data is None
    same = lint(one.path)  # the same model in one file: the same prediction
    assert report.int8_layers == same.int8_layers and "2/Conv" in report.int8_layers
    assert report.summary == same.summary and report.rules() == same.rules()
    monkeypatch.setattr(load, "PROTOBUF_LIMIT", 0)  # the path a > 2 GB file takes
    proto, _ = load.load_model(out.path)
    declared = onnx.load(str(out.path), load_external_data=False).graph.value_info
    assert len(proto.graph.value_info) > len(declared)  # inferred on the graph without weights
    rep = parity(prepared, out.path, [X], per_layer=True)
    assert rep.min_cosine > 0.9999
    assert rep.layers  # per-layer taps added to the graph read without its data
    # past 2 GB shape inference cannot take the model with its weights: the FLOP share then
    # comes from the shapes inferred on the graph without them, not 0 %
    infer = onnx.shape_inference.infer_shapes

    def weightless_only(model, *args, **kwargs):
        if any(t.raw_data for t in model.graph.initializer):
            raise ValueError("planted: Message onnx.ModelProto exceeds maximum protobuf size")
        return infer(model, *args, **kwargs)

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", weightless_only)
    big = lint(out.path)
    assert big.summary["int8_flops_percent"] == same.summary["int8_flops_percent"] > 0


def test_tampered_data_file_is_refused(prepared, tmp_path, large) -> None:
    out = qdq.export_onnx(prepared, (X,), tmp_path / "m.onnx", exporter="torchscript")
    assert out.external_data is not None
    data = bytearray(out.external_data.read_bytes())
    data[0] ^= 1
    out.external_data.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"does not describe .*m\.onnx\.data.*re-export"):
        qdq.load_calibration(_calibrated(), out.manifest_path)
    out.external_data.unlink()
    with pytest.raises(FileNotFoundError, match=r"m\.onnx\.data, which is missing"):
        qdq.load_calibration(_calibrated(), out.manifest_path)


@pytest.mark.parametrize("previous", [False, True])
def test_failure_midway_leaves_nothing_behind(
    prepared, tmp_path, large, monkeypatch, previous: bool
) -> None:
    import qdq.export.verify as verify

    target = tmp_path / "m.onnx"
    if previous:
        qdq.export_onnx(prepared, (X,), target, exporter="torchscript")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def broken(*args: Any, **kwargs: Any) -> None:
        raise ExportError("verification failed (simulated)")

    monkeypatch.setattr(verify, "verify_numerics", broken)
    with pytest.raises(ExportError, match="simulated"):
        qdq.export_onnx(_calibrated(2.0), (X,), target, exporter="torchscript", overwrite=True)
    monkeypatch.undo()
    _make_large(monkeypatch)
    real_replace = os.replace

    def failing_replace(src: Any, dst: Any) -> None:
        # moving the staged manifest into place, after the ONNX and its data
        if Path(dst).name == "m.onnx.manifest.json" and Path(src).parent != tmp_path:
            raise OSError("disk full (simulated, after the ONNX and its data)")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="simulated"):
        qdq.export_onnx(_calibrated(2.0), (X,), target, exporter="torchscript", overwrite=True)
    monkeypatch.setattr(os, "replace", real_replace)
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert after == before  # the old triple untouched (or still nothing); no staging left


def test_overwrite_covers_the_data_file(prepared, tmp_path, monkeypatch) -> None:
    target = tmp_path / "m.onnx"
    (tmp_path / "m.onnx.data").write_bytes(b"someone's data")
    with pytest.raises(FileExistsError, match=r"m\.onnx\.data exists.*overwrite=True"):
        qdq.export_onnx(prepared, (X,), target, exporter="torchscript")
    assert _files(tmp_path) == ["m.onnx.data"]
    _make_large(monkeypatch)
    qdq.export_onnx(prepared, (X,), target, exporter="torchscript", overwrite=True)
    assert _files(tmp_path) == ["m.onnx", "m.onnx.data", "m.onnx.manifest.json"]
    monkeypatch.undo()  # a small model again: one file, the old data file goes with the old ONNX
    out = qdq.export_onnx(prepared, (X,), target, exporter="torchscript", overwrite=True)
    assert out.external_data is None
    assert _files(tmp_path) == ["m.onnx", "m.onnx.manifest.json"]
    assert "external_data" not in json.loads(out.manifest_path.read_text())["onnx"]


def test_session_on_a_large_proto_and_on_one_without_its_data(prepared, tmp_path, large) -> None:
    from qdq.backends.onnxruntime import run, session

    out = qdq.export_onnx(prepared, (X,), tmp_path / "m.onnx", exporter="torchscript")
    full = onnx.load(str(out.path))
    skeleton = onnx.load(str(out.path), load_external_data=False)
    want = run(session(out.path), [X])[0]
    np.testing.assert_array_equal(run(session(full), [X])[0], want)  # via a temporary file
    np.testing.assert_array_equal(run(session(skeleton, base_dir=tmp_path), [X])[0], want)
    with pytest.raises(ValueError, match=r"external-data file; pass the ONNX file's path"):
        session(skeleton)


def test_a_proto_protobuf_cannot_size_counts_as_too_large() -> None:
    from google.protobuf.message import EncodeError

    class Huge:  # upb's ByteSize serializes, and fails past 2 GiB (regnet_y_128gf's 2.6 GB)
        def ByteSize(self) -> int:
            raise EncodeError("Failed to serialize proto")

    assert external.too_large(Huge())
    from qdq.lint.load import _too_large

    assert _too_large(Huge())  # the linter's check is the same helper (qdq._io.proto_byte_size)


def test_quantize_writes_and_measures_a_model_with_external_data(tmp_path, monkeypatch) -> None:
    from qdq.pipeline import PtqOptions, quantize

    _make_large(monkeypatch)
    (tmp_path / "net.py").write_text(
        "import torch\nfrom torch import nn\n\n\ndef build():\n    torch.manual_seed(0)\n"
        "    return nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Conv2d(16, 32, 3),\n"
        "                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).eval()\n"
    )
    x = torch.randn(16, 3, 12, 12, generator=torch.Generator().manual_seed(0)).numpy()
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out"
    res = quantize(
        f"{tmp_path / 'net.py'}:build", str(tmp_path / "x.npy"), out=out, exporter="torchscript",
        show_progress=False, ptq=PtqOptions(),
    )  # fmt: skip
    files = _files(out)
    assert {"model.qdq.onnx", "model.qdq.onnx.data", "manifest.json", "report.json"} <= set(files)
    assert not [f for f in files if f.startswith(".")]  # no staging left
    report = json.loads((out / "report.json").read_text())
    assert report["lint"] is not None
    assert res.report["int8_metric"] is not None


def test_verification_frees_the_ort_session_before_the_float64_copy(
    prepared, tmp_path, monkeypatch
) -> None:
    """regnet_y_128gf (2.6 GB) was killed for memory: ORT's weights and the float64 copy of the
    model that arbitrates a rounding cascade were held at once."""
    import contextlib
    import gc
    import weakref

    import qdq.backends.onnxruntime as ortb
    import qdq.export.verify as verify

    sessions: list[Any] = []
    real_session, real_against = ortb.session, verify._against_float64

    def tracked(*args: Any, **kwargs: Any) -> Any:
        sess = real_session(*args, **kwargs)
        sessions.append(weakref.ref(sess))
        return sess

    freed: list[bool] = []

    def against(*args: Any) -> Any:
        gc.collect()
        freed.append(sessions[-1]() is None)
        return real_against(*args)

    monkeypatch.setattr(ortb, "session", tracked)
    monkeypatch.setattr(verify, "_against_float64", against)
    monkeypatch.setattr(verify, "FLOOR_FP32", -1.0)  # every output goes to the float64 arbiter
    with contextlib.suppress(ExportError):
        qdq.export_onnx(prepared, (X,), tmp_path / "m.onnx", exporter="torchscript", verify=True)
    assert freed == [True]


def test_torchscript_exporter_gets_a_str_path(prepared, tmp_path, monkeypatch) -> None:
    """torch's TorchScript exporter writes external data past 2 GB only when the file is a
    ``str`` (a ``Path`` made regnet_y_128gf fail: 'the output file must be a file path')."""
    real = torch.onnx.export
    seen: list[type] = []

    def export(model: Any, args: Any, f: Any = None, **kwargs: Any) -> Any:
        seen.append(type(f))
        return real(model, args, f, **kwargs)

    monkeypatch.setattr(torch.onnx, "export", export)
    qdq.export_onnx(prepared, (X,), tmp_path / "m.onnx", exporter="torchscript", verify=False)
    assert seen == [str]
