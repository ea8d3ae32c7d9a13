"""``--format mixed --objective speed`` (issue 58): each measured layer's predicted time in INT8 and
in FP8 on the target's GPU, the tie-break of :func:`qdq.accuracy.formats.choose_formats` (rule
T02).

A layer is one engine layer of the linter's time model (:func:`qdq.lint.speed.cost.layer_time`)
in each format, sized from what one forward of the calibration batch gives it (its input, its
weight and, for a convolution, its output; the job's batch): a convolution's MACs and its GEMM
per group, a Linear's or a MatMul's rows, output columns and reduction. Both formats move the
same bytes (8-bit input and weight, an FP32 bias, the output in FP16: its reader's format is the
same either way), so what differs is the math: the GPU's INT8 and FP8 tensor-core peaks (equal on
Hopper, Blackwell and the datacenter Ada parts; FP8 is half of INT8 on GeForce Ada, whose FP8
accumulates in FP32) and, for a convolution whose channels per group do not fill the tensor
cores' 16-byte vectors, the CUDA-core rate (INT8's dp4a at 4x FP32, FP8 at 2x). Two times within
:data:`TIME_TIE` of each other are the same time: :func:`faster` says neither.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

__all__ = [
    "FORMATS",
    "TIME_TIE",
    "LayerShape",
    "cost_layer",
    "faster",
    "format_times",
    "nvfp4_times",
    "shape_of",
]

#: the two formats a mixed plan chooses between, in the order of :func:`format_times`' pairs
FORMATS = ("int8", "fp8")
#: two predicted times within this share of each other are the same (the model's own error is
#: larger: a tie-break on less would follow noise)
TIME_TIE = 0.02


@dataclass(frozen=True)
class LayerShape:
    """What a weighted layer computes, as one forward saw it.

    Attributes:
        op: ``"conv"``, ``"deconv"`` or ``"gemm"`` (Linear, a MatMul with a parameter).
        x: its input's shape; ``w``: its weight's; ``y``: its output's (``None``: not seen,
            a GEMM needs none).
        groups: convolution groups.
        bias: the bias's values (0: none).
    """

    op: str
    x: tuple[int, ...]
    w: tuple[int, ...]
    y: tuple[int, ...] | None = None
    groups: int = 1
    bias: int = 0


def shape_of(
    module: Any, x: tuple[int, ...], w: tuple[int, ...], y: tuple[int, ...] | None
) -> LayerShape | None:
    """The :class:`LayerShape` of a weighted layer: ``module`` (the owner's module, ``None`` for
    a functional MatMul), the shapes of its input ``x``, weight ``w`` and output ``y``; ``None``
    when they do not describe one (a convolution whose output was not seen)."""
    x, w = tuple(int(d) for d in x), tuple(int(d) for d in w)
    if not x or not w:
        return None
    bias = getattr(module, "bias", None)
    n_bias = int(bias.numel()) if isinstance(bias, nn.Parameter) else 0
    if isinstance(module, nn.modules.conv._ConvNd):
        if y is None or len(x) < 3:
            return None
        op = "deconv" if module.transposed else "conv"
        return LayerShape(op, x, w, tuple(int(d) for d in y), int(module.groups), n_bias)
    return LayerShape("gemm", x, w, None if y is None else tuple(int(d) for d in y), 1, n_bias)


def cost_layer(name: str, shape: LayerShape, precision: str) -> Any:
    """``shape`` as a :class:`~qdq.lint.speed.cost.CostLayer` running at ``precision`` (input
    and weight at its bytes per value: 8-bit, or NVFP4's with its block scales; FP32 bias, FP16
    output)."""
    from qdq.lint.speed.cost import ELEMENT_BYTES, CostLayer

    per = ELEMENT_BYTES.get(precision, 1.0)
    x, w, groups = shape.x, shape.w, max(1, shape.groups)
    if shape.op == "gemm":
        k = x[-1]
        rows = math.prod(x) // max(k, 1)
        n = math.prod(w) // max(k, 1)
        macs, gemm, per_group, out = float(rows * n * k), (rows, n, k), 0, rows * n
    else:
        assert shape.y is not None
        kernel = math.prod(w[2:])
        if shape.op == "conv":  # w: [Cout, Cin/g, k...]
            per_group, rows = w[1], shape.y[0] * math.prod(shape.y[2:])
            n_per, k_per = shape.y[1] // groups, per_group * kernel
        else:  # ConvTranspose, w: [Cin, Cout/g, k...]
            per_group, rows = x[1] // groups, x[0] * math.prod(x[2:])
            n_per, k_per = w[1] * kernel, per_group
        macs = float(rows) * n_per * k_per * groups
        gemm, out = (rows, max(n_per, 1), max(k_per, 1)), math.prod(shape.y)
    return CostLayer(
        name, shape.op, precision, macs=macs, read_bytes=per * math.prod(x),
        write_bytes=2.0 * out, weight_bytes=per * math.prod(w) + 4.0 * shape.bias, gemm=gemm,
        groups=groups if shape.op != "gemm" else 1, group_channels=per_group,
    )  # fmt: skip


def format_times(shapes: Mapping[str, LayerShape], gpu: Any) -> dict[str, tuple[float, float]]:
    """Each layer's predicted ``(INT8 ms, FP8 ms)`` on ``gpu`` (a
    :class:`~qdq.lint.speed.gpus.GPU`); ``{}`` when the GPU has no FP8 kernels (a mixed plan
    cannot choose FP8 there: nothing to break a tie with)."""
    from qdq.lint.speed.cost import UnsupportedPrecisionError, layer_time

    if gpu.peak("fp8") is None or gpu.peak("int8") is None:
        return {}
    out: dict[str, tuple[float, float]] = {}
    for name, shape in shapes.items():
        try:
            i8, f8 = (layer_time(cost_layer(name, shape, fmt), gpu).ms for fmt in FORMATS)
        except UnsupportedPrecisionError:
            continue
        out[name] = (i8, f8)
    return out


def nvfp4_times(shapes: Mapping[str, LayerShape], gpu: Any) -> dict[str, float]:
    """Each GEMM layer's predicted NVFP4 time on ``gpu`` (kernel rule K08: the FP4 rate, values
    moved with their E4M3 block scales); ``{}`` when the GPU has no FP4 kernels. Convolutions
    have none (F13)."""
    from qdq.lint.speed.cost import layer_time

    if gpu.peak("fp4") is None:  # (with them, no NVFP4 layer is refused)
        return {}
    return {
        name: layer_time(cost_layer(name, shape, "nvfp4"), gpu).ms
        for name, shape in shapes.items()
        if shape.op == "gemm"
    }


def faster(int8_ms: float, fp8_ms: float) -> str | None:
    """``"int8"`` or ``"fp8"``, the format predicted faster by more than :data:`TIME_TIE`;
    ``None`` when the two are the same time."""
    if int8_ms < fp8_ms * (1.0 - TIME_TIE):
        return "int8"
    if fp8_ms < int8_ms * (1.0 - TIME_TIE):
        return "fp8"
    return None
