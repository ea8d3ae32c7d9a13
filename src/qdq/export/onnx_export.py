"""``export_onnx``: a calibrated prepared model → TensorRT-ready Q/DQ ONNX + manifest JSON.

Flow: check the model (prepared, calibrated, finite amax) → attach float32 scales (floored, with a
warning listing dead channels) and int8 zero points to every quantizer → run torch's dynamo or
TorchScript exporter with quantizers emitting ``QuantizeLinear``/``DequantizeLinear``, on the path
the model takes in eager mode (:mod:`qdq.export.attempts`, :mod:`qdq.export.paths`) → post-process
(drop Identity on constants, one DequantizeLinear per consumer, module-path node names) → validate
(``onnx.checker``, strict shape inference, every planned weighted op really reads DQ'd inputs) →
check the numbers in ONNX Runtime against torch (:mod:`qdq.export.verify`) → write the ONNX and its
manifest (with the ONNX's SHA-256) as one unit: both or neither. A model past protobuf's 2 GB
limit is written with its weights in an external-data file beside the ONNX
(:mod:`qdq.export.external`), part of the same unit.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import logging
import time
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

from qdq._io import atomic_move_files, atomic_write_files
from qdq.api import plan_of, quantizers_of
from qdq.export.attempts import describe_paths, run_exporters
from qdq.export.blocks_trt import check_block_form
from qdq.export.errors import ExportError, ExportRefusedError
from qdq.export.external import sha256_of_file, sidecar_for
from qdq.export.paths import count_calls
from qdq.ptq.search import recipe_of
from qdq.qat.distill import has_distill_hooks
from qdq.qat.prepare import qat_state
from qdq.quant import MIN_AMAX, Quantizer, QuantMode
from qdq.quant.primitives import check_amax_values

__all__ = ["EXPORTERS", "ExportError", "ExportRefusedError", "ExportResult", "export_onnx"]

_log = logging.getLogger("qdq.export")
EXPORTERS = ("auto", "dynamo", "torchscript")
MIN_OPSET, MAX_OPSET = 13, 21
#: the opset an export gets by default, and the first that has FP8 (float8e4m3fn) Q/DQ
DEFAULT_OPSET, FP8_MIN_OPSET = 17, 19


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
    external_data: Path | None = None  # the weights file beside ``path`` (models past 2 GB)
    #: the dynamic dimensions besides the batch (``dynamic_dims``), ``{input index: {dim: name}}``
    dynamic_dims: dict[int, dict[int, str]] = field(default_factory=dict)
    #: MXFP8's form in a graph with block-format quantizers (``"onnx"``/``"trt"``), else ``None``
    block_form: str | None = None


def export_onnx(
    prepared: nn.Module,
    example_inputs: Sequence[Any],
    path: str | Path,
    *,
    opset: int | None = None,
    dynamic_batch: bool = True,
    exporter: str = "auto",
    fp16: bool = False,
    overwrite: bool = False,
    verify: bool | None = None,
    check_inputs: Iterable[Any] | None = None,
    allow_specialization: bool = False,
    manifest_path: str | Path | None = None,
    dynamic_dims: Mapping[int, Mapping[int, str]] | None = None,
    block_form: str = "onnx",
) -> ExportResult:
    """Export a calibrated model from :func:`qdq.prepare` to Q/DQ ONNX and its manifest.

    The ONNX file and its manifest (``path`` + ``.manifest.json``, e.g. ``m.onnx.manifest.json``;
    it records the SHA-256 of the ONNX bytes) are one unit: both are written to temporaries, checked,
    then moved into place together; on any error neither is written and an existing pair is left
    as it was. A model past protobuf's 2 GB limit (:data:`qdq.export.external.EXTERNAL_DATA_THRESHOLD`)
    keeps its weights in ``path`` + ``.data`` (e.g. ``m.onnx.data``, named in the ONNX by that
    relative location; move the two together), written in the same unit; the manifest then also
    records that file's SHA-256 (``"onnx": {..., "external_data": {"file", "sha256"}}``).

    Args:
        prepared: a prepared and calibrated model.
        example_inputs: a tuple of inputs for tracing.
        path: where to write the ``.onnx`` file.
        opset: ONNX opset, 13..21; default 17, or 19 when a quantizer is FP8 (``float8e4m3fn``
            Q/DQ exist from opset 19; an explicit lower opset is refused, naming the quantizer).
            A graph with block-format quantizers is written at the first opset whose
            ``DequantizeLinear`` takes their types: 21 (INT4), 23 (NVFP4), 24 (MXFP8; 19 with
            ``block_form="trt"``); another explicit opset is refused.
        dynamic_batch: make dimension 0 of every input and output dynamic.
        exporter: ``"dynamo"`` (torch.export based, the default in torch >= 2.9), ``"torchscript"``
            or ``"auto"`` (dynamo, falling back to TorchScript with a warning).
        fp16: write everything outside Q/DQ in float16 (TensorRT 11 strongly typed builds take
            precision from the ONNX). Inputs and outputs stay float32 behind Casts. Below opset 19
            QuantizeLinear needs float32, so Q/DQ keep float32 scales with Casts around them; from
            opset 19 the scales themselves are float16 (rounded from the float32 scale).
        overwrite: replace an existing ONNX file, manifest or external-data file ``path.data``
            (without it, any of them existing refuses). An old ``path.data`` is removed when the
            new export needs none.
        verify: run the exported graph in ONNX Runtime (``ORT_ENABLE_BASIC``) on
            ``example_inputs`` and ``check_inputs`` and compare every output with the torch
            fake-quant model before writing (see :mod:`qdq.export.verify` for the tolerance: the
            ORT–torch distance must stay below the error quantization itself makes). Default: on
            when onnxruntime is installed.
        check_inputs: more batches for ``verify`` (each a tensor or a tuple of inputs shaped
            like ``example_inputs``; with ``dynamic_batch=False`` of the same batch size). Use
            inputs that take other paths through the model than the example does.
        allow_specialization: write the file even though the TorchScript tracer warned that it
            turned tensor values into Python constants (``if x.mean() > 0:`` in ``forward``):
            the graph then always takes the branch the example input took.
        manifest_path: where to write the manifest (default ``path`` + ``.manifest.json``). It
            must lie in the same directory as ``path``; the manifest records the ONNX file's name,
            and :func:`~qdq.export.manifest.find_manifest` finds a ``manifest.json`` beside an
            ONNX file it names (``qdq quantize`` writes ``model.qdq.onnx`` + ``manifest.json``).
        dynamic_dims: dimensions besides the batch to export as dynamic, ``{tensor input index:
            {dimension: name}}``; inputs that name the same dimension share its size. Token ids
            and their mask: ``{0: {1: "sequence"}, 1: {1: "sequence"}}``. The example's size
            there must be at least 2 (torch.export fixes a size of 1); verify with
            ``check_inputs`` of another size.
        block_form: the form of MXFP8 block quantizers (:mod:`qdq.export.blocks_trt`):
            ``"onnx"`` (default) ONNX's ``DequantizeLinear`` of ``FLOAT8E8M0`` scales, opset 24,
            which TensorRT 11's parser reads; ``"trt"`` TensorRT's
            ``trt::TRT_MXFP8DequantizeLinear`` of ``UINT8`` exponents (TensorRT Model
            Optimizer's form), no opset-24 type: the graph stays at the opset its other tensors
            need (19; 23 with NVFP4, 21 with INT4), which TensorRT 10.12+ reads. The same codes
            bit for bit; NVFP4, INT4, INT8 and FP8 are written alike in both. The manifest and
            :attr:`ExportResult.block_form` record it for a graph with block quantizers.

    Raises:
        ValueError: unsupported opset, exporter or ``block_form``, uncalibrated or non-finite
            amax, an amax whose shape does not match its quantizer or tensor.
        FileExistsError: ``path`` or its manifest exists and ``overwrite`` is false.
        ExportError: the exported graph fails validation, was specialized on tensor values, or
            computes something else than torch (naming the first diverging output).
        ExportRefusedError: the model turns tensor values into Python values while it is
            exported (``if x.mean() > 0:``): the exporter would bake in the example's branch
            (TorchScript) or cannot capture it (dynamo). A model whose eager forward reads tensor
            values but whose exported path does not (torchvision's tracing branches) exports.

    Example:
        >>> import qdq, torch
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3))
        >>> m = qdq.prepare(net, (torch.randn(1, 3, 8, 8),))
        >>> _ = qdq.calibrate(m, [torch.randn(2, 3, 8, 8)], show_progress=False)
        >>> import tempfile, os
        >>> out = qdq.export_onnx(m, (torch.randn(1, 3, 8, 8),), os.path.join(tempfile.mkdtemp(), "m.onnx"))
        >>> out.num_quantize, out.num_dequantize, out.manifest_path.name
        (2, 2, 'm.onnx.manifest.json')
    """
    from qdq.export.manifest import build_manifest, manifest_path_for, sha256_of

    plan = plan_of(prepared)
    fp8 = [n for n, q in quantizers_of(prepared).items() if q.spec.format == "fp8"]
    file_opset = _block_opset(prepared, opset, check_block_form(block_form))
    if file_opset is not None:  # the exporters run at the default; expand_blocks raises it
        opset = None
    if opset is None:
        opset = FP8_MIN_OPSET if fp8 else DEFAULT_OPSET
    if isinstance(opset, bool) or not isinstance(opset, int) or not MIN_OPSET <= opset <= MAX_OPSET:
        raise ValueError(f"opset must be an int in {MIN_OPSET}..{MAX_OPSET}, got {opset!r}")
    if fp8 and opset < FP8_MIN_OPSET:
        raise ValueError(
            f"quantizer {fp8[0]!r} (and {len(fp8) - 1} more) is FP8: float8e4m3fn Q/DQ need "
            f"opset >= {FP8_MIN_OPSET}, got opset={opset}; export with opset={FP8_MIN_OPSET}"
        )
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter must be one of {EXPORTERS}, got {exporter!r}")
    if not isinstance(example_inputs, (tuple, list)):
        raise TypeError("example_inputs must be a tuple of inputs; wrap a single tensor as (x,)")
    for flag, value in (("verify", verify), ("allow_specialization", allow_specialization)):
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"{flag} must be a bool, got {value!r}")
    # Tensor-valued control flow seen by the recording: no refusal up front. The exporters are
    # asked instead: the TorchScript tracer refuses when the model turns a traced tensor into a
    # Python value, torch.export cannot guard on data-dependent values. Code that takes another
    # path when exported (torchvision's tracing branches) exports; the ONNX is then verified.
    branchy = bool(plan.control_flow) and not allow_specialization
    do_verify = _resolve_verify(verify)
    checks = [tuple(example_inputs), *_check_batches(check_inputs)]
    target = Path(path)
    manifest_file = manifest_path_for(target) if manifest_path is None else Path(manifest_path)
    if manifest_file.resolve().parent != target.resolve().parent:
        raise ValueError(
            f"manifest_path {manifest_file} must lie in the directory of {target} (the manifest "
            "names the ONNX file beside it)"
        )
    if manifest_file.resolve() == target.resolve():
        raise ValueError(f"manifest_path and path are the same file: {target}")
    if not overwrite:
        for existing in (target, manifest_file, sidecar_for(target)):
            if existing.exists():
                raise FileExistsError(f"{existing} exists; pass overwrite=True to replace it")
    hooked = has_distill_hooks(prepared)
    if hooked:
        raise ValueError(
            f"a qdq.qat.Distiller is still attached to {hooked[:3]}: call its close() (or use it "
            "in a with block) before exporting, so that no training hook is exported"
        )
    dims = _check_dynamic_dims(dynamic_dims, tuple(example_inputs), dynamic_batch)
    quantizers = quantizers_of(prepared)
    floored = _check_quantizers(quantizers)
    reached = _check_forward(prepared, tuple(example_inputs))
    # the exporters trace a CPU model: the ONNX of a CUDA model is the ONNX of its CPU copy (the
    # dynamo exporter traced device copies between CPU scales and CUDA weights and lost Q/DQ)
    export_model, export_args = _on_cpu(prepared, tuple(example_inputs))
    if fp16:
        export_model, export_args = _half_copy(export_model, export_args)
    start = time.perf_counter()
    order = ("dynamo", "torchscript") if exporter == "auto" else (exporter,)
    staging = contextlib.ExitStack()
    with staging:
        model_proto, used, counts, staged = run_exporters(
            export_model, export_args, order, exporter, opset, dynamic_batch, fp16,
            allow_specialization, plan, branchy, staging, target, dims, reached, block_form,
        )  # fmt: skip
        if branchy:
            warnings.warn(
                f"qdq.prepare saw tensor values decide Python control flow in "
                f"{describe_paths(plan.control_flow)}, but the {used} export turned no tensor into a "
                "Python value: that code takes another path when exported (as torchvision's "
                "detection heads do), so the ONNX is not specialized on the example's values. "
                "Verify it on inputs that take other paths (check_inputs)",
                stacklevel=2,
            )
        # a model past 2 GB is verified and hashed from its staged files (external data)
        data = model_proto.SerializeToString() if staged is None else staged.read_bytes()
        if do_verify:
            from qdq.export.verify import verify_numerics

            verify_numerics(
                data if staged is None else staged, export_model, checks,
                to_model=_caster(fp16), fp16=fp16, error=ExportError,
            )  # fmt: skip
        seconds = time.perf_counter() - start
        state = qat_state(prepared)
        sidecar = sidecar_for(staged) if staged is not None else None
        sidecar = sidecar if sidecar is not None and sidecar.exists() else None
        external = (sidecar.name, sha256_of_file(sidecar)) if sidecar is not None else None
        manifest = build_manifest(
            plan, quantizers, model_proto, exporter=used, opset=file_opset or opset,
            onnx_file=target.name, onnx_sha256=sha256_of(data), onnx_external=external,
            qat=state.to_dict() if state is not None else None, ptq=recipe_of(prepared),
            block_form=block_form if file_opset is not None else None,
        ).encode("utf-8")  # fmt: skip
        # the manifest last: it seals the unit (a process killed between two moves leaves no
        # manifest beside a new model); staged under a name that is not its final one
        if staged is None or sidecar is None:
            atomic_write_files(
                {target: data, manifest_file: manifest},
                overwrite=overwrite,
                remove=[sidecar_for(target)],  # an old export's external data
            )
        else:
            staged_manifest = staged.with_name(manifest_file.name + ".partial")
            staged_manifest.write_bytes(manifest)
            atomic_move_files(
                {target: staged, sidecar_for(target): sidecar, manifest_file: staged_manifest},
                overwrite=overwrite,
            )
    opset = file_opset or opset
    _log.info("exported %s with %s (opset %d) in %.2f s", target, used, opset, seconds)
    return ExportResult(
        target, manifest_file, used, opset, seconds, counts[0], counts[1], floored,
        sidecar_for(target) if sidecar is not None else None, dims,
        block_form if file_opset is not None else None,
    )  # fmt: skip


def _block_opset(prepared: nn.Module, opset: object, block_form: str) -> int | None:
    """The opset of a graph with block-format quantizers (21 INT4, 23 NVFP4, 24 MXFP8 or 19 in
    TensorRT's form: the first whose ``DequantizeLinear`` takes their types,
    :mod:`qdq.export.blocks_onnx`), or ``None`` without them.

    Raises:
        ValueError: an explicit ``opset`` other than that one, naming a quantizer.
    """
    from qdq.export.blocks_onnx import required_opset

    blocks = {
        n: q.spec.format
        for n, q in quantizers_of(prepared).items()
        if q.spec.is_block and q.mode is QuantMode.QUANTIZE
    }
    if not blocks:
        return None
    need = required_opset(set(blocks.values()), block_form)[0]
    if opset is not None and opset != need:
        name, fmt = next(iter(blocks.items()))
        raise ValueError(
            f"quantizer {name!r} (and {len(blocks) - 1} more) is {fmt.upper()}: a graph with "
            f"{', '.join(sorted(set(blocks.values())))} quantizers is written at opset {need} "
            f"(the first whose DequantizeLinear takes their types), got opset={opset}; pass "
            f"opset=None or {need}"
        )
    return need


def _check_dynamic_dims(
    dims: Mapping[int, Mapping[int, str]] | None, args: tuple[Any, ...], dynamic_batch: bool
) -> dict[int, dict[int, str]]:
    """``dims`` checked against the example's tensor inputs (see ``export_onnx``)."""
    if dims is None:
        return {}
    if not isinstance(dims, Mapping):
        raise TypeError(f"dynamic_dims must be a dict {{input index: {{dim: name}}}}, got {dims!r}")
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    out: dict[int, dict[int, str]] = {}
    for k, axes in dims.items():
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < len(tensors):
            raise ValueError(
                f"dynamic_dims: {k!r} is not the index of a tensor input (0..{len(tensors) - 1})"
            )
        if not isinstance(axes, Mapping):
            raise TypeError(f"dynamic_dims[{k}] must be a dict {{dim: name}}, got {axes!r}")
        t = tensors[k]
        for d, name in axes.items():
            low = 1 if dynamic_batch else 0
            if isinstance(d, bool) or not isinstance(d, int) or not low <= d < t.dim():
                raise ValueError(
                    f"dynamic_dims[{k}]: {d!r} is not a dimension {low}..{t.dim() - 1} of input "
                    f"{k} (shape {tuple(t.shape)}; dimension 0 is the batch)"
                )
            if not isinstance(name, str) or not name.isidentifier() or name == "batch":
                raise ValueError(f"dynamic_dims[{k}][{d}]: {name!r} is not a name (nor 'batch')")
            if t.shape[d] < 2:
                raise ValueError(
                    f"dynamic_dims[{k}][{d}] ({name}): the example's size there is "
                    f"{t.shape[d]}; give one of at least 2 (torch.export fixes sizes 0 and 1)"
                )
        out[k] = dict(axes)
    return out


