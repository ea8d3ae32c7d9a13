"""Small shared validators (no dependencies inside qdq, so anything may import them)."""

from __future__ import annotations

__all__ = ["normalize_axis"]


def normalize_axis(axis: int | None, ndim: int) -> int | None:
    """Return ``axis`` as a non-negative index into a tensor of rank ``ndim`` (or ``None``).

    Raises:
        TypeError: ``axis`` is not an int.
        ValueError: ``axis`` is out of range.

    Example:
        >>> normalize_axis(-1, 4)
        3
    """
    if axis is None:
        return None
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"axis must be an int or None, got {type(axis).__name__}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for a tensor of rank {ndim}")
    return axis % ndim
