"""FP8 (issue 49): FP32, qdq INT8, qdq FP8 and ModelOpt FP8 side by side, through the exports.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/fp8.py [--rows a,b] [--json OUT] [--text OUT]
[--timeout SECONDS] [--peer-python PY] [--target TARGET] [--work DIR]``. Prints one table and its
notes; asserts nothing.

Rows (``benchmarks/fp8_models.py``): the six zoo models on their own data, ViT and Swin
(torchvision, small), BERT and DistilBERT (transformers, small) and a diffusers UNet denoiser,
with random weights. Per row, each step is a process of its own (one ONNX Runtime session per
process), as in ``benchmarks/time_to_result.py``, whose helpers this reuses:

1. ``prep``: the data as ``qdq quantize`` resolves and splits it, saved as arrays for the peer
   (``calib.npz``, ``eval.npz``), and FP32's outputs on the evaluation samples in torch, the
   reference of every figure (``time_to_result.prep``);
2. ``qdq quantize --target TARGET`` (default ``trt10-hopper``), INT8 (its defaults: the recipe
   search) and ``--format fp8``: the headline metric and the cosine with FP32 of the exported ONNX
   in ONNX Runtime (``report.json``'s ``int8``), and the linter's predicted precision mix (INT8
   and FP8 weighted layers of all weighted layers) and unfused Q/DQ (reformats), from the
   report's lint summary for that target;
3. ModelOpt FP8 (``benchmarks/peers/fp8_peers.py`` in ``--peer-python``):
   ``mtq.quantize(model, mtq.FP8_DEFAULT_CFG, forward_loop)`` on the same calibration samples,
   its fake-quantized model in torch on the evaluation samples (the ``torch`` figure), and its
   ONNX export, run in ONNX Runtime as written (``time_to_result_peers.py evaluate``). When that
   ONNX does not load (ModelOpt 0.47 leaves its FP8 Q/DQ in the ``trt`` domain with ``uint8``
   outputs), the error is recorded and a repaired copy (those nodes moved to the ONNX domain,
   their outputs typed ``float8e4m3fn``: the ops ONNX defines, nothing else changed) is run
   instead, labelled ``repaired``; ``qdq lint --target TARGET`` reads the export as written.

Every figure is scored by ``qdq.pipeline.evaluate.score`` against the same FP32 reference (the
zoo's task metric, else the first output's agreement or cosine), as ``qdq quantize`` reports it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fp8_models import (  # noqa: E402
    OUTPUT_KIND,
    ROWS,
    Row,
    as_quantize_gets_it,
    model_spec,
    write_data,
)
from time_to_result import (  # noqa: E402
    BATCH,
    PEERS_SCRIPT,
    commit,
    data_options,
    env_with,
    log,
    prep,
    rows_and_src,
    run,
    score_outputs,
    stage_lines,
)

PEER_SCRIPT = HERE / "peers" / "fp8_peers.py"
FORMATS = ("int8", "fp8", "mixed")


# ------------------------------------------------------------------------------------------ qdq
def run_qdq(row: Row, fmt: str, a: argparse.Namespace, work: Path) -> dict[str, Any]:
    """``qdq quantize`` (``--format fmt``) on the row; its figures from ``report.json``."""
    out = work / f"qdq-{fmt}"
    data, flags = data_options(row)
    if row.data == "npz":
        data = str(work / "data.npz")
    cmd = [a.qdq_python, "-m", "qdq", "quantize", "--model", model_spec(row), "--out", str(out),
           "--no-progress", "--format", fmt, "--target", a.target,
           *(["--data", data] if data else []), *flags,
           *(["--output-kind", OUTPUT_KIND[row.name]] if row.name in OUTPUT_KIND else [])]  # fmt: skip
    t = run(cmd, work / f"qdq-{fmt}.log", a.timeout, env_with(a.qdq_src))
    if t["rc"] != 0:
        t["stages_printed"] = stage_lines(work / f"qdq-{fmt}.log")
        if not t["killed"]:
            t["error"] = full_error(work / f"qdq-{fmt}.log", work)
        return t
    r = json.loads((out / "report.json").read_text(encoding="utf-8"))
    t.update({"metric": r["int8_metric"], "cosine": r["int8"]["cosine_mean"],
              "cosine_min": r["int8"].get("cosine_min"), "fp32_metric": r["fp32_metric"],
              "recipe": r["settings"].get("recipe"), "formats": r["settings"].get("format"),
              "opset": r["settings"].get("opset"), "lint": r.get("lint"),
              "lint_target": r.get("lint_target"), "lint_verdict": r.get("lint_verdict"),
              "warn_rules": sorted({f["rule"] for f in r.get("lint_findings") or []
                                    if f.get("severity") in ("WARN", "ERROR")}),
              "output_cosines": [o["cosine_mean"] for o in r.get("outputs") or []],
              "timings_s": r["timings_s"]})  # fmt: skip
    return t


# ------------------------------------------------------------------------------------- modelopt
def repair(src: Path, dst: Path) -> int:
    """Copy ModelOpt's FP8 ONNX with its ``trt``-domain QuantizeLinear/DequantizeLinear moved to
    the ONNX domain and their quantized outputs typed ``float8e4m3fn`` (ModelOpt types them
    ``uint8``); the number of nodes moved."""
    import onnx

    model = onnx.load(str(src))
    moved, quantized = 0, set()
    for node in model.graph.node:
        if node.domain == "trt" and node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            node.domain, moved = "", moved + 1
            if node.op_type == "QuantizeLinear":
                quantized.update(node.output)
    for value in model.graph.value_info:
        if value.name in quantized:
            value.type.tensor_type.elem_type = onnx.TensorProto.FLOAT8E4M3FN
    onnx.save(model, str(dst))
    return moved


def lint_json(path: Path, a: argparse.Namespace, log_path: Path) -> dict[str, Any]:
    """``qdq lint --target --json`` of an ONNX (exit 1/2 are its verdicts, not failures)."""
    cmd = [a.qdq_python, "-m", "qdq", "lint", "--target", a.target, "--json", str(path)]
    r = run(cmd, log_path, a.timeout, env_with(a.qdq_src))
    if r["rc"] not in (0, 1, 2):
        return {"error": r.get("error", "killed")}
    text = log_path.read_text(encoding="utf-8")
    d, _ = json.JSONDecoder().raw_decode(text[text.index("\n{") + 1 :])
    warn = {f["rule"] for f in d["findings"] if f.get("severity") in ("WARN", "ERROR")}
    return {**d["summary"], "verdict": d["verdict"], "warn_rules": sorted(warn)}


def full_error(path: Path, work: Path) -> str:
    """The last line of a log that names an exception, whole, the row's folder left out."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    hits = [s.strip() for s in lines
            if re.match(r"^[\w.]*(Error|Exception|Fail)\b|^qdq \w+: error", s.strip())]  # fmt: skip
    return (hits or lines or ["(no output)"])[-1].replace(f"{work}/", "")


