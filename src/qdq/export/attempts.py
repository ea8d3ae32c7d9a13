"""Trying the exporters in turn: each one under the export state (scales and zero points
attached, eval mode, no grad), with weights computed in ``forward`` exported as torch computed
them, on the path qdq recorded (:mod:`qdq.export.paths`), and its ONNX validated; a failure
leaves no trace in the model and falls back to the next exporter."""

from __future__ import annotations

import contextlib
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from qdq.api import quantizers_of
from qdq.export.errors import ExportError, ExportRefusedError
from qdq.export.exporters import run_exporter
from qdq.export.external import Staging, save_external, too_large
from qdq.export.paths import count_calls, path_difference, recorded_path
from qdq.graph.plan import QuantPlan
from qdq.quant import BlockQuantizer, Quantizer, QuantMode, ScaleShapeError, scale_from_amax

__all__ = ["describe_paths", "run_exporters"]


def run_exporters(
    export_model: nn.Module,
    export_args: tuple[Any, ...],
    order: Sequence[str],
    exporter: str,
    opset: int,
    dynamic_batch: bool,
    fp16: bool,
    allow_specialization: bool,
    plan: QuantPlan,
    branchy: bool,
    staging: contextlib.ExitStack,
    target: Path,
    dynamic_dims: dict[int, dict[int, str]],
    eager: Counter[str],
    block_form: str = "onnx",
) -> tuple[Any, str, tuple[int, int], Path | None]:
    """Try the exporters in ``order``; return the first valid ONNX, the exporter, its Q/DQ
    counts and, for a model past 2 GB, its staged path (written with external data in a
    :class:`~qdq.export.external.Staging` directory that ``staging`` removes). ``eager``: the
    planned call sites one eager forward on the example reached (:func:`count_calls`); each
    trace must reach the same ones. ``block_form``: MXFP8's form
    (:func:`qdq.export.blocks_onnx.expand_blocks`)."""
    from qdq.export.blocks_onnx import expand_blocks
    from qdq.export.postprocess import postprocess
    from qdq.export.validate import validate_export

    plan_capture_recorded = plan.capture == "recorded" and not branchy
    errors: list[str] = []
    for candidate in order:
        try:
            symbolic_opset = max(opset, 18) if candidate == "dynamo" else opset
            scale_dtype = torch.float16 if fp16 and opset >= 19 else torch.float32
            first = None  # how the first trace's path differs from the eager one
            for retry in (False, True):  # the second time on the path qdq recorded
                try:
                    with (
                        _clean_failure(export_model),
                        _export_state(
                            export_model, quantizers_of(export_model), symbolic_opset, scale_dtype
                        ),
                        _computed_weights(export_model, export_args),
                        recorded_path() if retry else contextlib.nullcontext(),
                        count_calls(export_model) as traced,
                    ):
                        proto, call_order = run_exporter(
                            export_model, export_args, candidate, opset, dynamic_batch,
                            allow_specialization, recorded=plan_capture_recorded,
                            value_reads=plan.control_flow_sites, dynamic_dims=dynamic_dims,
                        )  # fmt: skip
                except Exception as err:
                    if not retry:
                        raise
                    raise _other_path(candidate, first, f"on its eager path: {err}") from err
                differ = path_difference(eager, traced)
                if differ is None:
                    break
                if retry:
                    raise _other_path(
                        candidate, first, f"and again with is_in_onnx_export() False: {differ}"
                    )
                first = differ
            if first is not None:
                warnings.warn(
                    f"the model branches on torch.onnx.is_in_onnx_export() ({candidate}'s first "
                    f"trace took another path than eager mode: {first}); qdq exported the eager "
                    "path, which it recorded, calibrated and verifies",
                    stacklevel=3,
                )
            # block markers: TensorRT's forms
            proto = expand_blocks(postprocess(proto, call_order), block_form)
            if fp16:
                from qdq.export.postprocess import float32_io

                float32_io(proto)
            staged = None
            if too_large(proto):  # protobuf cannot serialize it: weights to a file beside it
                stage = Staging(target)
                staged = stage.path(target.name)
                try:
                    save_external(proto, staged)
                    counts = validate_export(proto, plan, staged)
                except BaseException:
                    stage.close()  # no 2 GB left behind while the next exporter runs
                    raise
                staging.callback(stage.close)
                return proto, candidate, counts, staged
            # inside the loop: a graph that lost planned Q/DQ (dynamo merges two identical
            # Q/DQ + Conv chains, as in YOLOv10's freshly copied one2one head) falls back too
            counts = validate_export(proto, plan)
            return proto, candidate, counts, None
        except (ExportRefusedError, ScaleShapeError):
            raise  # our own refusals: another exporter would not make them right
        except Exception as err:  # the exporters raise many types; report them all
            refusal = _refusal_inside(err)
            if refusal is not None:
                raise refusal from None
            if branchy and exporter != "auto":
                raise _control_flow_refusal(plan.control_flow, candidate, err) from err
            if exporter != "auto":
                raise
            errors.append(f"{candidate}: {type(err).__name__}: {err}")
            warnings.warn(
                f"{candidate} export failed ({err}); trying the next exporter", stacklevel=3
            )
    raise ExportError("every exporter failed:\n" + "\n".join(errors))


