"""``qdq quantize --model NAME`` with no other flag on every zoo model: what the recipe search
(the default, issue 33) keeps, and the overfitting guard.

For each zoo model the main job runs three times on its own data, as a user runs it
(:func:`qdq.quantize`; the zoo's calibration and evaluation split, full INT8 coverage):

* ``--recipe none``: the default before the search (mse calibration, no PTQ step);
* no flag: the search holds out the last quarter of the calibration samples, keeps the best
  recipe by its held-out score, and exports it;
* ``search-seed1``: no flag, calibration seed 1 (``DataOptions(seed=1)``: other calibration
  samples drawn; the photo crops draw their evaluation crops from it too): what would another
  calibration draw have kept, and how does it evaluate.

Printed per run: the headline metric of the export in ONNX Runtime on the evaluation samples (the
published figure, never the held-out score that decided), its cosine with FP32 and the dataset's
own figures; the kept recipe and its held-out score; the search's seconds against one FP32
evaluation (``timings_s.fp32_eval``) of the same run.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/quantize_default.py [--models a,b] [--json F]``.
Prints figures; asserts nothing. Times are ratios within one run (shared, noisy machine).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import qdq
from qdq.pipeline import DataOptions

MODELS = (
    "fashion-mnist-resnet",
    "efficientnet-lite0",
    "crepe-tiny",
    "mtcnn-rnet",
    "mtcnn-onet",
    "ppocr-det",
)
RUNS = {"none": ("none", 0), "search": (None, 0), "search-seed1": (None, 1)}


def run(name: str, label: str, tmp: Path) -> dict[str, Any]:
    ptq, seed = RUNS[label]
    start = time.perf_counter()
    res = qdq.quantize(name, out=tmp / f"{name}-{seed}-{ptq}", overwrite=True, ptq=ptq,
                       data_options=DataOptions(seed=seed), show_progress=False)  # fmt: skip
    r = res.report
    found = (r.get("ptq") or {}).get("recipe_search") or {}
    kept = next((t for t in found.get("rows", []) if t["recipe"] == found.get("kept")), None)
    timings = r["timings_s"]
    row = {
        "model": name,
        "run": label,
        "metric_name": r["metric_name"],
        "fp32": r["fp32_metric"],
        "int8": r["int8_metric"],
        "cosine": r["int8"]["cosine_mean"],
        "figures": r["int8"].get("figures"),
        "recipe": r["settings"]["recipe"],
        "held_out_score": None if kept is None else kept["score"],
        "search_s": timings.get("recipe_search"),
        "fp32_eval_s": timings.get("fp32_eval"),
        "total_s": round(time.perf_counter() - start, 1),
        "trials": found.get("rows", []),
    }
    figures = "" if not row["figures"] else " " + json.dumps(row["figures"])
    search = ""
    if row["search_s"] is not None and row["fp32_eval_s"]:
        search = (f"; kept {row['recipe']} (held-out {row['held_out_score']:.6f}), search "
                  f"{row['search_s']:.0f} s = {row['search_s'] / row['fp32_eval_s']:.1f} FP32 "
                  "evaluations")  # fmt: skip
    print(f"{name} [{label}]: {row['metric_name']} FP32 {row['fp32']:.4f} INT8 {row['int8']:.4f} "
          f"cos {row['cosine']:.5f}{figures}{search}", flush=True)  # fmt: skip
    for t in row["trials"]:
        score = "-" if t["score"] is None else f"{t['score']:.6f}"
        print(f"    {t['recipe']:<28} {score:>9} {t['seconds']:7.1f} s  {t['status']}", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--runs", default=",".join(RUNS), help=f"of {list(RUNS)}")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            for label in args.runs.split(","):
                rows.append(run(name, label, Path(tmp)))
                if args.json:
                    args.json.write_text(json.dumps(rows, indent=2))
    print("| model | metric | FP32 | recipe none | search: kept | held-out | evaluation (cos) | "
          "search s (× FP32 eval) | seed 1: kept → evaluation |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        got = {r["run"]: r for r in rows if r["model"] == name}
        none, s, s1 = got.get("none"), got.get("search"), got.get("search-seed1")
        if s is None:
            continue
        ratio = "-" if not s["fp32_eval_s"] else f"{s['search_s'] / s['fp32_eval_s']:.1f}"
        held = "-" if s["held_out_score"] is None else f"{s['held_out_score']:.5f}"
        print(f"| {name} | {s['metric_name']} | {s['fp32']:.4f} | "
              f"{'-' if none is None else format(none['int8'], '.4f')} | {s['recipe']} | {held} | "
              f"{s['int8']:.4f} ({s['cosine']:.5f}) | {s['search_s'] or 0:.0f} ({ratio}) | "
              f"{'-' if s1 is None else s1['recipe'] + ' → ' + format(s1['int8'], '.4f')} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
