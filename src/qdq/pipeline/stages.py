"""The stages of ``qdq quantize``: each timed, reported to a callback, and — for the stages after
the INT8 measurement — unable to fail the job (:meth:`Stages.optional`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from qdq.pipeline.report import stage_error

__all__ = ["OptionalStage", "Stage", "StageCallback", "Stages"]

#: ``on_stage(name, seconds, detail)`` after every stage
StageCallback = Callable[[str, float, str], None]


class Stages:
    """Times stages: ``with stages("name") as st: ...; st.detail = "..."``.

    ``stages.optional("name")`` is a stage that cannot fail the job: an exception in it is
    recorded in :attr:`errors` (stage, error type, message) and swallowed; the callback gets the
    stage with a ``FAILED (...)`` detail.
    """

    def __init__(self, callback: StageCallback | None) -> None:
        self.callback = callback
        self.timings: dict[str, float] = {}
        self.errors: list[dict[str, str]] = []

    def __call__(self, name: str) -> Stage:
        return Stage(self, name)

    def optional(self, name: str) -> OptionalStage:
        """A stage whose failure is recorded, not raised (see the class docstring)."""
        return OptionalStage(self, name)


class Stage:
    def __init__(self, owner: Stages, name: str) -> None:
        self.owner, self.name, self.detail, self.start = owner, name, "", 0.0

    def __enter__(self) -> Stage:
        self.start = time.perf_counter()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._finish(exc_type, exc, optional=False)

    def _finish(self, exc_type: Any, exc: Any, *, optional: bool) -> bool:
        """Time the stage, record a swallowed failure, call back; whether to swallow ``exc``."""
        seconds = time.perf_counter() - self.start
        self.owner.timings[self.name] = round(seconds, 3)
        failed = exc_type is not None and optional and issubclass(exc_type, Exception)
        if failed:
            entry = stage_error(self.name, exc)
            self.owner.errors.append(entry)
            self.detail = f"FAILED ({entry['error']}: {entry['message'][:160]}); recorded in report"
        if (exc_type is None or failed) and self.owner.callback is not None:
            self.owner.callback(self.name, seconds, self.detail)
        return failed


class OptionalStage(Stage):
    """A stage whose exception is recorded and swallowed (:meth:`Stages.optional`)."""

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:  # type: ignore[override]
        return self._finish(exc_type, exc, optional=True)
