"""``pytorch_quantization.nn.modules.clip``: the :class:`Clip` module (learnable bounds)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from qdq.compat.pytorch_quantization.nn import functional as qf

__all__ = ["Clip"]


def _learnable(value: object) -> nn.Parameter:
    # as upstream: a float, or a numpy value of size 1 (a 0-d array, np.float32(...)); tensors,
    # even one-element ones, are refused
    number = isinstance(value, (float, int)) and not isinstance(value, bool)
    if not number and not (isinstance(value, (np.ndarray, np.generic)) and value.size == 1):
        raise ValueError(
            "clip_value_min/clip_value_max must be scalar for initializing learnable range "
            f"(a float), got {type(value).__name__}."
        )
    return nn.Parameter(torch.tensor(float(value) if isinstance(value, int) else value))


class Clip(nn.Module):
    """Clip to ``[clip_value_min, clip_value_max]`` with :func:`~..functional.clip`.

    Args:
        clip_value_min, clip_value_max: the bounds: tensors (broadcast to the input) or, when
            learned, floats.
        learn_min, learn_max: make that bound an ``nn.Parameter`` initialized from the float
            (state_dict keys ``clip_value_min``/``clip_value_max``).

    Raises:
        ValueError: a learned bound that is not a float (or one-element ndarray).

    Example:
        >>> Clip(0.0, 6.0, learn_max=True)(torch.tensor([-1.0, 7.0]))
        tensor([0., 6.], grad_fn=<ClipFunctionBackward>)
    """

    def __init__(
        self,
        clip_value_min: torch.Tensor | float,
        clip_value_max: torch.Tensor | float,
        learn_min: bool = False,
        learn_max: bool = False,
    ) -> None:
        super().__init__()
        self.clip_value_min = _learnable(clip_value_min) if learn_min else clip_value_min
        self.clip_value_max = _learnable(clip_value_max) if learn_max else clip_value_max

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return qf.clip(inputs, self.clip_value_min, self.clip_value_max)
