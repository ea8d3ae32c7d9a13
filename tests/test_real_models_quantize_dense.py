"""``qdq quantize`` as users run it (a subprocess) on the detector and segmenter rows of the
real-model suite (issue 31): ultralytics YOLO (train and export forms, detect/segment/pose),
segmentation-models-pytorch's U-Net and torchvision's RetinaNet head, DeepLabV3 and the whole
Faster/Keypoint R-CNN models.

Each row is given as ``factory.py:build`` with a folder of 8 images; the classifier rows and the
``.pt2`` are in ``test_real_models_quantize.py``. The helpers, sizes and the exporter choice are in
``tests/real_quantize.py``. Run with ``-s`` for one line per row.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from models.real import ARCHS
from real_quantize import REFUSED, arch_params, run_row, write_images

pytest.importorskip("onnxruntime")
pytest.importorskip("PIL")

# diffusers rows take latents, timesteps and text states, not images (tests/test_real_models.py)
_NOT_IMAGES = ("timm", "transformers", "diffusers")
ROWS = [name for name, arch in ARCHS.items() if arch.family not in _NOT_IMAGES]


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_images(tmp_path_factory.mktemp("images"))


@pytest.mark.parametrize("name", arch_params(ROWS))
def test_quantize_cli_on_real_dense_model(name: str, images: Path, tmp_path: Path) -> None:
    report = run_row(name, images, tmp_path)
    if name in REFUSED:
        return  # refused at the check stage, as run_row asserted
    assert report["data"]["input_shape"] == [3, 64, 64]
    if ARCHS[name].family == "yolo":  # detect, seg and pose heads: boxes, not a top-1
        assert report["metric_name"] == "box_agreement"
    per_image = "rcnn" in name  # detection lists after NMS: batch 1, detections matched
    assert report["per_image"] is per_image
    if per_image:
        assert report["metric_name"] == "detection_f1" and report["settings"]["batch_size"] == 1
        assert report["outputs"][0]["kind"] == "detection_list", report["outputs"][0]
        assert 0.0 <= report["int8_metric"] <= 1.0 and report["fp32_metric"] == 1.0
