"""Rule step 6 for the block formats (issue 60): NVFP4, MXFP8 and INT4 weight-only plans (F11-F17).

``QuantConfig(format="nvfp4" | "mxfp8")`` plans the FP8 plan first (:mod:`qdq.graph.formats`,
F01-F10) and then moves the GEMMs TensorRT runs in the block format; ``format="int4w"`` keeps
the INT4 weight-only GEMMs and leaves everything else float. The rules, as
:mod:`qdq.rules.tensorrt` states them with their sources:

* F11: a GEMM (Linear, MatMul/Gemm with a weight) whose reduction size K is a multiple of the
  block (NVFP4 16, MXFP8 32) and whose N is at least 16 runs the block format, weight and input:
  the weight blocked along its reduction axis (-1 for a Linear weight ``[out, in]``, -2 for a
  MatMul weight ``[K, N]``), the input along its last axis; NVFP4 inputs calibrate their per-tensor
  amax by max (the block scales are dynamic), MXFP8 inputs calibrate nothing;
* F12: a GEMM whose K is not a multiple of the block (or N below 16) takes the FP8 plan's
  decision: TensorRT quantizes whole blocks along the reduction axis;
* F13: convolutions and ConvTranspose take the FP8 plan's decision: TensorRT's FP4 and MX
  kernels are GEMMs (ModelOpt quantizes convolutions FP8 or INT8);
* F14: one quantize per tensor: a scale group runs a block format only when every reader of it
  runs that format (a GEMM input, or the fused residual of F15); otherwise its block readers take
  the FP8 plan's decision, to a fixed point (no format boundary inside a group). The block format
  is given up rather than a layer moved into a format it cannot run, or a user's choice undone;
* F15: a residual skip whose Add fuses into a block-format GEMM stays float: the fused Add reads
  its residual in the GEMM's float output precision, and block activations are quantized
  dynamically from a float tensor, so the float read costs nothing;
* F16 (``format="int4w"``, or ``Override(format="int4")``): a GEMM whose K is a multiple of 16
  gets INT4 weights in blocks of the largest of 128, 64, 32, 16 dividing K (max calibration) and
  a float input (weight-only);
* F17 (``format="int4w"``): everything else runs float: convolutions (no INT4 kernel), GEMMs
  whose K is not a multiple of 16, attention products and every non-weighted point.

Non-weighted points (residual skips, Concats, pools) are never block formats (TensorRT has no FP4
or MX element-wise layer): they follow the FP8 plan, and F10 leaves them float where they would
read a block or FP8 tensor. ``Override(format="nvfp4" | "mxfp8" | "int4")`` moves single layers
(rule ``USER``) in an FP8, mixed or block plan; where the layer cannot take the format the point's
reason says the override was refused and why (F12, F13), and the layer keeps its plan's format.
"""

from __future__ import annotations

from dataclasses import replace

import torch.fx as fx

from qdq.config import BLOCK_FORMATS, CalibSpec, QuantSpec
from qdq.graph.capture import fetch_attr
from qdq.graph.context import PlanContext, release
from qdq.graph.formats import GEMMS, WEIGHTED, assign_formats
from qdq.graph.plan import SKIP, QuantPoint, ScaleGroup
from qdq.graph.residual import fused_layer

__all__ = [
    "INT4_BLOCKS",
    "assign_block_formats",
    "block_kernel",
    "block_releases",
    "int4_block",
    "plan_int4w",
]

#: the block size of each activation-and-weight block format TensorRT runs
_BLOCK = {"nvfp4": 16, "mxfp8": 32}
#: INT4 weight-only block sizes, the first that divides K wins (ModelOpt's INT4_AWQ_CFG: 128)
INT4_BLOCKS = (128, 64, 32, 16)
#: block activations and INT4 weights: the per-tensor (NVFP4) or per-block (INT4) abs max
_MAX = CalibSpec(calibrator="max", method="max")
_WHY_FLOAT_INPUT = (
    "weight-only INT4 GEMM: its activation input stays float (TensorRT's INT4 weight-only GEMMs "
    "read FP16/BF16 activations; ModelOpt's INT4_AWQ_CFG quantizes no input)"
)

