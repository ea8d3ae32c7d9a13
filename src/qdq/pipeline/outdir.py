"""Where ``qdq quantize`` writes: its own files in ``OUT``, all of them or none, nothing else.

The job's files (:data:`QDQ_FILES`) are built in a staging folder inside ``OUT`` (``OUT/.qdq-partial-
XXXXXXXX/``, on ``OUT``'s file system), then moved into ``OUT`` one by one with
:func:`qdq._io.atomic_move_files`, the manifest last: it seals the set. A new ``OUT`` (and its
missing parents) is created for the job and removed again when the job fails.

* An existing non-empty ``OUT`` is refused unless ``overwrite``. With it, only qdq's own files are
  replaced: those this job writes, and those of the fixed list it does not write this time (an old
  ``model.qdq.onnx.data``) are removed. An old report or manifest is never read to decide what to
  delete. Every other file in ``OUT`` is left as it was. If a move fails, the old files are put back.
* ``OUT`` may be a symbolic link to a folder: the files are written into that folder and the link
  is kept. A link to nothing is refused; a link at a file's name inside ``OUT`` is replaced, not
  followed.
* The staging folder holds an ``INCOMPLETE`` marker (written first; the folder with it is removed
  last) and the manifest under the name ``manifest.json.partial``: a job killed before the end
  (SIGKILL; SIGTERM and Ctrl-C clean up) never leaves a model and a manifest that look finished. The
  next job into the same ``OUT`` removes such a folder when its marker names a process of this host
  that no longer runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from qdq._io import atomic_move_files

__all__ = [
    "PARTIAL",
    "QDQ_FILES",
    "STAGING_PREFIX",
    "Terminated",
    "check_name",
    "check_out_dir",
    "remove_stale",
    "sigterm_interrupts",
    "staged_dir",
    "staged_name",
]

#: every file a ``qdq quantize`` job writes into ``OUT``, in the order they are published: the
#: manifest last (it names the model and its hash; without it nothing looks finished)
QDQ_FILES = ("model.qdq.onnx", "model.qdq.onnx.data", "report.json", "report.html", "manifest.json")
#: the suffix of a staged file that takes its final name only when it is published
PARTIAL = ".partial"
STAGING_PREFIX = ".qdq-partial-"
MARKER = "INCOMPLETE"
_MARKER_BYTES = 4096  # a marker is a few hundred bytes; more is not ours


def staged_name(path: Path) -> Path:
    """The name ``path`` has in the staging folder until it is published (``manifest.json`` →
    ``manifest.json.partial``)."""
    return path.with_name(path.name + PARTIAL)


def check_name(path: str | Path, what: str) -> None:
    """Refuse a path whose name is not valid UTF-8 (bytes the file system gave back as surrogate
    escapes): ONNX Runtime opens models by UTF-8 name, and report.json records the names.

    Raises:
        ValueError: naming the path as bytes.
    """
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"{what} {os.fsencode(path)!r}: the name is not valid UTF-8 (ONNX Runtime and "
            "report.json need UTF-8 names); rename it"
        ) from None


def check_out_dir(out: Path, overwrite: bool) -> None:
    """Refuse an ``out`` the job could not write: a name that is not UTF-8, a file, a link to
    nothing, a folder without write permission (or whose nearest existing parent is one), a
    non-empty folder without ``overwrite``, or one holding a folder at a name of :data:`QDQ_FILES`.
    Staging folders (of this job or of killed ones) do not count as content.

    Raises:
        ValueError: a name that is not UTF-8.
        FileExistsError / NotADirectoryError / PermissionError: naming the path.
    """
    out = Path(out)
    check_name(out, "output")
    if out.is_symlink() and not out.exists():
        raise FileExistsError(
            f"output {out} is a symbolic link to {os.readlink(out)}, which does not exist"
        )
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"output {out} exists and is not a directory")
    if not out.exists():
        parent = _existing_parent(out)
        if not parent.is_dir():
            raise NotADirectoryError(f"output {out}: {parent} is not a directory")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise PermissionError(
                f"output {out}: cannot create it in {parent} (no write permission)"
            )
        return
    if not os.access(out, os.W_OK | os.X_OK):
        raise PermissionError(f"output directory {out} is not writable")
    content = [p for p in out.iterdir() if not _is_staging(p)]
    if content and not overwrite:
        raise FileExistsError(f"output directory {out} exists and is not empty; pass --overwrite")
    for name in QDQ_FILES:
        if (out / name).is_dir() and not (out / name).is_symlink():
            raise FileExistsError(f"output {out / name} is a directory; qdq writes a file there")


def _existing_parent(path: Path) -> Path:
    """The nearest ancestor of ``path`` that exists (``.`` for a relative path's last resort)."""
    for parent in path.absolute().parents:
        if parent.exists():
            return parent
    return Path(".")  # pragma: no cover - the root exists


@contextlib.contextmanager
def staged_dir(out: str | Path, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a fresh staging folder inside ``out``; on success its files are published into
    ``out`` (see the module's docstring); on any error or interrupt it is removed, ``out`` is as it
    was, and an ``out`` the job created is removed again.

    Write a file that must not look finished before the end under :func:`staged_name`: it is
    published under its final name.

    Raises:
        FileExistsError: see :func:`check_out_dir` (checked before yielding and again before
            publishing).
        RuntimeError: the job staged a file that is not one of :data:`QDQ_FILES`.
    """
    target = Path(out)
    check_out_dir(target, overwrite)
    created = _make_dirs(target)
    tmp: Path | None = None
    try:
        remove_stale(target)
        tmp = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=target))
        _write_marker(tmp)
        yield tmp
        check_out_dir(target, overwrite)
        _publish(tmp, target, overwrite)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        for d in reversed(created):  # the deepest first; only while empty
            with contextlib.suppress(OSError):
                d.rmdir()
        raise
    shutil.rmtree(tmp, ignore_errors=True)


def _make_dirs(target: Path) -> list[Path]:
    """Create ``target`` and its missing parents (following a link at ``target``); return the
    folders created, outermost first."""
    created = []
    for d in reversed([target, *target.parents]):
        if d.exists():
            continue
        try:
            d.mkdir()
        except FileExistsError:  # made meanwhile by someone else: not ours to remove
            continue
        created.append(d)
    return created


def _publish(tmp: Path, target: Path, overwrite: bool) -> None:
    staged: dict[str, Path] = {}
    for entry in tmp.iterdir():
        if entry.name == MARKER or entry.is_dir():
            continue  # the marker, and empty helpers of the export: removed with the folder
        name = entry.name.removesuffix(PARTIAL)
        if name not in QDQ_FILES:
            raise RuntimeError(f"the job staged {entry.name}, which is not one of qdq's files")
        staged[name] = entry
    moves: dict[str | Path, str | Path] = {target / n: staged[n] for n in QDQ_FILES if n in staged}
    remove = [target / n for n in QDQ_FILES if n not in staged] if overwrite else []
    backups = tmp / ".old"
    backups.mkdir()
    atomic_move_files(moves, overwrite=overwrite, remove=remove, backup_dir=backups)


# ------------------------------------------------------------------------------------ staging


def _write_marker(tmp: Path) -> None:
    record = {
        "qdq": "an unfinished qdq job: nothing in this folder is a usable output",
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (tmp / MARKER).write_text(json.dumps(record) + "\n", encoding="utf-8")


def _is_staging(path: Path) -> bool:
    return path.name.startswith(STAGING_PREFIX) and path.is_dir() and not path.is_symlink()


def remove_stale(out: Path) -> list[Path]:
    """Remove the staging folders in ``out`` left by killed jobs, and return them: a folder of
    that name owned by this user, whose marker names a process of this host that no longer runs
    (or an empty one, killed before its marker). Anything else is left alone."""
    removed = []
    for entry in out.iterdir():
        uid = getattr(os, "getuid", lambda: None)()
        if not _is_staging(entry) or (uid is not None and entry.lstat().st_uid != uid):
            continue
        marker = entry / MARKER
        if not marker.exists():
            with contextlib.suppress(OSError):
                entry.rmdir()  # only when empty
                removed.append(entry)
            continue
        if _dead_owner(marker):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def _dead_owner(marker: Path) -> bool:
    """Whether ``marker`` is a qdq marker naming a process of this host that is gone."""
    try:
        if marker.is_symlink() or marker.stat().st_size > _MARKER_BYTES:
            return False
        record = json.loads(marker.read_text(encoding="utf-8"))
        pid, host = record["pid"], record["host"]
    except (OSError, ValueError, TypeError, KeyError):
        return False
    mine = host == socket.gethostname() and type(pid) is int and pid > 0
    if not mine or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's process: alive
        return False
    return False


# ------------------------------------------------------------------------------------ SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the job runs so that it cleans up as after Ctrl-C."""


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` (a ``KeyboardInterrupt``) in the main
    thread: staging folders and temporary files are removed on the way out. Outside the main
    thread (signals cannot be set there) the block runs unchanged."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Terminated(f"terminated by signal {signum}")

    try:
        before = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)
