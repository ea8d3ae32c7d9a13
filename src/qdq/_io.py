"""Atomic file writes: a temporary file in the same directory, then ``os.replace``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write_bytes", "atomic_write_text"]


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
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
