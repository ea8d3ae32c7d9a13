"""``qdq.lint``: run every rule on a Q/DQ ONNX graph and predict the engine's precision facts."""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from qdq.lint.blocks import check_blocks
from qdq.lint.findings import ERROR, INFO, WARN, Finding, exit_code
from qdq.lint.formats import FORMATS, FP8, INT4W, MXFP8, NVFP4, is_dequantize, is_qdq
from qdq.lint.fp8 import check_fp8, no_kernel
from qdq.lint.graph import COPY_OPS, LintGraph
from qdq.lint.guard import Guard
from qdq.lint.load import LintInputError, load_model
from qdq.lint.placement import check_placement
from qdq.lint.predict import PredictedLayer, predict_layers
from qdq.lint.structure import check_structure
from qdq.lint.target import Target, parse_target
from qdq.lint.text import printable
from qdq.lint.validity import check_validity
from qdq.lint.versioned import build_rules

__all__ = ["SUMMARY_KEYS", "LintReport", "lint"]

logger = logging.getLogger(__name__)

SUMMARY_KEYS = (
    "weighted_layers",
    "int8_weighted_layers",
    "int8_flops_percent",
    "unfused_qdq",
    "float_islands",
    "scale_mismatches",
    "alignment_reformats",
    "folded_weighted_layers",
    "fp8_weighted_layers",
    "fp8_flops_percent",
    "nvfp4_weighted_layers",
    "mxfp8_weighted_layers",
    "int4w_weighted_layers",
)
#: the block formats' summary counts, in the order the text report names them
_BLOCK_KEYS = ((NVFP4, "nvfp4_weighted_layers"), (MXFP8, "mxfp8_weighted_layers"),
               (INT4W, "int4w_weighted_layers"))  # fmt: skip

_SKIP_OPS = COPY_OPS | {"Shape", "Constant", "Cast"}  # and every Q/DQ (is_qdq)


@dataclass(frozen=True)
class LintReport:
    """Findings plus predicted engine facts (plain data; ``to_json`` is stable)."""

    model: str
    target: str
    findings: tuple[Finding, ...]
    summary: dict[str, int]
    layers: tuple[PredictedLayer, ...] = field(default=())

    @property
    def int8_layers(self) -> tuple[str, ...]:
        """ONNX nodes predicted to run inside INT8 layers."""
        return tuple(x for ly in self.layers if ly.kind != "qdq" and ly.int8 for x in ly.nodes)

    @property
    def block_layers(self) -> dict[str, tuple[str, ...]]:
        """ONNX nodes predicted to run inside NVFP4, MXFP8 and INT4 weight-only layers, by
        format (``{"nvfp4": (...), "mxfp8": (...), "int4w": (...)}``)."""
        return {
            fmt: tuple(
                x
                for ly in self.layers
                if ly.kind != "qdq" and ly.input_precision == fmt
                for x in ly.nodes
            )
            for fmt, _ in _BLOCK_KEYS
        }

    @property
    def fp8_layers(self) -> tuple[str, ...]:
        """ONNX nodes predicted to run inside FP8 layers."""
        return tuple(
            x for ly in self.layers if ly.kind != "qdq" and ly.input_precision == FP8
            for x in ly.nodes
        )  # fmt: skip

    @property
    def float_layers(self) -> tuple[str, ...]:
        """ONNX compute nodes predicted to run in float (neither INT8 nor FP8)."""
        return tuple(
            x
            for ly in self.layers
            if ly.kind not in ("qdq", "plugin") and not ly.quantized
            for x in ly.nodes
        )

    @property
    def exit_code(self) -> int:
        """0 clean, 1 warnings, 2 errors (including ``L00``, ``L01``)."""
        return exit_code(self.findings)

    @property
    def verdict(self) -> str:
        """``"PASS"``, ``"WARN"`` or ``"ERROR"``."""
        return ("PASS", "WARN", "ERROR")[self.exit_code]

    def rules(self, severity: str | None = None) -> set[str]:
        """Rule ids that fired (optionally only at one severity)."""
        return {f.rule for f in self.findings if severity is None or f.severity == severity}

    def to_dict(self) -> dict[str, Any]:
        """``{"findings": [{rule, severity, nodes, message, fix, ...}], "summary": {...}}``."""
        return {
            "model": self.model,
            "target": self.target,
            "verdict": self.verdict,
            "findings": [f.to_dict() for f in self.findings],
            "summary": self.summary,
            "layers": [ly.to_dict() for ly in self.layers],
        }

    def to_json(self) -> str:
        """One JSON object."""
        return json.dumps(self.to_dict(), indent=2)

    def format(self, show_layers: bool = False) -> str:
        """Human output grouped by severity (with ``show_layers``, the predicted engine first).
        Names from the file are shown with control characters escaped (:func:`printable`)."""
        s = self.summary
        lines = [
            f"{printable(self.model)}: {self.verdict} ({self.target})",
            f"  INT8 weighted layers {s['int8_weighted_layers']}/{s['weighted_layers']} "
            f"({s['int8_flops_percent']}% of FLOPs), "
            + (
                f"FP8 weighted layers {s['fp8_weighted_layers']}/{s['weighted_layers']} "
                f"({s['fp8_flops_percent']}% of FLOPs), "
                if s["fp8_weighted_layers"]
                else ""
            )
            + "".join(
                f"{FORMATS[fmt].label} weighted layers {s[key]}/{s['weighted_layers']}, "
                for fmt, key in _BLOCK_KEYS
                if s[key]
            )
            + f"unfused Q/DQ {s['unfused_qdq']}, float islands {s['float_islands']}, "
            f"scale mismatches {s['scale_mismatches']}, "
            f"alignment reformats {s['alignment_reformats']}"
            + (
                f", weighted ops folded at build time {s['folded_weighted_layers']}"
                if s["folded_weighted_layers"]
                else ""
            ),
        ]
        if show_layers:
            lines.append(f"predicted engine layers ({len(self.layers)})")
            lines.extend(
                f"  {ly.input_precision:>4} -> {ly.output_precision:<4} {ly.kind:<9} "
                f"{printable(ly.name)}" + (f"  [{printable(ly.reason)}]" if ly.reason else "")
                for ly in self.layers
            )
        for severity in (ERROR, WARN, INFO):
            group = [f for f in self.findings if f.severity == severity]
            if group:
                lines.append(f"{severity} ({len(group)})")
                lines.extend(
                    f"  {f.rule:<5} {printable(f.message)}"
                    + (f"\n        fix: {printable(f.fix)}" if f.fix else "")
                    for f in group
                )
        return "\n".join(lines)


