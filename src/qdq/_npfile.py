"""``.npy`` and ``.npz`` files from others, read without pickles and within size limits.

:func:`read_arrays` reads every array's ``.npy`` header first (shape and dtype, before any data),
refuses what cannot be plain numeric data -- a pickle, an object or string dtype, a zip member that
is not an ``.npy`` array -- and checks the declared sizes against what the file holds and against
:mod:`qdq._limits` (the decoded size of the file, the expansion of a compressed member); only then
are the arrays read, with ``allow_pickle=False``, from the same open file.
"""

from __future__ import annotations

import math
import os
import zipfile
from pathlib import Path
from typing import IO

import numpy as np

from qdq._limits import InputRefusedError, check_expansion, check_input_bytes, human_bytes

__all__ = ["MAX_MEMBERS", "read_arrays"]

#: most arrays one ``.npz`` may hold (qdq uses a handful: inputs, labels)
MAX_MEMBERS = 256
_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"
_NUMERIC_KINDS = "biufc"


def read_arrays(path: Path) -> dict[str | None, np.ndarray]:
    """The arrays of a ``.npy`` (key ``None``) or ``.npz`` file (its keys, in stored order).

    Raises:
        ValueError: naming the file: not an ``.npy``/``.npz`` file (a pickle is refused),
            pickled/object or non-numeric arrays, a header declaring more data than the file
            holds, a member past the expansion limit, more than :data:`MAX_MEMBERS` arrays, a
            decoded size past the input limit, or an unreadable file.
    """
    try:
        with open(path, "rb") as fh:
            magic = fh.read(len(_NPY_MAGIC))
            fh.seek(0)
            if magic.startswith(_ZIP_MAGIC[:2]):  # a local header, or the end of an empty zip
                return _read_npz(fh, str(path))
            if magic == _NPY_MAGIC:
                size = os.fstat(fh.fileno()).st_size
                shape, dtype, start = _header(fh, str(path))
                _check_fits(shape, dtype, size - start, str(path))
                check_input_bytes(_nbytes(shape, dtype), str(path), _describe(shape, dtype))
                fh.seek(0)
                return {None: np.lib.format.read_array(fh, allow_pickle=False)}
    except InputRefusedError:
        raise
    except Exception as err:  # any parse failure of a malformed file (zlib, zip, header)
        raise ValueError(f"cannot read data file {path}: {' '.join(str(err).split())}") from None
    raise InputRefusedError(
        f"cannot read data file {path}: neither an .npy array nor an .npz archive (pickled "
        "data? pickled/object arrays are refused: save plain arrays with np.save/np.savez)"
    )


def _read_npz(fh: IO[bytes], where: str) -> dict[str | None, np.ndarray]:
    with zipfile.ZipFile(fh) as zf:
        infos = zf.infolist()
        if len(infos) > MAX_MEMBERS:
            raise InputRefusedError(
                f"{where} holds {len(infos)} members; qdq reads at most {MAX_MEMBERS} arrays"
            )
        keys: list[str] = []
        total = 0
        for info in infos:
            key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            if key in keys:
                raise InputRefusedError(f"{where} holds the array {key!r} twice")
            keys.append(key)
            member = f"{where}[{key}]"
            with zf.open(info) as m:
                shape, dtype, start = _header(m, member)
            nbytes = _nbytes(shape, dtype)
            _check_fits(shape, dtype, info.file_size - start, member)
            check_expansion(info, nbytes, where)
            total += nbytes
        check_input_bytes(total, where, f"{len(infos)} array(s)")
        arrays: dict[str | None, np.ndarray] = {}
        for key, info in zip(keys, infos, strict=True):
            with zf.open(info) as m:
                arrays[key] = np.lib.format.read_array(m, allow_pickle=False)
        if not arrays:
            raise InputRefusedError(f"data file {where} holds no arrays")
        return arrays


def _header(fp: IO[bytes], where: str) -> tuple[tuple[int, ...], np.dtype, int]:
    """Shape, dtype and data offset from an ``.npy`` header (nothing after it is read)."""
    if fp.read(len(_NPY_MAGIC)) != _NPY_MAGIC:
        raise InputRefusedError(
            f"{where} is not an .npy array (pickled data? pickled/object arrays are refused)"
        )
    fp.seek(0)  # a zip member seeks back by decompressing again from its start
    version = np.lib.format.read_magic(fp)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(fp)
    elif version == (2, 0):
        shape, _, dtype = np.lib.format.read_array_header_2_0(fp)
    else:
        raise InputRefusedError(
            f"{where}: .npy format version {version} is not read (1.0 and 2.0 are)"
        )
    if dtype.hasobject:
        raise InputRefusedError(
            f"{where} holds Python objects (dtype {dtype}): pickled/object arrays are refused"
        )
    if dtype.fields is not None or dtype.kind not in _NUMERIC_KINDS:
        raise InputRefusedError(
            f"{where} holds {dtype} data; qdq reads numeric arrays (bool, int, float)"
        )
    return tuple(shape), dtype, fp.tell()


def _nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    return math.prod(shape) * dtype.itemsize


def _describe(shape: tuple[int, ...], dtype: np.dtype) -> str:
    return f"an array of shape {shape} {dtype}"


def _check_fits(shape: tuple[int, ...], dtype: np.dtype, held: int, where: str) -> None:
    """Refuse a header that declares more data than the file (or zip member) holds."""
    nbytes = _nbytes(shape, dtype)
    if nbytes > held:
        raise InputRefusedError(
            f"{where}: its header declares {_describe(shape, dtype)} ({human_bytes(nbytes)}) but "
            f"it holds {human_bytes(max(held, 0))}"
        )
