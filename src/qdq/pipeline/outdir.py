"""An output directory that appears whole or not at all.

Everything is written into a temporary directory beside ``OUT`` (same file system), which is then
renamed to ``OUT``. An existing non-empty ``OUT`` is refused unless ``overwrite``; with it, the old
``OUT`` is moved aside, the new one renamed into place, and the old one deleted (restored if the
rename fails). On any error the temporary directory is removed and ``OUT`` is as it was.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["check_out_dir", "staged_dir"]


def check_out_dir(out: Path, overwrite: bool) -> None:
    """Refuse an ``out`` that is a file, or a non-empty directory without ``overwrite``."""
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"output {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"output directory {out} exists and is not empty; pass --overwrite")


@contextlib.contextmanager
def staged_dir(out: str | Path, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a fresh temporary directory; on success it becomes ``out``.

    Raises:
        FileExistsError: ``out`` is a file, or a non-empty directory and ``overwrite`` is false
            (checked before yielding and again before the rename).
    """
    target = Path(out)
    check_out_dir(target, overwrite)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent))
    try:
        yield tmp
        check_out_dir(target, overwrite)
        _publish(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _publish(tmp: Path, target: Path) -> None:
    if not target.exists():
        os.replace(tmp, target)
        return
    backup = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
    os.replace(target, backup / "old")
    try:
        os.replace(tmp, target)
    except BaseException:
        os.replace(backup / "old", target)
        shutil.rmtree(backup, ignore_errors=True)
        raise
    shutil.rmtree(backup, ignore_errors=True)
