"""Accuracy benchmark (issue 11): every zoo model, FP32 vs qdq INT8 vs the peers, in one run.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/accuracy.py [--models NAME ...] [--methods M ...]
[--calib-n N] [--eval-n N] [--peer-python PY] [--peers ort modelopt] [--out PREFIX] [--work DIR]``.
It prints one table per model and writes ``PREFIX.txt`` (the tables) and ``PREFIX.json``
(default ``benchmarks/accuracy``). Asserts nothing.

Per model of ``qdq.zoo.registry.MODELS`` (so new entries appear by themselves), on the entry's own
data, preprocessing and metric (``qdq.pipeline.data.resolve_data`` and ``evaluate.score``, as
``qdq quantize`` uses them):

1. the FP32 model is exported once (TorchScript exporter, opset 17, dynamic batch; BN folded) and
   its calibration samples saved as ``calib.npz``: every tool calibrates on exactly these samples,
   in batches of ``--batch`` (ModelOpt ONNX in batches of 1, its default);
2. **qdq**: ``qdq.prepare`` + ``qdq.calibrate`` with every calibration method (``--methods``), at
   the default placement (``QuantConfig.tensorrt()``) and at full INT8 coverage
   (``QuantConfig.tensorrt(disable=("performance",))``: H02/P14 off, every weighted layer INT8),
   then ``qdq.export_onnx`` (``benchmarks/accuracy_qdq.py``; ``--exporter``, default ``auto`` =
   qdq's default, dynamo; TorchScript
   gives the same Q/DQ numerics several times faster, but writes EfficientNet's SAME padding as a
   computed Pad, which the linter rightly predicts as float islands and unfused Q/DQ);
3. **ORT** ``quantize_static`` with TensorRT-style options (``benchmarks/accuracy_ort.py``:
   QDQ, symmetric S8S8, per-channel weights; MinMax, Percentile 99.99, Entropy with 2048 bins
   really applied), in this environment (onnxruntime is a qdq dependency);
4. **ModelOpt** torch (``INT8_DEFAULT_CFG``; and with ``mtq.register`` of Conv subclasses where the
   model has them) and ONNX (``max``, ``entropy``) in the peer environment
   (``benchmarks/peers/accuracy_peers.py`` run by ``--peer-python``); without it those rows say
   ``not run`` and why;
5. every ONNX (FP32 included) runs in ONNX Runtime on the CPU at ``ORT_ENABLE_BASIC`` (exact Q/DQ),
   one session at a time, on the evaluation samples; the metric, its drop vs the FP32 ONNX
   (percentage points), the mean/min output cosine with FP32; ``qdq.lint.lint`` of every ONNX gives
   the INT8 coverage (predicted INT8 weighted layers / weighted layers, the same count for every
   row) and the verdict;
6. for a peer row whose coverage no qdq row has (a peer keeping a few layers float), qdq rows with
   exactly those layers excluded, so every peer is compared at its own coverage.

Calibration time: the wall time of each tool's calibration step — qdq ``prepare`` + ``calibrate``;
ORT ``quantize_static`` (which also writes the ONNX; for Entropy the ``create_calibrator`` pass
too); ModelOpt ``mtq.quantize``; ModelOpt ONNX ``quantize`` (which also writes the ONNX) — divided
by one FP32 torch forward over the same calibration batches in the same process (minimum of 3
after a warm-up pass). A step under 30 s runs twice and the faster run counts. Every tool gets
one untimed warm-up call on the first batch. Export seconds (qdq, ModelOpt torch) are listed
separately. On a shared 2-core machine single timings varied up to 5x between runs; the ratios are
indications, not measurements to compare closely.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

import accuracy_ort
import qdq
from accuracy_qdq import float_weighted, matched_rows, qdq_rows
from accuracy_qdq import quiet as _quiet
from accuracy_table import Row, compare, format_table, row_from_dict, write_calib, write_json
from qdq.config import CALIBRATION_METHODS
from qdq.pipeline.data import DataOptions, QuantData, resolve_data
from qdq.pipeline.evaluate import metric_name, ort_outputs, score
from qdq.zoo.registry import MODELS, ZooEntry, get_model

ROOT = Path(__file__).resolve().parents[1]
PEER_SCRIPT = ROOT / "benchmarks" / "peers" / "accuracy_peers.py"
PEER_ROWS = {
    "modelopt": (
        "modelopt-torch",
        "modelopt-torch-registered",
        "modelopt-onnx-max",
        "modelopt-onnx-entropy",
    )
}
INPUT_NAME = "input"


def log(message: str) -> None:
    """A progress line on stderr (the tables go to stdout)."""
    print(message, file=sys.stderr, flush=True)


def short(err: BaseException, limit: int = 200) -> str:
    """``Type: first line`` of an exception, cut to ``limit``."""
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    text = f"{type(err).__name__}: {first}"
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class Settings:
    """The command line, checked."""

    models: tuple[str, ...]
    methods: tuple[str, ...]
    calib_n: int | None
    eval_n: int | None
    batch: int
    peers: tuple[str, ...]
    peer_python: Path
    exporter: str
    work: Path


def fp32_pass(model: nn.Module, batches: list[torch.Tensor]) -> float:
    """Seconds of one FP32 forward over ``batches`` (minimum of 3, after a warm-up pass)."""
    times = []
    with torch.no_grad():
        for b in batches:
            model(b)
        for _ in range(3):
            start = time.perf_counter()
            for b in batches:
                model(b)
            times.append(time.perf_counter() - start)
    return min(times)


def export_fp32(model: nn.Module, example: torch.Tensor, path: Path) -> None:
    """TorchScript export, opset 17, dimension 0 of the input and every output dynamic."""
    with torch.no_grad():
        outputs = model(example)
    n = len(outputs) if isinstance(outputs, (tuple, list)) else 1
    names = [f"output{i}" for i in range(n)]
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (example,),
            str(path),
            dynamo=False,
            opset_version=17,
            input_names=[INPUT_NAME],
            output_names=names,
            dynamic_axes={k: {0: "batch"} for k in (INPUT_NAME, *names)},
        )


def ort_rows(fp32: Path, calib: np.ndarray, work: Path, s: Settings, fp32_s: float) -> list[Row]:
    """ORT quantize_static with TensorRT-style options, every method."""
    rows = [
        Row("ort", m, "TensorRT-style", onnx=str(work / f"ort-{m}.onnx"))
        for m in accuracy_ort.METHODS
    ]
    try:
        pre = _quiet(lambda: accuracy_ort.preprocess(fp32, work / "fp32.pre.onnx"))
        _quiet(  # untimed warm-up
            lambda: accuracy_ort.quantize(
                pre, work / "ort-warmup.onnx", INPUT_NAME, calib[: s.batch], "MinMax", s.batch
            )
        )
    except Exception as err:
        for row in rows:
            row.note, row.onnx = f"not run: quant_pre_process failed: {short(err)}", None
        return rows
    for row in rows:
        if row.method == "Entropy":
            log(f"  {row.label}: a pure-Python KL search per tensor, minutes ...")
        try:
            row.calib_s = _quiet(
                partial(
                    accuracy_ort.quantize,
                    pre,
                    Path(str(row.onnx)),
                    INPUT_NAME,
                    calib,
                    row.method,
                    s.batch,
                )
            )
            row.calib_x = row.calib_s / fp32_s
        except Exception as err:
            row.note, row.onnx = f"not run: {short(err)}", None
        log(f"  {row.label}: {row.note or f'calibrated in {row.calib_s:.2f} s'}")
    if rows[2].onnx is not None:
        rows[2].note = (
            f"{accuracy_ort.ENTROPY_BINS} bins / {accuracy_ort.ENTROPY_QUANTIZED_BINS} quantized "
            "bins via create_calibrator (quantize_static alone would use 128/128 = MinMax)"
        )
    return rows


def modelopt_rows(name: str, fp32: Path, calib_npz: Path, s: Settings) -> tuple[list[Row], dict]:
    """Run the peer script in the peer environment; its rows (or ``not run`` rows) and info."""
    keys = PEER_ROWS["modelopt"]
    if not s.peer_python.is_file():
        why = f"not run: no peer environment at {s.peer_python} (see benchmarks/peers/accuracy_peers.py)"
        return _placeholder_rows(keys, why), {}
    job = s.work / name / "peers"
    job.mkdir(parents=True, exist_ok=True)
    (job / "job.json").write_text(
        json.dumps(
            {
                "model": name,
                "src": str(ROOT / "src"),
                "fp32_onnx": str(fp32),
                "calib": str(calib_npz),
                "batch": s.batch,
                "rows": list(keys),
            }
        ),
        encoding="utf-8",
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    try:
        subprocess.run(
            [str(s.peer_python), str(PEER_SCRIPT), str(job / "job.json")],
            check=True,
            env=env,
            stdout=sys.stderr,
            timeout=3600,
        )
        data = json.loads((job / "peers.json").read_text(encoding="utf-8"))
    except (subprocess.SubprocessError, OSError, ValueError) as err:
        return _placeholder_rows(keys, f"not run: peer script failed: {short(err)}"), {}
    rows = [row_from_dict(r) for r in data["rows"]]
    return rows, {"versions": data.get("versions"), "fp32_pass_s": data.get("fp32_pass_s")}


def _placeholder_rows(keys: tuple[str, ...], note: str) -> list[Row]:
    rows = []
    for key in keys:
        if key.endswith("registered"):
            continue
        if key.startswith("modelopt-torch"):
            rows.append(Row("modelopt-torch", "max", "INT8_DEFAULT_CFG", note=note))
        else:
            rows.append(Row("modelopt-onnx", key.rsplit("-", 1)[1], "default", note=note))
    return rows


def evaluate(rows: list[Row], data: QuantData, s: Settings) -> str:
    """Fill metric, drop, cosine, coverage and lint of every row; return the metric's name."""
    from qdq.lint import lint

    fp32 = rows[0]
    ref: list[torch.Tensor] | None = None
    name = "metric"
    for row in rows:
        if row.onnx is None:
            continue
        try:
            out = ort_outputs(
                row.onnx,
                data.evaluation,
                s.batch,
                static=False,
                desc=row.label,
                show=False,
                every=data.metric is not None,  # a task metric reads every output
            )
            if ref is None:
                ref, name = out, metric_name(out[0], data.labels, data.metric)
            result = score(out, ref, data.labels, data.metric, data.targets)
            row.metric = result["metric"]
            row.figures = dict(result.get("figures", {}))
            row.fp32_metric = result["metric"] if fp32.metric is None else fp32.metric
            row.cosine, row.cosine_min = result["cosine_mean"], result["cosine_min"]
            report = _quiet(partial(lint, row.onnx, target="trt10"))
            row.int8_layers = report.summary["int8_weighted_layers"]
            row.weighted_layers = report.summary["weighted_layers"]
            row.lint = report.verdict
            row.lint_rules = sorted(report.rules("WARN") | report.rules("ERROR"))
            row.lint_summary = dict(report.summary)
            row.float_layers = float_weighted(row.onnx, report.float_layers)
        except Exception as err:
            row.note = f"not evaluated: {short(err)}"
            row.metric = None
        log(f"  evaluated {row.label}: {_fmt(row)}")
        if ref is None:
            break  # without the FP32 reference nothing else can be scored
    return name


