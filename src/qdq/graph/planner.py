"""The planner: captured graph + ``QuantConfig`` + TensorRT rules → ``QuantPlan`` (a pure function).

Steps, each citing its rule id (``qdq.rules``):

1. weighted ops (P01, V12, P08, H02, P14): quantize activation input + weight, or skip with a reason;
2. residual Adds (P03, P05): quantize only the skip operand;
3. average pools (P06): quantize the input when the output feeds a quantized op;
4. Concats (S02): quantize every input when the output feeds a quantized op;
5. scale groups by union-find: one quantizer per tensor (S01), across pass-through ops (S03) and
   across each Concat (S02);
6. explanation-only points for SiLU epilogues (P07); Conv/Linear coverage of the original model.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, replace

import torch.fx as fx
from torch import nn

from qdq.config import CalibSpec, QuantConfig, QuantSpec
from qdq.graph.capture import TRACE_THROUGH, module_path
from qdq.graph.patterns import (
    COPY_KINDS,
    EPILOGUE_KINDS,
    PASS_THROUGH_KINDS,
    WEIGHTED_KINDS,
    op_kind,
    tensor_inputs,
    weight_arg,
)
from qdq.graph.plan import QUANTIZE, SHARE, SKIP, Coverage, QuantPlan, QuantPoint, ScaleGroup
from qdq.rules import UnionFind

__all__ = ["build_plan"]


@dataclass
class _Ctx:
    gm: fx.GraphModule
    config: QuantConfig
    modules: dict[str, nn.Module]
    kinds: dict[fx.Node, str]
    owners: dict[fx.Node, str]
    owner_types: dict[fx.Node, type | None]
    order: dict[fx.Node, int]
    by_name: dict[str, fx.Node]
    points: dict[str, QuantPoint]
    quantized_weighted: set[fx.Node]

    def add(self, point: QuantPoint) -> None:
        self.points[point.name] = point


def build_plan(
    gm: fx.GraphModule, config: QuantConfig | None = None, model: nn.Module | None = None
) -> QuantPlan:
    """Plan Q/DQ placement for a captured graph.

    Args:
        gm: the output of :func:`qdq.graph.capture.capture`.
        config: what to quantize (default ``QuantConfig.tensorrt()``).
        model: the original model, for the Conv/Linear coverage list (default: ``gm``).
    """
    cfg = config if config is not None else QuantConfig.tensorrt()
    modules = dict(gm.named_modules())
    nodes = list(gm.graph.nodes)
    kinds = {n: op_kind(n, modules) for n in nodes}
    ctx = _Ctx(
        gm=gm,
        config=cfg,
        modules=modules,
        kinds=kinds,
        owners=_owner_names(nodes, kinds),
        owner_types={n: _owner_type(n, modules) for n in nodes},
        order={n: i for i, n in enumerate(nodes)},
        by_name={n.name: n for n in nodes},
        points={},
        quantized_weighted=set(),
    )
    for n in nodes:
        if kinds[n] in WEIGHTED_KINDS:
            _plan_weighted(ctx, n)
    for n in nodes:
        if kinds[n] == "add":
            _plan_residual_add(ctx, n)
    for n in nodes:
        if kinds[n] == "avg_pool":
            _plan_avg_pool(ctx, n)
    for n in reversed(nodes):
        if kinds[n] == "cat":
            _plan_concat(ctx, n)
    for n in nodes:
        _explain_silu(ctx, n)
    points, groups = _group(ctx, nodes)
    ordered = sorted(points, key=lambda p: (ctx.order[ctx.by_name[p.consumer]], p.kind != "weight"))
    coverage = _coverage(model if model is not None else gm, ordered)
    name = type(model).__name__ if model is not None else gm.__class__.__name__
    return QuantPlan(model=name, points=tuple(ordered), groups=tuple(groups), coverage=coverage)


# ------------------------------------------------------------------ naming
def _owner_names(nodes: list[fx.Node], kinds: dict[fx.Node, str]) -> dict[fx.Node, str]:
    """``layer1.0.conv1`` for traced-through modules, ``layer1.0.add`` for functional ops."""
    names: dict[fx.Node, str] = {}
    seen: dict[str, list[fx.Node]] = {}
    for n in nodes:
        path = module_path(n)
        stack = n.meta.get("nn_module_stack")
        inner_type = list(stack.values())[-1][1] if stack else None
        if n.op == "call_module" or (
            kinds[n] in WEIGHTED_KINDS
            and isinstance(inner_type, type)
            and issubclass(inner_type, TRACE_THROUGH)
        ):
            names[n] = path
            continue
        base = re.sub(r"_\d+$", "", n.name)
        key = f"{path}.{base}" if path else base
        seen.setdefault(key, []).append(n)
        names[n] = key
    for key, group in seen.items():
        if len(group) > 1:
            for i, n in enumerate(group):
                names[n] = f"{key}_{i}" if i else key
    return names


def _owner_type(node: fx.Node, modules: dict[str, nn.Module]) -> type | None:
    if node.op == "call_module":
        return type(modules[str(node.target)])
    stack = node.meta.get("nn_module_stack")
    if stack:
        t = list(stack.values())[-1][1]
        return t if isinstance(t, type) else None
    return None


def _point(
    ctx: _Ctx,
    consumer: fx.Node,
    arg: int | str,
    producer: fx.Node,
    kind: str,
    label: str,
    **kw: object,
) -> QuantPoint:
    owner = ctx.owners[consumer]
    return QuantPoint(
        name=f"{owner}:{label}",
        owner=owner,
        op=ctx.kinds[consumer],
        kind=kind,
        consumer=consumer.name,
        arg=arg,
        producer=producer.name,
        **kw,  # type: ignore[arg-type]
    )


def _input_label(node: fx.Node, arg: int) -> str:
    return "input" if len(tensor_inputs(node)) == 1 else f"input{arg}"


# ------------------------------------------------------------ weighted ops
def _weight_shape(ctx: _Ctx, w: fx.Node) -> tuple[int, ...]:
    t = ctx.gm.get_parameter(str(w.target)) if _is_param(ctx.gm, str(w.target)) else None
    if t is None:
        t = ctx.gm.get_buffer(str(w.target))
    return tuple(t.shape)


def _is_param(gm: fx.GraphModule, target: str) -> bool:
    try:
        gm.get_parameter(target)
    except AttributeError:
        return False
    return True


def _conv_groups(node: fx.Node) -> int:
    """``groups`` of F.conv*/F.conv_transpose* (argument 6 in both signatures)."""
    g = node.kwargs.get("groups", node.args[6] if len(node.args) > 6 else 1)
    return int(g) if isinstance(g, int) else 1


def _is_first_layer(node: fx.Node, kinds: dict[fx.Node, str]) -> bool:
    x = tensor_inputs(node)[0][1] if tensor_inputs(node) else None
    while x is not None and kinds[x] in COPY_KINDS | {"pad"}:
        ins = tensor_inputs(x)
        x = ins[0][1] if ins else None
    return x is not None and x.op == "placeholder"


def _performance_skip(ctx: _Ctx, node: fx.Node, wshape: tuple[int, ...]) -> tuple[str, str] | None:
    """H02 / P14: ``(rule, reason)`` when TensorRT would not run this op in INT8 profitably."""
    kind = ctx.kinds[node]
    if kind in ("linear", "matmul"):
        n_out, k_in = (wshape[0], wshape[1]) if kind == "linear" else (wshape[-1], wshape[-2])
        if k_in < 16 or n_out < 16:
            return "P14", f"GEMM with K={k_in}, N={n_out} (< 16): no INT8 tensor-core kernel"
        return None
    if kind != "conv":
        return None
    groups = _conv_groups(node)
    oc, ic = wshape[0], wshape[1] * groups
    ksize = wshape[2:]
    if ic >= 16 and oc >= 16:
        return None
    if groups == 1:
        ok = (oc % 8 == 0 or ic % 8 == 0) and (
            _is_first_layer(node, ctx.kinds) or max(ic, oc) >= 16
        )
        ok = ok and len(set(ksize)) <= 1
    else:
        ok = oc % 8 == 0 and all(k >= 3 for k in ksize)
    if ok:
        return None
    return (
        "H02",
        f"small conv ({ic}->{oc} channels, kernel {list(ksize)}, groups {groups}): no INT8 kernel",
    )


def _plan_weighted(ctx: _Ctx, node: fx.Node) -> None:
    kind = ctx.kinds[node]
    owner = ctx.owners[node]
    acts = tensor_inputs(node)
    wa = weight_arg(node)
    excluded, calib_o, bits_o = ctx.config.resolve(owner, ctx.owner_types[node], kind)
    if wa is None:  # activation x activation MatMul (attention) or a conv with a computed weight
        perf = ctx.config.family_enabled("performance")
        for pos, producer in acts:
            if not excluded and not perf:
                _quantize_input(
                    ctx, node, pos, producer, "P01", f"activation input of {kind}", calib_o, bits_o
                )
                continue
            rule, reason = (
                ("USER", "excluded by the QuantConfig")
                if excluded
                else ("P14", "both operands are activations (attention-style MatMul); kept in FP16")
            )
            ctx.add(
                _point(
                    ctx,
                    node,
                    pos,
                    producer,
                    "input",
                    _input_label(node, pos),
                    decision=SKIP,
                    rule=rule,
                    reason=reason,
                )
            )
        return
    wkey, wnode = wa
    wshape = _weight_shape(ctx, wnode)
    skip: tuple[str, str] | None = ("USER", "excluded by the QuantConfig") if excluded else None
    if skip is None and ctx.config.family_enabled("performance"):
        skip = _performance_skip(ctx, node, wshape)
    if skip is None and not ctx.config.family_enabled("weighted"):
        skip = ("P01", "rule family 'weighted' disabled")
    x_pos, x = acts[0] if acts else (0, None)
    if skip is not None:
        rule, reason = skip
        ctx.add(
            _point(
                ctx, node, wkey, wnode, "weight", "weight", decision=SKIP, rule=rule, reason=reason
            )
        )
        if x is not None:
            ctx.add(
                _point(
                    ctx, node, x_pos, x, "input", "input", decision=SKIP, rule=rule, reason=reason
                )
            )
        return
    ctx.quantized_weighted.add(node)
    wspec, wrule, wreason = _weight_spec(ctx, node, kind, wshape, bits_o)
    ctx.add(
        _point(
            ctx,
            node,
            wkey,
            wnode,
            "weight",
            "weight",
            decision=QUANTIZE,
            rule=wrule,
            reason=wreason,
            spec=wspec,
            calib=ctx.config.weight_calib,
        )
    )
    if x is not None:
        _quantize_input(ctx, node, x_pos, x, "P01", f"activation input of {kind}", calib_o, bits_o)


def _weight_spec(
    ctx: _Ctx, node: fx.Node, kind: str, wshape: tuple[int, ...], bits: int | None
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


def _quantize_input(
    ctx: _Ctx,
    node: fx.Node,
    pos: int,
    producer: fx.Node,
    rule: str,
    reason: str,
    calib_o: CalibSpec | None,
    bits_o: int | None,
) -> None:
    spec = (
        ctx.config.activation if bits_o is None else replace(ctx.config.activation, num_bits=bits_o)
    )
    calib = calib_o if calib_o is not None else ctx.config.activation_calib
    label = _input_label(node, pos)
    if (
        ctx.kinds[producer] == "pad"
        and len(producer.users) == 1
        and ctx.kinds[node] in ("conv", "conv_transpose")
        and ctx.config.family_enabled("pad")
    ):
        pad_in = tensor_inputs(producer)[0][1]
        point = _point(
            ctx,
            producer,
            0,
            pad_in,
            "input",
            label,
            decision=QUANTIZE,
            rule="P08",
            reason=f"moved in front of zero Pad {ctx.owners[producer]} so Pad+{ctx.kinds[node]} fuse",
            spec=spec,
            calib=calib,
        )
        ctx.add(
            replace(
                point,
                name=f"{ctx.owners[node]}:{label}",
                owner=ctx.owners[node],
                op=ctx.kinds[node],
            )
        )
        return
    ctx.add(
        _point(
            ctx,
            node,
            pos,
            producer,
            "input",
            label,
            decision=QUANTIZE,
            rule=rule,
            reason=reason,
            spec=spec,
            calib=calib,
        )
    )


# ----------------------------------------------------------- residual adds
def _backbone(ctx: _Ctx, x: fx.Node) -> fx.Node | None:
    """The quantized weighted op whose epilogue can absorb an Add fed by ``x``.

    Walks back through epilogue ops (BN, bias, activations, SiLU) and copy ops; every tensor on the
    way must be read only by the next op (SiLU's input also by its sigmoid), or TensorRT cannot fuse.
    """
    if len(x.users) != 1:
        return None
    cur = x
    while True:
        kind = ctx.kinds[cur]
        if kind in WEIGHTED_KINDS:
            return cur if cur in ctx.quantized_weighted else None
        silu_x = _silu_operand(ctx, cur)
        ins = tensor_inputs(cur)
        if silu_x is not None:
            nxt, readers = silu_x, 2
        elif kind in EPILOGUE_KINDS | COPY_KINDS and len(ins) == 1:
            nxt, readers = ins[0][1], 1
        else:
            return None
        if len(nxt.users) != readers:
            return None
        cur = nxt


def _silu_operand(ctx: _Ctx, node: fx.Node) -> fx.Node | None:
    """For ``x * sigmoid(x)`` return ``x``."""
    if ctx.kinds[node] != "mul":
        return None
    ins = [a for _, a in tensor_inputs(node)]
    if len(ins) != 2:
        return None
    for a, b in (ins, ins[::-1]):
        if ctx.kinds[b] == "sigmoid" and tensor_inputs(b) and tensor_inputs(b)[0][1] is a:
            return a
    return None


def _distance_from(ancestor: fx.Node, target: fx.Node) -> int:
    """Shortest number of edges from ``ancestor`` down to ``target``."""
    seen = {ancestor}
    queue = deque([(ancestor, 0)])
    while queue:
        n, d = queue.popleft()
        if n is target:
            return d
        for u in n.users:
            if u not in seen:
                seen.add(u)
                queue.append((u, d + 1))
    return 1 << 30


def _ancestors(node: fx.Node) -> set[fx.Node]:
    out: set[fx.Node] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        for a in n.all_input_nodes:
            if a not in out:
                out.add(a)
                stack.append(a)
    return out


def _fused_operand(ctx: _Ctx, a: fx.Node, b: fx.Node) -> tuple[int | None, str]:
    """Which of the two Add operands TensorRT fuses into its conv (0 or 1), and why."""
    ba, bb = _backbone(ctx, a), _backbone(ctx, b)
    if ba is not None and bb is not None:
        common = (_ancestors(a) | {a}) & (_ancestors(b) | {b})
        if not common:
            return 0, f"two conv branches; fusing into {ctx.owners[ba]}"
        lca = max(common, key=lambda n: ctx.order[n])
        da, db = _distance_from(lca, a), _distance_from(lca, b)
        i, conv = (0, ba) if da >= db else (1, bb)
        return i, f"two conv branches; {ctx.owners[conv]} is on the longer path from {lca.name}"
    if ba is not None:
        other = b
        if ba in _ancestors(other) or ba is other:
            return None, f"both operands descend from {ctx.owners[ba]}: not a residual Add"
        return 0, f"conv branch {ctx.owners[ba]}"
    if bb is not None:
        if bb in _ancestors(a) or bb is a:
            return None, f"both operands descend from {ctx.owners[bb]}: not a residual Add"
        return 1, f"conv branch {ctx.owners[bb]}"
    return None, "no quantized conv/linear branch to fuse the Add into"


def _plan_residual_add(ctx: _Ctx, node: fx.Node) -> None:
    ins = tensor_inputs(node)
    if len(ins) != 2:
        return
    owner = ctx.owners[node]
    excluded, calib_o, bits_o = ctx.config.resolve(owner, ctx.owner_types[node], "add")
    if excluded or not ctx.config.family_enabled("residual"):
        reason = "excluded by the QuantConfig" if excluded else "rule family 'residual' disabled"
        for pos, producer in ins:
            ctx.add(
                _point(
                    ctx,
                    node,
                    pos,
                    producer,
                    "input",
                    f"input{pos}",
                    decision=SKIP,
                    rule="USER" if excluded else "P03",
                    reason=reason,
                )
            )
        return
    fused, why = _fused_operand(ctx, ins[0][1], ins[1][1])
    if fused is None:
        for pos, producer in ins:
            ctx.add(
                _point(
                    ctx,
                    node,
                    pos,
                    producer,
                    "input",
                    f"input{pos}",
                    decision=SKIP,
                    rule="P05",
                    reason=f"{why}; the Add stays in its inputs' precision",
                )
            )
        return
    for i, (pos, producer) in enumerate(ins):
        if i == fused:
            ctx.add(
                _point(
                    ctx,
                    node,
                    pos,
                    producer,
                    "input",
                    f"input{pos}",
                    decision=SKIP,
                    rule="P03",
                    reason=f"{why}: TensorRT fuses conv+Add here, no Q/DQ",
                )
            )
        else:
            _quantize_input(
                ctx,
                node,
                pos,
                producer,
                "P03",
                "residual skip input: makes the fused conv+Add output INT8",
                calib_o,
                bits_o,
            )


# ----------------------------------------------------- pools and concats
def _reaches_quantized(ctx: _Ctx, node: fx.Node) -> bool:
    """Whether ``node``'s output (through pass-through ops) is read by a quantized point."""
    read = {(p.producer, p.consumer) for p in ctx.points.values() if p.quantized}
    stack, seen = [node], {node}
    while stack:
        n = stack.pop()
        for u in n.users:
            if (n.name, u.name) in read:
                return True
            if ctx.kinds[u] in PASS_THROUGH_KINDS and u not in seen:
                seen.add(u)
                stack.append(u)
    return False


def _plan_avg_pool(ctx: _Ctx, node: fx.Node) -> None:
    ins = tensor_inputs(node)
    if not ins:
        return
    pos, producer = ins[0]
    owner = ctx.owners[node]
    excluded, calib_o, bits_o = ctx.config.resolve(owner, ctx.owner_types[node], "avg_pool")
    if excluded or not ctx.config.family_enabled("pooling"):
        reason = "excluded by the QuantConfig" if excluded else "rule family 'pooling' disabled"
        ctx.add(
            _point(
                ctx,
                node,
                pos,
                producer,
                "input",
                "input",
                decision=SKIP,
                rule="USER" if excluded else "P06",
                reason=reason,
            )
        )
        return
    if _reaches_quantized(ctx, node):
        _quantize_input(
            ctx,
            node,
            pos,
            producer,
            "P06",
            "average pool between INT8 layers runs INT8 with DQ-in/Q-out",
            calib_o,
            bits_o,
        )
    else:
        ctx.add(
            _point(
                ctx,
                node,
                pos,
                producer,
                "input",
                "input",
                decision=SKIP,
                rule="P06",
                reason="output does not feed a quantized op; the pool stays float",
            )
        )


def _plan_concat(ctx: _Ctx, node: fx.Node) -> None:
    ins = tensor_inputs(node)
    owner = ctx.owners[node]
    excluded, calib_o, bits_o = ctx.config.resolve(owner, ctx.owner_types[node], "cat")
    quantize = (
        not excluded and ctx.config.family_enabled("concat") and _reaches_quantized(ctx, node)
    )
    for pos, producer in ins:
        if quantize:
            _quantize_input(
                ctx,
                node,
                pos,
                producer,
                "S02",
                "Concat input: inputs and output share one scale",
                calib_o,
                bits_o,
            )
            continue
        if excluded:
            rule, reason = "USER", "excluded by the QuantConfig"
        elif not ctx.config.family_enabled("concat"):
            rule, reason = "S02", "rule family 'concat' disabled"
        else:
            rule, reason = "S02", "output does not feed a quantized op; the Concat stays float"
        ctx.add(
            _point(
                ctx,
                node,
                pos,
                producer,
                "input",
                f"input{pos}",
                decision=SKIP,
                rule=rule,
                reason=reason,
            )
        )


def _explain_silu(ctx: _Ctx, node: fx.Node) -> None:
    kind = ctx.kinds[node]
    x = _silu_operand(ctx, node) if kind == "mul" else None
    if kind in ("silu", "hardswish") and tensor_inputs(node):
        x = tensor_inputs(node)[0][1]
    if x is None:
        return
    ctx.add(
        _point(
            ctx,
            node,
            0,
            x,
            "input",
            "input",
            decision=SKIP,
            rule="P07",
            reason="SiLU/Hardswish epilogue: fused into the producing conv, no Q/DQ inside",
        )
    )


# ----------------------------------------------------------------- groups
def _group(ctx: _Ctx, nodes: list[fx.Node]) -> tuple[list[QuantPoint], list[ScaleGroup]]:
    """Union-find: one scale per tensor (S01), across pass-through ops (S03), per Concat (S02)."""
    tensors = UnionFind(nodes)
    crossing: dict[fx.Node, str] = {}
    if ctx.config.family_enabled("pooling"):
        for n in nodes:
            ins = tensor_inputs(n)
            if ctx.kinds[n] in PASS_THROUGH_KINDS and len(ins) == 1:
                tensors.union(ins[0][1], n)
                crossing[n] = "S03"
    by_name = ctx.by_name
    quantized = [p for p in ctx.points.values() if p.quantized and p.kind == "input"]
    points = UnionFind(p.name for p in quantized)
    why: dict[str, str] = {}
    first_on_component: dict[fx.Node, str] = {}
    for p in quantized:
        comp = tensors.find(by_name[p.producer])
        assert isinstance(comp, fx.Node)
        if comp in first_on_component:
            leader = first_on_component[comp]
            points.union(leader, p.name)
            same_tensor = ctx.points[leader].producer == p.producer
            why[p.name] = "S01" if same_tensor else "S03"
        else:
            first_on_component[comp] = p.name
    cat_members: dict[str, list[str]] = {}
    for p in quantized:
        if p.op == "cat" and p.rule == "S02":
            cat_members.setdefault(p.consumer, []).append(p.name)
    for cat_name, members in cat_members.items():
        cat = by_name[cat_name]
        downstream = [
            p.name for p in quantized if tensors.find(by_name[p.producer]) is tensors.find(cat)
        ]
        for m in members[1:] + downstream:
            if points.find(m) != points.find(members[0]):
                points.union(members[0], m)
                why.setdefault(m, "S02")
    result = {p.name: p for p in ctx.points.values()}
    groups: list[ScaleGroup] = []
    for gid, members in enumerate(points.groups()):
        names = [str(m) for m in members]
        leader = names[0]
        rules = sorted({why.get(m, "") for m in names[1:]} - {""})
        comps = {tensors.find(by_name[ctx.points[m].producer]) for m in names}
        crosses = sorted(ctx.owners[n] for n in crossing if tensors.find(n) in comps)
        groups.append(ScaleGroup(gid, leader, tuple(names), tuple(rules), tuple(crosses)))
        lead = result[leader]
        for m in names:
            p = result[m]
            if m == leader:
                result[m] = replace(p, group=gid)
            else:
                result[m] = replace(
                    p,
                    group=gid,
                    decision=SHARE,
                    share_rule=why.get(m, "S01"),
                    spec=lead.spec,
                    calib=lead.calib,
                    reason=f"{p.reason} (scale shared with {leader})",
                )
    # weights: one group each
    for p in list(result.values()):
        if p.kind == "weight" and p.quantized:
            gid = len(groups)
            groups.append(ScaleGroup(gid, p.name, (p.name,), ()))
            result[p.name] = replace(p, group=gid)
    return list(result.values()), groups


# --------------------------------------------------------------- coverage
def _coverage(model: nn.Module, points: Iterable[QuantPoint]) -> tuple[Coverage, ...]:
    weights = {p.owner: p for p in points if p.kind == "weight"}
    leaves = [
        (name, m)
        for name, m in model.named_modules()
        if name and not isinstance(m, TRACE_THROUGH) and _is_opaque_leaf(m)
    ]
    out = []
    for name, m in model.named_modules():
        if not isinstance(m, TRACE_THROUGH):
            continue
        p = weights.get(name)
        if p is not None:
            status = "int8" if p.quantized else "float"
            out.append(Coverage(name, type(m).__name__, status, p.rule, p.reason))
            continue
        parent = next((ln for ln, lm in leaves if name.startswith(ln + ".")), None)
        if parent is not None:
            reason = f"inside {parent} ({type(dict(leaves)[parent]).__name__}), run as one fused op"
        else:
            reason = "not called by forward() on the example inputs"
        out.append(Coverage(name, type(m).__name__, "not reached", "-", reason))
    return tuple(out)


def _is_opaque_leaf(m: nn.Module) -> bool:
    """A torch.nn leaf module (not traced into) that holds Conv/Linear children."""
    containers = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
    if not m.__module__.startswith("torch.nn") or isinstance(m, containers):
        return False
    return any(isinstance(c, TRACE_THROUGH) for c in m.modules())
