"""Q/DQ placement on detector-style nets, randomly initialised: the YOLO-style net (Concat scale
groups, SPPF, Conv-BN-SiLU epilogues, residual Adds, an excluded head), a weight-shared head, and
the CenterNet-style model (ConvTranspose weight axis; heatmap cosine, all three heads printed).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

import qdq
from models import CenterNetStyleNet, YoloStyleNet
from placement_support import (  # noqa: F401 (two_threads: an autouse fixture)
    BATCH,
    COSINE_BAR,
    SIZE,
    bn_calibrated,
    cosine,
    run_no_grad,
    two_threads,
)
from qdq.graph.plan import QuantPoint
from qdq.graph.record import record


class Seen:
    """What a prepared model runs, as a recorded graph with its quantizer calls (and its plan)."""

    def __init__(self, prepared: nn.Module, x: torch.Tensor) -> None:
        model = copy.deepcopy(prepared)
        for q in qdq.quantizers_of(model).values():
            if not q.is_calibrated:  # structure only: any amax will do
                q.set_amax(1.0)
        rec = record(model, (x,))
        self.graph, self.root = rec.graph, rec.root
        self.qdq_plan = qdq.plan_of(prepared)

    def get_submodule(self, path: str) -> nn.Module:
        return self.root.get_submodule(path)


# ------------------------------------------------------------------------- YOLO-style net
@pytest.fixture(scope="module")
def yolo() -> tuple[nn.Module, Seen]:
    torch.manual_seed(0)
    model = bn_calibrated(YoloStyleNet(), (BATCH, 3, SIZE, SIZE))
    x = torch.randn(BATCH, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(2))
    return model, Seen(qdq.prepare(model, (x,)), x)


def _nodes(gm: Seen) -> dict[str, fx.Node]:
    return {n.name: n for n in gm.graph.nodes}


def _module_calls(gm: Seen, kind: type[nn.Module]) -> list[fx.Node]:
    return [
        n
        for n in gm.graph.nodes
        if n.op == "call_module" and isinstance(gm.get_submodule(str(n.target)), kind)
    ]


def test_yolo_every_concat_shares_one_scale_with_its_consumers(yolo) -> None:
    _, prepared = yolo
    plan = qdq.plan_of(prepared)
    nodes = _nodes(prepared)
    by_cat: dict[str, list[QuantPoint]] = {}
    for p in plan.points:
        if p.op == "cat":
            by_cat.setdefault(p.consumer, []).append(p)
    # 2 C3 + 4 C2f + SPPF + 3 neck Concats + the Detect output Concat
    assert len(by_cat) == 11, sorted(by_cat)
    for cat, points in by_cat.items():
        n_inputs = len(nodes[cat].args[0])
        assert sorted(p.arg for p in points) == list(range(n_inputs)), points
        if all(p.owner.startswith("detect.") for p in points):
            # the head's Concat feeds the graph output only: it stays float (P12/S02)
            assert all(p.decision == "skip" and p.rule == "S02" for p in points), points
            continue
        assert all(p.quantized for p in points), [p.name for p in points if not p.quantized]
        groups = {p.group for p in points}
        assert len(groups) == 1, {p.name: p.group for p in points}
        consumers = [p for p in plan.points if p.producer == cat and p.kind == "input"]
        assert consumers, f"nothing reads {cat}"
        assert all(p.quantized and p.group in groups for p in consumers), [
            (p.name, p.decision, p.group) for p in consumers
        ]
        # materialised: every input of the cat and its output go through the same Quantizer
        quantizer = plan.groups[groups.pop()].quantizer
        assert [str(a.target) for a in nodes[cat].args[0]] == [quantizer] * n_inputs
        assert [str(u.target) for u in nodes[cat].users] == [quantizer]
    skipped_heads = [c for c, ps in by_cat.items() if not any(p.quantized for p in ps)]
    assert len(skipped_heads) == 1


def test_yolo_sppf_group_crosses_its_maxpools(yolo) -> None:
    _, prepared = yolo
    plan = qdq.plan_of(prepared)
    cat_points = [p for p in plan.points if p.op == "cat" and p.owner.startswith("sppf.")]
    assert len(cat_points) == 4
    group = plan.groups[cat_points[0].group]
    assert all(p.group == group.id for p in cat_points)
    pools = [n for n in _module_calls(prepared, nn.MaxPool2d) if str(n.target).startswith("sppf.")]
    assert len(pools) == 3  # one MaxPool2d module applied three times in series
    crossed = [c for c in group.crosses if c.startswith("sppf.m")]
    assert len(crossed) == 3, group.crosses
    assert "sppf.cv2.conv:input" in group.members


def test_yolo_no_qdq_inside_conv_bn_silu_epilogues(yolo) -> None:
    _, prepared = yolo
    plan = qdq.plan_of(prepared)
    allowed = {("conv", "weight"), ("conv", "input"), ("cat", "input"), ("add", "input")}
    allowed |= {("avg_pool", "input"), ("max_pool", "input")}
    bad = [p.name for p in plan.points if p.quantized and (p.op, p.kind) not in allowed]
    assert not bad, bad
    # in the prepared graph: conv → BN → SiLU with nothing in between
    for bn in _module_calls(prepared, nn.BatchNorm2d):
        src = bn.args[0]
        assert src.op == "call_function" and src.target in (torch.conv2d, F.conv2d), bn
    silus = _module_calls(prepared, nn.SiLU)
    for act in silus:
        src = act.args[0]
        assert src.op == "call_module" and isinstance(
            prepared.get_submodule(str(src.target)), nn.BatchNorm2d
        ), act
    # every SiLU is explained (P07) and left alone
    p07 = [p for p in plan.points if p.rule == "P07"]
    assert len(p07) == len(silus), (len(p07), len(silus))
    assert all(p.decision == "skip" for p in p07)
    quantizer_inputs = [
        n.args[0]
        for n in prepared.graph.nodes
        if n.op == "call_module"
        and isinstance(prepared.get_submodule(str(n.target)), qdq.Quantizer)
    ]
    for src in quantizer_inputs:
        assert not (src.op == "call_function" and src.target in (torch.conv2d, F.conv2d)), src
        if src.op == "call_module":
            assert not isinstance(prepared.get_submodule(str(src.target)), nn.BatchNorm2d), src


def test_yolo_bottleneck_residual_add_quantizes_exactly_one_input(yolo) -> None:
    _, prepared = yolo
    plan = qdq.plan_of(prepared)
    nodes = _nodes(prepared)
    adds: dict[str, list[QuantPoint]] = {}
    for p in plan.points:
        if p.op == "add":
            adds.setdefault(p.owner, []).append(p)
    blocks = {owner.rpartition(".")[0]: points for owner, points in adds.items()}
    assert set(blocks) == {"c3_1.m.0", "c2f_p3.m.0", "c2f_p4.m.0"}
    for block, points in blocks.items():
        assert len(points) == 2, points
        quantized = [p for p in points if p.quantized]
        fused = [p for p in points if not p.quantized]
        assert len(quantized) == 1 and len(fused) == 1, points
        assert quantized[0].rule == "P03" and fused[0].rule == "P03"
        # the fused operand is the Bottleneck's own conv branch, the skip is the block input
        assert str(nodes[fused[0].producer].target) == f"{block}.cv2.act"
        assert str(nodes[quantized[0].producer].target) != f"{block}.cv2.act"
        add_node = nodes[quantized[0].consumer]
        kinds = [
            isinstance(prepared.get_submodule(str(a.target)), qdq.Quantizer)
            if a.op == "call_module"
            else False
            for a in add_node.args
        ]
        assert sorted(kinds) == [False, True], add_node.args


def test_yolo_excluded_head_is_float_with_a_reason(yolo) -> None:
    model, _ = yolo
    x = torch.randn(BATCH, 3, SIZE, SIZE)
    prepared = qdq.prepare(model, (x,), qdq.QuantConfig.tensorrt().exclude(regex=r"^detect\."))
    plan = qdq.plan_of(prepared)
    head = [c for c in plan.coverage if c.module.startswith("detect.")]
    assert len(head) == 2
    for c in head:
        assert c.status == "float" and c.rule == "USER" and c.reason.strip(), c
    assert all(c.status == "int8" for c in plan.coverage if not c.module.startswith("detect."))


def test_yolo_share_rule_names_the_real_reason(yolo) -> None:
    _, prepared = yolo
    plan = qdq.plan_of(prepared)
    points = {p.name: p for p in plan.points}
    wrong = []
    for g in plan.groups:
        members = [points[m] for m in g.members]
        for p in members:
            same_tensor = any(o is not p and o.producer == p.producer for o in members)
            if p.decision == "share" and p.share_rule == "S01" and not same_tensor:
                wrong.append(f"{p.name} (reads {p.producer}, leader {g.leader})")
        joins_a_concat = any(p.op == "cat" for p in members) and any(p.op != "cat" for p in members)
        if joins_a_concat and "S02" not in g.rules:
            wrong.append(f"group {g.id} ({g.leader}) joins a Concat but rules={g.rules}")
    assert not wrong, wrong


class _SharedHead(nn.Module):
    """One head conv applied to two pyramid levels (RetinaNet/FCOS-style weight sharing)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.down = nn.Conv2d(16, 16, 3, stride=2, padding=1)
        self.head = nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p1 = torch.relu(self.stem(x))
        p2 = torch.relu(self.down(p1))
        return self.head(p1), self.head(p2)


