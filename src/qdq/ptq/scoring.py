"""The search's default score (:func:`qdq.ptq.search.search`): the output cosine with FP32 per
held-out sample."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from qdq._modes import eval_no_grad
from qdq.calib.batches import expected_inputs, run_batch
from qdq.debug.stats import sample_cosines

__all__ = ["output_cosine"]


def _floats(output: Any) -> list[torch.Tensor]:
    leaves = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor)]
    floats = [t for t in leaves if t.is_floating_point()]
    if not floats:
        raise ValueError("the model's output holds no floating-point tensor to score")
    return floats


def output_cosine(model: nn.Module, held: list[Any]) -> Callable[[nn.Module], torch.Tensor]:
    """``score(prepared)``: per held-out sample, the cosine similarity of each float output
    tensor with the FP32 model's (scale-invariant: :func:`qdq.debug.stats.sample_cosines`),
    averaged over the output tensors (the FP32 outputs computed
    once); one number (the mean over samples, then outputs) when the outputs do not all have one
    row per sample. Every output counts alike, so that a detector's box head weighs as much as
    its class scores."""

    def outputs(m: nn.Module) -> list[list[torch.Tensor]]:
        expected = expected_inputs(m)
        out = []
        with eval_no_grad(m):
            for i, batch in enumerate(held):
                tensors = _floats(run_batch(m, batch, i, expected))
                out.append([t.detach().float().flatten(1) if t.dim() > 1
                            else t.detach().float().reshape(1, -1) for t in tensors])  # fmt: skip
        return out

    reference = outputs(model)

    def cosine(prepared: nn.Module) -> torch.Tensor:
        per_output: list[list[torch.Tensor]] = [[] for _ in reference[0]]
        for got, ref in zip(outputs(prepared), reference, strict=True):
            if len(got) != len(ref):
                raise ValueError(f"{len(got)} float outputs where the FP32 model has {len(ref)}")
            for sims, g, r in zip(per_output, got, ref, strict=True):
                sims.append(sample_cosines(g, r))
        columns = [torch.cat(sims).double().cpu() for sims in per_output]
        if len({len(c) for c in columns}) == 1:  # batch-major outputs: one score per sample
            return torch.stack(columns).mean(0)
        return torch.stack([c.mean() for c in columns]).mean()  # else one number

    return cosine
