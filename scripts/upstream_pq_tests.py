"""Run NVIDIA's own pytorch-quantization unit tests against qdq's compat layer (the alias).

The tests are the specification of ``qdq.compat.pytorch_quantization`` (issue 59). They are not part
of qdq: fetch the TensorRT repository (``tools/pytorch-quantization``, 2.2.1) and point this script
at that folder. Its ``tests/`` and ``examples/`` are copied to a temporary folder (so the real
package beside them is never imported), ``qdq.compat.install_alias()`` runs before collection, and
pytest prints its usual summary; ``--json F`` writes the counts per file and the failing test ids.

``--cuda-as-cpu`` runs the tests written for a GPU on the CPU: ``Tensor.cuda()``/``Module.cuda()``
return the CPU tensor/module, ``torch.set_default_tensor_type('torch.cuda.FloatTensor')`` sets
the CPU type, ``device="cuda"`` given to torch's tensor factories or ``Tensor.to`` means the
CPU, ``torch.load`` maps to the CPU and ``torch.cuda.device(i)`` does nothing. It checks the
arithmetic those tests assert, not CUDA itself (``scripts/gpu_check.sh`` does
that on a GPU).

Usage::

    python scripts/upstream_pq_tests.py /path/to/TensorRT/tools/pytorch-quantization \
        [--cuda-as-cpu] [--json counts.json] [-- extra pytest args]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any


class _Harness:
    """A pytest plugin: the alias before collection, optional CUDA→CPU mapping, outcome counts."""

    def __init__(self, cuda_as_cpu: bool) -> None:
        self.cuda_as_cpu = cuda_as_cpu
        self.outcomes: dict[str, Counter[str]] = defaultdict(Counter)
        self.failed: list[str] = []

    def pytest_configure(self, config: Any) -> None:
        import qdq.compat

        qdq.compat.install_alias()
        if self.cuda_as_cpu:
            _map_cuda_to_cpu()

    def pytest_runtest_logreport(self, report: Any) -> None:
        file = report.nodeid.split("::")[0]
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            outcome = report.outcome
            if hasattr(report, "wasxfail"):
                outcome = "xfailed" if report.skipped else "xpassed"
            self.outcomes[file][outcome] += 1
            if outcome == "failed":
                self.failed.append(report.nodeid)

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            self.outcomes[report.nodeid or "<collection>"]["collection error"] += 1
            self.failed.append(report.nodeid)


def _map_cuda_to_cpu() -> None:
    import torch

    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign,assignment]
    torch.nn.Module.cuda = lambda self, *a, **k: self  # type: ignore[method-assign,assignment]
    original = torch.set_default_tensor_type

    def set_default_tensor_type(t: Any) -> None:
        if isinstance(t, str):
            t = t.replace("torch.cuda.", "torch.")
        original(t)

    torch.set_default_tensor_type = set_default_tensor_type  # type: ignore[assignment]

    def _cpu(device: Any) -> Any:
        is_cuda = str(device).startswith("cuda")
        return "cpu" if is_cuda else device

    def _factory(fn: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if "device" in kwargs:
                kwargs["device"] = _cpu(kwargs["device"])
            return fn(*args, **kwargs)

        return wrapped

    for name in _FACTORIES:
        setattr(torch, name, _factory(getattr(torch, name)))
    tensor_to = torch.Tensor.to

    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        args = tuple(_cpu(a) if isinstance(a, (str, torch.device)) else a for a in args)
        if "device" in kwargs:
            kwargs["device"] = _cpu(kwargs["device"])
        return tensor_to(self, *args, **kwargs)

    torch.Tensor.to = to  # type: ignore[method-assign,assignment]
    load = torch.load

    def load_on_cpu(*args: Any, **kwargs: Any) -> Any:  # the RNN test vectors are CUDA tensors
        kwargs.setdefault("map_location", "cpu")
        return load(*args, **kwargs)

    torch.load = load_on_cpu
    torch.cuda.device = lambda *a, **k: contextlib.nullcontext()  # type: ignore[assignment,misc]


#: torch factories whose ``device="cuda"`` ``--cuda-as-cpu`` maps to the CPU.
_FACTORIES = (
    "tensor",
    "as_tensor",
    "randn",
    "rand",
    "randint",
    "randn_like",
    "rand_like",
    "zeros",
    "ones",
    "empty",
    "full",
    "arange",
    "linspace",
    "eye",
    "randperm",
    "zeros_like",
    "ones_like",
    "empty_like",
    "full_like",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package_dir", type=Path, help="TensorRT/tools/pytorch-quantization")
    parser.add_argument("--cuda-as-cpu", action="store_true")
    parser.add_argument("--json", type=Path, help="write counts per file and failures here")
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: len(argv) - len(extra) - (1 if extra else 0)])
    if args.json:
        args.json = args.json.resolve()
    tests = args.package_dir / "tests"
    if not (tests / "tensor_quant_test.py").is_file():
        parser.error(f"{args.package_dir} has no tests/tensor_quant_test.py")
    import pytest

    with tempfile.TemporaryDirectory(prefix="upstream-pq-") as tmp:
        root = Path(tmp)
        shutil.copytree(tests, root / "tests")
        if (args.package_dir / "examples").is_dir():
            shutil.copytree(args.package_dir / "examples", root / "examples")
        (root / "pytest.ini").write_text("[pytest]\n")
        sys.path.insert(0, str(root))
        cwd = os.getcwd()
        os.chdir(root)  # the tests open data files by paths relative to the package folder
        harness = _Harness(args.cuda_as_cpu)
        rc = pytest.main(
            [
                "-q",
                "-p",
                "no:cacheprovider",
                "--continue-on-collection-errors",
                "--rootdir",
                str(root),
                str(root / "tests"),
                *extra,
            ],
            plugins=[harness],
        )
        os.chdir(cwd)
    totals: Counter[str] = Counter()
    for counts in harness.outcomes.values():
        totals.update(counts)
    print("totals:", dict(totals))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "totals": dict(totals),
                    "per_file": {f: dict(c) for f, c in sorted(harness.outcomes.items())},
                    "failed": harness.failed,
                },
                indent=1,
            )
        )
    return int(rc)


if __name__ == "__main__":
    sys.exit(main())
