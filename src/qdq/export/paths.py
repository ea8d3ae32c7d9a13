"""The exported path is the calibrated path: the export reaches the call sites the eager forward does.

Some models take another path while an ONNX exporter traces them: segmentation-models-pytorch's
PSPNet pools with ``F.interpolate(x, mode="area")`` instead of its ``nn.AdaptiveAvgPool2d`` when
``torch.onnx.is_in_onnx_export()``. The plan was recorded, and the model calibrated and
verified, on the eager path; on the export path the quantizer in front of the pool is never
called, so the ONNX reads that tensor unquantized while the fake-quant model quantizes it. No
Q/DQ goes missing from the graph (the tensor's quantizer is shared with its other readers), so
neither the Q/DQ count nor the per-quantizer parity sees it.

:func:`count_calls` counts the hits of every planned call site (the runtime's own counters,
:mod:`qdq.graph.runtime`); :func:`path_difference` compares the sites an export trace reached
with those the eager forward that checks the model before export reached. On a difference the
export is traced again with ``torch.onnx.is_in_onnx_export()`` answering ``False``
(:func:`recorded_path`), the path qdq recorded; if they still differ, the exporter's result is
refused.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from qdq.graph.runtime import runtime_of

__all__ = ["count_calls", "path_difference", "recorded_path"]


@contextlib.contextmanager
def count_calls(model: nn.Module) -> Iterator[Counter[str]]:
    """Count the hits of every planned call site of ``model`` inside, by site name (a prepared
    model: nothing to count without a runtime)."""
    hits: Counter[str] = Counter()
    runtime = runtime_of(model)
    before = {k: s.hits for k, s in runtime.sites.items()} if runtime is not None else {}
    try:
        yield hits
    finally:
        if runtime is not None:
            for key, site in runtime.sites.items():
                hits[_name(key)] += site.hits - before.get(key, 0)


def _name(key: Any) -> str:
    """A site key ``(module path, family, ordinal)`` as text."""
    path, family, ordinal = key
    return f"{path or '<model>'}:{family}" + ("" if ordinal is None else f"#{ordinal}")


def path_difference(eager: Counter[str], export: Counter[str], limit: int = 5) -> str | None:
    """``None`` when the export reached the planned call sites the eager run reached; else
    which sites one of them missed, for an error message. Sites, not counts: the exporter may
    trace another batch size (dynamo's dynamic batch traces two samples), and a loop over the
    samples reaches a site once per sample."""
    ours = {s for s, n in eager.items() if n}
    theirs = {s for s, n in export.items() if n}
    if ours == theirs:
        return None
    parts = []
    for what, sites in (("not reached by the export", ours - theirs),
                        ("reached only by the export", theirs - ours)):  # fmt: skip
        if sites:
            shown = ", ".join(sorted(sites)[:limit])
            more = f" and {len(sites) - limit} more" if len(sites) > limit else ""
            parts.append(f"{len(sites)} planned call site(s) {what}: {shown}{more}")
    return "; ".join(parts)


@contextlib.contextmanager
def recorded_path() -> Iterator[None]:
    """``torch.onnx.is_in_onnx_export()`` answers ``False`` inside: a model that branches on it
    takes the path it takes in eager mode (the one qdq recorded and calibrated)."""
    original = torch.onnx.is_in_onnx_export
    torch.onnx.is_in_onnx_export = lambda: False
    try:
        yield
    finally:
        torch.onnx.is_in_onnx_export = original
