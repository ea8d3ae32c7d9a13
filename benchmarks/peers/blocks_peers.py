"""ModelOpt's block formats for ``benchmarks/blocks.py``; runs in the peer virtual environment.

ModelOpt pins other onnx/onnxruntime versions than qdq, so it never shares qdq's environment
(``benchmarks/README.md``, "accuracy.py" and "fp8.py": the same ``/tmp/peers``). The driver writes
``job.json`` next to the row's files (``calib.npz``, ``eval.npz``, ``meta.json``: the samples
``qdq quantize`` calibrates and evaluates on) and calls, once per format,
``/tmp/peers/bin/python benchmarks/peers/blocks_peers.py JOB.json``. The job names the row
(``benchmarks/fp8_models.py``), qdq's ``src`` (the zoo registry only), the batch and the format:

* ``nvfp4``: ``mtq.NVFP4_DEFAULT_CFG`` (E2M1 weights and inputs of every Linear/Conv, blocks of
  16, E4M3 block scales under a per-tensor FP32 scale; ``max`` calibration of that scale);
* ``mxfp8``: ``mtq.MXFP8_DEFAULT_CFG`` (E4M3 values, blocks of 32, E8M0 scales; nothing
  calibrated);
* ``int4``: ``mtq.INT4_BLOCKWISE_WEIGHT_ONLY_CFG`` (INT4 weights, blocks of 128, ``max``);
* ``int4_awq``: ``mtq.INT4_AWQ_CFG`` (the same weights, ``awq_lite`` scale search).

Steps, each timed, as ``fp8_peers.py`` (whose helpers this imports):

1. ``cpu_as_is``: the config on a small ``nn.Linear`` on this CPU with ModelOpt as shipped.
   ModelOpt 0.47's NVFP4 and MXFP8 fake quantization is CUDA only (NVFP4: ``amax must be a CUDA
   tensor for dynamic block quantization``; MXFP8: its ``cuda_ext_mx`` extension). When it fails,
   the error is recorded and ``stand_in`` replaces the one CUDA call,
   ``tensor_quant.dynamic_block_quantize_op``, on CPU tensors by ModelOpt's own CPU code for the
   same numbers: ``NVFP4QTensor.quantize``/``dequantize`` with the per-tensor scale
   ``amax / (6 * 448)`` its kernel uses, ``MXFP8QTensor.quantize``/``dequantize`` (the classes its
   ONNX exporter packs weights with). Everything else (config, calibration, quantizer placement,
   the export) is ModelOpt's. Against qdq's exact reference (``qdq.quant.blocks``) on random
   tensors: MXFP8 equal bit for bit; NVFP4 the same E2M1 codes wherever the E4M3 block scale is
   normal, different only in blocks whose scale is subnormal or underflows (the class clamps it to
   2^-9; ModelOpt's Triton kernel maps a decoded scale below 1e-5 to 1.0).
   The result says ``kernel: "modelopt"`` or ``"cpu stand-in"``;
2. ``mtq.quantize(model, CFG, forward_loop)`` over the calibration batches; the fake-quantized
   model in torch on the evaluation samples (``modelopt-FMT-torch-outputs.npz``);
3. ModelOpt's ONNX export (``fp8_peers._export``: ``get_onnx_bytes_and_metadata``, TorchScript,
   opset 20, its NVFP4/MXFP8/INT4 exporters post-processing the graph) as
   ``modelopt-FMT.onnx``, with the ONNX ops it wrote counted (``trt::TRT_FP4DynamicQuantize`` ...)
   and its initializers' data types. When the export as configured fails, the error is recorded
   and the layers its exporter cannot take are left float (their quantizers disabled), the
   torch figure of that model saved as ``modelopt-FMT-exportable-torch-outputs.npz``, and the
   export tried again: block-quantized convolutions (TorchScript: "convolution for kernel of
   unknown shape"; INT4: "Expected MatMul or Gemm node") and, for the 4-bit formats, weights with
   an odd row count (its 4-bit packing asserts ``shape[0]`` even; the 3-label classifiers).

``peers-FMT.json`` holds the files, seconds, quantizer counts, errors, ops and versions (a failure
is a result: the driver prints it as the row's cell).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import sys
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fp8_peers import _arrays, _batches, _counts, _export, _outputs, _short

CONFIGS = {"nvfp4": "NVFP4_DEFAULT_CFG", "mxfp8": "MXFP8_DEFAULT_CFG",
           "int4": "INT4_BLOCKWISE_WEIGHT_ONLY_CFG", "int4_awq": "INT4_AWQ_CFG"}  # fmt: skip
#: formats whose weights ModelOpt packs two to a byte along the first axis
FOUR_BIT = ("nvfp4", "int4", "int4_awq")


# ------------------------------------------------------------------------------ the CPU stand-in
def _stand_in_values(x: torch.Tensor, block_size: int, amax: torch.Tensor | None,
                     fmt: tuple[int, int], scale: tuple[int, int]) -> torch.Tensor:  # fmt: skip
    """ModelOpt's own CPU quantize/dequantize of ``x`` (float32) along its last axis, padded to
    whole blocks and cropped back, as its kernel pads."""
    from modelopt.torch.quantization.qtensor import MXFP8QTensor, NVFP4QTensor
    from modelopt.torch.quantization.utils import reduce_block_padding

    n = x.shape[-1]
    padded = reduce_block_padding(x, block_sizes={-1: block_size})
    if fmt == (2, 1) and scale == (4, 3):
        gs = None if amax is None else amax.float().amax() / (6.0 * 448.0)
        q, s, s2 = NVFP4QTensor.quantize(padded, block_size, weights_scaling_factor_2=gs)
        y = q.dequantize(dtype=torch.float32, scale=s, double_scale=s2,
                         block_sizes={-1: block_size})  # fmt: skip
    elif fmt == (4, 3) and scale == (8, 0) and block_size == MXFP8QTensor.BLOCK_SIZE:
        q, s = MXFP8QTensor.quantize(padded)
        y = q.dequantize(dtype=torch.float32, scale=s)
    else:
        raise NotImplementedError(f"no CPU stand-in for {fmt} values, {scale} scales, "
                                  f"block {block_size}")  # fmt: skip
    return y.reshape(padded.shape)[..., :n]


def stand_in() -> None:
    """Route ModelOpt's dynamic block quantization of CPU tensors to ``_stand_in_values`` (CUDA
    tensors keep its kernel). The tracer is paused inside: at export the op's ONNX form is its
    ``symbolic``, as with its kernel."""
    import modelopt.torch.quantization.tensor_quant as tq

    kernel = tq.dynamic_block_quantize_op

    def op(inputs: torch.Tensor, block_size: int, amax: torch.Tensor | None, num_bits: int,
           exponent_bits: int, scale_num_bits: int, scale_exponent_bits: int) -> torch.Tensor:  # fmt: skip
        if inputs.is_cuda:
            return kernel(inputs, block_size, amax, num_bits, exponent_bits, scale_num_bits,
                          scale_exponent_bits)  # fmt: skip
        fmt = (exponent_bits, num_bits - exponent_bits - 1)
        scale = (scale_exponent_bits, scale_num_bits - scale_exponent_bits - 1)
        state = torch._C._get_tracing_state()
        torch._C._set_tracing_state(None)
        try:
            y = _stand_in_values(inputs.float(), block_size, amax, fmt, scale)
        finally:
            torch._C._set_tracing_state(state)
        return y.to(inputs.dtype)

    tq.dynamic_block_quantize_op = op


def cpu_as_is(cfg: dict[str, Any]) -> str | None:
    """The config on a small Linear with ModelOpt as shipped, on this CPU: None, or the error."""
    import modelopt.torch.quantization as mtq

    torch.manual_seed(0)
    tiny, x = nn.Sequential(nn.Linear(256, 256)), torch.randn(4, 256)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            mtq.quantize(tiny, copy.deepcopy(cfg), lambda m: m(x))
            with torch.no_grad():
                tiny(x)
    except Exception as err:
        return _short(err)
    return None


# ------------------------------------------------------------------------------------ export
def unexportable(model: nn.Module, fmt: str) -> dict[str, str]:
    """The layers ModelOpt's exporter cannot take in ``fmt``: name -> why."""
    out: dict[str, str] = {}
    for name, m in model.named_modules():
        wq = getattr(m, "weight_quantizer", None)
        iq = getattr(m, "input_quantizer", None)
        if not any(q is not None and q.is_enabled for q in (wq, iq)):
            continue
        if isinstance(m, nn.modules.conv._ConvNd):
            out[name] = "block-quantized convolution"
        elif (fmt in FOUR_BIT and wq is not None and wq.is_enabled
              and getattr(m, "weight", None) is not None and m.weight.shape[0] % 2):  # fmt: skip
            out[name] = f"4-bit weight with {m.weight.shape[0]} rows (odd)"
    return out


