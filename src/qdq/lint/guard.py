"""Run lint steps so that one rule that meets a graph it does not understand cannot take the report
down: its exception becomes an ``L00`` finding on the nodes concerned (with the exception type and
message, and the traceback in the debug log), and the other rules still run."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from qdq.lint.findings import ERROR, Finding

__all__ = ["INTERNAL_RULE", "Guard"]

logger = logging.getLogger("qdq.lint")

INTERNAL_RULE = "L00"
T = TypeVar("T")


class Guard:
    """Call analysis steps, turning their exceptions into ``L00`` findings.

    Args:
        strict: re-raise instead (what the rule modules do when called without a guard, so that
            tests and direct callers see the traceback).

    Example:
        >>> guard = Guard()
        >>> guard.call("demo", ("n1",), lambda: {}["x"], default=[])
        []
        >>> guard.findings[0].rule, guard.findings[0].extra["exception"]
        ('L00', 'KeyError')
    """

    def __init__(self, strict: bool = False) -> None:
        self.strict = strict
        self.findings: list[Finding] = []

    def call(
        self, step: str, nodes: Sequence[str], fn: Callable[..., T], *args: Any, default: T
    ) -> T:
        """``fn(*args)``, or ``default`` (and an ``L00`` finding on ``nodes``) when it raises."""
        try:
            return fn(*args)
        except MemoryError:
            raise
        except Exception as err:
            if self.strict:
                raise
            logger.debug("lint step %r failed on %s", step, list(nodes), exc_info=True)
            self.findings.append(internal_finding(step, nodes, err))
            return default


def internal_finding(step: str, nodes: Sequence[str], err: BaseException) -> Finding:
    """The ``L00`` finding for ``err`` raised by ``step`` on ``nodes``."""
    names = tuple(nodes)
    shown = ", ".join(names[:5]) + (f" (+{len(names) - 5} more)" if len(names) > 5 else "")
    detail = str(err).strip().splitlines()[0] if str(err).strip() else ""
    what = f"{type(err).__name__}: {detail}" if detail else type(err).__name__
    return Finding(
        INTERNAL_RULE,
        ERROR,
        names,
        f"internal: {step} could not analyse {shown or 'the graph'} ({what})",
        "not predicted: the report is incomplete for these nodes",
        "a linter bug or a graph it does not model; please report it with the ONNX file "
        "(`qdq -v lint` prints the traceback)",
        "qdq.lint",
        {"step": step, "exception": type(err).__name__, "detail": detail},
    )
