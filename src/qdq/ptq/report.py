"""The shared part of the PTQ steps' reports (:class:`StepReport`), apart from the step table
(:mod:`qdq.ptq.step`) so that the steps import it without importing the table that lists them."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

__all__ = ["StepReport"]


class StepReport:
    """The shared part of the PTQ steps' reports (mixed into frozen dataclasses that have
    ``rows`` and ``notes``)."""

    #: the step's key in ``report.json["ptq"]``
    key: ClassVar[str]
    #: the text table: ``(header, cell)`` per column; the first column is left-aligned
    columns: ClassVar[tuple[tuple[str, Callable[[Any], str]], ...]]

    rows: tuple[Any, ...]
    notes: tuple[str, ...]

    def summary(self) -> str:
        """One line: what the step did."""
        raise NotImplementedError

    def fields(self) -> dict[str, Any]:
        """The report-level JSON fields, written before ``rows`` (settings, data used)."""
        return {}

    def flag(self, row: Any) -> str:
        """Text after a row of the table (``""``: none)."""
        return ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable: :meth:`fields`, then ``rows`` and ``notes``."""
        return {
            **self.fields(),
            "rows": [r.to_dict() for r in self.rows],
            "notes": list(self.notes),
        }

    def to_report(self) -> dict[str, Any]:
        """What ``report.json["ptq"][key]`` holds: the summary line and :meth:`to_dict`."""
        return {"summary": self.summary(), **self.to_dict()}

    def to_json(self) -> str:
        """Indented JSON."""
        return json.dumps(self.to_dict(), indent=2)

    def format(self) -> str:
        """The summary line, a table of the rows and the notes."""
        return self._table(self.rows)

    def _table(self, shown: Sequence[Any]) -> str:
        rows = list(shown)
        heads = [h for h, _ in self.columns]
        cells = [[cell(r) for _, cell in self.columns] for r in rows]
        widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(heads)]

        def line(values: Sequence[str]) -> str:
            first = values[0].ljust(widths[0])
            rest = [v.rjust(w) for v, w in zip(values[1:], widths[1:], strict=True)]
            return "  ".join([first, *rest]).rstrip()

        lines = [self.summary(), line(heads)]
        lines += [line(c) + self.flag(r) for c, r in zip(cells, rows, strict=True)]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)
