"""The terminal summary of a ``qdq quantize`` job (:func:`print_summary`): the headline figures,
each output against FP32, the PTQ recipe and its search, the fallback, lint, the worst layers,
the time per stage and the budget, all read from ``report.json``'s dict."""

from __future__ import annotations

from typing import Any

from qdq.pipeline.report import format_label

__all__ = ["print_summary"]


def _figure_delta(name: str, delta: float) -> str:
    """INT8 − FP32 of the headline: in dB for a PSNR, else in points (hundredths)."""
    return f"{delta:+.2f} dB" if name == "psnr" else f"{100 * delta:+.2f} points"


def print_summary(r: dict[str, Any], out_dir: str) -> None:
    """The human summary of a report: metric, coverage, lint, timings, files."""
    name = r["metric_name"]
    fp32, int8 = r["fp32_metric"], r["int8_metric"]
    label = format_label((r.get("settings") or {}).get("format"))
    print(
        f"{name}: FP32 {fp32:.4f} (torch)  {label} {int8:.4f} (exported ONNX in ONNX Runtime; "
        f"{_figure_delta(name, int8 - fp32)})"
    )
    top = r.get("headline")
    if top:
        print(f"  headline: {top['text']}")
    for d in r["fp32"].get("degenerate") or []:
        print(f"  WARNING: FP32 {d['name']} {d['problem']}: {d['detail']}; the {label} figures "
              f"{'mean nothing' if d['headline'] else 'of that output mean nothing'}")  # fmt: skip
    if r.get("per_image"):
        print("  per-image detection lists: calibrated, evaluated and exported at batch 1")
    i8 = r["int8"]
    agree = "" if i8["top1_agreement"] is None else f"top-1 agreement {i8['top1_agreement']:.4f}, "
    print(
        f"  {label} vs FP32 (output 0): {agree}cosine mean {i8['cosine_mean']:.6f} "
        f"(min {i8['cosine_min']:.6f}); torch fake-quant {r['int8_torch']['metric']:.4f}"
    )
    _print_outputs(r.get("outputs") or [], label)
    figures = i8.get("figures")
    if figures:
        fp32_figures = r["fp32"]["figures"]
        pairs = ", ".join(f"{k} {fp32_figures[k]:.4g} → {v:.4g}" for k, v in figures.items())
        print(f"  {r['metric_name']} figures, FP32 → {label}: {pairs}")
    methods = r.get("calibration_methods")
    if methods:
        head = f"{label} (torch)"
        width = max(13, len(head) + 1)
        print(f"  {'method':<11}{head:>{width}}{'drop':>8}{'agree':>8}{'cosine':>10}")
        scale = 1 if name == "psnr" else 100  # the drop in dB, else in points
        for m, s in methods.items():
            ag = "-" if s["top1_agreement"] is None else f"{s['top1_agreement']:.4f}"
            mark = "  <- exported" if m == r["settings"]["method"] else ""
            print(
                f"  {m:<11}{s['metric']:>{width}.4f}{scale * (s['metric'] - fp32):>+8.2f}{ag:>8}"
                f"{s['cosine_mean']:>10.5f}{mark}"
            )
    ptq = r.get("ptq")
    if ptq:
        print(f"PTQ: {ptq['steps']} (recipe {ptq['recipe']})")
        for name, rep in ptq.items():
            if isinstance(rep, dict) and rep.get("summary"):
                print(f"  {name}: {rep['summary']}")
        _print_search(ptq.get("recipe_search"))
    _print_fallback(r.get("fallback"))
    qat = r.get("qat")
    if qat:
        before = qat.get("ptq_metric_torch")
        gain = (
            ""
            if before is None
            else (
                f"; {name} (torch fake-quant) PTQ {before:.4f} → QAT {r['int8_torch']['metric']:.4f}"
            )
        )
        print(f"QAT: {qat['summary']}, {qat['seconds_per_epoch']:.1f} s/epoch{gain}")
    lint = r["lint"]
    if lint is None:
        print(f"lint {r['lint_verdict']} (the lint stage failed; see below)")
    else:
        fp8 = (
            f", FP8 {lint['fp8_weighted_layers']}/{lint['weighted_layers']} "
            f"({lint['fp8_flops_percent']}% of FLOPs)"
            if lint.get("fp8_weighted_layers")
            else ""
        )
        for key, shown in (("nvfp4", "NVFP4"), ("mxfp8", "MXFP8"), ("int4w", "INT4 weight-only")):
            if lint.get(f"{key}_weighted_layers"):
                fp8 += f", {shown} {lint[f'{key}_weighted_layers']}/{lint['weighted_layers']}"
        print(
            f"predicted TensorRT INT8 coverage: {lint['int8_weighted_layers']}/"
            f"{lint['weighted_layers']} weighted layers ({lint['int8_flops_percent']}% of FLOPs)"
            f"{fp8}; lint {r['lint_verdict']} ({r['lint_target']}, "
            f"{len(r['lint_findings'])} findings)"
        )
    _print_latency(r)
    for s in r["skipped_layers"][:10]:
        print(f"  float: {s['name']} ({s['type']}) {s['rule']}: {s['reason']}")
    if len(r["skipped_layers"]) > 10:
        print(f"  ... and {len(r['skipped_layers']) - 10} more (report.json: skipped_layers)")
    for w in r["warnings"][:5]:
        print(f"  warning: {' '.join(w.split())[:200]}")
    errors = r.get("layer_errors")
    if errors and errors["rows"]:
        worst = ", ".join(
            f"{e['name']} {_db(e['accumulated']['sqnr_db'])}" for e in errors["rows"][:3]
        )
        print(f"worst layers (SQNR vs FP32 on {errors['samples']} samples): {worst}")
    for e in r.get("stage_errors") or []:
        print(
            f"warning: stage {e['stage']} failed ({e['error']}: {e['message'][:200]}); "
            "everything else was written (report.json: stage_errors)"
        )
    times = ", ".join(f"{k} {v:.1f}" for k, v in r["timings_s"].items())
    print(f"time: {r['total_s']:.1f} s ({times})")
    _print_budget(r.get("budget"))
    print(f"wrote {out_dir}/: {', '.join(r['files'].values())}")


