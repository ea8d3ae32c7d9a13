"""Time to result (issue 47): ``qdq quantize`` against ONNX Runtime and ModelOpt, wall time and accuracy.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/time_to_result.py [--rows a,b] [--json OUT]
[--text OUT] [--timeout SECONDS] [--qdq-python PY] [--qdq-src DIR] [--peer-python PY] [--work DIR]``.
Prints one table per row and a summary; asserts nothing (times are figures, not tests).

Rows (``benchmarks/time_to_result_models.py``): the six zoo models on their own data, and five real
architectures with random weights at realistic sizes: ResNet-50 and ViT-B/16 at 224 (qdq's
``skimage-photos`` crops), YOLOv8n at 640 and DETR at 128 (crops of the same photos), BERT-base at
128 random tokens. Per row, each tool runs in a process of its own (one ONNX Runtime session per
process, no cross-talk), back to back, timed from launch to exit:

1. ``prep`` (untimed): the data as ``qdq quantize`` resolves and splits it (``qdq.pipeline``), saved
   as arrays for the peers (``calib.npz``, ``eval.npz``: the very samples qdq calibrates and
   evaluates on), and FP32's outputs on the evaluation samples in torch (qdq's reference);
2. the FP32 ONNX export a peer's user runs first (build the model, ``torch.onnx.export``), timed
   once and added to each peer;
3. ONNX Runtime ``quantize_static`` (QDQ, per-channel, MinMax) and ModelOpt's ONNX PTQ (int8, its
   default calibration; in the peer environment) on that ONNX, each followed by its evaluation: the
   INT8 ONNX in ONNX Runtime (``ORT_ENABLE_BASIC``) on the evaluation samples
   (``benchmarks/peers/time_to_result_peers.py``);
4. ``qdq quantize`` with ``--recipe none`` and with its defaults (the CLI, ``python -m qdq``; its
   time includes its own evaluation, so the peers' "+ evaluate" column is the like-for-like one).

Accuracy is one figure for every tool: qdq's headline (``report.json: int8_metric``; a zoo
model's task metric, else the agreement of the first output's kind with FP32: top-1 agreement
for a classifier, box agreement for YOLO, cosine for a tensor), and the peers' outputs scored by
the same ``qdq.pipeline.evaluate.score`` against the same FP32 reference, plus the mean
per-sample cosine of every output. A run over ``--timeout`` is killed and reads ``> N s
(killed)``; a peer that cannot run reads ``not run: why``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from time_to_result_models import ROWS, Row, model_spec, write_data  # noqa: E402

PEERS_SCRIPT = HERE / "peers" / "time_to_result_peers.py"
TOOLS = ("qdq", "qdq-none", "ort", "modelopt")
LABELS = {"qdq": "qdq quantize (default)", "qdq-none": "qdq quantize --recipe none",
          "ort": "ORT quantize_static", "modelopt": "ModelOpt ONNX PTQ"}  # fmt: skip
PEERS = ("ort", "modelopt")
BATCH = 32  # qdq's default --batch-size; the peers' calibration (ORT) and evaluation batches


def log(msg: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------- processes
def run(cmd: list[str], out: Path, timeout: float, env: dict[str, str]) -> dict[str, Any]:
    """Run ``cmd`` (output to ``out``), killing its process group past ``timeout`` seconds."""
    start = time.perf_counter()
    with out.open("w", encoding="utf-8") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip
        try:
            rc = proc.wait(timeout=timeout)
            killed = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc, killed = proc.wait(), True
    wall = round(time.perf_counter() - start, 2)
    result = {"wall_s": wall, "rc": rc, "killed": killed}
    if rc != 0 and not killed:
        result["error"] = last_error(out)
    return result


def last_error(path: Path) -> str:
    """The last line of a log that names an exception (else its last line), cut to 200."""
    lines = [s.strip() for s in path.read_text(encoding="utf-8", errors="replace").splitlines()]
    lines = [s for s in lines if s]
    hits = [s for s in lines if re.match(r"^[\w.]*(Error|Exception)\b|^qdq quantize: error", s)]
    text = (hits or lines or ["(no output)"])[-1]
    return text if len(text) <= 200 else text[:199] + "…"


def env_with(pythonpath: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", YOLO_OFFLINE="1")
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


def stage_lines(path: Path) -> dict[str, float]:
    """The stages ``qdq quantize`` printed as they ended (what a killed run had done)."""
    found: dict[str, float] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines()[2:]:
        m = re.match(r"^  (\S.*?)\s+(\d+\.\d+) s(?:  |$)", line)
        if m:
            found[m.group(1)] = float(m.group(2))
    return found


# ---------------------------------------------------------------------------------------- prep
def data_options(row: Row) -> tuple[str | None, list[str]]:
    """``--data`` (``None``: the zoo model's own) and the count flags, as qdq gets them."""
    flags = []
    if row.calib:
        flags += ["--calib-samples", str(row.calib)]
    if row.evaluate:
        flags += ["--eval-samples", str(row.evaluate)]
    return row.data, flags


def prep(row: Row, work: Path) -> None:
    """Stage ``prep`` (a process of its own): the row's data through ``qdq.pipeline``, the
    peers' arrays, FP32's outputs and the ground truth of the metric."""
    import torch

    from qdq.pipeline import DataOptions, resolve_data, resolve_model
    from qdq.pipeline.evaluate import metric_name, score, torch_outputs
    from qdq.pipeline.inputs import bind_inputs, take
    from qdq.pipeline.outputs import output_names, recorded_output

    if row.data == "npz":
        write_data(row, work / "data.npz")
    spec = str(work / "data.npz") if row.data == "npz" else row.data
    source = resolve_model(model_spec(row))
    opts = DataOptions(calib_samples=row.calib, eval_samples=row.evaluate)
    qdata = resolve_data(spec, source.zoo, opts, model=source.module)
    fwd = bind_inputs(source.module, qdata.calibration)
    keys = None
    if isinstance(qdata.calibration, dict):
        keys = [name for name, _ in fwd.slots if name in qdata.calibration]
    names: list[str] = []
    for part, x in (("calib", qdata.calibration), ("eval", qdata.evaluation)):
        tensors = fwd.tensors(x)
        names = ["input" if i == 0 else f"input{i}" for i in range(len(tensors))]
        np.savez(
            work / f"{part}.npz", **{n: t.numpy() for n, t in zip(names, tensors, strict=True)}
        )
    with recorded_output(source.module) as seen, torch.no_grad():
        source.module(*fwd.positional(take(qdata.calibration, slice(0, 1))))
    ref = torch_outputs(source.module, qdata.evaluation, BATCH, static=False, desc="FP32",
                        show=False, every=True)  # fmt: skip
    np.savez(work / "ref.npz", **{f"out{i}": t.numpy() for i, t in enumerate(ref)})
    torch.save({"labels": qdata.labels, "targets": qdata.targets}, work / "truth.pt")
    fp32 = score(ref, ref, qdata.labels, qdata.metric, qdata.targets)
    meta = {
        "inputs": names, "keys": keys, "output_names": output_names(seen.value),
        "source": qdata.source, "split": qdata.split,
        "calibration_samples": len(tensors_of(qdata.calibration)),
        "evaluation_samples": len(ref[0]),
        "metric_name": metric_name(ref[0], qdata.labels, qdata.metric),
        "fp32_metric": fp32["metric"],
        "params_M": round(sum(p.numel() for p in source.module.parameters()) / 1e6, 2),
    }  # fmt: skip
    (work / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")


def tensors_of(x: Any) -> Any:
    return next(iter(x.values())) if isinstance(x, dict) else x[0] if isinstance(x, tuple) else x


# --------------------------------------------------------------------------------------- score
def score_outputs(work: Path, meta: dict[str, Any], outputs: Path) -> dict[str, Any]:
    """qdq's headline (``score``) and every output's cosine of a peer's outputs against FP32."""
    import torch

    from qdq.pipeline.evaluate import embedding_metric, score
    from qdq.pipeline.outputs import output_table
    from qdq.zoo.registry import DATASETS, get_dataset

    with np.load(work / "ref.npz") as f:
        ref = [torch.from_numpy(f[f"out{i}"]) for i in range(len(f.files))]
    with np.load(outputs) as f:
        outs = [torch.from_numpy(f[f"out{i}"]).float() for i in range(len(f.files))]
    truth = torch.load(work / "truth.pt", weights_only=False)
    metric = get_dataset(meta["source"]).metric if meta["source"] in DATASETS else None
    if metric is None and truth["labels"] is None:
        metric = embedding_metric(meta["output_names"], ref)
    if len(outs) != len(ref):
        raise ValueError(f"{len(outs)} outputs, FP32 has {len(ref)}")
    s = score(outs, ref, truth["labels"], metric, truth["targets"])
    rows = output_table(outs, ref)
    return {"metric": s["metric"], "cosine": s["cosine_mean"], "figures": s.get("figures"),
            "top1_agreement": s["top1_agreement"],
            "output_cosines": [r["cosine_mean"] for r in rows]}  # fmt: skip


# ----------------------------------------------------------------------------------------- rows
def run_row(row: Row, a: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Every tool on one row; the row's record."""
    here_env = env_with(a.qdq_src)  # the data, FP32 reference and export: --qdq-src's qdq
    rec: dict[str, Any] = {"row": row.name, "note": row.note, "model": model_spec(row),
                           "date": time.strftime("%Y-%m-%d %H:%M"), "qdq_src": a.qdq_src,
                           "qdq_commit": commit(a.qdq_src), "timeout_s": a.timeout,
                           "load_before": round(os.getloadavg()[0], 2), "tools": {}}  # fmt: skip
    log(f"{row.name}: prep (data, FP32 reference; untimed)")
    prep_run = run([a.qdq_python, __file__, "--stage", "prep", "--rows", row.name, "--work",
                    str(work)], work / "prep.log", a.timeout, here_env)  # fmt: skip
    if prep_run["rc"] != 0:
        rec["error"] = f"prep failed: {prep_run.get('error', 'killed')}"
        return rec
    meta = json.loads((work / "meta.json").read_text(encoding="utf-8"))
    rec.update({k: meta[k] for k in ("split", "calibration_samples", "evaluation_samples",
                                     "metric_name", "fp32_metric", "params_M")})  # fmt: skip
    tools = rec["tools"]

    log(f"{row.name}: FP32 export (the peers' first step)")
    exp = run([a.qdq_python, str(HERE / "time_to_result_models.py"), "export", row.name,
               str(work)], work / "export.log", a.timeout, here_env)  # fmt: skip
    if exp["rc"] == 0:
        exp.update(json.loads(last_line(work / "export.log")))
    rec["export"] = exp

    peer_env = env_with(None)
    for tool in PEERS:
        t: dict[str, Any] = {}
        tools[tool] = t
        python = a.qdq_python if tool == "ort" else a.peer_python
        if exp["rc"] != 0:
            t["not_run"] = f"the FP32 export failed: {exp.get('error', 'killed')}"
            continue
        if not Path(python).exists():
            t["not_run"] = f"no {python} (build the peer environment: benchmarks/README.md)"
            continue
        log(f"{row.name}: {LABELS[tool]}")
        onnx, res = work / f"{tool}.onnx", work / f"{tool}.json"
        q = run([python, str(PEERS_SCRIPT), tool, str(work / "fp32.onnx"), str(work / "calib.npz"),
                 str(onnx), "--batch", str(BATCH), "--result", str(res)], work / f"{tool}.log",
                a.timeout, here_env if tool == "ort" else peer_env)  # fmt: skip
        t["quantize"] = q
        if q["rc"] != 0:
            if not q["killed"]:
                t["not_run"] = q["error"]
            continue
        q.update(json.loads(res.read_text(encoding="utf-8")))
        log(f"{row.name}: {LABELS[tool]}: evaluate")
        outs = work / f"{tool}-outputs.npz"
        e = run([a.qdq_python, str(PEERS_SCRIPT), "evaluate", str(onnx), str(work / "eval.npz"),
                 str(outs), "--batch", str(BATCH), "--result", str(res)],
                work / f"{tool}-eval.log", a.timeout, here_env)  # fmt: skip
        t["evaluate"] = e
        if e["rc"] != 0:
            t["not_evaluated"] = "killed" if e["killed"] else e["error"]
            continue
        e.update(json.loads(res.read_text(encoding="utf-8")))
        try:
            t.update(score_outputs(work, meta, outs))
        except Exception as err:
            t["not_evaluated"] = f"{type(err).__name__}: {err}"[:200]

    qdq_env = env_with(a.qdq_src)
    data, flags = data_options(row)
    if row.data == "npz":
        data = str(work / "data.npz")
    for tool in ("qdq-none", "qdq"):
        log(f"{row.name}: {LABELS[tool]}")
        out = work / tool
        cmd = [a.qdq_python, "-m", "qdq", "quantize", "--model", model_spec(row), "--out",
               str(out), "--no-progress", *(["--data", data] if data else []), *flags,
               *(["--recipe", "none"] if tool == "qdq-none" else [])]  # fmt: skip
        t = tools[tool] = run(cmd, work / f"{tool}.log", a.timeout, qdq_env)
        if t["rc"] != 0:  # what it had done: the stages it printed
            t["stages_printed"] = stage_lines(work / f"{tool}.log")
        else:
            r = json.loads((out / "report.json").read_text(encoding="utf-8"))
            t.update({"metric": r["int8_metric"], "cosine": r["int8"]["cosine_mean"],
                      "top1_agreement": r["int8"].get("top1_agreement"),
                      "figures": r["int8"].get("figures"), "fp32_metric": r["fp32_metric"],
                      "metric_name": r["metric_name"], "timings_s": r["timings_s"],
                      "recipe": r["settings"].get("recipe"),
                      "output_cosines": [o["cosine_mean"] for o in r.get("outputs") or []],
                      "int8_layers": lint_coverage(r)})  # fmt: skip
    rec["load_after"] = round(os.getloadavg()[0], 2)
    return rec


def lint_coverage(report: dict[str, Any]) -> str | None:
    lint = report.get("lint")
    return f"{lint['int8_weighted_layers']}/{lint['weighted_layers']}" if lint else None


def last_line(path: Path) -> str:
    return path.read_text(encoding="utf-8").strip().splitlines()[-1]


def commit(src: str) -> str | None:
    try:
        return subprocess.run(["git", "-C", src, "rev-parse", "--short", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None


# --------------------------------------------------------------------------------------- table
def peer_times(rec: dict[str, Any], tool: str) -> tuple[float | None, float | None]:
    """``(export + quantize, + evaluate)`` seconds of a peer (``None``: not finished)."""
    t, exp = rec["tools"].get(tool, {}), rec.get("export") or {}
    q, e = t.get("quantize"), t.get("evaluate")
    if q is None or q["rc"] != 0 or exp.get("rc") != 0:
        return None, None
    total = exp["wall_s"] + q["wall_s"]
    return total, (total + e["wall_s"]) if e is not None and e["rc"] == 0 else None


def fastest(rec: dict[str, Any], index: int) -> tuple[str | None, float | None]:
    """The faster peer that finished (by export + quantize, or by + evaluate) and its seconds."""
    got = [(peer_times(rec, p)[index], p) for p in PEERS]
    got = [(s, p) for s, p in got if s is not None]
    return (min(got)[1], min(got)[0]) if got else (None, None)


def _s(seconds: float | None, killed: bool = False) -> str:
    if seconds is None:
        return "—"
    return f"> {seconds:.0f} s (killed)" if killed else f"{seconds:.1f}"


def _x(seconds: float | None, base: float | None, killed: bool = False) -> str:
    if seconds is None or not base:
        return "—"
    return f"{'> ' if killed else ''}{seconds / base:.2f}"


def _m(t: dict[str, Any]) -> tuple[str, str, str]:
    if t.get("metric") is None:
        return "—", "—", "—"
    cos = " / ".join(f"{c:.5f}" for c in t.get("output_cosines") or [])
    return f"{t['metric']:.4f}", f"{t['cosine']:.5f}", cos or "—"


def table(rec: dict[str, Any]) -> str:
    """One row's table, its qdq stage timings and its aims."""
    lines = [f"### {rec['row']}: {rec['note']}"]
    if rec.get("error"):
        return "\n".join([*lines, f"not run: {rec['error']}", ""])
    exp = rec.get("export") or {}
    how = (f"{exp['wall_s']:.1f} s wall ({exp.get('exporter')}, {exp.get('export_s')} s in "
           "process)") if exp.get("rc") == 0 else f"failed ({exp.get('error', 'killed')})"  # fmt: skip
    lines.append(
        f"{rec['metric_name']} (FP32 {rec['fp32_metric']:.4f}); {rec['calibration_samples']} "
        f"calibration / {rec['evaluation_samples']} evaluation samples; {rec['params_M']} M "
        f"params; the peers' FP32 export: {how}; qdq {rec.get('qdq_commit')} ({rec['qdq_src']}); "
        f"{rec['date']}, load {rec['load_before']} → {rec.get('load_after')}"
    )
    fq, fq_s = fastest(rec, 0)
    _, fe_s = fastest(rec, 1)
    lines += [
        f"| tool | to the INT8 ONNX, s | × faster peer ({LABELS.get(fq or '', '—')}) | "
        f"+ evaluate, s | × faster peer | {rec['metric_name']} | cosine (output 0) | cosine "
        "per output | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for tool in TOOLS:
        t = rec["tools"].get(tool)
        if t is None:
            continue
        metric, cos, per = _m(t)
        if tool in PEERS:
            if t.get("not_run"):
                lines.append(f"| {LABELS[tool]} | not run: {t['not_run']} | | | | | | | |")
                continue
            q, qe = peer_times(rec, tool)
            qk, e = t["quantize"]["killed"], t.get("evaluate") or {}
            shown = (f"{exp['wall_s']:.1f} + {_s(t['quantize']['wall_s'], True)}" if qk else
                     f"{exp['wall_s']:.1f} + {t['quantize']['wall_s']:.1f} = {q:.1f}")  # fmt: skip
            ev = _s(e["wall_s"], True) if e.get("killed") else _s(qe)
            note = "; ".join(x for x in (t["quantize"].get("note"), t.get("not_evaluated")) if x)
            lines.append(f"| {LABELS[tool]} | {shown} | {_x(q, fq_s)} | {ev} | "
                         f"{_x(qe, fe_s)} | {metric} | {cos} | {per} | {note} |")  # fmt: skip
        else:
            k, failed = t["killed"], t["rc"] != 0 and not t["killed"]
            wall = None if failed else t["wall_s"]  # a failed run's seconds are no result
            note = f"recipe {t['recipe']}; INT8 {t['int8_layers']}" if t.get("recipe") else ""
            note = f"failed after {t['wall_s']:.1f} s: {t.get('error')}" if failed else note
            lines.append(f"| {LABELS[tool]} | {_s(wall, k)} | {_x(wall, fq_s, k)} "
                         f"| (incl.) | {_x(wall, fe_s, k)} | {metric} | {cos} | {per} | "
                         f"{note} |")  # fmt: skip
    for tool in ("qdq", "qdq-none"):
        t = rec["tools"].get(tool) or {}
        stages = t.get("timings_s") or t.get("stages_printed")
        if stages:
            what = "stages, s" if t.get("timings_s") else "stages it printed before the kill, s"
            lines.append(f"{LABELS[tool]} {what}: "
                         + ", ".join(f"{k} {v:.1f}" for k, v in stages.items()))  # fmt: skip
    lines += [f"aims: {aims(rec)}", ""]
    return "\n".join(lines)


def aims(rec: dict[str, Any]) -> str:
    """qdq default: wall ≤ 2× the faster peer (export + quantize); accuracy ≥ recipe none; the zoo
    aims (EfficientNet-Lite0 agreement ≥ 90 %, CREPE-tiny RPA@10c = FP32); against the best peer."""
    d, n = rec["tools"].get("qdq") or {}, rec["tools"].get("qdq-none") or {}
    _, fq_s = fastest(rec, 0)
    out = []
    if d.get("wall_s") is not None and fq_s and (d["rc"] == 0 or d["killed"]):
        ratio = d["wall_s"] / fq_s
        ok = "yes" if ratio <= 2 and not d["killed"] else "no"
        out.append(f"wall ≤ 2× faster peer: {'> ' if d['killed'] else ''}{ratio:.2f}× — {ok}")
    if d.get("metric") is not None and n.get("metric") is not None:
        ok = "yes" if d["metric"] >= n["metric"] else "no"
        out.append(f"accuracy ≥ recipe none: {d['metric']:.4f} vs {n['metric']:.4f} — {ok}")
    if rec["row"] == "efficientnet-lite0" and d.get("metric") is not None:
        out.append(f"top-1 agreement ≥ 90 %: {100 * d['metric']:.1f} % — "
                   f"{'yes' if d['metric'] >= 0.90 else 'no'}")  # fmt: skip
    if rec["row"] == "crepe-tiny" and d.get("metric") is not None:
        out.append(f"RPA@10c = FP32: {d['metric']:.4f} vs {d['fp32_metric']:.4f} — "
                   f"{'yes' if d['metric'] >= d['fp32_metric'] else 'no'}")  # fmt: skip
    peers = [(rec["tools"][p]["metric"], rec["tools"][p]["cosine"], p) for p in PEERS
             if (rec["tools"].get(p) or {}).get("metric") is not None]  # fmt: skip
    if peers and d.get("metric") is not None:
        m, c, p = max(peers)
        verdict = ("ahead" if (d["metric"], d["cosine"]) > (m, c) else
                   "tie" if (d["metric"], d["cosine"]) == (m, c) else "behind")  # fmt: skip
        out.append(f"vs best peer ({LABELS[p]}): {d['metric']:.4f} / cos {d['cosine']:.5f} vs "
                   f"{m:.4f} / cos {c:.5f} — {verdict}")  # fmt: skip
    return "; ".join(out) or "—"


def summary(recs: list[dict[str, Any]]) -> str:
    lines = ["| row | qdq default, s | faster peer (export + quantize), s | × | qdq metric "
             "(default / recipe none / best peer) |", "|---|---|---|---|---|"]  # fmt: skip
    for rec in recs:
        d, n = rec["tools"].get("qdq") or {}, rec["tools"].get("qdq-none") or {}
        if d.get("rc") and not d.get("killed"):
            d = {"wall_s": None}  # failed: no time to a result
        p, s = fastest(rec, 0)
        best = max((rec["tools"][q]["metric"] for q in PEERS
                    if (rec["tools"].get(q) or {}).get("metric") is not None), default=None)  # fmt: skip
        ms = " / ".join(
            "—" if v is None else f"{v:.4f}" for v in (d.get("metric"), n.get("metric"), best)
        )
        lines.append(f"| {rec['row']} | {_s(d.get('wall_s'), d.get('killed', False))} | "
                     f"{_s(s)} {'(' + p + ')' if p else ''} | "
                     f"{_x(d.get('wall_s'), s, d.get('killed', False))} | {ms} |")  # fmt: skip
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------- main
def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default=",".join(ROWS), help=f"of {', '.join(ROWS)}")
    p.add_argument("--json", type=Path, help="merge each row's record into this JSON")
    p.add_argument("--text", type=Path, help="write the tables of every row in --json here")
    p.add_argument("--timeout", type=float, default=3600.0, help="per tool run, seconds")
    p.add_argument("--qdq-python", default=sys.executable, help="python that runs qdq quantize")
    p.add_argument("--qdq-src", default=str(HERE.parent / "src"), help="qdq's src directory")
    p.add_argument("--peer-python", default="/tmp/peers/bin/python", help="ModelOpt's python")
    p.add_argument("--work", type=Path, help="keep every row's files here (default: temporary)")
    p.add_argument("--stage", choices=("prep",), help=argparse.SUPPRESS)
    return rows_and_src(p, p.parse_args(argv), ROWS)


def rows_and_src(
    p: argparse.ArgumentParser, a: argparse.Namespace, rows: dict[str, Any]
) -> argparse.Namespace:
    """``a`` with ``--rows`` split and checked against ``rows`` (an unknown name is a usage
    error naming it) and ``--qdq-src`` made absolute; shared with ``fp8.py``."""
    a.rows = [r for r in a.rows.split(",") if r]
    unknown = [r for r in a.rows if r not in rows]
    if unknown:
        p.error(f"unknown rows {unknown}; rows: {', '.join(rows)}")
    a.qdq_src = str(Path(a.qdq_src).resolve())
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.stage == "prep":
        prep(ROWS[a.rows[0]], a.work)
        return 0
    merged: dict[str, Any] = {}
    if a.json and a.json.exists():
        merged = json.loads(a.json.read_text(encoding="utf-8")).get("rows", {})
    done = []
    for name in a.rows:
        if a.work:
            a.work.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"ttr-{name}-", dir=a.work))
        try:
            rec = run_row(ROWS[name], a, tmp)
        finally:
            if a.work is None:
                shutil.rmtree(tmp, ignore_errors=True)
        done.append(rec)
        print(table(rec), flush=True)
        merged[name] = rec
        if a.json:
            a.json.write_text(json.dumps({"rows": merged}, indent=1) + "\n", encoding="utf-8")
        if a.text:
            recs = [merged[r] for r in ROWS if r in merged]
            a.text.write_text("\n".join([*(table(r) for r in recs), summary(recs), ""]),
                              encoding="utf-8")  # fmt: skip
    print(summary(done), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
