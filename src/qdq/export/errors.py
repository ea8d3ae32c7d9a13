"""Export errors (a module of their own so that every export module can raise them)."""

from __future__ import annotations

__all__ = ["ExportError", "ExportRefusedError"]


class ExportError(RuntimeError):
    """The exported graph failed validation (checker, shape inference, Q/DQ structure, numbers)."""


class ExportRefusedError(ExportError):
    """An export qdq refuses whatever the exporter: it would be silently wrong (e.g. specialized
    on the example input's tensor values)."""
