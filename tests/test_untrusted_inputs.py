"""What ``qdq quantize --model ... --data ...`` loads from files others send (issue 57).

Hostile files are built here, small: a ``.pt2`` whose loading would run code (a pickled weight,
pickled sample inputs, a shape expression or a guard that is Python), ``.npz``/``.npy`` files
holding pickles or declaring more than they hold, decompression bombs, an image header of
12000x12000 pixels, symbolic links and FIFOs in an image folder, ONNX external data outside the
model's folder or larger than its tensor. Each is refused with one line naming the file (the CLI:
exit 2, no traceback) and runs nothing: the payloads would create a marker folder.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import re
import struct
import sys
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from qdq._limits import ENV_MAX_INPUT_BYTES, InputRefusedError
from qdq.cli.main import main
from qdq.pipeline.data import DataOptions, resolve_data
from qdq.pipeline.models import resolve_model
from qdq.specs import load_arrays

X = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


class _Payload:
    """Unpickling it creates the folder ``marker`` (what a hostile pickle would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Callable[..., object], tuple[str]]:
        return (os.mkdir, (self.marker,))


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A normal static-batch ``.pt2`` and one with a dynamic batch, as torch.export.save writes."""
    root = tmp_path_factory.mktemp("pt2")
    torch.manual_seed(0)
    net = _Net().eval()
    torch.export.save(torch.export.export(net, (X,)), root / "static.pt2")
    batch = {"x": {0: torch.export.Dim("batch", min=2)}}
    torch.export.save(torch.export.export(net, (X,), dynamic_shapes=batch), root / "dynamic.pt2")
    torch.save(net.state_dict(), root / "state.pt")
    return {"static": root / "static.pt2", "dynamic": root / "dynamic.pt2", "net": root}


def _rewrite(src: Path, dst: Path, edit: Callable[[str, bytes], bytes | None]) -> Path:
    """A copy of the archive ``src`` with each entry through ``edit`` (``None``: dropped)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = edit(info.filename.split("/", 1)[1], zin.read(info))
            if data is not None:
                zout.writestr(info, data)
    return dst


def _pickled_weight(marker: Path) -> Callable[[str, bytes], bytes | None]:
    def edit(name: str, data: bytes) -> bytes | None:
        if name == "data/weights/model_weights_config.json":
            config = json.loads(data)
            meta = config["config"]["conv.bias"]
            meta["use_pickle"] = True
            edit.entry = meta["path_name"]  # type: ignore[attr-defined]
            return json.dumps(config).encode()
        if name == f"data/weights/{getattr(edit, 'entry', '')}":
            return pickle.dumps(_Payload(marker))
        return data

    return edit


def _pickled_sample_inputs(marker: Path) -> Callable[[str, bytes], bytes | None]:
    def edit(name: str, data: bytes) -> bytes | None:
        if name == "data/sample_inputs/model.pt":
            buffer = io.BytesIO()
            torch.save(((_Payload(marker),), {}), buffer)
            return buffer.getvalue()
        return data

    return edit


def _graph_edit(change: Callable[[dict], None]) -> Callable[[str, bytes], bytes | None]:
    def edit(name: str, data: bytes) -> bytes | None:
        if name == "models/model.json":
            program = json.loads(data)
            change(program)
            return json.dumps(program).encode()
        return data

    return edit


def _python_expr(marker: Path) -> Callable[[str, bytes], bytes | None]:
    code = f"__import__('os').mkdir({str(marker)!r}) or "

    def change(program: dict) -> None:
        stack: list[object] = [program]
        while stack:  # the first symbolic shape expression gets the payload
            item = stack.pop()
            if isinstance(item, dict) and "expr_str" in item:
                item["expr_str"] = code + item["expr_str"]
                return
            stack.extend(
                item.values() if isinstance(item, dict) else item if isinstance(item, list) else []
            )
        raise AssertionError("no shape expression in the program")

    return _graph_edit(change)


