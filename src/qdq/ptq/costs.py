"""What a candidate of the recipe search costs, estimated before it runs (issue 47).

The search (:mod:`qdq.ptq.search`) runs inside a time budget: it orders the candidates by their
estimated cost, starts one only when its estimate fits in what is left, and shortens AdaRound
(fewer iterations) to fit. :class:`Costs` makes the estimates:

* from the **steps already run**: a step measured in one candidate (bias correction after
  kernel-sum, on the same samples) costs the same in the next, so its measured seconds replace
  the estimate (a fold with other samples scales it by their number);
* before a step first runs, from the **model's size**: ``forward``, the seconds of one fake-quant
  forward per sample (the caller's timing, else what one calibration sample cost, then the
  median with every candidate's scoring), the weighted layers and parameters, and ``flops``, this machine's
  matrix-multiply throughput, measured once. Per step:

  - kernel-sum rounding (data-free): a pass over the weights, :data:`KERNEL_SUM` seconds per
    parameter;
  - bias correction: the survey forward of one batch and one forward each of the INT8 model and
    its FP32 twin over its samples (:mod:`qdq.ptq._lockstep`), plus a second pass of every
    layer: :data:`BIAS_FORWARDS` forwards per sample;
  - method per quantizer: one FP32 forward per sample and every candidate amax of every layer
    run again: :data:`METHOD_FORWARDS` forwards per sample;
  - equalization: a forward per sample to measure the ranges, then the equalized copy is
    prepared and calibrated once per fold (:data:`EQUALIZE_CALIBRATIONS` calibrations);
  - AdaRound: three forwards per sample (survey, INT8, twin) and, per iteration, a forward and a
    backward GEMM of :data:`qdq.ptq.adaround.BATCH_ROWS` rows through every weight
    (``6 · rows · params`` flops) plus :data:`ITER_OVERHEAD` seconds per layer.

The constants are conservative: the estimates decide what starts, and an estimate too low lets
a candidate overrun the budget (the deadline then stops it at its next step).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

__all__ = [
    "BIAS_FORWARDS",
    "EQUALIZE_CALIBRATIONS",
    "ITER_OVERHEAD",
    "KERNEL_SUM",
    "METHOD_FORWARDS",
    "MIN_ADAROUND_ITERS",
    "Costs",
    "matmul_flops",
]

#: seconds per parameter of kernel-sum rounding (EfficientNet-Lite0: 1.2 s for 4.6M)
KERNEL_SUM = 3e-7
#: forwards per sample of bias correction in lockstep (survey, INT8, twin, the corrected call)
BIAS_FORWARDS = 4.0
#: forwards per sample of the method per quantizer (the FP32 forward and the candidates' reruns)
METHOD_FORWARDS = 6.0
#: calibrations the equalized copy costs (equalization's own forwards, then the calibration):
#: measured 3.8 (CREPE-tiny, 6.4 s on 2 folds of a 1.7 s calibration) and 4.5 (EfficientNet-
#: Lite0) on this CPU; at 2.0 the search ran equalization before bias correction, which then no
#: longer fit, and kept a worse recipe (EfficientNet-Lite0 agreement 78 % instead of 91 %)
EQUALIZE_CALIBRATIONS = 5.0
#: seconds per layer and AdaRound iteration outside the GEMMs (Adam, autograd, Python)
ITER_OVERHEAD = 4e-4
#: the fewest AdaRound iterations worth running: below, the candidate is skipped
MIN_ADAROUND_ITERS = 100


def matmul_flops() -> float:
    """This machine's float32 matrix-multiply throughput (flop/s) on the CPU, measured once on a
    GEMM of AdaRound's shape (1024 rows)."""
    global _FLOPS
    if _FLOPS is None:
        a, b = torch.randn(1024, 576), torch.randn(576, 256)
        torch.mm(a, b)  # warm up
        start, n = time.perf_counter(), 0
        while n < 3 or time.perf_counter() - start < 0.02:
            torch.mm(a, b)
            n += 1
        _FLOPS = 2 * 1024 * 576 * 256 * n / (time.perf_counter() - start)
    return _FLOPS


