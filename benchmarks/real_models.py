"""Real-model benchmark (issue 10): capture, placement, export, ORT parity and lint per architecture.

Run: ``YOLO_OFFLINE=1 .venv/bin/python benchmarks/real_models.py [--only NAME ...] [--json PATH]``;
``--merge A.json B.json`` prints one table from the JSON of earlier (grouped) runs (a model in a later
file replaces its row in an earlier one). With more than one
model, each runs in a child process (a crash is one row). Prints tables, asserts nothing. The
architectures are ``tests/models/real.py`` (random weights, batch 1, small inputs), plus its
base-size rows that only this benchmark runs (``BENCH_ARCHS``: BERT-family encoders at 12 layers
and 128 tokens, an all-MiniLM-L6-shaped mean-pooled encoder).

Per model: whether ``torch.fx.symbolic_trace`` and ``torch.export.export(strict=False)`` each succeed
on their own; which capture path ``qdq.prepare`` took (``plan.capture`` when the plan has it, else read
from the fallback note); plan counts (quantized / shared / skipped points, residual Adds placed by P03,
S02 Concat and S03 pass-through groups, Conv/Linear coverage); ``qdq.calibrate`` on 2 random batches
(max); ``qdq.export_onnx`` with each exporter; ORT parity on the example input; ``qdq.lint.lint`` of
each export. Every cell catches its own failure, so one model never stops the table. Only the public
API is used, so the script runs unchanged across rewrites of ``qdq.prepare``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import re
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import qdq
from models.real import BENCH_ARCHS as ARCHS
from models.real import RealModel

EXPORTERS = ("dynamo", "torchscript")
CALIB_BATCHES = 2
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # terminal colours in torch.onnx messages


def short(err: BaseException, limit: int = 160) -> str:
    """``Type: first line`` (two when the first ends with ":"), then the root cause, cut to ``limit``.

    Exporters wrap the real error (``TorchExportError`` around a constraint violation): the innermost
    ``__cause__`` is appended after ``<-``.
    """
    text = _line(err)
    root = err
    while root.__cause__ is not None and root.__cause__ is not root:
        root = root.__cause__
    if root is not err:
        text += f" <- {_line(root)}"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _line(err: BaseException) -> str:
    message = _ANSI.sub("", str(err))
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()] or [""]
    first = " ".join(lines[:2]) if lines[0].endswith(":") else lines[0]  # "...:" heads a list
    return f"{type(err).__name__}: {first}"


def timed(cell: dict[str, Any], fn: Callable[[], Any]) -> Any:
    """Run ``fn``; record ``ok``, ``seconds`` and the short ``error`` in ``cell``; return its value."""
    start = time.perf_counter()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            value = fn()
        cell["ok"] = True
        return value
    except Exception as err:  # every failure is a table cell
        cell.update(ok=False, error=short(err))
        return None
    finally:
        cell["seconds"] = round(time.perf_counter() - start, 2)


def capture_path(plan: Any) -> str:
    """The capture path of a plan: ``plan.capture`` when present, else inferred from its notes."""
    cap = getattr(plan, "capture", None)
    if cap is not None:
        if isinstance(cap, str):
            return cap
        for attr in ("path", "kind", "method", "name"):
            if isinstance(getattr(cap, attr, None), str):
                return str(getattr(cap, attr))
        return str(cap)
    return "replace" if any("module-replacement" in n for n in plan.notes) else "fx"


def plan_cells(plan: Any) -> dict[str, Any]:
    """Point, P03, group and coverage counts of a plan."""
    decisions = Counter(p.decision for p in plan.points)
    coverage = Counter(c.status for c in plan.coverage)
    return {
        "quantize": decisions["quantize"],
        "share": decisions["share"],
        "skip": decisions["skip"],
        "p03_adds": len({p.owner for p in plan.points if p.rule == "P03" and p.quantized}),
        "adds": len({p.owner for p in plan.points if p.op == "add"}),
        "s02_groups": sum(1 for g in plan.groups if "S02" in g.rules),
        "s03_groups": sum(1 for g in plan.groups if "S03" in g.rules),
        "coverage": {s: coverage[s] for s in ("int8", "float", "not reached")},
        "skip_rules": dict(Counter(p.rule for p in plan.points if p.decision == "skip")),
        "notes": list(plan.notes),
    }


def export_cells(prepared: Any, rm: RealModel, exporter: str, folder: Path) -> dict[str, Any]:
    """Export with one exporter, then ORT parity and lint of the file."""
    from qdq.backends.onnxruntime import parity

    cell: dict[str, Any] = {}
    path = folder / f"{rm.name}.{exporter}.onnx"
    res = timed(
        cell,
        lambda: qdq.export_onnx(
            prepared,
            rm.example_inputs,
            path,
            exporter=exporter,
            overwrite=True,
            verify=ARCHS[rm.name].end_to_end,
        ),
    )
    if res is None:
        return cell
    cell.update(q=res.num_quantize, dq=res.num_dequantize)
    par: dict[str, Any] = {}
    report = timed(par, lambda: parity(prepared, path, [rm.example_inputs]))
    if report is not None and report.size_differs:  # detections after NMS: nothing comparable
        par["size_differs"] = {
            str(i): [list(a), list(b)] for i, (a, b) in report.size_differs.items()
        }
    elif report is not None:
        par.update(
            max_rel_diff=report.max_rel_diff,
            min_cosine=report.min_cosine,
            top1=report.top1_agreement,
        )
    cell["parity"] = par
    lin: dict[str, Any] = {}
    lr = timed(lin, lambda: qdq.lint.lint(path))
    if lr is not None:
        s = lr.summary
        lin.update(
            verdict=lr.verdict,
            unfused_qdq=s["unfused_qdq"],
            float_islands=s["float_islands"],
            int8_weighted=s["int8_weighted_layers"],
            weighted=s["weighted_layers"],
            warn_rules=dict(
                sorted(Counter(f.rule for f in lr.findings if f.severity == "WARN").items())
            ),
            error_rules=sorted(lr.rules("ERROR")),
        )
    cell["lint"] = lin
    return cell


def bench(name: str, folder: Path) -> dict[str, Any]:
    """Every cell of one row."""
    arch = ARCHS[name]
    row: dict[str, Any] = {"name": name, "family": arch.family, "note": arch.note}
    if not arch.available:
        row["status"] = f"not installed ({', '.join(arch.missing)})"
        return row
    start = time.perf_counter()
    row["build"] = {}
    rm = timed(row["build"], arch.build)
    if rm is not None:
        _bench_model(rm, row, folder)
    row["status"] = "ok"
    row["total_seconds"] = round(time.perf_counter() - start, 1)
    return row


def _bench_model(rm: RealModel, row: dict[str, Any], folder: Path) -> None:
    row["fx"], row["torch_export"], row["prepare"] = {}, {}, {}
    timed(row["fx"], lambda: torch.fx.symbolic_trace(copy.deepcopy(rm.model)))
    timed(
        row["torch_export"],
        lambda: torch.export.export(copy.deepcopy(rm.model), rm.example_inputs, strict=False),
    )
    caught: list[str] = []

    def prepare() -> Any:
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            out = qdq.prepare(rm.model, rm.example_inputs)
        caught.extend(str(w.message) for w in ws if issubclass(w.category, UserWarning))
        return out

    prepared = timed(row["prepare"], prepare)
    if prepared is None:
        return
    plan = qdq.plan_of(prepared)
    row["prepare"].update(
        capture=capture_path(plan), warnings=[c.splitlines()[0][:160] for c in caught if c]
    )
    row["plan"] = plan_cells(plan)
    row["calibrate"] = {}
    gen = torch.Generator().manual_seed(2)
    batches = [tuple(_like(x, gen) for x in rm.example_inputs) for _ in range(CALIB_BATCHES)]
    done = timed(
        row["calibrate"],
        lambda: qdq.calibrate(prepared, batches, method="max", show_progress=False),
    )
    if done is None:
        return
    row["export"] = {e: export_cells(prepared, rm, e, folder) for e in EXPORTERS}


# ------------------------------------------------------------------------------------ printing
def _cell(c: dict[str, Any] | None) -> str:
    if not c:
        return "-"
    return "ok" if c.get("ok") else "FAIL"


def _num(v: Any, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def render(rows: list[dict[str, Any]]) -> str:
    """The three tables (capture and plan; export, parity and lint; failures and times) as text."""
    out = ["## capture and plan", ""]
    head = (
        f"{'model':<26} {'fx':<4} {'t.exp':<5} {'capture':<9} {'q/share/skip':<13} "
        f"{'P03 adds':<9} {'S02':>4} {'S03':>4} {'conv/lin int8/fl/nr':<20} {'total s':>7}"
    )
    out += [head, "-" * len(head)]
    for r in rows:
        if r.get("status") != "ok" or not r.get("build", {}).get("ok"):
            why = r.get("status") if r.get("status") != "ok" else r["build"].get("error")
            out.append(f"{r['name']:<26} {why}")
            continue
        pr, pl = r.get("prepare", {}), r.get("plan")
        cap = pr.get("capture", "FAIL")
        if pl:
            cov = pl["coverage"]
            counts = f"{pl['quantize']}/{pl['share']}/{pl['skip']}"
            adds = f"{pl['p03_adds']}/{pl['adds']}"
            covs = f"{cov['int8']}/{cov['float']}/{cov['not reached']}"
            s02, s03 = pl["s02_groups"], pl["s03_groups"]
        else:
            counts = adds = covs = s02 = s03 = "-"
        out.append(
            f"{r['name']:<26} {_cell(r['fx']):<4} {_cell(r['torch_export']):<5} {cap:<9} "
            f"{counts:<13} {adds:<9} {s02:>4} {s03:>4} {covs:<20} {r['total_seconds']:>7.1f}"
        )
    out += ["", "P03 adds: residual Adds with a P03 quantized input / all Add ops in the plan.", ""]
    out += ["## export, ORT parity (example input) and lint, per exporter", ""]
    head = (
        f"{'model':<26} {'exporter':<11} {'export':<6} {'Q/DQ':<9} {'rel diff':>9} {'cos':>7} "
        f"{'top1':>5} {'lint':<5} {'unfused':>7} {'islands':>7} {'int8/wl':<8} warn rules"
    )
    out += [head, "-" * len(head)]
    for r in rows:
        for exp, c in r.get("export", {}).items():
            par, lin = c.get("parity", {}), c.get("lint", {})
            qdq_n = f"{c['q']}/{c['dq']}" if c.get("ok") else "-"
            wl = f"{lin['int8_weighted']}/{lin['weighted']}" if lin.get("ok") else "-"
            rules = ",".join(f"{k}x{v}" for k, v in lin.get("warn_rules", {}).items()) or "-"
            out.append(
                f"{r['name']:<26} {exp:<11} {_cell(c):<6} {qdq_n:<9} "
                f"{_num(par.get('max_rel_diff'), '.2e'):>9} {_num(par.get('min_cosine'), '.4f'):>7} "
                f"{_num(par.get('top1'), '.2f'):>5} {lin.get('verdict', '-'):<5} "
                f"{_num(lin.get('unfused_qdq'), 'd'):>7} {_num(lin.get('float_islands'), 'd'):>7} "
                f"{wl:<8} {rules}"
            )
    out += ["", "## failures (first error line) and seconds per step", ""]
    for r in rows:
        if r.get("status") != "ok":
            continue
        steps = [
            ("build", r.get("build")),
            ("fx", r.get("fx")),
            ("torch.export", r.get("torch_export")),
        ]
        steps += [("prepare", r.get("prepare")), ("calibrate", r.get("calibrate"))]
        steps += [(f"export[{e}]", c) for e, c in r.get("export", {}).items()]
        secs = ", ".join(f"{n} {c['seconds']:.1f}" for n, c in steps if c and "seconds" in c)
        rss = f", peak RSS {r['peak_rss_mb']} MB" if "peak_rss_mb" in r else ""
        out.append(f"{r['name']}  ({r['total_seconds']:.1f} s{rss}: {secs})")
        if r.get("note"):
            out.append(f"    note: {r['note']}")
        for n, c in steps:
            if c and not c.get("ok", True):
                out.append(f"    {n}: {_ANSI.sub('', str(c.get('error')))}")
        for w in r.get("prepare", {}).get("warnings", []):
            out.append(f"    prepare warned: {w}")
        for e, c in r.get("export", {}).items():
            for part in ("parity", "lint"):
                if c.get(part) and not c[part].get("ok", True):
                    out.append(f"    {part}[{e}]: {c[part].get('error')}")
            if c.get("lint", {}).get("error_rules"):
                out.append(f"    lint[{e}] ERROR rules: {','.join(c['lint']['error_rules'])}")
            sized = c.get("parity", {}).get("size_differs")
            if sized:
                shapes = "; ".join(f"output {i}: {a} vs {b}" for i, (a, b) in sized.items())
                out.append(
                    f"    parity[{e}]: outputs sized by values (detections after NMS) differ, not "
                    f"compared: {shapes}"
                )
    return "\n".join(out)


def _peak_rss_mb() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def _bench_in_child(name: str, threads: int, folder: Path) -> dict[str, Any]:
    """One model in a child process, so that a crash (killed for memory) is one row, not the run."""
    import subprocess

    out = folder / f"{name}.json"
    cmd = [sys.executable, __file__, "--only", name, "--threads", str(threads), "--json", str(out)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, check=False)
    if proc.returncode == 0 and out.is_file():
        return dict(json.loads(out.read_text())[0])
    arch = ARCHS[name]
    return {
        "name": name,
        "family": arch.family,
        "note": arch.note,
        "status": f"crashed (exit code {proc.returncode}; killed for memory?)",
        "total_seconds": round(time.perf_counter() - start, 1),
    }


def _like(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A random calibration input shaped like ``x``: Gaussian for float inputs; integer inputs
    (token ids, masks) keep the example's values, whose ranges a random draw would not know."""
    return torch.randn(x.shape, generator=gen) if x.is_floating_point() else x.clone()


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", default=[], help="a model name (repeatable)")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON here")
    ap.add_argument("--merge", type=Path, nargs="+", help="print one table from these JSON files")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    ap.add_argument(
        "--inline", action="store_true", help="no child process per model (a crash stops the run)"
    )
    args = ap.parse_args(argv)
    if args.merge:
        latest: dict[str, dict[str, Any]] = {}  # a model re-run in a later file replaces its row
        for path in args.merge:
            for row in json.loads(path.read_text()):
                latest[row["name"]] = row
        print(render(list(latest.values())))
        if args.json:
            args.json.write_text(json.dumps(list(latest.values()), indent=1, default=str))
        return 0
    unknown = [n for n in args.only if n not in ARCHS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {', '.join(ARCHS)}")
    torch.set_num_threads(args.threads)
    names = args.only or list(ARCHS)
    rows = []
    with tempfile.TemporaryDirectory(prefix="qdq-real-") as tmp:
        for name in names:
            if len(names) == 1 or args.inline:
                print(f"[real_models] {name} ...", file=sys.stderr, flush=True)
                rows.append(bench(name, Path(tmp)))
                rows[-1]["peak_rss_mb"] = _peak_rss_mb()
                print(f"[real_models] {name} {rows[-1].get('total_seconds', 0)} s", file=sys.stderr)
            else:  # the child prints the progress lines
                rows.append(_bench_in_child(name, args.threads, Path(tmp)))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))
    print(f"qdq {qdq.__version__}, torch {torch.__version__}, {args.threads} threads")
    print(render(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