def _python_guard(marker: Path) -> Callable[[str, bytes], bytes | None]:
    def change(program: dict) -> None:
        program["guards_code"] = [f"__import__('os').mkdir({str(marker)!r}) or True"]

    return _graph_edit(change)


# ------------------------------------------------------------------------------------- .pt2


EVIL = [
    ("pickled weight", "static", _pickled_weight, "is a pickle"),
    ("pickled sample inputs", "static", _pickled_sample_inputs, "GLOBAL posix.mkdir"),
    ("Python shape expression", "dynamic", _python_expr, "shape expression"),
    ("Python guard", "static", _python_guard, "guard"),
]


@pytest.mark.parametrize(("case", "base", "make", "says"), EVIL, ids=[e[0] for e in EVIL])
def test_a_pt2_that_would_run_code_is_refused_and_runs_nothing(
    saved, tmp_path: Path, case: str, base: str, make: Callable, says: str
) -> None:
    marker = tmp_path / "PAYLOAD_RAN"
    evil = _rewrite(saved[base], tmp_path / "evil.pt2", make(marker))
    with pytest.raises(InputRefusedError) as err:
        resolve_model(str(evil))
    message = str(err.value)
    assert message.startswith(f"{evil}:") and says in message and "--trust-model" in message
    assert "\n" not in message and not marker.exists(), case


