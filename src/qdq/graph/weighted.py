"""Rule step 1: weighted ops (P01, V12, P08, H02, P14, P15) and attention MatMuls (P16)."""

from __future__ import annotations

from dataclasses import replace

import torch.fx as fx

from qdq.config import QuantSpec
from qdq.graph.attention import MAX_INT8_SEQUENCE, attention_role, key_length
from qdq.graph.capture import fetch_attr
from qdq.graph.context import PlanContext, input_label, make_point, quantize_input, skip_input
from qdq.graph.patterns import (
    COPY_KINDS,
    computed_weight_arg,
    conv_groups,
    tensor_inputs,
    transposed_weight_arg,
    weight_arg,
)
from qdq.graph.plan import QUANTIZE, SKIP, QuantPoint
from qdq.graph.streams import stream_norm

__all__ = ["FOLDED_REASON", "performance_skip", "plan_weighted"]

#: why a weighted call on constants alone stays float: the builder folds it, no runtime layer
FOLDED_REASON = "its input is computed from shapes and constants only: folded, kept float"


def _weight_shape(ctx: PlanContext, w: fx.Node) -> tuple[int, ...]:
    if w.op != "get_attr":  # computed from parameters in forward: its recorded shape
        return tuple(w.meta["tensor_meta"].shape)
    return tuple(fetch_attr(ctx.root, str(w.target)).shape)


def _conv_groups(node: fx.Node) -> int:
    """``groups`` of F.conv*/F.conv_transpose*; 1 when it is not a literal int."""
    groups = conv_groups(node)
    return groups if groups is not None else 1


def _is_first_layer(node: fx.Node, kinds: dict[fx.Node, str]) -> bool:
    x = tensor_inputs(node)[0][1] if tensor_inputs(node) else None
    while x is not None and kinds[x] in COPY_KINDS | {"pad"}:
        ins = tensor_inputs(x)
        x = ins[0][1] if ins else None
    return x is not None and x.op == "placeholder"


def _performance_skip(
    ctx: PlanContext, node: fx.Node, wshape: tuple[int, ...]
) -> tuple[str, str] | None:
    kind = ctx.kinds[node]
    first = kind == "conv" and _is_first_layer(node, ctx.kinds)
    return performance_skip(kind, wshape, _conv_groups(node), first_layer=first)


def performance_skip(
    kind: str, wshape: tuple[int, ...], groups: int = 1, *, first_layer: bool = False
) -> tuple[str, str] | None:
    """H02 / P14: ``(rule, reason)`` when TensorRT would not run this op in INT8 profitably.

    Example:
        >>> performance_skip("conv", (28, 3, 3, 3))[0]
        'H02'
        >>> performance_skip("linear", (1000, 512)) is None
        True
    """
    if kind in ("linear", "matmul"):
        n_out, k_in = (wshape[0], wshape[1]) if kind == "linear" else (wshape[-1], wshape[-2])
        if k_in < 16 or n_out < 16:
            return "P14", f"GEMM with K={k_in}, N={n_out} (< 16): no INT8 tensor-core kernel"
        return None
    if kind != "conv":
        return None
    oc, ic = wshape[0], wshape[1] * groups
    ksize = wshape[2:]
    if ic >= 16 and oc >= 16:
        return None
    if groups == 1:
        ok = (oc % 8 == 0 or ic % 8 == 0) and (first_layer or max(ic, oc) >= 16)
        ok = ok and len(set(ksize)) <= 1
    else:
        ok = oc % 8 == 0 and all(k >= 3 for k in ksize)
    if ok:
        return None
    return (
        "H02",
        f"small conv ({ic}->{oc} channels, kernel {list(ksize)}, groups {groups}): no INT8 kernel",
    )


