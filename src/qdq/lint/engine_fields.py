"""Checked access to the fields of an engine report from someone else (trtexec JSON).

:mod:`qdq.lint.engine_report` reads every field it uses through these getters: a field of the
wrong JSON type, a dimension that is not a 64-bit integer or a time that is not finite, negative
or absurdly large raises :class:`EngineReportError`, one line naming the layer, record or tensor
and the key. Names in messages are quoted with :func:`repr` (control characters escaped) and
clipped.

Example:
    >>> text({"Name": "Conv_0"}, "Name", "layer 0")
    'Conv_0'
    >>> text({"Name": {"a": 1}}, "Name", "layer 0")
    Traceback (most recent call last):
    ...
    qdq.lint.engine_fields.EngineReportError: layer 0: 'Name' must be a string, got an object
"""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "MAX_MS",
    "EngineReportError",
    "array",
    "dims",
    "json_kind",
    "keys",
    "milliseconds",
    "quote",
    "text",
]

#: largest layer time accepted from a profile (ms): a sum over any engine stays finite
MAX_MS = 1e9


class EngineReportError(ValueError):
    """An engine report that cannot be read: not JSON, past a limit of
    :mod:`qdq.lint.untrusted_json`, or a field of the wrong type or range.

    Attributes:
        part: which input is wrong: ``"layers"`` (the layer information), ``"profile"`` or
            ``"metadata"``; :func:`qdq.lint.load_engine_report` prefixes the message with its file.
    """

    def __init__(self, message: str, part: str = "layers") -> None:
        super().__init__(message)
        self.part = part


def json_kind(value: Any) -> str:
    """The JSON type of ``value``, for messages (``"an object"``, ``"null"``, ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    kinds = {
        dict: "an object",
        list: "an array",
        str: "a string",
        int: "a number",
        float: "a number",
    }
    return kinds.get(type(value), type(value).__name__)


def quote(name: str, width: int = 60) -> str:
    """``name`` quoted with its control characters escaped, clipped to ``width`` characters."""
    shown = repr(name)
    return shown if len(shown) <= width else shown[: width - 4] + "...'"


def keys(d: dict[Any, Any], n: int = 8) -> list[str]:
    """The first ``n`` keys of ``d``, sorted and quoted, for messages."""
    return sorted(quote(str(k), 40) for k in d)[:n]


def text(raw: dict[str, Any], key: str, where: str, part: str = "layers") -> str | None:
    """``raw[key]``: a string, or ``None`` when missing or null."""
    value = raw.get(key)
    if value is None or isinstance(value, str):
        return value
    raise EngineReportError(f"{where}: {key!r} must be a string, got {json_kind(value)}", part)


def array(raw: dict[str, Any], key: str, where: str) -> list[Any]:
    """``raw[key]``: an array, or ``[]`` when missing or null."""
    value = raw.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise EngineReportError(f"{where}: {key!r} must be an array, got {json_kind(value)}")
    return value


def milliseconds(rec: dict[str, Any], key: str, where: str) -> float | None:
    """``rec[key]``, a profile time: a finite number in ``[0, MAX_MS]``, or ``None`` when missing
    or null."""
    value = rec.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise EngineReportError(
            f"{where}: {key!r} must be a number, got {json_kind(value)}", "profile"
        )
    if not (math.isfinite(value) and 0 <= value <= MAX_MS):
        raise EngineReportError(
            f"{where}: {key!r} is {str(value)[:30]}; a time must be finite, >= 0 and "
            f"<= {MAX_MS:g} ms",
            "profile",
        )
    return float(value)


def dims(value: Any, where: str) -> tuple[int, ...]:
    """A ``Dimensions`` array: 64-bit integers (``-1`` for a dynamic one); ``()`` when missing."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise EngineReportError(f"{where}: 'Dimensions' must be an array, got {json_kind(value)}")
    for d in value:
        if isinstance(d, bool) or not isinstance(d, int) or not -(2**63) <= d < 2**63:
            shown = quote(str(d), 40) if isinstance(d, (int, float)) else json_kind(d)
            raise EngineReportError(f"{where}: 'Dimensions' must hold 64-bit integers, got {shown}")
    return tuple(value)
