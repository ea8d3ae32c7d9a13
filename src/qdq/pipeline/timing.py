"""What one sample costs in a forward of a model, timed for the job's time budget
(:mod:`qdq.pipeline.budget`): the unit its predictions are made of.

The timing must not swing with the machine's load (issue 57: one reading of the first calls on
2 samples took 1.4 s per sample where the evaluation then ran at 5.7 ms, and the default budget
came out at 23 hours). So it is taken as the job's own forwards run: on the job's batch (the
calibration batch, as big as the evaluation's), after a warm-up forward of that same batch
(first calls pay one-time costs: kernel checks, allocator and thread-pool caches); the fastest
of several readings is kept (the load only ever adds time); and it is bounded by what a sample
already cost in the calibration, whose batches ran real forwards (and more: the statistics).
It only predicts seconds: what the job does is planned from counts (:mod:`qdq.ptq.counts`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from qdq._modes import eval_no_grad
from qdq.calib.batches import batch_samples, expected_inputs, run_batch

__all__ = ["READINGS", "RETIME", "TIMED", "head", "per_sample"]

#: the most samples of the job's batch a forward is timed on (the demo's batches of 500 small
#: images cost per sample what 256 do; on a loaded 2-core machine 64 cost 10x more per sample,
#: the fixed cost of every call then dominating)
TIMED = 256
#: readings are taken until they add up to RETIME seconds, at least READINGS[0] (2 when one
#: forward takes longer than RETIME), at most READINGS[1]; the fastest is kept
RETIME, READINGS = 0.3, (3, 6)
#: a warm-up forward longer than this times a share of the batch that takes about this long
LONGEST = 1.0


def per_sample(
    model: nn.Module,
    batch: Any,
    warm: bool = True,
    bound: float | None = None,
    limit: int | None = TIMED,
) -> float:
    """Seconds per sample of a forward of ``model`` on ``batch`` (eval mode, no autograd; at most
    ``limit`` of its samples, ``None`` for a static batch): after a warm-up forward of the same
    batch when ``warm`` (when it takes over :data:`LONGEST` seconds, a share of the batch is
    timed), the fastest of :data:`READINGS` readings (more while they add up to less than
    :data:`RETIME` seconds), and at most ``bound`` (what a sample cost in the calibration), when
    given."""
    expected = expected_inputs(model)
    batch = batch if limit is None else _head(batch, limit)
    times: list[float] = []
    low, high = READINGS
    with eval_no_grad(model):
        if warm:
            start = time.perf_counter()
            run_batch(model, batch, 0, expected)
            one = time.perf_counter() - start
            n = batch_samples(batch)
            if one > LONGEST and limit is not None and n > 2:  # a large model: a share of it
                batch = _head(batch, max(2, int(n * LONGEST / one)))
                run_batch(model, batch, 0, expected)
            low = 2 if one > RETIME else low
        while len(times) < low or (len(times) < high and sum(times) < RETIME):
            start = time.perf_counter()
            run_batch(model, batch, 0, expected)
            times.append(max(time.perf_counter() - start, 0.0))
    got = min(times) / max(batch_samples(batch), 1)
    return got if bound is None or bound <= 0 else min(got, bound)


def _head(batch: Any, n: int) -> Any:
    from torch.utils._pytree import tree_map

    return tree_map(head(n), batch) if batch_samples(batch) > n else batch


def head(n: int) -> Callable[[Any], Any]:
    """The first ``n`` samples of a batch's tensor (other leaves as they are)."""
    return lambda t: t[:n] if isinstance(t, torch.Tensor) and t.dim() > 0 else t