def scored(work: Path, meta: dict[str, Any], outs: Path) -> dict[str, Any]:
    """``time_to_result.score_outputs``; where the row's headline is the cosine (``--output-kind
    tensor``), the metric is the first output's mean cosine, as ``qdq quantize`` reports it."""
    s = score_outputs(work, meta, outs)
    if meta["metric_name"] == "cosine":
        s["metric"] = s["cosine"]
    return s


def evaluate(onnx: Path, tag: str, a: argparse.Namespace, work: Path,
             meta: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """An ONNX in ONNX Runtime on the evaluation samples (a process), scored against FP32."""
    outs, res = work / f"{tag}-outputs.npz", work / f"{tag}.json"
    e = run([a.qdq_python, str(PEERS_SCRIPT), "evaluate", str(onnx), str(work / "eval.npz"),
             str(outs), "--batch", str(BATCH), "--result", str(res)], work / f"{tag}.log",
            a.timeout, env_with(a.qdq_src))  # fmt: skip
    if e["rc"] != 0:
        why = "killed" if e["killed"] else full_error(work / f"{tag}.log", work)
        return {"error": why, "wall_s": e["wall_s"]}
    return {**scored(work, meta, outs), "wall_s": e["wall_s"]}


def run_modelopt(row: Row, a: argparse.Namespace, work: Path,
                 meta: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """ModelOpt FP8 on the row: its torch figure, its export in ONNX Runtime, its lint."""
    if not Path(a.peer_python).exists():
        return {"not_run": f"no {a.peer_python} (build the peer environment: benchmarks/README.md)"}
    job = work / "job.json"
    job.write_text(json.dumps({"row": row.name, "src": a.qdq_src, "benchmarks": str(HERE),
                               "batch": BATCH}), encoding="utf-8")  # fmt: skip
    t: dict[str, Any] = {"peer": run([a.peer_python, str(PEER_SCRIPT), str(job)],
                                     work / "modelopt.log", a.timeout, env_with(None))}  # fmt: skip
    if t["peer"]["rc"] != 0 or not (work / "peers.json").exists():
        t["not_run"] = "killed" if t["peer"]["killed"] else full_error(work / "modelopt.log", work)
        return t
    t.update(json.loads((work / "peers.json").read_text(encoding="utf-8")))
    if t.get("error"):
        t["not_run"] = t["error"]
        return t
    t["torch"] = scored(work, meta, work / "modelopt-torch-outputs.npz")
    onnx = work / "modelopt-fp8.onnx"
    if t.get("export_error"):
        return t
    t["lint"] = lint_json(onnx, a, work / "modelopt-lint.log")
    t["ort"] = evaluate(onnx, "modelopt-ort", a, work, meta)
    if "error" in t["ort"]:
        fixed = work / "modelopt-fp8.repaired.onnx"
        t["repaired_nodes"] = repair(onnx, fixed)
        t["ort_repaired"] = evaluate(fixed, "modelopt-ort-repaired", a, work, meta)
    return t


# ----------------------------------------------------------------------------------------- rows
def run_row(row: Row, a: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Every tool on one row; the row's record."""
    start = time.perf_counter()
    rec: dict[str, Any] = {"row": row.name, "note": row.note, "model": model_spec(row),
                           "date": time.strftime("%Y-%m-%d %H:%M"), "target": a.target,
                           "qdq_commit": commit(a.qdq_src),
                           "load_before": round(os.getloadavg()[0], 2), "tools": {}}  # fmt: skip
    log(f"{row.name}: prep (data, FP32 reference)")
    count = ["--eval-samples", str(row.evaluate)] if row.evaluate else []
    p = run([a.qdq_python, __file__, "--stage", "prep", "--rows", row.name, "--work", str(work),
             *count], work / "prep.log", a.timeout, env_with(a.qdq_src))  # fmt: skip
    if p["rc"] != 0:
        rec["error"] = f"prep failed: {p.get('error', 'killed')}"
        return rec
    meta = json.loads((work / "meta.json").read_text(encoding="utf-8"))
    rec.update({k: meta[k] for k in ("calibration_samples", "evaluation_samples", "metric_name",
                                     "fp32_metric", "params_M")})  # fmt: skip
    for fmt in FORMATS:
        log(f"{row.name}: qdq quantize --format {fmt}")
        rec["tools"][fmt] = run_qdq(row, fmt, a, work)
    if row.name in a.peers_from:  # ModelOpt's record of an earlier run on the same data
        rec["tools"]["modelopt"] = a.peers_from[row.name]
        rec["modelopt_from"] = str(a.peers_from_path)
    else:
        log(f"{row.name}: ModelOpt FP8")
        rec["tools"]["modelopt"] = run_modelopt(row, a, work, meta)
    rec["wall_s"] = round(time.perf_counter() - start, 1)
    rec["load_after"] = round(os.getloadavg()[0], 2)
    return rec


def stage_prep(row: Row, work: Path) -> None:
    """Stage ``prep`` (its own process): the row's ``.npz`` if it has one, then
    ``time_to_result.prep`` with the row as ``qdq quantize`` gets it (and its headline as
    ``--output-kind`` sets it)."""
    npz = work / "data.npz" if row.data == "npz" else None
    if npz is not None:
        write_data(row, npz)
    prep(as_quantize_gets_it(row, npz), work)
    if OUTPUT_KIND.get(row.name) == "tensor":  # the headline is the cosine, FP32's is 1
        meta = json.loads((work / "meta.json").read_text(encoding="utf-8"))
        meta.update(metric_name="cosine", fp32_metric=1.0)
        (work / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")


# --------------------------------------------------------------------------------------- table
def _fig(t: dict[str, Any] | None) -> str:
    if not t or t.get("metric") is None:
        return "—"
    return f"{t['metric']:.4f} / {t['cosine']:.5f}"


def _mix(lint: dict[str, Any] | None) -> str:
    if not lint or "weighted_layers" not in lint:
        return "—"
    return (f"{lint['int8_weighted_layers']} / {lint.get('fp8_weighted_layers', 0)} of "
            f"{lint['weighted_layers']}, {lint['unfused_qdq']}")  # fmt: skip


def qdq_cell(t: dict[str, Any] | None) -> str:
    if not t:
        return "—"
    if t["rc"] != 0:
        return f"> {t['wall_s']:.0f} s (killed)" if t["killed"] else "failed (notes)"
    return _fig(t)


def modelopt_cells(t: dict[str, Any] | None) -> tuple[str, str, str]:
    """(torch figure, ONNX Runtime figure, lint mix) of the ModelOpt cell."""
    if not t:
        return "—", "—", "—"
    if t.get("not_run"):
        return f"n/a ({t['not_run'][:80]})", "—", "—"
    ort = t.get("ort") or {}
    if t.get("export_error"):
        cell = "export failed (notes)"
    elif "error" not in ort:
        cell = f"{_fig(ort)} (as exported)"
    elif (t.get("ort_repaired") or {}).get("metric") is not None:
        cell = f"{_fig(t['ort_repaired'])} (repaired)"
    else:
        cell = "did not run (notes)"
    return f"{_fig(t.get('torch'))} (torch)", cell, _mix(t.get("lint"))


def table(recs: list[dict[str, Any]]) -> str:
    """The side-by-side table, then each row's notes."""
    lines = [
        "| row | metric | FP32 | qdq INT8 | qdq FP8 | qdq mixed | ModelOpt FP8, torch fake-quant | "
        "ModelOpt FP8 ONNX in ORT | qdq INT8 export | qdq FP8 export | qdq mixed export | "
        "ModelOpt FP8 export |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes: list[str] = []
    for rec in recs:
        if rec.get("error"):
            lines.append(f"| {rec['row']} | not run: {rec['error']} |" + " |" * 10)
            continue
        tools = rec["tools"]
        mo_torch, mo_ort, mo_mix = modelopt_cells(tools.get("modelopt"))
        mixes = [_mix((tools.get(f) or {}).get("lint")) for f in FORMATS]
        lines.append(f"| {rec['row']} | {rec['metric_name']} | {rec['fp32_metric']:.4f} | "
                     f"{qdq_cell(tools.get('int8'))} | {qdq_cell(tools.get('fp8'))} | "
                     f"{qdq_cell(tools.get('mixed'))} | {mo_torch} | {mo_ort} | "
                     f"{' | '.join(mixes)} | {mo_mix} |")  # fmt: skip
        notes += row_notes(rec)
    lines += ["", *aims(recs)]
    head = ["Cells: metric / mean cosine with FP32 (first output). Exports: predicted INT8 / FP8 "
            "weighted layers of all weighted layers, unfused Q/DQ (reformats), by qdq's linter "
            f"for {recs[0].get('target') if recs else '—'}.", ""]  # fmt: skip
    return "\n".join([*head, *lines, "", *notes])


def modelopt_figure(t: dict[str, Any] | None) -> tuple[dict[str, Any] | None, str]:
    """ModelOpt's figure to compare with: its ONNX in ONNX Runtime (as exported, else repaired),
    else its torch fake-quant figure; and which it is."""
    t = t or {}
    for key, how in (("ort", "ONNX as exported"), ("ort_repaired", "ONNX repaired"),
                     ("torch", "torch fake-quant")):  # fmt: skip
        if (t.get(key) or {}).get("metric") is not None:
            return t[key], how
    return None, ""


def aims(recs: list[dict[str, Any]]) -> list[str]:
    """Issue 49's aims per row: FP8 within 0.3 points of FP32 (0.001 where the metric is a
    cosine), cosine >= 0.999 on the transformer rows, FP8 at or ahead of ModelOpt FP8 (metric,
    then cosine)."""
    out = ["| row | qdq FP8 vs FP32 | qdq FP8 vs ModelOpt FP8 | qdq mixed vs the better of INT8 "
           "and FP8; reformats |", "|---|---|---|---|"]  # fmt: skip
    for rec in recs:
        fp8 = (rec.get("tools") or {}).get("fp8") or {}
        if fp8.get("metric") is None:
            out.append(f"| {rec['row']} | no FP8 result | — | {mixed_aim(rec)} |")
            continue
        drop = 100 * (rec["fp32_metric"] - fp8["metric"])
        if rec["row"] in ("vit", "swin", "bert", "distilbert", "gpt2"):
            ok = fp8["cosine"] >= 0.999
            first = f"cosine {fp8['cosine']:.5f} ≥ 0.999: {'yes' if ok else 'no'}"
        elif rec["metric_name"] == "cosine":
            ok = fp8["metric"] >= rec["fp32_metric"] - 0.001
            first = f"cosine {fp8['metric']:.5f} within 0.001 of FP32: {'yes' if ok else 'no'}"
        else:
            ok = drop <= 0.3
            first = (f"{rec['metric_name']} drop {drop:+.2f} pt ≤ 0.3: {'yes' if ok else 'no'} "
                     f"(cosine {fp8['cosine']:.5f})")  # fmt: skip
        mo, how = modelopt_figure(rec["tools"].get("modelopt"))
        second = "—"
        if mo is not None:
            ours, theirs = (fp8["metric"], fp8["cosine"]), (mo["metric"], mo["cosine"])
            verdict = "ahead" if ours > theirs else "tie" if ours == theirs else "BEHIND"
            second = (f"{verdict}: {fp8['metric']:.4f} / {fp8['cosine']:.5f} vs "
                      f"{mo['metric']:.4f} / {mo['cosine']:.5f} ({how})")  # fmt: skip
        out.append(f"| {rec['row']} | {first} | {second} | {mixed_aim(rec)} |")
    return out


def mixed_aim(rec: dict[str, Any]) -> str:
    """Issue 49's aim for ``mixed``: at least as accurate as the better of INT8 and FP8 (metric,
    then cosine), with no more predicted reformats (unfused Q/DQ) than either."""
    tools = rec.get("tools") or {}
    mixed = tools.get("mixed") or {}
    if mixed.get("metric") is None:
        return "no mixed result"
    done = {f: tools[f] for f in ("int8", "fp8") if (tools.get(f) or {}).get("metric") is not None}
    if not done:
        return "no INT8 / FP8 result"
    best_fmt = max(done, key=lambda f: (done[f]["metric"], done[f]["cosine"]))
    best = done[best_fmt]
    ours, theirs = (mixed["metric"], mixed["cosine"]), (best["metric"], best["cosine"])
    verdict = "at least as accurate" if ours >= theirs else "LESS accurate"
    if ours < theirs and mixed["metric"] >= best["metric"]:
        verdict = "same metric, lower cosine"
    unfused = {f: ((tools.get(f) or {}).get("lint") or {}).get("unfused_qdq") for f in FORMATS}
    fewest = min((v for f, v in unfused.items() if f != "mixed" and v is not None), default=None)
    reformats = "—"
    if unfused["mixed"] is not None and fewest is not None:
        ok = "yes" if unfused["mixed"] <= fewest else "NO"
        reformats = f"{unfused['mixed']} vs {unfused['int8']} / {unfused['fp8']}: {ok}"
    return (f"{verdict}: {mixed['metric']:.4f} / {mixed['cosine']:.5f} vs {best_fmt.upper()} "
            f"{best['metric']:.4f} / {best['cosine']:.5f}; {reformats}")  # fmt: skip


def row_notes(rec: dict[str, Any]) -> list[str]:
    """One line per tool of a row: recipe, formats, verdicts, seconds, errors."""
    out = [f"- **{rec['row']}** ({rec['note']}; {rec['calibration_samples']} calibration / "
           f"{rec['evaluation_samples']} evaluation samples; {rec['params_M']} M params; "
           f"{rec['wall_s']:.0f} s, load {rec['load_before']} → {rec['load_after']})"]  # fmt: skip
    for fmt in FORMATS:
        t = rec["tools"].get(fmt) or {}
        if t.get("rc") == 0:
            lint = t.get("lint") or {}
            out.append(f"  - qdq {fmt}: recipe {t['recipe']}; quantizers {t['formats']}; "
                       f"opset {t['opset']}; lint {t['lint_verdict']} "
                       f"{','.join(t['warn_rules']) or '-'}; float islands "
                       f"{lint.get('float_islands')}; {t['wall_s']:.1f} s")  # fmt: skip
        elif t:
            why = "killed" if t["killed"] else t.get("error")
            out.append(f"  - qdq {fmt}: FAILED after {t['wall_s']:.1f} s: {why}")
    t = rec["tools"].get("modelopt") or {}
    if rec.get("modelopt_from"):
        out.append(f"  - ModelOpt FP8 from {rec['modelopt_from']} (run at {t.get('date', '?')})")
    if t.get("not_run"):
        out.append(f"  - ModelOpt FP8: not run: {t['not_run']}")
    elif t:
        q, lint = t.get("quantizers") or {}, t.get("lint") or {}
        ort = t.get("ort") or {}
        what = [f"{q.get('enabled')} of {q.get('inserted')} quantizers enabled",
                f"quantize {t.get('quantize_s')} s"]  # fmt: skip
        if t.get("export_error"):
            what.append(f"export failed: {t['export_error']}")
        elif "error" in ort:
            rep = t.get("ort_repaired") or {}
            what.append(f"its ONNX (opset {t['export']['opset']}) does not load in ONNX Runtime: "
                        f"{ort['error']}; repaired ({t.get('repaired_nodes')} Q/DQ nodes): "
                        + (_fig(rep) if "error" not in rep else f"fails too: {rep['error']}"))  # fmt: skip
        if lint:
            what.append(
                f"lint {lint.get('verdict')} {','.join(lint.get('warn_rules') or []) or '-'}"
            )
        out.append("  - ModelOpt FP8: " + "; ".join(what))
    return out


# ----------------------------------------------------------------------------------------- main
def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default=",".join(ROWS), help=f"of {', '.join(ROWS)}")
    p.add_argument("--json", type=Path, help="merge each row's record into this JSON")
    p.add_argument("--text", type=Path, help="write the table of every row in --json here")
    p.add_argument("--timeout", type=float, default=1800.0, help="per tool run, seconds")
    p.add_argument("--target", default="trt10-hopper", help="the linter's TensorRT target")
    p.add_argument("--qdq-python", default=sys.executable, help="python that runs qdq")
    p.add_argument("--qdq-src", default=str(HERE.parent / "src"), help="qdq's src directory")
    p.add_argument("--peer-python", default="/tmp/peers/bin/python", help="ModelOpt's python")
    p.add_argument(
        "--peers-from",
        type=Path,
        help="take ModelOpt's records from this JSON "
        "(an earlier run of this script on the same rows and data) instead of running it",
    )
    p.add_argument("--work", type=Path, help="keep every row's files here (default: temporary)")
    p.add_argument("--eval-samples", type=int, help="evaluation samples of every row (smoke runs)")
    p.add_argument("--stage", choices=("prep",), help=argparse.SUPPRESS)
    a = rows_and_src(p, p.parse_args(argv), ROWS)
    a.peers_from_path, a.peers_from = a.peers_from, {}
    if a.peers_from_path is not None:
        if not a.peers_from_path.is_file():
            p.error(f"--peers-from {a.peers_from_path}: no such file")
        rows = json.loads(a.peers_from_path.read_text(encoding="utf-8")).get("rows", {})
        a.peers_from = {name: dict(rec["tools"]["modelopt"], date=rec.get("date"))
                        for name, rec in rows.items() if "modelopt" in rec.get("tools", {})}  # fmt: skip
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.stage == "prep":
        row = ROWS[a.rows[0]]
        stage_prep(dataclasses.replace(row, evaluate=a.eval_samples or row.evaluate), a.work)
        return 0
    merged: dict[str, Any] = {}
    if a.json and a.json.exists():
        merged = json.loads(a.json.read_text(encoding="utf-8")).get("rows", {})
    done, start = [], time.perf_counter()
    for name in a.rows:
        if a.work:
            a.work.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"fp8-{name}-", dir=a.work))
        try:
            row = ROWS[name]
            if a.eval_samples:
                row = dataclasses.replace(row, evaluate=a.eval_samples)
            rec = run_row(row, a, tmp)
        finally:
            if a.work is None:
                shutil.rmtree(tmp, ignore_errors=True)
        done.append(rec)
        merged[name] = rec
        if a.json:
            a.json.write_text(json.dumps({"rows": merged}, indent=1) + "\n", encoding="utf-8")
        if a.text:
            recs = [merged[r] for r in ROWS if r in merged]
            a.text.write_text(table(recs) + "\n", encoding="utf-8")
    print(table(done), flush=True)
    print(f"\n{len(done)} rows in {time.perf_counter() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
