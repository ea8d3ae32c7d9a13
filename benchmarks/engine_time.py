"""The engine-time model against real TensorRT profiles (issue 58 part 5).

Three sections, each printed and written to ``benchmarks/engine_time_<YYYY-MM-DD>.txt`` / ``.json``:

* ``loo``: leave-one-out over the shared engines (``qdq.lint.speed.fit.SHARED_ENGINES``, the
  profiled engines of ``tests/fixtures/trt-engines``): each engine predicted by a fit on the
  others; its measured and predicted totals, the total's error, and the median per-layer error over
  the layers taking at least 2 % of its time; beside it, the in-sample fit (the stored parameters of
  ``params.json`` on the same engine). Aims: total error <= 20 %, median layer error <= 35 %.
* ``ratios``: the same model at several precisions. ResNet-18 on the A100 (FP32, FP16 and the
  conv-only Q/DQ engine): measured ratios of the per-layer sums against the predicted ones (the
  stored fit, and the leave-one-out predictions when ``loo`` ran), and the order. ResNet-50 on the
  RTX 3090 has only an FP32 engine: its layers re-timed at FP16 and INT8 (every layer at that
  precision, bytes scaled; no Q/DQ nor reformats added, the best case), with no measured pair to
  hold them against; the same re-timing of ResNet-18's FP32 engine is checked against its
  measured FP16 engine.
* ``onnx``: qdq's own ResNet-18 export (torchvision, random weights, eval) with qdq's default
  placement and with Q/DQ on the convolutions only, timed by ``predict_latency`` at batch 32 on
  224x224 on the A100 against the real figures (FP16 1.017 ms measured; conv-only Q/DQ 1.096 ms
  measured, 0.93x; the default placement's structure known to reach about 0.67 ms, 1.5x). Aims:
  the default's predicted speed-up within 15 % of 1.5x, conv-only predicted no faster than FP16.

Usage::

    .venv/bin/python benchmarks/engine_time.py                      # all three, ~70 s on 2 cores
    .venv/bin/python benchmarks/engine_time.py --sections ratios onnx  # without the refits

Nothing here changes the model or ``params.json``; a missed aim prints FAIL.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from qdq.lint.speed.cost import ELEMENT_BYTES, CostParams, load_params  # noqa: E402
from qdq.lint.speed.fit import (  # noqa: E402
    EngineSample,
    evaluate,
    leave_one_out,
    load_samples,
    predict,
)

FIXTURES = ROOT / "tests" / "fixtures" / "trt-engines"
AIM_TOTAL, AIM_LAYER, AIM_RATIO = 0.20, 0.35, 0.15
#: the real ResNet-18 figures at batch 32 on the A100 (ms): the FP16 and conv-only Q/DQ engines'
#: per-layer sums (tests/fixtures/trt-engines), and what qdq's default placement is known to reach
REAL_FP16_MS, REAL_CONV_ONLY_MS, REAL_DEFAULT_MS = 1.0168, 1.0957, 0.67
SECTIONS = ("loo", "ratios", "onnx")


class Out:
    """Prints each line and keeps it for the .txt file."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)


def _pct(x: float | None) -> str:
    return "   n/a" if x is None else f"{100 * x:+5.1f}%"


def _ok(good: bool) -> str:
    return "PASS" if good else "FAIL"


