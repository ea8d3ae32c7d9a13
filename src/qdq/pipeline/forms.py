"""The forms the pipeline's options take, shared by the CLI and the Python API.

Every option of :class:`qdq.pipeline.DataOptions` accepts what ``qdq quantize`` accepts on the command
line, and the Python forms a user would write: an image size as ``64``, ``(64, 96)``, ``"64"``,
``"64,96"`` or ``"64x96"``; a per-channel mean or std as ``0.5``, ``(0.485, 0.456, 0.406)`` or
``"0.485,0.456,0.406"``. Anything else raises a one-line ``ValueError``/``TypeError`` naming the
option and the forms it takes.

Example:
    >>> image_size(64, "image_size"), image_size("64x96", "--image-size")
    ((64, 64), (64, 96))
    >>> per_channel("0.5, 0.25", "mean")
    (0.5, 0.25)
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral, Real

__all__ = ["image_size", "per_channel"]


def image_size(value: object, what: str) -> tuple[int, int]:
    """``(H, W)`` from ``N``, ``(H, W)``, ``"N"``, ``"H,W"`` or ``"HxW"`` (positive ints).

    Raises:
        ValueError: anything else, naming ``what``.
    """
    expects = f"{what} must be N or (H, W) positive ints, or a string 'N', 'H,W' or 'HxW'"
    parts: list[object]
    if isinstance(value, str):
        parts = [p.strip() for p in value.lower().replace("x", ",").split(",")]
        try:
            parts = [int(p) for p in parts]  # type: ignore[call-overload]
        except ValueError:
            raise ValueError(f"{expects}; got {value!r}") from None
    elif isinstance(value, Integral) and not isinstance(value, bool):
        parts = [int(value)]
    elif isinstance(value, Sequence):
        parts = list(value)
    else:
        raise ValueError(f"{expects}; got {value!r}")
    ok = len(parts) in (1, 2) and all(
        isinstance(p, Integral) and not isinstance(p, bool) and int(p) >= 1 for p in parts
    )
    if not ok:
        raise ValueError(f"{expects}; got {value!r}")
    h, w = int(parts[0]), int(parts[-1])  # type: ignore[call-overload]
    return (h, w)


def per_channel(value: object, what: str) -> tuple[float, ...]:
    """One number per channel (or one for all) from a number, a sequence or ``"a,b,c"``.

    Raises:
        ValueError: anything else, naming ``what``.
    """
    expects = f"{what} must be a number, a sequence of numbers or a string 'M' or 'M,M,M'"
    items: list[object]
    if isinstance(value, str):
        try:
            items = [float(v) for v in value.split(",")]
        except ValueError:
            raise ValueError(f"{expects}; got {value!r}") from None
    elif isinstance(value, Real) and not isinstance(value, bool):
        items = [float(value)]
    elif isinstance(value, Sequence) and len(value) > 0:
        items = list(value)
    else:
        raise ValueError(f"{expects}; got {value!r}")
    if not all(isinstance(v, Real) and not isinstance(v, bool) for v in items):
        raise ValueError(f"{expects}; got {value!r}")
    return tuple(float(v) for v in items)  # type: ignore[arg-type]
