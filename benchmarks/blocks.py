"""Block formats (issue 60): FP32, qdq INT8 / FP8 / NVFP4 / MXFP8 / INT4w and ModelOpt NVFP4 /
MXFP8 / INT4 side by side, every figure through the export where it runs on this CPU.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/blocks.py [--rows a,b] [--formats f,g]
[--peer-formats f,g] [--json OUT] [--text OUT] [--timeout SECONDS] [--peer-python PY]
[--target TARGET] [--work DIR] [--eval-samples N] [--peers-from JSON]``. Prints the tables and
their notes; asserts nothing.

Rows (``benchmarks/fp8_models.py``, default its transformer rows: ViT, Swin, BERT, DistilBERT and
the diffusers UNet; the zoo rows are accepted too). Per row, each step a process of its own, with
``fp8.py``'s and ``time_to_result.py``'s helpers:

1. ``prep`` (``fp8.stage_prep``): the data as ``qdq quantize`` splits it, saved for the peer, and
   FP32's outputs in torch, the reference of every figure;
2. ``qdq quantize --format F --target TARGET`` (default ``trt10.12-blackwell``) for each of
   ``--formats`` (default ``int8,fp8,nvfp4,mxfp8,int4w``): the report's figure and lint summary
   (``fp8.run_qdq``). INT8 and FP8's figure is the report's (its export in ONNX Runtime). A block
   format's export is run here: in ONNX Runtime as written, else through
   ``qdq.backends.blocks_reference.runnable`` (the graph rewritten into ops ONNX Runtime's CPU
   runs: ORT has no FLOAT4E2M1 DequantizeLinear and no ``trt`` ops), inputs renamed by position
   to the saved arrays' names (``--stage runnable``);
3. ModelOpt (``peers/blocks_peers.py`` in ``--peer-python``) for each of ``--peer-formats``
   (default ``nvfp4,mxfp8,int4,int4_awq``): ``mtq.quantize`` with its default config on the same
   calibration batches, its torch figure, its ONNX export (as configured, else with the layers its
   exporter cannot take left float), run as qdq's is (as written, else through ``runnable``, else
   ``repair``-ed and through ``runnable``: its exports use ``trt``-domain and FP16-typed forms that
   neither reads, README) and linted as written by ``qdq lint --target TARGET --json``.

Every output is scored by ``qdq.pipeline.evaluate.score`` against the same FP32 reference.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fp8 import evaluate, lint_json, run_qdq, scored, stage_prep  # noqa: E402
from fp8_models import ROWS, Row, model_spec  # noqa: E402
from time_to_result import BATCH, commit, env_with, log, rows_and_src, run  # noqa: E402

PEER_SCRIPT = HERE / "peers" / "blocks_peers.py"
TRANSFORMERS = tuple(r for r in ("vit", "swin", "bert", "distilbert", "gpt2", "unet") if r in ROWS)
FORMATS = ("int8", "fp8", "nvfp4", "mxfp8", "int4w")
BLOCK = ("nvfp4", "mxfp8", "int4w")  # qdq formats whose export this script runs itself
PEER_FORMATS = ("nvfp4", "mxfp8", "int4", "int4_awq")
LABELS = {"int8": "INT8", "fp8": "FP8", "nvfp4": "NVFP4", "mxfp8": "MXFP8", "int4w": "INT4w",
          "mixed": "mixed", "int4": "INT4w", "int4_awq": "INT4w AWQ"}  # fmt: skip
#: lint summary keys of the format mix, in the order printed
MIX = (("nvfp4", "nvfp4_weighted_layers"), ("mxfp8", "mxfp8_weighted_layers"),
       ("int4w", "int4w_weighted_layers"), ("fp8", "fp8_weighted_layers"),
       ("int8", "int8_weighted_layers"))  # fmt: skip


# ------------------------------------------------------------------------------- running an ONNX
def repair(model: Any) -> dict[str, int]:
    """ModelOpt's block-format export in place, in the types and ops ONNX defines; what changed,
    counted. Its ``trt::DequantizeLinear`` / ``QuantizeLinear`` (INT4) move to the ONNX domain
    (opset 21), and where the blocked axis does not fit the scale but the other one does (its INT4
    ``Gemm`` weights, ``transB=1``: axis 0 written, the scale ``[out, in / 128]``) the axis is
    the other one. Its ``trt::TRT_MXFP8DequantizeLinear`` (E8M0 scales typed ``UINT8``,
    ``output_dtype`` FLOAT16 in an FP32 graph) becomes ``DequantizeLinear`` (``axis``,
    ``block_size``) with the same scale bytes typed ``FLOAT8E8M0`` (opset 24). In a graph whose
    inputs, outputs and initializers hold no FLOAT16/BFLOAT16, every ``Cast`` to those is removed
    (its readers read its input): its NVFP4 exporter casts both inputs of each GEMM (the GEMM's
    output still declared float32, the bias ``Add`` float32: ill-typed), its attention export one
    input of the score scaling ``Div``. Nothing else changes."""
    from onnx import TensorProto

    g = model.graph
    done = {"trt_domain_qdq": 0, "gemm_axis": 0, "mxfp8_dequantize": 0, "half_casts": 0}
    inits = {i.name: i for i in g.initializer}
    for n in g.node:
        if n.domain == "trt" and n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            n.domain = ""  # its INT4 (and FP8) Q/DQ, left in the trt domain
            done["trt_domain_qdq"] += 1
            done["gemm_axis"] += _fix_axis(n, inits)
        if n.domain == "trt" and n.op_type == "TRT_MXFP8DequantizeLinear":
            keep = [a for a in n.attribute if a.name in ("axis", "block_size")]
            n.domain, n.op_type = "", "DequantizeLinear"
            del n.attribute[:]
            n.attribute.extend(keep)
            s = inits.get(n.input[1])
            if s is not None and s.data_type == TensorProto.UINT8:
                s.data_type = TensorProto.FLOAT8E8M0
            done["mxfp8_dequantize"] += 1
    consumers: dict[str, list[Any]] = {}
    for n in g.node:
        for x in n.input:
            consumers.setdefault(x, []).append(n)
    half = (TensorProto.FLOAT16, TensorProto.BFLOAT16)
    typed = [*g.input, *g.output]
    fp32_graph = not any(i.data_type in half for i in g.initializer) and not any(
        v.type.tensor_type.elem_type in half for v in typed
    )
    drop = [n for n in g.node if fp32_graph and n.op_type == "Cast"
            and any(a.name == "to" and a.i in half for a in n.attribute)]  # fmt: skip
    for n in drop:
        for c in consumers.get(n.output[0], []):
            c.input[:] = [n.input[0] if x == n.output[0] else x for x in c.input]
        g.node.remove(n)
    done["half_casts"] = len(drop)
    need = 24 if done["mxfp8_dequantize"] else 21 if done["trt_domain_qdq"] else 0
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = max(o.version, need)  # blocked DQ: 21; E8M0 scales: 24
    return done


def _fix_axis(n: Any, inits: dict[str, Any]) -> int:
    """1 when a blocked 2-D DequantizeLinear's ``axis`` was set to the one its scale fits."""
    attrs = {a.name: a for a in n.attribute}
    w, sc = inits.get(n.input[0]), inits.get(n.input[1]) if len(n.input) > 1 else None
    if (
        "block_size" not in attrs
        or w is None
        or sc is None
        or len(w.dims) != 2
        or len(sc.dims) != 2
    ):
        return 0
    size, axis = attrs["block_size"].i, attrs["axis"].i % 2 if "axis" in attrs else 1

    def fits(ax: int) -> bool:
        return all(sc.dims[i] == (-(-w.dims[i] // size) if i == ax else w.dims[i]) for i in (0, 1))

    if fits(axis) or not fits(1 - axis):
        return 0
    if "axis" in attrs:
        attrs["axis"].i = 1 - axis
    else:
        from onnx import helper

        n.attribute.append(helper.make_attribute("axis", 1 - axis))
    return 1


def stage_runnable(src: Path, dst: Path, names: list[str], reference: bool, fix: bool) -> None:
    """Stage ``runnable`` (its own process): ``src`` with its graph inputs renamed by position to
    ``names`` (the saved arrays'), ``repair``-ed when ``fix``, rewritten by
    ``qdq.backends.blocks_reference.runnable`` when ``reference``, saved as ``dst``."""
    import onnx

    model = onnx.load(str(src))
    renames = {v.name: n for v, n in zip(model.graph.input, names, strict=False)}
    for value in model.graph.input:
        value.name = renames.get(value.name, value.name)
    for node in model.graph.node:
        node.input[:] = [renames.get(x, x) for x in node.input]
    if fix:
        print("repaired:", json.dumps(repair(model)))
    if reference:
        from qdq.backends.blocks_reference import runnable

        model = runnable(model)
        if not isinstance(model, onnx.ModelProto):
            raise TypeError(f"runnable returned {type(model).__name__}, not an onnx.ModelProto")
    onnx.save(model, str(dst))


#: how an export is run, tried in this order until one runs: key, through ``runnable``, repaired
WAYS = (("as_written", False, False), ("runnable", True, False), ("repaired", True, True))


def run_onnx(onnx: Path, tag: str, a: argparse.Namespace, work: Path, meta: dict[str, Any],
             repairable: bool = False) -> dict[str, Any]:  # fmt: skip
    """An export on the evaluation samples: in ONNX Runtime as written (``as_written``), else
    through ``runnable`` (``runnable``), else (ModelOpt's, ``repairable``) ``repair``-ed and
    through ``runnable`` (``repaired``); each scored against FP32, or its error."""
    out: dict[str, Any] = {}
    for key, reference, fix in WAYS:
        if fix and not repairable:
            break
        copy = work / f"{tag}-{key}.onnx"
        cmd = [a.qdq_python, __file__, "--stage", "runnable", "--work", str(work),
               "--src", str(onnx), "--dst", str(copy), *(["--reference"] if reference else []),
               *(["--repair"] if fix else [])]  # fmt: skip
        r = run(cmd, work / f"{tag}-{key}-prep.log", a.timeout, env_with(a.qdq_src))
        if r["rc"] != 0:
            out[key] = {"error": r.get("error", "killed")}
        else:
            out[key] = evaluate(copy, f"{tag}-{key}", a, work, meta)
        if "error" not in out[key]:
            break
    return out


def onnx_figure(t: dict[str, Any] | None) -> tuple[dict[str, Any] | None, str]:
    """The figure of ``run_onnx``'s record and how it ran (``ORT`` or ``runnable``)."""
    for key, how in (("as_written", "ORT"), ("runnable", "runnable"), ("repaired", "repaired")):
        f = (t or {}).get(key) or {}
        if f.get("metric") is not None:
            return f, how
    return None, ""


# ------------------------------------------------------------------------------------------- qdq
def format_args(a: argparse.Namespace, fmt: str) -> argparse.Namespace:
    """``a`` with the target of ``fmt``: ``--target`` when given, else the one qdq's job takes
    for the format (``qdq.pipeline.options.default_target``: MXFP8's opset-24 E8M0 scales need
    TensorRT 11's parser, NVFP4 a Blackwell TensorRT 10.12, INT8 and FP8 a Blackwell too, so
    the rows compare on one GPU)."""
    if a.target is not None:
        return a
    from qdq.pipeline.options import default_target

    plan = {"int4": "int4w", "int4_awq": "int4w"}.get(fmt, fmt)
    target = default_target(plan) if plan in ("nvfp4", "mxfp8", "int4w") else "trt10.12-blackwell"
    return argparse.Namespace(**{**vars(a), "target": target})


def run_qdq_format(row: Row, fmt: str, a: argparse.Namespace, work: Path,
                   meta: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """``fp8.run_qdq`` for ``fmt`` on its target (:func:`format_args`), and for a block format
    its export run here."""
    a = format_args(a, fmt)
    try:
        t = run_qdq(row, fmt, a, work)
    except (KeyError, TypeError) as err:  # a report without a figure: read what it has
        r = json.loads((work / f"qdq-{fmt}" / "report.json").read_text(encoding="utf-8"))
        t = {"rc": 0, "killed": False, "wall_s": None, "report_error": repr(err),
             "lint": r.get("lint"), "lint_verdict": r.get("lint_verdict"),
             "formats": (r.get("settings") or {}).get("format")}  # fmt: skip
    onnx = work / f"qdq-{fmt}" / "model.qdq.onnx"
    if fmt in BLOCK and t["rc"] == 0 and onnx.exists():
        t["onnx"] = run_onnx(onnx, f"qdq-{fmt}", a, work, meta)
    return t


def qdq_figure(t: dict[str, Any] | None) -> tuple[dict[str, Any] | None, str]:
    """A qdq format's figure: its export run here, else the report's."""
    f, how = onnx_figure((t or {}).get("onnx"))
    if f is not None:
        return f, how
    if (t or {}).get("metric") is not None:
        return t, "report"
    return None, ""


# -------------------------------------------------------------------------------------- modelopt
def run_modelopt(row: Row, fmt: str, a: argparse.Namespace, work: Path,
                 meta: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """ModelOpt in ``fmt`` on the row: its torch figures, its export run and linted (on the
    target qdq's job takes for that format: :func:`format_args`)."""
    a = format_args(a, fmt)
    if not Path(a.peer_python).exists():
        return {"not_run": f"no {a.peer_python} (build the peer environment: benchmarks/README.md)"}
    job = work / "job.json"
    job.write_text(json.dumps({"row": row.name, "src": a.qdq_src, "benchmarks": str(HERE),
                               "batch": BATCH, "format": fmt}), encoding="utf-8")  # fmt: skip
    result = work / f"peers-{fmt}.json"
    t: dict[str, Any] = {"peer": run([a.peer_python, str(PEER_SCRIPT), str(job)],
                                     work / f"modelopt-{fmt}.log", a.timeout, env_with(None))}  # fmt: skip
    if t["peer"]["rc"] != 0 or not result.exists():
        t["not_run"] = "killed" if t["peer"]["killed"] else t["peer"].get("error", "no result")
        return t
    t.update(json.loads(result.read_text(encoding="utf-8")))
    if t.get("error"):
        t["not_run"] = t["error"]
        return t
    t["torch"] = scored(work, meta, work / f"modelopt-{fmt}-torch-outputs.npz")
    exportable = work / f"modelopt-{fmt}-exportable-torch-outputs.npz"
    if exportable.exists():
        t["torch_exportable"] = scored(work, meta, exportable)
    exported = t.get("export_retry") or t.get("export") or {}
    onnx = work / f"modelopt-{fmt}.onnx"
    if "error" not in exported and onnx.exists():
        t["lint"] = lint_json(onnx, a, work / f"modelopt-{fmt}-lint.log")
        t["onnx"] = run_onnx(onnx, f"modelopt-{fmt}", a, work, meta, repairable=True)
    return t


def modelopt_figure(t: dict[str, Any] | None) -> tuple[dict[str, Any] | None, str]:
    """ModelOpt's figure to compare with: its ONNX's when exported as configured, else its torch
    fake-quant figure of the config as given."""
    t = t or {}
    f, how = onnx_figure(t.get("onnx"))
    if f is not None and not t.get("export_retry"):
        return f, f"ONNX, {how}"
    if (t.get("torch") or {}).get("metric") is not None:
        return t["torch"], "torch"
    return None, ""


# ------------------------------------------------------------------------------------------ rows
def run_row(row: Row, a: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Every tool on one row; the row's record."""
    start = time.perf_counter()
    rec: dict[str, Any] = {"row": row.name, "note": row.note, "model": model_spec(row),
                           "date": time.strftime("%Y-%m-%d %H:%M"), "target": a.target or "per format",
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
    qdq = (a.qdq_from, a.qdq_from_path, "qdq_from")
    peer = (a.peers_from, a.peers_from_path, "modelopt_from")
    runs = [(fmt, fmt, qdq, f"qdq quantize --format {fmt}", run_qdq_format)
            for fmt in a.formats]  # fmt: skip
    runs += [(f"modelopt-{fmt}", fmt, peer, f"ModelOpt {fmt}", run_modelopt)
             for fmt in a.peer_formats]  # fmt: skip
    for key, fmt, (earlier, path, field), label, runner in runs:  # an earlier record, else a run
        if key in earlier.get(row.name, {}):
            rec["tools"][key] = earlier[row.name][key]
            rec[field] = str(path)
        else:
            log(f"{row.name}: {label}")
            rec["tools"][key] = runner(row, fmt, a, work, meta)
    rec["wall_s"] = round(time.perf_counter() - start, 1)
    rec["load_after"] = round(os.getloadavg()[0], 2)
    return rec


# ----------------------------------------------------------------------------------------- table
def _fig(f: dict[str, Any] | None) -> str:
    if not f or f.get("metric") is None:
        return "—"
    return f"{f['metric']:.4f} / {f['cosine']:.5f}"


def mix(lint: dict[str, Any] | None) -> str:
    """The linter's format mix: weighted layers per format of all, and unfused Q/DQ."""
    if not lint or "weighted_layers" not in lint:
        return "—"
    parts = [f"{name} {lint[key]}" for name, key in MIX if lint.get(key)]
    return (
        f"{', '.join(parts) or 'none'} of {lint['weighted_layers']}; {lint['unfused_qdq']} unfused"
    )


def qdq_cell(t: dict[str, Any] | None) -> str:
    if not t:
        return "—"
    if t["rc"] != 0:
        return f"> {t['wall_s']:.0f} s (killed)" if t["killed"] else "failed (notes)"
    f, how = qdq_figure(t)
    return f"{_fig(f)} ({how})" if f else "no figure (notes)"


def modelopt_cell(t: dict[str, Any] | None) -> str:
    if not t:
        return "—"
    if t.get("not_run"):
        return f"n/a ({t['not_run'][:70]})"
    f, how = onnx_figure(t.get("onnx"))
    torch_part = f"{_fig(t.get('torch'))} (torch)"
    if f is None:
        exported = t.get("export_retry") or t.get("export") or {}
        return f"{torch_part}; " + ("export failed" if "error" in exported else "ONNX did not run")
    float_layers = len(t.get("export_float_layers") or {}) if t.get("export_retry") else 0
    note = f", {float_layers} layers float" if float_layers else ""
    return f"{torch_part}; {_fig(f)} (ONNX, {how}{note})"


def table(recs: list[dict[str, Any]], formats: list[str], peer_formats: list[str]) -> str:
    """The figures table, the format-mix table, the aims, then each row's notes."""
    peers = [f"modelopt-{f}" for f in peer_formats]
    head = (["row", "metric", "FP32"] + [f"qdq {LABELS[f]}" for f in formats]
            + [f"ModelOpt {LABELS[f]}" for f in peer_formats])  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    mixes = ["| row | " + " | ".join(head[3:]) + " |", "|" + "---|" * (len(head) - 2)]
    notes: list[str] = []
    for rec in recs:
        if rec.get("error"):
            lines.append(f"| {rec['row']} | not run: {rec['error']} |" + " |" * (len(head) - 2))
            continue
        tools = rec["tools"]
        cells = [qdq_cell(tools.get(f)) for f in formats]
        cells += [modelopt_cell(tools.get(p)) for p in peers]
        lines.append(f"| {rec['row']} | {rec['metric_name']} | {rec['fp32_metric']:.4f} | "
                     + " | ".join(cells) + " |")  # fmt: skip
        row_mix = [mix((tools.get(k) or {}).get("lint")) for k in [*formats, *peers]]
        mixes.append(f"| {rec['row']} | " + " | ".join(row_mix) + " |")
        notes += row_notes(rec, formats, peers)
    target = recs[0].get("target") if recs else "—"
    intro = ["Cells: metric / mean cosine with FP32 (first output), and how the figure ran: ORT "
             "(the export in ONNX Runtime as written), runnable (the export through "
             "qdq.backends.blocks_reference.runnable in ONNX Runtime), report (qdq quantize's "
             "own figure), torch (ModelOpt's fake-quantized model).", ""]  # fmt: skip
    mix_intro = [f"Format mix of each export, by qdq's linter for {target}: weighted layers per "
                 "format of all weighted layers; unfused Q/DQ (reformats).", ""]  # fmt: skip
    return "\n".join([*intro, *lines, "", *mix_intro, *mixes, "", *aims(recs), "", *notes])


def _versus(ours: dict[str, Any] | None, theirs: dict[str, Any] | None, how: str) -> str:
    if ours is None or theirs is None:
        return "—"
    a, b = (ours["metric"], ours["cosine"]), (theirs["metric"], theirs["cosine"])
    verdict = "ahead" if a > b else "tie" if a == b else "BEHIND"
    return f"{verdict}: {_fig(ours)} vs {_fig(theirs)} ({how})"


def aims(recs: list[dict[str, Any]]) -> list[str]:
    """Issue 60's aims per row: qdq NVFP4 and MXFP8 at or ahead of ModelOpt's (metric, then
    cosine; against ModelOpt's ONNX when it exported as configured, else its torch figure), and
    qdq MXFP8 within 0.002 cosine of qdq FP8."""
    out = ["| row | qdq NVFP4 vs ModelOpt NVFP4 | qdq MXFP8 vs ModelOpt MXFP8 | "
           "qdq MXFP8 within 0.002 cosine of qdq FP8 |", "|---|---|---|---|"]  # fmt: skip
    for rec in recs:
        tools = rec.get("tools") or {}
        cells = []
        for fmt in ("nvfp4", "mxfp8"):
            ours, _ = qdq_figure(tools.get(fmt))
            theirs, how = modelopt_figure(tools.get(f"modelopt-{fmt}"))
            cells.append(_versus(ours, theirs, how))
        mx, _ = qdq_figure(tools.get("mxfp8"))
        fp8, _ = qdq_figure(tools.get("fp8"))
        third = "—"
        if mx is not None and fp8 is not None:
            gap = fp8["cosine"] - mx["cosine"]
            third = f"{'yes' if gap <= 0.002 else 'NO'}: {mx['cosine']:.5f} vs {fp8['cosine']:.5f}"
        out.append(f"| {rec['row']} | {cells[0]} | {cells[1]} | {third} |")
    return out


def _why(run_: dict[str, Any]) -> str:
    """A run's figure, or its error without ONNX Runtime's prefix, cut to 160 characters."""
    if "error" not in run_:
        return _fig(run_)
    text = re.sub(r"^onnxruntime\S*: \[ONNXRuntimeError\] : \d+ : \w+ : ", "", run_["error"])
    text = re.sub(r"^Load model from \S+ failed:", "", text)
    return text if len(text) <= 160 else text[:159] + "…"


def row_notes(rec: dict[str, Any], formats: list[str], peers: list[str]) -> list[str]:
    """One line per tool of a row: settings, verdicts, seconds, errors, ModelOpt's ops."""
    out = [f"- **{rec['row']}** ({rec['note']}; {rec['calibration_samples']} calibration / "
           f"{rec['evaluation_samples']} evaluation samples; {rec['params_M']} M params; "
           f"{rec['wall_s']:.0f} s, load {rec['load_before']} → {rec['load_after']})"]  # fmt: skip
    for fmt in formats:
        t = rec["tools"].get(fmt) or {}
        if t.get("rc") == 0:
            what = [
                f"quantizers {t.get('formats')}",
                f"opset {t.get('opset')}",
                f"lint {t.get('lint_verdict')} {','.join(t.get('warn_rules') or []) or '-'}",
                f"report {_fig(t) if t.get('metric') is not None else t.get('report_error')}",
            ]
            for key, run_ in (t.get("onnx") or {}).items():
                what.append(f"{key}: {_why(run_)}")
            out.append(f"  - qdq {fmt}: " + "; ".join(what))
        elif t:
            out.append(f"  - qdq {fmt}: FAILED: {'killed' if t['killed'] else t.get('error')}")
    if rec.get("modelopt_from"):
        out.append(f"  - ModelOpt from {rec['modelopt_from']}")
    for key in peers:
        t = rec["tools"].get(key) or {}
        if not t:
            continue
        if t.get("not_run"):
            out.append(f"  - {key}: not run: {t['not_run']}")
            continue
        q, ex = t.get("quantizers") or {}, t.get("export") or {}
        shipped = t.get("cpu_as_is_error")
        what = [f"{t.get('config')}",
                f"kernel {t.get('kernel')}" + (f" (as shipped: {shipped})" if shipped else ""),
                f"{q.get('enabled')} of {q.get('inserted')} quantizers",
                f"quantize {t.get('quantize_s')} s"]  # fmt: skip
        if ex.get("error"):
            what.append(f"export failed: {ex['error']}")
        if t.get("export_retry"):
            retry = t["export_retry"]
            layers = ", ".join(
                f"{k} ({v})" for k, v in (t.get("export_float_layers") or {}).items()
            )
            what.append(f"exported with {layers} float: "
                        + retry.get("error", "ok")
                        + f"; torch of that model {_fig(t.get('torch_exportable'))}")  # fmt: skip
        done = t.get("export_retry") or ex
        if done and "error" not in done:
            trt = {k: v for k, v in done.get("ops", {}).items() if "::" in k or "Linear" in k}
            what.append(f"ONNX opsets {done.get('opsets')}, ops {trt}, initializers "
                        f"{done.get('initializer_dtypes')}")  # fmt: skip
        for k, run_ in (t.get("onnx") or {}).items():
            what.append(f"{k}: {_why(run_)}")
        lint = t.get("lint") or {}
        if lint:
            what.append(
                f"lint {lint.get('verdict')} {','.join(lint.get('warn_rules') or []) or '-'}"
            )
        out.append(f"  - {key}: " + "; ".join(what))
    return out


# ------------------------------------------------------------------------------------------ main
def _listed(p: argparse.ArgumentParser, text: str, known: tuple[str, ...], flag: str) -> list[str]:
    names = [s for s in text.split(",") if s]
    bad = [s for s in names if s not in LABELS or s not in known]
    if bad:
        p.error(f"{flag}: unknown {bad}; known: {', '.join(known)}")
    return names


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default=",".join(TRANSFORMERS), help=f"of {', '.join(ROWS)}")
    p.add_argument("--formats", default=",".join(FORMATS),
                   help=f"qdq --format values (default {','.join(FORMATS)}; also mixed)")  # fmt: skip
    p.add_argument("--peer-formats", default=",".join(PEER_FORMATS),
                   help=f"ModelOpt configs (default {','.join(PEER_FORMATS)})")  # fmt: skip
    p.add_argument("--json", type=Path, help="merge each row's record into this JSON")
    p.add_argument("--text", type=Path, help="write the tables of every row in --json here")
    p.add_argument("--timeout", type=float, default=1800.0, help="per tool run, seconds")
    p.add_argument(
        "--target",
        default=None,
        help="qdq's TensorRT target for every format (default: each format's own, as qdq "
        "quantize picks it: trt10.12-blackwell, MXFP8 trt11-b200, INT4w trt10.12)",
    )
    p.add_argument("--qdq-python", default=sys.executable, help="python that runs qdq")
    p.add_argument("--qdq-src", default=str(HERE.parent / "src"), help="qdq's src directory")
    p.add_argument("--peer-python", default="/tmp/peers/bin/python", help="ModelOpt's python")
    p.add_argument("--peers-from", type=Path,
                   help="take ModelOpt's records from this JSON (an earlier run of this script "
                   "on the same rows and data) instead of running it")  # fmt: skip
    p.add_argument("--qdq-from", type=Path,
                   help="take qdq's records from this JSON (an earlier run of this script on the "
                   "same rows and data) instead of running it")  # fmt: skip
    p.add_argument("--work", type=Path, help="keep every row's files here (default: temporary)")
    p.add_argument("--eval-samples", type=int, help="evaluation samples of every row (smoke runs)")
    p.add_argument("--stage", choices=("prep", "runnable"), help=argparse.SUPPRESS)
    p.add_argument("--src", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--dst", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--reference", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--repair", action="store_true", help=argparse.SUPPRESS)
    a = rows_and_src(p, p.parse_args(argv), ROWS)
    a.formats = _listed(p, a.formats, (*FORMATS, "mixed"), "--formats")
    a.peer_formats = _listed(p, a.peer_formats, PEER_FORMATS, "--peer-formats")
    a.peers_from_path = a.peers_from
    a.peers_from = _records(p, a.peers_from, "--peers-from", lambda k: k.startswith("modelopt-"))
    a.qdq_from_path = a.qdq_from
    a.qdq_from = _records(p, a.qdq_from, "--qdq-from", lambda k: not k.startswith("modelopt-"))
    return a


def _records(
    p: argparse.ArgumentParser, path: Path | None, flag: str, keep: Callable[[str], bool]
) -> dict[str, dict[str, Any]]:
    """The tool records of an earlier run's JSON, per row, of the tools ``keep`` takes."""
    if path is None:
        return {}
    if not path.is_file():
        p.error(f"{flag} {path}: no such file")
    rows = json.loads(path.read_text(encoding="utf-8")).get("rows", {})
    return {name: {k: v for k, v in rec.get("tools", {}).items() if keep(k)}
            for name, rec in rows.items()}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.stage == "prep":
        row = ROWS[a.rows[0]]
        stage_prep(dataclasses.replace(row, evaluate=a.eval_samples or row.evaluate), a.work)
        return 0
    if a.stage == "runnable":
        meta = json.loads((a.work / "meta.json").read_text(encoding="utf-8"))
        stage_runnable(a.src, a.dst, meta["inputs"], a.reference, a.repair)
        return 0
    merged: dict[str, Any] = {}
    if a.json and a.json.exists():
        merged = json.loads(a.json.read_text(encoding="utf-8")).get("rows", {})
    done, start = [], time.perf_counter()
    for name in a.rows:
        if a.work:
            a.work.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"blocks-{name}-", dir=a.work))
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
            a.text.write_text(table(recs, a.formats, a.peer_formats) + "\n", encoding="utf-8")
    print(table(done, a.formats, a.peer_formats), flush=True)
    print(f"\n{len(done)} rows in {time.perf_counter() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
