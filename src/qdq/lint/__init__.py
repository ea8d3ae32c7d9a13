"""The TensorRT linter: predict engine precision and fusion from a Q/DQ ONNX; read engine reports.

``qdq.lint.lint(onnx, target=...)`` → :class:`LintReport`: findings (validity rules V, placement and
sharing rules P/S/H, build rules B, FP8 rules F, L00 for a step that failed, L01 for a model without
Q/DQ), the predicted engine layers (fused ONNX nodes with input and output precision -- INT8, FP8 or
float -- and standalone Q/DQ), INT8 and FP8 coverage, unfused Q/DQ and float islands. An unreadable
model raises :class:`LintInputError`.
``qdq.lint.engine_report`` reads trtexec ``--exportLayerInfo`` JSON (TensorRT 8-10 and 11) and
``qdq.lint.diff_engine`` compares a prediction with it layer by layer.
"""

from __future__ import annotations

from qdq.lint.diff import EngineDiff, LayerMatch, diff_engine
from qdq.lint.engine_report import EngineLayer, EngineReport, EngineTensor, load_engine_report
from qdq.lint.findings import Finding
from qdq.lint.load import LintInputError
from qdq.lint.predict import PredictedLayer
from qdq.lint.report import LintReport, lint
from qdq.lint.target import Target, parse_target

__all__ = [
    "EngineDiff",
    "EngineLayer",
    "EngineReport",
    "EngineTensor",
    "Finding",
    "LayerMatch",
    "LintInputError",
    "LintReport",
    "PredictedLayer",
    "Target",
    "diff_engine",
    "lint",
    "load_engine_report",
    "parse_target",
]
