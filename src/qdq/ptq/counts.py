"""Work counted, not timed: the deterministic estimates the recipe search plans with (issue 57).

The same data and flags must give the same model whatever the machine's load, so what the search
tries — which candidates, how many folds, AdaRound's iterations — is planned from **counts**: the
model's multiply-accumulates per sample (counted on one forward of the float model,
:func:`count_macs`), its weighted layers and parameters, and the samples of each split. The
counts are turned into *nominal seconds*: what the work would take on a reference machine
(:data:`NOMINAL_FLOPS`, :data:`NOMINAL_GEMM_FLOPS`, :data:`LAYER_CALL`; about this project's
2-core CPU). A nominal second is
a unit of work, the same on every run and every machine; it is never compared with the clock.
The clock (:mod:`qdq._deadline`) only stops work the user's own time budget, or a hard ceiling,
asks to stop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from qdq.ptq.costs import Costs

__all__ = [
    "CALIBRATION_FORWARDS",
    "LAYER_CALL",
    "NOMINAL_FLOPS",
    "NOMINAL_GEMM_FLOPS",
    "batch_of",
    "count_macs",
    "nominal_costs",
    "nominal_forward",
]

#: float32 flop/s of a forward on the reference machine (this project's 2-core CPU: the demo's
#: ResNet, 9.3 M multiply-accumulates per sample, ran its FP32 evaluation at 70 us per sample in
#: batches of 500: 2.7e11; a fake-quant forward and smaller batches are slower)
NOMINAL_FLOPS = 1e11
#: float32 flop/s of AdaRound's GEMMs (1024 rows) on the reference machine (3e10 measured idle)
NOMINAL_GEMM_FLOPS = 2e10
#: seconds per weighted layer and batch call of a fake-quant forward outside its arithmetic
#: (Python, the quantizers' elementwise work) on the reference machine
LAYER_CALL = 2e-4
#: forwards per sample of one calibration (the histogram collection, then the method's amax)
CALIBRATION_FORWARDS = 3.0


def count_macs(model: nn.Module, example: Sequence[Any], samples: int) -> int | None:
    """The multiply-accumulates of one forward of ``model`` per sample, counted on ``example``
    (``samples`` of them) by :class:`torch.utils.flop_counter.FlopCounterMode` (matrix
    multiplies and convolutions; no timing); ``None`` when the forward cannot be counted."""
    from torch.utils.flop_counter import FlopCounterMode

    from qdq._modes import eval_no_grad

    try:
        with eval_no_grad(model), FlopCounterMode(display=False) as counter:
            model(*example)
        return int(counter.get_total_flops()) // 2 // max(samples, 1)
    except Exception:  # a model the counter cannot follow: the parameters stand in
        return None


def nominal_forward(macs: int, layers: int, batch: int) -> float:
    """Nominal seconds of one fake-quant forward per sample: ``macs`` per sample at
    :data:`NOMINAL_FLOPS`, and :data:`LAYER_CALL` per layer and call of a ``batch``."""
    return 2.0 * macs / NOMINAL_FLOPS + LAYER_CALL * max(layers, 1) / max(batch, 1)


def nominal_costs(*, params: int, layers: int, macs: int | None, batch: int, samples: int) -> Costs:
    """The search's deterministic estimates (:class:`~qdq.ptq.costs.Costs` in nominal seconds):
    its forward from the counts (``macs`` per sample, else ``params``: a weight used once per
    sample), a calibration of ``samples`` at :data:`CALIBRATION_FORWARDS`, the reference
    machine's throughput. Nothing measured is ever recorded in it."""
    forward = nominal_forward(params if macs is None else macs, layers, batch)
    return Costs(forward=forward, calibration=CALIBRATION_FORWARDS * forward * max(samples, 1),
                 params=params, layers=layers, flops=NOMINAL_GEMM_FLOPS)  # fmt: skip


def batch_of(batches: Sequence[Any]) -> int:
    """Samples in the first of ``batches`` (1 when there are none)."""
    from qdq.calib.batches import batch_samples

    return max(batch_samples(batches[0]), 1) if batches else 1
