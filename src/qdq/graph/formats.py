"""Rule step 6: the format of every quantized layer (F01-F09), when the plan is not INT8 only.

With ``QuantConfig(format="fp8")`` every quantized weighted layer gets FP8 E4M3 where TensorRT
has an FP8 kernel for it and INT8 where it has none (the INT8 placement, steps 1-5, decided what
is quantized at all; this step only decides how). The rules, as :mod:`qdq.rules.tensorrt` states
them with their sources:

* F01: Conv / Linear / MatMul and the two attention products run FP8 on Ada, Hopper and Blackwell;
* F02: grouped and depthwise convolutions, ConvTranspose, and pooling and element-wise layers (a
  quantized tensor no Conv/GEMM reads) have no FP8 kernel: INT8;
* F03: a convolution with at most 16 input or output channels or a kernel area above 32: INT8
  (ModelOpt keeps these out of FP8);
* F04: a GEMM with K or N below 16: INT8 (the INT8 placement usually left it float already, P14);
* F05: one Quantize per tensor: a scale group read by an INT8 layer is INT8, and so is every
  FP8 layer that reads that group (its input and weight must share a format to fuse), until
  nothing changes: no format boundary inside a group, the fewest reformats;
* F06: FP8 weights per tensor (TensorRT rejects per-channel FP8 convolution weights; per-channel
  FP8 GEMM scales exist from TensorRT 10.6 on Hopper and 10.7 on Ada only, so per tensor builds on
  every FP8 target); with ``QuantConfig(fp8_gemm_per_channel=True)`` (the job's choice on such a
  target) GEMM weights keep their per-output-channel axis;
* F07 (``format="mixed"``): each layer the format TensorRT runs fastest: convolutions INT8 (FP8
  convolutions measured no faster: ModelOpt's FAR3D example, INT8 24.6 ms against FP8 31.5 ms on
  an RTX 6000 Ada; users report FP8 convolutions no faster than FP16 on Ada with TensorRT 10.3),
  GEMMs and attention FP8. ``Override(format=...)`` moves single layers (rule ``USER``): the job's
  ``--format mixed`` moves to FP8 the layers where INT8 measurably loses accuracy
  (:mod:`qdq.accuracy.formats`).

* F09 (``format="fp8"``): in a ConvNet that contains grouped or depthwise convolutions every
  convolution stays INT8: TensorRT has no optimized FP8 kernels for those and recommends INT8
  for such ConvNets (10.12 release notes, Limitations; NVIDIA/TensorRT#4524), so FP8 on their
  pointwise convolutions would put a format boundary at every block for no speed-up; their
  GEMMs (Linear, MatMul, attention) stay FP8. On EfficientNet-Lite0 FP8 convolutions also cost
  accuracy: per-tensor FP8 weights measure ~31.5 dB where per-channel INT8 ones reach 41-48 dB.

* F08: the softmax output of an FP8 attention (BMM2's probabilities operand) is quantized at
  the fixed amax 1 (scale 1/448, ``CalibSpec(fixed_amax=1.0)``): the probabilities lie in [0, 1]
  whatever the data, and TensorRT's fused FP8 attention is built from that data-independent
  Q/DQ (ModelOpt's FP8 exporter inserts exactly it).

Non-weighted points (a residual Add's skip input, Concat and pooling groups) take the format of
their group. FP8 activations calibrate by ``max`` when the config kept the default method
(TensorRT's FP8 recipes use max calibration); an explicit method is kept.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch.fx as fx

from qdq.config import CalibSpec, QuantSpec
from qdq.graph.attention import attention_role, probs_source
from qdq.graph.capture import fetch_attr
from qdq.graph.context import PlanContext, alias_root
from qdq.graph.patterns import (
    COPY_KINDS,
    EPILOGUE_KINDS,
    conv_groups,
    tensor_inputs,
)
from qdq.graph.plan import QuantPoint, ScaleGroup
from qdq.graph.residual import fused_layer, weighted_writer

__all__ = [
    "MIXED_CONV",
    "WEIGHTED",
    "assign_formats",
    "float_movement",
    "fp8_fused_adds",
    "fp8_kernel",
]

#: F07's reason: a convolution of a mixed plan
MIXED_CONV = (
    "mixed: INT8, the faster format for convolutions in TensorRT (FP8 convolutions measured "
    "slower or no faster than INT8 on Ada)"
)
#: the layer kinds a format is chosen for (their activation inputs follow them)
WEIGHTED = ("conv", "conv_transpose", "linear", "matmul")
#: the weighted layers TensorRT runs as GEMMs (F06: their FP8 weights may be per channel)
GEMMS = ("linear", "matmul")
#: formats whose layers cannot write INT8 and that no Concat, pool or PointWise layer reads (F10)
_NOT_INT8 = ("fp8", "nvfp4", "mxfp8")


def fp8_kernel(kind: str, wshape: tuple[int, ...], groups: int = 1) -> tuple[str, str, str]:
    """``(format, rule, reason)`` of one weighted layer: FP8 where TensorRT has an FP8 kernel.

    Args:
        kind: ``"conv"``, ``"conv_transpose"``, ``"linear"`` or ``"matmul"``.
        wshape: the weight's shape as the layer reads it (``(out, in/groups, *kernel)`` for a
            convolution, ``(out, in)`` for Linear, ``(..., K, N)`` for MatMul).
        groups: the convolution's groups.

    Example:
        >>> fp8_kernel("conv", (64, 64, 3, 3))[:2]
        ('fp8', 'F01')
        >>> fp8_kernel("conv", (64, 1, 3, 3), groups=64)[:2]
        ('int8', 'F02')
        >>> fp8_kernel("linear", (768, 768))[:2]
        ('fp8', 'F01')
    """
    if kind == "conv_transpose":
        why = "ConvTranspose: TensorRT has FP8 convolution kernels, not FP8 deconvolution"
        return "int8", "F02", why
    if kind == "conv":
        out_c, in_c = wshape[0], wshape[1] * groups
        area = math.prod(wshape[2:])
        if groups > 1:
            what = "depthwise" if wshape[1] == 1 else "grouped"
            return "int8", "F02", f"{what} convolution (groups={groups}): no FP8 kernel in TensorRT"
        if in_c <= 16 or out_c <= 16 or area > 32:
            return (
                "int8",
                "F03",
                f"convolution {in_c}->{out_c}, kernel area {area}: FP8 gains nothing at <= 16 "
                "channels or a kernel area above 32 (ModelOpt keeps these out of FP8)",
            )
        return "fp8", "F01", f"FP8 convolution ({in_c}->{out_c}, kernel area {area})"
    n_out, k_in = (wshape[0], wshape[1]) if kind == "linear" else (wshape[-1], wshape[-2])
    if k_in < 16 or n_out < 16:
        return "int8", "F04", f"GEMM with K={k_in}, N={n_out} (< 16): no FP8 tensor-core tile"
    return "fp8", "F01", f"FP8 GEMM (K={k_in}, N={n_out})"


def assign_formats(
    ctx: PlanContext, points: list[QuantPoint], groups: list[ScaleGroup]
) -> list[QuantPoint]:
    """Give every quantized point of a ``format="fp8"`` plan its format (rules F01-F09).

    Returns:
        The points with FP8 specs where chosen; each quantized point's reason ends with its
        format, its rule and why.
    """
    nodes = {owner: node for node, owner in ctx.owners.items()}
    by_name = {p.name: p for p in points}
    layer: dict[str, tuple[str, str, str]] = {}  # owner -> (format, rule, reason)
    for p in points:
        if not p.quantized or p.op not in WEIGHTED or p.owner in layer:
            continue
        if p.kind == "weight":
            node = nodes.get(p.owner)
            groups_n = (conv_groups(node) or 1) if node is not None else 1
            layer[p.owner] = fp8_kernel(p.op, _shape(ctx, p), groups_n)
            if ctx.config.format == "mixed" and p.op == "conv" and layer[p.owner][0] == "fp8":
                layer[p.owner] = ("int8", "F07", MIXED_CONV)
    grouped = _grouped_conv(ctx) if ctx.config.format == "fp8" else None
    if grouped is not None:  # F09: a ConvNet with grouped/depthwise convolutions runs INT8
        why = (
            f"the network has grouped/depthwise convolutions ({grouped}): TensorRT has no "
            "optimized FP8 kernels for them and recommends INT8 for such ConvNets"
        )
        for owner, (fmt, _, _) in layer.items():
            if fmt == "fp8" and nodes.get(owner) is not None and ctx.kinds[nodes[owner]] == "conv":
                layer[owner] = ("int8", "F09", why)
    _pooled_reads(ctx, points, layer)
    for p in points:  # activation x activation: the attention products (P16) or P01 products
        if p.quantized and p.op == "matmul" and p.owner not in layer:
            layer[p.owner] = ("fp8", "F01", "FP8 attention product (TensorRT's fused FP8 MHA)")
    for owner in layer:  # the user's (or the job's measured) choice per layer
        node = nodes.get(owner)
        kind = ctx.kinds[node] if node is not None else ""
        owner_type = ctx.owner_types.get(node) if node is not None else None
        for o in ctx.config.overrides:
            if o.format is not None and o.matches(owner, owner_type, kind):
                layer[owner] = (o.format, "USER", f"{o.format.upper()} set by the QuantConfig")
    fused = _fused_owners(ctx, points, layer)
    group_fmt = _settle(points, groups, layer, fused)
    probs = _softmax_groups(ctx, points, group_fmt)
    out = []
    for p in points:
        if not p.quantized or p.group is None or p.spec is None:
            out.append(p)
            continue
        fmt, rule, why = _why(p, by_name, groups, group_fmt, layer, fused)
        q = _with_format(ctx, p, fmt, rule, why)
        if p.group in probs and q.calib is not None:
            q = replace(
                q,
                calib=replace(q.calib, fixed_amax=1.0),
                reason=f"{q.reason}; the softmax output at the fixed amax 1 (F08: scale 1/448, "
                "data-independent, as TensorRT's fused FP8 attention takes it)",
                format_rule="F08",
            )
        out.append(q)
    return out


def _fused_owners(
    ctx: PlanContext, points: list[QuantPoint], layer: dict[str, tuple[str, str, str]]
) -> dict[str, str]:
    """Residual skip point -> the owner of the weighted layer its Add fuses into (P03), for the
    skips whose layer has a format: that layer reads the skip, in its own format. Not a skip an
    INT8 layer writes (a ResNet's strided shortcut convolution): that one is INT8 at no cost,
    where reading it in FP8 would take a standalone Quantize after its writer."""
    fused = _fused_nodes(ctx, points)
    out = {}
    for p in points:
        node = fused.get(p.consumer) if p.quantized and p.rule == "P03" else None
        owner = ctx.owners.get(node) if node is not None else None
        if owner is None or owner not in layer:
            continue
        writer = weighted_writer(ctx, ctx.by_name[p.producer], fused)
        if writer is not None and layer.get(ctx.owners.get(writer, ""), ("",))[0] == "int8":
            continue
        out[p.name] = owner
    return out


def _fused_nodes(ctx: PlanContext, points: list[QuantPoint]) -> dict[str, fx.Node]:
    """Residual Add (its name) -> the weighted op it fuses into, for the Adds with a quantized
    skip (:func:`qdq.graph.residual.fused_layer`)."""
    out = {}
    for p in points:
        node = fused_layer(ctx, p)
        if node is not None:
            out[p.consumer] = node
    return out


def float_movement(
    ctx: PlanContext, points: list[QuantPoint], floated: set[str]
) -> list[tuple[QuantPoint, str]]:
    """F10: quantized inputs of layers that are not Conv/GEMM/attention (a Concat, a pool, an
    element-wise Add or Mul) that cost reformats in a plan with FP8 layers, each with why.
    TensorRT's FP8 kernels are GEMMs, convolutions and attention only, so such a layer runs
    float or INT8:

    * in an FP8 scale group (an FP8 layer reads the tensor), it runs float: a standalone
      Dequantize per input and a standalone Quantize for its FP8 reader (YOLOv8n's FP8 export:
      76 unfused Q/DQ at its Concats and pools), where left float it costs the reader's one
      Quantize;
    * in an INT8 group no weighted layer reads (F02, the INT8 plan's element-wise layers) whose
      tensor an FP8 layer writes (through its epilogue, or a residual Add fused into it): an FP8
      layer cannot write INT8, so that is a standalone Quantize, and the INT8 layer writes INT8
      for FP8 readers (RepVGG's identity-branch Adds: two reformats a block). Not a pool's
      whose output an INT8 layer reads: its one Quantize is before it or after it either way,
      and INT8 keeps the head it feeds INT8 (F05, :func:`_pooled_reads`);
    * in an INT8 group no weighted layer reads (F02) of a layer whose output (with its
      epilogue) only FP8 layers read in quantized form: it cannot write FP8, so it writes float
      and runs float, and its INT8 input would be a standalone Quantize and Dequantize of its
      own (DenseNet's pre-activation BatchNorm + ReLU before each FP8 1x1 convolution:
      DenseNet-121's FP8 export 184 -> 63 unfused Q/DQ);
    * every other quantized input of a layer in ``floated`` (one input left float above): it
      runs float, and its INT8 inputs would be standalone Dequantize layers.

    A residual skip read in FP8 by the layer its Add fuses into stays. ``floated`` collects the
    consumers of what is returned; the planner releases these points and plans the formats again.
    """
    fmt = {p.group: p.spec.format for p in points if p.quantized and p.spec is not None}
    formats = _weight_formats(points)
    fused = _fused_nodes(ctx, points)
    reads: dict[fx.Node, list[str | None]] = {}  # tensor -> its quantized reads' formats
    for q in points:
        if q.quantized and q.kind == "input" and q.producer in ctx.by_name:
            root = alias_root(ctx, ctx.by_name[q.producer], COPY_KINDS)
            reads.setdefault(root, []).append(fmt.get(q.group))

    def fp8_writer(p: QuantPoint) -> str:
        """The FP8 (or block-format) layer that writes ``p``'s tensor (through its epilogue or a
        fused Add), with its format."""
        node = weighted_writer(ctx, ctx.by_name[p.producer], fused)
        writer = ctx.owners.get(node, "") if node is not None else ""
        fmt = formats.get(writer, "")
        return f"{writer} runs {fmt.upper()}" if fmt in _NOT_INT8 else ""

    out = []
    for p in points:
        if not p.quantized or p.kind != "input" or p.op in WEIGHTED or p.consumer in fused:
            continue
        group = fmt.get(p.group)
        consumer = ctx.by_name[p.consumer]
        what = f"{ctx.owners.get(consumer) or p.consumer} ({ctx.kinds.get(consumer)})"
        # a pool whose output an INT8 layer reads: its one Quantize is before it or after it
        # either way, and INT8 keeps the head it feeds INT8 (F05, _pooled_reads)
        pool = ctx.kinds.get(consumer) in ("avg_pool", "max_pool") and "int8" in reads.get(
            consumer, []
        )
        if group in _NOT_INT8:
            why = (
                f"{what} would read FP8, and TensorRT has no FP8 Concat, pooling or PointWise "
                "layer (its FP8 kernels are GEMMs, convolutions and attention): it runs float, "
                "and its FP8 reader quantizes its output (one Quantize, not a Dequantize per input "
                "and a Quantize)"
            )
        elif p.consumer in floated:
            why = f"another input of {what} stays float (F10), so it runs float"
        elif group == "int8" and p.format_rule == "F02" and not pool and (w := fp8_writer(p)):
            why = (
                f"{w} and cannot write INT8: {what} stays float (an INT8 input would be "
                "a standalone Quantize after it)"
            )
        elif group == "int8" and p.format_rule == "F02" and _read_in_fp8_only(ctx, consumer, reads):
            why = (
                f"{what} writes only FP8 readers, and TensorRT has no FP8 PointWise or pooling "
                "layer: it writes float, so it runs float and an INT8 input would be a "
                "standalone Quantize and Dequantize of its own (a pre-activation BatchNorm + "
                "ReLU before an FP8 convolution: DenseNet)"
            )
        else:
            continue
        out.append((p, why))
    floated.update(p.consumer for p, _ in out)
    return out


def _read_in_fp8_only(
    ctx: PlanContext, node: fx.Node, reads: dict[fx.Node, list[str | None]]
) -> bool:
    """Whether the output of ``node`` with its epilogue (a BatchNorm, an activation: the single
    readers after it) is quantized for its readers in FP8 only (``reads``: each tensor's
    quantized reads by format)."""
    cur = node
    for _ in range(len(ctx.order)):
        users = list(cur.users)
        if len(users) != 1 or ctx.kinds.get(users[0]) not in EPILOGUE_KINDS:
            break
        if len(tensor_inputs(users[0])) != 1:
            break
        cur = users[0]
    formats = reads.get(cur, [])
    return bool(formats) and all(f in _NOT_INT8 for f in formats)


def fp8_fused_adds(ctx: PlanContext, points: list[QuantPoint]) -> frozenset[str]:
    """The residual Adds (their node names) whose quantized skip fuses into an FP8 layer: such a
    layer writes FP8 only when every reader quantizes its output (F10), so its skip stays float
    when one does not (:func:`qdq.graph.residual.release_float_output_skips`)."""
    formats = _weight_formats(points)
    fused = _fused_nodes(ctx, points)
    return frozenset(a for a, n in fused.items() if formats.get(ctx.owners.get(n, "")) == "fp8")


def _weight_formats(points: list[QuantPoint]) -> dict[str, str]:
    """Weighted layer (its owner) -> the format its weight quantizer runs."""
    return {p.owner: p.spec.format for p in points if p.kind == "weight" and p.spec is not None}


def _pooled_reads(
    ctx: PlanContext, points: list[QuantPoint], layer: dict[str, tuple[str, str, str]]
) -> None:
    """F05 on the producer's side: an FP8 layer reading the output of a pool that runs INT8 (its
    input quantized, P06: a classifier head after global average pooling) reads INT8, as the
    INT8 plan has it. TensorRT has no FP8 pooling, so the pool writes INT8 or float, and an FP8
    read would be a standalone Quantize (EfficientNet-Lite0's FP8 head: P05 at the pool)."""
    running = {p.consumer for p in points if p.quantized and p.kind == "input"}
    for p in points:
        if not p.quantized or p.kind != "input" or layer.get(p.owner, ("",))[0] != "fp8":
            continue
        node = ctx.by_name.get(p.producer)
        if node is None:
            continue
        root = alias_root(ctx, node, COPY_KINDS)
        if ctx.kinds.get(root) in ("avg_pool", "max_pool") and root.name in running:
            pool = ctx.owners.get(root) or root.name
            layer[p.owner] = (
                "int8",
                "F05",
                f"reads the output of {pool}, a pool that runs INT8 (TensorRT has no FP8 "
                "pooling): an FP8 read would cost a reformat",
            )


def _grouped_conv(ctx: PlanContext) -> str | None:
    """The first grouped or depthwise convolution of the graph (its owner), ``None`` when there
    is none (F09)."""
    for node, kind in ctx.kinds.items():
        if kind == "conv" and (conv_groups(node) or 1) > 1:
            return ctx.owners.get(node) or node.name
    return None


def _softmax_groups(
    ctx: PlanContext, points: list[QuantPoint], group_fmt: dict[int, str]
) -> set[int]:
    """The FP8 scale groups holding the probabilities of an attention (F08): BMM2's operand
    that is a layout view of the softmax output."""
    found = set()
    for p in points:
        if not p.quantized or p.group is None or p.kind != "input" or p.op != "matmul":
            continue
        if group_fmt.get(p.group) != "fp8" or not isinstance(p.arg, int):
            continue
        node = ctx.by_name.get(p.consumer)
        if node is None or attention_role(node, ctx.kinds) != "context":
            continue
        if p.arg < len(node.args) and probs_source(node.args[p.arg], ctx.kinds) is not None:
            found.add(p.group)
    return found


def _settle(
    points: list[QuantPoint],
    groups: list[ScaleGroup],
    layer: dict[str, tuple[str, str, str]],
    fused: dict[str, str],
) -> dict[int, str]:
    """F05 to a fixed point: a group read by an INT8 layer is INT8; an FP8 layer reading an INT8
    group becomes INT8. A residual skip counts as read by the layer its Add fuses into
    (``fused``). Returns each group's format."""
    by_name = {p.name: p for p in points}
    readers: dict[int, list[str]] = {}  # activation group -> the layers reading it
    for g in groups:  # a parameter used by two layers is one weight quantizer: one format too
        readers[g.id] = sorted(
            {by_name[m].owner for m in g.members if by_name[m].owner in layer}
            | {fused[m] for m in g.members if m in fused}
        )
    changed = True
    while changed:
        changed = False
        for owners in readers.values():
            int8 = [o for o in owners if layer[o][0] == "int8"]
            if not int8:
                continue
            for o in owners:
                if layer[o][0] == "fp8":
                    layer[o] = (
                        "int8",
                        "F05",
                        f"its input tensor is also read by {int8[0]} in INT8 ({layer[int8[0]][1]}): "
                        "one Quantize per tensor, and an FP8 layer cannot read INT8",
                    )
                    changed = True
    return {
        gid: "int8" if any(layer[o][0] == "int8" for o in owners) else "fp8"
        for gid, owners in readers.items()
    }


def _why(
    p: QuantPoint,
    by_name: dict[str, QuantPoint],
    groups: list[ScaleGroup],
    group_fmt: dict[int, str],
    layer: dict[str, tuple[str, str, str]],
    fused: dict[str, str],
) -> tuple[str, str, str]:
    if p.owner in layer and (p.kind == "weight" or p.op in WEIGHTED):
        return layer[p.owner]
    assert p.group is not None
    fmt = group_fmt.get(p.group, "fp8")
    readers = [m for m in groups[p.group].members if by_name[m].owner in layer]
    if readers:
        return fmt, "F05", f"shares its Quantize with {readers[0]}, read in {fmt.upper()}"
    skips = [m for m in groups[p.group].members if m in fused]
    if skips:
        return (
            fmt,
            "F05",
            f"the residual skip of an Add fused into {fused[skips[0]]}, read in "
            f"{fmt.upper()} (TensorRT's fused Add reads its residual in its layer's format)",
        )
    return (
        "int8",
        "F02",
        (
            "read by no Conv/GEMM: TensorRT has FP8 kernels for GEMMs, convolutions and attention "
            "only, so pooling and element-wise layers stay INT8, as in the INT8 plan"
        ),
    )


def _with_format(ctx: PlanContext, p: QuantPoint, fmt: str, rule: str, why: str) -> QuantPoint:
    assert p.spec is not None and p.calib is not None
    reason = f"{p.reason}; {fmt.upper()} ({rule}: {why})"
    if fmt == "int8":
        return replace(p, reason=reason, format_rule=rule)
    spec: QuantSpec = replace(p.spec, format="fp8", num_bits=8, narrow_range=False)
    calib = p.calib
    if p.kind == "weight" and ctx.config.fp8_gemm_per_channel and p.op in GEMMS:
        reason = (
            f"weights per output channel (F06: the target scales FP8 GEMMs per channel); "
            f"FP8 ({rule}: {why})"
        )
        rule = "F06"
    elif p.kind == "weight":
        spec = replace(spec, axis=None)
        reason, rule = f"weights per tensor (F06); FP8 ({rule}: {why})", "F06"
    elif calib == ctx.config.activation_calib and calib == CalibSpec():
        calib = replace(calib, method="max")  # TensorRT's FP8 recipes calibrate by max
    return replace(p, spec=spec, calib=calib, reason=reason, format_rule=rule)


def _shape(ctx: PlanContext, p: QuantPoint) -> tuple[int, ...]:
    node: fx.Node = ctx.by_name[p.producer]
    if node.op == "get_attr":
        return tuple(fetch_attr(ctx.root, str(node.target)).shape)
    return tuple(node.meta["tensor_meta"].shape)
