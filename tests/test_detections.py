"""Per-image detection lists (``qdq.pipeline.detections``, ``qdq.pipeline.per_image``): the
greedy matching and its figures on synthetic lists, empty lists, and the per-quantizer export
check of a small per-image detector (a wrong scale or wrong weights in the ONNX fail it)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from qdq.pipeline.detections import box_iou, detection_agreement, match
from qdq.pipeline.per_image import compare_lists, per_image_keys


def _dets(k: int = 20, seed: int = 0, labels: bool = True) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(k, 2, generator=g) * 200
    wh = torch.rand(k, 2, generator=g) * 40 + 10
    out = {
        "boxes": torch.cat([xy, xy + wh], dim=1),
        "scores": torch.rand(k, generator=g).sort(descending=True).values,
    }
    if labels:
        out["labels"] = torch.randint(1, 5, (k,), generator=g)
    return out


def test_equal_lists_agree_fully_and_noise_keeps_them_matched() -> None:
    ref = [_dets(seed=i) for i in range(3)]
    same = detection_agreement(ref, ref)
    assert same["detection_f1"] == same["recall"] == same["precision"] == 1.0
    assert same["mean_iou"] == 1.0 and same["score_delta"] == 0.0 and same["top10_recall"] == 1.0
    # rounding-level noise on boxes and scores, and the order shuffled: still every box matched
    g = torch.Generator().manual_seed(1)
    noisy = []
    for r in ref:
        perm = torch.randperm(20, generator=g)
        noisy.append({k: v[perm] for k, v in r.items()})
        noisy[-1]["boxes"] = noisy[-1]["boxes"] + 1e-3 * torch.randn(20, 4, generator=g)
        noisy[-1]["scores"] = noisy[-1]["scores"] + 1e-4
    close = detection_agreement(noisy, ref)
    assert close["detection_f1"] == 1.0 and close["mean_iou"] > 0.999
    assert close["score_delta"] == pytest.approx(1e-4, rel=1e-2)


def test_a_moved_box_a_wrong_label_and_a_missing_box_are_not_matched() -> None:
    ref = _dets(k=10)
    out = {k: v.clone() for k, v in ref.items()}
    out["boxes"][0] += 60  # moved well beyond IoU 0.5
    out["labels"][1] = 99  # another class
    out = {k: v[:-1] for k, v in out.items()}  # FP32's lowest-scoring box is missing
    m = match(out, ref)
    assert m.count_out == 9 and m.count_ref == 10 and len(m.pairs) == 7
    figures = detection_agreement([out], [ref])
    assert figures["detection_f1"] == pytest.approx(2 * 7 / 19)
    assert figures["recall"] == pytest.approx(0.7) and figures["precision"] == pytest.approx(7 / 9)
    assert figures["top10_recall"] == pytest.approx(0.7)
    # without labels the relabelled box matches again
    unlabelled = detection_agreement(
        [{k: v for k, v in out.items() if k != "labels"}], [_dets(k=10, labels=False)]
    )
    assert unlabelled["detection_f1"] < 1.0


def test_empty_lists() -> None:
    empty = {"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0)}
    full = _dets(k=5)
    both = detection_agreement([empty], [empty])
    assert both["detection_f1"] == both["recall"] == both["precision"] == 1.0
    assert both["mean_iou"] is None and both["score_delta"] is None
    assert detection_agreement([empty], [full])["detection_f1"] == 0.0
    lost = detection_agreement([full], [empty])
    assert lost["detection_f1"] == 0.0 and lost["recall"] == 1.0 and lost["precision"] == 0.0
    mixed = detection_agreement([empty, full], [empty, full])
    assert mixed["detection_f1"] == 1.0 and mixed["detections_fp32"] == 2.5
    score, rows = compare_lists([empty, full], [full, full], ["boxes", "scores", "labels"])
    assert score["metric"] == 0.5 and score["cosine_min"] == 0.0 and score["cosine_mean"] == 0.5
    assert [r["kind"] for r in rows] == ["detection_list", "tensor", "tensor"]
    assert rows[0]["headline"] and rows[0]["shape"] == ["k", 4]


def test_box_iou_and_keypoints() -> None:
    a = torch.tensor([[0.0, 0, 10, 10], [5, 5, 5, 5]])
    iou = box_iou(a, a)
    assert iou[0, 0] == 1.0 and iou[1, 1] == 1.0 and iou[0, 1] == 0.0  # equal empty boxes: 1
    ref = {"boxes": a[:1], "scores": torch.ones(1), "keypoints": torch.zeros(1, 17, 3)}
    out = {**ref, "keypoints": ref["keypoints"] + torch.tensor([3.0, 4.0, 0.0])}
    assert detection_agreement([out], [ref])["keypoint_error"] == pytest.approx(5.0)


def test_per_image_outputs_are_recognised() -> None:
    d = _dets(k=3)
    assert per_image_keys([d, _dets(k=5)], 2) == ("boxes", "scores", "labels")
    assert per_image_keys([d], 2) is None  # one dict for two images
    assert per_image_keys([{"boxes": d["boxes"]}], 1) is None  # no scores
    assert per_image_keys(d["boxes"], 1) is None


class TinyDetector(torch.nn.Module):
    """A per-image detector: a conv head scores a 4x4 grid of fixed boxes per image; the boxes
    above a score threshold are kept (a varying count), as torchvision's R-CNNs return them."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(16, 16, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(16, 5, 4, 4),
        )
        for p in self.body.parameters():
            torch.nn.init.normal_(p, std=0.3, generator=g)
        cells = torch.arange(4.0) * 4
        y, x = torch.meshgrid(cells, cells, indexing="ij")
        self.register_buffer("anchors", torch.stack([x, y, x + 4, y + 4], -1).reshape(-1, 4))

    def forward(self, images: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        head = self.body(images).flatten(2).transpose(1, 2)  # (N, 16, 5)
        out = []
        for h in head:
            scores = h[:, 4].sigmoid()
            keep = scores > 0.3
            out.append({"boxes": (self.anchors + h[:, :4])[keep], "scores": scores[keep]})
        return out


def _perturbed(path: Path, out: Path, what: str) -> Path:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    inits = {i.name: i for i in model.graph.initializer}
    if what == "scale":  # the first activation quantizer's scale, 1.5x
        q = next(n for n in model.graph.node if n.op_type == "QuantizeLinear")
        target = inits[q.input[1]]
        value = numpy_helper.to_array(target) * 1.5
    else:  # the first conv's weights, output channels reversed
        target = next(i for i in model.graph.initializer if len(i.dims) == 4)
        value = numpy_helper.to_array(target)[::-1]
    target.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(value), target.name))
    onnx.save(model, str(out))
    return out


def test_export_check_passes_the_export_and_fails_a_wrong_scale_or_wrong_weights(
    tmp_path: Path,
) -> None:
    pytest.importorskip("onnxruntime")
    import qdq
    from qdq.export import ExportError
    from qdq.pipeline.inputs import ForwardInputs
    from qdq.pipeline.per_image import check_export

    x = torch.rand(4, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    model = TinyDetector().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prepared = qdq.prepare(model, (x[:1],))
        qdq.calibrate(prepared, [(x[i : i + 1],) for i in range(4)], show_progress=False)
        exported = qdq.export_onnx(prepared, (x[:1],), tmp_path / "m.onnx",
                                   exporter="torchscript", dynamic_batch=False, verify=False)  # fmt: skip
    forward = ForwardInputs("tensor")
    assert check_export(exported.path, prepared, x, forward) >= 1
    for what in ("weights", "scale"):
        bad = _perturbed(exported.path, tmp_path / f"{what}.onnx", what)
        with pytest.raises(ExportError, match="beyond float rounding"):
            check_export(bad, prepared, x, forward)
