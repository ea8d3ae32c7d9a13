"""What ``benchmarks/gpu.py`` (qdq) and ``benchmarks/peers/gpu_peers.py`` (ModelOpt, in its own
environment) share: the models, the data, the timer and the figures' names. Imports torch and
torchvision only, never qdq, so the peer environment can load it by path."""

from __future__ import annotations

import copy
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

#: the figures, in table order: (key, label)
FIGURES = (
    ("calib_max", "calibration max, × one FP32 pass over the batches"),
    ("calib_mse", "calibration mse, × one FP32 pass over the batches"),
    ("fq_forward", "fake-quant forward, × FP32 forward"),
    ("qat_fp32", "QAT step (fwd, bwd, SGD), × float step, fp32"),
    ("qat_bf16", "QAT step, × float step, bf16 autocast"),
    ("compiled_fq_forward", "torch.compile: fake-quant forward, × compiled FP32 forward"),
    ("compiled_qat_fp32", "torch.compile: QAT step, × compiled float step, fp32"),
    ("compiled_qat_bf16", "torch.compile: QAT step, × compiled float step, bf16"),
)


def build(name: str, device: str) -> nn.Module:
    """A torchvision model with random (seeded) weights, eval mode, on ``device``."""
    import torchvision

    torch.manual_seed(0)
    return torchvision.models.get_model(name, weights=None).eval().to(device)


def batches(n: int, batch: int, size: int, device: str) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(batch, 3, size, size, generator=g).to(device) for _ in range(n)]


def sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _once(fn: Callable[[], Any], device: str) -> float:
    """One timed run of ``fn()`` (CUDA events between synchronised points on a GPU)."""
    if torch.device(device).type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize(device)
        return float(start.elapsed_time(end)) / 1000.0
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def paired_ratio(
    subject: Callable[[], Any],
    baseline: Callable[[], Any],
    device: str,
    repeats: int,
    warmup: int,
) -> float:
    """The median over ``repeats`` of ``time(subject) / time(baseline)``, the two run back to back
    in each repeat (which one goes first alternates), after ``warmup`` runs of each: a change of
    load on a shared machine hits both sides of a ratio, not one figure of it."""
    for _ in range(warmup):
        baseline()
        subject()
    ratios = []
    for i in range(repeats):
        if i % 2:
            b = _once(baseline, device)
            a = _once(subject, device)
        else:
            a = _once(subject, device)
            b = _once(baseline, device)
        ratios.append(a / b)
    return statistics.median(ratios)


def forward_pass(model: nn.Module, data: list[torch.Tensor]) -> Callable[[], None]:
    def run() -> None:
        with torch.no_grad():
            for x in data:
                model(x)

    return run


def train_step(
    model: nn.Module, x: torch.Tensor, device: str, dtype: torch.dtype | None
) -> Callable[[], None]:
    """One step: forward (under autocast when ``dtype``), a mean-square loss, backward, SGD."""
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    kind = torch.device(device).type

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(kind, dtype=dtype or torch.float32, enabled=dtype is not None):
            out = model(x)
        out.float().square().mean().backward()
        opt.step()

    return step


def cell(fn: Callable[[], float]) -> float | str:
    """A ratio, or ``"fails: <error type>"``."""
    try:
        return fn()
    except Exception as err:  # a benchmark cell that cannot run is reported, not fatal
        return f"fails: {type(err).__name__}"


def put_cell(out: dict[str, Any], key: str, fn: Callable[[], float]) -> None:
    """``out[key] = cell(fn)``, printed to stderr at once (a run stopped by its time limit keeps
    what it measured)."""
    out[key] = cell(fn)
    print(f"  {key}: {out[key]}", file=sys.stderr, flush=True)


def forward_and_step_ratios(
    quantized: nn.Module,
    trainable: nn.Module,
    model: nn.Module,
    x: torch.Tensor,
    device: str,
    ratio: Callable[[Callable[[], Any], Callable[[], Any]], float],
    compile_too: bool,
    eager_too: bool = True,
) -> dict[str, float | str]:
    """The fake-quant forward cells of one tool's ``quantized`` model and the QAT-step cells of its
    ``trainable`` one (copied into train mode per cell; the same model where the tool has one for
    both), against the float ``model`` on batch ``x`` (``ratio``: :func:`paired_ratio` with the
    run's device and repeats); with ``compile_too`` the same under ``torch.compile`` (only those
    when ``eager_too`` is false). Each cell is printed to stderr as it completes, so that a run
    stopped by its time limit keeps what it measured. Shared by qdq's and ModelOpt's side."""
    out: dict[str, float | str] = {}

    def put(key: str, fn: Callable[[], float]) -> None:
        put_cell(out, key, fn)

    if eager_too:
        put("fq_forward", lambda: ratio(forward_pass(quantized, [x]), forward_pass(model, [x])))
        for key, dtype in (("qat_fp32", None), ("qat_bf16", torch.bfloat16)):
            put(key, lambda d=dtype: _step_ratio(trainable, model, x, device, d, ratio))
    if compile_too:
        cq, cm = torch.compile(quantized), torch.compile(copy.deepcopy(model))
        put("compiled_fq_forward", lambda: ratio(forward_pass(cq, [x]), forward_pass(cm, [x])))
        for key, dtype in (("compiled_qat_fp32", None), ("compiled_qat_bf16", torch.bfloat16)):
            put(key, lambda d=dtype: _step_ratio(trainable, model, x, device, d, ratio, True))
    return out


def _step_ratio(
    quantized: nn.Module,
    model: nn.Module,
    x: torch.Tensor,
    device: str,
    dtype: torch.dtype | None,
    ratio: Callable[[Callable[[], Any], Callable[[], Any]], float],
    compiled: bool = False,
) -> float:
    """QAT step of a train-mode copy of ``quantized`` × the float step of a copy of ``model``."""
    mine, theirs = copy.deepcopy(quantized).train(), copy.deepcopy(model).train()
    if compiled:
        mine, theirs = torch.compile(mine), torch.compile(theirs)  # type: ignore[assignment]
    return float(ratio(train_step(mine, x, device, dtype), train_step(theirs, x, device, dtype)))
