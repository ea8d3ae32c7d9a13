"""``qdq parity`` end to end, and the model/data specs it reads."""

from __future__ import annotations

import json
import textwrap
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

import qdq
from qdq.cli.main import main
from qdq.export.manifest import manifest_path_for
from qdq.specs import load_data_spec, load_model_spec

MODEL_PY = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
            self.conv2 = nn.Conv2d(16, 16, 3, groups=16, padding=1)
            self.fc = nn.Linear(16, 32)

        def forward(self, x):
            y = F.relu6(self.conv1(x))
            y = F.relu6(self.conv2(y)) + y
            return self.fc(y.mean((2, 3)))


    def build():
        torch.manual_seed(0)
        return Net()


    def broken():
        raise RuntimeError("factory exploded\\nsecond line")


    NOT_A_MODEL = 3
    """
)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("parity")
    py = root / "tiny_model.py"
    py.write_text(MODEL_PY)
    model = load_model_spec(f"{py}:build")
    gen = torch.Generator().manual_seed(0)
    data = torch.randn(24, 3, 8, 8, generator=gen)
    np.save(root / "data.npy", data.numpy())
    prepared = qdq.prepare(model, (data[:1],))
    qdq.calibrate(prepared, [data[:8], data[8:16]], show_progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = qdq.export_onnx(prepared, (data[:1],), root / "tiny.qdq.onnx")
    assert out.manifest_path == root / "tiny.qdq.onnx.manifest.json"
    return {"onnx": str(out.path), "model": f"{py}:build", "data": str(root / "data.npy")}


def _args(e: dict[str, str], *extra: str) -> list[str]:
    return ["parity", e["onnx"], "--model", e["model"], "--data", e["data"], *extra]


def test_parity_passes(exported, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_args(exported, "--batch-size", "8")) == 0
    out = capsys.readouterr().out
    assert "top-1 agreement     100.00%" in out and "verdict: PASS" in out
    assert "conv1.input_quantizer" in out and "first unexplained   -" in out


def test_parity_json(exported, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_args(exported, "--json")) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["passed"] and doc["failures"] == [] and doc["batches"] == 1
    assert doc["top1_agreement"] == 1.0 and doc["first_unexplained"] is None
    first = next(iter(doc["layers"]))
    assert first == "conv1.input_quantizer"  # execution order
    assert doc["layers"][first]["code_mismatch_rate"] == 0.0
    assert doc["manifest"].endswith("tiny.qdq.onnx.manifest.json")


def test_parity_fails_past_threshold(exported, tmp_path: Path, capsys) -> None:
    model = onnx.load(exported["onnx"])
    for init in model.graph.initializer:
        if init.name.startswith("conv2") and init.name.endswith("weight"):
            w = onnx.numpy_helper.to_array(init)
            init.CopyFrom(onnx.numpy_helper.from_array(-w, init.name))
    bad = tmp_path / "bad.onnx"
    onnx.save(model, str(bad))
    manifest = manifest_path_for(exported["onnx"])
    manifest_path_for(bad).write_text(manifest.read_text())
    args = ["parity", str(bad), "--model", exported["model"], "--data", exported["data"]]
    assert main(args) == 2  # the manifest describes another file: refused before anything runs
    err = capsys.readouterr().err
    assert "bad.onnx.manifest.json records no ONNX hash" not in err
    assert "does not describe" in err and "--ignore-hash" in err and len(err.splitlines()) == 1
    args.append("--ignore-hash")
    assert main([*args, "--json"]) == 1
    captured = capsys.readouterr()
    assert "does not describe" in captured.err and "comparing them anyway" in captured.err
    doc = json.loads(captured.out)
    assert not doc["passed"]
    # conv2's own input already differs by rounding-boundary flips of conv1 (explained); the
    # negated conv2 weights first show in what conv2 feeds: the residual sum's quantizer
    assert doc["first_unexplained"] == "mean_input_quantizer"
    assert doc["layers"]["conv2.input_quantizer"]["unexplained_codes"] == 0
    assert any("beyond float rounding" in f for f in doc["failures"])
    assert main([*args, "--threshold", "1"]) == 1  # unexplained codes fail at any threshold
    assert "verdict: FAIL" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model": "no_such_file.py:build"}, "no model file at no_such_file.py"),
        ({"model": "nocolon"}, "must be 'pkg.module:factory'"),
        ({"model": "{py}:missing"}, "has no attribute 'missing'"),
        ({"model": "{py}:NOT_A_MODEL"}, "is not callable"),
        ({"model": "{py}:broken"}, "RuntimeError: factory exploded second line"),
        ({"data": "data.csv"}, "must be a .npy or .npz file"),
        ({"onnx": "missing.onnx"}, "no ONNX file at missing.onnx"),
    ],
)
def test_parity_errors_are_one_line(exported, capsys, change: dict[str, str], message: str) -> None:
    py = exported["model"].rpartition(":")[0]
    e = {**exported, **{k: v.format(py=py) for k, v in change.items()}}
    assert main(_args(e)) == 2
    err = capsys.readouterr().err
    assert err.startswith("qdq parity: error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_parity_needs_the_manifest(exported, tmp_path: Path, capsys) -> None:
    lone = tmp_path / "lone.onnx"
    lone.write_bytes(Path(exported["onnx"]).read_bytes())
    assert main(_args({**exported, "onnx": str(lone)})) == 2
    err = capsys.readouterr().err
    assert "no manifest for" in err and "lone.onnx.manifest.json" in err and "manifest.json" in err


def test_parity_help_warns_about_user_code(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["parity", "--help"])
    assert "executes" in capsys.readouterr().out


def test_specs(tmp_path: Path) -> None:
    assert isinstance(load_model_spec("torch.nn:Identity"), torch.nn.Identity)
    with pytest.raises(ValueError, match="cannot import"):
        load_model_spec("no_such_pkg_xyz:build")
    np.savez(tmp_path / "d.npz", a=np.ones((3, 2)), b=np.zeros((2, 2), dtype=np.int64))
    batches = load_data_spec(tmp_path / "d.npz", batch_size=2)
    assert [tuple(b.shape) for b in batches] == [(2, 2), (1, 2), (2, 2)]
    assert batches[0].dtype == torch.float32 and batches[2].dtype == torch.int64
    np.save(tmp_path / "s.npy", np.float32(1.0))
    with pytest.raises(ValueError, match="samples along axis 0"):
        load_data_spec(tmp_path / "s.npy")
    with pytest.raises(ValueError, match="batch_size"):
        load_data_spec(tmp_path / "d.npz", batch_size=0)
