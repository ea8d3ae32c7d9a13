"""The zoo section of ``benchmarks/calibrators.py``: calibration time vs one FP32 pass and vs ORT.

Per zoo model, on its own calibration samples (``qdq.pipeline.data.resolve_data``, as ``qdq
quantize`` reads them) in batches of ``--batch``:

* **FP32**: one torch forward over the batches (eval, ``no_grad``), as ``benchmarks/accuracy.py``;
  interleaved with the qdq runs, so both share the machine's noise;
* **qdq**: ``qdq.calibrate`` over the same batches with the quantizers' default method (``mse``:
  one histogram pass, then amax of every activation quantizer). ``qdq.prepare`` runs once before,
  untimed (its seconds are listed apart);
* **ORT MinMax**: ``onnxruntime.quantization`` MinMax calibration (symmetric) of the FP32 ONNX
  (TorchScript exporter, opset 17, dynamic batch) on the same samples and batches:
  ``collect_data`` + ``compute_data``. ``create_calibrator`` (graph augmentation and the
  inference session, re-created with as many intra-op threads as torch has) runs before, untimed,
  as ``prepare`` is for qdq. It runs in a process of its own, after the torch timings: ONNX
  Runtime's idle threads spin for a while after each run and would take the cores from the next
  torch step (measured: RNet's FP32 pass read 48 ms instead of 4 ms on 2 threads).

Every step gets one untimed warm-up; the table shows the medians of ``--zoo-repeats`` repeats and
the ratios of those medians.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import io
import multiprocessing
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

import qdq
from accuracy import INPUT_NAME, export_fp32  # the FP32 ONNX every peer row starts from

__all__ = ["bench_zoo"]

T = TypeVar("T")


def _quiet(fn: Callable[[], T]) -> T:
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        return fn()


def _seconds(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _fp32(model: nn.Module, batches: list[torch.Tensor]) -> None:
    with torch.no_grad():
        for b in batches:
            model(b)


def _ort_minmax_seconds(onnx_path: str, batches_path: str, repeats: int, threads: int) -> float:
    """Median seconds of ORT MinMax calibration (``collect_data`` + ``compute_data``); run in a
    process of its own (see the module docstring)."""
    import onnxruntime as ort
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        create_calibrator,
    )

    with np.load(batches_path) as f:
        batches = [f[k] for k in sorted(f.files, key=int)]
    work = Path(batches_path).parent

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(batches)

        def get_next(self) -> dict[str, np.ndarray] | None:
            b = next(self.it, None)
            return None if b is None else {INPUT_NAME: b}

    def calibrator() -> Any:
        cal = create_calibrator(
            onnx_path,
            augmented_model_path=str(work / "augmented.onnx"),
            calibrate_method=CalibrationMethod.MinMax,
            extra_options={"symmetric": True},
        )
        options = ort.SessionOptions()  # as ORT's own, with torch's thread count
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.intra_op_num_threads = threads
        cal.infer_session = ort.InferenceSession(
            cal.augmented_model_path, sess_options=options, providers=cal.execution_providers
        )
        return cal

    def run(cal: Any) -> None:
        cal.collect_data(Reader())
        cal.compute_data()

    times = []
    for i in range(repeats + 1):  # the first is the warm-up
        cal = _quiet(calibrator)
        seconds = _seconds(functools.partial(run, cal))
        if i:
            times.append(seconds)
        del cal
        gc.collect()  # one live session (and thread pool) at a time
    return statistics.median(times)


def _ort_row(
    model: nn.Module, batches: list[torch.Tensor], repeats: int
) -> tuple[float | None, str]:
    """ORT MinMax seconds on ``batches`` (or ``None`` and why not)."""
    with tempfile.TemporaryDirectory(prefix="qdq-calib-bench-") as tmp:
        try:
            path = Path(tmp) / "fp32.onnx"
            _quiet(lambda: export_fp32(model, batches[0][:1], path))
            data = Path(tmp) / "batches.npz"
            arrays: dict[str, Any] = {str(i): b.numpy() for i, b in enumerate(batches)}
            np.savez(data, **arrays)
            ctx = multiprocessing.get_context("spawn")
            with ctx.Pool(1) as pool:
                args = (str(path), str(data), repeats, torch.get_num_threads())
                return pool.apply(_ort_minmax_seconds, args), ""
        except Exception as err:  # the row still shows FP32 and qdq
            return None, f"ORT not run: {type(err).__name__}: {str(err)[:120]}"


def _model_row(name: str, batch: int, calib_n: int | None, repeats: int) -> dict[str, Any]:
    from qdq.pipeline.data import DataOptions, resolve_data
    from qdq.zoo.registry import get_model

    entry = get_model(name)
    missing = entry.missing()
    if missing:
        return {"model": name, "note": f"not run: needs {'; '.join(missing)}"}
    data = resolve_data(None, entry, DataOptions(calib_samples=calib_n))
    model = _quiet(entry.build).eval()
    calib = data.calibration
    batches = [calib[i : i + batch] for i in range(0, len(calib), batch)]
    start = time.perf_counter()
    prepared = _quiet(lambda: qdq.prepare(model, (batches[0][:1],)))
    prepare_s = time.perf_counter() - start

    def run_qdq() -> None:
        _quiet(lambda: qdq.calibrate(prepared, batches, show_progress=False))

    _fp32(model, batches)
    run_qdq()  # warm-up
    fp32_t, qdq_t = [], []
    for _ in range(repeats):
        fp32_t.append(_seconds(lambda: _fp32(model, batches)))
        qdq_t.append(_seconds(run_qdq))
    ort_s, ort_note = _ort_row(model, batches, repeats)
    fp32_s, qdq_s = statistics.median(fp32_t), statistics.median(qdq_t)
    acts = sum(1 for q in qdq.quantizers_of(prepared).values() if not q.name.endswith(":weight"))
    return {
        "model": name,
        "samples": len(calib),
        "batches": len(batches),
        "quantizers": acts,
        "prepare_s": prepare_s,
        "fp32_s": fp32_s,
        "qdq_s": qdq_s,
        "ort_s": ort_s,
        "note": ort_note,
    }


def bench_zoo(models: list[str], batch: int, calib_n: int | None, repeats: int) -> None:
    """Print the per-model table (see the module docstring)."""
    print(
        f"calibration time per zoo model (medians of {repeats}; batches of {batch}; "
        f"torch threads {torch.get_num_threads()})"
    )
    head = (
        f"  {'model':<22}{'samples':>8}{'acts':>6}{'FP32 s':>10}{'qdq calib s':>13}"
        f"{'x FP32':>8}{'ORT MinMax s':>14}{'x ORT':>7}{'prepare s':>11}"
    )
    print(head)
    for name in models:
        r = _model_row(name, batch, calib_n, repeats)
        if "fp32_s" not in r:
            print(f"  {name:<22}{r['note']}")
            continue
        ort = r["ort_s"]
        ort_txt = f"{ort:>14.4f}{r['qdq_s'] / ort:>7.2f}" if ort else f"{'-':>14}{'-':>7}"
        print(
            f"  {name:<22}{r['samples']:>8}{r['quantizers']:>6}{r['fp32_s']:>10.4f}"
            f"{r['qdq_s']:>13.4f}{r['qdq_s'] / r['fp32_s']:>8.2f}{ort_txt}{r['prepare_s']:>11.2f}"
            + (f"   {r['note']}" if r["note"] else ""),
            flush=True,
        )