Decision = tuple[str | None, str, str]  # (block format or None: the FP8 plan's, rule, why)
Where = tuple[int, int]  # (the weight's reduction axis, negative; K)


def int4_block(k: int) -> int | None:
    """The INT4 weight block along a reduction of size ``k``: the largest of 128, 64, 32, 16
    dividing it; ``None`` when none does (F17).

    Example:
        >>> int4_block(768), int4_block(96), int4_block(24)
        (128, 32, None)
    """
    return next((b for b in INT4_BLOCKS if k >= b and k % b == 0), None)


def block_kernel(fmt: str, kind: str, wshape: tuple[int, ...]) -> Decision:
    """``(format or None, rule, reason)`` of one weighted layer for a block format (F11-F13,
    F16, F17): ``None`` when TensorRT has no ``fmt`` kernel for it.

    Args:
        fmt: ``"nvfp4"``, ``"mxfp8"`` or ``"int4"`` (weight-only).
        kind: ``"conv"``, ``"conv_transpose"``, ``"linear"`` or ``"matmul"``.
        wshape: the weight as the layer reads it (``(out, in)`` for Linear, ``(..., K, N)`` for
            MatMul).

    Example:
        >>> block_kernel("nvfp4", "linear", (768, 768))[:2]
        ('nvfp4', 'F11')
        >>> block_kernel("mxfp8", "linear", (64, 48))[:2]
        (None, 'F12')
        >>> block_kernel("nvfp4", "conv", (64, 64, 3, 3))[:2]
        (None, 'F13')
        >>> block_kernel("int4", "matmul", (96, 64))[:2]
        ('int4', 'F16')
    """
    if fmt not in BLOCK_FORMATS:
        raise ValueError(f"{fmt!r} is no block format; choose one of {', '.join(BLOCK_FORMATS)}")
    label = fmt.upper()
    if kind not in GEMMS:
        what = "ConvTranspose" if kind == "conv_transpose" else "convolution"
        if fmt == "int4":
            return None, "F17", f"{what}: TensorRT has no INT4 weight-only convolution"
        return (
            None,
            "F13",
            f"{what}: TensorRT has no {label} convolution (its FP4/MX kernels are GEMMs; "
            "ModelOpt quantizes convolutions FP8 or INT8)",
        )
    n, k = (wshape[0], wshape[1]) if kind == "linear" else (wshape[-1], wshape[-2])
    if fmt == "int4":
        b = int4_block(k)
        if b is None:
            return None, "F17", f"GEMM with K={k}: no multiple of 16, no INT4 weight block"
        return (
            "int4",
            "F16",
            f"INT4 weight-only GEMM (K={k} in blocks of {b}, N={n}): TensorRT 10.0+ block-wise "
            "INT4 weights, float activations",
        )
    block = _BLOCK[fmt]
    if k % block or n < 16:
        why = f"K={k} is not a multiple of the {label} block ({block})" if k % block else ""
        why = why or f"N={n} < 16: no {label} tensor-core tile"
        return None, "F12", f"{why}: TensorRT quantizes whole blocks along the reduction axis"
    since = "10.8" if fmt == "nvfp4" else "10.12"
    return (
        fmt,
        "F11",
        f"{label} GEMM (K={k} in blocks of {block}, N={n}): TensorRT {since}+ block-scaled GEMM "
        "on Blackwell",
    )