def _activation_product(ctx: PlanContext, node: fx.Node, excluded: bool) -> tuple[str, str, bool]:
    """``(rule, reason, quantize)`` for a MatMul of two activations: P16 inside attention (up to
    :data:`MAX_INT8_SEQUENCE` keys), P14 otherwise; with the performance rules off, P01."""
    if excluded:
        return "USER", "excluded by the QuantConfig", False
    kind = ctx.kinds[node]
    role = attention_role(node, ctx.kinds)
    if role is not None and ctx.config.family_enabled("attention"):
        what = "Q·Kᵀ" if role == "scores" else "softmax·V"
        keys = key_length(node, role)
        if (
            keys is None
            or keys <= MAX_INT8_SEQUENCE
            or not ctx.config.family_enabled("performance")
        ):
            return "P16", f"attention {what}: both operands INT8 in TensorRT's fused MHA", True
        return "P14", f"attention {what} over {keys} keys (> {MAX_INT8_SEQUENCE}): FP16 MHA", False
    if not ctx.config.family_enabled("performance"):
        return "P01", f"activation input of {kind}", True
    if role is not None:
        return "P14", "attention MatMul with rule family 'attention' disabled; kept in FP16", False
    return "P14", "both operands are activations outside an attention pattern; kept in FP16", False


def plan_weighted(ctx: PlanContext, node: fx.Node, *, performance: bool = True) -> None:
    """Step 1 for one weighted op: quantize its activation input and weight, or skip both with a
    reason. ``performance=False``: the performance rules (H02, P14) do not apply (a small conv
    between INT8 layers, :func:`qdq.graph.planner.build_plan`)."""
    kind = ctx.kinds[node]
    owner = ctx.owners[node]
    acts = tensor_inputs(node)
    wa = weight_arg(node)
    excluded, calib_o, bits_o = ctx.config.resolve(owner, ctx.owner_types[node], kind)
    swapped = transposed_weight_arg(node) if wa is None and kind == "matmul" else None
    computed = computed_weight_arg(node) if wa is None and swapped is None else None
    if computed is not None and kind == "matmul":
        wkey, wnode = computed
        reason = (
            "a MatMul operand computed from parameters by more than a transpose: only parameter "
            "and computed Conv/Linear weights are quantized; kept float"
        )
        ctx.add(
            make_point(
                ctx, node, wkey, wnode, "weight", "weight", decision=SKIP, rule="P01", reason=reason
            )
        )
        for pos, producer in acts:
            skip_input(ctx, node, pos, producer, "P01", reason, label=input_label(node, pos))
        return
    if wa is None and swapped is None and computed is None:  # activation x activation (attention)
        rule, reason, quantize = _activation_product(ctx, node, excluded)
        for pos, producer in acts:
            if quantize:
                quantize_input(ctx, node, pos, producer, rule, reason, calib_o, bits_o)
            else:
                skip_input(ctx, node, pos, producer, rule, reason, label=input_label(node, pos))
        return
    # the weight's Q/DQ sits on the parameter; a transpose of it (HaloNet) stays after the DQ,
    # where TensorRT folds it into the GEMM's weights (rule spec, copy ops)
    if wa is not None:
        wsite, wkey, wnode = node, wa[0], wa[1]
    elif computed is not None:  # standardized in forward (StdConv2d): quantized where it is read
        wsite, wkey, wnode = node, computed[0], computed[1]
    elif swapped is not None:
        wsite, wkey, wnode = swapped[0], 0, swapped[1]
    else:  # an activation product: planned above
        return
    wshape = _weight_shape(ctx, wnode)
    if swapped is not None:  # the operand as the MatMul reads it
        wshape = tuple(swapped[0].meta["tensor_meta"].shape)
    skip: tuple[str, str] | None = ("USER", "excluded by the QuantConfig") if excluded else None
    if skip is None and performance and ctx.config.family_enabled("performance"):
        skip = _performance_skip(ctx, node, wshape)
    if skip is None and not ctx.config.family_enabled("weighted"):
        skip = ("P01", "rule family 'weighted' disabled")
    if skip is None and not acts:
        # e.g. a positional encoding's projection (EdgeNeXt): exporters fold it into a constant,
        # so no Q/DQ can sit on its input, and TensorRT folds the layer at build time anyway
        skip = ("P01", FOLDED_REASON)
    x_pos, x = acts[0] if acts else (0, None)
    if skip is None and x is not None:
        skip = _float_stream_skip(ctx, x)
    if skip is not None:
        rule, reason = skip
        ctx.add(
            _weight_point(ctx, node, wsite, wkey, wnode, decision=SKIP, rule=rule, reason=reason)
        )
        if x is not None:
            ctx.add(
                make_point(
                    ctx, node, x_pos, x, "input", "input", decision=SKIP, rule=rule, reason=reason
                )
            )
        return
    ctx.quantized_weighted.add(node)
    wspec, wrule, wreason = _weight_spec(ctx, node, kind, wshape, bits_o)
    if swapped is not None:
        wspec = replace(wspec, axis=swapped[2])
        wreason = f"MatMul weight per output column (axis {swapped[2]} of the transposed parameter)"
    ctx.add(
        _weight_point(
            ctx,
            node,
            wsite,
            wkey,
            wnode,
            decision=QUANTIZE,
            rule=wrule,
            reason=wreason,
            spec=wspec,
            calib=ctx.config.weight_calib,
        )
    )
    if x is not None:
        quantize_input(ctx, node, x_pos, x, "P01", f"activation input of {kind}", calib_o, bits_o)


