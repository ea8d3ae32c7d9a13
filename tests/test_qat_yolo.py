"""An ultralytics YOLOv8n (random weights) fine-tuned with ultralytics' own detection loss on the
qdq-prepared model, then exported: the documented recipe of docs/qat_yolo.md, at a small size."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

import qdq

pytest.importorskip("ultralytics")
pytest.importorskip("onnxruntime")


def _batch(n_images: int, size: int, seed: int) -> dict[str, torch.Tensor]:
    """Synthetic images with a few boxes each, in ultralytics' training-batch layout."""
    g = torch.Generator().manual_seed(seed)
    boxes_per_image = 3
    n = n_images * boxes_per_image
    centre = 0.25 + 0.5 * torch.rand(n, 2, generator=g)
    extent = 0.1 + 0.3 * torch.rand(n, 2, generator=g)
    return {
        "img": torch.rand(n_images, 3, size, size, generator=g),
        "cls": torch.randint(0, 4, (n, 1), generator=g).float(),
        "bboxes": torch.cat([centre, extent], dim=1),  # normalised xywh
        "batch_idx": torch.arange(n_images).repeat_interleave(boxes_per_image).float(),
    }


def test_yolov8n_qat_with_ultralytics_loss_then_export(tmp_path: Path) -> None:
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils import DEFAULT_CFG

    torch.manual_seed(0)
    size = 96
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = DetectionModel("yolov8n.yaml", nc=4, verbose=False).eval()
    x = torch.rand(1, 3, size, size)
    with torch.no_grad():
        model(x)  # the head caches its anchors on the first call, as after ultralytics' own setup
    prepared = qdq.prepare(model, (x,))
    calib = [_batch(2, size, seed)["img"] for seed in (1, 2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # random weights: some activations are all zero
        qdq.calibrate(prepared, calib, method="max", show_progress=False)
    qat = qdq.qat.prepare(prepared)
    qat.args = get_cfg(DEFAULT_CFG)  # the loss gains (box, cls, dfl) ultralytics' trainer sets
    amax = {n: q.amax.clone() for n, q in qdq.quantizers_of(qat).items()}
    weight = qat.model[0].conv.weight.detach().clone()
    hit: set[str] = set()
    hooks = [q.register_forward_hook(lambda m, a, o, n=n: hit.add(n))
             for n, q in qdq.quantizers_of(qat).items()]  # fmt: skip
    opt = torch.optim.AdamW(
        qat.parameters(), lr=1e-3
    )  # ultralytics' optimizer="auto" picks AdamW for short runs
    batch = _batch(2, size, 3)
    for _ in range(2):
        loss, items = qat.loss(batch)  # ultralytics' v8DetectionLoss on training-mode outputs
        assert bool(torch.isfinite(loss).all()) and {"box_loss", "cls_loss", "dfl_loss"} <= set(
            items
        )
        opt.zero_grad()
        loss.sum().backward()
        opt.step()
    for h in hooks:
        h.remove()
    # every quantizer runs in training mode except the DFL decode, which only inference uses
    assert set(qdq.quantizers_of(qat)) - hit == {
        "model.22.dfl.conv.input_quantizer",
        "model.22.dfl.conv.weight_quantizer",
    }
    assert not torch.equal(qat.model[0].conv.weight.detach(), weight)
    for name, q in qdq.quantizers_of(qat).items():
        assert torch.equal(q.amax, amax[name]), name  # frozen

    qat.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = qdq.export_onnx(qat, (x,), tmp_path / "yolov8n.qat.onnx")  # ORT-verified
    assert result.num_quantize > 100
    assert qdq.qat.qat_state(qat) is not None
