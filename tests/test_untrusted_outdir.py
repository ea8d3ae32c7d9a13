"""Where ``qdq quantize`` writes (issue 57): ``--overwrite`` replaces only qdq's own files, a
symlinked ``OUT`` is written through, a killed job leaves nothing that looks finished, names that
are not UTF-8 and missing data are refused before anything is loaded, nothing lands outside ``OUT``.

The kills are deterministic: a child process patches the job so that it signals itself at a known
point (right after the export wrote the model and its manifest, or while the files are published).
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from qdq.cli.main import main
from qdq.pipeline.outdir import (
    PARTIAL,
    QDQ_FILES,
    STAGING_PREFIX,
    check_out_dir,
    remove_stale,
    staged_dir,
)

FILES = sorted(["manifest.json", "model.qdq.onnx", "report.html", "report.json"])
FAST = ("--exporter", "torchscript", "--recipe", "none", "--no-progress")
MODEL_PY = textwrap.dedent(
    """
    import pathlib, torch
    from torch import nn

    def build():
        pathlib.Path(__file__).with_name("LOADED").touch()  # the model was loaded
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(256, 3))
    """
)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("outdir_job")
    (root / "tiny.py").write_text(MODEL_PY)
    x = np.random.default_rng(0).standard_normal((16, 3, 8, 8)).astype(np.float32)
    np.save(root / "x.npy", x)
    return {"root": root, "py": root / "tiny.py", "npy": root / "x.npy"}


def _argv(job: dict[str, Path], out: Path | str, *extra: str) -> list[str]:
    return ["quantize", "--model", f"{job['py']}:build", "--data", str(job["npy"]),
            "--out", str(out), *FAST, *extra]  # fmt: skip


def _tree(root: Path) -> dict[str, bytes | str]:
    """Every entry under ``root``: a file's bytes, a link's target, ``dir`` for a folder."""
    seen: dict[str, bytes | str] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        seen[rel] = (
            f"-> {os.readlink(p)}" if p.is_symlink() else "dir" if p.is_dir() else p.read_bytes()
        )
    return seen


def _old_run(out: Path) -> None:
    """A previous job's files (with external data) and the user's own files."""
    out.mkdir(parents=True)
    for name in QDQ_FILES:
        (out / name).write_bytes(b"old " + name.encode())
    (out / "report.json").write_text(json.dumps({"files": {"html": "notes.txt"}}))  # not read
    (out / "notes.txt").write_text("mine")
    (out / "sub").mkdir()
    (out / "sub" / "model.qdq.onnx").write_text("also mine")


def _stage(tmp: Path, names: tuple[str, ...] = ("model.qdq.onnx", "report.json")) -> None:
    for name in names:
        (tmp / name).write_bytes(b"new " + name.encode())
    (tmp / f"manifest.json{PARTIAL}").write_bytes(b"new manifest.json")


# -------------------------------------------------------------------------- --overwrite


def test_overwrite_replaces_only_qdq_files_and_drops_their_stale_ones(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _old_run(out)
    with staged_dir(out, overwrite=True) as tmp:
        assert tmp.parent == out and tmp.name.startswith(STAGING_PREFIX)
        _stage(tmp)
    assert _tree(out) == {
        "manifest.json": b"new manifest.json",
        "model.qdq.onnx": b"new model.qdq.onnx",
        "report.json": b"new report.json",  # report.html and the .data of the old run: removed
        "notes.txt": b"mine",
        "sub": "dir",
        "sub/model.qdq.onnx": b"also mine",
    }
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing beside OUT


def test_a_failure_while_publishing_restores_the_old_files(tmp_path, monkeypatch) -> None:
    import qdq._io

    out = tmp_path / "out"
    _old_run(out)
    before = _tree(out)
    real, calls = os.replace, []

    def flaky(src, dst):  # the third move into OUT fails (the first two are placed)
        if Path(dst).parent == out:
            calls.append(dst)
            if len(calls) == 3:
                raise OSError("disk full")
        real(src, dst)

    monkeypatch.setattr(qdq._io.os, "replace", flaky)
    with pytest.raises(OSError, match="disk full"), staged_dir(out, overwrite=True) as tmp:
        _stage(tmp, ("model.qdq.onnx", "model.qdq.onnx.data", "report.json", "report.html"))
    assert _tree(out) == before


def test_an_error_in_the_job_leaves_an_existing_out_as_it_was(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _old_run(out)
    before = _tree(out)
    with pytest.raises(RuntimeError, match="boom"), staged_dir(out, overwrite=True) as tmp:
        _stage(tmp)
        raise RuntimeError("boom")
    assert _tree(out) == before


def test_a_new_out_and_its_parents_are_removed_when_the_job_fails(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b" / "out"
    with pytest.raises(KeyboardInterrupt), staged_dir(out) as tmp:
        _stage(tmp)
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
    with staged_dir(out) as tmp:
        _stage(tmp)
    assert sorted(p.name for p in out.iterdir()) == [
        "manifest.json",
        "model.qdq.onnx",
        "report.json",
    ]
    mask = os.umask(0o022)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~mask  # as mkdir makes it (not mkdtemp's 0700)


def test_without_overwrite_a_non_empty_out_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty; pass --overwrite"):
        check_out_dir(out, overwrite=False)
    (out / "notes.txt").unlink()
    (out / "manifest.json").mkdir()
    with pytest.raises(FileExistsError, match=r"manifest\.json is a directory"):
        check_out_dir(out, overwrite=True)


def test_a_job_that_staged_an_unknown_file_publishes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="staged evil.txt"), staged_dir(out) as tmp:
        _stage(tmp)
        (tmp / "evil.txt").write_text("x")
    assert not out.exists()


# -------------------------------------------------------------------------- symbolic links


def test_a_symlinked_out_is_written_through_and_kept(tmp_path: Path) -> None:
    real = tmp_path / "real"
    _old_run(real)
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    outside = tmp_path / "outside.onnx"
    outside.write_text("not qdq's")
    (real / "model.qdq.onnx").unlink()
    (real / "model.qdq.onnx").symlink_to(outside)  # a link at a qdq name: replaced, not followed
    with staged_dir(link, overwrite=True) as tmp:
        _stage(tmp)
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert (real / "model.qdq.onnx").read_bytes() == b"new model.qdq.onnx"
    assert not (real / "model.qdq.onnx").is_symlink() and outside.read_text() == "not qdq's"
    assert (real / "notes.txt").read_text() == "mine"


def test_a_link_to_nothing_is_refused(tmp_path: Path, capsys) -> None:
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileExistsError, match="symbolic link to .*nowhere, which does not exist"):
        check_out_dir(link, overwrite=True)
    assert not (tmp_path / "nowhere").exists()


# -------------------------------------------------------------------------- killed jobs

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    import qdq.pipeline.finish as run
    from qdq.cli.main import main

    real = run.export_model

    def export_then_die(*args, **kwargs):
        result = real(*args, **kwargs)  # the model and its manifest are in the staging folder
        os.kill(os.getpid(), signal.SIGKILL)
        return result

    run.export_model = export_then_die
    sys.exit(main(sys.argv[1:]))
    """
)


