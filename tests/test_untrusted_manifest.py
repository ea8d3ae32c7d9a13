"""Issue 57: a manifest from someone else is untrusted input.

``qdq parity`` and :func:`qdq.load_calibration` read only files inside the manifest's folder,
read nothing unbounded (size and JSON depth checked first, files hashed in chunks), refuse an ONNX
that is not the file the manifest was written with before any user code runs, and report every
malformed value as one line naming the manifest and the key. The fuzz test mutates a real
manifest a few hundred times: each case loads or raises the documented ``ValueError`` /
``FileNotFoundError``, never another exception.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import random
import shutil
import textwrap
import tracemalloc
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import qdq
from qdq.cli.main import main
from qdq.export.manifest import OnnxMismatchError, check_onnx, config_of, find_manifest
from qdq.export.manifest_io import (
    MAX_DEPTH,
    MAX_MANIFEST_BYTES,
    MAX_ONNX_BYTES,
    hash_file,
    read_manifest,
)
from qdq.lint.untrusted_json import json_depth
from qdq.specs import load_model_spec

pytest.importorskip("onnxruntime")

MODEL_PY = textwrap.dedent(
    """
    from pathlib import Path

    import torch
    from torch import nn


    def build():
        Path(__file__).with_name("ran.txt").write_text("the model spec ran")
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 10))
    """
)
SECRET = b"root:x:0:0:root:/root:/bin/bash\n"  # stands for /etc/passwd: a file outside the folder


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a tiny export: m.onnx, m.onnx.manifest.json, model.py, data.npy."""
    root = tmp_path_factory.mktemp("export")
    (root / "model.py").write_text(MODEL_PY)
    x = torch.randn(8, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    np.save(root / "data.npy", x.numpy())
    prepared = qdq.prepare(load_model_spec(f"{root / 'model.py'}:build"), (x[:1],))
    qdq.calibrate(prepared, [x], show_progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qdq.export_onnx(prepared, (x[:1],), root / "m.onnx")
    (root / "ran.txt").unlink()
    return root


@pytest.fixture
def pair(export: Path, tmp_path: Path) -> Path:
    """A private copy of the export (tests edit it), inside ``tmp_path/out``; a secret file lies
    beside ``out``, outside it."""
    out = tmp_path / "out"
    shutil.copytree(export, out)
    (tmp_path / "secret.txt").write_bytes(SECRET)
    return out


def _manifest(out: Path) -> Path:
    return out / "m.onnx.manifest.json"


def _edit(out: Path, change: Any) -> Path:
    p = _manifest(out)
    doc = json.loads(p.read_text())
    change(doc)
    p.write_text(json.dumps(doc))
    return p


def _parity(out: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    args = ["parity", str(out / "m.onnx"), "--model", f"{out / 'model.py'}:build"]
    code = main([*args, "--data", str(out / "data.npy"), "--no-reference", *extra])
    return code, capsys.readouterr().err


def _one_line_error(err: str) -> str:
    assert err.startswith("qdq parity: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


def _ensure(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)


# ---------------------------------------------------------------- paths confined to the folder


@pytest.mark.parametrize(
    ("key", "name", "why"),
    [
        ("onnx.file", "../secret.txt", "a '..' part"),
        ("onnx.file", "../../../../etc/passwd", "a '..' part"),
        ("onnx.file", "/etc/passwd", "an absolute path"),
        ("onnx.file", "link.onnx", "a symbolic link leading out"),
        ("onnx.external_data.file", "../secret.txt", "a '..' part"),
        ("onnx.external_data.file", "link.onnx", "a symbolic link leading out"),
    ],
)
def test_parity_refuses_a_file_named_outside_the_folder(
    pair: Path, capsys, key: str, name: str, why: str
) -> None:
    (pair / "link.onnx").symlink_to(pair.parent / "secret.txt")

    def change(doc: dict[str, Any]) -> None:
        if key == "onnx.file":
            doc["onnx"]["file"] = name
        else:
            doc["onnx"]["external_data"] = {"file": name, "sha256": "0" * 64}

    _edit(pair, change)
    code, err = _parity(pair, capsys)
    assert code == 2
    _one_line_error(err)
    assert f"m.onnx.manifest.json: '{key}' names '{name}'" in err and f"({why})" in err
    assert hashlib.sha256(SECRET).hexdigest()[:12] not in err  # the secret was never hashed
    assert not (pair / "ran.txt").exists()  # refused before the model spec's code ran


def test_load_calibration_refuses_paths_outside_without_opening_them(pair: Path) -> None:
    prepared = qdq.prepare(
        load_model_spec(f"{pair / 'model.py'}:build"), (torch.randn(1, 3, 8, 8),)
    )
    for name in ("../secret.txt", "/etc/passwd", "sub/../../secret.txt", "a\x00b", "C:\\x"):
        p = _edit(pair, lambda d, n=name: d["onnx"].update(file=n))
        with pytest.raises(
            ValueError, match=r"'onnx\.file' names .* outside the manifest's folder"
        ):
            qdq.load_calibration(prepared, p)
    _edit(pair, lambda d: d["onnx"].update(file="\x1b]0;title\x07.onnx"))  # stays inside: unread
    qdq.load_calibration(prepared, _manifest(pair))  # a missing file beside it is not checked


def test_a_manifest_that_is_a_symlink_leading_out_is_refused(pair: Path) -> None:
    outside = pair.parent / "elsewhere.json"
    shutil.move(_manifest(pair), outside)
    _manifest(pair).symlink_to(outside)
    with pytest.raises(ValueError, match="symbolic link leading out of"):
        find_manifest(pair / "m.onnx")


# ---------------------------------------------------------------- bounded reads


def test_an_onnx_file_past_two_gib_is_refused_before_it_is_read(pair: Path) -> None:
    big = pair / "big.onnx"
    with open(big, "wb") as fh:  # sparse: no disk space, no time
        fh.truncate(MAX_ONNX_BYTES + 1)
    p = _edit(pair, lambda d: d["onnx"].update(file="big.onnx"))
    prepared = qdq.prepare(
        load_model_spec(f"{pair / 'model.py'}:build"), (torch.randn(1, 3, 8, 8),)
    )
    with pytest.raises(ValueError, match=r"big\.onnx is 2,147,483,648 bytes, more than .* refused"):
        qdq.load_calibration(prepared, p)


def test_a_manifest_past_the_size_bound_is_refused_before_it_is_read(tmp_path: Path) -> None:
    p = tmp_path / "m.onnx.manifest.json"
    with open(p, "wb") as fh:
        fh.truncate(MAX_MANIFEST_BYTES + 1)
    with pytest.raises(ValueError, match=r"m\.onnx\.manifest\.json is 268,435,457 bytes, more"):
        read_manifest(p)


def test_files_are_hashed_in_chunks(tmp_path: Path) -> None:
    data = tmp_path / "m.onnx.data"
    with open(data, "wb") as fh:
        fh.truncate(64 * 2**20)
    tracemalloc.start()
    try:
        digest = hash_file(data, limit=None, manifest=tmp_path / "m.json", key="k")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert digest == hashlib.sha256(bytes(64 * 2**20)).hexdigest()
    assert peak < 8 * 2**20  # 1 MiB chunks, not the 64 MiB file


def test_a_fifo_is_not_read(pair: Path) -> None:
    os.mkfifo(pair / "pipe")
    with pytest.raises(ValueError, match="not a regular file"):
        hash_file(pair / "pipe", limit=None, manifest=_manifest(pair), key="onnx.file")
    _edit(pair, lambda d: d["onnx"].update(external_data={"file": "pipe", "sha256": "0" * 64}))
    with pytest.raises(FileNotFoundError, match="keeps its weights in .*pipe, which is missing"):
        check_onnx(_manifest(pair))


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 100_000])
def test_deeply_nested_json_is_refused_before_parsing(pair: Path, capsys, depth: int) -> None:
    p = _manifest(pair)
    text = p.read_text().rstrip().rstrip("}")
    p.write_text(f'{text}, "qat": {"[" * depth}{"]" * depth}}}')
    code, err = _parity(pair, capsys)
    assert code == 2
    assert f"nests deeper than {MAX_DEPTH} levels ({depth + 1} found)" in _one_line_error(err)


def test_json_depth_ignores_brackets_in_strings() -> None:
    assert json_depth('{"a": "[[[{{", "b": ["\\"]]]", {"c": []}]}') == 4
    assert json_depth("[]" * 100_000) == 1
    assert json_depth('"[[["') == 0


# ---------------------------------------------------------------- the ONNX is the manifest's


@pytest.mark.parametrize("named", ["decoy.onnx", "missing.onnx", "m.onnx"])
def test_parity_refuses_an_onnx_the_manifest_does_not_describe(
    pair: Path, capsys, named: str
) -> None:
    shutil.copy(pair / "m.onnx", pair / "decoy.onnx")  # the original, as a decoy
    with open(pair / "m.onnx", "ab") as fh:
        fh.write(b"\x00")  # tampered
    _edit(pair, lambda d: d["onnx"].update(file=named))
    code, err = _parity(pair, capsys)
    assert code == 2
    _one_line_error(err)
    assert "does not describe" in err and "m.onnx" in err and "--ignore-hash" in err
    assert not (pair / "ran.txt").exists()


def test_a_manifest_without_a_hash_is_refused_by_parity(pair: Path, capsys) -> None:
    _edit(pair, lambda d: d.pop("onnx"))
    code, err = _parity(pair, capsys)
    assert code == 2 and "records no ONNX hash" in _one_line_error(err)
    with pytest.raises(OnnxMismatchError):
        check_onnx(_manifest(pair), pair / "m.onnx")


def test_ignore_hash_compares_anyway_with_a_note(pair: Path, capsys) -> None:
    _edit(pair, lambda d: d["onnx"].update(sha256="0" * 64))
    code, err = _parity(pair, capsys, "--ignore-hash")
    assert code == 0, err
    assert "qdq parity: note:" in err and "does not describe" in err and "anyway" in err
    capsys.readouterr()
    # --ignore-hash does not let a manifest name files outside its folder
    _edit(pair, lambda d: d["onnx"].update(file="../secret.txt"))
    code, err = _parity(pair, capsys, "--ignore-hash")
    assert code == 2 and "outside the manifest's folder" in _one_line_error(err)


def test_parity_errors_never_print_control_characters_raw(pair: Path, capsys) -> None:
    import onnx

    model = onnx.load(str(pair / "m.onnx"))
    model.graph.node[-1].input[0] = "missing\x1b]0;pwned\x07\x1b[2J"  # ORT's error quotes it
    onnx.save(model, str(pair / "m.onnx"))
    digest = hashlib.sha256((pair / "m.onnx").read_bytes()).hexdigest()
    _edit(pair, lambda d: d["onnx"].update(sha256=digest))  # a consistent pair, from someone else
    code, err = _parity(pair, capsys)
    assert code == 2
    assert "\x1b" not in _one_line_error(err) and "\x07" not in err
    assert "missing\\x1b]0;pwned\\x07\\x1b[2J" in err


def test_parity_of_a_graph_with_a_quantize_node_without_outputs(pair: Path, capsys) -> None:
    import onnx

    model = onnx.load(str(pair / "m.onnx"))
    node = next(n for n in model.graph.node if n.op_type == "QuantizeLinear")
    del node.output[:]  # was an IndexError in parity's graph edit
    onnx.save(model, str(pair / "m.onnx"))
    digest = hashlib.sha256((pair / "m.onnx").read_bytes()).hexdigest()
    _edit(pair, lambda d: d["onnx"].update(sha256=digest))
    code, err = _parity(pair, capsys)
    assert code == 2 and "IndexError" not in _one_line_error(err), err


# ---------------------------------------------------------------- values: one line, naming the key


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["quantizers"][0].update(format=3), r"quantizers\[0\]\.format must be one of"),
        (lambda d: d["quantizers"][1].update(kind=["w"]), r"quantizers\[1\]\.kind must be"),
        (lambda d: d["quantizers"][1].update(name=None), r"quantizers\[1\]\.name must be"),
        (lambda d: d["quantizers"][1].update(axis="0"), r"quantizers\[1\]\.axis must be"),
        (lambda d: d["quantizers"][1].update(axis=True), r"quantizers\[1\]\.axis must be"),
        (lambda d: d["quantizers"].append(7), r"quantizers\[\d\] must be an object"),
    ],
)
def test_config_of_names_the_bad_key(pair: Path, change: Any, message: str) -> None:
    p = _edit(pair, change)
    with pytest.raises(ValueError, match=message) as info:
        config_of(p)
    assert "m.onnx.manifest.json" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (10**400, "an integer of 401 digits"),  # refused as it is parsed
        (1e300, "'0.input_quantizer': amax has .*values past float32's range"),
        (math.nan, "'0.input_quantizer': amax has .*non-finite"),
        (-0.5, "'0.input_quantizer': amax has .*negative"),
    ],
)
def test_amax_out_of_range_is_a_value_error(pair: Path, value: float, message: str) -> None:
    p = _edit(pair, lambda d: d["quantizers"][0].update(amax=value))
    prepared = qdq.prepare(
        load_model_spec(f"{pair / 'model.py'}:build"), (torch.randn(1, 3, 8, 8),)
    )
    with pytest.raises(ValueError, match=message):
        qdq.load_calibration(prepared, p)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"method": 3}, "'method' must be a method name"),
        ({"method": "\x1b[2J"}, "'method' must be a method name"),
        ({"method": "percentile", "percentile": 10**400}, r"an integer of 401 digits"),
        ({"method": "percentile", "percentile": math.nan}, r"'percentile' must be a number in"),
    ],
)
def test_method_records_are_checked(pair: Path, entry: dict[str, Any], message: str) -> None:
    p = _edit(pair, lambda d: d["quantizers"][0].update(entry))
    prepared = qdq.prepare(
        load_model_spec(f"{pair / 'model.py'}:build"), (torch.randn(1, 3, 8, 8),)
    )
    with pytest.raises(ValueError, match=message):
        qdq.load_calibration(prepared, p)


