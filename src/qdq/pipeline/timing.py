"""What one sample costs in a forward of a model, timed for the job's time budget
(:mod:`qdq.pipeline.budget`): the unit its estimates are made of."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from qdq._modes import eval_no_grad
from qdq.calib.batches import batch_samples, expected_inputs, run_batch

__all__ = ["RETIME", "RETIMES", "TIMED", "head", "per_sample"]

#: calibration samples the time budget's forwards are timed on (:mod:`qdq.pipeline.budget`;
#: fewer would weigh the per-call overhead of a small model's eval batches too much)
TIMED = 16
#: a timed forward is repeated while the timings add up to less than this, at most RETIMES times
RETIME, RETIMES = 0.5, 5


def per_sample(model: nn.Module, batch: Any, warm: bool) -> float:
    """Seconds per sample of a forward of ``model`` on ``batch`` (eval mode, no autograd), after
    a forward of its first sample when ``warm`` (first calls pay one-time costs: kernel checks,
    caches), on as many of its samples as :data:`RETIME` seconds allow by that first forward
    (2 to :data:`TIMED`). A quick forward is timed up to :data:`RETIMES` times, until
    :data:`RETIME` seconds are spent, and the median kept: on a shared machine one timing of a
    few milliseconds swings 10x with the load of the moment, where the evaluation's many batches
    average it out."""
    expected = expected_inputs(model)
    times: list[float] = []
    with eval_no_grad(model):
        if warm:
            start = time.perf_counter()
            run_batch(model, tree_map(head(1), batch), 0, expected)
            one = time.perf_counter() - start
            # a large model is timed on fewer samples (YOLOv8n at 640 took 14 s on 16)
            keep = max(2, min(TIMED, int(RETIME / max(one, 1e-6))))
            batch = tree_map(head(keep), batch)
        while len(times) < RETIMES and sum(times) < RETIME:
            start = time.perf_counter()
            run_batch(model, batch, 0, expected)
            times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] / max(batch_samples(batch), 1)


def head(n: int) -> Callable[[Any], Any]:
    """The first ``n`` samples of a batch's tensor (other leaves as they are)."""
    return lambda t: t[:n] if isinstance(t, torch.Tensor) and t.dim() > 0 else t
