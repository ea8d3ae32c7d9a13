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

The structural tests on the YOLO-style and CenterNet-style nets are in
``test_detector_placement.py``.

Run with ``-s`` to see one line per model (plan counts, coverage, cosines, timings).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
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
#: a floor far below the bar: catches broken quantization (NaN, collapsed or sign-flipped output)
#: on the models whose 0.99 check is an xfail. It is not the target.
COSINE_FLOOR = 0.80
METHODS = ("max", "mse", "percentile")


# ------------------------------------------------------------------------------------ helpers
def main_output(y: Any) -> torch.Tensor:
    """The tensor compared for cosine: ``out`` of segmentation dicts, ``hm`` of CenterNet."""
    if isinstance(y, dict):
        return y["out"] if "out" in y else y["hm"]
    if isinstance(y, (tuple, list)):
        return y[0]
    return y


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


def _build_case(name: str) -> ZooCase:
    shape = (BATCH, 3, SIZE, SIZE)
    t0 = time.perf_counter()
    torch.manual_seed(0)
    model = bn_calibrated(ZOO[name](), shape)
    data = torch.Generator().manual_seed(2)
    example = torch.randn(shape, generator=data)
    state_before = _snapshot(model)
    modules_before = [n for n, _ in model.named_modules()]
    out_before = run_no_grad(model, example)
    t1 = time.perf_counter()
    prepared = qdq.prepare(model, (example,))
    t2 = time.perf_counter()
    state_after_prepare = _snapshot(model)
    out_after_prepare = run_no_grad(model, example)
    batches = [torch.randn(shape, generator=data) for _ in range(4)]
    qdq.calibrate(prepared, batches, show_progress=False)
    t3 = time.perf_counter()
    state_after_calibrate = _snapshot(model)
    out_after_calibrate = run_no_grad(model, example)
    eval_x = torch.randn(shape, generator=data)
    float_eval = run_no_grad(model, eval_x)
    int8_eval = run_no_grad(prepared, eval_x)
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
        case.cosines[method] = cosine(
            main_output(float_eval), main_output(run_no_grad(prepared, eval_x))
        )
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
    run_no_grad(zoo.prepared, zoo.example)
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
