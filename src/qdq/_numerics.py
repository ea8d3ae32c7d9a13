"""The numeric constants shared by the torch formulations and the fused kernels that replace them.

They live below :mod:`qdq.quant.primitives`, :mod:`qdq.calib.histogram` and :mod:`qdq.kernels`
(and import nothing from qdq), so that the kernels take the very numbers of the torch path without
importing the layers that call them: the imports go one way, down. Each owner keeps exporting its
own names (``qdq.quant.MIN_AMAX`` / ``MIN_SCALE``, ``qdq.calib.histogram._MIN_EXP``); the values
are written here once.
"""

from __future__ import annotations

__all__ = ["HISTOGRAM_MIN_EXP", "MIN_AMAX", "MIN_SCALE"]

#: amax values at or below this are treated as "no signal" and floored (as pytorch-quantization does).
MIN_AMAX = 2.0**-24
#: The smallest scale we ever use or export (MIN_AMAX / 127): positive, a normal float32.
MIN_SCALE = MIN_AMAX / 127.0
#: The lowest exponent of the calibration histogram's grid: its range is never below
#: ``[0, 2**-24]``, the amax floor above (written out on its own: tests/test_calibrators.py checks
#: that the two agree).
HISTOGRAM_MIN_EXP = -24
