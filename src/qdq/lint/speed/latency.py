"""Engine time of a Q/DQ ONNX model without a GPU, against the same model built FP16.

:func:`predict_latency` times the engine the linter predicts for the model (its layers, fused as
TensorRT fuses them, at their predicted precisions, with the standalone Q/DQ and the builder's
reformats: :mod:`qdq.lint.speed.onnx_layers`) with the fitted layer model
(:func:`qdq.lint.speed.cost.layer_time`), and the same model with its Q/DQ removed built FP16
(:func:`qdq.lint.speed.onnx_layers.strip_qdq`). It names the quantized layers that do not pay: a
quantized convolution, GEMM or attention core whose time, with the standalone Quantize/Dequantize
and reformats it causes, is predicted above the FP16 build's time of the same ONNX nodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qdq.lint.formats import is_quantized
from qdq.lint.graph import LintGraph
from qdq.lint.layer import PredictedLayer
from qdq.lint.load import load_model
from qdq.lint.predict import predict_layers
from qdq.lint.speed.cost import CostLayer, CostParams, layer_time, load_params
from qdq.lint.speed.gpus import GPU, find_gpu, gpu_for_target
from qdq.lint.speed.onnx_layers import EngineLayer, engine_layers, strip_qdq
from qdq.lint.target import Target, parse_target
from qdq.lint.text import printable

__all__ = [
    "SLOW_SPEEDUP",
    "LatencyReport",
    "LayerLatency",
    "NotPaying",
    "predict_latency",
    "speedup_text",
    "target_gpu",
]

#: qdq warns when a Q/DQ engine is predicted less than this many times as fast as FP16
SLOW_SPEEDUP = 1.05
_COMPUTE_KINDS = ("weighted", "attention")
_TOP = 10


@dataclass(frozen=True)
class LayerLatency:
    """One engine layer's predicted time.

    Attributes:
        name: the layer's name (ONNX node names joined with ``" + "``, or a reformat's).
        nodes: the ONNX nodes it runs (empty for a builder reformat).
        op: the time model's op (``"conv"``, ``"gemm"``, ``"qdq"``, ``"reformat"``, ...).
        precision: the precision it computes (or converts to).
        ms: predicted time.
    """

    name: str
    nodes: tuple[str, ...]
    op: str
    precision: str
    ms: float

    def to_dict(self) -> dict[str, Any]:
        """``{name, type, precision, ms}``, as ``qdq engine time --json`` writes its layers."""
        return {"name": self.name, "type": self.op, "precision": self.precision,
                "ms": round(self.ms, 6)}  # fmt: skip


@dataclass(frozen=True)
class NotPaying:
    """A quantized layer predicted slower than the FP16 build of the same ONNX nodes.

    Attributes:
        name: the quantized layer.
        quantized_ms: its time plus its share of the standalone Q/DQ and reformats it causes.
        fp16_ms: the FP16 build's time of the layers its nodes run in there.
        reason: what makes it slower.
    """

    name: str
    quantized_ms: float
    fp16_ms: float
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict."""
        return {"name": self.name, "quantized_ms": round(self.quantized_ms, 6),
                "fp16_ms": round(self.fp16_ms, 6), "reason": self.reason}  # fmt: skip


