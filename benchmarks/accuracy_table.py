"""Rows, tables and files of ``benchmarks/accuracy.py`` (standard library and numpy only).

The peer script (``benchmarks/peers/accuracy_peers.py``) runs in another virtual environment and
imports this module too, for the calibration ``.npz`` and the row format it hands back.

Example:
    >>> row = Row("qdq", "mse", "full", metric=0.9210, fp32_metric=0.9220, cosine=0.9998,
    ...           int8_layers=10, weighted_layers=10, lint="PASS", calib_s=1.5, calib_x=15.0)
    >>> round(row.drop_pt, 2)
    0.1
    >>> row.label
    'qdq mse [full]'
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

__all__ = [
    "CALIB_KEY",
    "REPEAT_BELOW_S",
    "Row",
    "compare",
    "format_table",
    "read_calib",
    "row_from_dict",
    "timed",
    "write_calib",
]

T = TypeVar("T")

#: the array name in ``calib.npz`` when the input name is not known
CALIB_KEY = "input"

#: a step faster than this is run twice and timed by the faster run (shared-CPU noise)
REPEAT_BELOW_S = 30.0

#: display names of the tools
TOOLS = {
    "fp32": "FP32",
    "qdq": "qdq",
    "ort": "ORT quantize_static",
    "modelopt-torch": "ModelOpt torch",
    "modelopt-onnx": "ModelOpt ONNX",
}


@dataclass
class Row:
    """One ONNX model of the benchmark: how it was made and what it scored.

    Attributes:
        tool: a key of :data:`TOOLS`.
        method: the calibration method as the tool names it (``mse``, ``MinMax``, ``max`` ...).
        placement: ``default``/``full`` for qdq, the configuration for a peer.
        onnx: the ONNX file (``None`` when the row did not run).
        note: why the row did not run (``"not run: ..."``), or a remark.
        calib_s: wall seconds of the tool's calibration step (see the benchmark's docstring).
        calib_x: ``calib_s`` divided by one FP32 forward pass over the same calibration set,
            measured in the same process.
        export_s: wall seconds of a separate export step (``None`` when calibration writes the
            ONNX itself).
        metric / fp32_metric: the zoo metric of this ONNX and of the FP32 ONNX (fractions).
        cosine / cosine_min: mean and minimum per-sample output cosine with FP32.
        int8_layers / weighted_layers: the linter's predicted INT8 weighted layers, of all.
        lint: the linter's verdict; ``lint_rules`` the rule ids of its warnings and errors;
            ``lint_summary`` its summary (coverage, INT8 FLOPs, unfused Q/DQ, float islands ...);
            ``float_layers`` the weighted ONNX nodes it predicts to run float.
        figures: every figure of a task metric (e.g. RPA at 10 and 25 cents), when it has one.
    """

    tool: str
    method: str
    placement: str
    onnx: str | None = None
    note: str = ""
    calib_s: float | None = None
    calib_x: float | None = None
    export_s: float | None = None
    metric: float | None = None
    fp32_metric: float | None = None
    cosine: float | None = None
    cosine_min: float | None = None
    int8_layers: int | None = None
    weighted_layers: int | None = None
    lint: str | None = None
    lint_rules: list[str] = field(default_factory=list)
    lint_summary: dict[str, int] = field(default_factory=dict)
    float_layers: list[str] = field(default_factory=list)
    figures: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """``"qdq mse [full]"``, ``"ORT quantize_static Entropy [TensorRT-style]"``, ``"FP32"``."""
        if self.tool == "fp32":
            return "FP32"
        return f"{TOOLS.get(self.tool, self.tool)} {self.method} [{self.placement}]"

    @property
    def ran(self) -> bool:
        """Whether the row has a metric."""
        return self.metric is not None

    @property
    def drop_pt(self) -> float | None:
        """FP32 metric minus this metric, in percentage points (positive: worse than FP32)."""
        if self.metric is None or self.fp32_metric is None:
            return None
        return 100.0 * (self.fp32_metric - self.metric)

    @property
    def coverage(self) -> str:
        """``"10/10"`` (INT8 weighted layers / weighted layers) or ``"-"``."""
        if self.int8_layers is None or self.weighted_layers is None:
            return "-"
        return f"{self.int8_layers}/{self.weighted_layers}"

    def to_dict(self) -> dict[str, Any]:
        """The fields plus ``label``, ``drop_pt`` and ``coverage``."""
        return {
            **asdict(self),
            "label": self.label,
            "drop_pt": self.drop_pt,
            "coverage": self.coverage,
        }


def timed(step: Callable[[], T]) -> tuple[T, float]:
    """``(result, seconds)`` of ``step()``; a step under :data:`REPEAT_BELOW_S` runs twice and
    the faster run counts (the second run's result is returned)."""
    start = time.perf_counter()
    result = step()
    seconds = time.perf_counter() - start
    if seconds < REPEAT_BELOW_S:
        start = time.perf_counter()
        result = step()
        seconds = min(seconds, time.perf_counter() - start)
    return result, seconds


def row_from_dict(data: dict[str, Any]) -> Row:
    """The :class:`Row` of :meth:`Row.to_dict` (derived keys are ignored).

    Raises:
        ValueError: a required key (``tool``, ``method``, ``placement``) is missing.
    """
    missing = [k for k in ("tool", "method", "placement") if k not in data]
    if missing:
        raise ValueError(f"row {data!r} lacks {missing}")
    names = set(Row.__dataclass_fields__)
    return Row(**{k: v for k, v in data.items() if k in names})


def write_calib(path: Path, name: str, array: np.ndarray) -> None:
    """Save the calibration array under the ONNX input ``name`` (float32, C order)."""
    arrays = {name: np.ascontiguousarray(array, dtype=np.float32)}
    np.savez(path, **arrays)  # type: ignore[arg-type]  # numpy's stubs type the keywords


def read_calib(path: Path) -> tuple[str, np.ndarray]:
    """``(input name, array)`` of a ``calib.npz`` written by :func:`write_calib`.

    Raises:
        ValueError: the file holds no array or more than one.
    """
    with np.load(path) as data:
        names = list(data.files)
        if len(names) != 1:
            raise ValueError(f"{path} must hold one array (the model input), found {names}")
        return names[0], data[names[0]]


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def format_table(title: str, metric_name: str, rows: list[Row]) -> str:
    """A fixed-width table: variant, metric, drop, cosine, INT8 coverage, lint, times."""
    head = (
        "variant",
        metric_name,
        "drop pt",
        "cos mean",
        "cos min",
        "INT8",
        "lint",
        "calib s",
        "x FP32",
        "export s",
    )
    body: list[tuple[str, ...]] = []
    for r in rows:
        if not r.ran:
            body.append((r.label, r.note or "not run"))
            continue
        body.append(
            (
                r.label,
                _num(None if r.metric is None else 100 * r.metric, ".2f"),
                "-" if r.tool == "fp32" else _num(r.drop_pt, "+.2f"),
                _num(r.cosine, ".5f"),
                _num(r.cosine_min, ".4f"),
                r.coverage,
                "-" if r.tool == "fp32" else " ".join([r.lint or "-", *r.lint_rules]),
                _num(r.calib_s, ".2f"),
                _num(r.calib_x, ".1f"),
                _num(r.export_s, ".2f"),
            )
        )
    full = [b for b in body if len(b) == len(head)]
    widths = [max(len(str(x[i])) for x in [head, *full]) for i in range(len(head))]
    lines = [title, "  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(
        zip(head, widths, strict=True)))]  # fmt: skip
    lines.append("-" * len(lines[-1]))
    for b in body:
        if len(b) == len(head):
            cells = [str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in
                     enumerate(zip(b, widths, strict=True))]  # fmt: skip
            lines.append("  ".join(cells))
        else:
            lines.append(f"{b[0].ljust(widths[0])}  {b[1]}")
    with_figures = [r for r in rows if r.ran and r.figures]
    if with_figures:
        lines.append("task metric figures:")
        for r in with_figures:
            figures = ", ".join(f"{k} {v:.4g}" for k, v in r.figures.items())
            lines.append(f"  {r.label.ljust(widths[0])}  {figures}")
    notes = [f"  {r.label}: {r.note}" for r in rows if r.ran and r.note]
    if notes:
        lines.append("notes:")
        lines.extend(notes)
    return "\n".join(lines)


