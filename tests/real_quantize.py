"""Running ``qdq quantize`` as users do on the real-model rows (issue 31): the helpers of
``test_real_models_quantize.py`` (classifiers) and ``test_real_models_quantize_dense.py``
(detectors and segmenters). Two files, so that ``pytest -n 2 --dist loadfile`` runs them on both
workers.

Each row runs ``python -m qdq quantize`` in a subprocess on a model given as ``factory.py:build``
(the row's builder from ``tests/models/real.py``: random weights, no downloads) and a small folder
of images written once per module (:func:`write_images`), and checks what a user gets: exit 0,
the four files, the report's FP32 and INT8 metrics and its lint verdict (:func:`check`).

Sizes are the smallest each row takes sensibly (:data:`SIZES`): 64x64 for the convolutional rows
(strides up to 32; RetinaNet's P6/P7 levels are then 1x1), ViT-Tiny keeps its 224x224 (timm's
patch embedding checks the size it was built for). The factory builds the row for that size: the
YOLO ``*_deploy`` rows clamp ``max_det`` to its anchor count, the R-CNNs resize to it inside
(``min_size``/``max_size``).

The exporter: ``auto`` (dynamo, else TorchScript), what users get, on one row per family
(:data:`AUTO_ROWS`: a residual CNN, a YOLO, the U-Net, a YOLO-seg, the ViT, the ``.pt2``), and
``--exporter torchscript`` on the others. Dynamo costs 7-20 s per row alone on 2 cores against 1-7 s
for TorchScript (10-54 s per row under ``-n 2`` on a busy machine), and both exporters are checked
per family by ``test_real_models.py``; what these tests add is the whole job as users run it.

torchvision's R-CNNs return per-image detection lists after NMS: the job runs them in per-image
mode (batch 1, ``detection_f1`` against FP32, the export checked per quantizer) and they are
ordinary exit-0 rows. :data:`REFUSED` would hold rows the check stage refuses (outputs neither
batch-major nor detection lists, asserted by :func:`refused`); none is left.

With ``-s`` every row prints one line (exit code, wall time, files, metrics, lint verdict, export
and per-layer-error seconds); with ``QDQ_QUANTIZE_TABLE=path`` it also appends it, as a Markdown
table row, to ``path``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from models.real import ARCHS

__all__ = [
    "AUTO_ROWS",
    "FILES",
    "REFUSED",
    "SIZES",
    "arch_params",
    "check",
    "quantize_cli",
    "record",
    "run_row",
    "write_images",
]

FILES = ("manifest.json", "model.qdq.onnx", "report.html", "report.json")
#: images in the folder: the command splits them into calibration and evaluation halves
IMAGES, CALIB, EVAL, BATCH = 8, 4, 4, 4
TIMEOUT_S = 900
DEFAULT_SIZE = 64
#: rows that cannot take DEFAULT_SIZE
SIZES: dict[str, int] = {"vit_tiny_patch16_224": 224}  # timm PatchEmbed: strict image size
#: rows on the default exporter (``auto``); the others pass ``--exporter torchscript``
AUTO_ROWS = frozenset(
    {"resnet50", "yolo11n", "yolov8n_seg", "unet_resnet34", "vit_tiny_patch16_224"}
)
#: rows the check stage refuses (see the module docstring): none
REFUSED: frozenset[str] = frozenset()

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"

FACTORY = textwrap.dedent(
    """
    import models.real as real

    # the builders read these when called: the model is built for the size the command feeds it
    real.DETECTOR_SIZE = real.CLASSIFIER_SIZE = {size}


    def build():
        return real.ARCHS[{name!r}].build().model
    """
)


def arch_params(names: list[str]) -> list[Any]:
    """``pytest.param`` per row: marked ``slow`` as the row says, skipped without its packages."""
    params = []
    for name in names:
        arch = ARCHS[name]
        marks = [pytest.mark.slow] if arch.slow else []
        if not arch.available:
            marks.append(pytest.mark.skip(reason=f"{', '.join(arch.missing)} not installed"))
        params.append(pytest.param(name, marks=marks, id=name))
    return params


def write_images(folder: Path) -> Path:
    """Write a flat folder of smooth random RGB images (PNG and JPEG, 80x96; no labels)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(IMAGES):
        coarse = rng.uniform(0, 255, size=(5, 6, 3)).astype(np.uint8)
        img = Image.fromarray(coarse).resize((96, 80), Image.BILINEAR)
        noisy = np.asarray(img, dtype=np.int16) + rng.integers(-20, 21, size=(80, 96, 3))
        img = Image.fromarray(noisy.clip(0, 255).astype(np.uint8))
        img.save(folder / (f"{i:02d}.png" if i % 2 else f"{i:02d}.jpg"))
    return folder