def lint(
    model: str | Path | Any,
    *,
    target: str | Target = "trt10",
    strongly_typed: bool | None = None,
    flags: Iterable[str] | None = None,
) -> LintReport:
    """Lint a Q/DQ ONNX model (path or ``onnx.ModelProto``) for TensorRT.

    Args:
        model: the ONNX file or model.
        target: ``"trt10"`` (weakly typed, INT8+FP16 builds) or ``"trt11"`` (strongly typed: the
            float remainder runs at the ONNX dtype), optionally with a minor version
            (``"trt8.6"``, ``"trt10.5"``) for the version-dependent rules (V07, V10, V12, P11)
            and a GPU (``"trt10-hopper"``, ``"trt10.12-sm89"``) for the FP8 rules (F01, F06).
        strongly_typed: ``True`` for a ``--stronglyTyped`` build on TensorRT 10.12+.
        flags: weak-typing precision flags of the build (default ``int8`` and ``fp16``, and
            ``fp8`` for a GPU with FP8); without ``int8`` a Q/DQ model does not build (V13),
            without ``fp16`` the float remainder runs FP32 (B01), without ``fp8`` FP8 Q/DQ get
            no FP8 kernels (F07).

    Returns:
        The :class:`LintReport`. A rule or prediction step that fails on part of the graph does not
        abort the lint: it becomes an ``L00`` ERROR finding naming the step, the nodes, and the
        exception, and the other rules still run. A graph without any Q/DQ gets ``L01`` (ERROR).

    Raises:
        LintInputError: (a ``ValueError``) ``model`` cannot be read: a missing file, a directory,
            an empty, non-ONNX or truncated file, missing external data, an undefined tensor.
        TypeError: ``model`` is neither a path nor an ``onnx.ModelProto``.
        ValueError: a bad ``target``/``strongly_typed``/``flags`` combination.

    Example:
        >>> report = lint("model.onnx")  # doctest: +SKIP
        >>> report.summary["int8_weighted_layers"], report.verdict  # doctest: +SKIP
    """
    import onnx

    t = parse_target(target, strongly_typed=strongly_typed, flags=flags)
    proto, label = load_model(model)
    try:
        g = LintGraph(proto)
    except Exception as err:  # an initializer or Constant numpy cannot decode
        logger.debug("indexing %s failed", label, exc_info=True)
        raise LintInputError(
            f"{label}: the graph cannot be read ({type(err).__name__}: {err})"
        ) from err
    guard = Guard()
    findings: list[Finding] = guard.call(
        "structure rules V14-V17", (), check_structure, proto, g, default=[]
    )
    if g.cyclic:  # no rule below holds on a cycle (they walk producers): V14 says why
        return LintReport(
            label, t.label, tuple(findings + guard.findings), dict.fromkeys(SUMMARY_KEYS, 0)
        )
    findings += guard.call("validity rules", (), check_validity, proto, t, guard, default=[])
    findings += check_placement(g, guard)
    fp16_onnx = any(i.data_type == onnx.TensorProto.FLOAT16 for i in proto.graph.initializer)
    dtype = "fp16" if t.strongly_typed and fp16_onnx else t.float_dtype
    layers: list[PredictedLayer] = guard.call(
        "layer prediction", (), predict_layers, g, dtype, guard, default=[]
    )
    by_name = {g.name(n): n for n in g.nodes}
    floats = [
        by_name[x]
        for ly in layers
        if ly.kind not in ("qdq", "plugin") and not ly.quantized
        for x in ly.nodes
    ]
    if t.strongly_typed:
        findings += guard.call(
            "strong-typing rules B02/V11", (), _strong_typing, g, floats, default=[]
        )
    findings += guard.call(
        "build rules V13/B01/P05/P11", (), build_rules, g, t, layers, floats, default=[]
    )
    findings += guard.call("FP8 rules F01-F09", (), check_fp8, g, t, default=[])
    findings += guard.call("block-format rules M01-M05", (), check_blocks, g, t, default=[])
    summary: dict[str, int] = guard.call(
        "summary", (), _summary, proto, g, layers, floats, findings, default={}
    )
    findings += guard.findings
    summary = {**dict.fromkeys(SUMMARY_KEYS, 0), **summary}
    return LintReport(label, t.label, tuple(findings), summary, tuple(layers))