# ------------------------------------------------------------------ leave-one-out
def loo_section(samples: list[EngineSample], params: CostParams, say: Out) -> dict[str, Any]:
    say("== leave-one-out over the shared engines (each engine predicted by a fit on the others)")
    say(f"   aims: |total error| <= {AIM_TOTAL:.0%}, median layer error <= {AIM_LAYER:.0%} "
        "over the layers taking >= 2 % of the engine's time")  # fmt: skip
    t0 = time.perf_counter()
    loo = leave_one_out(samples, CostParams())
    seconds = time.perf_counter() - t0
    fit = evaluate(samples, params)
    head = ("engine", "GPU", "measured", "LOO pred", "err", "layer med", "n", "fit pred", "err",
            "layer med", "aims")  # fmt: skip
    say("{:31s} {:15s} {:>8s} {:>8s} {:>6s} {:>9s} {:>3s} {:>8s} {:>6s} {:>9s}  {}".format(*head))
    rows: dict[str, Any] = {}
    for s in samples:
        o, f = loo[s.name], fit[s.name]
        med = o["median_layer_error"]
        good = abs(o["total_error"]) <= AIM_TOTAL and med is not None and med <= AIM_LAYER
        fmed = f["median_layer_error"]
        say(f"{s.name:31s} {s.gpu.name:15s} {o['measured_ms']:8.3f} {o['predicted_ms']:8.3f} "
            f"{_pct(o['total_error'])} {100 * (med or 0):8.1f}% {o['layers']:3d} "
            f"{f['predicted_ms']:8.3f} {_pct(f['total_error'])} {100 * (fmed or 0):8.1f}%  "
            f"{_ok(good)}")  # fmt: skip
        rows[s.name] = {"leave_one_out": o, "fit": f, "aims_met": good}
    worst = max(abs(r["leave_one_out"]["total_error"]) for r in rows.values())
    meds = [r["leave_one_out"]["median_layer_error"] or 0.0 for r in rows.values()]
    say(f"   worst |LOO total error| {100 * worst:.1f}%, LOO median layer errors "
        f"{100 * min(meds):.1f}..{100 * max(meds):.1f}% (median {100 * statistics.median(meds):.1f}%); "
        f"{sum(r['aims_met'] for r in rows.values())}/{len(rows)} engines meet both aims; "
        f"the 8 refits took {seconds:.0f} s")  # fmt: skip
    say()
    return {"engines": rows, "refit_seconds": round(seconds, 1),
            "aims_met": all(r["aims_met"] for r in rows.values())}  # fmt: skip


# ------------------------------------------------------------------ precision ratios
def retime(sample: EngineSample, precision: str) -> EngineSample:
    """``sample``'s layers at ``precision``: every float layer's math and tensors at it, bytes
    scaled by the element sizes (layers of integer or boolean tensors unchanged)."""
    layers = []
    for x in sample.layers:
        old = x.precision
        if old not in ("fp32", "tf32", "fp16", "bf16", "int8", "fp8"):
            layers.append(x)
            continue
        k = ELEMENT_BYTES[precision] / ELEMENT_BYTES[old]
        layers.append(replace(x, precision=precision, read_bytes=x.read_bytes * k,
                              write_bytes=x.write_bytes * k, weight_bytes=x.weight_bytes * k))  # fmt: skip
    return replace(sample, name=f"{sample.name}@{precision}", layers=tuple(layers))


