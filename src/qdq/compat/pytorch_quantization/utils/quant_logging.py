"""``pytorch_quantization.utils.quant_logging``: undo libraries that take over the root logger."""

from __future__ import annotations

import logging

__all__ = ["reset_logger_handler"]


def reset_logger_handler() -> None:
    """Remove every handler of the root logger (so ``logging.basicConfig`` works again)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
