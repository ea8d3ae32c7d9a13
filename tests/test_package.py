"""Package hygiene: light imports, public API, version."""

from __future__ import annotations

import subprocess
import sys

import qdq


def test_import_does_not_pull_optional_backends() -> None:
    code = (
        "import sys, qdq; "
        "heavy = [m for m in ('onnxruntime', 'onnx', 'tensorrt', 'torchvision', 'scipy') "
        "if m in sys.modules]; print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_public_api() -> None:
    for name in qdq.__all__:
        assert hasattr(qdq, name), name
    assert qdq.__version__.count(".") == 2


def test_import_asks_openmp_to_wait_passively_unless_told_otherwise() -> None:
    """Before torch loads OpenMP, ``import qdq`` sets OMP_WAIT_POLICY=PASSIVE (spinning threads
    halve throughput on a shared CPU: qdq._threads); a user's own value, or torch loaded first,
    is left alone."""
    import os

    code = "import os, {}; print(os.environ.get('OMP_WAIT_POLICY'))"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}

    def policy(modules: str, **extra: str) -> str:
        out = subprocess.run([sys.executable, "-c", code.format(modules)], env={**env, **extra},
                             capture_output=True, text=True, check=True)  # fmt: skip
        return out.stdout.strip()

    assert policy("qdq") == "PASSIVE"
    assert policy("qdq", OMP_WAIT_POLICY="ACTIVE") == "ACTIVE"
    assert policy("torch, qdq") == "None"