def ratios_section(
    samples: list[EngineSample], params: CostParams, loo: dict[str, Any] | None, say: Out
) -> dict[str, Any]:
    by = {s.name: s for s in samples}
    pred = {s.name: sum(predict(s, params)) for s in samples}
    say("== same-model precision ratios")
    say(f"   aim: predicted ratio within {AIM_RATIO:.0%} of the measured one, the order right")
    say("ResNet-18, A100, batch 32 (per-layer sums of the profiles)")
    trio = {"fp32": "resnet18-a100-fp32", "fp16": "resnet18-a100-fp16", "q/dq": "resnet18-a100-qat"}
    for label, name in trio.items():
        line = f"  {label:5s} measured {by[name].total_ms:6.3f} ms, fit {pred[name]:6.3f} ms"
        if loo:
            line += (
                f", leave-one-out {loo['engines'][name]['leave_one_out']['predicted_ms']:6.3f} ms"
            )
        say(line)
    out: dict[str, Any] = {"resnet18_a100": {}}
    sources = [("fit", pred)]
    if loo:
        sources.append(("leave-one-out", {n: loo["engines"][n]["leave_one_out"]["predicted_ms"]
                                          for n in trio.values()}))  # fmt: skip
    for a, b in (("fp32", "fp16"), ("fp16", "q/dq"), ("fp32", "q/dq")):
        measured = by[trio[a]].total_ms / by[trio[b]].total_ms
        entry: dict[str, Any] = {"measured": round(measured, 4)}
        parts = []
        for source, totals in sources:
            ratio = totals[trio[a]] / totals[trio[b]]
            err = ratio / measured - 1
            entry[source] = {"predicted": round(ratio, 4), "error": round(err, 4),
                             "aim_met": abs(err) <= AIM_RATIO}  # fmt: skip
            parts.append(f"{source} {ratio:.3f} ({_pct(err)}, {_ok(abs(err) <= AIM_RATIO)})")
        say(f"  {a}/{b}: measured {measured:.3f}, predicted " + ", ".join(parts))
        out["resnet18_a100"][f"{a}/{b}"] = entry
    for source, totals in sources:
        m_order = sorted(trio, key=lambda k: -by[trio[k]].total_ms)
        p_order = sorted(trio, key=lambda k: -totals[trio[k]])
        good = m_order == p_order
        say(f"  order, slowest first: measured {' > '.join(m_order)}; {source} "
            f"{' > '.join(p_order)}: {_ok(good)}")  # fmt: skip
        out["resnet18_a100"][f"order_{source}"] = {"measured": m_order, "predicted": p_order,
                                                   "aim_met": good}  # fmt: skip
    fp32 = by["resnet18-a100-fp32"]
    as16 = sum(predict(retime(fp32, "fp16"), params))
    err = as16 / by["resnet18-a100-fp16"].total_ms - 1
    measured16 = by["resnet18-a100-fp16"].total_ms
    say(f"  check of the re-timing below: the FP32 engine's layers re-timed at FP16 {as16:.3f} ms "
        f"against the FP16 engine measured {measured16:.3f} ms ({_pct(err)})")  # fmt: skip
    out["resnet18_a100"]["fp32_retimed_fp16"] = {"predicted_ms": round(as16, 4),
                                                 "error_vs_fp16_engine": round(err, 4)}  # fmt: skip

    r50 = by["resnet50-keras-rtx3090-fp32"]
    say("ResNet-50 (Keras), RTX 3090, FP32 engine only: no measured FP16 or INT8 engine, so no "
        "measured ratio to check")  # fmt: skip
    totals = {"fp32": pred[r50.name]}
    for p in ("fp16", "int8"):
        totals[p] = sum(predict(retime(r50, p), params))
    say(f"  fp32 measured {r50.total_ms:.3f} ms, fit {totals['fp32']:.3f} ms; its layers re-timed "
        f"(every layer at the precision, no Q/DQ or reformats): fp16 {totals['fp16']:.3f} ms, "
        f"int8 {totals['int8']:.3f} ms")  # fmt: skip
    good = totals["fp32"] > totals["fp16"] > totals["int8"]
    say(f"  predicted fp32/fp16 {totals['fp32'] / totals['fp16']:.2f}x, fp16/int8 "
        f"{totals['fp16'] / totals['int8']:.2f}x; order fp32 > fp16 > int8: {_ok(good)}")  # fmt: skip
    out["resnet50_rtx3090"] = {"measured_fp32_ms": round(r50.total_ms, 4),
                               "predicted_ms": {k: round(v, 4) for k, v in totals.items()},
                               "order_aim_met": good, "measured_pair": None}  # fmt: skip
    say()
    return out