def test_the_cli_refuses_an_evil_pt2_in_one_line_exit_2(saved, tmp_path: Path, capsys) -> None:
    marker = tmp_path / "PAYLOAD_RAN"
    evil = _rewrite(saved["static"], tmp_path / "evil.pt2", _pickled_weight(marker))
    np.save(tmp_path / "x.npy", np.zeros((4, 3, 8, 8), np.float32))
    out = tmp_path / "out"
    argv = ["quantize", "--model", str(evil), "--data", str(tmp_path / "x.npy"), "--out", str(out)]
    assert main([*argv, "--recipe", "none", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(f"qdq quantize: error: {evil}: entry data/weights/") and "(conv.bias)" in err
    )
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not marker.exists() and not out.exists()
    for verb in ("debug", "sensitivity"):  # the same loader, the same refusal and opt-in flag
        assert main([verb, "--model", str(evil), "--data", str(tmp_path / "x.npy")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"qdq {verb}: error: {evil}: entry data/weights/"), err
        assert err.count("\n") == 1 and "--trust-model" in err and not marker.exists()


def test_trust_model_loads_as_torch_does(saved, tmp_path: Path) -> None:
    """The opt-in is what switches the checks off: the same file then runs its payload."""
    marker = tmp_path / "PAYLOAD_RAN"
    evil = _rewrite(saved["static"], tmp_path / "evil.pt2", _pickled_sample_inputs(marker))
    with pytest.raises(ValueError, match="cannot read"):  # broken once the payload ran
        resolve_model(str(evil), trust_model=True)
    assert marker.is_dir()
    marker.rmdir()
    np.save(tmp_path / "x.npy", np.zeros((4, 3, 8, 8), np.float32))
    argv = ["quantize", "--model", str(evil), "--data", str(tmp_path / "x.npy"), "--trust-model"]
    assert main([*argv, "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    assert marker.is_dir()  # the CLI flag reaches the loader


def test_aoti_code_and_old_layouts_are_refused(saved, tmp_path: Path) -> None:
    aoti = _rewrite(saved["static"], tmp_path / "aoti.pt2", lambda name, data: data)
    with zipfile.ZipFile(aoti, "a") as zf:
        zf.writestr("static/data/aotinductor/model/model.so", b"\x7fELF")
    with pytest.raises(InputRefusedError, match="AOTInductor compiled code"):
        resolve_model(str(aoti))
    old = _rewrite(
        saved["static"], tmp_path / "old.pt2", lambda n, d: None if n == "archive_format" else d
    )
    with pytest.raises(InputRefusedError, match="no archive_format entry"):
        resolve_model(str(old))


@pytest.mark.parametrize("base", ["static", "dynamic"])
def test_a_normal_pt2_still_loads_unchecked_by_nothing(saved, base: str) -> None:
    source = resolve_model(str(saved[base]))
    torch.manual_seed(0)
    expected = _Net().eval()(X)
    assert source.kind == "pt2" and torch.allclose(source.module(X), expected)
    assert source.static_batch == (2 if base == "static" else None)


SIZE_CODE = [  # (text, a guard?, accepted): what torch writes passes, Python and huge powers not
    ("Mul(Integer(2), Symbol('s77', integer=True, positive=True))", False, True),
    (
        "Add(FloorDiv(Symbol('s0', positive=True), Integer(2)), Float('1.5', precision=53))",
        False,
        True,
    ),
    ("torch.sym_max(1, (-1) + L['x'].size()[1]) <= (L['x'].size()[0] // 2)", True, True),
    ("exec(chr(112) + chr(114))", False, False),
    ("Symbol('s0', positive=__import__('os'))", False, False),
    ("10^10^10", False, False),
    ("Pow(Integer(10), Integer(10000000000))", False, False),
    ("().__class__", False, False),
    ("torch.load('x')", True, False),
    ("L['x'].size()[0] == 'a\"b'", True, False),
    ("2**2**200", True, False),
]


@pytest.mark.parametrize(("text", "guard", "accepted"), SIZE_CODE)
def test_shape_expressions_and_guards_are_plain_size_arithmetic(text, guard, accepted) -> None:
    from qdq.pipeline.model_files import _check_code

    if accepted:
        _check_code(text, "m.pt2", "code", guard=guard)
    else:
        with pytest.raises(InputRefusedError, match="is not plain size arithmetic"):
            _check_code(text, "m.pt2", "code", guard=guard)


# ------------------------------------------------------------------------------ .npy / .npz


def test_pickles_in_array_files_are_one_line_value_errors(tmp_path: Path) -> None:
    marker = tmp_path / "PAYLOAD_RAN"
    with zipfile.ZipFile(tmp_path / "member.npz", "w") as zf:
        zf.writestr("x.npy", pickle.dumps(_Payload(marker)))  # the AttributeError
    (tmp_path / "whole.npz").write_bytes(pickle.dumps(_Payload(marker)))
    np.save(tmp_path / "object.npy", np.array([1, "a"], dtype=object), allow_pickle=True)
    for name in ("member.npz", "whole.npz", "object.npy"):
        with pytest.raises(ValueError) as err:
            load_arrays(tmp_path / name)
        message = str(err.value)
        assert str(tmp_path / name) in message and "pickled/object arrays are refused" in message
        assert "\n" not in message and not marker.exists()


def test_sizes_are_checked_from_the_headers_before_reading(tmp_path: Path, monkeypatch) -> None:
    with open(tmp_path / "lies.npy", "wb") as fh:  # declares 4 TB, holds 16 bytes
        np.lib.format.write_array_header_1_0(
            fh, {"descr": "<f4", "fortran_order": False, "shape": (10**12,)}
        )
        fh.write(bytes(16))
    with pytest.raises(InputRefusedError, match=r"declares an array of shape \(1000000000000,\)"):
        load_arrays(tmp_path / "lies.npy")
    # a bomb: 128 MiB of zeros deflated to ~130 kB (the 1 MB -> 1 GB, smaller)
    bomb = tmp_path / "bomb.npz"
    with (
        zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf,
        zf.open("x.npy", "w", force_zip64=True) as member,
    ):
        np.lib.format.write_array_header_1_0(
            member, {"descr": "<f4", "fortran_order": False, "shape": (2**25,)}
        )
        for _ in range(8):
            member.write(bytes(2**24))
    with pytest.raises(InputRefusedError) as err:
        load_arrays(tmp_path / "bomb.npz")
    assert str(err.value).startswith(f"{tmp_path / 'bomb.npz'}: member 'x.npy' expands from")
    assert "limit of 100x" in str(err.value)
    # the decoded-size limit, lowered by its environment variable
    np.savez(tmp_path / "ok.npz", x=np.zeros((64, 16), np.float32))
    assert load_arrays(tmp_path / "ok.npz")["x"].shape == (64, 16)
    monkeypatch.setenv(ENV_MAX_INPUT_BYTES, "1000")
    with pytest.raises(InputRefusedError, match=f"{ENV_MAX_INPUT_BYTES}=1000"):
        load_arrays(tmp_path / "ok.npz")


def test_the_cli_refuses_a_pickled_npz_in_one_line(saved, tmp_path: Path, capsys) -> None:
    with zipfile.ZipFile(tmp_path / "d.npz", "w") as zf:
        zf.writestr("x.npy", pickle.dumps(_Payload(tmp_path / "PAYLOAD_RAN")))
    argv = ["quantize", "--model", str(saved["static"]), "--data", str(tmp_path / "d.npz")]
    assert main([*argv, "--out", str(tmp_path / "o"), "--recipe", "none", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"qdq quantize: error: {tmp_path / 'd.npz'}[x] is not an .npy array")
    assert err.count("\n") == 1 and not (tmp_path / "PAYLOAD_RAN").exists()


# ---------------------------------------------------------------------------- image folders


def _png_header(path: Path, width: int, height: int) -> None:
    """A PNG that declares ``width`` x ``height`` (IHDR) and holds one empty data chunk."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"")
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
    )


def _images(folder: Path, n: int = 3) -> Path:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.fromarray(np.full((10, 12, 3), 40 * i, np.uint8)).save(folder / f"{i}.png")
    return folder


OPTS = DataOptions(image_size=8)


def test_a_huge_image_is_refused_from_its_header(tmp_path: Path) -> None:
    folder = _images(tmp_path / "imgs")
    _png_header(folder / "bomb.png", 12000, 12000)  # 144 Mpixel: PIL itself only warns
    with pytest.raises(InputRefusedError) as err:
        resolve_data(str(folder), options=OPTS)
    assert str(err.value).startswith(f"image {folder / 'bomb.png'} is 12000x12000 pixels")
    assert "8192x8192" in str(err.value)
    (folder / "bomb.png").unlink()
    # many images: their decoded size is checked before any is decoded
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENV_MAX_INPUT_BYTES, "1000")
        with pytest.raises(InputRefusedError, match="3 images of 3x8x8 float32 would take 2.3 kB"):
            resolve_data(str(folder), options=OPTS)


def test_links_out_of_the_folder_are_refused_fifos_skipped(tmp_path: Path) -> None:
    folder = _images(tmp_path / "imgs")
    outside = _images(tmp_path / "elsewhere", 1) / "0.png"
    os.mkfifo(folder / "pipe.png")  # never opened (opening it would block)
    (folder / "inside.png").symlink_to(folder / "0.png")  # a link inside the folder is read
    assert resolve_data(str(folder), options=OPTS).split.startswith("4 samples")
    (folder / "link.png").symlink_to(outside)
    with pytest.raises(ValueError) as err:
        resolve_data(str(folder), options=OPTS)
    assert f"{folder / 'link.png'} is a symbolic link to {outside}, outside the folder" in str(
        err.value
    )


def test_only_image_formats_are_decoded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from PIL import EpsImagePlugin

    opened: list[object] = []

    def eps_open(image: object) -> None:
        opened.append(image)
        raise SyntaxError("not EPS")

    monkeypatch.setattr(EpsImagePlugin.EpsImageFile, "_open", eps_open)
    folder = _images(tmp_path / "imgs")
    # Pillow picks its plugin by content: an EPS named .png would go to Ghostscript
    (folder / "ps.png").write_bytes(b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 8 8\nshowpage\n")
    # refused whatever Pillow says then ("cannot identify", or a plugin another package registered
    # failing: ultralytics' HEIF opener without pi_heif, once ultralytics is imported)
    with pytest.raises(ValueError, match=re.escape(f"cannot read image {folder / 'ps.png'}: ")):
        resolve_data(str(folder), options=OPTS)
    assert not opened  # the EPS plugin never saw the file


# -------------------------------------------------------------------------------------- ONNX


def _onnx(path: Path, location: str, length: int | None = None) -> Path:
    import onnx
    from onnx import TensorProto, helper

    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4])
    w.data_location = TensorProto.EXTERNAL
    entries = {"location": location} | ({} if length is None else {"length": str(length)})
    for key, value in entries.items():
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [x], [y], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_onnx_external_data_is_confined_and_sized_before_reading(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    pytest.importorskip("onnx2torch")
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "secret.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    (folder / "w.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    with open(folder / "sparse.bin", "wb") as fh:
        fh.truncate(1 << 30)  # 1 GiB on a sparse file: the 16-byte tensor would read it all
    good = resolve_model(str(_onnx(folder / "good.onnx", "w.bin")))
    assert good.kind == "onnx" and sorted(os.listdir(folder)) == [
        "good.onnx",
        "sparse.bin",
        "w.bin",
    ]
    for name, location, says in [
        ("up.onnx", "../secret.bin", "not a relative path inside the model's folder"),
        ("abs.onnx", str(tmp_path / "secret.bin"), "not a relative path inside the model's folder"),
        (
            "sparse.onnx",
            "sparse.bin",
            "in 'sparse.bin' holds 1073741824 bytes from offset 0 to the end of the file",
        ),
    ]:
        with pytest.raises(InputRefusedError) as err:
            resolve_model(str(_onnx(folder / name, location)))
        assert str(err.value).startswith(f"{folder / name}: tensor 'w'") and says in str(err.value)


# ------------------------------------------------------------------------------------ fuzzing


def _mutants(data: bytes, count: int, seed: int) -> list[bytes]:
    """``count`` copies of ``data`` with a few bytes changed, a piece cut or truncated (seeded)."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        b = bytearray(data)
        if i % 3 == 0:
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(len(b))] = rng.randrange(256)
        elif i % 3 == 1:
            start = rng.randrange(len(b))
            del b[start : start + rng.randint(1, 64)]
        else:
            del b[rng.randrange(1, len(b)) :]
        out.append(bytes(b))
    return out


def test_fuzzed_files_give_a_value_error_or_load(saved, tmp_path: Path) -> None:
    """Corrupted files: each read either succeeds or raises a ValueError (one line), never
    another exception, a hang or a crash."""
    from PIL import Image

    buffer = io.BytesIO()
    np.savez_compressed(buffer, x=np.arange(96, dtype=np.float32).reshape(4, 24), y=np.arange(4))
    npz = buffer.getvalue()
    buffer = io.BytesIO()
    np.save(buffer, np.ones((3, 5), np.float32))
    npy = buffer.getvalue()
    buffer = io.BytesIO()
    Image.fromarray(np.arange(300, dtype=np.uint8).reshape(10, 10, 3)).save(buffer, "PNG")
    png = buffer.getvalue()
    readers: list[tuple[str, bytes, Callable[[Path], object], int]] = [
        ("d.npz", npz, load_arrays, 60),
        ("d.npy", npy, load_arrays, 40),
        ("m.pt2", saved["static"].read_bytes(), lambda p: resolve_model(str(p)), 30),
    ]
    _images(tmp_path / "imgs", 2)
    readers.append(("imgs/a.png", png, lambda p: resolve_data(str(p.parent), options=OPTS), 40))
    for name, data, read, count in readers:
        for i, mutant in enumerate(_mutants(data, count, seed=len(name))):
            path = tmp_path / name
            path.write_bytes(mutant)
            try:
                read(path)
            except ValueError as err:
                assert "\n" not in str(err).strip(), (name, i, str(err))
            except Exception as err:  # pragma: no cover - the failure this test looks for
                pytest.fail(f"{name} mutant {i}: {type(err).__name__}: {err}")


if sys.platform == "win32":  # pragma: no cover
    pytestmark = pytest.mark.skip("FIFOs and symbolic links")