def _fmt(row: Row) -> str:
    if row.metric is None:
        return row.note
    drop = "" if row.tool == "fp32" else f", drop {row.drop_pt:+.2f} pt"
    return f"{100 * row.metric:.2f}{drop}, INT8 {row.coverage}, lint {row.lint}"


def run_model(name: str, s: Settings) -> dict[str, Any]:
    """Everything for one zoo model; the JSON record (with a ``table`` text)."""
    entry: ZooEntry = get_model(name)
    started = time.perf_counter()
    log(f"[{name}] {entry.description}")
    missing = entry.missing()
    if missing:
        log(f"  not run: needs {'; '.join(missing)}")
        return {"model": name, "not_run": f"needs {'; '.join(missing)}", "table": ""}
    work = s.work / name
    work.mkdir(parents=True, exist_ok=True)
    data = resolve_data(None, entry, DataOptions(calib_samples=s.calib_n, eval_samples=s.eval_n))
    model = _quiet(entry.build).eval()
    batches = [data.calibration[i : i + s.batch] for i in range(0, len(data.calibration), s.batch)]
    log(f"  data: {data.split}")
    fp32 = work / "fp32.onnx"
    export_fp32(model, batches[0][:1], fp32)
    calib_npz = work / "calib.npz"
    write_calib(calib_npz, INPUT_NAME, data.calibration.numpy())
    fp32_s = fp32_pass(model, batches)
    log(f"  one FP32 forward over {len(data.calibration)} calibration samples: {fp32_s:.3f} s")
    rows = [Row("fp32", "-", "-", onnx=str(fp32))]
    rows += qdq_rows(model, batches, work, s.methods, s.exporter, fp32_s, log)
    if "ort" in s.peers:
        rows += ort_rows(fp32, data.calibration.numpy(), work, s, fp32_s)
    peer_info: dict[str, Any] = {}
    if "modelopt" in s.peers:
        log("  ModelOpt (peer environment) ...")
        peer_rows, peer_info = modelopt_rows(name, fp32, calib_npz, s)
        rows += peer_rows
    log("  evaluating in ONNX Runtime (ORT_ENABLE_BASIC) and linting ...")
    metric = evaluate(rows, data, s)
    extra = matched_rows(rows, model, batches, work, s.methods, s.exporter, fp32_s, log)
    if extra:
        log("  evaluating the qdq rows matched to a peer's coverage ...")
        evaluate([rows[0], *extra], data, s)  # the FP32 row again: the reference outputs
        last_qdq = max(i for i, r in enumerate(rows) if r.tool == "qdq")
        rows[last_qdq + 1 : last_qdq + 1] = extra
    title = (
        f"== {name}: {entry.metric}\n   {data.split}\n   metric: {metric} (%), drop = FP32 - INT8 "
        f"in points; INT8 = predicted TensorRT INT8 weighted layers (qdq lint); x FP32 = "
        f"calibration time / one FP32 forward over the calibration set ({fp32_s:.3f} s here"
        + (
            f", {peer_info['fp32_pass_s']:.3f} s in the peer process"
            if peer_info.get("fp32_pass_s")
            else ""
        )
        + ")"
    )
    table = format_table(title, metric, rows)
    comparison = compare(rows)
    text = table + (
        "\nqdq vs peers at equal INT8 coverage:\n  " + "\n  ".join(comparison) if comparison else ""
    )
    print(text + "\n", flush=True)
    return {
        "model": name,
        "description": entry.description,
        "metric_name": metric,
        "metric_description": entry.metric,
        "split": data.split,
        "calibration_samples": len(data.calibration),
        "evaluation_samples": len(data.evaluation),
        "fp32_pass_s": fp32_s,
        "peer": peer_info,
        "rows": [r.to_dict() for r in rows],
        "comparison": comparison,
        "seconds": round(time.perf_counter() - started, 1),
        "table": text,
    }


