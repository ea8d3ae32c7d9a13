"""Reading a manifest someone else wrote: bounded, and confined to its folder.

A manifest arrives with a model from anyone, so it is untrusted input. :func:`read_manifest`
checks a manifest before it parses it: a regular file of at most :data:`MAX_MANIFEST_BYTES`,
UTF-8, JSON nested at most :data:`MAX_DEPTH` levels deep (counted on the text, before anything is
built: :func:`qdq.lint.untrusted_json.parse_json`). :func:`confined` resolves a file a manifest
names relative to the folder it belongs in and refuses a name that could lead anywhere else: an
absolute path, a ``..`` part, a symbolic link whose target lies outside the folder.
:func:`hash_file` hashes a file in chunks after checking that it is a regular file within a size
bound, so memory stays bounded whatever the file. Nothing here runs code or writes a file.

Every refusal is a :class:`ValueError` whose one-line message names the manifest, the key and the
offending value (``repr``, shortened: control characters never reach a terminal raw).
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from qdq.lint.untrusted_json import UntrustedJSONError, parse_json

__all__ = [
    "MAX_DEPTH",
    "MAX_MANIFEST_BYTES",
    "MAX_ONNX_BYTES",
    "SCHEMA",
    "confined",
    "hash_file",
    "read_manifest",
    "short",
]

#: the schema of qdq's manifests (:mod:`qdq.export.manifest`)
SCHEMA = "qdq.manifest/1"
#: The largest manifest read (256 MiB). A manifest holds about 64 bytes per channel of a
#: per-channel amax and scale (ResNet-18: 372 kB, 43 quantizers, 5,822 channels); 256 MiB would
#: hold about 4 million channels.
MAX_MANIFEST_BYTES = 256 * 2**20
#: The deepest JSON nesting read. qdq writes at most 5 levels (document, ``quantizers``, an entry,
#: ``learned``, a part); the margin leaves room for recorded recipes.
MAX_DEPTH = 64
#: Protobuf cannot parse a message of 2 GiB or more, so no ``.onnx`` file is larger; a larger file
#: named as one is refused before it is hashed.
MAX_ONNX_BYTES = 2**31 - 1

_CHUNK = 1 << 20


def short(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters (a hostile value may be megabytes long)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_manifest(path: str | Path) -> Any:
    """The parsed JSON of the manifest at ``path``, checked before it is parsed.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: not a regular file, larger than :data:`MAX_MANIFEST_BYTES`, not UTF-8, nested
            deeper than :data:`MAX_DEPTH`, or not JSON; the message names the file.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "m.json")
        >>> _ = open(p, "w").write('{"schema": "qdq.manifest/1"}')
        >>> read_manifest(p)
        {'schema': 'qdq.manifest/1'}
    """
    p = Path(path)
    data = _read_bounded(p, MAX_MANIFEST_BYTES, what="manifest")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{p} is not valid JSON: {err}") from None
    try:
        return parse_json(text, f"manifest {p}", max_depth=MAX_DEPTH, nonfinite=True)
    except UntrustedJSONError as err:
        raise ValueError(" ".join(str(err).split())[:300]) from None


def confined(folder: Path, name: object, *, manifest: Path, key: str) -> Path:
    """``folder / name`` for a file a manifest names, refused unless it stays inside ``folder``.

    ``name`` must be a non-empty relative path without ``..`` parts whose resolved location
    (symbolic links followed) lies inside the resolved ``folder``. The file need not exist.

    Raises:
        ValueError: naming ``manifest``, ``key`` and ``name``.

    Example:
        >>> confined(Path("out"), "m.onnx", manifest=Path("out/m.json"), key="onnx.file").name
        'm.onnx'
        >>> try:
        ...     confined(Path("out"), "../x", manifest=Path("out/m.json"), key="onnx.file")
        ... except ValueError as err:
        ...     print(str(err).split(" (")[0])
        out/m.json: 'onnx.file' names '../x', outside the manifest's folder out
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{manifest}: {key!r} must be a file name, got {short(name)}")
    why = None
    if "\x00" in name:
        why = "a NUL character"
    elif PurePosixPath(name).is_absolute() or PureWindowsPath(name).anchor:
        why = "an absolute path"
    elif ".." in PurePosixPath(name).parts or ".." in PureWindowsPath(name).parts:
        why = "a '..' part"
    else:
        try:
            inside = (folder / name).resolve().is_relative_to(folder.resolve())
        except (OSError, RuntimeError):  # a symlink loop, a name too long
            inside = False
        if not inside:
            why = "a symbolic link leading out"
    if why is not None:
        raise ValueError(
            f"{manifest}: {key!r} names {short(name)}, outside the manifest's folder {folder} "
            f"({why}); a manifest names only files beside it"
        )
    return folder / name


def hash_file(path: Path, *, limit: int | None, manifest: Path, key: str) -> str:
    """Hex SHA-256 of the regular file at ``path``, read in 1 MiB chunks; refused before any
    byte is read when it is larger than ``limit`` bytes (``None``: no bound; memory stays
    bounded either way).

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: not a regular file, or larger than ``limit``; naming ``manifest`` and ``key``.
    """
    digest = hashlib.sha256()
    fd = _open_regular(path, limit, manifest=manifest, key=key)
    with os.fdopen(fd, "rb") as fh:
        while block := fh.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _read_bounded(p: Path, limit: int, *, what: str) -> bytes:
    fd = _open_regular(p, limit, manifest=p, key=what)
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(limit + 1)  # bounded even if the file grows after the size check
    if len(data) > limit:
        raise ValueError(f"{p} is larger than {limit:,} bytes; refused")
    return data


def _open_regular(path: Path, limit: int | None, *, manifest: Path, key: str) -> int:
    """A read-only descriptor of the regular file at ``path`` (checked on the open file, so a
    swap after the check cannot matter; non-blocking, so a FIFO cannot hang the open)."""
    subject = f"{path}" if path == manifest else f"{manifest}: {key} {path}"
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise FileNotFoundError(f"no {key} at {path}") from None
    except OSError as err:
        raise ValueError(f"{subject}: cannot be read ({err.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{subject} is not a regular file; refused")
        if limit is not None and st.st_size > limit:
            raise ValueError(
                f"{subject} is {st.st_size:,} bytes, more than {limit:,}; refused before reading it"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd
