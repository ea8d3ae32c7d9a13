"""Read an ONNX model's external data only after checking it, confined to the model's folder.

``onnx.load`` reads each external tensor's ``length`` bytes (or the rest of its file) before
anything compares them with the tensor's shape: an 80-byte tensor whose record claims 8 GiB of a
sparse file made the linter allocate 17 GB, and a ``location`` may name any file the user can
read (``/etc/passwd``, ``../../secret``, a symlink out of the folder, a FIFO that blocks).
:func:`load_external_data` checks every record first -- the location is a relative path inside the
model's folder (symlinks resolved) naming a regular file; offset and length are whole numbers;
``length`` (when absent: the rest of the file) is the size the tensor's shape and type need;
``offset + size`` lies inside the file -- and then reads exactly that many bytes per tensor, so
memory is bounded by what the tensors declare and the files really hold.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

__all__ = ["external_tensors", "load_external_data", "tensor_nbytes"]

#: bits per element of the packed sub-byte types (ONNX stores two 4-bit values per byte)
_PACKED_BITS = {"INT4": 4, "UINT4": 4, "FLOAT4E2M1": 4, "INT2": 2, "UINT2": 2}


def tensor_nbytes(t: Any) -> int:
    """The bytes ``t``'s data takes by its declared dims and type (``ValueError`` for a type
    whose data has no fixed size, such as STRING, or a negative dimension).

    Example:
        >>> from onnx import TensorProto, helper
        >>> tensor_nbytes(helper.make_tensor("w", TensorProto.FLOAT, [2, 10], [0.0] * 20))
        80
    """
    from onnx import TensorProto, helper

    if any(d < 0 for d in t.dims):
        raise ValueError(f"negative dimension in its shape {list(t.dims)}")
    count = 1
    for d in t.dims:  # Python ints: no overflow, whatever the file claims
        count *= int(d)
    packed = {getattr(TensorProto, k, None): b for k, b in _PACKED_BITS.items()}
    if t.data_type in packed:
        return (count * packed[t.data_type] + 7) // 8
    if t.data_type in (TensorProto.STRING, TensorProto.UNDEFINED):
        raise ValueError("a STRING or untyped tensor cannot be stored as external data")
    try:
        import numpy as np

        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"unknown data type {t.data_type}") from None
    return count * itemsize


def external_tensors(model: Any) -> Iterator[Any]:
    """Every TensorProto of ``model`` stored as external data: initializers, sparse
    initializers, and tensor attributes of nodes (subgraphs included)."""
    from onnx import AttributeProto, TensorProto

    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        tensors = list(graph.initializer)
        for sparse in graph.sparse_initializer:
            tensors += [sparse.values, sparse.indices]
        for node in graph.node:
            for a in node.attribute:
                if a.type == AttributeProto.TENSOR:
                    tensors.append(a.t)
                elif a.type == AttributeProto.TENSORS:
                    tensors.extend(a.tensors)
                elif a.type == AttributeProto.GRAPH:
                    graphs.append(a.g)
                elif a.type == AttributeProto.GRAPHS:
                    graphs.extend(a.graphs)
        yield from (t for t in tensors if t.data_location == TensorProto.EXTERNAL)


def load_external_data(model: Any, path: str | Path) -> None:
    """Check, then read, the external data of ``model`` (loaded from ``path`` without it).

    Raises:
        ValueError: one line naming the tensor and the file: a location that is absolute, climbs
            out of the model's folder (``..``, a symlink), is missing or not a regular file; an
            offset or length that is not a whole number, a length other than the tensor's size,
            data past the end of the file, or more data than this machine's memory.
    """
    folder = Path(path).resolve().parent
    records = [(t, _record(t, folder)) for t in external_tensors(model)]
    total = sum(size for _, (_, _, size) in records)
    memory = _physical_memory()
    if memory and total > memory:
        raise ValueError(
            f"its external data declares {total} bytes, more than this machine's memory "
            f"({memory} bytes)"
        )
    for t, (file, offset, size) in records:
        t.raw_data = _read(t.name, file, offset, size)
        del t.external_data[:]
        t.data_location = 0  # TensorProto.DEFAULT


def _record(t: Any, folder: Path) -> tuple[Path, int, int]:
    """(file, offset, size) of ``t``'s external data, checked against its shape and file."""
    info = {e.key: e.value for e in t.external_data}
    name = t.name
    location = info.get("location", "")
    if not location:
        raise ValueError(f"tensor {name!r}: external data without a location")
    if "\x00" in location:
        raise ValueError(f"tensor {name!r}: external data location {location!r} holds a NUL byte")
    pure = PurePosixPath(location.replace("\\", "/"))
    if pure.is_absolute() or PureWindowsPath(location).is_absolute() or ".." in pure.parts:
        raise ValueError(
            f"tensor {name!r}: external data location {location!r} is not a relative path "
            "inside the model's folder"
        )
    file = (folder / pure).resolve()
    if not file.is_relative_to(folder):
        raise ValueError(
            f"tensor {name!r}: external data file {location!r} leads out of the model's folder "
            f"(to {file})"
        )
    try:
        st = os.stat(file)
    except OSError:
        raise ValueError(  # worded as onnx's own error was
            f"external data file {location} is missing or not a file (tensor {name!r})"
        ) from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"tensor {name!r}: external data file {location!r} is not a regular file")
    offset = _whole(info.get("offset", "0"), name, "offset", location)
    length = _whole(info["length"], name, "length", location) if "length" in info else None
    try:
        size = tensor_nbytes(t)
    except ValueError as err:
        raise ValueError(f"tensor {name!r}: {err}") from None
    if length is not None and length != size:
        raise ValueError(
            f"tensor {name!r}: external data in {location!r} claims {length} bytes, its shape "
            f"{list(t.dims)} needs {size}: corrupt or tampered"
        )
    if offset + size > st.st_size:
        raise ValueError(
            f"tensor {name!r}: external data in {location!r} ends at byte {offset + size}, past "
            f"the end of the file ({st.st_size} bytes): truncated or corrupt"
        )
    if length is None and st.st_size - offset != size:  # no length: the rest of the file
        raise ValueError(
            f"tensor {name!r}: external data in {location!r} holds {st.st_size - offset} bytes "
            f"from offset {offset} to the end of the file (no length given), its shape "
            f"{list(t.dims)} needs {size}: corrupt or tampered"
        )
    return file, offset, size


def _whole(text: str, name: str, key: str, location: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(
            f"tensor {name!r}: external data {key} {text!r} in {location!r} is not a whole number"
        )
    return value


def _read(name: str, file: Path, offset: int, size: int) -> bytes:
    with open(file, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # replaced since it was checked
            raise ValueError(f"tensor {name!r}: external data file {file} is not a regular file")
        f.seek(offset)
        data = f.read(size)
    if len(data) != size:
        raise ValueError(
            f"tensor {name!r}: external data file {file} holds {len(data)} of the {size} bytes "
            "its shape needs"
        )
    return data


def _physical_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):
        return 0