# ---------------------------------------------------------------- fuzz


_HOSTILE: list[Any] = [
    None, True, False, 0, -1, 10**400, 1e308, -1e308, math.nan, math.inf, -math.inf, 0.5, "",
    "x" * 10_000, "../../../../etc/passwd", "/etc/passwd", "..", ".", "a/../../b", "\x1b]0;pwn\x07",
    "\x00", "C:\\Windows", [], {}, [1.0] * 3, ["a"], {"file": "../x", "sha256": "0" * 64},
    {"file": "m.onnx", "sha256": "f" * 64}, "0" * 64,
]  # fmt: skip


_NUMBERS: list[Any] = [10**400, -(10**400), 2**63, 1e308, 1e-320, -0.0, math.nan, math.inf, -1]
#: the keys a reader acts on: most mutations land on one of them
_KEYS = frozenset(
    {"amax", "axis", "channels", "name", "path", "method", "percentile", "format", "kind",
     "learned", "onnx", "file", "sha256", "external_data", "quantizers", "schema", "rounding",
     "bias_correction"}
)  # fmt: skip
_DEEP = "@@deep@@"  # replaced in the text by arrays nested past any recursion limit


def _nodes(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into ``doc`` (keys and indices), the root excluded."""
    out = []
    items = (
        doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    )
    for k, v in items:
        out.append((*path, k))
        out.extend(_nodes(v, (*path, k)))
    return out


def _nest(depth: int) -> Any:
    value: Any = 1.0
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def _mutate(doc: dict[str, Any], rng: random.Random) -> str:
    doc = copy.deepcopy(doc)
    for _ in range(rng.randint(1, 3)):
        paths = _nodes(doc)
        focus = [w for w in paths if w[-1] in _KEYS or (len(w) > 1 and w[-2] in _KEYS)]
        where = rng.choice(focus if focus and rng.random() < 0.7 else paths)
        parent = doc
        for k in where[:-1]:
            parent = parent[k]
        key = where[-1]
        how = rng.random()
        if how < 0.25:  # deletion
            del parent[key]
        elif how < 0.6:  # a hostile value; for a number, often an extreme one
            number = isinstance(parent[key], (int, float)) and rng.random() < 0.6
            parent[key] = copy.deepcopy(rng.choice(_NUMBERS if number else _HOSTILE))
        elif how < 0.75:  # a type swap
            v = parent[key]
            swaps = {
                dict: lambda v: list(v.values()),
                list: lambda v: {str(i): x for i, x in enumerate(v)},
                str: lambda v: [v],
                float: lambda v: str(v),
                int: lambda v: float(v) * 1e30,
            }
            parent[key] = swaps.get(type(v), lambda v: {"v": v})(v)
        elif how < 0.85:  # deep nesting, around the bound and past Python's recursion limit
            depth = rng.choice([3, MAX_DEPTH - 4, MAX_DEPTH + 4, 500, 5000])
            parent[key] = _nest(depth) if depth < 1000 else _DEEP
        elif how < 0.92 and isinstance(parent, list):  # duplicated entry
            parent.append(copy.deepcopy(parent[key]))
        else:  # a new key at the top
            doc[rng.choice(["onnx", "quantizers", "schema", "zz"])] = copy.deepcopy(
                rng.choice(_HOSTILE)
            )
        if not doc:
            break
    text = json.dumps(doc).replace(f'"{_DEEP}"', "[" * 5000 + "]" * 5000)
    r = rng.random()
    if r < 0.1:  # raw text damage: truncation, a stray byte
        text = text[: rng.randrange(len(text))]
    elif r < 0.15:
        i = rng.randrange(len(text))
        text = text[:i] + rng.choice(["\udcff", "{", "]", '"', "\\"]) + text[i + 1 :]
    return text


def test_fuzzed_manifests_load_or_raise_the_documented_errors(pair: Path) -> None:
    (pair / "link.onnx").symlink_to(pair.parent / "secret.txt")
    original = json.loads(_manifest(pair).read_text())
    prepared = qdq.prepare(
        load_model_spec(f"{pair / 'model.py'}:build"), (torch.randn(1, 3, 8, 8),)
    )
    rng = random.Random(57)
    p = _manifest(pair)
    shared = pair / "shared"  # the layout qdq quantize writes: OUT/model.qdq.onnx + manifest.json
    shared.mkdir()
    shutil.copy(pair / "m.onnx", shared / "m.onnx")
    outcomes: dict[str, int] = {}
    for case in range(300):
        text = _mutate(original, rng)
        p.write_bytes(text.encode("utf-8", "surrogateescape"))
        (shared / "manifest.json").write_bytes(p.read_bytes())
        for name, call in (
            ("load_calibration", lambda: qdq.load_calibration(prepared, p)),
            ("config_of", lambda: config_of(p)),
            ("check_onnx", lambda: check_onnx(p, pair / "m.onnx")),
            ("find_manifest", lambda: find_manifest(shared / "m.onnx")),
        ):
            try:
                call()
                outcome = "ok"
            except (ValueError, FileNotFoundError) as err:
                message = str(err)
                _ensure("\n" not in message and len(message) < 2000, f"case {case} {name}: {err!r}")
                outcome = type(err).__name__
            except Exception as err:  # any other exception is the bug this test looks for
                raise AssertionError(
                    f"case {case}, {name}: {type(err).__name__}: {err}\n{text[:2000]}"
                ) from err
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert outcomes.get("ok", 0) > 50 and outcomes.get("ValueError", 0) > 100, outcomes