def compare(rows: list[Row], default_method: str = "mse") -> list[str]:
    """For every peer row, qdq's drop at the same INT8 coverage (its default method, its best).

    The verdict is ``ok`` when qdq's default method drops no more than the peer (a 0.005 pt
    tolerance for rounding), ``LOSES`` otherwise, followed by both mean output cosines; ``no qdq
    row at this coverage`` when no qdq row has the peer's coverage.
    """
    qdq = [r for r in rows if r.tool == "qdq" and r.ran and r.drop_pt is not None]
    out = []
    for peer in rows:
        if peer.tool in ("fp32", "qdq") or not peer.ran or peer.drop_pt is None:
            continue
        same = [r for r in qdq if r.int8_layers == peer.int8_layers]
        head = f"{peer.label} ({peer.coverage}): drop {peer.drop_pt:+.2f} pt"
        if not same:
            out.append(f"{head}; no qdq row at this coverage")
            continue
        best = min(same, key=lambda r: r.drop_pt if r.drop_pt is not None else float("inf"))
        default = next((r for r in same if r.method == default_method), best)
        assert default.drop_pt is not None and best.drop_pt is not None
        verdict = "ok" if default.drop_pt <= peer.drop_pt + 0.005 else "LOSES"
        cosines = ""
        if peer.cosine is not None and default.cosine is not None:
            cosines = f" (cos mean {default.cosine:.5f} vs {peer.cosine:.5f})"
        out.append(
            f"{head}; qdq {default.method} [{default.placement}] {default.drop_pt:+.2f} pt, "
            f"best qdq {best.method} [{best.placement}] {best.drop_pt:+.2f} pt: {verdict}{cosines}"
        )
    return out


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """``payload`` as indented JSON (rows as :meth:`Row.to_dict`)."""
    path.write_text(json.dumps(payload, indent=2, default=_jsonable) + "\n", encoding="utf-8")


def _jsonable(value: Any) -> Any:
    if isinstance(value, Row):
        return value.to_dict()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
