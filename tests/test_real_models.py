"""Real architectures of issue 10 (ultralytics, timm, segmentation-models-pytorch, torchvision).

Built from their packages with random weights (``tests/models/real.py``; a missing package skips
its rows). For every architecture, one module-scoped case (built and prepared once) asserts what
holds both before and after the capture/placement rewrite of issue 10:

* ``qdq.prepare`` does not modify the user's model (state dict, submodules, output, eval mode);
* the prepared model with every quantizer bypassed computes the float model (same output structure,
  same values);
* ``plan.coverage`` lists every Conv/ConvTranspose/Linear of the model exactly once, with a status
  and a reason.

The full matrix (capture path, plan counts, both exporters, ORT parity, lint) is printed by
``benchmarks/real_models.py``; ``benchmarks/real_models_before.txt`` is the table before the rewrite.

Expectations that only the rewrite delivers (issue 10, "Done when"), NOT asserted here yet; turn
them into assertions when the rewrite lands:

1. Capture path: every row takes the graph path (``torch.fx`` or ``torch.export`` non-strict),
   reported by the plan (``plan.capture``), except ``fasterrcnn_resnet50_fpn`` and
   ``keypointrcnn_resnet50_fpn`` (module replacement, with a note of what was not covered). Today
   the 8 ultralytics rows and both R-CNNs fall back (benchmarks/real_models_before.txt).
2. P03 on residual Adds: every residual Add of ResNet-50, EfficientNet-B0, MobileNetV3-L,
   RegNetY-008, CSPDarkNet-53, ConvNeXt-T, ViT-Ti (both Adds per block), U-Net-ResNet34's encoder,
   RetinaNet's FPN (top-down Adds, through ``interpolate(size=...)``), DeepLabV3's backbone and the
   YOLO Bottlenecks (C2f/C3k2 shortcuts) has a quantized P03 input; shape-only reads (``x.shape``,
   ``x.ndim``, ``_assert``) do not turn it into P05.
3. Shared groups: every ultralytics Concat (C2f/C3k2, neck, SPPF) is one S02 scale group over its
   inputs and output; SPPF's MaxPools share in/out (S03); U-Net decoder Concats likewise.
4. Both exporters (``exporter="dynamo"`` and ``"torchscript"``) succeed on every row, including the
   fallback R-CNNs and the deployment-form YOLOs; ViT with TorchScript; dynamic batch from the batch-1
   example (ConvNeXt); one weight quantizer per module however often it is called (RetinaNet head).
5. Lint: no P03a/P04/S02b placement warning on any convolutional row (unfused Q/DQ at or near the
   ResNet-50 level); transformer rows (ViT, ConvNeXt) float only where the rule table says TensorRT
   wants it (LayerNorm/Softmax/GELU), Q·Kᵀ and attention·V with both inputs INT8.
6. The prepared model keeps the float model's attributes (``model.stride``, ``model.names``,
   ``model.model[-1]`` for ultralytics) and train/eval behaviour.
"""

from __future__ import annotations

import copy
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._pytree import tree_flatten

import qdq
from models.real import ARCHS, RealModel

WEIGHTED_TYPES = (
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
    nn.Linear,
)


def _param(name: str) -> Any:
    arch = ARCHS[name]
    marks = [pytest.mark.slow] if arch.slow else []
    if not arch.available:
        marks.append(pytest.mark.skip(reason=f"{', '.join(arch.missing)} not installed"))
    return pytest.param(name, marks=marks, id=name)


@dataclass
class RealCase:
    """One architecture, built and prepared once."""

    rm: RealModel
    prepared: nn.Module
    state_before: dict[str, torch.Tensor]
    modules_before: list[str]
    out_before: Any
    out_after_prepare: Any
    seconds: float


