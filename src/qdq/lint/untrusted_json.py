"""Read JSON that comes from someone else (engine reports, ``report.json``, manifests) with limits.

:func:`load_json` and :func:`parse_json` accept only what a well-formed report can hold, and say
in one line what is wrong otherwise, as :class:`UntrustedJSONError` (a ``ValueError``):

* a file larger than ``max_bytes`` (default :data:`MAX_BYTES`) is refused before it is read;
* text must be UTF-8 (a byte-order mark is allowed);
* nesting deeper than ``max_depth`` (default :data:`MAX_DEPTH`) is refused before parsing, so a
  file of ``[[[[...`` cannot exhaust the interpreter's stack (``RecursionError``);
* ``NaN``, ``Infinity`` and ``-Infinity`` are refused (they are not JSON), as are numbers a float
  cannot hold (``1e999``) and integers of more than :data:`MAX_INT_DIGITS` digits.

What the decoded value must look like is the caller's business (check types before use).

Example:
    >>> parse_json('{"a": [1, 2.5]}')
    {'a': [1, 2.5]}
    >>> parse_json("[[[1]]]", "x.json", max_depth=2)
    Traceback (most recent call last):
    ...
    qdq.lint.untrusted_json.UntrustedJSONError: x.json nests deeper than 2 levels (3 found)
    >>> parse_json('{"t": NaN}', "p.json")
    Traceback (most recent call last):
    ...
    qdq.lint.untrusted_json.UntrustedJSONError: p.json is not valid JSON: NaN is not a JSON number
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "UntrustedJSONError",
    "json_depth",
    "load_json",
    "parse_json",
]

#: largest JSON file read by default (engine reports of large networks are tens of MB)
MAX_BYTES = 256 * 2**20
#: deepest nesting of arrays and objects accepted by default (engine reports nest 5 levels)
MAX_DEPTH = 64
#: longest integer accepted (in digits)
MAX_INT_DIGITS = 64

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_CHUNK = 1 << 20
#: the nesting step of each byte of a skeleton of brackets
_STEP = np.zeros(256, dtype=np.int64)
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1


class UntrustedJSONError(ValueError):
    """A JSON input that is too large, too deep, not UTF-8 or not JSON.

    Attributes:
        what: the input, as named in the message (``"profile JSON /x/p.json"``).
        reason: what is wrong with it, without the name.
    """

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"{what} {reason}")
        self.what = what
        self.reason = reason


def load_json(
    path: str | Path,
    what: str = "JSON",
    *,
    max_bytes: int = MAX_BYTES,
    max_depth: int = MAX_DEPTH,
) -> Any:
    """The decoded content of the JSON file ``path``, read within the limits of the module.

    Args:
        path: the file.
        what: how messages name it (followed by the path): ``"profile JSON"``.
        max_bytes: larger files are refused before they are read.
        max_depth: deeper nesting is refused before it is parsed.

    Raises:
        FileNotFoundError: ``path`` is not a file.
        UntrustedJSONError: the file breaks a limit or is not JSON.
        OSError: it cannot be read.
    """
    p = Path(path)
    name = f"{what} {p}"
    if not p.is_file():
        raise FileNotFoundError(f"no {what} file at {p}")
    size = p.stat().st_size
    if size > max_bytes:
        raise UntrustedJSONError(name, f"is {size} bytes, more than the {max_bytes} accepted")
    with p.open("rb") as fh:
        data = fh.read(max_bytes + 1)  # the file may have grown since stat
    if len(data) > max_bytes:
        raise UntrustedJSONError(name, f"is more than the {max_bytes} bytes accepted")
    return parse_json(data, name, max_depth=max_depth)


def parse_json(
    text: str | bytes,
    what: str = "JSON",
    *,
    max_depth: int = MAX_DEPTH,
    nonfinite: bool = False,
) -> Any:
    """Decode JSON ``text`` (``bytes``: UTF-8) within the limits of the module; ``nonfinite``
    accepts Python's ``NaN``/``Infinity`` (which qdq's own manifests write for an infinite gain).

    Raises:
        UntrustedJSONError: ``text`` breaks a limit or is not JSON; ``what`` names it.
    """
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8-sig")
        except UnicodeDecodeError as err:
            raise UntrustedJSONError(
                what, f"is not valid JSON: not UTF-8 text (byte 0x{text[err.start]:02x} at offset "
                f"{err.start})"
            ) from None  # fmt: skip
    elif text.startswith("\ufeff"):
        text = text[1:]
    depth = json_depth(text)
    if depth > max_depth:
        raise UntrustedJSONError(what, f"nests deeper than {max_depth} levels ({depth} found)")
    try:
        if nonfinite:
            return json.loads(text, parse_int=_int)
        return json.loads(text, parse_constant=_no_constant, parse_float=_float, parse_int=_int)
    except _BadNumberError as err:
        raise UntrustedJSONError(what, f"is not valid JSON: {err}") from None
    except json.JSONDecodeError as err:
        raise UntrustedJSONError(what, f"is not valid JSON: {err}") from None
    except RecursionError:  # json_depth bounds the nesting; a smaller stack than expected
        raise UntrustedJSONError(what, "nests too deeply to be parsed") from None


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in JSON ``text`` (brackets inside strings do not
    count), in one linear pass in bounded memory; exact for valid JSON (and for the prefix that a
    parser reads before it finds an error).

    Example:
        >>> json_depth('{"a": [1, "[[["], "b": {}}'), json_depth("3")
        (2, 0)
    """
    skeleton = _NOT_BRACKET.sub("", _STRING.sub("", text)).encode("ascii")
    depth = level = 0
    for start in range(0, len(skeleton), _CHUNK):
        chunk = np.frombuffer(skeleton, np.uint8, min(_CHUNK, len(skeleton) - start), start)
        levels = np.cumsum(_STEP[chunk]) + level
        depth, level = max(depth, int(levels.max())), int(levels[-1])
    return depth


class _BadNumberError(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise _BadNumberError(f"{name} is not a JSON number")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _BadNumberError(f"the number {text[:40]} is out of range")
    return value


def _int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise _BadNumberError(f"an integer of {digits} digits (at most {MAX_INT_DIGITS} accepted)")
    return int(text)