def _float_stream_skip(ctx: PlanContext, x: fx.Node) -> tuple[str, str] | None:
    """P15: ``(rule, reason)`` when a normalization reads the input ``x`` too (directly or
    through data movement, :func:`qdq.graph.streams.stream_norm`): ``x`` is written in float for
    it, so an INT8 read here would cost a standalone Quantize (P04); the layer stays float. Off
    with the ``residual`` family (P15's)."""
    if not ctx.config.family_enabled("residual"):
        return None
    norm = stream_norm(ctx, x)
    if norm is None:
        return None
    return (
        "P15",
        f"its input is a float stream: {ctx.owners[norm]} ({ctx.kinds[norm]}, no INT8 path) "
        "reads it in float, so an INT8 read here would cost a standalone Quantize beside it "
        "(P04); kept float, the tensor is read in one precision",
    )


def _weight_point(
    ctx: PlanContext,
    node: fx.Node,
    site: fx.Node,
    key: int | str,
    param: fx.Node,
    **kw: object,
) -> QuantPoint:
    """The weight point of ``node``, quantizing ``param`` where ``site`` reads it (``node``
    itself, or the transpose between the parameter and a MatMul), named after ``node``."""
    point = make_point(ctx, site, key, param, "weight", "weight", **kw)
    if site is node:
        return point
    owner = ctx.owners[node]
    return replace(point, name=f"{owner}:weight", owner=owner, op=ctx.kinds[node])


def _weight_spec(
    ctx: PlanContext, node: fx.Node, kind: str, wshape: tuple[int, ...], bits: int | None
) -> tuple[QuantSpec, str, str]:
    spec = ctx.config.weight if bits is None else replace(ctx.config.weight, num_bits=bits)
    if kind == "conv_transpose":
        groups = _conv_groups(node)
        if ctx.config.conv_transpose_axis == 1 and groups == 1:
            return (
                replace(spec, axis=1),
                "V12",
                "ConvTranspose weights per output channel (axis 1, TRT >= 10.2)",
            )
        why = (
            "grouped ConvTranspose"
            if groups > 1
            else "TensorRT's expected axis is version-dependent"
        )
        return replace(spec, axis=None), "V12", f"ConvTranspose weights per tensor ({why})"
    if kind == "matmul":
        return (
            replace(spec, axis=len(wshape) - 1),
            "P01",
            "MatMul weight per output column (last axis)",
        )
    return spec, "P01", "weights per output channel (axis 0)"
