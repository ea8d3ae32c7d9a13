"""Every output against FP32 (``qdq.pipeline.outputs``) and the user metric
(``qdq.pipeline.metric``) on synthetic tensors: kinds, figures, headline and errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qdq.pipeline.evaluate import headline, metric_name, score
from qdq.pipeline.metric import load_metric
from qdq.pipeline.outputs import (
    box_agreement,
    compare,
    describe,
    output_kind,
    output_names,
    output_table,
)


def _yolo(n: int = 4, classes: int = 80, anchors: int = 400, seed: int = 0) -> torch.Tensor:
    """A YOLOv8-like head ``(N, 4 + K, A)``: (cx, cy, w, h) in pixels, sigmoid class scores."""
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, anchors, generator=g) * 320
    wh = torch.rand(n, 2, anchors, generator=g) * 40 + 10
    scores = torch.rand(n, classes, anchors, generator=g)
    return torch.cat([xy, wh, scores], dim=1)


def test_kinds_from_shapes_and_scores() -> None:
    y = _yolo()
    assert output_kind(y).name == "detections" and output_kind(y).layout == "rows"
    assert output_kind(y.transpose(1, 2)).layout == "columns"  # YOLOv5's (N, A, 5 + K)
    # YOLOv8 at 64x64: as many anchors as rows (84); the (N, 4 + K, A) layout wins the tie
    tie = _yolo(anchors=84)
    assert output_kind(tie) == output_kind(y)
    # scores outside [0, 1] (raw logits) or too few anchors: not detections
    assert output_kind(torch.randn(2, 84, 400) * 5).name == "tensor"
    assert output_kind(_yolo(anchors=40)).name == "tensor"
    assert output_kind(torch.rand(2, 4, 400)).name == "tensor"  # no class score
    assert output_kind(torch.randn(3, 10)).figure == "top1_agreement"
    assert output_kind(torch.randn(3, 5, 4, 4)).figure == "pixel_agreement"
    assert output_kind(torch.randn(3, 1)).figure == "cosine"
    assert output_kind(torch.randn(3)).figure == "cosine"
    assert output_kind(torch.randn(3, 1, 8, 8)).name == "tensor"  # one channel: no arg-max


def test_detections_equal_give_one_perturbed_less() -> None:
    ref = _yolo()
    same = compare(ref.clone(), ref, output_kind(ref))
    assert same["box_agreement"] == 1.0 and same["topk_overlap"] == 1.0 and same["top_k"] == 40
    assert same["value"] == 1.0 and same["relative_error"] == 0.0 and same["cosine_min"] > 0.9999

    # move the box of every second anchor by its own width: those lose IoU >= 0.5
    out = ref.clone()
    out[:, 0, ::2] += out[:, 2, ::2]
    moved = box_agreement(out, ref, "rows")
    assert 0.3 < moved["box_agreement"] < 0.7 and moved["topk_overlap"] == 1.0

    # another class wins at FP32's top anchors: the same boxes no longer agree
    out = ref.clone()
    top = ref[:, 4:].amax(dim=1).topk(40, dim=1).indices  # (N, 40)
    for n in range(len(ref)):
        out[n, 4:, top[n]] = 0.0  # every score of those anchors drops ...
        out[n, 4, top[n]] = 0.5  # ... but class 0's, which now wins
    swapped = box_agreement(out, ref, "rows")
    expected = float((ref[:, 4:].argmax(dim=1).gather(1, top) == 0).float().mean())
    assert swapped["box_agreement"] == pytest.approx(expected) and expected < 0.1
    assert swapped["topk_overlap"] < 0.5  # their scores fell below other anchors'

    small = ref + 1e-4 * torch.randn(ref.shape, generator=torch.Generator().manual_seed(1))
    assert box_agreement(small, ref, "rows")["box_agreement"] > 0.95
    # the same in YOLOv5's layout
    cols = box_agreement(out.transpose(1, 2), ref.transpose(1, 2), "columns")
    assert cols["box_agreement"] == swapped["box_agreement"] and cols["layout"] == "columns"


def test_box_agreement_refuses_bad_arguments() -> None:
    ref = _yolo(anchors=100)
    with pytest.raises(ValueError, match="layout must be 'rows' or 'columns', got 'nchw'"):
        box_agreement(ref, ref, "nchw")
    with pytest.raises(ValueError, match=r"top_k must be an int in 1..100 .* got 0"):
        box_agreement(ref, ref, "rows", top_k=0)
    with pytest.raises(ValueError, match="two equal 3-D shapes"):
        box_agreement(ref[:, :, :50], ref, "rows")


def test_class_map_and_class_vector_agreement() -> None:
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(2, 5, 4, 4, generator=g)
    out = ref.clone()
    out[0, :, 0, :] = -ref[0, :, 0, :]  # 4 of 32 pixels: the arg-max becomes the arg-min
    row = compare(out, ref, output_kind(ref))
    assert row["kind"] == "class_map" and row["pixel_agreement"] == 28 / 32 == row["value"]

    logits = torch.randn(8, 10, generator=g)
    out = logits.clone()
    out[:3] = -out[:3]
    row = compare(out, logits, output_kind(logits))
    assert row["kind"] == "class_vector" and row["top1_agreement"] == 5 / 8
    scaled = compare(logits * 1.1, logits, output_kind(logits))
    assert scaled["relative_error"] == pytest.approx(0.1) and scaled["cosine_min"] > 0.9999


def test_table_names_and_headline() -> None:
    g = torch.Generator().manual_seed(0)
    refs = [_yolo(n=3, anchors=100), torch.randn(3, 5, 4, 4, generator=g), torch.randn(3)]
    names = output_names((refs[0], {"seg": refs[1], "n": 7, "x": refs[2]}))
    assert names == ["output[0]", "output[1]['seg']", "output[1]['x']"]
    rows = output_table(refs, refs, names, ["det", "seg", "x"], headline=0)
    # a 4-D output after the first is a feature map, not a class map (YOLO's feats)
    assert [r["kind"] for r in rows] == ["detections", "tensor", "tensor"]
    first = output_table(refs[1:], refs[1:], None, None, headline=0)
    assert first[0]["kind"] == "class_map" and first[0]["pixel_agreement"] == 1.0
    assert [r["headline"] for r in rows] == [True, False, False]
    assert rows[1]["shape"] == [5, 4, 4] and rows[2]["shape"] == [] and rows[2]["value"] == 1.0
    assert describe(rows[0]).startswith("output[0] (detections, 84x100): box_agreement 1.0000")
    assert "scalar" in describe(rows[2])
    zeros = torch.zeros(3, 2)
    assert compare(zeros + 1, zeros, output_kind(zeros))["relative_error"] is None

    # the headline without labels is the first output's figure; with labels, top-1 accuracy
    assert metric_name(refs[0], None) == "box_agreement"
    top = headline(refs[0], None)
    assert top["source"] == "output" and top["kind"] == "detections" and top["output"] == 0
    out = [refs[0].clone(), refs[1], refs[2]]
    out[0][:, 0] += 1000.0  # every box moves far away
    s = score(out, refs, None)
    assert s["metric"] == 0.0 and s["top1_agreement"] is None
    logits = torch.randn(4, 10, generator=g)
    labels = logits.argmax(dim=1)
    assert score([logits], [logits], labels)["metric"] == 1.0
    assert headline(logits, labels)["source"] == "labels"


def test_user_metric_values_and_errors(tmp_path) -> None:
    outs = [torch.ones(4, 3), torch.zeros(4)]

    def agreement(outputs, labels):
        return torch.tensor(0.75)  # a one-element tensor is a number

    m = load_metric(agreement)
    assert m is not None and m.name == "agreement"
    assert m.figures(outs, None) == {"agreement": 0.75}
    lam = load_metric(lambda outputs, labels: {"map50": np.float32(0.5), "recall": 1})
    assert lam is not None and lam.figures(outs, None) == {"map50": 0.5, "recall": 1.0}

    bad = load_metric(lambda outputs, labels: "high")
    with pytest.raises(TypeError, match=r"metric .*<lambda> returned str \(high\), not a number"):
        bad.figures(outs, None)
    vec = load_metric(lambda outputs, labels: {"ap": torch.ones(3)})
    with pytest.raises(TypeError, match=r"returned\['ap'\] Tensor of shape \(3,\)"):
        vec.figures(outs, None)

    def broken(outputs, labels):
        return outputs[5]

    with pytest.raises(ValueError, match=r"metric .*broken raised IndexError: list index"):
        load_metric(broken).figures(outs, None)

    (tmp_path / "m.py").write_text("THRESHOLD = 0.5\ndef score(outputs, labels):\n    return 1.0\n")
    assert load_metric(f"{tmp_path / 'm.py'}:score").spec == f"{tmp_path / 'm.py'}:score"
    with pytest.raises(ValueError, match=r"metric spec '.*m.py:nope': .* no attribute 'nope'"):
        load_metric(f"{tmp_path / 'm.py'}:nope")
    with pytest.raises(TypeError, match=r"metric spec '.*:THRESHOLD' names a float, not a fun"):
        load_metric(f"{tmp_path / 'm.py'}:THRESHOLD")
    with pytest.raises(FileNotFoundError, match="no metric file at"):
        load_metric(f"{tmp_path / 'none.py'}:score")
    with pytest.raises(ValueError, match="metric spec 'no_such_pkg_xyz:f': cannot import"):
        load_metric("no_such_pkg_xyz:f")
    with pytest.raises(ValueError, match="must be 'pkg.module:fn' or 'path/to/file.py:fn'"):
        load_metric("score")
    with pytest.raises(TypeError, match="metric must be a function"):
        load_metric(3)


def test_seg_and_pose_heads_are_detections_over_their_scores() -> None:
    """YOLO-seg's head is (N, 4 + 80 + 32, A): 32 mask coefficients follow the scores; YOLO-pose's
    (N, 4 + 1 + 51, A): 17 keypoints (x, y in pixels, visibility) follow the one person score."""
    g = torch.Generator().manual_seed(3)
    det = _yolo(n=3, anchors=400)
    seg = torch.cat([det, torch.randn(3, 32, 400, generator=g)], dim=1)
    kind = output_kind(seg)
    assert (kind.name, kind.layout, kind.classes) == ("detections", "rows", 80)
    masks_off = seg.clone()
    masks_off[:, 84:] += 1.0  # the mask coefficients say nothing about the boxes
    assert compare(masks_off, seg, kind)["box_agreement"] == 1.0
    classes_off = seg.clone()
    classes_off[:, 4:84] = classes_off[:, 4:84].flip(1)  # every anchor's class changes
    assert compare(classes_off, seg, kind)["box_agreement"] < 0.1
    keypoints = torch.rand(3, 51, 400, generator=g) * 64
    pose = torch.cat([det[:, :5], keypoints], dim=1)
    assert output_kind(pose).classes == 1 and output_kind(pose).figure == "box_agreement"
    with pytest.raises(ValueError, match="classes must be in"):
        box_agreement(seg, seg, "rows", classes=0)
