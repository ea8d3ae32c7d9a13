"""Fit the engine-time model's parameters on the real engine profiles and store them.

    .venv/bin/python scripts/fit_engine_time.py            # writes src/qdq/lint/speed/params.json

Reads every engine of ``qdq.lint.speed.fit.SHARED_ENGINES`` from ``tests/fixtures/trt-engines``
(layer information + profile), fits the free parameters of ``qdq.lint.speed.cost`` (Nelder-Mead
from the defaults: deterministic), and writes them with the fit's residuals per engine and the
leave-one-out errors (each engine predicted by a fit on the others). About a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from qdq._io import atomic_write_text  # noqa: E402
from qdq.lint.speed.cost import CostParams  # noqa: E402
from qdq.lint.speed.fit import (  # noqa: E402
    SHARED_ENGINES,
    evaluate,
    fit_params,
    leave_one_out,
    load_samples,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixtures", default=str(ROOT / "tests" / "fixtures" / "trt-engines"))
    parser.add_argument(
        "--out", default=str(ROOT / "src" / "qdq" / "lint" / "speed" / "params.json")
    )
    args = parser.parse_args()
    samples = load_samples(args.fixtures)
    params = fit_params(samples, CostParams())
    residuals = evaluate(samples, params)
    loo = leave_one_out(samples, CostParams())
    doc = {
        "about": "engine-time model parameters fitted by scripts/fit_engine_time.py on the "
        "per-layer profiles of tests/fixtures/trt-engines (docs/engine_time.md)",
        "fitted": datetime.date.today().isoformat(),
        "engines": dict(SHARED_ENGINES),
        "params": params.to_dict(),
        "residuals": residuals,
        "leave_one_out": loo,
    }
    atomic_write_text(Path(args.out), json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")
    head = ("engine", "GPU", "measured", "fit", "err", "LOO", "err", "layer med")
    print("{:32s} {:16s} {:>9s} {:>8s} {:>6s} {:>8s} {:>6s} {:>9s}".format(*head))
    for name, r in residuals.items():
        o = loo[name]
        print(f"{name:32s} {r['gpu']:16s} {r['measured_ms']:9.3f} {r['predicted_ms']:8.3f} "
              f"{100 * r['total_error']:+5.1f}% {o['predicted_ms']:8.3f} {100 * o['total_error']:+5.1f}% "
              f"{100 * (o['median_layer_error'] or 0):8.1f}%")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