@dataclass(frozen=True)
class LatencyReport:
    """The predicted engine time of a Q/DQ model and of its FP16 build (plain data).

    Attributes:
        model: the model's label (file name).
        target: the target label (``"trt10-a100"``).
        gpu: the GPU's canonical name in the table.
        gpu_label: its marketing name.
        gpu_note: why this GPU stands for the target's generation ('' when it was named).
        total_ms: the sum of the predicted engine's layer times.
        fp16_total_ms: the same for the model without Q/DQ built FP16.
        speedup_vs_fp16: ``fp16_total_ms / total_ms``.
        layers: the Q/DQ engine's layers, in engine order.
        fp16_layers: the FP16 build's layers.
        not_paying: the quantized layers predicted slower than FP16.
        unsized: layers whose shapes ONNX shape inference could not tell (timed at the launch
            floor only).
    """

    model: str
    target: str
    gpu: str
    gpu_label: str
    gpu_note: str
    total_ms: float
    fp16_total_ms: float
    speedup_vs_fp16: float
    layers: tuple[LayerLatency, ...]
    fp16_layers: tuple[LayerLatency, ...]
    not_paying: tuple[NotPaying, ...] = field(default=())
    unsized: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """``{total_ms, fp16_total_ms, speedup_vs_fp16, gpu, layers, not_paying, ...}``."""
        return {
            "model": self.model,
            "target": self.target,
            "gpu": self.gpu,
            "gpu_label": self.gpu_label,
            "gpu_note": self.gpu_note,
            "total_ms": round(self.total_ms, 6),
            "fp16_total_ms": round(self.fp16_total_ms, 6),
            "speedup_vs_fp16": round(self.speedup_vs_fp16, 4),
            "layers": [ly.to_dict() for ly in self.layers],
            "fp16_layers": [ly.to_dict() for ly in self.fp16_layers],
            "not_paying": [n.to_dict() for n in self.not_paying],
            "unsized": list(self.unsized),
        }

    def format(self, top: int = _TOP) -> str:
        """A short text: the totals, the speed-up, the layers that do not pay, the slowest
        layers (names from the file shown escaped)."""
        s = self.speedup_vs_fp16
        verdict = f"{s:.2f}x faster than FP16" if s >= 1 else f"{s:.2f}x: slower than FP16"
        lines = [
            f"{printable(self.model)}: predicted engine time on {self.gpu_label} ({self.target})",
            f"  Q/DQ engine {self.total_ms:.3f} ms, FP16 build {self.fp16_total_ms:.3f} ms: "
            + verdict,
        ]
        if self.gpu_note:
            lines.append(f"  {self.gpu_note}")
        if self.unsized:
            lines.append(
                f"  {_count(len(self.unsized), 'layer')} without shapes counted at the launch floor only "
                f"(first: {printable(self.unsized[0])}); give input sizes with --shape"
            )
        if self.not_paying:
            lines.append(
                f"quantization does not pay in {_count(len(self.not_paying), 'layer')} "
                "(predicted slower than FP16 with the Q/DQ and reformats they cause)"
            )
            lines.extend(
                f"  {printable(n.name)}: {n.quantized_ms:.4f} ms vs FP16 {n.fp16_ms:.4f} ms "
                f"({printable(n.reason)})"
                for n in self.not_paying
            )
        slowest = sorted(self.layers, key=lambda ly: -ly.ms)[:top]
        if slowest:
            lines.append(f"slowest layers ({len(slowest)} of {len(self.layers)})")
            total = self.total_ms or 1.0
            lines.extend(
                f"  {ly.ms:7.4f} ms {100 * ly.ms / total:4.1f}%  {ly.precision:>4} {ly.op:<9} "
                f"{printable(ly.name)}"
                for ly in slowest
            )
        return "\n".join(lines)