def _summary(
    proto: Any, g: LintGraph, layers: list[PredictedLayer], floats: list[Any], findings: list[Any]
) -> dict[str, int]:
    folded = {id(n) for n in g.nodes if g.weighted(n) and g.folded_node(n)}
    flops = {n: f for n, f in _weighted_flops(proto, g).items() if n not in folded}
    total_flops = sum(flops.values())
    int8_ids = {id(n) for n in g.nodes if g.int8_weighted(n)}
    int8_flops = sum(f for n, f in flops.items() if n in int8_ids)
    fp8_ids = {  # an FP8 op TensorRT has no FP8 kernel for runs float (fp8.no_kernel)
        id(n) for n in g.nodes if g.weighted_format(n) == FP8 and not no_kernel(g, n, FP8)
    }
    fp8_flops = sum(f for n, f in flops.items() if n in fp8_ids)
    return {  # a weighted op the builder folds (constant inputs only) is no engine layer
        "weighted_layers": sum(1 for n in g.nodes if g.weighted(n) and id(n) not in folded),
        "int8_weighted_layers": sum(1 for n in g.nodes if g.int8_weighted(n)),
        "int8_flops_percent": round(100 * int8_flops / total_flops) if total_flops else 0,
        "unfused_qdq": sum(1 for ly in layers if ly.kind == "qdq"),
        "float_islands": _islands(g, floats),
        "scale_mismatches": sum(1 for f in findings if f.rule in ("S01", "S02", "S03", "S04")),
        "alignment_reformats": sum(1 for f in findings if f.rule == "H01" and f.severity == WARN),
        "folded_weighted_layers": len(folded),
        "fp8_weighted_layers": len(fp8_ids - folded),
        "fp8_flops_percent": round(100 * fp8_flops / total_flops) if total_flops else 0,
    } | {  # block formats: layers TensorRT has the format's kernels for (not convolutions)
        key: sum(
            1
            for n in g.nodes
            if id(n) not in folded and g.weighted_format(n) == fmt and not no_kernel(g, n, fmt)
        )
        for fmt, key in _BLOCK_KEYS
    }


