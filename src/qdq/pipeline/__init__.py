"""The main job: a float model and its data → a verified, linted INT8 Q/DQ ONNX and a report.

:func:`quantize` runs capture + plan → calibrate → export → ONNX Runtime verification → per-layer
error → lint and writes ``OUT/model.qdq.onnx``, ``OUT/manifest.json``, ``OUT/report.json`` and
``OUT/report.html``; ``qdq quantize`` is a thin command around it. Model and data specs:
:mod:`qdq.pipeline.models`, :mod:`qdq.pipeline.data`.

Example:
    >>> from qdq.pipeline import quantize
    >>> res = quantize("fashion-mnist-resnet", out="out", overwrite=True)  # doctest: +SKIP
    >>> res.report["lint"]["int8_weighted_layers"], res.report["lint"]["weighted_layers"]  # doctest: +SKIP
    (11, 12)
"""

from __future__ import annotations

from qdq.pipeline.data import DataOptions, QuantData, resolve_data
from qdq.pipeline.improve import PtqOptions, QatOptions
from qdq.pipeline.models import ModelSource, resolve_model
from qdq.pipeline.recipe import SearchOptions
from qdq.pipeline.run import (
    HTML_FILE,
    MANIFEST_FILE,
    ONNX_FILE,
    REPORT_FILE,
    QuantizeResult,
    quantize,
)

__all__ = [
    "HTML_FILE",
    "MANIFEST_FILE",
    "ONNX_FILE",
    "REPORT_FILE",
    "DataOptions",
    "ModelSource",
    "PtqOptions",
    "QatOptions",
    "QuantData",
    "QuantizeResult",
    "SearchOptions",
    "quantize",
    "resolve_data",
    "resolve_model",
]