def leave_float(model: nn.Module, names: dict[str, str]) -> None:
    """Disable every quantizer of the named layers."""
    for name, m in model.named_modules():
        if name in names:
            for attr in ("input_quantizer", "weight_quantizer", "output_quantizer"):
                q = getattr(m, attr, None)
                if q is not None:
                    q.disable()


def onnx_facts(path: Path) -> dict[str, Any]:
    """The ops (``domain::op`` counts) and initializer data types of an ONNX."""
    import onnx

    model = onnx.load(str(path))
    ops = Counter(f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in model.graph.node)
    dtypes = Counter(onnx.TensorProto.DataType.Name(t.data_type) for t in model.graph.initializer)
    return {"ops": dict(sorted(ops.items())), "initializer_dtypes": dict(sorted(dtypes.items())),
            "opsets": {o.domain or "ai.onnx": o.version for o in model.opset_import}}  # fmt: skip


def export(model: nn.Module, example: tuple[torch.Tensor, ...], names: list[str],
           path: Path) -> dict[str, Any]:  # fmt: skip
    """``fp8_peers._export`` timed, with the ONNX's facts; ``error`` when it fails."""
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            facts = _export(model, example, names, path)
    except Exception as err:
        traceback.print_exc()
        return {"error": _short(err), "export_s": round(time.perf_counter() - start, 2)}
    return {**facts, **onnx_facts(path), "export_s": round(time.perf_counter() - start, 2)}


