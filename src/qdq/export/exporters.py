"""Running torch's exporters: dynamo (torch.export) and TorchScript, with the quantizers emitting
Q/DQ; the TorchScript run refuses a trace specialized on tensor values (tracer warnings)."""

from __future__ import annotations

import contextlib
import sys
import tempfile
import types
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

import torch
from torch import nn

from qdq._io import onnx_input_names
from qdq.api import quantizers_of
from qdq.export.errors import ExportError, ExportRefusedError
from qdq.quant.onnx_qdq import export_mode

__all__ = ["register_lost_constants", "run_exporter"]

_TORCH_DIR = str(Path(torch.__file__).parent)
_CAPTURE_DIR = str(Path(__file__).parent.parent / "graph")
_DISPATCH = (str(Path(torch.__file__).parent / "overrides.py"),)


def run_exporter(
    model: nn.Module,
    args: tuple[Any, ...],
    exporter: str,
    opset: int,
    dynamic_batch: bool,
    allow_specialization: bool,
    *,
    dynamic_dims: Mapping[int, Mapping[int, str]] | None = None,
    recorded: bool = False,
    value_reads: tuple[str, ...] = (),
) -> tuple[Any, list[str] | None]:
    """Run one exporter; return the ONNX model and (TorchScript) the quantizer call order.

    ``recorded``: the plan comes from a recording of the eager forward that saw no tensor value
    decide Python control flow; the tracer's conversions are then of traced shapes.
    ``value_reads``: where (``file:line``) the recording saw tensor values turned into Python
    values, when it saw some: only a tracer conversion at one of them is refused.
    ``dynamic_dims``: more dynamic dimensions, ``{tensor input index: {dimension: name}}``
    (one name, one size: a token sequence and its mask).
    """
    import onnx

    tensor_args = [a for a in args if isinstance(a, torch.Tensor)]
    input_names = onnx_input_names(len(tensor_args))
    with export_mode(exporter), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        axes = _axes(args, dynamic_batch, dynamic_dims or {})
        if exporter == "dynamo":
            dyn = None
            if axes:
                dims = {
                    n: torch.export.Dim(n, min=2)
                    for n in {d for a in axes.values() for d in a.values()}
                }
                dims["batch"] = torch.export.Dim("batch")
                dyn = _by_signature(
                    model,
                    [
                        {d: dims[n] for d, n in axes[i].items()} if i in axes else None
                        for i in range(len(args))
                    ],
                )
                if dynamic_batch:
                    args = _batch_of_two(args)
            program = torch.onnx.export(
                model, args, dynamo=True, opset_version=max(opset, 18), dynamic_shapes=dyn,
                input_names=input_names, verbose=False,
            )  # fmt: skip
            if program is None:
                raise ExportError("torch.onnx.export(dynamo=True) returned no program")
            register_lost_constants(program.model)
            proto = program.model_proto
            if opset < 18:
                from qdq.export.opset import downgrade

                proto = downgrade(proto, opset)
            return proto, None
        tensor_pos = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        named: dict[str, dict[int, str]] | None = {
            n: dict(axes[i]) for n, i in zip(input_names, tensor_pos, strict=True) if i in axes
        }
        if not named:
            named = None
        elif dynamic_batch:
            named["output"] = {0: "batch"}
        order: list[str] = []
        hooks = [
            q.register_forward_pre_hook(lambda m, a, path=path: order.append(path))
            for path, q in quantizers_of(model).items()
        ]
        try:
            with (
                tempfile.TemporaryDirectory(prefix="qdq-export-") as tmp,
                _tracer_warnings(allow_specialization, recorded, value_reads),
                _given_inputs_only(model),
            ):
                # a str: torch writes external data past 2 GB only beside a path given as str
                out = Path(tmp) / "model.onnx"
                torch.onnx.export(
                    model, args, str(out), dynamo=False, opset_version=opset, input_names=input_names,
                    output_names=["output"], dynamic_axes=named, do_constant_folding=True,
                )  # fmt: skip
                return onnx.load(str(out)), order
        finally:
            for h in hooks:
                h.remove()


