"""``qdq quantize`` as users run it (a subprocess) on the classifier rows of the real-model suite,
and on a ``.pt2`` (issue 31).

Every timm row of ``tests/models/real.py`` (random weights) is given as ``factory.py:build`` with a
folder of 8 images; the detector and segmenter rows are in ``test_real_models_quantize_dense.py``
(two files: ``--dist loadfile`` runs them on both workers). The helpers, sizes and the exporter
choice are in ``tests/real_quantize.py``. Run with ``-s`` for one line per row.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from models.real import ARCHS
from real_quantize import arch_params, check, quantize_cli, record, run_row, write_images

pytest.importorskip("onnxruntime")
pytest.importorskip("PIL")

ROWS = [name for name, arch in ARCHS.items() if arch.family == "timm"]


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_images(tmp_path_factory.mktemp("images"))


@pytest.mark.parametrize("name", arch_params(ROWS))
def test_quantize_cli_on_real_classifier(name: str, images: Path, tmp_path: Path) -> None:
    report = run_row(name, images, tmp_path)
    assert report["data"]["input_shape"][0] == 3
    assert report["metric_name"] == "top1_agreement"  # (N, 1000) logits, no labels


def test_quantize_cli_on_pt2(images: Path, tmp_path: Path) -> None:
    """A ``torch.export`` program of ResNet-18 with a static batch of 1, as most users export."""
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = tv.models.resnet18(weights=None).eval()
    pt2 = tmp_path / "resnet18.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(1, 3, 64, 64),)), str(pt2))
    run = quantize_cli(str(pt2), images, 64, tmp_path / "out")
    record("resnet18.pt2", 64, run)
    report = check(run)
    assert report["model"]["kind"] == "pt2" and report["model"]["static_batch"] == 1
    assert report["settings"]["batch_size"] == 1  # the program's static batch, not --batch-size
    assert report["metric_name"] == "top1_agreement"
