"""Names from untrusted files, made safe to print and to draw.

An ONNX file or an engine report names its nodes, tensors and layers as its author likes: a name
may hold ESC sequences (clearing the screen, setting the window title, OSC 8 links), carriage
returns that overwrite a line, bidirectional overrides that reorder it, or characters XML 1.0
forbids even escaped. :func:`printable` shows each such character visibly as a Python-style
escape (``\\x1b``, ``\\u202e``), so that what ``qdq`` prints or draws is what the file says,
never what it would make a terminal or an SVG viewer do. JSON output needs none of this
(``json.dumps`` escapes control characters itself).
"""

from __future__ import annotations

import re

__all__ = ["printable", "printable_text"]

#: C0 controls (tab and newline included), DEL, C1 controls, the bidirectional embeddings,
#: overrides and isolates, the line/paragraph separators, the BOM and the non-characters XML 1.0
#: cannot carry (U+FFFE, U+FFFF), and lone surrogates (from a file decoded with surrogateescape)
_OTHERS = "\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029\ufeff\ufffe\uffff\ud800-\udfff"
_UNSAFE = re.compile(f"[\x00-\x1f\x7f-\x9f{_OTHERS}]")
_UNSAFE_KEEP_NEWLINE = re.compile(f"[\x00-\x09\x0b-\x1f\x7f-\x9f{_OTHERS}]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(name: object) -> str:
    """``name`` as text with every control or invisible-reordering character escaped visibly.

    Use it on anything read from a file before it is printed on a terminal or drawn (node,
    tensor and layer names, paths from a report). Ordinary text, Unicode letters included, is
    unchanged.

    Example:
        >>> printable("conv\\x1b]0;owned\\x07")
        'conv\\\\x1b]0;owned\\\\x07'
        >>> printable("résumé/Conv_1")
        'résumé/Conv_1'
    """
    return _UNSAFE.sub(_escape, str(name))


def printable_text(text: str) -> str:
    """A multi-line text with the same characters escaped as :func:`printable`, newlines kept.

    For a whole report assembled from names (each already escaped where it could hold a newline
    that would fake a line): a last guard before the terminal.

    Example:
        >>> print(printable_text("a\\x1b[2J\\nb"))
        a\\x1b[2J
        b
    """
    return _UNSAFE_KEEP_NEWLINE.sub(_escape, text)
