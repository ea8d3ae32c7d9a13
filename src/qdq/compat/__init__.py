"""Compatibility layers for scripts written against other quantization toolkits.

``qdq.compat.pytorch_quantization`` mirrors NVIDIA's ``pytorch_quantization``;
``qdq.compat.recipes`` holds the helpers NVIDIA's recipes copy around (``QuantAdd``, ...). Nothing here is
imported by ``import qdq``; nothing is patched until asked: :func:`install_alias` makes
``import pytorch_quantization`` (and every submodule name under it) resolve to qdq's,
:func:`uninstall_alias` removes it again.

Example:
    >>> import qdq.compat
    >>> qdq.compat.install_alias()
    >>> import pytorch_quantization
    >>> pytorch_quantization.__name__
    'qdq.compat.pytorch_quantization'
    >>> from pytorch_quantization.nn.modules import quant_rnn
    >>> quant_rnn.__name__
    'qdq.compat.pytorch_quantization.nn.modules.quant_rnn'
    >>> qdq.compat.uninstall_alias()
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

__all__ = ["install_alias", "uninstall_alias"]

_TARGET = "qdq.compat.pytorch_quantization"
#: upstream 2.2.1's modules, registered at once by install_alias (others resolve on import).
_SUBMODULES = (
    "",
    ".version",
    ".tensor_quant",
    ".quant_modules",
    ".calib",
    ".calib.calibrator",
    ".calib.max",
    ".calib.histogram",
    ".nn",
    ".nn.functional",
    ".nn._functions",
    ".nn._functions.quant_rnn",
    ".nn.modules",
    ".nn.modules._utils",
    ".nn.modules.tensor_quantizer",
    ".nn.modules.clip",
    ".nn.modules.quant_conv",
    ".nn.modules.quant_linear",
    ".nn.modules.quant_pooling",
    ".nn.modules.quant_rnn",
    ".nn.modules.quant_instancenorm",
    ".utils",
    ".utils.reduce_amax",
    ".utils.quant_logging",
    ".optim",
    ".optim.helper",
    ".cuda_ext",
)


class _AliasLoader(importlib.abc.Loader):
    """Hands out the already-imported qdq module for an alias name (one object, two names)."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return self.module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module was executed under its qdq name."""


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Resolves ``<alias>.x.y`` to ``qdq.compat.pytorch_quantization.x.y`` on import, so a name
    that is not in :data:`_SUBMODULES` (or was not importable when the alias went in) still works."""

    def __init__(self, alias: str) -> None:
        self.alias = alias

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.alias and not fullname.startswith(self.alias + "."):
            return None
        real = _TARGET + fullname[len(self.alias) :]
        try:
            module = importlib.import_module(real)
        except ModuleNotFoundError as err:
            if err.name == real:
                return None  # no such module: the import fails as for any missing name
            raise
        is_package = hasattr(module, "__path__")
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(module), is_package=is_package)


def _finders(name: str) -> list[_AliasFinder]:
    return [f for f in sys.meta_path if isinstance(f, _AliasFinder) and f.alias == name]


def _is_ours(module: ModuleType | None) -> bool:
    return module is not None and getattr(module, "__name__", "").startswith(_TARGET)


def install_alias(name: str = "pytorch_quantization") -> None:
    """Make ``import <name>`` and ``import <name>.<any submodule>`` give qdq's modules.

    Upstream's modules (:data:`_SUBMODULES`) are registered in ``sys.modules`` at once (a module
    whose file is missing is skipped); any other submodule name resolves when imported. Calling it
    again is harmless.

    Raises:
        RuntimeError: a different module is already imported under ``name`` (e.g. the real
            ``pytorch_quantization``); aliasing it would mix two implementations.
    """
    present = sys.modules.get(name)
    if present is not None and present.__name__ != _TARGET:
        raise RuntimeError(
            f"{name!r} is already imported from {getattr(present, '__file__', present)}; "
            "install the alias before anything imports it"
        )
    if not _finders(name):
        sys.meta_path.insert(0, _AliasFinder(name))
    for suffix in _SUBMODULES:
        try:
            sys.modules[name + suffix] = importlib.import_module(_TARGET + suffix)
        except ModuleNotFoundError as err:
            if err.name != _TARGET + suffix:
                raise  # the module exists but one of its own imports is missing: say so


def uninstall_alias(name: str = "pytorch_quantization") -> None:
    """Remove the alias: its import hook and every ``sys.modules`` entry under ``name`` that is one
    of qdq's modules (a real package imported under that name is left alone)."""
    for finder in _finders(name):
        sys.meta_path.remove(finder)
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        if _is_ours(sys.modules.get(key)):
            del sys.modules[key]
