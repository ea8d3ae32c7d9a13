"""Q/DQ ONNX export: emission, post-processing, validation and the manifest."""

from __future__ import annotations

from qdq.export.manifest import SCHEMA, find_manifest, load_calibration, manifest_path_for
from qdq.export.onnx_export import (
    EXPORTERS,
    ExportError,
    ExportRefusedError,
    ExportResult,
    export_onnx,
)
from qdq.export.summary import graph_summary

__all__ = [
    "EXPORTERS",
    "SCHEMA",
    "ExportError",
    "ExportRefusedError",
    "ExportResult",
    "export_onnx",
    "find_manifest",
    "graph_summary",
    "load_calibration",
    "manifest_path_for",
]