def assign_block_formats(
    ctx: PlanContext, points: list[QuantPoint], groups: list[ScaleGroup]
) -> list[QuantPoint]:
    """The formats of a plan that is not INT8 only: F01-F10 (:func:`assign_formats`), and F11-F16
    where the plan is ``nvfp4``/``mxfp8`` or an ``Override`` asks for a block format.

    Returns:
        The points with their specs; each quantized point's reason ends with its format, its
        rule and why.
    """
    cfg = ctx.config
    if cfg.format not in _BLOCK and not any(o.format in BLOCK_FORMATS for o in cfg.overrides):
        return assign_formats(ctx, points, groups)
    base_cfg = replace(
        cfg,
        format="fp8" if cfg.format in _BLOCK else cfg.format,
        overrides=tuple(
            replace(o, format=None) if o.format in BLOCK_FORMATS else o for o in cfg.overrides
        ),
    )
    base = assign_formats(replace(ctx, config=base_cfg), points, groups)
    layer, where = _layers(ctx, points)
    skips = _fused_skips(ctx, points)
    _settle(points, groups, layer, skips)
    out = []
    for p, b in zip(points, base, strict=True):
        if not p.quantized or p.group is None or p.spec is None or p.calib is None:
            out.append(b)
        elif p.name in skips and layer.get(skips[p.name], (None,))[0] in _BLOCK:
            owner = skips[p.name]
            why = (
                f"the residual skip of an Add fused into {owner}, a "
                f"{str(layer[owner][0]).upper()} GEMM: the fused Add reads its residual in the "
                "GEMM's float output, and block inputs are quantized dynamically from a float "
                "tensor, so it stays float at no cost"
            )
            out.append(replace(b, reason=f"{p.reason}; float (F15: {why})", format_rule="F15"))
        elif p.owner in layer and (p.kind == "weight" or p.op in WEIGHTED):
            w = where.get(p.owner, (-1, 0))
            out.append(_with_block(p, b, layer[p.owner], w, cfg.activation_calib))
        else:
            out.append(b)
    return out


def block_releases(points: list[QuantPoint]) -> list[tuple[QuantPoint, str, str]]:
    """``(point, rule, why)`` for the inputs a block plan reads in float: the residual skips of
    Adds fused into a block-format GEMM (F15) and the inputs of INT4 weight-only GEMMs (F16).
    The planner releases them and plans the formats again."""
    out = []
    for p in points:
        if p.quantized and p.kind == "input" and p.format_rule in ("F15", "F16"):
            why = p.reason.rsplit(f"({p.format_rule}: ", 1)[-1].removesuffix(")")
            out.append((p, str(p.format_rule), why))
    return out


def plan_int4w(ctx: PlanContext) -> None:
    """``format="int4w"`` (F16, F17), before the scale groups: every GEMM that can run INT4
    weight-only keeps its weight, INT4 in blocks along its reduction axis, and reads its input in
    float; every other point runs float. ``Override(format="int4")`` is the plan's own choice;
    another format is refused (the reason says so)."""
    nodes = {owner: node for node, owner in ctx.owners.items()}
    for p in list(ctx.points.values()):
        if not p.quantized:
            continue
        if p.kind == "input":
            w = ctx.points.get(f"{p.owner}:weight")
            if p.op in GEMMS and w is not None and w.quantized and _int4(ctx, w)[0] is not None:
                release(ctx, p, "F16", _WHY_FLOAT_INPUT)
            else:
                why = (
                    "an int4w plan quantizes INT4 GEMM weights only (weight-only GEMMs are for "
                    "memory-bound layers): the rest runs float"
                )
                release(ctx, p, "F17", why)
            continue
        (fmt, rule, why), (axis, k) = _int4(ctx, p)
        chosen = _overridden(ctx, nodes.get(p.owner))
        if chosen not in (None, "int4"):
            why = f"Override(format={chosen!r}) refused in an int4w plan; {why}"
        if fmt is None:
            ctx.add(
                replace(
                    p,
                    decision=SKIP,
                    rule=rule,
                    reason=f"float ({rule}: {why})",
                    spec=None,
                    calib=None,
                )
            )
            continue
        spec = QuantSpec.block("int4", axis=axis, block_size=int4_block(k))
        reason = (
            f"INT4 weights blocked along axis {axis} in blocks of {spec.block_size} (F16: {why})"
        )
        ctx.add(replace(p, spec=spec, calib=_MAX, reason=reason, format_rule="F16"))


