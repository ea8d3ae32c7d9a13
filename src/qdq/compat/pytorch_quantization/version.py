"""``pytorch_quantization.version``: the version of the package this layer mirrors."""

from __future__ import annotations

__all__ = ["__version__"]

#: upstream's release whose API this is, with qdq's local tag (PEP 440: compares as 2.2.1).
__version__ = "2.2.1+qdq"