# --------------------------------------------------------------------------------------- steps
def run(job: dict[str, Any], work: Path) -> dict[str, Any]:
    """The steps on one row and format; the result (an ``error`` key when a step failed)."""
    sys.path.insert(0, job["src"])
    sys.path.insert(0, job["benchmarks"])
    import modelopt.torch.quantization as mtq

    from fp8_models import ROWS, build
    from time_to_result_models import _Flat

    fmt = job["format"]
    if fmt not in CONFIGS or not hasattr(mtq, CONFIGS[fmt]):
        return {"error": f"no ModelOpt config for {fmt!r} here (known: {', '.join(CONFIGS)})"}
    cfg = getattr(mtq, CONFIGS[fmt])
    result: dict[str, Any] = {"format": fmt, "config": f"mtq.{CONFIGS[fmt]}"}
    result["cpu_as_is_error"] = cpu_as_is(cfg)
    result["kernel"] = "modelopt"
    if result["cpu_as_is_error"] is not None:
        stand_in()
        result["kernel"] = "cpu stand-in"
        still = cpu_as_is(cfg)
        if still is not None:
            return {**result, "error": f"the CPU stand-in fails too: {still}"}

    meta = json.loads((work / "meta.json").read_text(encoding="utf-8"))
    calib = _batches(_arrays(work / "calib.npz"), job["batch"])
    evals = _batches(_arrays(work / "eval.npz"), job["batch"])
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            model = _Flat(build(ROWS[job["row"]]), meta["keys"]).eval()
    except Exception as err:
        traceback.print_exc()
        return {**result, "error": f"the float model did not build here: {_short(err)}"}

    def forward_loop(m: nn.Module) -> None:
        with torch.no_grad():
            for b in calib:
                m(*b)

    start = time.perf_counter()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            mtq.quantize(model, copy.deepcopy(cfg), forward_loop)
    except Exception as err:
        traceback.print_exc()
        return {**result, "error": f"mtq.quantize: {_short(err)}"}
    result["quantize_s"] = round(time.perf_counter() - start, 2)
    result["quantizers"] = _counts(model)
    start = time.perf_counter()
    _outputs(model, evals, work / f"modelopt-{fmt}-torch-outputs.npz")
    result["torch_eval_s"] = round(time.perf_counter() - start, 2)

    example, onnx = tuple(x[:2] for x in calib[0]), work / f"modelopt-{fmt}.onnx"
    result["export"] = export(model, example, meta["inputs"], onnx)
    if "error" in result["export"]:
        skip = unexportable(model, fmt)
        result["export_float_layers"] = skip
        if skip:
            leave_float(model, skip)
            result["quantizers_exported"] = _counts(model)
            _outputs(model, evals, work / f"modelopt-{fmt}-exportable-torch-outputs.npz")
            result["export_retry"] = export(model, example, meta["inputs"], onnx)
    return result


def main(job_path: str) -> int:
    job = json.loads(Path(job_path).read_text(encoding="utf-8"))
    work = Path(job_path).parent
    import modelopt

    torch.manual_seed(0)
    result = run(job, work)
    result["versions"] = {"modelopt": modelopt.__version__, "torch": torch.__version__}
    out = work / f"peers-{job['format']}.json"
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
