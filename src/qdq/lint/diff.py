"""Compare the linter's predicted engine with a real engine report, layer by layer.

Predicted layers are matched to engine layers by ONNX node name when the engine was built from the
same ONNX file (TensorRT keeps node names in fused layer names and ``Metadata``). When the names do
not match (the engine came from another export of the same network), layers are matched by order:
the longest common subsequence of layer kinds (weighted, pooling, standalone Q/DQ, ...) over both
sequences, ignoring what the linter does not predict (builder reformats, no-ops, shuffles).
Precisions are compared as INT8 vs FP8 vs float: a weakly typed builder picks FP16 or FP32 by
timing, so the float precisions are one class; TensorRT's ``FP8`` (trex's name) is its own.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from qdq.lint.engine_report import EngineLayer, EngineReport
from qdq.lint.formats import is_quantized
from qdq.lint.predict import PredictedLayer
from qdq.lint.report import LintReport
from qdq.lint.text import visible

__all__ = ["LCS_CELLS", "EngineDiff", "LayerMatch", "diff_engine", "engine_kind", "lcs_pairs"]

_IGNORED_TYPES = ("NoOp", "Shuffle", "Constant", "shape_call", "signal", "wait")


@dataclass(frozen=True)
class LayerMatch:
    """One predicted layer and the engine layer it corresponds to."""

    predicted: str
    engine: str
    kind: str
    predicted_input: str
    predicted_output: str
    engine_input: str
    engine_output: str

    @property
    def agrees(self) -> bool:
        """Input and output agree on INT8 vs FP8 vs float."""
        return _class(self.predicted_input) == _class(self.engine_input) and _class(
            self.predicted_output
        ) == _class(self.engine_output)


@dataclass(frozen=True)
class EngineDiff:
    """Prediction vs engine: matched layers, what only one side has, and the summary counts.

    Attributes:
        matched_by: ``"name"`` or ``"order"``.
        matches: matched layer pairs, in order.
        only_predicted: predicted layers without an engine counterpart.
        only_engine: engine layers (of predicted kinds) without a predicted counterpart.
        compare: ``{key: (predicted, engine)}`` for weighted, INT8 weighted and unfused Q/DQ
            (and FP8 weighted when either side has one).
    """

    matched_by: str
    matches: tuple[LayerMatch, ...]
    only_predicted: tuple[str, ...]
    only_engine: tuple[str, ...]
    compare: dict[str, tuple[int, int]]

    @property
    def mismatches(self) -> tuple[LayerMatch, ...]:
        """Matched layers whose INT8 / FP8 / float precision differs."""
        return tuple(m for m in self.matches if not m.agrees)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (``layer_mismatches`` lists the disagreeing pairs)."""
        return {
            "matched_by": self.matched_by,
            "matched_layers": len(self.matches),
            "agreeing_layers": len(self.matches) - len(self.mismatches),
            "layer_mismatches": [asdict(m) for m in self.mismatches],
            "only_predicted": list(self.only_predicted),
            "only_engine": list(self.only_engine),
            "compare": {k: list(v) for k, v in self.compare.items()},
        }

    def format(self) -> str:
        """Human-readable comparison."""
        lines = [
            f"engine report vs prediction ({len(self.matches)} layers matched by "
            f"{self.matched_by}, {len(self.matches) - len(self.mismatches)} agree):"
        ]
        for key, (pred, real) in self.compare.items():
            lines.append(f"  {key:<22} predicted {pred:>4}  engine {real:>4}")
        for m in self.mismatches:
            lines.append(
                f"  differs: {m.predicted} predicted {m.predicted_input}->{m.predicted_output}, "
                f"engine {m.engine_input}->{m.engine_output} ({m.engine})"
            )
        lines.extend(f"  not in the engine: {n}" for n in self.only_predicted)
        lines.extend(f"  not predicted: {n}" for n in self.only_engine)
        return visible("\n".join(lines))  # names from the engine report: no terminal escapes