def _by_signature(model: nn.Module, per_arg: list[Any]) -> tuple[Any, ...]:
    """The dynamic shapes of the positional inputs ``per_arg`` in the structure torch.export binds
    them to ``model.forward``'s parameters: one entry per named parameter, and the inputs that a
    ``*args`` parameter collects as one tuple (``forward(self, *inputs)``: a wrapper's), none
    when it collects nothing (ultralytics' ``forward(self, x, *args, **kwargs)``)."""
    import inspect

    from qdq.calib.batches import forward_parameters

    named = 0
    for p in forward_parameters(model):
        if p.kind == inspect.Parameter.VAR_POSITIONAL and len(per_arg) > named:
            return (*per_arg[:named], tuple(per_arg[named:]))
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            named += 1
    return tuple(per_arg)


def register_lost_constants(model: Any) -> list[str]:
    """Register as initializers the constants that nodes of ``model`` (an ``onnx_ir.Model``) read
    but the graph does not hold; return their names.

    onnxscript's optimizer (run by ``torch.onnx.export(dynamo=True)``) fuses ``Min(Max(x, lo),
    hi)`` into ``Clip(x, lo, hi)`` with new initializers named ``{x}_min``/``{x}_max``
    (``FuseMaxMinToClip``, onnxscript 0.7). When several clamps read one tensor (timm's Gemma 4
    ViT clamps the input of its q, k and v projections, each with its own bounds) the second and
    third get unique names (``x_min_1``) but are never registered: the serialized graph reads
    inputs that nothing defines, which ``onnx.checker`` reports as "not topologically sorted".
    The values still carry their constants, so they are registered under those names.
    """
    graph = model.graph
    lost: list[str] = []
    for node in graph:
        for value in node.inputs:
            if (
                value is None
                or value.producer() is not None
                or value.is_graph_input()
                or value.is_initializer()
                or value.const_value is None
                or value.name is None
            ):
                continue
            graph.register_initializer(value)
            lost.append(value.name)
    return lost


@contextlib.contextmanager
def _given_inputs_only(model: nn.Module) -> Iterator[None]:
    """Trace only the inputs the caller gives, leaving ``forward``'s other parameters at their
    Python defaults, as in eager.

    torch's TorchScript exporter appends the default of every ``forward`` parameter the example
    does not pass to the traced inputs (``_decide_input_format``), and the tracer turns a Python
    ``bool``/``int``/``float`` input into a tensor: timm's ``forward(x, attn_mask=None,
    is_causal=False)`` then hands ``F.scaled_dot_product_attention`` a tensor ``is_causal`` and
    the export fails (plain ``torch.onnx.export(..., dynamo=False)`` does the same, without
    qdq). While it traces, the model's ``forward`` is seen through a ``(*args)`` signature (an
    instance attribute, removed afterwards), so no default is appended; the module, its scopes
    and its initializer names are unchanged.
    """
    attrs = vars(model)
    had = "forward" in attrs
    previous = attrs.get("forward")
    bound = model.forward

    def forward(*args: Any) -> Any:  # no functools.wraps: the signature must be (*args)
        return bound(*args)

    attrs["forward"] = forward
    try:
        yield
    finally:
        if had:
            attrs["forward"] = previous
        else:
            attrs.pop("forward", None)


