"""The peers' side of ``benchmarks/time_to_result.py``: quantize an FP32 ONNX, or evaluate an ONNX.

Each call is one process, timed from launch to exit by the driver, so a peer's time includes its
imports as a user's script pays them. Modes:

* ``ort FP32 CALIB OUT`` (qdq's environment: onnxruntime is a qdq dependency): ONNX Runtime's
  ``quant_pre_process`` as ORT recommends (when it fails, e.g. PP-OCR's "Incomplete symbolic shape
  inference", the export itself is quantized and the note says so), then ``quantize_static``:
  ``QuantFormat.QDQ``, per-channel weights, ``CalibrationMethod.MinMax``, S8S8 with the
  TensorRT-style options of ``benchmarks/accuracy_ort.py`` (symmetric ranges, float bias, Conv
  axis 0 / ConvTranspose axis 1), calibration batches of ``--batch`` samples;
* ``modelopt FP32 CALIB OUT`` (the peer environment ``/tmp/peers``, see ``benchmarks/README.md``
  "accuracy.py"): ``modelopt.onnx.quantization.quantize(quantize_mode="int8")`` with its default
  calibration (entropy, batches of 1), ``calibration_eps=["cpu"]`` and
  ``high_precision_dtype="fp32"`` (its default fp16 would cast the float layers, which this
  CPU's ONNX Runtime evaluation should not measure);
* ``evaluate ONNX EVAL OUT`` (qdq's environment): the ONNX in ONNX Runtime on the CPU at
  ``ORT_ENABLE_BASIC`` (exact Q/DQ, as ``qdq quantize`` evaluates its export), batches of
  ``--batch`` (batch 1 when the model takes no other), every output saved to ``OUT`` as
  ``out0``, ``out1``, ... in the graph's order.

``CALIB`` / ``EVAL`` are ``.npz`` files of the ONNX's inputs by name (the samples qdq's split
gave). ``--result FILE`` receives one JSON object (seconds in process, notes).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np


def _arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def _batches(arrays: dict[str, np.ndarray], size: int) -> list[dict[str, np.ndarray]]:
    n = len(next(iter(arrays.values())))
    return [{k: v[i : i + size] for k, v in arrays.items()} for i in range(0, n, size)]


def ort(fp32: Path, calib: Path, out: Path, batch: int) -> dict[str, Any]:
    """``quant_pre_process`` + ``quantize_static`` (MinMax, QDQ, per-channel) of ``fp32``."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from accuracy_ort import EXTRA_OPTIONS

    class Reader(CalibrationDataReader):
        def __init__(self, batches: list[dict[str, np.ndarray]]) -> None:
            self.it = iter(batches)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.it, None)

    result: dict[str, Any] = {"note": ""}
    start = time.perf_counter()
    source = out.with_name(out.stem + ".pre.onnx")
    try:
        quant_pre_process(str(fp32), str(source))
    except Exception as err:
        traceback.print_exc()
        result["note"] = f"quant_pre_process failed ({type(err).__name__}: {err}"[:160] + ")"
        source = fp32
    result["preprocess_s"] = round(time.perf_counter() - start, 2)
    start = time.perf_counter()
    quantize_static(str(source), str(out), Reader(_batches(_arrays(calib), batch)),
                    quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    calibrate_method=CalibrationMethod.MinMax,
                    extra_options=EXTRA_OPTIONS)  # fmt: skip
    result["quantize_s"] = round(time.perf_counter() - start, 2)
    return result


def modelopt(fp32: Path, calib: Path, out: Path) -> dict[str, Any]:
    """``modelopt.onnx.quantization.quantize`` (int8, default calibration) of ``fp32``."""
    import modelopt
    from modelopt.onnx.quantization import quantize

    start = time.perf_counter()
    quantize(str(fp32), quantize_mode="int8", calibration_data=_arrays(calib),
             calibration_eps=["cpu"], high_precision_dtype="fp32", output_path=str(out),
             log_level="WARNING")  # fmt: skip
    return {"quantize_s": round(time.perf_counter() - start, 2), "version": modelopt.__version__}


def evaluate(model: Path, data: Path, out: Path, batch: int) -> dict[str, Any]:
    """Every output of ``model`` on every sample of ``data`` (ORT, CPU, ``ORT_ENABLE_BASIC``
    without ``WeightBiasQuantization``, as qdq's own sessions: that basic-level rewrite turns the
    float bias of a Gemm/Conv whose input and weight are dequantized into int32 at ``s_x * s_w``,
    arithmetic the file does not have and TensorRT does not do; with INT4 block scales it broke
    an INT4 weight-only Gemm, 0.94 cosine against 0.99 as written)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    start = time.perf_counter()
    sess = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"],
                                disabled_optimizers=["WeightBiasQuantization"])  # fmt: skip
    arrays = _arrays(data)
    arrays = {i.name: arrays[i.name] for i in sess.get_inputs()}  # an unread input is dropped
    first = sess.get_inputs()[0].shape[0]
    if isinstance(first, int):  # a static batch dimension
        batch = first
    parts = [sess.run(None, b) for b in _batches(arrays, batch)]
    np.savez(out, **{f"out{i}": np.concatenate(p) for i, p in enumerate(zip(*parts, strict=True))})
    return {"evaluate_s": round(time.perf_counter() - start, 2), "batch": batch}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=("ort", "modelopt", "evaluate"))
    p.add_argument("model", type=Path, help="the FP32 ONNX (ort, modelopt) or the ONNX to run")
    p.add_argument("data", type=Path, help="calibration (ort, modelopt) or evaluation .npz")
    p.add_argument("out", type=Path, help="the INT8 ONNX, or the outputs .npz (evaluate)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--result", type=Path, required=True)
    a = p.parse_args(argv)
    if a.mode == "ort":
        result = ort(a.model, a.data, a.out, a.batch)
    elif a.mode == "modelopt":
        result = modelopt(a.model, a.data, a.out)
    else:
        result = evaluate(a.model, a.data, a.out, a.batch)
    a.result.write_text(json.dumps(result) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