def _resolve_verify(verify: bool | None) -> bool:
    """``verify=None`` → on when onnxruntime is importable; ``True`` without it is an error."""
    available = importlib.util.find_spec("onnxruntime") is not None
    if verify is None:
        return available
    if verify and not available:
        raise ImportError("verify=True needs onnxruntime: pip install 'qdq[onnx]'")
    return verify


def _check_batches(check_inputs: Iterable[Any] | None) -> list[tuple[Any, ...]]:
    if check_inputs is None:
        return []
    if isinstance(check_inputs, torch.Tensor):
        raise TypeError("check_inputs must be a list of batches; wrap a single tensor as [x]")
    batches = []
    for i, b in enumerate(check_inputs):
        if isinstance(b, torch.Tensor):
            batches.append((b,))
        elif isinstance(b, (tuple, list)) and all(isinstance(a, torch.Tensor) for a in b):
            batches.append(tuple(b))
        else:
            raise TypeError(
                f"check_inputs[{i}] must be a tensor or a tuple of tensors, got {type(b).__name__}"
            )
    return batches


def _caster(fp16: bool) -> Any:
    """What the verification feeds the exported (CPU) model: CPU tensors, float16 with ``fp16``."""

    def cast(args: tuple[Any, ...]) -> tuple[Any, ...]:
        args = _to_cpu(args)
        if not fp16:
            return args
        return tuple(
            a.half() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args
        )

    return cast