def _weighted_flops(proto: Any, g: LintGraph) -> dict[int, int]:
    """Multiply-accumulate counts (x2) of the weighted ops whose shapes shape inference can tell.

    Shape inference propagates constant shape values (``data_prop``): the TorchScript exporter
    computes a GroupNorm's or an attention's Reshape target from ``Shape -> Gather -> Concat``,
    and without the values every layer after the first such Reshape had no shape (a diffusion
    UNet's TorchScript export counted 106 of its 649 MFLOPs)."""
    import onnx

    inferred = proto  # best effort: the shapes the model declares (a model past 2 GB cannot be
    for data_prop in (True, False):  # serialized for inference; lint.load added its shapes)
        try:
            inferred = onnx.shape_inference.infer_shapes(proto, data_prop=data_prop)
            break
        except Exception:
            continue
    dims: dict[str, list[int]] = {}
    for vi in [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]:
        shape = [d.dim_value if d.dim_value > 0 else 1 for d in vi.type.tensor_type.shape.dim]
        dims[vi.name] = shape
    out: dict[int, int] = {}  # id(node) -> FLOPs
    for n in g.nodes:
        if not g.weighted(n):
            continue
        w = g.qinput(n.input[1])
        weight = g.const.get(w.source if w is not None else n.input[1])
        y = dims.get(n.output[0])
        if weight is None or not y:
            continue
        if n.op_type in ("Conv", "ConvTranspose"):
            spatial = int(np.prod(y[2:])) if len(y) > 2 else 1
            out[id(n)] = 2 * int(np.prod(weight.shape)) * spatial * y[0]
        else:
            rows = int(np.prod(y[:-1])) if len(y) > 1 else 1
            out[id(n)] = 2 * int(np.prod(weight.shape)) * rows
    return out


def _islands(g: LintGraph, floats: list[Any]) -> int:
    """Connected groups of float compute layers that sit between INT8 layers."""
    ids = {id(n) for n in floats}
    seen: set[int] = set()
    islands = 0
    for n in floats:
        if id(n) in seen:
            continue
        islands += 1
        stack = [n]
        while stack:
            cur = stack.pop()
            if id(cur) in seen:
                continue
            seen.add(id(cur))
            near = [g.producer.get(i) for i in cur.input] + [
                c for o in cur.output for c in g.consumers.get(o, [])
            ]
            stack.extend(x for x in near if x is not None and id(x) in ids)
    return islands


def _strong_typing(g: LintGraph, floats: list[Any]) -> list[Finding]:
    """B02: a float32 ONNX built strongly typed runs everything outside Q/DQ in FP32.
    V11: DequantizeLinear outputs its scale's dtype, so FP32 scales make FP32 consumers."""
    from onnx import TensorProto

    out: list[Finding] = []
    dtypes = Counter(i.data_type for i in g.graph.initializer)
    heads = [
        g.producer[o]
        for o in g.outputs
        if o in g.producer and g.producer[o].op_type not in _SKIP_OPS and not is_qdq(g.producer[o])
    ]
    fp32 = floats + [h for h in heads if h not in floats]
    if fp32 and dtypes.get(TensorProto.FLOAT16, 0) == 0:
        names = tuple(g.name(n) for n in fp32[:10])
        out.append(
            Finding(
                "B02",
                WARN,
                names,
                f"strongly typed target: {len(fp32)} layers outside Q/DQ are FP32 in the ONNX",
                "they run FP32 on TensorRT 11",
                "export with qdq.export_onnx(..., fp16=True) (or ModelOpt AutoCast)",
                "rule spec §1.5",
            )
        )
    fp32_dq = [
        n
        for n in g.nodes
        if is_dequantize(n)
        and n.input[1] in g.const
        and g.const[n.input[1]].dtype.name == "float32"
        and not g.is_const(n.input[0])
    ]
    if fp32_dq:
        out.append(
            Finding(
                "V11",
                INFO,
                tuple(g.name(n) for n in fp32_dq[:10]),
                f"{len(fp32_dq)} activation DequantizeLinear nodes have FP32 scales",
                "their outputs (and consumers) are FP32 under strong typing, or Casts follow",
                "use opset >= 19 with FP16 scales (qdq.export_onnx(..., fp16=True, opset=19))",
                "rule spec §1.1 V11",
            )
        )
    return out
