"""Atomic file writes: a temporary file in the same directory, then ``os.replace``.

:func:`atomic_write_files` extends this to several files that only make sense together (an ONNX model
and its manifest): all are written to temporaries first, then moved into place; if anything fails, the
temporaries are removed and the files that were already replaced are restored, so readers see the old
set or the new set, never a mix.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = [
    "atomic_move_files",
    "atomic_write_bytes",
    "atomic_write_files",
    "atomic_write_text",
    "proto_byte_size",
]


def atomic_write_text(path: str | Path, text: str, *, overwrite: bool = True) -> Path:
    """Write ``text`` to ``path`` so that readers see the old file or the whole new one, never a part.

    Raises:
        FileExistsError: ``path`` exists and ``overwrite`` is false.
    """
    return atomic_write_bytes(path, text.encode("utf-8"), overwrite=overwrite)


def atomic_write_bytes(path: str | Path, data: bytes, *, overwrite: bool = True) -> Path:
    """Like :func:`atomic_write_text`, for bytes."""
    target = Path(path)
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} exists; pass overwrite=True to replace it")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _write_temporary(target, data)
    try:
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def _write_temporary(target: Path, data: bytes) -> Path:
    """``data`` in a new temporary file beside ``target`` (flushed to disk); return its path."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        if hasattr(os, "fchmod"):  # mkstemp makes 0600; open() would give 0666 & ~umask
            os.fchmod(fd, _file_mode())
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def _file_mode() -> int:
    """The mode ``open()`` gives a new file under the current umask (``os.umask`` can only be
    read by setting it, so it is set back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write_files(
    files: Mapping[str | Path, bytes], *, overwrite: bool = True, remove: Sequence[str | Path] = ()
) -> list[Path]:
    """Write several files as one unit: afterwards all are new, or (on any error) all are as before.

        Every file is first written to a temporary beside it; only when all are on disk are they moved
        into place. Existing files are first moved aside (to a temporary name) and restored if a later
        move fails. Interrupted by a crash between two moves, the directory may hold a mixed set; files
        that must match should carry a hash of each other (as the ONNX manifest does). The files in
    ``remove`` are deleted with the unit (restored on error): an ONNX file's old external data.

        Raises:
            FileExistsError: ``overwrite`` is false and any of the files exists (nothing is written).

        Example:
            >>> import tempfile, os
            >>> d = tempfile.mkdtemp()
            >>> [p.name for p in atomic_write_files({os.path.join(d, "a"): b"1", os.path.join(d, "b"): b"2"})]
            ['a', 'b']
    """
    targets = {Path(p): data for p, data in files.items()}
    _refuse_existing(targets, overwrite)
    temporaries: dict[str | Path, str | Path] = {}
    try:
        for target, data in targets.items():
            target.parent.mkdir(parents=True, exist_ok=True)
            temporaries[target] = _write_temporary(target, data)
        return atomic_move_files(temporaries, overwrite=overwrite, remove=remove)
    finally:
        for tmp in temporaries.values():
            Path(tmp).unlink(missing_ok=True)  # moved into place, or left over after an error


def atomic_move_files(
    moves: Mapping[str | Path, str | Path],
    *,
    overwrite: bool = True,
    remove: Sequence[str | Path] = (),
    backup_dir: str | Path | None = None,
) -> list[Path]:
    """Move already written files into place as one unit (``{target: source}``, each source on the
    target's file system, e.g. a temporary beside it), and delete the files in ``remove`` with
    them: afterwards all targets are new and ``remove`` is gone, or (on any error) all are as
    before. The sources are not removed on error. Targets are placed in the order given (put the
    file that seals the set, a manifest, last); every old file is moved aside (in the reverse
    order) before the first is placed, into ``backup_dir`` when given (on the targets' file
    system), else beside it. A link at a target is replaced, never followed.

    Used for outputs too large to hold as bytes (an ONNX file and its external-data file, written
    by ``onnx`` into a temporary directory beside the target).

    Raises:
        FileExistsError: ``overwrite`` is false and any target exists (nothing is moved).

    Example:
        >>> import tempfile, os
        >>> d = tempfile.mkdtemp()
        >>> open(os.path.join(d, "a.tmp"), "w").close()
        >>> [p.name for p in atomic_move_files({os.path.join(d, "a"): os.path.join(d, "a.tmp")})]
        ['a']
    """
    targets = {Path(t): Path(s) for t, s in moves.items()}
    _refuse_existing(targets, overwrite)
    doomed = [Path(r) for r in remove if os.path.lexists(r) and Path(r) not in targets]
    backups: dict[Path, Path] = {}
    placed: list[Path] = []
    try:
        for target in [*reversed(targets), *doomed]:  # the seal first
            if os.path.lexists(target):
                aside = target.parent if backup_dir is None else Path(backup_dir)
                fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".old", dir=aside)
                os.close(fd)
                os.replace(target, name)
                backups[target] = Path(name)
        for target, source in targets.items():
            os.replace(source, target)
            placed.append(target)
    except BaseException:
        for target in placed:
            with contextlib.suppress(OSError):
                os.replace(target, targets[target])  # the source back where it was
        for target, backup in backups.items():
            with contextlib.suppress(OSError):
                os.replace(backup, target)
        raise
    for backup in backups.values():
        backup.unlink(missing_ok=True)
    return list(targets)


def _refuse_existing(targets: Mapping[Path, object], overwrite: bool) -> None:
    if overwrite:
        return
    existing = [str(t) for t in targets if t.exists()]
    if existing:
        raise FileExistsError(
            f"{', '.join(existing)} exist{'s' if len(existing) == 1 else ''}; "
            "pass overwrite=True to replace"
        )


def proto_byte_size(message: object) -> float:
    """A protobuf message's serialized size in bytes (an ``onnx.ModelProto``), or infinity when
    protobuf cannot size it: the upb backend sizes a message by serializing it, which fails past
    2 GiB (``EncodeError``) — too large either way."""
    from google.protobuf.message import EncodeError

    try:
        return float(message.ByteSize())  # type: ignore[attr-defined]
    except EncodeError:
        return float("inf")


def onnx_input_names(n: int) -> list[str]:
    """The names qdq's export gives ``n`` tensor inputs, in ``forward``'s order: ``input``,
    ``input1``, ... An exporter may drop an input the graph never reads (TorchScript drops
    DeBERTa-v2's unused ``token_type_ids``): feed by these names, never by position."""
    return [f"input{i}" if i else "input" for i in range(n)]


def feed_by_name(names: Sequence[str], inputs: Sequence[object]) -> dict[str, object]:
    """``{onnx input name: value}`` for positional ``inputs`` of a graph whose inputs are
    ``names``: by :func:`onnx_input_names` when ``names`` are among them (inputs the graph
    dropped are left out), else by position when the counts agree.

    Raises:
        ValueError: neither applies (naming both lists).
    """
    ours = onnx_input_names(len(inputs))
    if set(names) <= set(ours):
        return {n: x for n, x in zip(ours, inputs, strict=True) if n in names}
    if len(names) == len(inputs):
        return dict(zip(names, inputs, strict=True))
    raise ValueError(f"the ONNX model takes {len(names)} inputs ({list(names)}), got {len(inputs)}")
