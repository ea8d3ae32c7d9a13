"""Command-line specs for a model and its data (shared by the ``qdq`` sub-commands).

* A **model spec** names a factory: ``pkg.module:factory`` (imported) or ``path/to/file.py:factory``
  (the file is executed). The factory is called with no arguments and must return an
  ``nn.Module``; an ``nn.Module`` object named by the spec is used as is. Loading a spec runs
  the user's code, exactly as ``python -c "import ..."`` would. :func:`load_attribute` resolves
  the same two forms to any object (``qdq quantize --metric file.py:fn``).
* A **data spec** is a ``.npy`` file (one array: the samples stacked along axis 0) or a ``.npz``
  file (every array in stored order, each stacked along axis 0). Floating arrays become float32
  tensors; other dtypes keep theirs.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import torch
from torch import nn

__all__ = ["load_arrays", "load_attribute", "load_data_spec", "load_model_spec"]


def load_model_spec(spec: str) -> nn.Module:
    """Build the model a spec names (this executes user code).

    Args:
        spec: ``pkg.module:factory`` or ``path/to/file.py:factory``; ``factory`` may be dotted
            (``module:Class.build``).

    Returns:
        The ``nn.Module`` the factory returns, in eval mode.

    Raises:
        ValueError: the spec is malformed, or the module has no such attribute.
        FileNotFoundError: a ``.py`` path that does not exist.
        TypeError: the factory is not callable or does not return an ``nn.Module``.

    Example:
        >>> load_model_spec("torch.nn:Identity")
        Identity()
    """
    obj = load_attribute(spec, "model", "factory")
    attr = spec.rpartition(":")[2]
    if not isinstance(obj, nn.Module):
        if not callable(obj):
            raise TypeError(f"model spec {spec!r}: {attr} is not callable nor an nn.Module")
        obj = obj()
    if not isinstance(obj, nn.Module):
        raise TypeError(
            f"model spec {spec!r}: {attr}() returned {type(obj).__name__}, not an nn.Module"
        )
    return obj.eval()


def load_attribute(spec: str, what: str = "model", attribute: str = "factory") -> object:
    """The object a ``pkg.module:name`` or ``path/to/file.py:name`` spec names (this imports or
    executes user code). Shared by model specs and ``qdq quantize --metric``.

    Args:
        spec: ``pkg.module:name`` or ``path/to/file.py:name``; ``name`` may be dotted
            (``module:Class.build``).
        what: what the spec is for, in error messages (``"model"``, ``"metric"``).
        attribute: what ``name`` is, in error messages (``"factory"``, ``"fn"``).

    Raises:
        TypeError: ``spec`` is not a string.
        ValueError: the spec is malformed, the module cannot be imported or loaded, or it has no
            such attribute.
        FileNotFoundError: a ``.py`` path that does not exist.

    Example:
        >>> load_attribute("math:sqrt", "metric", "fn")
        <built-in function sqrt>
    """
    if not isinstance(spec, str):
        raise TypeError(f"{what} spec must be a string, got {type(spec).__name__}")
    source, sep, attr = spec.rpartition(":")
    if not sep or not source or not attr:
        raise ValueError(
            f"{what} spec {spec!r} must be 'pkg.module:{attribute}' or "
            f"'path/to/file.py:{attribute}'"
        )
    module = _module_from_file(source, what) if _is_path(source) else _import(source, spec, what)
    obj: object = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{what} spec {spec!r}: {source} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def load_data_spec(spec: str | Path, *, batch_size: int | None = None) -> list[torch.Tensor]:
    """Load the batches a ``.npy``/``.npz`` data spec holds.

    Args:
        spec: a ``.npy`` file (one array) or a ``.npz`` file (its arrays in stored order).
        batch_size: split every array along axis 0 into batches of at most this many samples
            (default: one batch per array).

    Returns:
        A list of tensors, the model's single input batch by batch.

    Raises:
        FileNotFoundError: no such file.
        ValueError: another suffix, an unreadable or empty file, a 0-d array, or a bad
            ``batch_size``.

    Example:
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "x.npy")
        >>> np.save(path, np.zeros((5, 3), dtype=np.float64))
        >>> [tuple(b.shape) for b in load_data_spec(path, batch_size=2)]
        [(2, 3), (2, 3), (1, 3)]
    """
    if batch_size is not None and (isinstance(batch_size, bool) or batch_size < 1):
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    path = Path(spec)
    arrays = [
        (str(path) if key is None else f"{path}[{key}]", array)
        for key, array in load_arrays(spec).items()
    ]
    batches: list[torch.Tensor] = []
    for name, array in arrays:
        if array.ndim == 0 or array.shape[0] == 0:
            raise ValueError(f"{name} has shape {array.shape}: expected samples along axis 0")
        t = torch.from_numpy(np.ascontiguousarray(array))
        if t.is_floating_point():
            t = t.to(torch.float32)
        step = batch_size or t.shape[0]
        batches.extend(t[i : i + step] for i in range(0, t.shape[0], step))
    return batches


def load_arrays(spec: str | Path) -> dict[str | None, np.ndarray]:
    """The arrays of a ``.npy`` (key ``None``) or ``.npz`` file (its keys, in stored order).

    Raises:
        FileNotFoundError: no such file.
        ValueError: another suffix, an unreadable file, pickled/object or non-numeric arrays,
            sizes past :mod:`qdq._limits` (all checked from the headers before reading), or no
            arrays.

    Example:
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "d.npz")
        >>> np.savez(path, x=np.zeros((4, 2)), y=np.arange(4))
        >>> {k: v.shape for k, v in load_arrays(path).items()}
        {'x': (4, 2), 'y': (4,)}
    """
    path = Path(spec)
    if path.suffix not in (".npy", ".npz"):
        raise ValueError(f"data spec {str(spec)!r} must be a .npy or .npz file")
    if not path.is_file():
        if path.exists():
            raise ValueError(f"data file {path} is not a regular file")
        raise FileNotFoundError(f"no data file at {path}")
    from qdq._npfile import read_arrays

    arrays = read_arrays(path)  # headers and sizes checked first; no pickle
    if not arrays:
        raise ValueError(f"data file {path} holds no arrays")
    return arrays


def _is_path(source: str) -> bool:
    return source.endswith(".py") or "/" in source or "\\" in source


def _import(name: str, spec: str, what: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        raise ValueError(f"{what} spec {spec!r}: cannot import {name!r} ({err})") from None


def _module_from_file(source: str, what: str) -> ModuleType:
    path = Path(source).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no {what} file at {source}")
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
    name = f"qdq_user_{what}_{digest}"
    loader_spec = importlib.util.spec_from_file_location(name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise ValueError(f"cannot load {source} as a Python module")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    try:
        loader_spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module