def predict_latency(
    model: str | Path | Any,
    *,
    target: str | Target,
    gpu: str | GPU | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    params: CostParams | None = None,
    layers: Sequence[PredictedLayer] | None = None,
) -> LatencyReport:
    """Predict the engine time of a Q/DQ ONNX model and of the same model built FP16.

    Args:
        model: the ONNX file or ``onnx.ModelProto``.
        target: the linter's target (``"trt10-a100"``, ``"trt10-ampere"``, a :class:`Target`).
        gpu: a GPU of the table (:func:`qdq.lint.speed.gpus.find_gpu`); by default the one the
            target names (a generation without a model: a representative GPU, said in
            ``gpu_note``).
        shapes: sizes of the graph inputs, ``{name: dims}``; needed for a dynamic dimension.
        params: the time model's parameters (default: the fitted ones).
        layers: the linter's predicted layers of ``model`` when already at hand
            (:attr:`qdq.lint.LintReport.layers` for the same target); predicted otherwise.

    Raises:
        LintInputError: (a ``ValueError``) ``model`` cannot be read.
        ValueError: no GPU named and none follows from the target, an unknown GPU, a dynamic
            input without a size in ``shapes``, or a layer in a precision the GPU lacks
            (:class:`~qdq.lint.speed.cost.UnsupportedPrecisionError`, FP8 before Ada).
        TypeError: ``model`` is neither a path nor an ``onnx.ModelProto``.

    Example:
        >>> r = predict_latency("resnet18_qdq.onnx", target="trt10-a100",
        ...                     shapes={"input": (32, 3, 224, 224)})  # doctest: +SKIP
        >>> round(r.speedup_vs_fp16, 2)  # doctest: +SKIP
    """
    t = parse_target(target)
    device, note = _gpu_of(t, gpu)
    proto, label = load_model(model)
    p = params or load_params()
    if layers is None:
        from qdq.lint.report import lint

        layers = lint(proto, target=t).layers
    if not layers:
        raise ValueError(f"{label}: the linter predicts no engine layers (see its findings)")
    quantized = engine_layers(proto, layers, shapes=shapes)
    stripped = strip_qdq(proto)
    g16 = LintGraph(stripped)
    fp16 = engine_layers(stripped, predict_layers(g16, "fp16"), shapes=shapes, graph=g16)
    q_ms = [layer_time(e.cost, device, p).ms for e in quantized]
    f_ms = [layer_time(e.cost, device, p).ms for e in fp16]
    total, fp16_total = sum(q_ms), sum(f_ms)
    return LatencyReport(
        model=label,
        target=t.label,
        gpu=device.name,
        gpu_label=device.label,
        gpu_note=note,
        total_ms=total,
        fp16_total_ms=fp16_total,
        speedup_vs_fp16=fp16_total / total if total > 0 else 0.0,
        layers=_timed(quantized, q_ms),
        fp16_layers=_timed(fp16, f_ms),
        not_paying=tuple(_not_paying(quantized, q_ms, fp16, f_ms, device, p)),
        unsized=tuple(e.cost.name for e in quantized if not e.sized),
    )


def _gpu_of(t: Target, gpu: str | GPU | None) -> tuple[GPU, str]:
    """The GPU to time on and the note saying why (the target's representative GPU)."""
    if gpu is not None:
        return find_gpu(gpu), ""
    return gpu_for_target(t)


def _timed(found: list[EngineLayer], ms: list[float]) -> tuple[LayerLatency, ...]:
    return tuple(
        LayerLatency(e.cost.name, e.nodes, e.cost.op, e.cost.precision, t)
        for e, t in zip(found, ms, strict=True)
    )


def _not_paying(
    quantized: list[EngineLayer],
    q_ms: list[float],
    fp16: list[EngineLayer],
    f_ms: list[float],
    device: GPU,
    p: CostParams,
) -> list[NotPaying]:
    """Each quantized compute layer against the FP16 build's time of its nodes, counting its
    share of the standalone Q/DQ and quantized reformats next to it; a layer whose quantized
    output other quantized layers read would need a standalone Quantize of that output if it
    ran FP16, which counts on the FP16 side."""
    compute = [i for i, e in enumerate(quantized) if e.quantized and e.kind in _COMPUTE_KINDS]
    if not compute:
        return []
    extras: dict[int, list[tuple[int, float]]] = {i: [] for i in compute}
    readers: dict[int, list[int]] = {}
    for j, e in enumerate(quantized):
        for s in e.sources:
            readers.setdefault(s, []).append(j)
    for x, e in enumerate(quantized):
        if not _caused_by_quantization(e):
            continue
        owners = _owners(quantized, readers, x, set(compute))
        for i in owners:
            extras[i].append((x, q_ms[x] / len(owners)))
    node_owner = {n: i for i in compute for n in quantized[i].nodes}
    fp16_of: dict[int, float] = dict.fromkeys(compute, 0.0)
    fp16_readers: dict[int, list[int]] = {}
    for j, e in enumerate(fp16):
        for s in e.sources:
            fp16_readers.setdefault(s, []).append(j)
    for x, (e, t) in enumerate(zip(fp16, f_ms, strict=True)):
        if e.nodes:  # a layer: its weighted op (or first node) says whose it is
            owner = node_owner.get(e.nodes[0])
            if owner is not None:
                fp16_of[owner] += t
            continue
        # an input reformat the FP16 build needs where the Q/DQ build quantizes instead
        near = [fp16[j].nodes[0] for j in fp16_readers.get(x, []) if fp16[j].nodes]
        served = sorted({node_owner[n] for n in near if n in node_owner})
        for i in served:
            fp16_of[i] += t / len(served)
    for i in compute:
        theirs_q = _output_quantize_ms(quantized, readers, i, device, p)
        if theirs_q and fp16_of[i] > 0:
            fp16_of[i] += theirs_q
    out = []
    for i in compute:
        own, share = q_ms[i], sum(s for _, s in extras[i])
        mine, theirs = own + share, fp16_of[i]
        if theirs <= 0 or mine <= theirs:
            continue
        e = quantized[i]
        label = e.cost.precision.upper()
        if own > theirs:
            reason = f"the {label} kernel alone is predicted slower than FP16 ({own:.4f} ms)"
        else:
            first = quantized[extras[i][0][0]]
            more = f" and {len(extras[i]) - 1} more" if len(extras[i]) > 1 else ""
            why = f" ({first.reason})" if first.reason else ""
            reason = (
                f"{label} {own:.4f} ms + {share:.4f} ms of standalone Q/DQ and reformats: "
                f"{first.cost.name}{why}{more}"
            )
        out.append(NotPaying(e.cost.name, mine, theirs, reason))
    return out


