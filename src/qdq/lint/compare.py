"""Compare two real TensorRT engines (FP16 vs INT8, ``--best`` vs Q/DQ, two placements).

:func:`compare_engines` takes two :class:`~qdq.lint.engine_report.EngineReport` (with their
profile JSON for the latencies) and returns an :class:`EngineComparison`, plain data:

* the total latency of each (the sum of the per-layer medians of the profile, as trex reports it);
* latency and layer count by layer type (TensorRT's ``ParameterType``, with reformats split into
  unfused Q/DQ and builder-inserted ones, which is where a Q/DQ placement loses its speed);
* the precision mix: compute layers (reformats and no-ops aside) by the precision they compute in;
* the layers that differ most: layers are matched by their ONNX node names when both engines were
  built from exports with the same names, otherwise by order (the longest common subsequence of
  layer kinds, as :func:`qdq.lint.diff_engine` does); a layer without a counterpart (an unfused
  Q/DQ of the INT8 engine) counts as all added or all removed time.

:meth:`EngineComparison.format` prints the tables, :meth:`~EngineComparison.to_dict` gives JSON
and :func:`qdq.lint.compare_draw.comparison_svg` draws the bars.

Example:
    >>> from qdq.lint.engine_report import parse_engine_report
    >>> def engine(dtype, ms):
    ...     t = {"Name": "x", "Format/Datatype": dtype}
    ...     return parse_engine_report(
    ...         [{"Name": "Conv_0", "LayerType": "CaskConvolution",
    ...           "ParameterType": "Convolution", "Inputs": [t], "Outputs": [t]}],
    ...         [{"name": "Conv_0", "medianMs": ms, "averageMs": ms}])
    >>> c = compare_engines(engine("Half", 0.4), engine("Int8", 0.25), names=("fp16", "int8"))
    >>> c.total_ms, c.precision_mix["int8"]
    ((0.4, 0.25), (0, 1))
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any

from qdq.lint.diff import engine_kind, lcs_pairs
from qdq.lint.engine_draw import short_name
from qdq.lint.engine_report import EngineLayer, EngineReport
from qdq.lint.text import visible

__all__ = ["EngineComparison", "LayerDelta", "TypeRow", "compare_engines", "layer_category"]

_NO_COMPUTE = ("NoOp", "Shuffle", "Constant", "shape_call", "signal", "wait")
_UNMATCHED = "(profile records naming no layer)"
_PRECISION_ORDER = ("int8", "fp8", "fp16", "bf16", "fp32", "other")


@dataclass(frozen=True)
class TypeRow:
    """One layer type: layer count and summed median ms in engine A and B (``None``: no profile)."""

    layer_type: str
    count_a: int
    count_b: int
    ms_a: float | None
    ms_b: float | None


@dataclass(frozen=True)
class LayerDelta:
    """A matched pair of layers (or a layer only one engine has: the other side is ``""``).

    ``a``/``b`` are short layer names (:func:`qdq.lint.engine_draw.short_name`); ``precision_*``
    the compute precision, or ``"Q/DQ"``/``"reformat"`` for reformat layers.
    """

    kind: str
    a: str
    b: str
    precision_a: str
    precision_b: str
    ms_a: float | None
    ms_b: float | None

    @property
    def delta_ms(self) -> float:
        """``ms_b - ms_a`` (a missing side counts 0)."""
        return (self.ms_b or 0.0) - (self.ms_a or 0.0)


@dataclass(frozen=True)
class EngineComparison:
    """Two engines side by side (see the module docstring).

    Attributes:
        names: what to call engine A and B in tables.
        layers: number of layers of A and B.
        total_ms: summed per-layer median ms of A and B (``None`` without a profile).
        by_type: latency and count per layer category, slowest (in A + B) first.
        precision_mix: compute precision → number of compute layers in A and B.
        precision_ms: compute precision → summed median ms in A and B.
        matched_by: ``"name"`` or ``"order"`` (how layers were paired for ``top``).
        top: the layers whose latency differs most, largest absolute difference first.
    """

    names: tuple[str, str]
    layers: tuple[int, int]
    total_ms: tuple[float | None, float | None]
    by_type: tuple[TypeRow, ...]
    precision_mix: dict[str, tuple[int, int]]
    precision_ms: dict[str, tuple[float | None, float | None]]
    matched_by: str
    top: tuple[LayerDelta, ...]

    @property
    def speedup(self) -> float | None:
        """``total A / total B`` (> 1: B is faster), if both were profiled (``None`` when B took
        no time or the ratio is past a float)."""
        a, b = self.total_ms
        return _finite(a / b) if a is not None and b else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict with stable keys."""
        return {
            "names": list(self.names),
            "layers": list(self.layers),
            "total_ms": list(self.total_ms),
            "speedup": self.speedup,
            "by_type": [asdict(r) for r in self.by_type],
            "precision_mix": {k: list(v) for k, v in self.precision_mix.items()},
            "precision_ms": {k: list(v) for k, v in self.precision_ms.items()},
            "matched_by": self.matched_by,
            "top": [{**asdict(d), "delta_ms": d.delta_ms} for d in self.top],
        }

    def to_json(self) -> str:
        """:meth:`to_dict` as indented JSON (strict: never ``NaN`` or ``Infinity``)."""
        return json.dumps(self.to_dict(), indent=2, allow_nan=False)

    def format(self) -> str:
        """The comparison as plain-text tables."""
        a, b = self.names
        ta, tb = self.total_ms
        w = 40
        lines = [f"A = {a} ({self.layers[0]} layers), B = {b} ({self.layers[1]} layers)"]
        if ta is not None and tb is not None:
            ratio = f"; B takes {tb / ta:.2f}x the time of A" if ta and _finite(tb / ta) else ""
            lines.append(
                f"total latency (sum of layer medians): A {ta:.3f} ms, B {tb:.3f} ms "
                f"(B-A {tb - ta:+.3f} ms{ratio})"
            )
        else:
            lines.append("total latency: no profile (pass the --exportProfile JSON of both)")
        lines += ["", "latency by layer type:"]
        lines.append(
            f"  {'layer type':<30} {'A ms':>8} {'n':>3} {'B ms':>8} {'n':>3} {'B-A ms':>8}"
        )
        for r in self.by_type:
            lines.append(
                f"  {r.layer_type:<30} {_ms(r.ms_a):>8} {r.count_a:>3} {_ms(r.ms_b):>8} "
                f"{r.count_b:>3} {_delta(r.ms_a, r.ms_b):>8}"
            )
        lines += ["", "precision mix (compute layers; reformats and no-ops aside):"]
        lines.append(f"  {'precision':<10} {'A n':>4} {'A ms':>8} {'B n':>4} {'B ms':>8}")
        for p, (na, nb) in self.precision_mix.items():
            ma, mb = self.precision_ms[p]
            ma, mb = (ma if na else None), (mb if nb else None)
            lines.append(f"  {p.upper():<10} {na:>4} {_ms(ma):>8} {nb:>4} {_ms(mb):>8}")
        lines += ["", f"layers that differ most (paired by {self.matched_by}):"]
        lines.append(f"  {'B-A ms':>8} {'A ms':>7} {'B ms':>7}  {'A layer':<{w}}  B layer")
        for d in self.top:
            left = f"{d.a} [{d.precision_a}]" if d.a else "-"
            right = f"{d.b} [{d.precision_b}]" if d.b else "-"
            lines.append(
                f"  {d.delta_ms:>+8.3f} {_ms(d.ms_a):>7} {_ms(d.ms_b):>7}  {left:<{w}}  {right}"
            )
        return visible("\n".join(lines))  # names from the reports: no terminal escapes


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _delta(a: float | None, b: float | None) -> str:
    return "-" if a is None and b is None else f"{(b or 0.0) - (a or 0.0):+.3f}"


