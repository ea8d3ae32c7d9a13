"""Progress bars for long loops: tqdm when installed (auto-off when not a terminal), else logging."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import TypeVar

__all__ = ["progress"]

T = TypeVar("T")
_log = logging.getLogger("qdq")


def progress(
    items: Iterable[T], *, total: int | None, desc: str, enabled: bool = True
) -> Iterator[T]:
    """Yield ``items`` while showing progress (``enabled=False`` for silence)."""
    if enabled:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            pass
        else:
            yield from tqdm(items, total=total, desc=desc, leave=False, disable=None)
            return
    for i, item in enumerate(items):
        if enabled and total and (i + 1) % max(1, total // 10) == 0:
            _log.info("%s: %d/%d", desc, i + 1, total)
        yield item
