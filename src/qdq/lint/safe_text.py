"""Text from someone else's file (layer and node names), made safe to print, draw and embed.

A name in an engine report or an ONNX model is arbitrary text: printed raw, ``"\\x1b[2J"`` clears
the user's terminal and ``"\\x1b]0;...\\x07"`` sets its title; in an SVG, a control character
makes the document ill-formed XML. :func:`visible` writes every such character as a visible
escape (``\\x1b``, ``\\u202e``) and leaves the rest alone.

Example:
    >>> print(visible("Conv_0\\x1b[2J + <Relu>"))
    Conv_0\\x1b[2J + <Relu>
    >>> visible("a\\nb"), visible("a\\nb", keep="")
    ('a\\nb', 'a\\\\x0ab')
"""

from __future__ import annotations

import re

__all__ = ["UNSAFE_CHARACTERS", "visible"]

#: C0 controls, DEL and C1 controls (terminal escapes; XML 1.0 forbids most C0), bidirectional
#: overrides and isolates (text that reads other than it is stored), lone surrogates (not
#: encodable) and the non-characters U+FFFE/U+FFFF (forbidden in XML)
UNSAFE_CHARACTERS = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff\ufffe\uffff]"
)


def visible(text: str, *, keep: str = "\n\t") -> str:
    """``text`` with each unsafe character (:data:`UNSAFE_CHARACTERS`) but those in ``keep``
    written as a visible escape: ``\\xNN`` below U+0100, else ``\\uNNNN``."""
    return UNSAFE_CHARACTERS.sub(lambda m: _escape(m.group(), keep), text)


def _escape(ch: str, keep: str) -> str:
    if ch in keep:
        return ch
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
