"""Better post-training quantization around :func:`qdq.calibrate`.

Before :func:`qdq.prepare`, on a copy of the float model:

* :mod:`qdq.ptq.equalize` — cross-layer equalization: per-channel activation ranges moved into
  the next layer's weights (the float function unchanged), where that lowers the INT8 error.

After calibration, each step is a switch that works on a calibrated prepared model, reports what
it changed, and is carried by :func:`qdq.export_onnx` through the same Q/DQ ONNX:

* :mod:`qdq.ptq.methods` — the calibration method chosen per quantizer, from the same histograms,
  by the error of that layer's output;
* :mod:`qdq.ptq.bias` — bias correction of weighted layers;
* :mod:`qdq.ptq.kernel_sums` — data-free weight rounding that keeps every conv kernel's sum;
* :mod:`qdq.ptq.adaround` — learned weight rounding (AdaRound): only the weights' INT8 codes change.
"""

from __future__ import annotations

__all__: list[str] = []