def test_weight_shared_head_is_quantized_at_every_call() -> None:
    model = _SharedHead().eval()
    x = torch.randn(1, 3, 16, 16)
    prepared = Seen(qdq.prepare(model, (x,)), x)
    convs = [
        n
        for n in prepared.graph.nodes
        if n.op == "call_function" and n.target in (torch.conv2d, F.conv2d)
    ]
    assert len(convs) == 4

    def quantized(a: object) -> bool:
        return (
            isinstance(a, fx.Node)
            and a.op == "call_module"
            and isinstance(prepared.get_submodule(str(a.target)), qdq.Quantizer)
        )

    unquantized = [c.name for c in convs if not (quantized(c.args[0]) and quantized(c.args[1]))]
    assert not unquantized, f"conv calls without input/weight quantizers: {unquantized}"


# ---------------------------------------------------------------------- CenterNet-style net
@pytest.fixture(scope="module")
def centernet() -> nn.Module:
    torch.manual_seed(0)
    return bn_calibrated(CenterNetStyleNet(), (BATCH, 3, SIZE, SIZE))


def _conv_transposes(model: nn.Module) -> dict[str, nn.ConvTranspose2d]:
    return {n: m for n, m in model.named_modules() if isinstance(m, nn.ConvTranspose2d)}


