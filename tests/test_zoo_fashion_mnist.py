"""qdq.zoo.fashion_mnist: IDX parsing, data splits, the pretrained model and fx traceability."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.fx

from qdq.zoo import fashion_mnist as fm

_HAVE_DATA = all(
    (fm.data_dir() / f"{stem}.gz").is_file() or (fm.data_dir() / stem).is_file()
    for pair in fm._SPLIT_FILES.values()
    for stem in pair
)
needs_data = pytest.mark.skipif(
    not _HAVE_DATA, reason=f"Fashion-MNIST not found in {fm.data_dir()}; run `make data`"
)


def _idx_bytes(array: np.ndarray, type_code: int = 0x08) -> bytes:
    header = struct.pack(">BBBB", 0, 0, type_code, array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.tobytes()


def _write_split(root: Path, split: str, images: np.ndarray, labels: np.ndarray) -> None:
    images_stem, labels_stem = fm._SPLIT_FILES[split]
    (root / f"{images_stem}.gz").write_bytes(gzip.compress(_idx_bytes(images)))
    (root / f"{labels_stem}.gz").write_bytes(gzip.compress(_idx_bytes(labels)))


# --------------------------------------------------------------------------------------------
# IDX parser
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compress", [False, True])
def test_read_idx_roundtrip(tmp_path: Path, compress: bool) -> None:
    data = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    raw = _idx_bytes(data)
    path = tmp_path / "tiny-idx3-ubyte"
    path.write_bytes(gzip.compress(raw) if compress else raw)
    out = fm.read_idx(path, expect_ndim=3)
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out, data)


def test_read_idx_big_endian_types(tmp_path: Path) -> None:
    data = np.array([[1, -2], [300, 70000]], dtype=">i4")
    path = tmp_path / "ints.idx"
    path.write_bytes(_idx_bytes(data, type_code=0x0C))
    out = fm.read_idx(path)
    assert out.dtype == np.dtype(np.int32)
    np.testing.assert_array_equal(out, data.astype(np.int32))


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"\x00\x00", "too short"),
        (b"\x01\x00\x08\x01" + struct.pack(">I", 1) + b"\x00", "magic"),
        (b"\x00\x00\x07\x01" + struct.pack(">I", 1) + b"\x00", "element type"),
        (b"\x00\x00\x08\x03" + struct.pack(">I", 2), "truncated IDX header"),
        (b"\x00\x00\x08\x01" + struct.pack(">I", 5) + b"\x00\x01", "declares shape"),
        (b"\x00\x00\x08\x01" + struct.pack(">I", 1) + b"\x00\x01", "declares shape"),
    ],
)
def test_read_idx_malformed_names_file(tmp_path: Path, raw: bytes, match: str) -> None:
    path = tmp_path / "broken-idx1-ubyte"
    path.write_bytes(raw)
    with pytest.raises(ValueError, match=match) as info:
        fm.read_idx(path)
    assert str(path) in str(info.value)


def test_read_idx_wrong_ndim(tmp_path: Path) -> None:
    path = tmp_path / "labels"
    path.write_bytes(_idx_bytes(np.zeros(3, dtype=np.uint8)))
    with pytest.raises(ValueError, match="expected an IDX file of 3 dimensions"):
        fm.read_idx(path, expect_ndim=3)


def test_read_idx_corrupt_gzip(tmp_path: Path) -> None:
    path = tmp_path / "bad.gz"
    path.write_bytes(gzip.compress(_idx_bytes(np.zeros(8, dtype=np.uint8)))[:-6])
    with pytest.raises(ValueError, match="gzip") as info:
        fm.read_idx(path)
    assert str(path) in str(info.value)


# --------------------------------------------------------------------------------------------
# load_split on synthetic and missing data
# --------------------------------------------------------------------------------------------


def test_load_split_synthetic_normalization(tmp_path: Path) -> None:
    images = np.zeros((3, 28, 28), dtype=np.uint8)
    images[1] = 255
    labels = np.array([0, 9, 4], dtype=np.uint8)
    _write_split(tmp_path, "test", images, labels)
    x, y = fm.load_split("test", root=tmp_path)
    assert x.shape == (3, 1, 28, 28) and x.dtype == torch.float32
    assert y.tolist() == [0, 9, 4] and y.dtype == torch.int64
    torch.testing.assert_close(x[0], torch.full((1, 28, 28), -fm.MEAN / fm.STD))
    torch.testing.assert_close(x[1], torch.full((1, 28, 28), (1 - fm.MEAN) / fm.STD))


def test_load_split_returns_fresh_tensors(tmp_path: Path) -> None:
    _write_split(tmp_path, "test", np.ones((2, 28, 28), np.uint8), np.zeros(2, np.uint8))
    x, _ = fm.load_split("test", root=tmp_path)
    x.zero_()
    again, _ = fm.load_split("test", root=tmp_path)
    assert bool((again != 0).all())


def test_load_split_count_mismatch(tmp_path: Path) -> None:
    _write_split(tmp_path, "test", np.zeros((3, 28, 28), np.uint8), np.zeros(2, np.uint8))
    with pytest.raises(ValueError, match="3 images but"):
        fm.load_split("test", root=tmp_path)


def test_load_split_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write_split(tmp_path, "train", np.zeros((5, 28, 28), np.uint8), np.arange(5, dtype=np.uint8))
    monkeypatch.setenv(fm.ENV_DIR, str(tmp_path))
    x, y = fm.load_split("train")
    assert x.shape[0] == 5 and y.tolist() == [0, 1, 2, 3, 4]


def test_load_split_missing_dir_says_make_data(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="make data"):
        fm.load_split("test", root=tmp_path / "nowhere")


def test_load_split_missing_dir_via_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(fm.ENV_DIR, str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="make data"):
        fm.load_split("train")


def test_load_split_bad_split() -> None:
    with pytest.raises(ValueError, match="split"):
        fm.load_split("validation")


# --------------------------------------------------------------------------------------------
# Real data
# --------------------------------------------------------------------------------------------


@needs_data
def test_load_split_real_test() -> None:
    x, y = fm.load_split("test")
    assert x.shape == (10_000, 1, 28, 28) and x.dtype == torch.float32
    assert y.shape == (10_000,) and y.dtype == torch.int64
    assert int(y.min()) == 0 and int(y.max()) == len(fm.CLASSES) - 1
    assert torch.bincount(y).tolist() == [1000] * 10
    assert abs(float(x.mean())) < 0.05 and abs(float(x.std()) - 1.0) < 0.05


@needs_data
def test_calibration_batches_deterministic() -> None:
    a = fm.calibration_batches(num_batches=3, batch_size=16, seed=1)
    b = fm.calibration_batches(num_batches=3, batch_size=16, seed=1)
    c = fm.calibration_batches(num_batches=3, batch_size=16, seed=2)
    assert len(a) == 3 and all(t.shape == (16, 1, 28, 28) for t in a)
    assert all(torch.equal(s, t) for s, t in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])


@needs_data
def test_calibration_batches_bad_args() -> None:
    with pytest.raises(ValueError, match="num_batches"):
        fm.calibration_batches(num_batches=0)
    with pytest.raises(ValueError, match="exceeds"):
        fm.calibration_batches(num_batches=1000, batch_size=1000)


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------


def test_model_shape_and_size() -> None:
    model = fm.ResNetish()
    assert sum(p.numel() for p in model.parameters()) == 77_754
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


def test_model_fx_traceable_identical_outputs() -> None:
    torch.manual_seed(0)
    model = fm.ResNetish().eval()
    traced = torch.fx.symbolic_trace(model)
    targets = {node.target for node in traced.graph.nodes if node.op == "call_function"}
    assert torch.flatten in targets
    adds = [n for n in traced.graph.nodes if n.op == "call_function" and "add" in str(n.target)]
    assert len(adds) == 3
    x = torch.randn(4, 1, 28, 28)
    with torch.no_grad():
        assert torch.equal(traced(x), model(x))


def test_evaluate_restores_training_flag() -> None:
    model = fm.ResNetish().train()
    x, y = torch.randn(7, 1, 28, 28), torch.randint(0, 10, (7,))
    acc = fm.evaluate(model, x, y, batch_size=3)
    assert 0.0 <= acc <= 1.0
    assert model.training
    with pytest.raises(ValueError, match="differ in length"):
        fm.evaluate(model, x, y[:3])
    with pytest.raises(ValueError, match="batch_size"):
        fm.evaluate(model, x, y, batch_size=0)


def test_load_pretrained_missing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="train_fashion_mnist"):
        fm.load_pretrained(tmp_path / "absent.pt")


def test_load_pretrained_wrong_state(tmp_path: Path) -> None:
    path = tmp_path / "other.pt"
    torch.save(torch.nn.Linear(2, 2).state_dict(), path)
    with pytest.raises(ValueError, match="not a ResNetish"):
        fm.load_pretrained(path)


def test_pretrained_checkpoint_is_packaged() -> None:
    assert fm.DEFAULT_WEIGHTS.is_file(), "run scripts/train_fashion_mnist.py"


@needs_data
def test_pretrained_accuracy() -> None:
    model = fm.load_pretrained()
    assert not model.training
    x, y = fm.load_split("test")
    acc = fm.evaluate(model, x, y)
    assert acc >= 0.91, f"pretrained accuracy {acc:.4f} < 0.91"