def _run(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> Any:
    with torch.no_grad():
        return model(*inputs)


@pytest.fixture(scope="module", params=[_param(n) for n in ARCHS])
def case(request: pytest.FixtureRequest) -> RealCase:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        rm = ARCHS[request.param].build()
        model, inputs = rm.model, rm.example_inputs
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        modules = [n for n, _ in model.named_modules()]
        out_before = copy.deepcopy(_run(model, inputs))
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # today's fallback warns; the plan's notes say it too
            prepared = qdq.prepare(model, inputs)
        seconds = time.perf_counter() - start
        out_after = _run(model, inputs)
    finally:
        torch.set_num_threads(before)
    return RealCase(rm, prepared, state, modules, out_before, out_after, seconds)


def _leaves(out: Any) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(out)
    return [t for t in leaves if isinstance(t, torch.Tensor)]


def _structure(out: Any) -> str:
    """Containers and keys of an output, tensors as their shape (dicts and OrderedDicts alike)."""
    if isinstance(out, dict):
        return "{" + ", ".join(f"{k}: {_structure(v)}" for k, v in out.items()) + "}"
    if isinstance(out, (tuple, list)):
        return "[" + ", ".join(_structure(v) for v in out) + "]"
    if isinstance(out, torch.Tensor):
        return str(tuple(out.shape))
    return type(out).__name__


def _max_diff(a: Any, b: Any) -> float:
    pairs = zip(_leaves(a), _leaves(b), strict=True)
    return max(
        ((x.float() - y.float()).abs().max().item() for x, y in pairs if x.numel()), default=0.0
    )


# ---------------------------------------------------------------------------------------- tests
def test_prepare_leaves_the_model_unchanged(case: RealCase) -> None:
    model = case.rm.model
    state = model.state_dict()
    assert state.keys() == case.state_before.keys()
    changed = [k for k in state if not torch.equal(state[k], case.state_before[k])]
    assert not changed, f"prepare modified the user's model: {changed[:5]}"
    assert [n for n, _ in model.named_modules()] == case.modules_before
    assert not any(isinstance(m, qdq.Quantizer) for m in model.modules())
    assert not model.training
    assert case.prepared is not model
    assert _structure(case.out_after_prepare) == _structure(case.out_before)
    assert _max_diff(case.out_after_prepare, case.out_before) == 0.0
    print(f"\n[real] {case.rm.name}: prepare {case.seconds:.1f} s")


def test_bypassed_prepared_model_computes_the_float_model(case: RealCase) -> None:
    ref = case.out_before
    assert all(torch.isfinite(t).all() for t in _leaves(ref)), "float output not finite"
    with qdq.quantizer_mode(case.prepared, "bypass"), torch.no_grad():
        out = case.prepared(*case.rm.example_inputs)
    assert _structure(out) == _structure(ref)
    scale = max((t.abs().max().item() for t in _leaves(ref) if t.numel()), default=1.0)
    diff = _max_diff(out, ref)
    assert diff <= 1e-5 * max(1.0, scale), f"max |diff| {diff:.3g} (output scale {scale:.3g})"


def test_coverage_accounts_for_every_weighted_module(case: RealCase) -> None:
    plan = qdq.plan_of(case.prepared)
    expected = {
        n: type(m).__name__
        for n, m in case.rm.model.named_modules()
        if isinstance(m, WEIGHTED_TYPES)
    }
    seen = Counter(c.module for c in plan.coverage)
    assert set(seen) == set(expected), {
        "missing": sorted(set(expected) - set(seen))[:5],
        "unexpected": sorted(set(seen) - set(expected))[:5],
    }
    assert all(n == 1 for n in seen.values()), [m for m, n in seen.items() if n > 1]
    for c in plan.coverage:
        assert c.type == expected[c.module], c
        assert c.status in ("int8", "float", "not reached"), c
        assert c.reason.strip(), f"coverage entry without a reason: {c}"
    counts = Counter(c.status for c in plan.coverage)
    print(f"\n[coverage] {case.rm.name}: {dict(counts)} of {len(plan.coverage)}")
