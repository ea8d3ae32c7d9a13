"""Degenerate FP32 outputs: when the float model's own outputs make every INT8 figure meaningless.

``qdq quantize`` compares INT8 with FP32. When FP32's outputs carry no information, every figure
of that comparison — the headline, the agreement, the cosine, the relative error — is noise: a
model whose logits underflow to about 1e-41 (a 0.02-std initialisation through eval-mode
BatchNorms) still "agrees on top-1" for some fraction of the samples. Each output tensor of the
FP32 evaluation outputs (the very tensors the figures are computed from, so the check costs no
forward pass) is checked for:

* ``non_finite`` — any NaN or infinite value;
* ``underflow`` — its largest ``|value|`` over every evaluation sample is below float16's
  smallest normal number, ``2**-14`` (about 6.1e-5; :data:`FLOAT16_TINY`): below it float16
  has only subnormals (fewer significant bits, 0 below about 6e-8), so an FP16 engine cannot
  carry the values, and the model's activations have vanished on the way;
* ``constant`` — with at least two samples, every element's spread over the samples
  (``max − min``) is at most :data:`CONSTANT_TOLERANCE` times the largest ``|value|``: the model
  ignores its input.

Example:
    >>> import torch
    >>> found = degenerate_outputs([torch.full((4, 10), 1e-41), torch.randn(4, 3)])
    >>> [(d.output, d.problem) for d in found]
    [(0, 'underflow'), (0, 'constant')]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

__all__ = ["CONSTANT_TOLERANCE", "FLOAT16_TINY", "Degenerate", "degenerate_outputs", "warning"]

#: float16's smallest normal number (``2**-14``, about 6.1e-5)
FLOAT16_TINY = 2.0**-14
#: an output whose spread over the samples is at most this share of its largest |value| is constant
CONSTANT_TOLERANCE = 1e-6


@dataclass(frozen=True)
class Degenerate:
    """One problem of one FP32 output tensor (``report.json: fp32.degenerate``).

    Attributes:
        output: the output's index (pytree order).
        name: its pytree path (``output[0]``), or ``output N``.
        problem: ``"non_finite"``, ``"underflow"`` or ``"constant"``.
        detail: the measurement, in words.
    """

    output: int
    name: str
    problem: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable."""
        return asdict(self)


def degenerate_outputs(
    references: Sequence[torch.Tensor], names: Sequence[str | None] | None = None
) -> list[Degenerate]:
    """Every problem of FP32's output tensors (samples along dimension 0; module docstring),
    output by output; an empty list when there is none."""
    found = []
    for i, ref in enumerate(references):
        name = (names[i] if names is not None and i < len(names) else None) or f"output {i}"
        if ref.numel() == 0:
            continue
        x = ref.detach().double()
        bad = int((~torch.isfinite(x)).sum())
        if bad:
            found.append(Degenerate(i, name, "non_finite",
                                    f"{bad} of {x.numel()} values are NaN or infinite"))  # fmt: skip
            continue  # the other checks need finite values
        largest = float(x.abs().max())
        if largest < FLOAT16_TINY:
            detail = (
                "every value is 0"
                if largest == 0
                else f"its largest |value| is {largest:.3g}, below float16's smallest normal "
                f"number 2^-14 = {FLOAT16_TINY:.2g}"
            )
            found.append(Degenerate(i, name, "underflow", detail))
        if len(x) >= 2:
            spread = float((x.amax(dim=0) - x.amin(dim=0)).max())
            if spread <= CONSTANT_TOLERANCE * largest:
                found.append(Degenerate(i, name, "constant", f"the same for all {len(x)} "
                                        f"evaluation samples (largest spread {spread:.3g})"))  # fmt: skip
    return found


def warning(found: Degenerate, headline: bool, metric: str) -> str:
    """The warning of one problem; ``headline``: whether the headline metric (``metric``)
    scores this output."""
    what = (
        f"the INT8 figures (the headline {metric}, the agreement, the cosine) mean nothing"
        if headline
        else "its INT8 figures in the outputs table mean nothing"
    )
    return (
        f"the FP32 model is degenerate: {found.name} {_PROBLEMS[found.problem]}: {found.detail}. "
        f"So {what}; fix the float model first (its weights or initialisation, its BatchNorm "
        "statistics, the data's preprocessing)"
    )


_PROBLEMS = {
    "non_finite": "is not finite",
    "underflow": "underflows",
    "constant": "does not depend on the input",
}