_FLOPS: float | None = None


@dataclass
class Costs:
    """The estimates of the search's steps (module docstring).

    Attributes:
        forward: seconds of one fake-quant forward per sample.
        calibration: seconds of one prepare + calibrate of the float model (an equalized base).
        params: parameters of the weighted layers.
        layers: weighted layers.
        flops: matrix-multiply throughput in flop/s (:func:`matmul_flops`).
        measured: per step key, ``(seconds, samples)`` of its last run.
        forwards: the forwards measured so far (seconds per sample): ``forward`` is their
            median, robust to a first call's one-time costs and to a load spike.
    """

    forward: float
    calibration: float
    params: int
    layers: int
    flops: float
    measured: dict[str, tuple[float, int]] = field(default_factory=dict)
    forwards: list[float] = field(default_factory=list)

    def timed_forward(self, seconds: float) -> None:
        """A fake-quant forward took ``seconds`` per sample: ``forward`` becomes the median of
        every one measured (the first estimate included)."""
        if not self.forwards:
            self.forwards.append(self.forward)
        self.forwards.append(seconds)
        ordered = sorted(self.forwards)
        self.forward = ordered[len(ordered) // 2]

    def step(self, key: str, samples: int, *, iters: int = 500) -> float:
        """Seconds of step ``key`` (:data:`qdq.ptq.step.STEPS`) on ``samples`` calibration
        samples (AdaRound: ``min(samples, 256)`` and ``iters`` iterations)."""
        if key in self.measured and key != "adaround":
            seconds, ran_on = self.measured[key]
            return seconds * max(samples, 1) / max(ran_on, 1) if key != "kernel_sum" else seconds
        if key == "kernel_sum":
            return 0.02 + KERNEL_SUM * self.params
        if key == "bias_correction":
            return BIAS_FORWARDS * self.forward * min(samples, 128)
        if key == "method_per_quantizer":
            return METHOD_FORWARDS * self.forward * min(samples, 128)
        if key == "equalize":
            return EQUALIZE_CALIBRATIONS * self.calibration
        if key == "adaround":
            return self.adaround_fixed(samples) + iters * self.adaround_iteration()
        raise KeyError(f"no cost estimate for step {key!r}")

    def adaround_fixed(self, samples: int) -> float:
        """AdaRound's seconds outside its iterations (its forwards)."""
        return 3.0 * self.forward * min(samples, 256)

    def adaround_iteration(self) -> float:
        """Seconds of one AdaRound iteration over every layer; measured once it ran."""
        if "adaround" in self.measured:
            seconds, iters = self.measured["adaround"]
            return seconds / max(iters, 1)
        return 6 * 1024 * self.params / self.flops + ITER_OVERHEAD * self.layers

    def adaround_iters(self, seconds: float, samples: int, wanted: int) -> int:
        """The most AdaRound iterations (at most ``wanted``) that fit in ``seconds``; 0 when
        fewer than :data:`MIN_ADAROUND_ITERS` fit."""
        room = seconds - self.adaround_fixed(samples)
        fit = math.floor(room / self.adaround_iteration()) if room > 0 else 0
        fit = min(wanted, fit)
        return fit if fit >= min(wanted, MIN_ADAROUND_ITERS) else 0

    def record(self, key: str, seconds: float, samples: int, *, iters: int | None = None) -> None:
        """A step ran: its seconds on ``samples`` (AdaRound: the seconds of its iterations
        alone, and their number, are what is kept)."""
        if key == "adaround" and iters:
            fixed = self.adaround_fixed(samples)
            self.measured[key] = (max(seconds - fixed, 0.0), iters)
        else:
            self.measured[key] = (seconds, samples)

    def score(self, held: int) -> float:
        """Seconds to score a candidate on ``held`` held-out samples."""
        return self.forward * held
