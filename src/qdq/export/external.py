"""ONNX files past protobuf's 2 GB limit: the weights in an external-data file beside the ONNX.

Protobuf cannot serialize (nor parse) a message of 2 GiB or more, so a model with more than about
500 M float32 parameters (torchvision's ``regnet_y_128gf``, ``vit_h_14``) cannot be one ``.onnx``
file. :func:`qdq.export_onnx` then writes ``m.onnx`` (the graph, the Q/DQ scales and zero points,
every initializer under :data:`SIDECAR_MIN_BYTES`) and ``m.onnx.data`` beside it (every larger
initializer; ``m.onnx`` names it by its relative location ``m.onnx.data``, so the pair can be
moved together). ONNX Runtime, TensorRT's ONNX parser, ``onnx.load`` and ``qdq lint`` read such a
pair from the ``.onnx`` path. A model under :data:`EXTERNAL_DATA_THRESHOLD` stays one file.

The pair is written through a :class:`Staging` directory beside the target (same file system):
``onnx`` writes both files there under their final names, the export is checked from there
(``onnx.checker`` and ONNX Runtime from the path), and both are then moved into place with the
manifest as one unit (:func:`qdq._io.atomic_move_files`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from qdq._io import _file_mode, proto_byte_size

__all__ = [
    "EXTERNAL_DATA_THRESHOLD",
    "SIDECAR_MIN_BYTES",
    "SIDECAR_SUFFIX",
    "Staging",
    "has_external_data",
    "save_external",
    "sha256_of_file",
    "sidecar_for",
    "too_large",
]

#: A model whose serialized size (``ModelProto.ByteSize()``) exceeds this is written with external
#: data. Protobuf's limit is 2 GiB; the margin (about 147 MB) leaves room for the graph edits of
#: later stages (parity's per-layer outputs) on a model just below it.
EXTERNAL_DATA_THRESHOLD = 2_000_000_000
#: Initializers of at least this many bytes go to the external-data file; smaller ones stay in
#: the ``.onnx``: shapes, zero points and the Q/DQ scales (per-channel up to 16,384 channels), so
#: the graph and its quantization are readable without the data file.
SIDECAR_MIN_BYTES = 65536
#: Appended to the full ONNX file name: ``m.onnx`` → ``m.onnx.data``.
SIDECAR_SUFFIX = ".data"


def sidecar_for(onnx_path: str | Path) -> Path:
    """The external-data file qdq writes beside ``onnx_path``.

    Example:
        >>> sidecar_for("out/m.onnx").name
        'm.onnx.data'
    """
    p = Path(onnx_path)
    return p.with_name(p.name + SIDECAR_SUFFIX)


def too_large(model: Any) -> bool:
    """Whether ``model`` (an ``onnx.ModelProto``) must be written with external data."""
    return proto_byte_size(model) > EXTERNAL_DATA_THRESHOLD


def has_external_data(model: Any) -> bool:
    """Whether any initializer of ``model`` refers to an external-data file."""
    from onnx import TensorProto

    return any(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer)


def save_external(model: Any, path: Path) -> Path | None:
    """Write ``model`` to ``path`` with its large initializers in :func:`sidecar_for` ``(path)``;
    return the data file's path (``None`` when no initializer reached :data:`SIDECAR_MIN_BYTES`).

    ``model`` is changed in place: its large initializers now refer to the data file and hold no
    data (so it serializes in a few megabytes).
    """
    import onnx

    sidecar = sidecar_for(path)
    sidecar.unlink(missing_ok=True)  # onnx appends to an existing data file
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=sidecar.name,
        size_threshold=SIDECAR_MIN_BYTES,
    )
    for written in (path, sidecar):  # onnx creates the data file 0600: give both open()'s mode
        if written.exists():
            written.chmod(_file_mode())
            with open(written, "rb") as fh:  # on disk before it is moved into place
                os.fsync(fh.fileno())
    return sidecar if sidecar.exists() else None


def sha256_of_file(path: str | Path, chunk: int = 1 << 24) -> str:
    """Hex SHA-256 of a file, read in chunks (a data file may be larger than memory allows)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


class Staging:
    """A temporary directory beside ``target`` (same file system, so moving out of it is a
    rename); removed with whatever is left in it on :meth:`close`.

    Example:
        >>> import tempfile, os
        >>> with Staging(os.path.join(tempfile.mkdtemp(), "m.onnx")) as s:
        ...     s.path("m.onnx").parent.is_dir()
        True
    """

    def __init__(self, target: str | Path) -> None:
        target = Path(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))

    def path(self, name: str) -> Path:
        """A file of that name in the staging directory."""
        return self.dir / name

    def close(self) -> None:
        """Remove the directory and what is left in it."""
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