def _to_cpu(args: Any) -> Any:
    """``args`` with every tensor on the CPU (containers kept)."""
    return tree_map(lambda a: a.cpu() if isinstance(a, torch.Tensor) else a, args)


def _on_cpu(prepared: nn.Module, args: tuple[Any, ...]) -> tuple[nn.Module, tuple[Any, ...]]:
    """The model and inputs to trace: as given when all on the CPU, else a CPU copy of the model
    (the user's prepared model stays where it is) and the inputs moved to the CPU."""
    tensors = [*prepared.parameters(), *prepared.buffers()]
    tensors += [a for a in tree_flatten(args)[0] if isinstance(a, torch.Tensor)]
    if all(t.device.type == "cpu" for t in tensors):
        return prepared, args
    return copy.deepcopy(prepared).cpu(), _to_cpu(args)


def _check_forward(prepared: nn.Module, args: tuple[Any, ...]) -> Counter[str]:
    """One torch forward on the example: a per-channel amax that does not fit its tensor (or any
    other shape problem) is reported here, naming the quantizer, before an exporter hides it.
    Returns the planned call sites it reached, which every export trace must reach too
    (:mod:`qdq.export.paths`)."""
    was_training = prepared.training
    prepared.eval()
    try:
        with torch.no_grad(), count_calls(prepared) as reached:
            prepared(*args)
        return reached
    except ValueError as err:
        if "quantizer" in str(err):
            raise ValueError(f"cannot export: {err}") from None
        raise
    finally:
        prepared.train(was_training)


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
        if q.spec.num_bits != 8 and not q.spec.is_block:  # FP8 specs are 8 bits (QuantSpec)
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
        q._assign_amax(original.amax.detach().clone())
    cast = tuple(
        a.half() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args
    )
    return half, cast