def layer_category(layer: EngineLayer) -> str:
    """The layer-type row a layer is counted in: ``"Reformat (Q/DQ)"`` for an unfused Q/DQ,
    ``"Reformat"`` for a builder-inserted one, else TensorRT's ``ParameterType`` (``LayerType``
    when there is none)."""
    if layer.is_qdq_reformat:
        return "Reformat (Q/DQ)"
    if layer.is_reformat:
        return "Reformat"
    return layer.parameter_type or layer.layer_type or "?"


def compute_precision(layer: EngineLayer) -> str | None:
    """The precision a compute layer runs in (INT8 or FP8 weights count as INT8 or FP8); ``None``
    for reformats and layers that compute nothing (no-ops, shuffles)."""
    if layer.is_reformat or layer.is_qdq_reformat or layer.layer_type in _NO_COMPUTE:
        return None
    if layer.weights_dtype in ("int8", "fp8"):
        return layer.weights_dtype
    return layer.input_precision or "other"


def compare_engines(
    a: EngineReport,
    b: EngineReport,
    *,
    names: tuple[str, str] = ("A", "B"),
    top: int = 10,
) -> EngineComparison:
    """Compare engine ``a`` with engine ``b`` (see the module docstring).

    Args:
        a, b: parsed engine reports (optimization profile 0 is compared).
        names: labels for the tables.
        top: how many of the most different layers to keep.

    Raises:
        ValueError: ``top`` is not a non-negative int.
    """
    if isinstance(top, bool) or not isinstance(top, int) or top < 0:
        raise ValueError(f"top must be an int >= 0, got {top!r}")
    la = [x for x in a.layers if x.profile == 0]
    lb = [x for x in b.layers if x.profile == 0]
    ga, gb = _by_category(la), _by_category(lb)
    cats = list(dict.fromkeys([*ga, *gb]))
    rows = [
        TypeRow(
            c,
            len(ga.get(c, [])),
            len(gb.get(c, [])),
            _sum_ms(a, ga.get(c, [])),
            _sum_ms(b, gb.get(c, [])),
        )
        for c in cats
    ]
    if a.unmatched_timings or b.unmatched_timings:
        rows.append(
            TypeRow(
                _UNMATCHED,
                len(a.unmatched_timings),
                len(b.unmatched_timings),
                sum(a.unmatched_timings.values()) if a.has_timings else None,
                sum(b.unmatched_timings.values()) if b.has_timings else None,
            )
        )
    rows.sort(key=lambda r: -((r.ms_a or 0.0) + (r.ms_b or 0.0)))
    mix, mix_ms = _precisions(a, la, b, lb)
    pairs, matched_by = _pairs(la, lb)
    deltas = _deltas(la, lb, pairs)
    deltas.sort(key=lambda d: -abs(d.delta_ms))
    return EngineComparison(
        names,
        (len(la), len(lb)),
        (
            a.total_median_ms() if a.has_timings else None,
            b.total_median_ms() if b.has_timings else None,
        ),
        tuple(rows),
        mix,
        mix_ms,
        matched_by,
        tuple(deltas[:top]),
    )


