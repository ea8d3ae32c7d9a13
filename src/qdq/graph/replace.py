"""The module-replacement path for models torch.fx cannot trace.

Every Conv/ConvTranspose/Linear (and subclass) becomes :class:`qdq.nn.QuantWeighted`, every average
pool :class:`qdq.nn.QuantInput`, in a deep copy. Rules that need the graph (P03 residual Adds, S02
Concat groups, S03 MaxPool sharing) cannot be applied; the plan says so in its notes.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import torch
from torch import nn

from qdq.config import QuantConfig
from qdq.graph.capture import TRACE_THROUGH
from qdq.graph.plan import QUANTIZE, SKIP, Coverage, QuantPlan, QuantPoint, ScaleGroup
from qdq.graph.weighted import performance_skip
from qdq.nn import QuantInput, QuantWeighted

__all__ = ["prepare_by_replacement"]

_AVG_POOLS = (
    nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
    nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
)  # fmt: skip
_CONV_T = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)


def prepare_by_replacement(
    model: nn.Module, config: QuantConfig, why: str
) -> tuple[nn.Module, QuantPlan]:
    """A copy of ``model`` with quantized Conv/Linear/average-pool modules, and its plan."""
    clone = copy.deepcopy(model)
    points: list[QuantPoint] = []
    coverage: list[Coverage] = []
    groups: list[ScaleGroup] = []
    for name, module in list(clone.named_modules()):
        if isinstance(module, TRACE_THROUGH):
            _weighted(clone, name, module, config, points, coverage, groups)
        elif isinstance(module, _AVG_POOLS) and config.family_enabled("pooling"):
            excluded, calib, _ = config.resolve(name, type(module), "avg_pool")
            if excluded:
                continue
            q = QuantInput(module, name=name, calib=calib or config.activation_calib)
            clone.set_submodule(name, q)
            gid = len(groups)
            groups.append(
                ScaleGroup(
                    gid, f"{name}:input", (f"{name}:input",), (), (), f"{name}.input_quantizer"
                )
            )
            points.append(_p(name, "avg_pool", "input", QUANTIZE, "P06", "average pool input", gid))
    notes = (
        f"torch.fx cannot trace the model ({why})",
        "module-replacement fallback: Conv/Linear inputs and weights and average-pool inputs are "
        "quantized; residual Adds (P03), Concat groups (S02) and MaxPool sharing (S03) are NOT "
        "placed. Use qdq.nn.QuantAdd / qdq.nn.QuantConcat in the model's forward for those.",
    )
    plan = QuantPlan(type(model).__name__, tuple(points), tuple(groups), tuple(coverage), notes)
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
    groups: list[ScaleGroup],
) -> None:
    op = (
        "conv_transpose"
        if isinstance(module, _CONV_T)
        else "linear"
        if isinstance(module, nn.Linear)
        else "conv"
    )
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
    wrapped = QuantWeighted(module, name=name, weight_spec=wspec, input_spec=ispec,
                            input_calib=calib or config.activation_calib)  # fmt: skip
    root.set_submodule(name, wrapped)
    for kind, rule, reason, spec in (
        ("weight", wrule, wreason, wspec),
        ("input", "P01", f"activation input of {op}", ispec),
    ):
        gid = len(groups)
        groups.append(
            ScaleGroup(
                gid, f"{name}:{kind}", (f"{name}:{kind}",), (), (), f"{name}.{kind}_quantizer"
            )
        )
        point_calib = config.weight_calib if kind == "weight" else calib or config.activation_calib
        point = _p(name, op, kind, QUANTIZE, rule, reason, gid)
        points.append(replace(point, spec=spec, calib=point_calib))
    coverage.append(
        Coverage(name, type(module).__name__, "int8", "P01", "module replaced by QuantWeighted")
    )
