"""Speed in the main job (issue 58): the predicted TensorRT engine time of the export against FP16,
and ``--objective speed``, which keeps in FP16 the layers whose quantization does not pay.

When the job's target names a GPU (``trt10-a100``, ``trt10-hopper``: :func:`target_gpu`), the
optional stage ``latency`` runs the linter's engine-time model
(:func:`qdq.lint.speed.latency.predict_latency`) on the exported ONNX at the job's batch
(:func:`job_shapes`) and :func:`add_speed` writes ``report.json: latency`` (its ``to_dict``) —
``null`` with ``latency_reason`` otherwise. A predicted speed-up under :data:`SLOW_SPEEDUP` is a
warning naming the layers where quantization does not pay.

``objective="speed"`` (:func:`keep_fp16`, the optional stage ``speed``, before the fallback search):
the calibrated plan is exported to a temporary file, its engine time predicted, and every
quantized layer predicted slower than in FP16 (its Q/DQ and reformats counted) is mapped back to
its module — through the Q/DQ nodes feeding it, whose names start with their quantizer's path as
in the manifest, and the plan's scale groups — and excluded, as a user exclusion would be. The
plan is prepared and calibrated again with those exclusions (the recipe's steps re-applied), and
kept only if its own export is not predicted slower. Each excluded module's plan points and
coverage row carry rule :data:`SPEED_RULE` and the prediction as their reason. The fallback search
(``max_drop``) then starts from that plan, so the accuracy guard holds for the final model, and
the job's accuracy figures are measured on its final export.
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from qdq.config import QuantConfig
from qdq.lint.speed.latency import SLOW_SPEEDUP, speedup_text
from qdq.pipeline.stages import Stages

__all__ = [
    "OBJECTIVES",
    "SLOW_SPEEDUP",
    "SPEED_RULE",
    "Kept",
    "SpeedChoice",
    "add_speed",
    "check_objective",
    "job_shapes",
    "keep_fp16",
    "latency_line",
    "latency_stage",
    "objective_entry",
    "owners_of",
    "slow_warning",
    "speedup_text",
    "target_gpu",
]

_log = logging.getLogger(__name__)

#: what ``qdq quantize`` optimises beyond the plan: ``accuracy`` (the placement rules only) or
#: ``speed`` (also keep in FP16 the layers whose quantization is predicted not to pay)
OBJECTIVES = ("accuracy", "speed")
#: the plan rule of a layer ``--objective speed`` kept in FP16
SPEED_RULE = "T01"
#: plan-rule ids the speed objective's exclusions replace (the planner's for an exclusion)
_EXCLUDED_RULE = "USER"
#: ONNX op types of the plan's op kinds (a non-weighted layer's owner is found by its op)
_ONNX_OPS = {
    "conv": ("Conv",), "conv_transpose": ("ConvTranspose",), "linear": ("Gemm", "MatMul"),
    "matmul": ("MatMul", "Gemm"), "bmm": ("MatMul",), "add": ("Add",), "sub": ("Sub",),
    "mul": ("Mul",), "cat": ("Concat",), "avg_pool": ("AveragePool", "GlobalAveragePool"),
    "max_pool": ("MaxPool",),
}  # fmt: skip


def target_gpu(target: str) -> tuple[Any, str]:
    """``(GPU, note)`` of the linter's ``target``, or ``(None, why)`` when it names no GPU (or is
    not a target: the job's own check of ``--target`` says so first)."""
    from qdq.lint.speed.latency import target_gpu as of_target

    try:
        return of_target(target)
    except ValueError as err:
        return None, str(err)


def check_objective(objective: object, target: str) -> str:
    """Check ``objective`` before anything runs; return it.

    Raises:
        ValueError: an unknown objective, or ``"speed"`` with a target that names no GPU (the
            engine time is predicted for a GPU).
    """
    if not isinstance(objective, str) or objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
    if objective == "speed":
        gpu, why = target_gpu(target)
        if gpu is None:
            raise ValueError(
                f"--objective speed predicts each layer's engine time on the target's GPU, and "
                f"target {target!r} names none ({why}); name one, e.g. --target trt10-a100 or "
                "trt10-hopper"
            )
    return objective