def _env() -> dict[str, str]:
    env = dict(os.environ)
    path = [str(SRC), str(TESTS), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    env.setdefault("YOLO_OFFLINE", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    # one thread, alone as in the suite: importing ultralytics in a worker sets OMP_NUM_THREADS=1
    # in os.environ, and rows inherited it only after such a test (keypointrcnn's RoI selection
    # differed between torch and ORT at one thread only)
    env["OMP_NUM_THREADS"] = "1"
    return env


#: flags that give the recipe or bound the search (a row with one does not get --recipe none)
RECIPE_FLAGS = frozenset({"--recipe", "--search-budget", "--equalize", "--rounding",
                          "--bias-correction", "--calib-per-quantizer"})  # fmt: skip


def quantize_cli(model: str, data: Path, size: int, out: Path, *extra: str) -> dict[str, Any]:
    """Run ``python -m qdq quantize``: the process, its seconds, the files in ``out``, the report."""
    cmd = [
        sys.executable, "-m", "qdq", "quantize",
        "--model", model, "--data", str(data), "--image-size", f"{size},{size}",
        "--calib-samples", str(CALIB), "--eval-samples", str(EVAL),
        "--batch-size", str(BATCH), "--no-progress", "--out", str(out), *extra,
    ]  # fmt: skip
    if not RECIPE_FLAGS & set(extra):  # the suite runs recipe none unless a row says otherwise:
        cmd += ["--recipe", "none"]  # the search's cost is benchmarks/ptq_search.py's to measure
    start = time.perf_counter()
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=_env(), timeout=TIMEOUT_S, check=False
    )
    seconds = time.perf_counter() - start
    files = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    report = json.loads((out / "report.json").read_text()) if "report.json" in files else None
    return {"proc": proc, "seconds": seconds, "files": files, "report": report, "out": out}


def run_row(name: str, images: Path, tmp_path: Path) -> dict[str, Any]:
    """Write the row's factory and run the command on it (recorded, then checked)."""
    size = SIZES.get(name, DEFAULT_SIZE)
    factory = tmp_path / "factory.py"
    factory.write_text(FACTORY.format(size=size, name=name))
    extra = () if name in AUTO_ROWS else ("--exporter", "torchscript")
    run = quantize_cli(f"{factory}:build", images, size, tmp_path / "out", *extra)
    record(name, size, run)
    if name in REFUSED:
        return refused(run)
    report = check(run)
    assert report["model"]["kind"] == "factory"
    return report


def record(row: str, size: int, run: dict[str, Any]) -> None:
    """Print the row's line; append it to ``$QDQ_QUANTIZE_TABLE`` when set."""
    proc, r = run["proc"], run["report"]
    if r is not None:
        t = r["timings_s"]
        figures = (
            f"{r['metric_name']} FP32 {r['fp32_metric']:.4f} INT8 {r['int8_metric']:.4f} "
            f"(cosine {r['int8']['cosine_mean']:.4f}) | {r['lint_verdict']} | "
            f"{r['settings']['exporter']}->{r['export']['exporter']} {t['export']:.0f} s, "
            f"per-layer error {t.get('layer_errors', 0):.0f} s"
        )
    else:
        error = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        figures = f"{error[:300]} | - | -"
    line = (
        f"| {row} | {size} | {proc.returncode} | {run['seconds']:.0f} s | "
        f"{', '.join(run['files']) or '-'} | {figures} |"
    )
    print(f"\n[quantize] {line}")
    table = os.environ.get("QDQ_QUANTIZE_TABLE")
    if table:
        with open(table, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def refused(run: dict[str, Any]) -> dict[str, Any]:
    """Exit 2 at the check stage: one line naming the per-image output and what to do; no files."""
    proc = run["proc"]
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and "one row per sample" in err, err
    assert "['boxes']" in err and "wrap the model" in err, err
    assert "export" not in proc.stdout.split("check one sample")[-1], proc.stdout
    assert run["files"] == [], run["files"]
    return {}


def check(run: dict[str, Any]) -> dict[str, Any]:
    """Exit 0, the four files, a report with finite metrics and a verdict; returns the report."""
    proc = run["proc"]
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert tuple(run["files"]) == FILES, run["files"]
    r = run["report"]
    assert r["files"] == {
        "onnx": "model.qdq.onnx",
        "manifest": "manifest.json",
        "report": "report.json",
        "html": "report.html",
    }
    for key in ("fp32_metric", "int8_metric"):
        assert isinstance(r[key], float) and np.isfinite(r[key]), (key, r[key])
    assert r["lint_verdict"] in ("PASS", "WARN", "FAIL"), r["lint_verdict"]
    assert r["data"]["calibration_samples"] == CALIB, r["data"]
    assert r["data"]["evaluation_samples"] == EVAL, r["data"]
    manifest = json.loads((run["out"] / "manifest.json").read_text())
    onnx_bytes = (run["out"] / "model.qdq.onnx").read_bytes()
    assert manifest["onnx"] == {
        "file": "model.qdq.onnx",
        "sha256": hashlib.sha256(onnx_bytes).hexdigest(),
    }
    html = (run["out"] / "report.html").read_text(encoding="utf-8")
    assert html.lstrip().lower().startswith("<!doctype html"), html[:100]
    assert f"wrote {run['out']}/" in proc.stdout, proc.stdout
    return r
