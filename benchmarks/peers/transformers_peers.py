"""ModelOpt rows of ``benchmarks/transformers_compare.py``; runs in the peer virtual environment.

ModelOpt pins other onnx/onnxruntime versions than qdq, so it never shares qdq's environment::

    python3 -m venv /tmp/peers
    /tmp/peers/bin/pip install torch==2.14.1 torchvision==0.29.1 "nvidia-modelopt[onnx]" \\
        requests huggingface_hub transformers==5.24.0

``benchmarks/transformers_compare.py`` writes a job file and calls
``/tmp/peers/bin/python benchmarks/peers/transformers_peers.py JOB.json``. The job names the
real-model row (``tests/models/real.py``, which imports only torch and transformers: the same
model code and random weights as qdq's rows), the FP32 ONNX the driver exported and the
calibration tokens (``calib.npz``: ``input_ids``, ``attention_mask``). Rows written next to the
job:

* ``modelopt-torch``: ``mtq.quantize(model, mtq.INT8_DEFAULT_CFG, forward_loop)`` over the
  calibration batches, then ``torch.onnx.export(dynamo=False, opset_version=17)`` with a dynamic
  batch and sequence length;
* ``modelopt-onnx``: ``modelopt.onnx.quantization.quantize`` on the FP32 ONNX,
  ``quantize_mode="int8"``, ``calibration_method="max"``, CPU calibration, everything else at its
  defaults.

``peers.json`` holds the files, the seconds of each step and the versions.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np
import torch


def main(job_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    work = Path(job_path).parent
    sys.path.insert(0, job["tests"])
    import modelopt

    from models.real import BENCH_ARCHS

    calib = dict(np.load(job["calib"]))
    ids, mask = torch.from_numpy(calib["input_ids"]), torch.from_numpy(calib["attention_mask"])
    size = job["batch"]
    out: dict = {"versions": {"modelopt": modelopt.__version__, "torch": torch.__version__},
                 "rows": {}}  # fmt: skip
    try:
        import modelopt.torch.quantization as mtq

        rm = BENCH_ARCHS[job["row"]].build()
        model = rm.model

        def loop(m: torch.nn.Module) -> None:
            with torch.no_grad():
                for i in range(0, len(ids), size):
                    m(ids[i : i + size], mask[i : i + size])

        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mtq.quantize(model, mtq.INT8_DEFAULT_CFG, loop)
        seconds = time.perf_counter() - start
        path = work / "modelopt-torch.onnx"
        axes = {
            "input_ids": {0: "batch", 1: "sequence"},
            "attention_mask": {0: "batch", 1: "sequence"},
        }
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model.eval(), (ids[:2], mask[:2]), str(path), dynamo=False,
                              opset_version=17, input_names=["input_ids", "attention_mask"],
                              dynamic_axes=axes)  # fmt: skip
        out["rows"]["modelopt-torch"] = {"onnx": str(path), "calibrate_s": seconds}
    except Exception as err:  # a peer failure is a row
        out["rows"]["modelopt-torch"] = {"error": f"{type(err).__name__}: {err}",
                                         "traceback": traceback.format_exc()[-2000:]}  # fmt: skip
    try:
        from modelopt.onnx.quantization import quantize

        path = work / "modelopt-onnx.onnx"
        start = time.perf_counter()
        quantize(job["fp32"], quantize_mode="int8", calibration_method="max",
                 calibration_data={"input_ids": calib["input_ids"],
                                   "attention_mask": calib["attention_mask"]},
                 calibration_eps=["cpu"], output_path=str(path))  # fmt: skip
        out["rows"]["modelopt-onnx"] = {
            "onnx": str(path),
            "calibrate_s": time.perf_counter() - start,
        }
    except Exception as err:
        out["rows"]["modelopt-onnx"] = {"error": f"{type(err).__name__}: {err}",
                                        "traceback": traceback.format_exc()[-2000:]}  # fmt: skip
    (work / "peers.json").write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
