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
