"""The export step of ``qdq quantize``: the exported ONNX keeps a dynamic batch and, for token
inputs, a dynamic sequence length.

Token inputs are integer ``(N, L)`` tensors with one ``L`` (token ids, attention masks, token
types: :func:`sequence_dims`). Their length is exported dynamic too (``export_onnx(dynamic_dims=
...)``) and verified on half the example's length (:func:`shorter`). Integer inputs that are no
sequence (categorical features a model indexes by column) fail that export: the model is then
exported with the example's length fixed, and a warning says why.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["export_model", "sequence_dims", "shorter"]


def sequence_dims(args: Sequence[Any]) -> dict[int, dict[int, str]]:
    """``{tensor input index: {1: "sequence"}}`` when every tensor input holds token-like data,
    integer ``(N, L)`` with one ``L >= 2`` (token ids, attention masks, token types): the export
    then keeps the sequence length dynamic, as the batch (``export_onnx(dynamic_dims=...)``).
    Otherwise ``{}``."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not tensors or any(t.dim() != 2 or t.is_floating_point() or t.is_complex() for t in tensors):
        return {}
    lengths = {int(t.shape[1]) for t in tensors}
    if len(lengths) != 1 or lengths.pop() < 2:
        return {}
    return {i: {1: "sequence"} for i in range(len(tensors))}


def shorter(args: Sequence[Any], dims: dict[int, dict[int, str]]) -> tuple[Any, ...]:
    """``args`` with each dynamic sequence cut to its first half (at least 2): an input of another
    length for the export's verification. Tokens are kept in order, masks with them."""
    out: list[Any] = []
    k = 0
    for a in args:
        if isinstance(a, torch.Tensor):
            if k in dims:
                a = a[:, : max(2, a.shape[1] // 2)]
            k += 1
        out.append(a)
    return tuple(out)


def export_model(
    prepared: nn.Module,
    example: tuple[Any, ...],
    onnx_path: Path,
    manifest_path: Path,
    *,
    opset: int | None,
    exporter: str,
    static: bool,
    per_image: bool,
    block_form: str = "onnx",
) -> tuple[Any, dict[int, dict[int, str]]]:
    """Export ``prepared`` (its :class:`~qdq.export.ExportResult`) and the dynamic dimensions
    besides the batch it got; ``static``: a fixed batch (a ``.pt2``'s); ``per_image``: detection
    lists, verified by the caller.

    ``onnx_path`` and ``manifest_path`` lie in the job's staging folder
    (:func:`qdq.pipeline.outdir.staged_dir`): the manifest is written there as
    ``manifest.json.partial`` and takes its name when the folder is published, so that a killed
    job never leaves a model and its manifest that look finished."""
    import qdq
    from qdq.pipeline.outdir import staged_name

    manifest_path = staged_name(manifest_path)

    def run(dims: dict[int, dict[int, str]]) -> Any:
        return qdq.export_onnx(
            prepared,
            example,
            onnx_path,
            opset=opset,
            exporter=exporter,
            dynamic_batch=not static,
            manifest_path=manifest_path,
            verify=False if per_image else None,  # detection lists: checked by the caller
            dynamic_dims=dims,
            check_inputs=[shorter(example, dims)] if dims else None,
            block_form=block_form,
        )

    dims = {} if static or per_image else sequence_dims(example)
    if not dims:
        return run({}), {}
    try:
        return run(dims), dims
    except Exception as err:  # the exporters raise many types
        warnings.warn(
            f"the export with a dynamic sequence length failed ({type(err).__name__}: "
            f"{str(err)[:300]}); exported with the example's length fixed",
            stacklevel=3,
        )
        return run({}), {}