def _by_category(layers: list[EngineLayer]) -> dict[str, list[EngineLayer]]:
    groups: dict[str, list[EngineLayer]] = {}
    for x in layers:
        groups.setdefault(layer_category(x), []).append(x)
    return groups


def _sum_ms(engine: EngineReport, layers: list[EngineLayer]) -> float | None:
    return sum(x.median_ms or 0.0 for x in layers) if engine.has_timings else None


def _precisions(
    a: EngineReport, la: list[EngineLayer], b: EngineReport, lb: list[EngineLayer]
) -> tuple[dict[str, tuple[int, int]], dict[str, tuple[float | None, float | None]]]:
    pa = [compute_precision(x) for x in la]
    pb = [compute_precision(x) for x in lb]
    seen = {p for p in (*pa, *pb) if p is not None}
    order = [p for p in _PRECISION_ORDER if p in seen] + sorted(seen - set(_PRECISION_ORDER))
    mix = {p: (pa.count(p), pb.count(p)) for p in order}
    mix_ms = {
        p: (
            _sum_ms(a, [x for x, q in zip(la, pa, strict=True) if q == p]),
            _sum_ms(b, [x for x, q in zip(lb, pb, strict=True) if q == p]),
        )
        for p in order
    }
    return mix, mix_ms


def _compute_names(layer: EngineLayer) -> set[str]:
    """ONNX node names of the layer that identify it across exports (no Q/DQ, weights, copies)."""
    return {
        n for n in layer.onnx_nodes
        if not n.startswith(("QuantizeLinear", "DequantizeLinear", "Reformatting CopyNode"))
        and "/QuantizeLinear" not in n and "/DequantizeLinear" not in n
        and not n.endswith((".weight", ".bias"))
    }  # fmt: skip