# --------------------------------------------------------------------------- the prediction
def job_shapes(
    onnx_path: str | Path, example: Iterable[Any], batch: int
) -> dict[str, tuple[int, ...]] | None:
    """The input shapes to predict at: ``None`` when every ONNX input is static (the export's
    batch), else every input's shape with its dynamic dimensions from the job — the batch
    ``batch``, the others the example's (a token sequence's length)."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    graph_inputs = [i for i in model.graph.input if i.name not in inits]
    tensors = [t for t in _leaves(example) if isinstance(t, torch.Tensor)]
    shapes: dict[str, tuple[int, ...]] = {}
    dynamic = False
    for k, inp in enumerate(graph_inputs):
        dims = inp.type.tensor_type.shape.dim
        like = tensors[k] if k < len(tensors) else None
        shape = []
        for j, d in enumerate(dims):
            if d.HasField("dim_value") and d.dim_value > 0:
                shape.append(int(d.dim_value))
                continue
            dynamic = True
            if j == 0:
                shape.append(int(batch))
            elif like is not None and j < like.dim():
                shape.append(int(like.shape[j]))
            else:
                shape.append(1)
        shapes[inp.name] = tuple(shape)
    return shapes if dynamic else None


def _leaves(x: Any) -> list[Any]:
    if isinstance(x, (list, tuple)):
        return [leaf for item in x for leaf in _leaves(item)]
    if isinstance(x, dict):
        return [leaf for item in x.values() for leaf in _leaves(item)]
    return [x]


def predict(
    onnx_path: str | Path, target: str, example: Iterable[Any], batch: int, lint: Any = None
) -> Any:
    """The :class:`~qdq.lint.speed.latency.LatencyReport` of ``onnx_path`` at the job's shapes
    (``lint``: the job's :class:`~qdq.lint.LintReport` of it, whose predicted layers are timed)."""
    from qdq.lint.speed import latency

    shapes = job_shapes(onnx_path, example, batch)
    layers = None if lint is None else lint.layers
    return latency.predict_latency(str(onnx_path), target=target, shapes=shapes, layers=layers)


def _ms(value: float) -> str:
    return f"{value:.3f}" if value < 10 else f"{value:.1f}"


def latency_line(lat: Any) -> str:
    """``predicted on <GPU>: <ms> ms vs FP16 <ms> ms (<x>x)``."""
    return (
        f"predicted on {lat.gpu_label}: {_ms(lat.total_ms)} ms vs FP16 "
        f"{_ms(lat.fp16_total_ms)} ms ({speedup_text(lat.speedup_vs_fp16)}x)"
    )


def slow_warning(lat: Any) -> str | None:
    """The warning when the engine is predicted less than :data:`SLOW_SPEEDUP` times faster than
    FP16 (naming the layers where quantization does not pay), else ``None``."""
    if lat.speedup_vs_fp16 >= SLOW_SPEEDUP:
        return None
    names = [str(n.name) for n in lat.not_paying]
    where = (
        f"quantization does not pay in {len(names)} layer(s): {', '.join(names[:5])}"
        + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        + " (report.json latency.not_paying; --objective speed keeps them in FP16)"
        if names
        else "no single layer is predicted slower than in FP16: the model gains too little from "
        "quantization at this shape (small or memory-bound layers)"
    )
    return (
        f"the Q/DQ engine is predicted only {speedup_text(lat.speedup_vs_fp16)}x as fast as FP16 on "
        f"{lat.gpu_label} ({_ms(lat.total_ms)} ms vs {_ms(lat.fp16_total_ms)} ms; qdq warns "
        f"under {SLOW_SPEEDUP}x): {where}"
    )


def latency_stage(
    stages: Stages,
    onnx_path: str | Path,
    target: str,
    example: Iterable[Any],
    batch: int,
    lint: Any = None,
) -> dict[str, Any]:
    """The optional stage ``latency`` on the job's export: ``{"latency", "latency_reason"}`` for
    ``report.json`` (the prediction, or ``None`` and why). ``lint``: the job's lint report of
    the export (its layers, linted with the job's build flags, are timed; ``None``: linted
    again). A slow engine warns (:func:`slow_warning`: the log and the report's warnings)."""
    gpu, why = target_gpu(target)
    if gpu is None:
        return {"latency": None, "latency_reason": f"no engine time predicted: {why}"}
    out: dict[str, Any] = {
        "latency": None,
        "latency_reason": "the latency stage failed (report.json: stage_errors)",
    }
    with stages.optional("latency") as st:
        lat = predict(onnx_path, target, example, batch, lint)
        entry = dict(lat.to_dict())
        entry["gpu_note"] = entry.get("gpu_note") or lat.gpu_note or why
        out = {"latency": entry, "latency_reason": None}
        st.detail = latency_line(lat)
        slow = slow_warning(lat)
        if slow is not None:
            st.detail += f"; under {SLOW_SPEEDUP}x ({len(lat.not_paying)} layer(s) do not pay)"
            _log.warning("qdq quantize: %s", slow)
            warnings.warn(slow, stacklevel=1)  # the job records its warnings in the report
    return out


def objective_entry(objective: str, choice: SpeedChoice | None) -> dict[str, Any]:
    """``report.json: objective``: ``{"name": "accuracy"}``, or what ``--objective speed``
    decided (:meth:`SpeedChoice.to_dict`; ``failed`` when its stage failed)."""
    if objective != "speed":
        return {"name": objective}
    if choice is None:
        return {"name": "speed", "kept_fp16": [], "failed": True,
                "summary": "the speed stage failed (report.json: stage_errors): the plan is the "
                "accuracy objective's"}  # fmt: skip
    return choice.to_dict()


def add_speed(report: dict[str, Any], latency: dict[str, Any], objective: dict[str, Any]) -> None:
    """Add the prediction (:func:`latency_stage`) and the objective (:func:`objective_entry`)
    to ``report``."""
    report.update(latency)
    report["objective"] = objective
    report.setdefault("settings", {})["objective"] = objective["name"]


# --------------------------------------------------------------------------- --objective speed
@dataclass(frozen=True)
class Kept:
    """One module ``--objective speed`` kept in FP16: the engine layer it belongs to, the rule
    and the prediction that decided it."""

    module: str
    layer: str
    quantized_ms: float
    fp16_ms: float
    rule: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict."""
        return {"module": self.module, "layer": self.layer, "quantized_ms": self.quantized_ms,
                "fp16_ms": self.fp16_ms, "rule": self.rule, "reason": self.reason}  # fmt: skip


@dataclass(frozen=True)
class SpeedChoice:
    """What ``--objective speed`` decided (``report.json: objective``).

    Attributes:
        kept: the modules kept in FP16 (:class:`Kept`).
        unmapped: not-paying layers no quantized module could be found for.
        before: the first export's prediction (``total_ms``, ``fp16_total_ms``,
            ``speedup_vs_fp16``, ``gpu``).
        after: the re-planned export's, or ``None`` when nothing changed.
        reverted: why the changes were dropped (the re-planned export predicted slower), or
            ``""``.
        config: the plan's config with the exclusions (what the fallback search starts from).
    """

    kept: tuple[Kept, ...]
    unmapped: tuple[str, ...]
    before: dict[str, Any]
    after: dict[str, Any] | None = None
    reverted: str = ""
    config: QuantConfig | None = None

    def summary(self) -> str:
        """One line for the stage."""
        b = self.before
        head = f"first export {_ms(b['total_ms'])} ms vs FP16 {_ms(b['fp16_total_ms'])} ms"
        if self.reverted:
            return f"{head}; {self.reverted}"
        if not self.kept:
            return f"{head}; no quantized layer is predicted slower than FP16: nothing kept in FP16"
        a = self.after or b
        return (
            f"{head}; {len(self.kept)} module(s) kept in FP16 ({SPEED_RULE}): "
            f"{', '.join(k.module for k in self.kept[:5])}; re-planned {_ms(a['total_ms'])} ms "
            f"({a['speedup_vs_fp16']:.2f}x)"
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict."""
        return {
            "name": "speed",
            "kept_fp16": [] if self.reverted else [k.to_dict() for k in self.kept],
            "candidates": [k.to_dict() for k in self.kept] if self.reverted else [],
            "unmapped": list(self.unmapped),
            "before": self.before,
            "after": self.after,
            "reverted": self.reverted or None,
            "summary": self.summary(),
        }

    def mark(self, prepared: nn.Module) -> None:
        """Give the kept modules' excluded plan points and coverage rows rule :data:`SPEED_RULE`
        and the prediction as their reason (the planner recorded them as user exclusions)."""
        if self.reverted or not self.kept:
            return
        from qdq.api import plan_of

        why: dict[str, str] = {}
        for k in self.kept:
            why[k.module] = "; ".join(filter(None, (why.get(k.module), k.reason)))
        plan = plan_of(prepared)
        points = tuple(
            replace(p, rule=SPEED_RULE, reason=why[p.owner])
            if p.owner in why and not p.quantized and p.rule == _EXCLUDED_RULE
            else p
            for p in plan.points
        )
        coverage = tuple(
            replace(c, rule=SPEED_RULE, reason=why[c.module])
            if c.module in why and c.status == "float" and c.rule == _EXCLUDED_RULE
            else c
            for c in plan.coverage
        )
        note = f"--objective speed kept in FP16 ({SPEED_RULE}): {', '.join(why)}"
        notes = plan.notes if note in plan.notes else (*plan.notes, note)
        new = replace(plan, points=points, coverage=coverage, notes=notes)
        object.__setattr__(prepared, "qdq_plan", new)


