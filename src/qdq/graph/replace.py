"""The graphless fallback, for models that cannot be recorded.

Without a graph only what needs none is placed: every Conv/ConvTranspose/Linear module (and
subclass) gets an input and a weight quantizer, applied at every call of that module (one
quantizer each, however often it is called), and every average pool an input quantizer (P06).
Rules that need the dataflow (P03 residual Adds, S02 Concat groups, S03 MaxPool sharing) cannot
be applied; the plan says so in its notes. The quantizers are applied by the same call-site
runtime as the full plan (:mod:`qdq.graph.runtime`), so the model exports with both exporters.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import torch
from torch import nn

from qdq.config import QuantConfig
from qdq.graph.calls import MODULE, SiteKey
from qdq.graph.capture import TRACE_THROUGH
from qdq.graph.plan import QUANTIZE, SKIP, Coverage, QuantPlan, QuantPoint, ScaleGroup
from qdq.graph.runtime import Site, SiteRuntime, install_runtime
from qdq.graph.weighted import performance_skip
from qdq.quant import Quantizer

__all__ = ["prepare_by_replacement"]

_AVG_POOLS = (
    nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
    nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
)  # fmt: skip
_CONV_T = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


def _families(module: nn.Module) -> tuple[str, tuple[str, ...]]:
    """The op kind and the torch calls a weighted module makes (``conv2d`` for a Conv2d...)."""
    if isinstance(module, _CONV_T):
        return "conv_transpose", tuple(f"conv_transpose{d}d" for d in (1, 2, 3))
    if isinstance(module, nn.Linear):
        return "linear", ("linear",)
    return "conv", tuple(f"conv{d}d" for d in (1, 2, 3))


def prepare_by_replacement(
    model: nn.Module, config: QuantConfig, why: str
) -> tuple[nn.Module, QuantPlan]:
    """A copy of ``model`` with quantized Conv/Linear/average-pool calls, and its plan."""
    clone = copy.deepcopy(model)
    points: list[QuantPoint] = []
    coverage: list[Coverage] = []
    groups: list[ScaleGroup] = []
    sites: dict[SiteKey, Site] = {}

    def add(name: str, op: str, kind: str, rule: str, reason: str, q: Quantizer) -> None:
        gid = len(groups)
        path = f"{name}.{kind}_quantizer"
        groups.append(ScaleGroup(gid, f"{name}:{kind}", (f"{name}:{kind}",), (), (), path))
        point = _p(name, op, kind, QUANTIZE, rule, reason, gid)
        points.append(replace(point, spec=q.spec, calib=q.calib))

    for name, module in list(clone.named_modules()):
        if isinstance(module, TRACE_THROUGH) and name:
            _weighted(clone, name, module, config, points, coverage, sites, add)
        elif isinstance(module, _AVG_POOLS) and name and config.family_enabled("pooling"):
            excluded, calib, _ = config.resolve(name, type(module), "avg_pool")
            if excluded:
                continue
            q = Quantizer(config.activation, calib or config.activation_calib, name=f"{name}:input")
            module.add_module("input_quantizer", q)
            sites[(name, MODULE, None)] = Site([(0, q)])
            add(name, "avg_pool", "input", "P06", "average pool input", q)
    notes = (
        f"the model could not be recorded ({why})",
        "graphless fallback: Conv/Linear inputs and weights and average-pool inputs are "
        "quantized; residual Adds (P03), Concat groups (S02) and MaxPool sharing (S03) are NOT "
        "placed. Use qdq.nn.QuantAdd / qdq.nn.QuantConcat in the model's forward for those.",
    )
    install_runtime(clone, SiteRuntime(clone, sites))
    plan = QuantPlan(
        type(model).__name__, tuple(points), tuple(groups), tuple(coverage), notes, "replacement"
    )
    return clone, plan


def _p(
    name: str, op: str, kind: str, decision: str, rule: str, reason: str, group: int | None
) -> QuantPoint:
    return QuantPoint(
        name=f"{name}:{kind}", owner=name, op=op, kind=kind, consumer=name, arg=0 if kind == "input" else 1,
        producer=kind, decision=decision, rule=rule, reason=reason, group=group,
    )  # fmt: skip


def _weighted(
    root: nn.Module,
    name: str,
    module: nn.Module,
    config: QuantConfig,
    points: list[QuantPoint],
    coverage: list[Coverage],
    sites: dict[SiteKey, Site],
    add: object,
) -> None:
    op, families = _families(module)
    excluded, calib, bits = config.resolve(name, type(module), op)
    weight = module.weight
    assert isinstance(weight, torch.Tensor)
    shape = tuple(weight.shape)
    group_count = int(getattr(module, "groups", 1))
    skip = ("USER", "excluded by the QuantConfig") if excluded else None
    if skip is None and config.family_enabled("performance"):
        skip = performance_skip(op, shape, group_count)
    if skip is not None:
        for kind in ("weight", "input"):
            points.append(_p(name, op, kind, SKIP, skip[0], skip[1], None))
        coverage.append(Coverage(name, type(module).__name__, "float", skip[0], skip[1]))
        return
    wspec = config.weight if bits is None else replace(config.weight, num_bits=bits)
    wrule, wreason = "P01", "weights per output channel (axis 0)"
    if op == "conv_transpose":
        axis = 1 if config.conv_transpose_axis == 1 and group_count == 1 else None
        wspec, wrule, wreason = (
            replace(wspec, axis=axis),
            "V12",
            f"ConvTranspose weights axis {axis}",
        )
    ispec = config.activation if bits is None else replace(config.activation, num_bits=bits)
    wq = Quantizer(wspec, config.weight_calib, name=f"{name}:weight")
    iq = Quantizer(ispec, calib or config.activation_calib, name=f"{name}:input")
    module.add_module("weight_quantizer", wq)
    module.add_module("input_quantizer", iq)
    wq.calibrate_from(weight)
    for family in families:
        sites[(name, family, None)] = Site([(0, iq), (1, wq)])
    assert callable(add)
    add(name, op, "weight", wrule, wreason, wq)
    add(name, op, "input", "P01", f"activation input of {op}", iq)
    coverage.append(
        Coverage(name, type(module).__name__, "int8", "P01", "every call of the module quantized")
    )