@pytest.mark.parametrize("axis", [None, 1], ids=["default", "axis1"])
def test_centernet_conv_transpose_weight_axis(centernet: nn.Module, axis: int | None) -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(BATCH, 3, SIZE, SIZE, generator=g)
    config = None if axis is None else qdq.QuantConfig(conv_transpose_axis=1)
    prepared = qdq.prepare(centernet, (x,), config)
    plan = qdq.plan_of(prepared)
    deconvs = _conv_transposes(centernet)
    assert len(deconvs) == 3
    weights = [p for p in plan.points if p.op == "conv_transpose" and p.kind == "weight"]
    assert sorted(p.owner for p in weights) == sorted(deconvs)
    for p in weights:
        assert p.decision == "quantize" and p.rule == "V12", p
        assert p.spec is not None and p.spec.axis == axis, p
        q = prepared.get_submodule(plan.groups[p.group].quantizer)
        w = deconvs[p.owner].weight.detach()
        expected = w.abs().amax() if axis is None else w.abs().amax(dim=(0, 2, 3))
        assert q.spec.axis == axis
        torch.testing.assert_close(q.amax, expected)
    inputs = [p for p in plan.points if p.op == "conv_transpose" and p.kind == "input"]
    assert len(inputs) == 3 and all(p.quantized and p.rule == "P01" for p in inputs)
    others = [p for p in plan.points if p.op == "conv" and p.kind == "weight"]
    assert others and all(p.spec is not None and p.spec.axis == 0 for p in others)
    # calibrated, the heatmap follows the float model; all heads are reported
    batches = [torch.randn(BATCH, 3, SIZE, SIZE, generator=g) for _ in range(4)]
    qdq.calibrate(prepared, batches, show_progress=False)
    x_eval = torch.randn(BATCH, 3, SIZE, SIZE, generator=g)
    ref, out = run_no_grad(centernet, x_eval), run_no_grad(prepared, x_eval)
    assert set(out) == {"hm", "wh", "reg"}
    cos = {k: cosine(ref[k], out[k]) for k in ref}
    print(
        f"\n[centernet axis={axis}] head cosines "
        + " ".join(f"{k}={v:.4f}" for k, v in cos.items())
    )
    assert cos["hm"] >= COSINE_BAR, cos