def _summary(lat: Any) -> dict[str, Any]:
    return {"total_ms": float(lat.total_ms), "fp16_total_ms": float(lat.fp16_total_ms),
            "speedup_vs_fp16": float(lat.speedup_vs_fp16), "gpu": str(lat.gpu_label)}  # fmt: skip


def owners_of(onnx_path: str | Path, lat: Any, plan: Any) -> tuple[list[Kept], list[str]]:
    """The modules of the not-paying layers of ``lat`` (a prediction of ``onnx_path``, the
    export of the model planned by ``plan``), and the layers none was found for.

    A layer's quantized inputs are the DequantizeLinear nodes feeding its ONNX nodes; each is
    named after its quantizer's module path (``0.weight_quantizer/DequantizeLinear``, as the
    manifest records ``onnx_nodes``), whose scale group's points name the ops: a weight's owner
    is the layer's module; without a weight, the points whose op is the node's."""
    import onnx

    gpu = str(lat.gpu_label)
    model = onnx.load(str(onnx_path), load_external_data=False)
    producer = {out: n for n in model.graph.node for out in n.output}
    by_name = {n.name: n for n in model.graph.node}
    groups = {g.quantizer: g for g in plan.groups if g.quantizer}
    points = {p.name: p for p in plan.points}
    nodes_of = {str(ly.name): tuple(ly.nodes) for ly in lat.layers}
    kept: list[Kept] = []
    unmapped: list[str] = []
    for slow in lat.not_paying:
        name = str(slow.name)
        layer_nodes = nodes_of.get(name) or tuple(name.split(" + "))
        weights: list[str] = []
        others: list[str] = []
        for node_name in layer_nodes:
            node = by_name.get(node_name)
            if node is None:
                continue
            for tensor in node.input:
                dq = producer.get(tensor)
                if dq is None or dq.op_type != "DequantizeLinear":
                    continue
                group = groups.get(dq.name.split("/")[0])
                members = [points[m] for m in (group.members if group else ()) if m in points]
                weights += [p.owner for p in members if p.kind == "weight"]
                ops = {p.owner for p in members if node.op_type in _ONNX_OPS.get(p.op, ())}
                owners = {p.owner for p in members}
                others += sorted(ops) if ops else sorted(owners) if len(owners) == 1 else []
        found = list(dict.fromkeys(weights or others))
        if not found:
            unmapped.append(name)
            continue
        q, f = float(slow.quantized_ms), float(slow.fp16_ms)
        reason = str(getattr(slow, "reason", "") or "").strip()
        text = (
            f"kept FP16 by --objective speed: predicted {q:.4f} ms quantized vs {f:.4f} ms "
            f"FP16 on {gpu}"
        )
        if reason:
            text += f" ({reason})"
        kept += [Kept(m, name, q, f, SPEED_RULE, text) for m in found]
    return kept, unmapped


