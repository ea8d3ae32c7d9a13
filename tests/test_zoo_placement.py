"""Q/DQ placement across a zoo of architectures: torchvision classifiers, a segmentation net, a
YOLO-style detector and a CenterNet-style model, all randomly initialised (no downloads).

For every model (one module-scoped fixture instance per architecture, so each is built, prepared
and calibrated once):

* ``prepare`` leaves the user's model untouched (state dict, outputs, submodules);
* the prepared graph with every quantizer bypassed computes the float model exactly;
* every Conv/ConvTranspose/Linear of the model is accounted for once in ``plan.coverage``;
* the plan is self-consistent and materialised as planned (one Quantizer per scale group);
* after ``calibrate`` (4 random batches, default method) the INT8 output follows the float output
  (cosine >= 0.99; models that fall short on random weights are xfailed with measured numbers).

Then structural tests on the YOLO-style net (Concat scale groups, SPPF, Conv-BN-SiLU epilogues,
residual Adds), a weight-shared head, and the CenterNet-style model (ConvTranspose weight
axis; heatmap cosine, all three heads printed).

Run with ``-s`` to see one line per model (plan counts, coverage, cosines, timings).
"""

from __future__ import annotations

import copy
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

import qdq
from models import CenterNetStyleNet, YoloStyleNet
from qdq.graph.plan import QuantPoint
from qdq.graph.record import record

tvm = pytest.importorskip("torchvision.models")
tvseg = pytest.importorskip("torchvision.models.segmentation")

WEIGHTED_TYPES = (
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
    nn.Linear,
)
COSINE_BAR = 0.99
#: a floor far below the bar: catches broken quantization (NaN, collapsed or sign-flipped output)
#: on the models whose 0.99 check is an xfail. It is not the target.
COSINE_FLOOR = 0.80
METHODS = ("max", "mse", "percentile")
BATCH, SIZE = 2, 64


