"""Every module, name and signature of NVIDIA pytorch-quantization 2.2.1 exists under the alias.

``tests/fixtures/pytorch_quantization_api.json`` lists the package's API (read from its source by
``scripts/pq_api_snapshot.py``: modules, functions, classes, public methods and ``__init__`` with
their parameter names in order). A script written for the package imports these modules and passes
these arguments by position or by name: each must resolve to qdq's implementation.
"""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path
from typing import Any

import pytest

import qdq.compat

_SNAPSHOT = json.loads(
    (Path(__file__).parent / "fixtures" / "pytorch_quantization_api.json").read_text()
)
_IMPLICIT = {"self", "cls", "ctx"}
#: Where qdq's signature differs on purpose, and why.
_DIFFERENT = {
    # upstream's private base mirrors torch's _ConvTransposeNd(…, dilation, transposed, …); qdq's
    # quant convolutions subclass torch's public ConvTranspose classes instead (so
    # isinstance(m, nn.ConvTranspose2d) holds) and take their arguments
    "pytorch_quantization.nn.modules.quant_conv._QuantConvTransposeNd.__init__",
}


@pytest.fixture(scope="module", autouse=True)
def _alias() -> Any:
    qdq.compat.install_alias()
    yield
    qdq.compat.uninstall_alias()


def _entries() -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (module, name, info)
        for module, names in sorted(_SNAPSHOT["modules"].items())
        for name, info in sorted(names.items())
    ]


def _check_params(fn: Any, upstream: list[str], label: str) -> None:
    try:
        ours = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: nothing to compare
        return
    kinds = {p.kind for p in ours.values()}
    names = [n for n in ours if n not in _IMPLICIT]
    wanted = [p for p in upstream if not p.startswith("*") and p not in _IMPLICIT]
    if inspect.Parameter.VAR_KEYWORD not in kinds:
        missing = [p for p in wanted if p not in names]
        assert not missing, f"{label}: upstream's parameters {missing} are not accepted"
    if inspect.Parameter.VAR_POSITIONAL not in kinds:
        positional = [
            n for n, p in ours.items()
            if n not in _IMPLICIT
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]  # fmt: skip
        common = [p for p in wanted if p in positional]
        assert positional[: len(common)] == common, (
            f"{label}: positional order {positional} differs from upstream's {wanted}"
        )


def test_snapshot_is_the_last_release() -> None:
    assert _SNAPSHOT["version"] == "2.2.1"
    assert len(_SNAPSHOT["modules"]) >= 25


@pytest.mark.parametrize("module", sorted(_SNAPSHOT["modules"]))
def test_every_module_imports_under_the_alias(module: str) -> None:
    mod = importlib.import_module(module)
    assert mod.__name__.startswith("qdq.compat.pytorch_quantization")


def test_every_name_and_signature() -> None:
    problems: list[str] = []
    for module, name, info in _entries():
        mod = importlib.import_module(module)
        if not hasattr(mod, name):
            problems.append(f"{module}.{name} is missing")
            continue
        obj = getattr(mod, name)
        try:
            if info["kind"] == "function":
                _check_params(obj, info["params"], f"{module}.{name}")
            elif info["kind"] == "class":
                for method, params in info["methods"].items():
                    label = f"{module}.{name}.{method}"
                    if not hasattr(obj, method):
                        problems.append(f"{label} is missing")
                    elif label not in _DIFFERENT and not isinstance(
                        inspect.getattr_static(obj, method), property
                    ):
                        _check_params(getattr(obj, method), params, label)
        except AssertionError as err:
            problems.append(str(err))
    assert not problems, "\n".join(problems)


def test_the_check_catches_a_missing_parameter() -> None:
    def narrower(inputs: Any, amax: Any) -> None: ...

    with pytest.raises(AssertionError, match="num_bits"):
        _check_params(narrower, ["inputs", "amax", "num_bits"], "f")
    with pytest.raises(AssertionError, match="order"):
        _check_params(lambda amax, inputs: None, ["inputs", "amax"], "g")
