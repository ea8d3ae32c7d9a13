"""``export_onnx``: a calibrated prepared model → TensorRT-ready Q/DQ ONNX + manifest JSON.

Flow: check the model (prepared, calibrated, finite amax) → attach float32 scales (floored, with a
warning listing dead channels) and int8 zero points to every quantizer → run torch's dynamo or
TorchScript exporter with quantizers emitting ``QuantizeLinear``/``DequantizeLinear`` → post-process
(drop Identity on constants, one DequantizeLinear per consumer, module-path node names) → validate
(``onnx.checker``, strict shape inference, every planned weighted op really reads DQ'd inputs) →
write the ONNX and its manifest atomically.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from qdq._io import atomic_write_bytes, atomic_write_text
from qdq.api import plan_of, quantizers_of
from qdq.quant import MIN_AMAX, Quantizer, QuantMode, scale_from_amax
from qdq.quant.onnx_qdq import export_mode
from qdq.quant.primitives import check_amax_values

__all__ = ["EXPORTERS", "ExportError", "ExportResult", "export_onnx"]

_log = logging.getLogger("qdq.export")
EXPORTERS = ("auto", "dynamo", "torchscript")
MIN_OPSET, MAX_OPSET = 13, 21


class ExportError(RuntimeError):
    """The exported graph failed validation (checker, shape inference or Q/DQ structure)."""


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_onnx` wrote and measured."""

    path: Path
    manifest_path: Path
    exporter: str
    opset: int
    seconds: float
    num_quantize: int
    num_dequantize: int
    floored: dict[str, list[int]] = field(default_factory=dict)


def export_onnx(
    prepared: nn.Module,
    example_inputs: Sequence[Any],
    path: str | Path,
    *,
    opset: int = 17,
    dynamic_batch: bool = True,
    exporter: str = "auto",
    fp16: bool = False,
    overwrite: bool = False,
) -> ExportResult:
    """Export a calibrated model from :func:`qdq.prepare` to Q/DQ ONNX (and ``*.manifest.json``).

    Args:
        prepared: a prepared and calibrated model.
        example_inputs: a tuple of inputs for tracing.
        path: where to write the ``.onnx`` file.
        opset: ONNX opset, 13..21.
        dynamic_batch: make dimension 0 of every input and output dynamic.
        exporter: ``"dynamo"`` (torch.export based, the default in torch >= 2.9), ``"torchscript"``
            or ``"auto"`` (dynamo, falling back to TorchScript with a warning).
        fp16: write everything outside Q/DQ in float16 (TensorRT 11 strongly typed builds take
            precision from the ONNX). Inputs and outputs stay float32 behind Casts. Below opset 19
            QuantizeLinear needs float32, so Q/DQ keep float32 scales with Casts around them; from
            opset 19 the scales themselves are float16 (rounded from the float32 scale).
        overwrite: replace an existing file.

    Raises:
        ValueError: unsupported opset or exporter, uncalibrated or non-finite amax.
        FileExistsError: ``path`` exists and ``overwrite`` is false.
        ExportError: the exported graph fails validation.

    Example:
        >>> import qdq, torch
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3))
        >>> m = qdq.prepare(net, (torch.randn(1, 3, 8, 8),))
        >>> _ = qdq.calibrate(m, [torch.randn(2, 3, 8, 8)], show_progress=False)
        >>> import tempfile, os
        >>> out = qdq.export_onnx(m, (torch.randn(1, 3, 8, 8),), os.path.join(tempfile.mkdtemp(), "m.onnx"))
        >>> out.num_quantize, out.num_dequantize
        (2, 2)
    """
    from qdq.export.manifest import build_manifest
    from qdq.export.postprocess import postprocess
    from qdq.export.validate import validate_export

    plan = plan_of(prepared)
    if isinstance(opset, bool) or not isinstance(opset, int) or not MIN_OPSET <= opset <= MAX_OPSET:
        raise ValueError(f"opset must be an int in {MIN_OPSET}..{MAX_OPSET}, got {opset!r}")
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter must be one of {EXPORTERS}, got {exporter!r}")
    if not isinstance(example_inputs, (tuple, list)):
        raise TypeError("example_inputs must be a tuple of inputs; wrap a single tensor as (x,)")
    target = Path(path)
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} exists; pass overwrite=True to replace it")
    quantizers = quantizers_of(prepared)
    floored = _check_quantizers(quantizers)
    export_model, export_args = prepared, tuple(example_inputs)
    if fp16:
        export_model, export_args = _half_copy(prepared, export_args)
    export_quantizers = quantizers_of(export_model)
    start = time.perf_counter()
    order = ("dynamo", "torchscript") if exporter == "auto" else (exporter,)
    model_proto = None
    call_order: list[str] | None = None
    used = order[0]
    errors: list[str] = []
    for candidate in order:
        try:
            symbolic_opset = max(opset, 18) if candidate == "dynamo" else opset
            scale_dtype = torch.float16 if fp16 and opset >= 19 else torch.float32
            with _export_state(export_model, export_quantizers, symbolic_opset, scale_dtype):
                model_proto, call_order = _run_exporter(
                    export_model, export_args, candidate, opset, dynamic_batch
                )
            used = candidate
            break
        except Exception as err:  # the exporters raise many types; report them all
            if exporter != "auto":
                raise
            errors.append(f"{candidate}: {type(err).__name__}: {err}")
            warnings.warn(
                f"{candidate} export failed ({err}); trying the next exporter", stacklevel=2
            )
    if model_proto is None:
        raise ExportError("every exporter failed:\n" + "\n".join(errors))
    model_proto = postprocess(model_proto, call_order)
    if fp16:
        from qdq.export.postprocess import float32_io

        float32_io(model_proto)
    counts = validate_export(model_proto, plan)
    seconds = time.perf_counter() - start
    manifest = build_manifest(plan, quantizers, model_proto, exporter=used, opset=opset)
    atomic_write_bytes(target, model_proto.SerializeToString(), overwrite=True)
    manifest_path = target.with_suffix(".manifest.json")
    atomic_write_text(manifest_path, manifest, overwrite=True)
    _log.info("exported %s with %s (opset %d) in %.2f s", target, used, opset, seconds)
    return ExportResult(target, manifest_path, used, opset, seconds, counts[0], counts[1], floored)


