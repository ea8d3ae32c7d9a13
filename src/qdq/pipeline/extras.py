"""The optional stages of ``qdq quantize`` after the INT8 measurement, each within what the time
budget leaves (:mod:`qdq.pipeline.budget`): the per-layer errors (on fewer samples, or none) and
``--compare-methods`` (the methods that fit). Their failures never fail the job
(:meth:`qdq.pipeline.stages.Stages.optional`)."""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from qdq.config import CALIBRATION_METHODS
from qdq.pipeline import per_image
from qdq.pipeline.budget import LAYER_ERROR_FORWARDS, METHOD_FORWARDS, Budget
from qdq.pipeline.data import QuantData
from qdq.pipeline.device import to_device
from qdq.pipeline.evaluate import score, torch_outputs
from qdq.pipeline.inputs import batches, num_samples, take

__all__ = [
    "LAYER_ERROR_BATCH",
    "LAYER_ERROR_MIN",
    "LAYER_ERROR_SAMPLES",
    "compare_methods",
    "layer_error_count",
    "layer_errors",
]

#: evaluation samples (and the largest batch) of the per-layer error stage (32: every layer's
#: SQNR settles well before, and the stage costs six fake-quant forwards per sample)
LAYER_ERROR_SAMPLES, LAYER_ERROR_BATCH = 32, 16
#: the fewest samples the per-layer errors run on when the time budget shortens them
LAYER_ERROR_MIN = 8


def layer_error_count(budget: Budget, forward: float, s: Any) -> int:
    """The evaluation samples the per-layer errors run on: :data:`LAYER_ERROR_SAMPLES`, fewer
    (at least :data:`LAYER_ERROR_MIN`) when the time budget leaves less, or 0 (skipped, and
    the budget's report says why). ``forward``: one FP32 evaluation sample's seconds."""
    wanted = budget.layer_error_samples or LAYER_ERROR_SAMPLES
    if s.per_image or s.static:
        wanted = max(wanted, s.batch_size if s.static else 1)
    per_sample = LAYER_ERROR_FORWARDS * forward
    room = budget.left() - budget.reserved(after="layer_errors")
    if per_sample * wanted <= room or s.static or s.per_image:
        return wanted if per_sample * wanted <= room else 0
    fit = int(room / per_sample) if per_sample > 0 else wanted
    if fit >= min(wanted, LAYER_ERROR_MIN):
        budget.skip("layer_errors", f"{wanted - fit} of {wanted} samples",
                    f"the budget leaves {max(room, 0):.1f} s: {fit} samples fit")  # fmt: skip
        return fit
    budget.skip("layer_errors", "the stage", f"the budget leaves {max(room, 0):.1f} s, "
                f"{per_sample * min(wanted, LAYER_ERROR_MIN):.1f} s needed")  # fmt: skip
    return 0


def layer_errors(prepared: nn.Module, qdata: QuantData, s: Any, count: int) -> Any:
    """:func:`qdq.debug.layer_errors` on the first ``count`` evaluation samples, in small
    batches."""
    from qdq.debug import layer_errors as measure

    size = s.batch_size if s.static else min(s.batch_size, LAYER_ERROR_BATCH)
    samples = take(qdata.evaluation, slice(0, count))  # per image: one (a forward per image)
    data = [
        to_device(b if s.inputs is None else s.inputs.arguments(b), torch.device(s.device))
        for b, _ in batches(samples, size, s.static)
    ]
    return measure(prepared, data, num_batches=len(data))


def compare_methods(
    prepared: nn.Module,
    qdata: QuantData,
    ref: list[Any],
    s: Any,
    budget: Budget,
    forward: float,
) -> dict[str, dict[str, Any]]:
    """Every calibration method's metric in torch fake-quant, amax recomputed on a copy of
    ``prepared`` (recomputing the exported model's amax would undo a per-quantizer choice);
    a method whose evaluation no longer fits in the time budget is left out (and said so).
    ``forward``: one FP32 evaluation sample's seconds (the first estimate; then measured)."""
    import qdq

    model = qdq.copy_prepared(prepared)
    out: dict[str, dict[str, Any]] = {}
    each = METHOD_FORWARDS * forward * num_samples(qdata.evaluation)
    for method in CALIBRATION_METHODS:
        if not budget.fits("compare_methods", each):
            budget.skip("compare_methods", method, f"~{each:.1f} s, the budget leaves "
                        f"{max(budget.left() - budget.reserved('compare_methods'), 0):.1f} s")  # fmt: skip
            continue
        start = time.perf_counter()
        qdq.recompute_amax(model, method)
        if s.per_image is not None:
            out[method] = per_image.score_model(model, qdata.evaluation, ref, s.per_image,
                                                f"INT8 {method} (torch)", s.show_progress)  # fmt: skip
        else:
            fq = torch_outputs(
                model,
                qdata.evaluation,
                s.batch_size,
                static=s.static,
                desc=f"INT8 {method} (torch)",
                show=s.show_progress,
                every=qdata.metric is not None,
            )
            out[method] = score(fq, ref, qdata.labels, qdata.metric, qdata.targets)
        each = time.perf_counter() - start
    return out
