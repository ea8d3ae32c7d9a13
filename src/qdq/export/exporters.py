"""Running torch's exporters: dynamo (torch.export) and TorchScript, with the quantizers emitting
Q/DQ; the TorchScript run refuses a trace specialized on tensor values (tracer warnings)."""

from __future__ import annotations

import contextlib
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from qdq.api import quantizers_of
from qdq.export.errors import ExportError, ExportRefusedError
from qdq.quant.onnx_qdq import export_mode

__all__ = ["run_exporter"]


def run_exporter(
    model: nn.Module,
    args: tuple[Any, ...],
    exporter: str,
    opset: int,
    dynamic_batch: bool,
    allow_specialization: bool,
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
            with (
                tempfile.TemporaryDirectory(prefix="qdq-export-") as tmp,
                _tracer_warnings(allow_specialization),
            ):
                out = Path(tmp) / "model.onnx"
                torch.onnx.export(
                    model, args, out, dynamo=False, opset_version=opset, input_names=input_names,
                    output_names=["output"], dynamic_axes=axes, do_constant_folding=True,
                )  # fmt: skip
                return onnx.load(str(out)), order
        finally:
            for h in hooks:
                h.remove()


@contextlib.contextmanager
def _tracer_warnings(allow_specialization: bool) -> Iterator[None]:
    """Refuse (``ExportRefusedError``) when the TorchScript tracer warns that the model's own code turned
    a tensor into a Python value; other warnings pass through unchanged."""
    torch_dir = str(Path(torch.__file__).parent)
    specialized = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", torch.jit.TracerWarning)
        try:
            yield
        finally:
            for w in caught:
                if not issubclass(w.category, torch.jit.TracerWarning):
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
                elif not w.filename.startswith(torch_dir):
                    specialized.append(w)
    if not specialized:
        return
    where = "; ".join(
        f"{w.filename}:{w.lineno}: {str(w.message).split('.')[0]}" for w in specialized[:3]
    )
    if allow_specialization:
        warnings.warn(
            f"the TorchScript export is specialized on the example input ({where}); written "
            "because allow_specialization=True",
            stacklevel=4,
        )
        return
    raise ExportRefusedError(
        f"the model's forward turns tensor values into Python values ({where}), typically "
        "Python control flow such as `if x.mean() > 0:`. The TorchScript exporter records only "
        "the branch the example input took, so the ONNX would silently compute something else "
        "for other inputs. Make the branch tensor code (torch.where), export a model without it, "
        "or pass allow_specialization=True if every input takes the same path"
    )