# ------------------------------------------------------------------ the ONNX path
def _export_resnet18(folder: Path) -> dict[str, Path]:
    """qdq's ResNet-18 exports, default placement and conv-only (as tests/test_speed_onnx.py)."""
    import torch
    import torchvision.models as tv

    import qdq

    paths = {}
    for name, config in (
        ("default", None),
        ("conv-only", qdq.QuantConfig.tensorrt(disable=("residual", "pooling", "performance"))),
    ):
        torch.manual_seed(0)
        x = torch.randn(2, 3, 64, 64)  # exported small; timed at batch 32 on 224x224
        prepared = qdq.prepare(tv.resnet18().eval(), (x,), config)
        qdq.calibrate(prepared, [x], method="max", show_progress=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = folder / f"resnet18-{name}.onnx"
            paths[name] = qdq.export_onnx(prepared, (x[:1],), out, exporter="torchscript").path
    return paths


def onnx_section(say: Out) -> dict[str, Any]:
    import onnx

    from qdq.lint.speed.latency import predict_latency

    say("== the ONNX path: qdq's ResNet-18 export, batch 32, 224x224, A100 (qdq lint --latency)")
    real = {"default": (REAL_DEFAULT_MS, "about, the structure's known figure"),
            "conv-only": (REAL_CONV_ONLY_MS, "measured, resnet18-a100-qat")}  # fmt: skip
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        paths = _export_resnet18(Path(tmp))
        for name, path in paths.items():
            model = onnx.load(str(path))
            shapes = {model.graph.input[0].name: (32, 3, 224, 224)}
            r = predict_latency(path, target="trt10-a100", shapes=shapes)
            real_ms, how = real[name]
            real_speedup = REAL_FP16_MS / real_ms
            qdq_nodes = sum(ly.op == "qdq" for ly in r.layers)
            say(f"  {name:9s} Q/DQ engine {r.total_ms:.3f} ms (real {real_ms:.3f}, {how}; "
                f"{_pct(r.total_ms / real_ms - 1)}), FP16 build {r.fp16_total_ms:.3f} ms (real "
                f"{REAL_FP16_MS:.3f}; {_pct(r.fp16_total_ms / REAL_FP16_MS - 1)}), speed-up "
                f"{r.speedup_vs_fp16:.3f}x (real {real_speedup:.3f}x; "
                f"{_pct(r.speedup_vs_fp16 / real_speedup - 1)}); {qdq_nodes} standalone Q/DQ, "
                f"layers that do not pay: {len(r.not_paying)}")  # fmt: skip
            out[name] = {"total_ms": round(r.total_ms, 4), "fp16_total_ms": round(r.fp16_total_ms, 4),
                         "speedup_vs_fp16": round(r.speedup_vs_fp16, 4), "real_ms": real_ms,
                         "real_fp16_ms": REAL_FP16_MS, "real_speedup": round(real_speedup, 4),
                         "standalone_qdq": qdq_nodes,
                         "not_paying": [n.name for n in r.not_paying]}  # fmt: skip
    d = out["default"]
    err = d["speedup_vs_fp16"] / d["real_speedup"] - 1
    d["aim_met"] = abs(err) <= AIM_RATIO
    say(f"  aim: default placement within {AIM_RATIO:.0%} of the real {d['real_speedup']:.2f}x: "
        f"{d['speedup_vs_fp16']:.2f}x ({_pct(err)}): {_ok(d['aim_met'])}")  # fmt: skip
    c = out["conv-only"]
    c["aim_met"] = c["speedup_vs_fp16"] <= 1.0
    say(f"  aim: conv-only predicted no faster than FP16: {c['speedup_vs_fp16']:.2f}x: "
        f"{_ok(c['aim_met'])}")  # fmt: skip
    say()
    return out


# ------------------------------------------------------------------ main
def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--out-dir", default=str(Path(__file__).resolve().parent))
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    say = Out()
    today = datetime.date.today().isoformat()
    commit = _git("rev-parse", "--short", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--", "src/qdq/lint/speed"))
    params = load_params()
    say(
        f"engine-time model, {today}, commit {commit}{' (src/qdq/lint/speed modified)' if dirty else ''}"
    )
    say(f"parameters (params.json): {json.dumps(params.to_dict())}")
    say()
    samples = load_samples(FIXTURES)
    doc: dict[str, Any] = {"date": today, "commit": commit, "speed_modified": dirty,
                           "params": params.to_dict()}  # fmt: skip
    loo = loo_section(samples, params, say) if "loo" in args.sections else None
    if loo:
        doc["loo"] = loo
    if "ratios" in args.sections:
        doc["ratios"] = ratios_section(samples, params, loo, say)
    if "onnx" in args.sections:
        doc["onnx"] = onnx_section(say)
    if not args.no_write:
        base = Path(args.out_dir) / f"engine_time_{today}"
        base.with_suffix(".txt").write_text("\n".join(say.lines) + "\n", encoding="utf-8")
        base.with_suffix(".json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {base}.txt and .json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
