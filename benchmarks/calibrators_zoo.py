"""The zoo section of ``benchmarks/calibrators.py``: calibration time vs one FP32 pass and vs ORT.

Per zoo model, on its own calibration samples (``qdq.pipeline.data.resolve_data``, as ``qdq
quantize`` reads them) in batches of ``--batch``, each repeat times, interleaved so all three share
the machine's noise:

* **FP32**: one torch forward over the batches (eval, ``no_grad``), as ``benchmarks/accuracy.py``;
* **qdq**: ``qdq.calibrate`` over the same batches with the quantizers' default method (``mse``:
  one histogram pass, then amax of every activation quantizer). ``qdq.prepare`` runs once before,
  untimed (its seconds are listed apart);
* **ORT MinMax**: ``onnxruntime.quantization`` MinMax calibration (symmetric) of the FP32 ONNX
  (TorchScript exporter, opset 17, dynamic batch) on the same samples and batches:
  ``collect_data`` + ``compute_data``. ``create_calibrator`` (graph augmentation and the
  inference session) runs before, untimed, as ``prepare`` is for qdq.

Every step gets one untimed warm-up; the table shows the medians of ``--zoo-repeats`` repeats and
the ratios of those medians.
"""

from __future__ import annotations

import contextlib
import io
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


class _Ort:
    """ORT MinMax calibration of one FP32 ONNX on fixed batches."""

    def __init__(self, onnx_path: Path, work: Path, batches: list[np.ndarray]) -> None:
        self.onnx_path, self.work, self.batches = onnx_path, work, batches

    def calibrator(self) -> Any:
        from onnxruntime.quantization import CalibrationMethod, create_calibrator

        return create_calibrator(
            self.onnx_path,
            augmented_model_path=str(self.work / "augmented.onnx"),
            calibrate_method=CalibrationMethod.MinMax,
            extra_options={"symmetric": True},
        )

    def run(self, calibrator: Any) -> Any:
        from onnxruntime.quantization import CalibrationDataReader

        batches = self.batches

        class Reader(CalibrationDataReader):
            def __init__(self) -> None:
                self.it = iter(batches)

            def get_next(self) -> dict[str, np.ndarray] | None:
                b = next(self.it, None)
                return None if b is None else {INPUT_NAME: b}

        calibrator.collect_data(Reader())
        return calibrator.compute_data()


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

    ort_note = ""
    with tempfile.TemporaryDirectory(prefix="qdq-calib-bench-") as tmp:
        ort: _Ort | None = None
        try:
            path = Path(tmp) / "fp32.onnx"
            _quiet(lambda: export_fp32(model, batches[0][:1], path))
            ort = _Ort(path, Path(tmp), [b.numpy() for b in batches])
            ort.run(_quiet(ort.calibrator))  # warm-up
        except Exception as err:  # the row still shows FP32 and qdq
            ort, ort_note = None, f"ORT not run: {type(err).__name__}: {str(err)[:120]}"
        _fp32(model, batches)
        run_qdq()  # warm-up
        fp32_t, qdq_t, ort_t = [], [], []
        for _ in range(repeats):
            fp32_t.append(_seconds(lambda: _fp32(model, batches)))
            qdq_t.append(_seconds(run_qdq))
            if ort is not None:
                cal = _quiet(ort.calibrator)
                ort_t.append(_seconds(lambda c=cal: ort.run(c)))  # type: ignore[union-attr]
    fp32_s, qdq_s = statistics.median(fp32_t), statistics.median(qdq_t)
    ort_s = statistics.median(ort_t) if ort_t else None
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
