"""``pytorch_quantization.nn.functional``: :func:`clip` with broadcast bounds and PACT gradients."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch.autograd import Function

__all__ = ["ClipFunction", "clip"]

_log = logging.getLogger("pytorch_quantization")
_warned_learning = False


class ClipFunction(Function):
    """``max(min(x, clip_max), clip_min)`` with tensor bounds broadcast to ``x``.

    Gradients as PACT (arXiv:1805.06085) and TensorFlow's ``clip_by_value``: ``x`` gets the
    gradient strictly inside ``(clip_min, clip_max)``; a bound that requires grad gets the sum of
    the gradient of the elements clipped to it (a one-element bound only).
    """

    @staticmethod
    def forward(
        ctx: Any,
        input: torch.Tensor,
        clip_value_min: torch.Tensor,
        clip_value_max: torch.Tensor,
    ) -> torch.Tensor:
        ctx.save_for_backward(input, clip_value_min, clip_value_max)
        return torch.max(torch.min(input, clip_value_max), clip_value_min)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        global _warned_learning
        input, clip_value_min, clip_value_max = ctx.saved_tensors
        above_min = (input > clip_value_min).to(grad_output.dtype)
        below_max = (input < clip_value_max).to(grad_output.dtype)
        grad_input = grad_output * above_min * below_max
        learn_min, learn_max = ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        if (learn_min or learn_max) and not _warned_learning:
            _log.warning("Learning clip min/max is experimental, use at your own risk :).")
            _warned_learning = True
        if (learn_min and clip_value_min.numel() != 1) or (
            learn_max and clip_value_max.numel() != 1
        ):
            raise ValueError(
                f"Learnable min/max can only be scalar, got size {clip_value_min.size()} and "
                f"{clip_value_max.size()}."
            )
        # in the bound's dtype (autocast may have made the sum float32)
        grad_min = (
            (grad_output * (1.0 - above_min)).sum().to(clip_value_min.dtype) if learn_min else None
        )
        grad_max = (
            (grad_output * (1.0 - below_max)).sum().to(clip_value_min.dtype) if learn_max else None
        )
        return grad_input, grad_min, grad_max


def _as_bound(value: torch.Tensor | float, like: torch.Tensor) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    return torch.tensor(value, dtype=like.dtype, device=like.device)


def clip(
    input: torch.Tensor,
    clip_value_min: torch.Tensor | float,
    clip_value_max: torch.Tensor | float,
) -> torch.Tensor:
    """Clip ``input`` to ``[clip_value_min, clip_value_max]``; bounds broadcast (unlike clamp).

    Args:
        input: a tensor.
        clip_value_min, clip_value_max: tensors broadcastable to ``input`` (or numbers). A bound
            that requires grad must have one element; it learns the gradient of what it clipped.

    Raises:
        ValueError: in backward, a bound that requires grad has more than one element.

    Example:
        >>> clip(torch.tensor([-1.0, 0.5, 2.0]), torch.tensor(0.0), torch.tensor(1.0))
        tensor([0.0000, 0.5000, 1.0000])
    """
    out: torch.Tensor = ClipFunction.apply(
        input, _as_bound(clip_value_min, input), _as_bound(clip_value_max, input)
    )
    return out
