"""The recipe search (``qdq.ptq.search``) on the zoo: what it keeps, and how that holds up.

For each zoo model, at full INT8 coverage (as ``benchmarks/ptq.py``), the calibration batches are
split: the last quarter is held out (at least one batch; fewer than four batches are cut into
quarters first), the rest calibrates. The search runs
with its defaults: candidates, budget (10 × one prepare + calibrate, at least 30 s), and the
per-sample output cosine on the held-out batches as the score. Then:

* the kept recipe's model and the default recipe (``none``: mse) are exported, and each is
  measured on the evaluation set in ONNX Runtime (``ORT_ENABLE_BASIC``). These are the published
  figures, never the held-out score that decided;
* the search runs again with the *first* quarter held out (another calibration split): what
  would it have kept?
* its cost: the search's seconds against one FP32 evaluation of the model.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/ptq_search.py [--models a,b] [--json out.json]``.
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

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ptq as bench  # benchmarks/ptq.py: the zoo models, their data, export and ORT scoring
import qdq
from qdq.ptq.search import search

MODELS = ("fashion-mnist-resnet", "crepe-tiny", "mtcnn-rnet", "mtcnn-onet", "efficientnet-lite0")


def run_model(name: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    b = bench.Bench(name, args.batch)
    if len(b.calib) < 4 and not b.static:  # too few batches to hold a quarter out: smaller ones
        b.calib = [c for batch in b.calib for c in torch.chunk(batch, 4)]
    k = max(1, len(b.calib) // 4)
    splits = {"last quarter held out": (b.calib[:-k], b.calib[-k:]),
              "first quarter held out": (b.calib[k:], b.calib[:k])}  # fmt: skip
    out: dict[str, Any] = {"model": name, "fp32": bench._figures(b.fp32), "splits": {}}
    bench.log(f"== {name}: FP32 {b.fp32['metric']:.4f} (one FP32 evaluation {b.fp32_eval_s:.1f} s)")
    for label, (calib, held) in splits.items():
        start = time.perf_counter()
        found = bench.quiet(lambda c=calib, h=held: search(
            b.source.module, (b.example,), c, h, config=bench.FULL, budget=args.budget,
            adaround_iters=args.adaround_iters))  # fmt: skip
        seconds = time.perf_counter() - start
        kept = bench._figures(b.through_export(found.model, tmp, f"kept-{len(out['splits'])}"))
        row = {
            "kept": found.kept.name,
            "reason": found.reason,
            "held_out_score": next(t.score for t in found.rows if t.recipe == found.kept.name),
            "eval": kept,
            "search_seconds": round(seconds, 1),
            "x_fp32_evaluation": round(seconds / b.fp32_eval_s, 1),
            "trials": [t.to_dict() for t in found.rows],
        }
        if label.startswith("last"):
            none = bench.quiet(lambda c=calib: _default(b, c))
            row["default_eval"] = bench._figures(b.through_export(none, tmp, "default"))
        out["splits"][label] = row
        versus = row.get("default_eval")
        versus_text = "" if versus is None else f" vs default {versus['metric']:.4f}"
        bench.log(f"  {label}: kept {found.kept.name} (held-out cosine {row['held_out_score']:.5f}); "
                  f"evaluation {kept['metric']:.4f} agree {kept['agreement']} cos {kept['cosine']:.5f}"
                  f"{versus_text}; search {seconds:.0f} s = {row['x_fp32_evaluation']} FP32 "
                  "evaluations")  # fmt: skip
        for t in found.rows:
            score = "-" if t.score is None else f"{t.score:.6f}"
            bench.log(f"    {t.recipe:<28} {score:>9}  {t.seconds:6.1f} s  {t.status}")
    return out


def _default(b: bench.Bench, calib: list[Any]) -> Any:
    prepared = qdq.prepare(b.source.module, (b.example,), bench.FULL)
    qdq.calibrate(prepared, calib, show_progress=False)
    return prepared


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--budget", type=float, help="search budget in seconds (default: the search's)")
    p.add_argument("--adaround-iters", type=int, default=500)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            results.append(run_model(name, args, Path(tmp)))
    print("| model | FP32 | default (none) | kept (last quarter held out) | held-out cosine | "
          "evaluation | search s (× FP32 eval) | kept with the first quarter held out |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        last, first = r["splits"]["last quarter held out"], r["splits"]["first quarter held out"]
        print(f"| {r['model']} | {r['fp32']['metric']:.4f} | {last['default_eval']['metric']:.4f} | "
              f"{last['kept']} | {last['held_out_score']:.5f} | {last['eval']['metric']:.4f} | "
              f"{last['search_seconds']:.0f} ({last['x_fp32_evaluation']}) | {first['kept']} |")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