# ------------------------------------------------------------------------------------ helpers
@pytest.fixture(scope="module", autouse=True)
def _two_threads():
    """Two intra-op threads (the CI machine has two cores); restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def bn_calibrated(model: nn.Module, shape: tuple[int, ...], passes: int = 4, seed: int = 1):
    """A copy of ``model`` whose BatchNorm running statistics match N(0, 1) input data.

    Resets every BN's running stats, sets ``momentum=None`` (cumulative average) and runs
    ``passes`` forward passes in train mode without gradients; returns the copy in eval mode.
    """
    m = copy.deepcopy(model)
    for mod in m.modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            mod.reset_running_stats()
            mod.momentum = None
    g = torch.Generator().manual_seed(seed)
    m.train()
    with torch.no_grad():
        for _ in range(passes):
            m(torch.randn(shape, generator=g))
    return m.eval()


def main_output(y: Any) -> torch.Tensor:
    """The tensor compared for cosine: ``out`` of segmentation dicts, ``hm`` of CenterNet."""
    if isinstance(y, dict):
        return y["out"] if "out" in y else y["hm"]
    if isinstance(y, (tuple, list)):
        return y[0]
    return y


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return F.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0).item()


def _vit_b_16() -> nn.Module:
    m = tvm.vit_b_16(weights=None, image_size=SIZE)
    # torchvision zero-initialises the classification head, so the output is identically 0 and a
    # cosine is undefined; give the head ordinary random weights instead.
    nn.init.normal_(m.heads.head.weight, std=0.02)
    return m


ZOO: dict[str, Callable[[], nn.Module]] = {
    "resnet18": lambda: tvm.resnet18(weights=None),
    "resnet50": lambda: tvm.resnet50(weights=None),
    "mobilenet_v2": lambda: tvm.mobilenet_v2(weights=None),
    "mobilenet_v3_small": lambda: tvm.mobilenet_v3_small(weights=None),
    "efficientnet_b0": lambda: tvm.efficientnet_b0(weights=None),
    "regnet_x_400mf": lambda: tvm.regnet_x_400mf(weights=None),
    "densenet121": lambda: tvm.densenet121(weights=None),
    "googlenet": lambda: tvm.googlenet(weights=None, aux_logits=False, init_weights=True),
    "squeezenet1_0": lambda: tvm.squeezenet1_0(weights=None),
    "shufflenet_v2_x0_5": lambda: tvm.shufflenet_v2_x0_5(weights=None),
    "convnext_tiny": lambda: tvm.convnext_tiny(weights=None),
    "vit_b_16": _vit_b_16,
    "deeplabv3_mobilenet_v3_large": lambda: tvseg.deeplabv3_mobilenet_v3_large(
        weights=None, weights_backbone=None, aux_loss=False
    ),
    "yolo_style": YoloStyleNet,
    "centernet_style": CenterNetStyleNet,
}


def _short(cos: str, err: str, noisy: str, weights: str, extra: str = "") -> str:
    return (
        f"random weights: INT8 cosine {cos} (mse/max/percentile), none reaches 0.99; the float "
        f"model with Gaussian noise of the INT8 activation error (median rel. RMS {err}) added at "
        f"every Conv/Linear input scores {noisy}; INT8 weights alone {weights}{extra}"
    )


#: Measured on this file's seeds (2-core CPU, torch 2.14.1). Random-weight networks amplify any
#: perturbation: plain Gaussian noise as large as the INT8 activation error, added in float, loses
#: about as much as quantization does, so these shortfalls are the test's random weights, not a
#: misplaced Q/DQ. Strict: a model that starts passing (or a changed calibration) is news.
COSINE_SHORTFALL: dict[str, str] = {
    "resnet50": _short("0.883/0.867/0.872", "1.0%", "0.883", "0.892"),
    "mobilenet_v2": _short("0.856/0.865/0.903", "1.1%", "0.913", "0.950"),
    "mobilenet_v3_small": _short("0.974/0.970/0.978", "1.8%", "0.981", "0.997"),
    "efficientnet_b0": _short(
        "0.894/0.795/0.898",
        "2.1%",
        "0.929",
        "0.993",
        "; worst single quantizer: features.7.0.block.3.0 input (after SE scaling, amax 24) 0.983",
    ),
    "regnet_x_400mf": _short("0.928/0.908/0.926", "1.2%", "0.934", "0.946"),
    "densenet121": _short("0.982/0.979/0.981", "1.1%", "0.986", "0.991"),
    "googlenet": _short("0.889/0.866/0.879", "1.0%", "0.872", "0.928"),
    "shufflenet_v2_x0_5": _short("0.883/0.915/0.887", "0.9%", "0.875", "0.969"),
    "deeplabv3_mobilenet_v3_large": _short("0.955/0.957/0.966", "1.6%", "0.963", "0.997"),
    "yolo_style": _short(
        "0.968/0.940/0.914",
        "2.2%",
        "0.964",
        "0.999",
        "; worst single quantizer: the S02 group joining both neck Concats (P3 reaches 6.2, the "
        "PAN input 17.2, one amax 15.9) 0.985; with the 'concat' family disabled 0.960",
    ),
}


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


@dataclass
class ZooCase:
    name: str
    model: nn.Module
    prepared: nn.Module
    example: torch.Tensor
    state_before: dict[str, torch.Tensor]
    state_after_prepare: dict[str, torch.Tensor]
    state_after_calibrate: dict[str, torch.Tensor]
    modules_before: list[str]
    out_before: Any
    out_after_prepare: Any
    out_after_calibrate: Any
    eval_x: torch.Tensor
    float_eval: Any
    int8_eval: Any
    cosines: dict[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _run(model: nn.Module, x: torch.Tensor) -> Any:
    with torch.no_grad():
        return model(x)


def _build_case(name: str) -> ZooCase:
    shape = (BATCH, 3, SIZE, SIZE)
    t0 = time.perf_counter()
    torch.manual_seed(0)
    model = bn_calibrated(ZOO[name](), shape)
    data = torch.Generator().manual_seed(2)
    example = torch.randn(shape, generator=data)
    state_before = _snapshot(model)
    modules_before = [n for n, _ in model.named_modules()]
    out_before = _run(model, example)
    t1 = time.perf_counter()
    prepared = qdq.prepare(model, (example,))
    t2 = time.perf_counter()
    state_after_prepare = _snapshot(model)
    out_after_prepare = _run(model, example)
    batches = [torch.randn(shape, generator=data) for _ in range(4)]
    qdq.calibrate(prepared, batches, show_progress=False)
    t3 = time.perf_counter()
    state_after_calibrate = _snapshot(model)
    out_after_calibrate = _run(model, example)
    eval_x = torch.randn(shape, generator=data)
    float_eval = _run(model, eval_x)
    int8_eval = _run(prepared, eval_x)
    case = ZooCase(
        name=name,
        model=model,
        prepared=prepared,
        example=example,
        state_before=state_before,
        state_after_prepare=state_after_prepare,
        state_after_calibrate=state_after_calibrate,
        modules_before=modules_before,
        out_before=out_before,
        out_after_prepare=out_after_prepare,
        out_after_calibrate=out_after_calibrate,
        eval_x=eval_x,
        float_eval=float_eval,
        int8_eval=int8_eval,
    )
    case.cosines["default"] = cosine(main_output(float_eval), main_output(int8_eval))
    # Calibrate once, evaluate many: re-derive amax for the other methods from the collected
    # statistics (no second pass over the data), then restore the default amax.
    quantizers = qdq.quantizers_of(prepared)
    saved = {n: q.amax.clone() for n, q in quantizers.items()}
    default_method = qdq.QuantConfig.tensorrt().activation_calib.method
    for method in METHODS:
        if method == default_method:
            case.cosines[method] = case.cosines["default"]
            continue
        qdq.recompute_amax(prepared, method)
        case.cosines[method] = cosine(main_output(float_eval), main_output(_run(prepared, eval_x)))
    for n, q in quantizers.items():
        q.set_amax(saved[n])
    t4 = time.perf_counter()
    case.seconds = {
        "build+bn": t1 - t0,
        "prepare": t2 - t1,
        "calibrate": t3 - t2,
        "eval": t4 - t3,
    }
    plan = qdq.plan_of(prepared)
    n = {d: sum(v.values()) for d, v in plan.counts().items()}
    cov = Counter(c.status for c in plan.coverage)
    cos = " ".join(f"{k}={v:.4f}" for k, v in case.cosines.items())
    secs = " ".join(f"{k}={v:.1f}s" for k, v in case.seconds.items())
    print(
        f"\n[zoo] {name}: points quantize/share/skip={n['quantize']}/{n['share']}/{n['skip']} "
        f"groups={len(plan.groups)} coverage={dict(cov)} cosine {cos} | {secs}"
    )
    return case


@pytest.fixture(scope="module")
def zoo(request: pytest.FixtureRequest) -> ZooCase:
    return _build_case(request.param)


def _zoo_params(xfail: dict[str, str] | None = None) -> list[Any]:
    marks = xfail or {}
    return [
        pytest.param(
            n,
            id=n,
            marks=(
                [pytest.mark.xfail(strict=True, raises=AssertionError, reason=marks[n])]
                if n in marks
                else []
            ),
        )
        for n in ZOO
    ]


zoo_models = pytest.mark.parametrize("zoo", _zoo_params(), indirect=True)


def _same_output(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_output(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same_output(x, y) for x, y in zip(a, b, strict=True))
    return torch.equal(a, b)


def _close_output(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close_output(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_close_output(x, y) for x, y in zip(a, b, strict=True))
    return torch.allclose(a, b, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------- zoo tests
@zoo_models
def test_prepare_and_calibrate_leave_the_model_unchanged(zoo: ZooCase) -> None:
    for state in (zoo.state_after_prepare, zoo.state_after_calibrate):
        assert state.keys() == zoo.state_before.keys()
        changed = [k for k in state if not torch.equal(state[k], zoo.state_before[k])]
        assert not changed, f"prepare/calibrate modified the user's model: {changed[:5]}"
    assert _same_output(zoo.out_after_prepare, zoo.out_before)
    assert _same_output(zoo.out_after_calibrate, zoo.out_before)
    assert [n for n, _ in zoo.model.named_modules()] == zoo.modules_before
    assert not any(isinstance(m, qdq.Quantizer) for m in zoo.model.modules())
    assert not zoo.model.training
    assert zoo.prepared is not zoo.model
    model_storage = {p.data_ptr() for p in zoo.model.parameters()}
    assert model_storage.isdisjoint(p.data_ptr() for p in zoo.prepared.parameters())


@zoo_models
def test_bypassed_prepared_model_computes_the_float_model(zoo: ZooCase) -> None:
    with qdq.quantizer_mode(zoo.prepared, "bypass"), torch.no_grad():
        out = zoo.prepared(zoo.eval_x)
    assert _close_output(out, zoo.float_eval)


@zoo_models
def test_coverage_accounts_for_every_weighted_module(zoo: ZooCase) -> None:
    plan = qdq.plan_of(zoo.prepared)
    expected = {
        n: type(m).__name__ for n, m in zoo.model.named_modules() if isinstance(m, WEIGHTED_TYPES)
    }
    seen = Counter(c.module for c in plan.coverage)
    assert set(seen) == set(expected), {
        "missing": sorted(set(expected) - set(seen))[:5],
        "unexpected": sorted(set(seen) - set(expected))[:5],
    }
    assert all(n == 1 for n in seen.values()), [m for m, n in seen.items() if n > 1]
    weights = {p.owner: p for p in plan.points if p.kind == "weight"}
    for c in plan.coverage:
        assert c.type == expected[c.module]
        assert c.status in ("int8", "float", "not reached"), c
        assert c.reason.strip(), f"coverage entry without a reason: {c}"
        if c.status == "int8":
            assert weights[c.module].quantized, c
        elif c.status == "float":
            assert c.rule.strip() and c.rule != "-", c
            assert not weights[c.module].quantized, c
        else:
            assert c.module not in weights, c
    counts = Counter(c.status for c in plan.coverage)
    print(f"\n[coverage] {zoo.name}: {dict(counts)} of {len(plan.coverage)}")
    assert counts["int8"] > len(plan.coverage) / 2, dict(counts)


@zoo_models
def test_plan_is_consistent_and_materialised(zoo: ZooCase) -> None:
    plan = qdq.plan_of(zoo.prepared)
    # traced and planned on the graph, not the module-replacement fallback
    assert plan.capture == "recorded", plan.capture
    assert not plan.notes, plan.notes
    names = [p.name for p in plan.points]
    assert len(names) == len(set(names)), [n for n, k in Counter(names).items() if k > 1][:5]
    for p in plan.points:
        assert p.decision in ("quantize", "share", "skip"), p
        assert p.reason.strip() and p.rule.strip(), p
        if p.decision == "skip":
            assert p.group is None and p.spec is None, p
        else:
            assert p.group is not None and p.name in plan.groups[p.group].members, p
            assert p.spec is not None and p.calib is not None, p
    quantizers = qdq.quantizers_of(zoo.prepared)
    assert set(quantizers) == {g.quantizer for g in plan.groups}
    points = {p.name: p for p in plan.points}
    for g in plan.groups:
        assert plan.groups[g.id] is g
        assert points[g.leader].decision == "quantize", g
        assert all(points[m].decision == "share" for m in g.members if m != g.leader), g
        assert quantizers[g.quantizer].is_calibrated, g
        assert torch.isfinite(quantizers[g.quantizer].amax).all(), g
    # every quantizer of the prepared graph is actually called
    called: set[str] = set()
    hooks = [q.register_forward_hook(lambda *a, n=n: called.add(n)) for n, q in quantizers.items()]
    _run(zoo.prepared, zoo.example)
    for h in hooks:
        h.remove()
    assert set(quantizers) <= called, sorted(set(quantizers) - called)


@zoo_models
def test_int8_output_is_not_broken(zoo: ZooCase) -> None:
    out = main_output(zoo.int8_eval)
    assert torch.isfinite(out).all()
    assert out.shape == main_output(zoo.float_eval).shape
    assert zoo.cosines["default"] >= COSINE_FLOOR, zoo.cosines


@pytest.mark.parametrize("zoo", _zoo_params(COSINE_SHORTFALL), indirect=True)
def test_int8_output_matches_float(zoo: ZooCase) -> None:
    assert zoo.cosines["default"] >= COSINE_BAR, (
        f"{zoo.name}: cosine {zoo.cosines['default']:.4f} < {COSINE_BAR}; by method: "
        + ", ".join(f"{k}={v:.4f}" for k, v in zoo.cosines.items())
    )


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
    ref, out = _run(centernet, x_eval), _run(prepared, x_eval)
    assert set(out) == {"hm", "wh", "reg"}
    cos = {k: cosine(ref[k], out[k]) for k in ref}
    print(
        f"\n[centernet axis={axis}] head cosines "
        + " ".join(f"{k}={v:.4f}" for k, v in cos.items())
    )
    assert cos["hm"] >= COSINE_BAR, cos
