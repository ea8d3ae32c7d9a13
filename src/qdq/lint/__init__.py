"""The TensorRT linter: predict engine precision and fusion from a Q/DQ ONNX; read engine reports.

``qdq.lint.lint(onnx)`` → :class:`LintReport` (validity rules V, placement/sharing rules P/S/H,
strong-typing rule B02, predicted INT8 coverage, unfused Q/DQ and float islands);
``qdq.lint.engine_report`` reads trtexec ``--exportLayerInfo`` JSON (TensorRT 8-10 and 11).
"""

from __future__ import annotations

from qdq.lint.engine_report import EngineLayer, EngineReport, EngineTensor, load_engine_report
from qdq.lint.findings import Finding
from qdq.lint.report import LintReport, lint

__all__ = [
    "EngineLayer",
    "EngineReport",
    "EngineTensor",
    "Finding",
    "LintReport",
    "lint",
    "load_engine_report",
]