@contextlib.contextmanager
def _tracer_warnings(
    allow_specialization: bool, recorded: bool, value_reads: tuple[str, ...] = ()
) -> Iterator[None]:
    """Refuse (``ExportRefusedError``) when the TorchScript tracer warns that the model's own code turned
    a tensor into a Python value; other warnings pass through unchanged.

    When the plan was ``recorded``, the eager recording saw every tensor the model turned into a
    Python value and export already refused data-dependent control flow, so what the tracer still
    reports are the tensors *it* makes of sizes (``x.shape`` is traced) and of default arguments
    (``is_causal=False``): specializations on input shapes, written with a warning that names them.

    When the recording saw tensor values decide control flow, it knows where (``value_reads``):
    only a tracer conversion at one of those lines bakes the example's branch into the graph; a
    conversion elsewhere is of a traced size, as above (transformers' masking code reads
    ``padding_mask.all()`` in eager and skips that read under tracing, where only shapes are
    converted). Without those sites, every conversion is refused.

    A conversion made by torch itself (``torch._assert`` on a traced shape, ``Tensor.__format__``) is
    not the model's control flow. The call-site runtime forwards every torch call of the model, so a
    C-level conversion (``Tensor.__bool__``) is reported at the runtime's frame; its real origin is
    the first frame outside qdq's capture code and torch's dispatch code.
    """
    specialized: list[tuple[str, int, str]] = []
    passed: list[warnings.WarningMessage] = []

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        if not issubclass(category, torch.jit.TracerWarning):
            passed.append(warnings.WarningMessage(message, category, filename, lineno))
            return
        filename, lineno = _origin(filename, lineno)
        if not filename.startswith(_TORCH_DIR):
            specialized.append((filename, lineno, str(message).split(".")[0]))

    with warnings.catch_warnings():
        warnings.simplefilter("always", torch.jit.TracerWarning)
        warnings.showwarning = show  # restored by catch_warnings
        yield
    for w in passed:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if not specialized:
        return
    where = "; ".join(f"{file}:{line}: {text}" for file, line, text in specialized[:3])
    if allow_specialization:
        warnings.warn(
            f"the TorchScript export is specialized on the example input ({where}); written "
            "because allow_specialization=True",
            stacklevel=5,
        )
        return
    sites = {f"{file}:{line}" for file, line, _ in specialized}
    if recorded or (value_reads and not sites & set(value_reads)):
        seen = (
            "The recording of the eager forward read no computed tensor as a Python value"
            if recorded
            else "The recording read tensor values elsewhere only "
            f"({', '.join(value_reads[:3])}), which the trace does not reach"
        )
        warnings.warn(
            f"the TorchScript trace turned traced sizes or default arguments into Python values "
            f"({where}). {seen}, so the ONNX is specialized on input shapes there: exact for the "
            "example's shape; with a dynamic batch, pass check_inputs of another batch size to "
            "verify it",
            stacklevel=5,
        )
        return
    raise ExportRefusedError(
        f"the model's forward turns tensor values into Python values ({where}), typically "
        "Python control flow such as `if x.mean() > 0:`. The TorchScript exporter records only "
        "the branch the example input took, so the ONNX would silently compute something else "
        "for other inputs. Make the branch tensor code (torch.where), export a model without it, "
        "or pass allow_specialization=True if every input takes the same path"
    )


def _origin(filename: str, lineno: int) -> tuple[str, int]:
    """Where a warning reported at ``filename:lineno`` really comes from: the frame itself, unless it
    is qdq's call-site runtime, then the first caller outside the runtime and torch's dispatch."""
    if not filename.startswith(_CAPTURE_DIR):
        return filename, lineno
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None and not (
        frame.f_code.co_filename == filename and frame.f_lineno == lineno
    ):
        frame = frame.f_back
    while frame is not None and (
        frame.f_code.co_filename.startswith(_CAPTURE_DIR) or frame.f_code.co_filename in _DISPATCH
    ):
        frame = frame.f_back
    if frame is None:
        return filename, lineno
    return frame.f_code.co_filename, frame.f_lineno


def _axes(
    args: tuple[Any, ...], dynamic_batch: bool, extra: Mapping[int, Mapping[int, str]]
) -> dict[int, dict[int, str]]:
    """``{position in args: {dimension: name}}`` of every dynamic dimension: the batch of each
    tensor, and ``extra``'s, whose keys count tensor inputs only (``input1`` is the second)."""
    tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    axes: dict[int, dict[int, str]] = {i: {0: "batch"} for i in tensors} if dynamic_batch else {}
    for k, dims in extra.items():
        axes.setdefault(tensors[k], {}).update(dims)
    return axes


def _batch_of_two(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The example inputs with a batch-1 tensor repeated to batch 2: torch.export specializes a
    size-1 dimension to the constant 1, so a dynamic batch needs an example batch of at least 2.
    The exported graph is the same computation; nothing batch-dependent runs in eval mode."""
    return tuple(
        torch.cat([a, a]) if isinstance(a, torch.Tensor) and a.dim() and a.shape[0] == 1 else a
        for a in args
    )
