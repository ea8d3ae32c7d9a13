"""Write NVIDIA pytorch-quantization's public API (modules, names, parameter lists) as JSON.

The snapshot is what ``tests/test_compat_pq_api.py`` checks ``qdq.compat.pytorch_quantization``
against: every module of the package, every top-level function, class, public method (and
``__init__``) and module-level value, with the parameter names in order. It is read from the
source with ``ast`` (nothing of the package is imported or copied; only names).

Usage::

    python scripts/pq_api_snapshot.py /path/to/TensorRT/tools/pytorch-quantization \
        tests/fixtures/pytorch_quantization_api.json
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path
from typing import Any

#: Names a module imports for its own use (not the package's API).
_IMPORTED_FOR_USE = {"absl", "logging", "np", "torch", "nn", "F", "Function", "yaml", "math"}


def _params(fn: ast.FunctionDef) -> list[str]:
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    if a.vararg:
        names.append("*" + a.vararg.arg)
    if a.kwarg:
        names.append("**" + a.kwarg.arg)
    return names


def _module_api(tree: ast.Module, is_package: bool) -> dict[str, Any]:
    names: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("__"):
            names[node.name] = {"kind": "function", "params": _params(node)}
        elif isinstance(node, ast.ClassDef):
            methods = {
                b.name: _params(b)
                for b in node.body
                if isinstance(b, ast.FunctionDef)
                and (not b.name.startswith("_") or b.name == "__init__")
            }
            names[node.name] = {"kind": "class", "methods": methods}
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names[target.id] = {"kind": "value"}
        elif isinstance(node, ast.ImportFrom) and is_package:
            for alias in node.names:
                if alias.name != "*" and (alias.asname or alias.name) not in _IMPORTED_FOR_USE:
                    names[alias.asname or alias.name] = {"kind": "import"}
    return names


def snapshot(package_dir: Path) -> dict[str, Any]:
    """``{module: {name: {"kind": ..., "params"/"methods": ...}}}`` of the package's source."""
    root = package_dir / "pytorch_quantization"
    if not (root / "tensor_quant.py").is_file():
        raise FileNotFoundError(f"{package_dir} has no pytorch_quantization/tensor_quant.py")
    api: dict[str, Any] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        module = ".".join(("pytorch_quantization", *parts))
        api[module] = _module_api(ast.parse(path.read_text()), path.name == "__init__.py")
    return api


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package_dir", type=Path, help="TensorRT/tools/pytorch-quantization")
    parser.add_argument("out", type=Path, help="the JSON file to write")
    args = parser.parse_args(argv)
    api = snapshot(args.package_dir)
    version = (args.package_dir / "VERSION").read_text().strip()
    tmp = args.out.with_name(args.out.name + ".partial")
    tmp.write_text(json.dumps({"version": version, "modules": api}, indent=1, sort_keys=True))
    tmp.replace(args.out)
    print(f"{len(api)} modules, {sum(len(v) for v in api.values())} names -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
