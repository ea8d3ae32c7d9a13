"""ONNX Runtime on CPU with exact Q/DQ semantics, and torch ↔ ORT parity checks: the public name
of :mod:`qdq.backends.ort_session` (sessions at ``ORT_ENABLE_BASIC``, runs; why that level, in
its docstring) and :mod:`qdq.backends.parity` (:func:`parity` and its reports), which uses the
sessions. onnxruntime is imported lazily (extra ``qdq[onnx]``).
"""

from __future__ import annotations

from qdq.backends.ort_session import DISABLED_OPTIMIZERS, run, session
from qdq.backends.parity import LayerParity, ParityReport, parity

__all__ = ["DISABLED_OPTIMIZERS", "LayerParity", "ParityReport", "parity", "run", "session"]