def keep_fp16(
    objective: str,
    stages: Stages,
    done: Any,
    example: tuple[Any, ...],
    config: QuantConfig,
    calib: str | None,
    percentile: float | None,
    exporter: str,
    opset: int | None,
    target: str,
    size: int,
    static: bool,
) -> tuple[nn.Module, QuantConfig, SpeedChoice | None]:
    """``objective="speed"``: the calibrated model of ``done`` (:class:`~qdq.pipeline.recipe.
    Calibrated`) re-planned with its not-paying layers excluded (the stage ``speed``: the module
    docstring); ``(prepared, config, choice)``. ``"accuracy"``, or a failure of the stage
    (recorded in ``stage_errors``): ``done.prepared`` and ``config`` unchanged, ``choice``
    ``None``."""
    if objective != "speed":
        return done.prepared, config, None
    result: tuple[nn.Module, QuantConfig, SpeedChoice | None] = (done.prepared, config, None)
    with stages.optional("speed") as st:
        import qdq
        from qdq.lint import lint
        from qdq.pipeline.options import block_form, check_format_target

        flags = check_format_target(config.format, target)  # the job's build flags (FP8)
        form = block_form(config.format, target)  # the job's MXFP8 form

        def predicted(model: nn.Module, tmp: str, name: str) -> tuple[Path, Any]:
            path = Path(tmp) / name
            qdq.export_onnx(model, example, path, opset=opset, exporter=exporter,
                            dynamic_batch=not static, verify=False, block_form=form)  # fmt: skip
            layers = lint(path, target=target, flags=flags)
            return path, predict(path, target, example, size, layers)

        with tempfile.TemporaryDirectory(prefix="qdq-speed-") as tmp:
            path, first = predicted(done.prepared, tmp, "first.onnx")
            kept, unmapped = owners_of(path, first, qdq.plan_of(done.prepared))
            choice = SpeedChoice(tuple(kept), tuple(unmapped), _summary(first), config=config)
            if not kept:
                st.detail = choice.summary()
                return done.prepared, config, choice
            cfg = config
            for module in dict.fromkeys(k.module for k in kept):
                cfg = cfg.exclude(name=module)
            again = qdq.prepare(done.float_model, example, cfg)
            qdq.calibrate(again, done.batches, calib, percentile=percentile, show_progress=False)
            if done.improve is not None:
                done.improve(again)
            _, second = predicted(again, tmp, "fp16-kept.onnx")
        after = _summary(second)
        if after["total_ms"] > choice.before["total_ms"]:
            choice = replace(choice, after=after, reverted=(
                f"the changes were dropped: the re-planned export is predicted slower "
                f"({_ms(after['total_ms'])} ms vs {_ms(choice.before['total_ms'])} ms)"))  # fmt: skip
            result = (done.prepared, config, choice)
        else:
            choice = replace(choice, after=after, config=cfg)
            choice.mark(again)
            result = (again, cfg, choice)
        st.detail = choice.summary()
    return result
