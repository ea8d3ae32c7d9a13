"""A deadline for the work inside a block, checked where long loops step.

The recipe search of ``qdq quantize`` runs each candidate under the deadline of its time budget
(:mod:`qdq.pipeline.budget`): a candidate that runs past it stops at the next step of its loop
(AdaRound's iterations, bias correction's layers, calibration batches — every loop that shows
progress through :func:`qdq._progress.progress`) with :class:`DeadlinePassed`, and the search
lists it as stopped instead of waiting for it. Outside such a block nothing is checked.

The deadline is a context variable: it holds in the thread (and task) that set it.

Example:
    >>> import time
    >>> with deadline(time.perf_counter() - 1):
    ...     check()
    Traceback (most recent call last):
    ...
    qdq._deadline.DeadlinePassed: the time budget ran out
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar

__all__ = ["DeadlinePassed", "check", "deadline", "left"]

_AT: ContextVar[float | None] = ContextVar("qdq_deadline", default=None)


class DeadlinePassed(RuntimeError):  # noqa: N818 - a condition, named as the user reads it
    """The work ran past its deadline (:func:`deadline`)."""


@contextlib.contextmanager
def deadline(at: float | None) -> Iterator[None]:
    """Inside the block, :func:`check` raises once ``time.perf_counter()`` is past ``at``
    (``None``: no deadline; an enclosing earlier deadline still holds)."""
    outer = _AT.get()
    effective = at if outer is None else outer if at is None else min(at, outer)
    token = _AT.set(effective)
    try:
        yield
    finally:
        _AT.reset(token)


def left() -> float | None:
    """Seconds until the deadline (negative once past it; ``None``: none set)."""
    at = _AT.get()
    return None if at is None else at - time.perf_counter()


def check() -> None:
    """Raise :class:`DeadlinePassed` when the deadline set by :func:`deadline` has passed."""
    at = _AT.get()
    if at is not None and time.perf_counter() > at:
        raise DeadlinePassed("the time budget ran out")