def _other_path(exporter: str, differ: str | None, then: str) -> ExportError:
    """The error for a model that ``exporter`` traces on another path than its eager one."""
    return ExportError(
        f"the model takes another path while {exporter} traces it than in eager mode, where qdq "
        f"recorded and calibrated it ({differ}); traced {then}. The ONNX would not compute what "
        "the fake-quant model computes: make the forward take one path (a branch on "
        "torch.jit.is_tracing(), torch.compiler.is_exporting() or a flag set for export?)"
    )


def describe_paths(paths: Sequence[str]) -> str:
    """Module paths for a message (``<root>`` for the model itself)."""
    return ", ".join(p or "<root>" for p in paths)


def _control_flow_refusal(
    paths: Sequence[str], exporter: str, err: BaseException
) -> ExportRefusedError:
    """The refusal when an exporter fails on a model whose recording saw tensor-valued control
    flow: torch.export fails on it rather than specializing; say so before torch's message."""
    first = " ".join(str(err).split())[:300]
    return ExportRefusedError(
        f"tensor values decide Python control flow in {describe_paths(paths)} (a Python boolean or "
        f"number read from a computed tensor, seen when qdq.prepare recorded the model), and the "
        f"{exporter} exporter failed on it ({type(err).__name__}: {first}). Make the branch tensor "
        "code (torch.where), export a model without it, or export with exporter='torchscript' and "
        "allow_specialization=True if every input takes the same path"
    )


def _refusal_inside(err: BaseException) -> BaseException | None:
    """Our refusal wrapped by an exporter (torch.export and torch.onnx re-raise with context)."""
    seen: set[int] = set()
    cur: BaseException | None = err
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, (ExportRefusedError, ScaleShapeError)):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


@contextlib.contextmanager
def _clean_failure(model: nn.Module) -> Iterator[None]:
    """Leave no trace of an exporter that fails inside the model.

    A failed ``torch.export`` may leave a torch function mode on the stack and the prepared
    model's call tracker active (see :meth:`qdq.graph.calls.CallTracker.abandon`); the next
    exporter would then trace the model without its weight quantizers.
    """
    from qdq.graph.runtime import runtime_of

    depth = torch._C._len_torch_function_stack()
    try:
        yield
    except BaseException:
        while torch._C._len_torch_function_stack() > depth:
            torch._C._pop_torch_function_stack()
        runtime = runtime_of(model)
        if runtime is not None:
            runtime.abandon()
        raise


@contextlib.contextmanager
def _computed_weights(model: nn.Module, args: tuple[Any, ...]) -> Iterator[None]:
    """Weights that ``forward`` computes from parameters (timm's ``StdConv2d``) are exported as
    the very values torch computed: one eager forward records each such weight quantizer's input
    and its Quantize reads that constant (``export_weight``), not the ops that computed it (the
    exporters would fold those with their own arithmetic, a rounding step away from torch's for
    some weights). Learned rounding (AdaRound's ``export_weight``) is kept as it is."""
    todo = {
        q: None
        for q in quantizers_of(model).values()
        if getattr(q, "computed_weight", False)
        and q.mode is QuantMode.QUANTIZE
        and "export_weight" not in q._buffers
    }
    if not todo:
        yield
        return

    def seen(q: nn.Module, inputs: tuple[Any, ...]) -> None:
        todo[q] = inputs[0].detach().clone()  # type: ignore[index]

    hooks = [q.register_forward_pre_hook(seen) for q in todo]
    try:
        with torch.no_grad():
            model(*args)
    finally:
        for h in hooks:
            h.remove()
    for q, value in todo.items():
        if value is not None:
            dtype = q.export_scale.dtype if "export_scale" in q._buffers else value.dtype
            q.register_buffer("export_weight", value.to(dtype))
    yield  # _export_state removes the buffers


@contextlib.contextmanager
def _export_state(
    model: nn.Module, quantizers: dict[str, Quantizer], opset: int, scale_dtype: torch.dtype
) -> Iterator[None]:
    """Attach export scales/zero points (and learned weights, :meth:`Quantizer.export_constants`),
    eval mode, no grad; undo everything afterwards."""
    was_training = model.training
    try:
        for q in quantizers.values():
            if isinstance(q, BlockQuantizer):  # one marker with its amax (qdq.export.blocks_onnx)
                amax = q.marker_amax()
                if amax is not None:
                    q.register_buffer("export_amax", amax)
                q.export_opset = opset
                continue
            scale = scale_from_amax(q.amax, fmt=q.spec.format).detach().clone().to(scale_dtype)
            q.register_buffer("export_scale", scale)
            zero_dtype = torch.float8_e4m3fn if q.spec.format == "fp8" else torch.int8
            q.register_buffer(
                "export_zero_point", torch.zeros(scale.shape, dtype=zero_dtype, device=scale.device)
            )
            for name, value in q.export_constants(scale).items():  # AdaRound: scale·code
                q.register_buffer(name, value)
            q.export_opset = opset
        model.eval()
        with torch.no_grad():
            yield
    finally:
        for q in quantizers.values():
            for buf in ("export_scale", "export_zero_point", "export_weight", "export_amax"):
                if buf in q._buffers:
                    del q._buffers[buf]
        model.train(was_training)