def _check_quantizers(quantizers: dict[str, Quantizer]) -> dict[str, list[int]]:
    """Every quantizer calibrated, finite, exportable; return the channels whose scale is floored."""
    missing = [
        n for n, q in quantizers.items() if q.mode is QuantMode.QUANTIZE and not q.is_calibrated
    ]
    if missing:
        raise ValueError(
            f"cannot export before calibration: {len(missing)} quantizers have no amax "
            f"(first: {missing[:5]}); run qdq.calibrate first"
        )
    floored: dict[str, list[int]] = {}
    for name, q in quantizers.items():
        if q.mode is not QuantMode.QUANTIZE:
            continue
        check_amax_values(q.amax, what=f"quantizer {name!r} amax")
        if q.spec.num_bits != 8:
            raise ValueError(
                f"quantizer {name!r} uses {q.spec.num_bits} bits; ONNX INT8 Q/DQ needs 8"
            )
        dead = (q.amax.detach().flatten() <= MIN_AMAX).nonzero().flatten().tolist()
        if dead:
            floored[name] = dead
    if floored:
        listing = "; ".join(f"{n}: channels {c[:10]}" for n, c in floored.items())
        warnings.warn(
            f"amax <= 2**-24 floored to a positive scale (TensorRT rejects non-positive scales): "
            f"{listing}",
            stacklevel=3,
        )
    return floored


def _half_copy(prepared: nn.Module, args: tuple[Any, ...]) -> tuple[nn.Module, tuple[Any, ...]]:
    """A float16 copy of the model whose quantizers keep their float32 amax."""
    half = copy.deepcopy(prepared).half()
    for name, q in quantizers_of(half).items():
        original = prepared.get_submodule(name)
        assert isinstance(original, Quantizer)
        q.amax = original.amax.detach().clone()
    cast = tuple(
        a.half() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args
    )
    return half, cast


@contextlib.contextmanager
def _export_state(
    model: nn.Module, quantizers: dict[str, Quantizer], opset: int, scale_dtype: torch.dtype
) -> Iterator[None]:
    """Attach export scales/zero points, eval mode, no grad; undo everything afterwards."""
    was_training = model.training
    try:
        for q in quantizers.values():
            scale = scale_from_amax(q.amax).detach().clone().to(scale_dtype)
            q.register_buffer("export_scale", scale)
            q.register_buffer(
                "export_zero_point", torch.zeros(scale.shape, dtype=torch.int8, device=scale.device)
            )
            q.export_opset = opset
        model.eval()
        with torch.no_grad():
            yield
    finally:
        for q in quantizers.values():
            for buf in ("export_scale", "export_zero_point"):
                if buf in q._buffers:
                    del q._buffers[buf]
        model.train(was_training)


def _run_exporter(
    model: nn.Module, args: tuple[Any, ...], exporter: str, opset: int, dynamic_batch: bool
) -> tuple[Any, list[str] | None]:
    """Run one exporter; return the ONNX model and (TorchScript) the quantizer call order."""
    import onnx

    tensor_args = [a for a in args if isinstance(a, torch.Tensor)]
    input_names = [f"input{i}" if i else "input" for i in range(len(tensor_args))]
    with export_mode(exporter), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        if exporter == "dynamo":
            dyn = None
            if dynamic_batch:
                batch = torch.export.Dim("batch")
                dyn = tuple({0: batch} if isinstance(a, torch.Tensor) else None for a in args)
            program = torch.onnx.export(
                model, args, dynamo=True, opset_version=max(opset, 18), dynamic_shapes=dyn,
                input_names=input_names, verbose=False,
            )  # fmt: skip
            if program is None:
                raise ExportError("torch.onnx.export(dynamo=True) returned no program")
            proto = program.model_proto
            if opset < 18:
                from qdq.export.opset import downgrade

                proto = downgrade(proto, opset)
            return proto, None
        axes = {n: {0: "batch"} for n in input_names} if dynamic_batch else None
        if axes is not None:
            axes["output"] = {0: "batch"}
        order: list[str] = []
        hooks = [
            q.register_forward_pre_hook(lambda m, a, path=path: order.append(path))
            for path, q in quantizers_of(model).items()
        ]
        try:
            with tempfile.TemporaryDirectory(prefix="qdq-export-") as tmp:
                out = Path(tmp) / "model.onnx"
                torch.onnx.export(
                    model, args, out, dynamo=False, opset_version=opset, input_names=input_names,
                    output_names=["output"], dynamic_axes=axes, do_constant_folding=True,
                )  # fmt: skip
                return onnx.load(str(out)), order
        finally:
            for h in hooks:
                h.remove()