# ----------------------------------------------------------------- helpers
def _int4(ctx: PlanContext, w: QuantPoint) -> tuple[Decision, Where]:
    """F16/F17 for one weight point, and where its blocks run."""
    shape = _operand_shape(ctx, w)
    decision = block_kernel("int4", w.op, shape)
    axis = _reduction_axis(ctx, w)
    if decision[0] is not None and axis is None:
        decision = (None, "F17", "a permuted MatMul weight of more than 2 axes")
    k = shape[1] if w.op == "linear" else shape[-2] if len(shape) > 1 else 0
    return decision, (axis if axis is not None else -1, k)


def _layers(
    ctx: PlanContext, points: list[QuantPoint]
) -> tuple[dict[str, Decision], dict[str, Where]]:
    """Weighted layer (owner) -> its block decision: every layer of an ``nvfp4``/``mxfp8`` plan,
    and the layers an ``Override(format=<block>)`` names in any plan; and where its weight's
    blocks run."""
    cfg = ctx.config
    plan_fmt = cfg.format if cfg.format in _BLOCK else None
    nodes = {owner: node for node, owner in ctx.owners.items()}
    layer: dict[str, Decision] = {}
    where: dict[str, Where] = {}
    for p in points:
        if not p.quantized or p.kind != "weight" or p.op not in WEIGHTED or p.owner in layer:
            continue
        chosen = _overridden(ctx, nodes.get(p.owner))
        want = plan_fmt if chosen is None else chosen if chosen in BLOCK_FORMATS else None
        if want is None:
            continue
        shape = _operand_shape(ctx, p)
        fmt, rule, why = block_kernel(want, p.op, shape)
        axis = _reduction_axis(ctx, p)
        if fmt is not None and axis is None:
            fmt, rule, why = None, "F12", "a permuted MatMul weight of more than 2 axes"
        if chosen == want and fmt is not None:
            rule, why = "USER", f"{want.upper()} set by the QuantConfig ({why})"
        elif chosen == want:
            why = f"Override(format={want!r}) refused: {why}"
        layer[p.owner] = (fmt, rule, why)
        if axis is not None:
            where[p.owner] = (axis, shape[1] if p.op == "linear" else shape[-2])
    return layer, where


def _overridden(ctx: PlanContext, node: fx.Node | None) -> str | None:
    """The format the last matching ``Override(format=...)`` gives ``node``'s layer."""
    if node is None:
        return None
    chosen = None
    for o in ctx.config.overrides:
        if o.format is not None and o.matches(
            ctx.owners[node], ctx.owner_types.get(node), ctx.kinds[node]
        ):
            chosen = o.format
    return chosen


def _fused_skips(ctx: PlanContext, points: list[QuantPoint]) -> dict[str, str]:
    """Residual skip point -> the owner of the weighted layer its Add fuses into (P03)."""
    out = {}
    for p in points:
        node = fused_layer(ctx, p)
        if node is not None and ctx.owners.get(node):
            out[p.name] = ctx.owners[node]
    return out


def _settle(
    points: list[QuantPoint],
    groups: list[ScaleGroup],
    layer: dict[str, Decision],
    skips: dict[str, str],
) -> None:
    """F14 to a fixed point: a group runs a block format only when every member is the input or
    weight of a layer running that one format, or a residual skip fused into one (F15);
    otherwise its block readers take the FP8 plan's decision. The inputs of INT4 weight-only
    layers read float (F16): they do not count."""
    by_name = {p.name: p for p in points}
    changed = True
    while changed:
        changed = False
        for g in groups:
            block: list[tuple[str, str]] = []  # (owner, block format)
            other: list[QuantPoint] = []
            for m in g.members:
                p = by_name[m]
                fmt = layer.get(p.owner, (None,))[0]
                if (p.kind == "input" and fmt == "int4") or (
                    m in skips and layer.get(skips[m], (None,))[0] in _BLOCK
                ):
                    continue
                if (p.kind == "weight" or p.op in GEMMS) and fmt in _BLOCK:
                    block.append((p.owner, str(fmt)))
                else:
                    other.append(p)
            fmts = {f for _, f in block}
            if not block or (len(fmts) == 1 and not other):
                continue
            if other:
                o = other[0]
                what = f"{o.owner} ({'a GEMM' if o.op in GEMMS else 'a ' + o.op} without a block format)"
            else:
                what = " and ".join(f"{o} in {f.upper()}" for o, f in block[:2])
            tensor = "weight" if by_name[g.leader].kind == "weight" else "input tensor"
            for owner, _ in block:
                layer[owner] = (
                    None,
                    "F14",
                    f"its {tensor} is also read by {what}: one quantize per tensor, so it takes "
                    "the FP8 plan's format",
                )
                changed = True


