"""Per-layer quantization error: where the fake-quant model departs from FP32, and why.

:func:`layer_errors` runs a few batches through the prepared model twice each — every quantizer
bypassed (the FP32 model) and the quantizers as they are set (the INT8 model as it is exported) — and,
at every activation quantizer, compares the tensor its consumers read in the INT8 model (everything
upstream quantized, then this Q/DQ) with the same tensor in the FP32 model. That is the
*accumulated* error of the point. Also measured: the output of the quantizer's layer when it is a
module (``nn.Conv2d``, ``nn.Linear`` ...), the error of every quantized weight, the model's first
output, the fraction of FP32 values beyond ``amax`` (clipped), and, for the worst points, the
calibration histogram of ``|x|`` with the amax of every calibration method.

Errors are summed over every call of a quantizer and every batch, as

* ``sqnr_db`` = 10·log10(Σx² / Σ(x − y)²) (higher is better; ``inf`` when identical);
* ``cosine`` = Σxy / √(Σx²·Σy²) over the whole tensor;
* ``rel_mse`` = Σ(x − y)² / Σx² (= 10^(−SQNR/10)).

The *isolated* error of a point (only this point quantized) comes from the same pass: in the FP32
run, each activation quantizer's Q/DQ is applied to the FP32 tensor on the side and compared with it
(``LayerError.isolated``). Isolated far above accumulated: the damage comes from upstream.

Example:
    >>> import torch, qdq
    >>> net = torch.nn.Sequential(
    ...     torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 3)
    ... )
    >>> m = qdq.prepare(net, (torch.randn(1, 3, 12, 12),))
    >>> data = [torch.randn(4, 3, 12, 12) for _ in range(3)]
    >>> _ = qdq.calibrate(m, data, show_progress=False)
    >>> errors = layer_errors(m, data)
    >>> [r.name for r in errors.rows]  # worst first
    ['2:input', '0:input']
    >>> errors.rows[0].accumulated.sqnr_db > 20, errors.rows[0].weight.sqnr_db > 40
    (True, True)
"""

from __future__ import annotations

from qdq.debug.layers import HISTOGRAM_BINS, LayerError, LayerErrors, WeightError, layer_errors
from qdq.debug.stats import ErrorStats, Histogram

__all__ = [
    "HISTOGRAM_BINS",
    "ErrorStats",
    "Histogram",
    "LayerError",
    "LayerErrors",
    "WeightError",
    "layer_errors",
]