def _pairs(la: list[EngineLayer], lb: list[EngineLayer]) -> tuple[list[tuple[int, int]], str]:
    """Index pairs of corresponding layers: by shared ONNX node names when that pairs at least
    half of the compute layers, else by order of layer kinds (longest common subsequence)."""
    ka = [engine_kind(x) for x in la]
    kb = [engine_kind(x) for x in lb]
    owner = {
        n: j for j, x in enumerate(lb) if kb[j] not in (None, "qdq") for n in _compute_names(x)
    }
    by_name: list[tuple[int, int]] = []
    used: set[int] = set()
    for i, x in enumerate(la):
        if ka[i] in (None, "qdq"):
            continue
        j = next((owner[n] for n in sorted(_compute_names(x)) if n in owner), None)
        if j is not None and j not in used:
            used.add(j)
            by_name.append((i, j))
    compute = min(
        sum(1 for k in ka if k not in (None, "qdq")), sum(1 for k in kb if k not in (None, "qdq"))
    )
    if by_name and len(by_name) * 2 >= compute:
        return _same_names(la, lb, by_name), "name"
    ia = [i for i, k in enumerate(ka) if k not in (None, "qdq")]
    ib = [j for j, k in enumerate(kb) if k not in (None, "qdq")]
    out = [(ia[i], ib[j]) for i, j in lcs_pairs([ka[i] for i in ia], [kb[j] for j in ib])]
    return _same_names(la, lb, out), "order"


def _same_names(
    la: list[EngineLayer], lb: list[EngineLayer], pairs: list[tuple[int, int]]
) -> list[tuple[int, int]]:
    """``pairs`` plus the unpaired layers of the same name in both (reformats, no-ops)."""
    paired_a, paired_b = {i for i, _ in pairs}, {j for _, j in pairs}
    free_b = {x.name: j for j, x in enumerate(lb) if j not in paired_b}
    extra = [(i, free_b.pop(x.name)) for i, x in enumerate(la)
             if i not in paired_a and x.name in free_b]  # fmt: skip
    return sorted([*pairs, *extra])


def _deltas(
    la: list[EngineLayer], lb: list[EngineLayer], pairs: list[tuple[int, int]]
) -> list[LayerDelta]:
    def prec(x: EngineLayer) -> str:
        return compute_precision(x) or ("Q/DQ" if x.is_qdq_reformat else x.layer_type.lower())

    out = [
        LayerDelta(engine_kind(la[i]) or "other", short_name(la[i]), short_name(lb[j]), prec(la[i]),
                   prec(lb[j]), la[i].median_ms, lb[j].median_ms)
        for i, j in pairs
    ]  # fmt: skip
    paired_a = {i for i, _ in pairs}
    paired_b = {j for _, j in pairs}
    out += [
        LayerDelta(layer_category(x), short_name(x), "", prec(x), "", x.median_ms, None)
        for i, x in enumerate(la) if i not in paired_a
    ]  # fmt: skip
    out += [
        LayerDelta(layer_category(x), "", short_name(x), "", prec(x), None, x.median_ms)
        for j, x in enumerate(lb) if j not in paired_b
    ]  # fmt: skip
    return out
