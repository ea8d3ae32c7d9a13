"""Progress bars for long loops: tqdm when installed (auto-off when not a terminal), else logging.

Every step of such a loop is also where a deadline set by :func:`qdq._deadline.deadline` is
checked (:class:`qdq._deadline.DeadlinePassed`), bars shown or not.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import TypeVar

from qdq._deadline import check

__all__ = ["progress"]

T = TypeVar("T")
_log = logging.getLogger("qdq")


def progress(
    items: Iterable[T], *, total: int | None, desc: str, enabled: bool = True
) -> Iterator[T]:
    """Yield ``items`` while showing progress (``enabled=False`` for silence); a deadline
    (:mod:`qdq._deadline`) is checked before each item."""
    if enabled:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            pass
        else:
            for item in tqdm(items, total=total, desc=desc, leave=False, disable=None):
                check()
                yield item
            return
    for i, item in enumerate(items):
        check()
        if enabled and total and (i + 1) % max(1, total // 10) == 0:
            _log.info("%s: %d/%d", desc, i + 1, total)
        yield item
