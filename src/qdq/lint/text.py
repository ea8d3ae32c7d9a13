"""Names from untrusted files, made safe to print and to draw.

An ONNX file or an engine report names its nodes, tensors and layers as its author likes: a name
may hold ESC sequences (clearing the screen, setting the window title, OSC 8 links), carriage
returns that overwrite a line, bidirectional overrides that reorder it, or characters XML 1.0
forbids even escaped. :func:`visible` shows each such character visibly as a Python-style escape
(``\\x1b``, ``\\u202e``), so that what ``qdq`` prints or draws is what the file says, never what
it would make a terminal or an SVG viewer do; :func:`printable` (one name, nothing kept) and
:func:`printable_text` (a multi-line text) are its two common uses. JSON output needs none of
this (``json.dumps`` escapes control characters itself).

Example:
    >>> print(visible("Conv_0\\x1b[2J + <Relu>"))
    Conv_0\\x1b[2J + <Relu>
    >>> visible("a\\nb"), visible("a\\nb", keep="")
    ('a\\nb', 'a\\\\x0ab')
"""

from __future__ import annotations

import re

__all__ = ["UNSAFE_CHARACTERS", "printable", "printable_text", "visible"]

#: C0 controls, DEL and C1 controls (terminal escapes; XML 1.0 forbids most C0), the
#: bidirectional marks, embeddings, overrides and isolates (text that reads other than it is
#: stored), the line/paragraph separators, the BOM, lone surrogates (from a file decoded with
#: surrogateescape: not encodable) and the non-characters XML 1.0 cannot carry (U+FFFE, U+FFFF)
UNSAFE_CHARACTERS = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029\ufeff"
    "\ud800-\udfff\ufffe\uffff]"
)


def visible(text: str, *, keep: str = "\n\t") -> str:
    """``text`` with each unsafe character (:data:`UNSAFE_CHARACTERS`) but those in ``keep``
    written as a visible escape: ``\\xNN`` below U+0100, else ``\\uNNNN``."""
    return UNSAFE_CHARACTERS.sub(lambda m: _escape(m.group(), keep), text)


def printable(name: object) -> str:
    """``name`` as one line of text with every unsafe character escaped visibly (newlines and
    tabs too: a name must not fake a line of the report).

    Use it on anything read from a file before it is printed on a terminal or drawn (node,
    tensor and layer names, paths from a report). Ordinary text, Unicode letters included, is
    unchanged.

    Example:
        >>> printable("conv\\x1b]0;owned\\x07")
        'conv\\\\x1b]0;owned\\\\x07'
        >>> printable("résumé/Conv_1")
        'résumé/Conv_1'
    """
    return visible(str(name), keep="")


def printable_text(text: str) -> str:
    """A multi-line text with the same characters escaped as :func:`printable`, newlines kept.

    For a whole report assembled from names (each already escaped where it could hold a newline
    that would fake a line): a last guard before the terminal.

    Example:
        >>> print(printable_text("a\\x1b[2J\\nb"))
        a\\x1b[2J
        b
    """
    return visible(text, keep="\n")


def _escape(ch: str, keep: str) -> str:
    if ch in keep:
        return ch
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
