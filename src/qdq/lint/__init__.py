"""The TensorRT linter: predict engine precision and fusion from a Q/DQ ONNX; read engine reports.

Today: the engine-report reader (``qdq.lint.engine_report``) for trtexec ``--exportLayerInfo`` JSON
(TensorRT 8-10 and 11 schemas).
"""

from __future__ import annotations

from qdq.lint.engine_report import EngineLayer, EngineReport, EngineTensor, load_engine_report

__all__ = ["EngineLayer", "EngineReport", "EngineTensor", "load_engine_report"]