def _print_latency(r: dict[str, Any]) -> None:
    """The predicted engine time against FP16 and what ``--objective speed`` kept in FP16."""
    from qdq.lint.speed.latency import speedup_text

    lat = r.get("latency")
    if lat:
        print(
            f"predicted on {lat['gpu_label']}: {_ms(lat['total_ms'])} ms vs FP16 "
            f"{_ms(lat['fp16_total_ms'])} ms ({speedup_text(lat['speedup_vs_fp16'])}x)"
        )
    objective = r.get("objective") or {}
    if objective.get("name") == "speed":
        print(f"  --objective speed: {objective.get('summary', '')}")


def _ms(value: float) -> str:
    return f"{value:.3f}" if value < 10 else f"{value:.1f}"


def _print_budget(b: dict[str, Any] | None) -> None:
    """The time budget: planned and spent, the clock's part, what it left out."""
    from qdq.pipeline.budget import budget_lines

    for line in budget_lines(b):
        print(line)


def _print_outputs(rows: list[dict[str, Any]], label: str) -> None:
    """One line per output tensor when there are several (the headline's marked ``*``)."""
    if len(rows) < 2:
        return
    from qdq.pipeline.outputs import describe

    print(f"  every output, {label} (ONNX Runtime) vs FP32 ({len(rows)} tensors):")
    for row in rows:
        print(f"  {'*' if row['headline'] else ' '} {describe(row)}")


def _print_fallback(fb: dict[str, Any] | None) -> None:
    if fb is None:
        return
    verdict = "within" if fb["within_budget"] else "NOT within"
    print(
        f"fallback (--max-drop {fb['max_drop']:g}, torch fake-quant on the evaluation data): "
        f"full INT8 {fb['full_int8_metric']:.4f} → {fb['int8_metric']:.4f}, {verdict} budget; "
        f"kept in float: {', '.join(fb['fallback']) or 'nothing'}"
    )
    for step in fb["steps"]:
        if step["kept"]:
            cost = step["cost"]
            extra = (
                ""
                if cost is None
                else (
                    f"; TensorRT: {cost['int8_layers_lost']} weighted layer(s) leave INT8, "
                    f"{cost['float_islands']:+d} float island(s), {cost['unfused_qdq']:+d} unfused Q/DQ"
                )
            )
            print(f"  float: {step['unit']} → metric {step['metric']:.4f}{extra}")


def _db(value: float | None) -> str:
    return "identical" if value is None else f"{value:.1f} dB"


def _print_search(found: Any) -> None:
    """The recipe search's table: each candidate's held-out score and seconds."""
    if not isinstance(found, dict) or not found.get("rows"):
        return
    print(
        f"    {'recipe':<28}{'held-out ' + str(found['score']):>28}{'folds':>6}{'seconds':>9}  status"
    )
    for t in found["rows"]:
        value = "-" if t["score"] is None else f"{t['score']:.6f}"
        mark = "  <- kept" if t["recipe"] == found["kept"] else ""
        folds = t.get("folds", 1)
        print(
            f"    {t['recipe']:<28}{value:>28}{folds:>6}{t['seconds']:>9.1f}  {t['status']}{mark}"
        )
    print(f"    kept {found['kept']}: {found['reason']}")
