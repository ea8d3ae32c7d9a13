"""The HTML report of ``qdq quantize``: one self-contained file that opens offline.

:func:`render_html` turns the content of ``report.json`` (:mod:`qdq.pipeline.report`) into a page
(jinja2 template, inline CSS and JavaScript, matplotlib plots and the Graphviz drawing as inline
SVG; nothing is fetched). :func:`write_html` also draws the model from its ONNX file.
Needs the ``report`` extra (``pip install 'qdq[report]'``: jinja2, matplotlib); the drawing needs
Graphviz ``dot`` and is replaced by a note without it.
"""

from __future__ import annotations

from qdq.report.html import check_dependencies, render_html, write_html

__all__ = ["check_dependencies", "render_html", "write_html"]
