"""ModelOpt FP8 side of ``benchmarks/fp8.py``; runs in the peer virtual environment.

ModelOpt pins other onnx/onnxruntime versions than qdq, so it never shares qdq's environment
(``benchmarks/README.md``, "accuracy.py"; the ``bert``/``distilbert``/``unet`` rows also need
``transformers==5.24.0 diffusers==0.42.1 tokenizers typer importlib_metadata`` there).

``benchmarks/fp8.py`` writes ``job.json`` next to the row's files and calls
``/tmp/peers/bin/python benchmarks/peers/fp8_peers.py JOB.json``. The job names the row
(``benchmarks/fp8_models.py``, whose factories import only torch and their model package, and
qdq's ``src`` for the zoo models' registry: the same model code and weights as qdq's runs), the
calibration and evaluation ``.npz`` the driver saved (the very samples ``qdq quantize``
calibrates and evaluates on, inputs by position; ``meta.json``'s ``keys`` maps them to keyword
inputs) and the batch size. Steps, each timed:

1. ``mtq.quantize(model, mtq.FP8_DEFAULT_CFG, forward_loop)`` over the calibration batches
   (max calibration, per-tensor FP8 E4M3 inputs and weights of every Conv/Linear);
2. the fake-quantized model in torch on the evaluation samples (``torch-outputs.npz``, outputs in
   pytree order as ``out0``, ``out1`` ...): ModelOpt's own figure;
3. ModelOpt's ONNX export of the quantized model
   (``modelopt.torch._deploy.utils.get_onnx_bytes_and_metadata``: TorchScript at its default
   opset, FP8 Q/DQ post-processed by its ``FP8QuantExporter``), dynamic batch, inputs renamed to
   the ``.npz`` names; written as ``modelopt-fp8.onnx`` for the driver to run in ONNX Runtime.

``peers.json`` holds the files, the seconds, the quantizer counts, the versions and any error
(a failure is a result: the driver prints it as the row's cell).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn


def _short(err: BaseException, limit: int = 300) -> str:
    text = f"{type(err).__name__}: {str(err).strip()}"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _arrays(path: Path) -> list[torch.Tensor]:
    with np.load(path) as f:
        return [torch.from_numpy(f[k]) for k in f.files]


def _batches(xs: list[torch.Tensor], size: int) -> list[tuple[torch.Tensor, ...]]:
    return [tuple(x[i : i + size] for x in xs) for i in range(0, len(xs[0]), size)]


def _counts(model: nn.Module) -> dict[str, int]:
    """Enabled ModelOpt quantizers, of all it inserted."""
    from modelopt.torch.quantization.nn import TensorQuantizer

    qs = [m for m in model.modules() if isinstance(m, TensorQuantizer)]
    return {"enabled": sum(1 for q in qs if q.is_enabled), "inserted": len(qs)}


def _outputs(model: nn.Module, batches: list[tuple[torch.Tensor, ...]], path: Path) -> None:
    parts = []
    with torch.no_grad():
        for b in batches:
            parts.append([t.float() for t in model(*b)])
    np.savez(
        path, **{f"out{i}": torch.cat(p).numpy() for i, p in enumerate(zip(*parts, strict=True))}
    )


def _export(model: nn.Module, example: tuple[torch.Tensor, ...], names: list[str],
            path: Path) -> dict[str, Any]:  # fmt: skip
    """ModelOpt's ONNX export of the quantized model, inputs renamed to ``names``."""
    import onnx
    from modelopt.torch._deploy.utils import get_onnx_bytes_and_metadata
    from modelopt.torch._deploy.utils.torch_onnx import DEFAULT_ONNX_OPSET, OnnxBytes

    with torch.no_grad():
        n_out = len(model(*example))
    # ModelOpt names the inputs by forward's parameters (``*xs``: xs.0, xs.1, ...) and the
    # outputs by the flattened output (``out.0``, ...)
    axes = {f"xs.{i}": {0: "batch"} for i in range(len(names))}
    axes.update({f"out.{i}": {0: "batch"} for i in range(n_out)})
    chatter = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(chatter):
        warnings.simplefilter("ignore")
        blob, meta = get_onnx_bytes_and_metadata(model, example, dynamic_axes=axes)
    folder = path.parent / "modelopt-export"
    with contextlib.redirect_stdout(chatter):
        OnnxBytes.from_bytes(blob).write_to_disk(str(folder), clean_dir=True)
    proto = onnx.load(str(next(folder.glob("*.onnx"))))
    renames = dict(zip(meta["input_onnx_names"], names, strict=False))
    for value in proto.graph.input:
        value.name = renames.get(value.name, value.name)
    for node in proto.graph.node:
        node.input[:] = [renames.get(x, x) for x in node.input]
    onnx.save(proto, str(path))
    return {"opset": DEFAULT_ONNX_OPSET, "inputs": list(renames.values()),
            "outputs": list(meta["output_onnx_names"])}  # fmt: skip


def run(job: dict[str, Any], work: Path) -> dict[str, Any]:
    """The three steps on one row; the result (an ``error`` key when a step failed)."""
    sys.path.insert(0, job["src"])
    sys.path.insert(0, job["benchmarks"])
    import modelopt.torch.quantization as mtq

    from fp8_models import ROWS, build
    from time_to_result_models import _Flat

    meta = json.loads((work / "meta.json").read_text(encoding="utf-8"))
    calib = _batches(_arrays(work / "calib.npz"), job["batch"])
    evals = _batches(_arrays(work / "eval.npz"), job["batch"])
    result: dict[str, Any] = {}
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            model = _Flat(build(ROWS[job["row"]]), meta["keys"]).eval()
    except Exception as err:
        traceback.print_exc()
        return {"error": f"the float model did not build here: {_short(err)}"}

    def forward_loop(m: nn.Module) -> None:
        with torch.no_grad():
            for b in calib:
                m(*b)

    start = time.perf_counter()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            mtq.quantize(model, mtq.FP8_DEFAULT_CFG, forward_loop)
    except Exception as err:
        traceback.print_exc()
        return {"error": f"mtq.quantize: {_short(err)}"}
    result["quantize_s"] = round(time.perf_counter() - start, 2)
    result["quantizers"] = _counts(model)
    start = time.perf_counter()
    _outputs(model, evals, work / "modelopt-torch-outputs.npz")
    result["torch_eval_s"] = round(time.perf_counter() - start, 2)
    start = time.perf_counter()
    try:
        example = tuple(x[:2] for x in calib[0])
        result["export"] = _export(model, example, meta["inputs"], work / "modelopt-fp8.onnx")
        result["export_s"] = round(time.perf_counter() - start, 2)
    except Exception as err:
        traceback.print_exc()
        result["export_error"] = _short(err)
    return result


def main(job_path: str) -> int:
    job = json.loads(Path(job_path).read_text(encoding="utf-8"))
    work = Path(job_path).parent
    import modelopt

    torch.manual_seed(0)
    result = run(job, work)
    result["versions"] = {"modelopt": modelopt.__version__, "torch": torch.__version__}
    (work / "peers.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