def _child(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=300
    )


def _finished_pairs(root: Path) -> list[Path]:
    """Every ``manifest.json`` under ``root`` that names an ONNX file beside it with its hash."""
    from qdq.export.external import sha256_of_file

    found = []
    for m in root.rglob("*manifest.json"):
        info = json.loads(m.read_text())["onnx"]
        onnx = m.with_name(info["file"])
        if onnx.is_file() and sha256_of_file(onnx) == info["sha256"]:
            found.append(m)
    return found


def test_sigkill_after_the_export_leaves_nothing_that_looks_finished(job, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    done = _child(CHILD, *_argv(job, out))
    assert done.returncode == -signal.SIGKILL, done.stderr
    (staging,) = out.iterdir()  # only the staging folder, inside OUT
    assert staging.name.startswith(STAGING_PREFIX)
    names = sorted(p.name for p in staging.iterdir())
    assert names == ["INCOMPLETE", "manifest.json.partial", "model.qdq.onnx"], names
    assert json.loads((staging / "INCOMPLETE").read_text())["pid"] > 0
    assert _finished_pairs(tmp_path) == []
    from qdq.export import find_manifest

    with pytest.raises(FileNotFoundError):
        find_manifest(staging / "model.qdq.onnx")
    # the next job into OUT needs no --overwrite: the killed job's folder is removed
    assert main(_argv(job, out)) == 0, capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == FILES
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


class _UnhandledError(Exception):
    pass


def _unhandled(signum, frame):
    raise _UnhandledError("the CLI did not handle SIGTERM")


def test_sigterm_cleans_up_like_ctrl_c(job, tmp_path: Path, monkeypatch, capsys) -> None:
    """In this process: the CLI's handler replaces this test's guard while the job runs."""
    run = importlib.import_module("qdq.pipeline.finish")
    real = run.export_model

    def export_then_term(*args, **kwargs):
        result = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        return result

    monkeypatch.setattr(run, "export_model", export_then_term)
    out = tmp_path / "out"
    _old_run(out)
    before = _tree(out)
    guard = signal.signal(signal.SIGTERM, _unhandled)
    try:
        assert main(_argv(job, out, "--overwrite")) == 143
    finally:
        assert signal.signal(signal.SIGTERM, guard) is _unhandled  # put back by the CLI
    err = capsys.readouterr().err
    assert err == "qdq quantize: terminated (SIGTERM); nothing written\n", err
    assert _tree(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


PUBLISH_CHILD = textwrap.dedent(
    """
    import os, signal, sys, types
    from pathlib import Path

    # qdq and qdq.pipeline as bare packages: outdir and _io without torch (a fast child)
    for name in ("qdq", "qdq.pipeline"):
        package = types.ModuleType(name)
        package.__path__ = [os.path.join(sys.argv[2], *name.split("."))]
        sys.modules[name] = package
    import qdq._io
    from qdq.pipeline.outdir import staged_dir

    out = Path(sys.argv[1])
    real = os.replace

    def replace(src, dst):
        real(src, dst)
        if Path(dst) == out / "model.qdq.onnx":  # the first new file is in place
            os.kill(os.getpid(), signal.SIGKILL)

    qdq._io.os.replace = replace
    with staged_dir(out, overwrite=True) as tmp:
        for name in ("model.qdq.onnx", "report.json"):
            (tmp / name).write_text("new")
        (tmp / "manifest.json.partial").write_text("new")
    """
)


def test_sigkill_while_publishing_leaves_no_manifest(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _old_run(out)
    import qdq

    done = _child(PUBLISH_CHILD, str(out), str(Path(qdq.__file__).parent.parent))
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert not (out / "manifest.json").exists()  # the seal: moved aside first, placed last
    assert (out / "model.qdq.onnx").read_text() == "new"
    assert (out / "notes.txt").read_text() == "mine"
    (staging,) = [p for p in out.iterdir() if p.name.startswith(STAGING_PREFIX)]
    assert all(p.name.endswith(".old") for p in (staging / ".old").iterdir())
    assert remove_stale(out) == [staging] and not staging.exists()


def test_stale_folders_of_live_or_foreign_jobs_are_left_alone(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    live = out / f"{STAGING_PREFIX}live"
    live.mkdir()
    import socket

    record = {"pid": os.getppid(), "host": socket.gethostname()}  # a process that runs
    (live / "INCOMPLETE").write_text(json.dumps(record))
    odd = out / f"{STAGING_PREFIX}odd"
    odd.mkdir()
    (odd / "INCOMPLETE").write_text("not json")
    user = out / f"{STAGING_PREFIX}user"  # the user's own file of that name
    user.write_text("mine")
    empty = out / f"{STAGING_PREFIX}empty"  # killed before its marker
    empty.mkdir()
    assert remove_stale(out) == [empty]
    assert live.is_dir() and odd.is_dir() and user.read_text() == "mine"


# -------------------------------------------------------------------------- argument checks


def _bad_name(tmp_path: Path, stem: str) -> Path:
    if sys.getfilesystemencoding().lower() not in ("utf-8", "utf8"):
        pytest.skip("needs a UTF-8 file system encoding")
    return tmp_path / os.fsdecode(stem.encode() + b"\xff")


@pytest.mark.parametrize("which", ["--out", "--data"])
def test_names_that_are_not_utf8_fail_before_the_model_loads(job, tmp_path, capsys, which):
    bad = _bad_name(tmp_path, "d")
    if which == "--data":
        bad.mkdir()
        (bad / "x.npy").write_bytes(job["npy"].read_bytes())
        argv = _argv(job, tmp_path / "out")
        argv[argv.index("--data") + 1] = str(bad / "x.npy")
    else:
        argv = _argv(job, bad)
    (job["root"] / "LOADED").unlink(missing_ok=True)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"qdq quantize: error: {which} b'") and "not valid UTF-8" in err, err
    assert err.count("\n") == 1 and not (job["root"] / "LOADED").exists()
    assert not (tmp_path / "out").exists() and not (which == "--out" and bad.exists())


@pytest.mark.parametrize(
    ("data", "message"),
    [("missing.npy", "--data: no data file at"), ("imagenet1k", "unknown dataset 'imagenet1k'")],
)
def test_missing_data_fails_before_the_model_loads(job, tmp_path, capsys, data, message) -> None:
    argv = _argv(job, tmp_path / "out")
    argv[argv.index("--data") + 1] = str(tmp_path / data) if "." in data else data
    (job["root"] / "LOADED").unlink(missing_ok=True)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("qdq quantize: error: ") and message in err and err.count("\n") == 1
    assert not (job["root"] / "LOADED").exists() and not (tmp_path / "out").exists()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_out_fails_before_the_model_loads(job, tmp_path, capsys) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    (job["root"] / "LOADED").unlink(missing_ok=True)
    assert main(_argv(job, locked / "out")) == 2
    assert "no write permission" in capsys.readouterr().err
    assert not (job["root"] / "LOADED").exists()


def test_the_job_writes_only_the_listed_files() -> None:
    """:data:`QDQ_FILES` covers what the job writes: the names ``run.py`` uses and the ONNX's
    external-data file."""
    from qdq.export.external import sidecar_for

    pipeline_run = importlib.import_module("qdq.pipeline.run")
    written = {pipeline_run.ONNX_FILE, pipeline_run.MANIFEST_FILE, pipeline_run.REPORT_FILE,
               pipeline_run.HTML_FILE, sidecar_for(pipeline_run.ONNX_FILE).name}  # fmt: skip
    assert written == set(QDQ_FILES) and QDQ_FILES[-1] == pipeline_run.MANIFEST_FILE