def _output_quantize_ms(
    found: list[EngineLayer], readers: dict[int, list[int]], i: int, device: GPU, p: CostParams
) -> float:
    """The time of the standalone Quantize layer ``i``'s output would need if ``i`` ran in FP16:
    when it writes INT8/FP8 that a quantized layer (not a standalone Q/DQ) reads."""
    e = found[i]
    out = e.cost.out_precision
    if out is None or not is_quantized(out):
        return 0.0
    if not any(found[j].quantized and found[j].kind != "qdq" for j in readers.get(i, [])):
        return 0.0
    size = e.cost.write_bytes  # one byte per value
    q = CostLayer(f"{e.cost.name} output Quantize", "qdq", out, read_bytes=2.0 * size,
                  write_bytes=size)  # fmt: skip
    return layer_time(q, device, p).ms


def _caused_by_quantization(e: EngineLayer) -> bool:
    """A standalone Quantize/Dequantize, or a builder reformat to or from INT8/FP8."""
    if e.kind == "qdq":
        return True
    if e.kind != "reformat":
        return False
    return any(is_quantized(p.strip()) for p in e.reason.split("->"))


def _owners(
    found: list[EngineLayer], readers: dict[int, list[int]], x: int, compute: set[int]
) -> list[int]:
    """The quantized compute layers a standalone Q/DQ or reformat at ``x`` serves: those reading
    it (through quantized data-movement and pooling layers and further Q/DQ), else those it
    reads from."""
    for step in (lambda k: readers.get(k, []), lambda k: sorted(found[k].sources)):
        seen, todo, owners = {x}, [x], []
        while todo:
            k = todo.pop()
            for j in step(k):
                if j in seen:
                    continue
                seen.add(j)
                if j in compute:
                    owners.append(j)
                elif found[j].quantized or found[j].kind in ("qdq", "reformat"):
                    todo.append(j)
        if owners:
            return sorted(owners)
    return []


def _count(n: int, noun: str) -> str:
    """``"1 layer"``, ``"3 layers"``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def target_gpu(target: str | Target) -> tuple[GPU | None, str]:
    """``(GPU, note)`` a linter target times on (:func:`~qdq.lint.speed.gpus.gpu_for_target`),
    or ``(None, why)`` when it names no GPU (a bad target string still raises ``ValueError``)."""
    t = parse_target(target)
    try:
        return gpu_for_target(t)
    except ValueError as err:
        return None, str(err)


def speedup_text(speedup: float) -> str:
    """A speed-up with two decimals, or as many more as it takes not to round it across the
    warning's threshold (1.046 is under 1.05: not "1.05").

    Example:
        >>> speedup_text(1.5), speedup_text(1.046), speedup_text(1.0496), speedup_text(1.05)
        ('1.50', '1.046', '1.0496', '1.05')
    """
    text = f"{speedup:.2f}"
    for digits in range(3, 8):
        if (float(text) < SLOW_SPEEDUP) == (speedup < SLOW_SPEEDUP):
            break
        text = f"{speedup:.{digits}f}"
    return text
