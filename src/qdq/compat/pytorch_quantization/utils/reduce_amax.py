"""``pytorch_quantization.utils.reduce_amax``: the absolute maximum along axes, numpy style."""

from __future__ import annotations

import torch

__all__ = ["reduce_amax"]


def reduce_amax(
    input: torch.Tensor,
    axis: int | tuple[int, ...] | list[int] | None = None,
    keepdims: bool = True,
) -> torch.Tensor:
    """``max(|input|)`` over ``axis`` (all axes when ``None``), without gradient.

    As upstream: ``axis=None`` gives a 0-d tensor whatever ``keepdims``; an int axis follows
    ``torch.max(dim, keepdim)``; a tuple reduces its axes with kept dimensions and then, when
    ``keepdims`` is false or one value is left, squeezes *every* size-1 dimension.

    Args:
        input: a tensor.
        axis: ``None``, an int, or a tuple/list of ints (the axes reduced away).
        keepdims: keep the reduced axes with size 1.

    Raises:
        ValueError: a tuple of more axes than ``input`` has.

    Example:
        >>> x = torch.tensor([[1.0, -3.0], [2.0, 0.5]])
        >>> reduce_amax(x), reduce_amax(x, axis=1, keepdims=False), reduce_amax(x, axis=(0,)).shape
        (tensor(3.), tensor([3., 2.]), torch.Size([1, 2]))
    """
    with torch.no_grad():
        output = input.abs()
        if axis is None:
            return torch.max(output)
        if isinstance(axis, int):
            return torch.max(output, dim=axis, keepdim=keepdims)[0]
        if isinstance(axis, tuple) and len(axis) > input.dim():
            raise ValueError(
                f"Cannot reduce more axes than tensor's dim: axis {axis} for {input.dim()} dims."
            )
        for dim in axis:
            output = torch.max(output, dim=dim, keepdim=True)[0]
        if not keepdims or output.numel() == 1:
            output = output.squeeze()
        return output