def parse(argv: list[str] | None) -> tuple[Settings, Path]:
    """The command line (``SystemExit`` with one line on bad values)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--models",
        nargs="+",
        default=sorted(MODELS),
        metavar="NAME",
        help=f"zoo models (default: all: {', '.join(sorted(MODELS))})",
    )
    p.add_argument(
        "--methods",
        nargs="+",
        default=list(CALIBRATION_METHODS),
        metavar="M",
        help=f"qdq calibration methods (default: {' '.join(CALIBRATION_METHODS)})",
    )
    p.add_argument(
        "--calib-n", type=int, default=None, help="calibration samples (default: the zoo dataset's)"
    )
    p.add_argument(
        "--eval-n",
        type=int,
        default=None,
        help="evaluation samples (default: the zoo dataset's)",
    )
    p.add_argument("--batch", type=int, default=32, help="calibration/evaluation batch (32)")
    p.add_argument(
        "--peers",
        nargs="*",
        default=["ort", "modelopt"],
        choices=["ort", "modelopt"],
        help="peer tools to run (default: both; none: --peers)",
    )
    p.add_argument(
        "--peer-python",
        type=Path,
        default=Path("/tmp/peers/bin/python"),
        help="python of the ModelOpt environment (default /tmp/peers/bin/python)",
    )
    p.add_argument(
        "--exporter",
        choices=["torchscript", "dynamo", "auto"],
        default="auto",
        help="qdq's exporter (default auto: qdq's default, dynamo with a TorchScript fallback)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=ROOT / "benchmarks" / "accuracy",
        help="writes OUT.txt and OUT.json (default benchmarks/accuracy)",
    )
    p.add_argument(
        "--work",
        type=Path,
        default=None,
        help="keep the ONNX files here (default: a temporary directory, removed)",
    )
    a = p.parse_args(argv)  # fmt: skip
    unknown = [m for m in a.models if m not in MODELS]
    if unknown:
        p.error(f"unknown zoo model(s) {unknown}; choose from {', '.join(sorted(MODELS))}")
    bad = [m for m in a.methods if m not in CALIBRATION_METHODS]
    if bad:
        p.error(f"unknown method(s) {bad}; choose from {', '.join(CALIBRATION_METHODS)}")
    for flag, value in (("--calib-n", a.calib_n), ("--eval-n", a.eval_n), ("--batch", a.batch)):
        if value is not None and value < 1:
            p.error(f"{flag} must be a positive int, got {value}")
    work = a.work or Path(tempfile.mkdtemp(prefix="qdq-accuracy-"))
    settings = Settings(
        tuple(a.models), tuple(a.methods), a.calib_n, a.eval_n, a.batch, tuple(a.peers),
        a.peer_python, a.exporter, work,
    )  # fmt: skip
    return settings, a.out


def main(argv: list[str] | None = None) -> int:
    s, out = parse(argv)
    started = time.perf_counter()
    records = []
    try:
        for name in s.models:
            try:
                records.append(run_model(name, s))
            except Exception as err:  # one model never stops the run
                log(f"[{name}] failed: {short(err)}")
                records.append({"model": name, "not_run": short(err), "table": ""})
    finally:
        if s.work.name.startswith("qdq-accuracy-") and s.work.parent == Path(tempfile.gettempdir()):
            shutil.rmtree(s.work, ignore_errors=True)
    seconds = time.perf_counter() - started
    header = _header(s, seconds)
    text = "\n\n".join(
        [header, *(r["table"] or f"== {r['model']}: not run: {r['not_run']}" for r in records)]
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".txt").write_text(text + "\n", encoding="utf-8")
    write_json(
        out.with_suffix(".json"),
        {"header": header, "seconds": round(seconds, 1), "models": records},
    )
    log(f"wrote {out.with_suffix('.txt')} and {out.with_suffix('.json')} ({seconds:.0f} s)")
    return 0


def _header(s: Settings, seconds: float) -> str:
    import onnxruntime

    return (
        f"benchmarks/accuracy.py — qdq {qdq.__version__}, torch {torch.__version__}, "
        f"onnxruntime {onnxruntime.__version__}; qdq methods {' '.join(s.methods)}; "
        f"qdq exporter {s.exporter}; batch {s.batch}; peers {' '.join(s.peers) or 'none'} "
        f"(ModelOpt via {s.peer_python}); {seconds:.0f} s"
    )


if __name__ == "__main__":
    sys.exit(main())