def diff_engine(report: LintReport, engine: EngineReport) -> EngineDiff:
    """Match the predicted layers of ``report`` with ``engine``'s layers and compare."""
    layers, summary = report.layers, report.summary
    real = [ly for ly in engine.layers if ly.profile == 0 and engine_kind(ly) is not None]
    pairs = _by_name(layers, engine, real)
    matched_by = "name"
    if len(pairs) < len(layers) // 2:
        pairs, matched_by = _by_order(layers, real), "order"
    used_p = {id(p) for p, _ in pairs}
    used_e = {id(e) for _, e in pairs}
    weighted = engine.weighted_layers()
    compare = {
        "weighted_layers": (summary["weighted_layers"], len(weighted)),
        "int8_weighted_layers": (
            summary["int8_weighted_layers"],
            sum(1 for ly in weighted if ly.input_precision == "int8"),
        ),
        "unfused_qdq": (summary["unfused_qdq"], len(engine.qdq_reformats())),
    }
    fp8 = (
        summary.get("fp8_weighted_layers", 0),
        sum(1 for ly in weighted if ly.input_precision == "fp8"),
    )
    if any(fp8):
        compare["fp8_weighted_layers"] = fp8
    return EngineDiff(
        matched_by,
        tuple(
            LayerMatch(
                p.name,
                e.name,
                p.kind,
                p.input_precision,
                p.output_precision,
                e.input_precision or "?",
                e.output_precision or "?",
            )
            for p, e in pairs
        ),
        tuple(p.name for p in layers if id(p) not in used_p),
        tuple(e.name for e in real if id(e) not in used_e),
        compare,
    )


def _class(precision: str) -> str:
    """``"int8"``, ``"fp8"`` or ``"float"`` (FP16/FP32/BF16 and an unknown ``"?"`` alike)."""
    return precision if is_quantized(precision) else "float"


def engine_kind(layer: EngineLayer) -> str | None:
    """The predicted-layer kind an engine layer corresponds to (``None``: not predicted)."""
    if layer.is_qdq_reformat:
        return "qdq"
    if layer.is_reformat or layer.layer_type in _IGNORED_TYPES:
        return None
    if layer.is_weighted:
        return "weighted"
    kinds = f"{layer.layer_type} {layer.parameter_type or ''}"
    if "Pool" in kinds:
        return "pooling"
    if "PointWise" in kinds or "ElementWise" in kinds:
        return "pointwise"
    return "other"


def _by_name(
    layers: tuple[PredictedLayer, ...], engine: EngineReport, real: list[EngineLayer]
) -> list[tuple[PredictedLayer, EngineLayer]]:
    kept = {id(e) for e in real}
    first: dict[str, EngineLayer] = {}  # as EngineReport.find, one pass over the engine
    for x in engine.layers:
        if x.profile == 0:
            for name in x.onnx_nodes:
                first.setdefault(name, x)
    out, seen = [], set()
    for p in layers:
        found = (first.get(n) for n in p.nodes)
        e = next((x for x in found if x is not None and id(x) in kept), None)
        if e is not None and id(e) not in seen:
            seen.add(id(e))
            out.append((p, e))
    return out


def _by_order(
    layers: tuple[PredictedLayer, ...], real: list[EngineLayer]
) -> list[tuple[PredictedLayer, EngineLayer]]:
    """Longest common subsequence of kinds (concat and pointwise predicted as separate layers are
    often fused or eliminated by the builder; the LCS skips them)."""
    pairs = lcs_pairs([p.kind for p in layers], [engine_kind(e) for e in real])
    return [(layers[i], real[j]) for i, j in pairs]


#: past this many cells (2000 x 2000 layers) :func:`lcs_pairs` pairs greedily, in linear time
LCS_CELLS = 4_000_000


def lcs_pairs(a: Sequence[Hashable], b: Sequence[Hashable]) -> list[tuple[int, int]]:
    """Index pairs ``(i, j)`` with ``a[i] == b[j]``, increasing in both: a longest common
    subsequence, or, when ``len(a) * len(b)`` exceeds :data:`LCS_CELLS`, the greedy one (each
    ``a[i]`` takes the next equal ``b[j]``), so that a hostile report of 10^5 layers costs
    linear time and memory.

    Example:
        >>> lcs_pairs(["w", "p", "w"], ["w", "w"])
        [(0, 0), (2, 1)]
    """
    n, m = len(a), len(b)
    if n * m > LCS_CELLS:
        return _greedy_pairs(a, b)
    table = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            table[i][j] = (
                table[i + 1][j + 1] + 1 if a[i] == b[j] else max(table[i + 1][j], table[i][j + 1])
            )
    out, i, j = [], 0, 0
    while i < n and j < m:
        if a[i] == b[j]:
            out.append((i, j))
            i, j = i + 1, j + 1
        elif table[i + 1][j] >= table[i][j + 1]:
            i += 1
        else:
            j += 1
    return out


def _greedy_pairs(a: Sequence[Hashable], b: Sequence[Hashable]) -> list[tuple[int, int]]:
    where: dict[Hashable, list[int]] = {}
    for j, key in enumerate(b):
        where.setdefault(key, []).append(j)
    out: list[tuple[int, int]] = []
    after = 0
    for i, key in enumerate(a):
        spots = where.get(key, [])
        k = bisect_left(spots, after)
        if k < len(spots):
            out.append((i, spots[k]))
            after = spots[k] + 1
    return out