def _with_block(
    p: QuantPoint, b: QuantPoint, decision: Decision, where: Where, act: CalibSpec
) -> QuantPoint:
    """The point ``p`` of a layer with a block decision (``b``: its FP8-plan point)."""
    fmt, rule, why = decision
    axis, k = where
    if fmt is None:  # the FP8 plan's format, and why no block format
        return replace(b, reason=f"{b.reason}; no block format ({rule}: {why})", format_rule=rule)
    assert p.calib is not None
    if fmt == "int4":  # Override(format="int4"): weight-only
        if p.kind == "input":  # released by the planner (block_releases)
            reason = f"{p.reason}; float (F16: {_WHY_FLOAT_INPUT})"
            return replace(b, reason=reason, format_rule="F16")
        spec = QuantSpec.block("int4", axis=axis, block_size=int4_block(k))
        reason = (
            f"INT4 weights blocked along axis {axis} in blocks of {spec.block_size} ({rule}: {why})"
        )
        return replace(p, spec=spec, calib=_MAX, reason=reason, format_rule=rule)
    if p.kind == "weight":
        return replace(
            p,
            spec=QuantSpec.block(fmt, axis=axis),
            reason=f"{fmt.upper()} weights blocked along axis {axis} ({rule}: {why})",
            format_rule=rule,
        )
    calib = _MAX if p.calib == act and p.calib == CalibSpec() else p.calib
    scales = (
        "per-tensor amax by max, block scales at run time"
        if fmt == "nvfp4"
        else "nothing calibrated, E8M0 block scales at run time"
    )
    return replace(
        p,
        spec=QuantSpec.block(fmt, axis=-1),
        calib=calib,
        reason=f"{p.reason}; {fmt.upper()} input blocked along its last axis, {scales} "
        f"({rule}: {why})",
        format_rule=rule,
    )


def _operand_shape(ctx: PlanContext, p: QuantPoint) -> tuple[int, ...]:
    """The weight as the layer reads it (through a transpose of the parameter)."""
    site = ctx.by_name[p.consumer]
    if ctx.kinds.get(site) not in WEIGHTED:  # W.t() before a MatMul
        return tuple(site.meta["tensor_meta"].shape)
    node = ctx.by_name[p.producer]
    if node.op == "get_attr":
        return tuple(fetch_attr(ctx.root, str(node.target)).shape)
    return tuple(node.meta["tensor_meta"].shape)


def _reduction_axis(ctx: PlanContext, p: QuantPoint) -> int | None:
    """The weight parameter's reduction (K) axis, negative: -1 for Linear ``[out, in]``, -2 for a
    MatMul weight ``[..., K, N]``, the other axis of a transposed 2-D parameter; ``None`` for a
    permuted parameter of more than 2 axes or a convolution."""
    if p.op == "linear":
        return -1
    if p.op != "matmul":
        return None
    if ctx.kinds.get(ctx.by_name[p.consumer]) in WEIGHTED:
        return -2
    if len(_operand_shape(ctx, p)) != 2 or p.spec is None or p.spec.axis is None:
        return None
    return (1 - p.spec.axis % 2) - 2  # the parameter's axis that is not the output column
