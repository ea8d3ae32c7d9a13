"""The recipe search as ``qdq quantize``'s default (issue 33): the held-out split of the
calibration samples, the report's table, the manifest's recipe, the budget, the cases where it
does not run, the CLI's switches, and a per-image detector (the search scores detection F1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import qdq
from qdq.cli.main import main
from qdq.pipeline import PtqOptions, QuantData, SearchOptions, quantize
from qdq.pipeline.recipe import MIN_SAMPLES, held_out_folds, held_out_split


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3),
        torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 5),
    ).eval()  # fmt: skip


def _data(calib: int = 16, evaluation: int = 8) -> QuantData:
    g = torch.Generator().manual_seed(3)
    return QuantData(
        calibration=torch.randn(calib, 3, 8, 8, generator=g),
        evaluation=torch.randn(evaluation, 3, 8, 8, generator=g),
        labels=None,
        source="random",
        split=f"{calib} calibration, {evaluation} evaluation",
    )


def _run(tmp_path: Path, ptq: object, data: QuantData | None = None) -> dict:
    res = quantize(_net(), data or _data(), out=tmp_path / "out", exporter="torchscript",
                   batch_size=4, show_progress=False, ptq=ptq)  # type: ignore[arg-type]  # fmt: skip
    return res.report


def test_the_default_searches_on_held_out_calibration_samples(tmp_path: Path) -> None:
    stages: list[tuple[str, str]] = []
    # a time budget no load exhausts: every candidate runs, whatever the machine's speed
    res = quantize(_net(), _data(), out=tmp_path / "out", exporter="torchscript", batch_size=4,
                   show_progress=False, on_stage=lambda n, s, d: stages.append((n, d)),
                   ptq=SearchOptions(candidates=("none", "kernel-sum", "bias")),
                   time_budget=3600.0)  # fmt: skip
    r = res.report
    found = r["ptq"]["recipe_search"]
    # 16 calibration samples: 12 calibrate, 4 (one batch of 4) are scored on; the candidates
    # still close then race over the 3 other disjoint quarters (each calibrated on the rest)
    assert dict(stages)["calibrate"].startswith("mse on 12 samples")
    assert "4 more held out for the recipe search" in dict(stages)["calibrate"]
    assert found["score"] == "output cosine" and found["margin"]["ceiling"] == 1.0
    assert 1 <= found["folds"] <= 4 and found["held_out_batches"] == found["folds"]
    assert [t["recipe"] for t in found["rows"]] == ["none", "kernel-sum", "bias"]
    assert all(t["status"].startswith("scored") and 0.9 < t["score"] <= 1.0
               for t in found["rows"])  # fmt: skip
    assert max(t["folds"] for t in found["rows"]) == found["folds"]
    kept_row = next(t for t in found["rows"] if t["recipe"] == found["kept"])
    assert kept_row["folds"] == found["folds"] and kept_row["status"] == "scored"
    # the kept recipe is the one that ran, exported, and recorded for replay
    assert r["ptq"]["recipe"] == r["settings"]["recipe"] == found["kept"]
    assert found["kept"] in ("none", "kernel-sum", "bias")
    assert "recipe_search" in r["timings_s"]
    # then the kept recipe ran again on all 16 samples: that model is the one exported
    assert dict(stages)["refit"] == f"{found['kept']} on all 16 calibration samples"
    manifest = json.loads(res.manifest_path.read_text())
    assert manifest["ptq"]["recipe"] == found["kept"] and manifest["ptq"]["chosen_by"] == "search"
    # the kept model is the exported one: ONNX Runtime agrees with it
    assert r["int8_torch"]["vs_onnxruntime"]["cosine_min"] > 0.9999
    html = res.html_path.read_text()
    assert "Recipe search: kept" in html and "held-out score" in html


def test_without_refit_the_searched_model_is_exported(tmp_path: Path) -> None:
    options = SearchOptions(candidates=("bias", "none"), refit=False)
    res = quantize(_net(), _data(), out=tmp_path / "out", exporter="torchscript", batch_size=4,
                   show_progress=False, ptq=options)  # fmt: skip
    r = res.report
    assert "refit" not in r["timings_s"] and r["ptq"]["recipe"] == r["ptq"]["recipe_search"]["kept"]
    if r["ptq"]["recipe"] == "bias":  # the searched candidate's own report: 12 samples
        assert "from 12 samples" in r["ptq"]["bias_correction"]["summary"]
    refit = _run(tmp_path / "refit", SearchOptions(candidates=("bias",)))
    assert "from 16 samples" in refit["ptq"]["bias_correction"]["summary"]


def test_a_search_budget_of_nothing_skips_the_search_and_says_why(tmp_path: Path) -> None:
    found = _run(tmp_path, SearchOptions(budget=0, candidates=("none", "bias", "kernel-sum")))
    search = found["ptq"]["recipe_search"]
    assert search["rows"] == [] and search["kept"] == "none" == found["ptq"]["recipe"]
    assert search["reason"].startswith("not run: --search-budget 0 s less than scoring one")
    assert {"stage": "recipe_search", "what": "every candidate", "why": search["reason"]} in (
        found["budget"]["skipped"]
    )
    assert "recipe_search" not in found["timings_s"] and "refit" not in found["timings_s"]


def test_too_few_samples_skip_the_search_and_say_why(tmp_path: Path) -> None:
    r = _run(tmp_path, None, _data(calib=MIN_SAMPLES - 1))
    found = r["ptq"]["recipe_search"]
    assert found["rows"] == [] and found["kept"] == "none" == r["ptq"]["recipe"]
    assert f"{MIN_SAMPLES - 1} calibration sample(s)" in found["summary"]
    assert "recipe_search" not in r["timings_s"]


def test_a_given_recipe_does_not_search(tmp_path: Path) -> None:
    r = _run(tmp_path, PtqOptions.from_recipe("kernel-sum"))
    assert "recipe_search" not in r["ptq"] and r["ptq"]["recipe"] == "kernel-sum"
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["ptq"] == {
        "recipe": "kernel-sum",
        "steps": ["kernel_sum"],
        "chosen_by": "given",
    }
    r = _run(tmp_path / "none", "none")  # recipe none: no PTQ section at all
    assert r["ptq"] is None and r["settings"]["recipe"] == "none"
    with pytest.raises(TypeError, match="ptq must be None or a SearchOptions"):
        _run(tmp_path / "bad", {"rounding": "adaround"})
    with pytest.raises(ValueError, match="unknown recipe part"):
        _run(tmp_path / "bad", "sharpen")
    assert not (tmp_path / "bad").exists()


def test_under_torchrun_the_search_does_not_run(tmp_path: Path, monkeypatch) -> None:
    from qdq.qat import distributed as dist

    monkeypatch.setattr(dist, "world_size", lambda: 2)  # rank 0 of two (nothing initialised)
    r = _run(tmp_path, None)
    assert "not run under torchrun" in r["ptq"]["recipe_search"]["summary"]
    assert r["ptq"]["recipe"] == "none"


def test_held_out_split_keeps_at_least_one_sample_on_each_side() -> None:
    cal = torch.arange(8.0).reshape(8, 1)
    fit, held, why = held_out_split(cal, SearchOptions(held_out=0.95))
    assert (len(fit), len(held), why) == (1, 7, "")  # type: ignore[arg-type]
    fit, held, _ = held_out_split(cal, SearchOptions())
    assert (len(fit), len(held)) == (6, 2)  # type: ignore[arg-type]


def test_held_out_folds_are_disjoint_shares_and_each_fits_on_the_rest() -> None:
    cal = torch.arange(10.0).reshape(10, 1)
    folds = held_out_folds(cal, SearchOptions())  # 10 samples, a quarter: 2 per fold, 4 folds
    first = held_out_split(cal, SearchOptions())
    assert len(folds) == 4
    assert torch.equal(folds[0][0], first[0]) and torch.equal(folds[0][1], first[1])  # type: ignore[arg-type]
    helds = [set(h.flatten().tolist()) for _, h in folds]  # type: ignore[union-attr]
    assert all(len(h) == 2 for h in helds) and len(set().union(*helds)) == 8
    for (fit, held), h in zip(folds, helds, strict=True):
        assert set(fit.flatten().tolist()) | h == set(range(10)) and len(fit) == 8  # type: ignore[union-attr,arg-type]
        assert torch.equal(held, held.sort(0).values)  # the samples keep their order
    assert len(held_out_folds(cal, SearchOptions(folds=2))) == 2
    assert len(held_out_folds(cal, SearchOptions(held_out=0.6))) == 1  # only one share of 6 fits
    with pytest.raises(ValueError, match="folds must be an int >= 1"):
        SearchOptions(folds=0)


def test_held_out_split_draws_across_ordered_data() -> None:
    """Class-ordered calibration data (MTCNN's crops: faces first) must not hold out one class:
    the held-out samples are a seeded draw; fit and held-out are disjoint, cover every sample,
    keep the samples' order and are the same on every run."""
    cal = {"x": torch.arange(40.0).reshape(40, 1), "label": torch.arange(40) // 20}
    fit, held, _ = held_out_split(cal, SearchOptions())
    assert isinstance(fit, dict) and isinstance(held, dict)
    f, h = fit["x"].flatten().tolist(), held["x"].flatten().tolist()
    assert len(h) == 10 and sorted(f + h) == list(range(40))
    assert f == sorted(f) and h == sorted(h)
    assert set(held["label"].tolist()) == {0, 1}  # both halves of the ordered data
    assert torch.equal(held["label"], held["x"].flatten().long() // 20)  # inputs stay aligned
    again = held_out_split(cal, SearchOptions())[1]
    assert isinstance(again, dict) and torch.equal(again["x"], held["x"])


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"budget": -1}, "search budget must be a number of seconds >= 0"),
        ({"budget": True}, "search budget"),
        ({"held_out": 1.0}, "held_out must be a share"),
        ({"candidates": ()}, "non-empty sequence of recipe names"),
        ({"candidates": "none"}, "non-empty sequence of recipe names"),
        ({"candidates": ("none", "sharpen")}, "unknown recipe part"),
        ({"adaround_iters": 0}, "adaround_iters must be a positive int"),
        ({"refit": "yes"}, "refit must be True or False"),
    ],
)
def test_bad_search_options_are_named(options: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SearchOptions(**options)


def test_cli_search_budget_conflicts_and_bad_values(tmp_path: Path, capsys) -> None:
    import numpy as np

    np.save(tmp_path / "x.npy", np.zeros((16, 3, 8, 8), np.float32))
    base = ["quantize", "--model", "tests.test_quantize_search:_net", "--data",
            str(tmp_path / "x.npy"), "--out", str(tmp_path / "o"), "--no-progress"]  # fmt: skip
    for extra, message in (
        (["--search-budget", "5", "--recipe", "none"], "--search-budget bounds the recipe search"),
        (["--search-budget", "5", "--rounding", "nearest"], "but --rounding gives the recipe"),
        (["--search-budget", "-2"], "search budget must be a number of seconds >= 0"),
        (["--recipe", "bias", "--equalize"], "both set PTQ steps"),
    ):
        assert main([*base, *extra]) == 2, extra
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (extra, err)
        assert not (tmp_path / "o").exists()


def test_a_per_image_detector_is_searched_by_detection_f1(tmp_path: Path) -> None:
    from test_detections import TinyDetector

    g = torch.Generator().manual_seed(5)
    data = QuantData(
        calibration=torch.randn(8, 3, 16, 16, generator=g),
        evaluation=torch.randn(3, 3, 16, 16, generator=g),
        labels=None,
        source="random",
        split="8 calibration, 3 evaluation",
    )
    # a budget no load can exhaust: what is asserted is the score, not what the time allowed
    res = quantize(TinyDetector().eval(), data, out=tmp_path / "out", exporter="torchscript",
                   show_progress=False, ptq=SearchOptions(candidates=("none", "bias")),
                   time_budget=3600.0)  # fmt: skip
    found = res.report["ptq"]["recipe_search"]
    assert found["score"] == "detection F1 vs FP32" and found["margin"]["ceiling"] is None
    assert found["held_out_batches"] == 2 * found["folds"]  # 2 of the 8 images per fold
    assert all(t["status"].startswith("scored") and 0 <= t["score"] <= 1 for t in found["rows"])


def test_copy_prepared_keeps_a_graph_modules_quantizers_working(tmp_path: Path) -> None:
    from qdq.pipeline import resolve_model

    net = _net()
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    torch.export.save(torch.export.export(net, (x,)), tmp_path / "m.pt2")
    gm = resolve_model(str(tmp_path / "m.pt2")).module  # a GraphModule, as qdq quantize runs it
    assert isinstance(gm, torch.fx.GraphModule)
    prepared = qdq.prepare(gm, (x,))
    qdq.calibrate(prepared, [x])
    clone = qdq.copy_prepared(prepared)
    assert qdq.plan_of(clone) == qdq.plan_of(prepared) and qdq.plan_of(clone).points
    with torch.no_grad():
        want, got, float_out = prepared(x), clone(x), net(x)
    assert torch.equal(got, want) and not torch.equal(got, float_out)
    # the clone's quantizers are its own
    mine = set(map(id, qdq.quantizers_of(prepared).values()))
    assert not mine & set(map(id, qdq.quantizers_of(clone).values()))
