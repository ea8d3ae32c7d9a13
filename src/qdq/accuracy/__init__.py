"""Find where INT8 costs accuracy and keep only that in float.

* :func:`sensitivity` — every unit (scale group) scored one-off or one-on, by the output proxy or
  the user's metric (:mod:`qdq.accuracy.sensitivity`);
* :func:`auto_quantize` — INT8 everywhere the ``max_drop`` budget allows, with the fallback
  reported and its TensorRT cost predicted (:mod:`qdq.accuracy.fallback`);
* :mod:`qdq.accuracy.units` — what is switched as one.

Per-layer error without any re-evaluation is :func:`qdq.debug.layer_errors`.
"""

from __future__ import annotations

from qdq.accuracy.fallback import (
    AutoQuantResult,
    FallbackStep,
    LintCost,
    agreement_metric,
    auto_quantize,
)
from qdq.accuracy.sensitivity import MODES, Sensitivity, SensitivityRow, sensitivity
from qdq.accuracy.units import Unit, units_of, units_off, units_only

__all__ = [
    "MODES",
    "AutoQuantResult",
    "FallbackStep",
    "LintCost",
    "Sensitivity",
    "SensitivityRow",
    "Unit",
    "agreement_metric",
    "auto_quantize",
    "sensitivity",
    "units_of",
    "units_off",
    "units_only",
]
