"""CPU proxies of qdq's GPU cost (issue 48): what a launch-bound GPU pays, measured where compute
vanishes (batch 1 or 2, 32×32 inputs, one thread) and counted exactly.

Per model, each against the float model over the same calls:

* host time per call, as the median of paired ratios (subject and float timed back to back,
  alternating, after warm-up: a load change on the shared machine hits both sides of a ratio):
  the bypassed prepared model (every quantizer in ``bypass``), the fake-quant forward, a one-batch
  ``qdq.calibrate`` (max; the default histogram/mse) and the cost of one more batch inside a
  calibration, × the float forward; the QAT step (forward, loss, backward, SGD) × the float step;
* aten ops and kernels (ops that are neither views nor allocations) of a forward and a backward,
  and the ops each quantizer adds: (subject − float) / quantizers;
* aten ops, kernels and host synchronisations (:mod:`gpu_proxy_probes`) per calibration batch
  (the difference between a calibration of ``1 + MERGE_EVERY`` batches and one of 1, divided by
  ``MERGE_EVERY``: one merge of the pending histograms included), in computing the amax, and per
  QAT step;
* ``torch.compile`` (dynamo, backend ``eager``): graphs, recompilations and graph breaks over
  :data:`gpu_proxy_probes.EVAL_SEQUENCE` (the prepared model) and ``TRAIN_SEQUENCE`` (the QAT
  model), against the float model over the same sequence, ``fullgraph=True`` where the float
  model compiles so.

Usage (``benchmarks/README.md``, "GPU proxies")::

    PYTHONPATH=src .venv/bin/python benchmarks/gpu_proxies.py \\
        --models tiny_cnn resnet50 efficientnet_b0 vit_b_16 --json /tmp/proxies.json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_common as common
import gpu_proxy_probes as probes
import qdq
import qdq.qat
from qdq.calib import histogram
from qdq.quant import QuantMode, quantizer_mode

DEFAULT_MODELS = ("tiny_cnn", "resnet50", "efficientnet_b0", "vit_b_16")


class TinyCNN(nn.Module):
    """Conv-BN-ReLU stem, a residual block, a concat of two branches, max and average pooling and
    a Linear: the placement patterns of a ConvNet in a model that runs in a millisecond."""

    def __init__(self, c: int = 32) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU())
        self.c1 = nn.Conv2d(c, c, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(c)
        self.c2 = nn.Conv2d(c, c, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(c)
        self.a = nn.Conv2d(c, c, 1)
        self.b = nn.Conv2d(c, c, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(2 * c, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        y = self.bn2(self.c2(torch.relu(self.bn1(self.c1(x)))))
        x = torch.relu(x + y)
        x = torch.cat([self.a(x), self.b(x)], dim=1)
        return self.fc(self.pool(x).mean((2, 3)))


def build(name: str, size: int) -> nn.Module:
    """A model with random (seeded) weights, eval mode: ``tiny_cnn``, ``tiny_vit`` (two encoder
    layers of width 64) or a torchvision name (ViTs built for ``size``)."""
    torch.manual_seed(0)
    if name == "tiny_cnn":
        return TinyCNN().eval()
    import torchvision

    if name == "tiny_vit":
        vit = torchvision.models.VisionTransformer
        return vit(
            size, 8, num_layers=2, num_heads=2, hidden_dim=64, mlp_dim=128, num_classes=16
        ).eval()
    extra = {"image_size": size} if name.startswith("vit_") else {}
    return torchvision.models.get_model(name, weights=None, **extra).eval()


class Subjects:
    """A float model, its prepared copy calibrated (max) and its QAT copy, and the inputs: one
    image for forwards and calibration, two for training steps (BatchNorm trains on more than one
    value per channel)."""

    def __init__(self, name: str, size: int = 32) -> None:
        self.name = name
        self.model = build(name, size)
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(1, 3, size, size, generator=g)
        self.x2 = torch.randn(2, 3, size, size, generator=g)
        self.batches = [torch.randn(1, 3, size, size, generator=g) for _ in range(3)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.prepared = qdq.prepare(self.model, (self.x,))
            qdq.calibrate(self.prepared, self.batches, method="max", show_progress=False)
            self.qat = qdq.qat.prepare(self.prepared).train()
        quantizers = qdq.quantizers_of(self.prepared).values()
        self.quantizers = len(quantizers)
        #: the quantizers calibration feeds (activations; weights take their amax at prepare)
        self.activations = sum(q.calibrator.num_batches > 0 for q in quantizers)
        self.sample = lambda n: torch.randn(n, *self.x.shape[1:], generator=g)


def _no_grad(model: nn.Module, x: torch.Tensor) -> Callable[[], Any]:
    def run() -> Any:
        with torch.no_grad():
            return model(x)

    return run


def _calibrate(
    prepared: nn.Module, data: list[torch.Tensor], method: str | None
) -> Callable[[], Any]:
    def run() -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return qdq.calibrate(prepared, data, method=method, show_progress=False)

    return run


def _fwd_bwd(model: nn.Module, x: torch.Tensor) -> tuple[probes.Probe, probes.Probe]:
    """Probes of one training forward (with gradients) and of its backward."""
    fwd = probes.Probe(attribute=True)
    with fwd.recording():
        out = model(x)
    loss = out.float().square().mean()
    bwd = probes.Probe(attribute=True)
    with bwd.recording():
        loss.backward()
    model.zero_grad(set_to_none=True)
    return fwd, bwd


def _top(sites: Counter[str], n: int = 6) -> list[list[Any]]:
    return [[site, round(v, 2) if isinstance(v, float) else v] for site, v in sites.most_common(n)]


def count_figures(s: Subjects) -> dict[str, Any]:
    """The exact counts of :mod:`gpu_proxy_probes` for one model (see the module docstring)."""
    out: dict[str, Any] = {"quantizers": s.quantizers, "activation_quantizers": s.activations}
    nq = max(1, s.quantizers)
    fq = _no_grad(s.prepared, s.x)
    fq()  # the fixed weights' fake-quantized copies are made once (Quantizer._weight_key)
    float_fwd = probes.count(_no_grad(s.model, s.x))
    fq_fwd = probes.count(fq, attribute=True, host_reads=True)
    with quantizer_mode(s.prepared, QuantMode.BYPASS):
        bypass = probes.count(_no_grad(s.prepared, s.x), attribute=True)
    out["float_fwd_ops"], out["float_fwd_kernels"] = float_fwd.total, float_fwd.kernels
    out["fq_fwd_ops"], out["fq_fwd_kernels"] = fq_fwd.total, fq_fwd.kernels
    out["bypass_fwd_ops"], out["bypass_fwd_kernels"] = bypass.total, bypass.kernels
    out["fq_fwd_kernels_per_q"] = (fq_fwd.kernels - float_fwd.kernels) / nq
    out["fq_fwd_syncs"] = len(fq_fwd.syncs)
    out["fq_fwd_sites"] = _top(fq_fwd.op_sites)
    out["fq_fwd_site_ops"] = _top(fq_fwd.site_ops, 12)

    f_fwd, f_bwd = _fwd_bwd(copy.deepcopy(s.model).train(), s.x2)
    _fwd_bwd(s.qat, s.x2)  # each quantizer's scale and clipping bound are made once (per amax)
    q_fwd, q_bwd = _fwd_bwd(s.qat, s.x2)
    for key, p in (("float_train_fwd", f_fwd), ("float_train_bwd", f_bwd),
                   ("qat_fwd", q_fwd), ("qat_bwd", q_bwd)):  # fmt: skip
        out[f"{key}_ops"], out[f"{key}_kernels"] = p.total, p.kernels
    out["qat_fwd_kernels_per_q"] = (q_fwd.kernels - f_fwd.kernels) / nq
    out["qat_bwd_kernels_per_q"] = (q_bwd.kernels - f_bwd.kernels) / nq
    out["qat_sites"] = _top(q_fwd.op_sites + q_bwd.op_sites)
    out["qat_site_ops"] = _top(q_fwd.site_ops + q_bwd.site_ops, 16)

    step = common.train_step(s.qat, s.x2, "cpu", None)
    step()
    qat_step = probes.count(step, host_reads=True)
    float_step = probes.count(common.train_step(copy.deepcopy(s.model).train(), s.x2, "cpu", None))
    out["qat_step_syncs"], out["float_step_syncs"] = len(qat_step.syncs), len(float_step.syncs)
    out["qat_step_sync_sites"] = _top(qat_step.sync_sites())

    out.update(_calibration_counts(s, float_fwd.total, float_fwd.kernels))
    return out


def _merge_span(s: Subjects) -> tuple[int, list[Any]]:
    """``MERGE_EVERY`` (1 for a qdq that merged every batch as it came) and ``1 + MERGE_EVERY``
    calibration batches (the subject's, cycled): one more batch than a merge takes."""
    extra = getattr(histogram, "MERGE_EVERY", 1)
    return extra, [s.batches[i % len(s.batches)] for i in range(1 + extra)]


def _calibration_counts(s: Subjects, float_ops: int, float_kernels: int) -> dict[str, Any]:
    """Per calibration batch: the difference between a calibration of ``1 + MERGE_EVERY`` batches
    and one of 1 batch, divided by ``MERGE_EVERY`` (the histogram collection every method
    shares, with the merge of ``MERGE_EVERY`` pending batches into the running histogram that
    the longer one pays once more); the rest of a 1-batch calibration is the amax computation
    (``max``, and ``mse``: the default). Counted on the histogram's path for
    a device where reading back waits for it (``reads_free`` false): on the CPU the calibrator
    reads each batch's range and sign, which costs nothing there and is no proxy for a GPU."""
    out: dict[str, Any] = {}
    na = max(1, s.activations)
    free = histogram.reads_free
    extra, many = _merge_span(s)
    histogram.reads_free = lambda device: False
    try:
        one = probes.count(_calibrate(s.prepared, s.batches[:1], None), attribute=True,
                           host_reads=True)  # fmt: skip
        many_c = probes.count(_calibrate(s.prepared, many, None), attribute=True,
                             host_reads=True)  # fmt: skip
        by_max = probes.count(_calibrate(s.prepared, s.batches[:1], "max"), host_reads=True)
    finally:
        histogram.reads_free = free
    ops = (many_c.total - one.total) / extra
    syncs = (len(many_c.syncs) - len(one.syncs)) / extra
    sites = Counter({k: v / extra for k, v in (many_c.sync_sites() - one.sync_sites()).items()})
    out["calib_batch_ops"], out["calib_batch_ops_x_float"] = ops, ops / max(1, float_ops)
    kernels = (many_c.kernels - one.kernels) / extra
    out["calib_batch_kernels"] = kernels
    out["calib_batch_kernels_x_float"] = kernels / max(1, float_kernels)
    out["calib_batch_syncs"], out["calib_batch_syncs_per_q"] = syncs, syncs / na
    out["calib_batch_sync_sites"] = _top(sites)
    out["calib_batch_op_sites"] = _top(
        Counter({k: v / extra for k, v in (many_c.op_sites - one.op_sites).items()})
    )
    stacks: dict[str, list[str]] = {}
    for sy in many_c.syncs:
        if sy.site in sites:
            stacks.setdefault(sy.site, list(sy.stack))
    out["calib_batch_sync_stacks"] = dict(list(stacks.items())[:3])
    per_batch = Counter({k: int(v) for k, v in sites.items()})
    for method in ("max", "mse"):
        amax = one if method == "mse" else by_max
        out[f"calib_{method}_amax_syncs"] = len(amax.syncs) - syncs
        out[f"calib_{method}_amax_sync_sites"] = _top(amax.sync_sites() - per_batch)
    return out


def compile_figures(s: Subjects, backend: str = "eager") -> dict[str, Any]:
    """:func:`gpu_proxy_probes.compile_sequence` of the float model and of the prepared (eval
    sequence) and QAT (training sequence) models."""
    out: dict[str, Any] = {}
    float_model = copy.deepcopy(s.model)
    for tag, subject, steps in (("eval", s.prepared, probes.EVAL_SEQUENCE),
                                ("train", s.qat, probes.TRAIN_SEQUENCE)):  # fmt: skip
        base = probes.compile_sequence(float_model, steps, s.sample, backend=backend)
        full = not base.graph_breaks and base.error is None
        if full:  # the float model compiles as one graph per frame: hold the subject to it
            full_base = probes.compile_sequence(
                float_model, steps, s.sample, backend=backend, fullgraph=True
            )
            base = full_base if full_base.error is None else base
            full = full_base.error is None
        mine = probes.compile_sequence(subject, steps, s.sample, backend=backend, fullgraph=full)
        if mine.error is not None and full:  # count its breaks and recompiles without fullgraph
            error = mine.error
            mine = probes.compile_sequence(subject, steps, s.sample, backend=backend)
            mine.error = f"fullgraph: {error}"
        for who, c in (("float", base), ("qdq", mine)):
            out[f"compile_{tag}_{who}"] = {
                "fullgraph": c.fullgraph, "graphs": c.graphs, "recompiles": len(c.recompiles),
                "graph_breaks": sum(c.graph_breaks.values()), "limit_hit": c.limit_hit,
                "error": c.error, "recompile_reasons": c.recompiles[:12],
                "break_reasons": dict(c.graph_breaks.most_common(6))}  # fmt: skip
    return out


def time_figures(s: Subjects, repeats: int, warmup: int) -> dict[str, float]:
    """Host time per call as the median paired ratio to the float model's (module docstring)."""

    def r(subject: Callable[[], Any], baseline: Callable[[], Any], n: int = repeats) -> float:
        return common.paired_ratio(subject, baseline, "cpu", n, warmup)

    out: dict[str, float] = {}
    float_fwd = _no_grad(s.model, s.x)
    with quantizer_mode(s.prepared, QuantMode.BYPASS):
        out["t_bypass_fwd"] = r(_no_grad(s.prepared, s.x), float_fwd)
    out["t_fq_fwd"] = r(_no_grad(s.prepared, s.x), float_fwd)
    for method in ("max", "mse"):
        out[f"t_calib_{method}"] = r(_calibrate(s.prepared, s.batches[:1], method), float_fwd)
    out["t_calib_batch"] = _batch_ratio(s, float_fwd, repeats, warmup)
    steps = max(5, repeats // 2)
    qat = common.train_step(s.qat, s.x2, "cpu", None)
    out["t_qat_step"] = r(
        qat, common.train_step(copy.deepcopy(s.model).train(), s.x2, "cpu", None), steps
    )
    s.qat.zero_grad(set_to_none=True)
    return out


def _batch_ratio(s: Subjects, float_fwd: Callable[[], Any], repeats: int, warmup: int) -> float:
    """One more batch inside a calibration: ((1 + MERGE_EVERY)-batch − 1-batch calibration) /
    MERGE_EVERY (a merge of the pending batches included, as :func:`_calibration_counts`),
    × the float forward, the three timed back to back (order rotating) in each repeat; the
    median."""
    extra, many = _merge_span(s)
    runs = [
        _calibrate(s.prepared, s.batches[:1], None),
        _calibrate(s.prepared, many, None),
        float_fwd,
    ]
    for _ in range(warmup):
        for fn in runs:
            fn()
    ratios = []
    for i in range(repeats):
        t = [0.0, 0.0, 0.0]
        for j in range(3):
            k = (i + j) % 3
            t0 = time.perf_counter()
            runs[k]()
            t[k] = time.perf_counter() - t0
        ratios.append((t[1] - t[0]) / extra / t[2])
    return statistics.median(ratios)


def profile_figures(s: Subjects, calls: int) -> dict[str, Any]:
    """:func:`gpu_proxy_probes.host_profile` of the float and fake-quant forwards, a 3-batch
    calibration and the QAT and float steps."""
    float_step = common.train_step(copy.deepcopy(s.model).train(), s.x2, "cpu", None)
    runs = {"float_fwd": _no_grad(s.model, s.x), "fq_fwd": _no_grad(s.prepared, s.x),
            "calib_3_batches": _calibrate(s.prepared, s.batches, None),
            "qat_step": common.train_step(s.qat, s.x2, "cpu", None), "float_step": float_step}  # fmt: skip
    out = {f"profile_{k}": probes.host_profile(fn, max(2, calls // (4 if "step" in k else 1)))
           for k, fn in runs.items()}  # fmt: skip
    s.qat.zero_grad(set_to_none=True)
    return out


#: the table: (key, label); a key names a figure of the JSON
ROWS = (
    ("quantizers", "quantizers (activation ones, which calibration feeds)"),
    ("t_bypass_fwd", "host time: bypassed prepared forward × float forward"),
    ("t_fq_fwd", "host time: fake-quant forward × float forward"),
    ("t_calib_max", "host time: calibrate 1 batch, max × float forward"),
    ("t_calib_mse", "host time: calibrate 1 batch, mse × float forward"),
    ("t_calib_batch", "host time: one more calibration batch × float forward"),
    ("t_qat_step", "host time: QAT step × float step (batch 2)"),
    ("fwd_kernels", "kernels, forward: float → fake-quant (eval, no grad)"),
    ("fq_fwd_kernels_per_q", "kernels added per quantizer, fake-quant forward"),
    ("qat_fwd_kernels_per_q", "kernels added per quantizer, QAT forward"),
    ("qat_bwd_kernels_per_q", "kernels added per quantizer, QAT backward"),
    ("calib_batch_ops_x_float", "aten ops per calibration batch × float forward"),
    ("calib_batch_kernels_x_float", "kernels per calibration batch × float forward"),
    ("calib_batch_syncs", "host syncs per calibration batch (per activation quantizer)"),
    ("calib_amax_syncs", "host syncs computing amax: max / mse"),
    ("qat_step_syncs", "host syncs per QAT step (float step)"),
    ("fq_fwd_syncs", "host syncs per fake-quant forward"),
    ("compile_eval", "compile, prepared (eval sequence): recompiles qdq / float; graphs; breaks"),
    ("compile_train", "compile, QAT (training sequence): recompiles qdq / float; graphs; breaks"),
)


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.2f}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def _cell(fig: dict[str, Any], key: str) -> str:
    """One model's cell of the table."""
    if key == "quantizers" and key in fig:
        return f"{fig['quantizers']} ({fig['activation_quantizers']})"
    if key == "fwd_kernels" and "fq_fwd_kernels" in fig:
        return f"{fig['float_fwd_kernels']} → {fig['fq_fwd_kernels']}"
    if key == "calib_batch_syncs" and key in fig:
        return f"{_fmt(fig[key])} ({_fmt(fig['calib_batch_syncs_per_q'])})"
    if key == "calib_amax_syncs" and "calib_max_amax_syncs" in fig:
        return f"{_fmt(fig['calib_max_amax_syncs'])} / {_fmt(fig['calib_mse_amax_syncs'])}"
    if key == "qat_step_syncs" and key in fig:
        return f"{fig[key]} ({fig['float_step_syncs']})"
    if key.startswith("compile_") and f"{key}_qdq" in fig:
        q, f = fig[f"{key}_qdq"], fig[f"{key}_float"]
        text = f"{q['recompiles']} / {f['recompiles']}; {q['graphs']} / {f['graphs']}; {q['graph_breaks']}"
        return text + (" (fullgraph fails)" if q["error"] else "")
    return _fmt(fig.get(key))


def table(figures: dict[str, dict[str, Any]]) -> str:
    models = list(figures)
    rows = ["| | " + " | ".join(models) + " |", "|---|" + "---|" * len(models)]
    rows += [f"| {label} | " + " | ".join(_cell(figures[m], key) for m in models) + " |"
             for key, label in ROWS]  # fmt: skip
    return "\n".join(rows)


def causes(name: str, fig: dict[str, Any]) -> str:
    """Where the counts come from, for one model: the qdq functions that dispatch the most ops,
    the sync sites, the recompilation reasons."""
    lines = [f"{name}:"]
    for key, what in (("fq_fwd_sites", "ops of a fake-quant forward by qdq function"),
                      ("qat_sites", "ops of a QAT forward + backward by qdq function"),
                      ("calib_batch_op_sites", "ops per calibration batch by qdq function"),
                      ("calib_batch_sync_sites", "syncs per calibration batch"),
                      ("calib_mse_amax_sync_sites", "syncs computing amax (mse)"),
                      ("qat_step_sync_sites", "syncs per QAT step")):  # fmt: skip
        if fig.get(key):
            lines.append(f"  {what}: " + "; ".join(f"{site} ×{_fmt(n)}" for site, n in fig[key]))
    for key in [k for k in fig if k.startswith("profile_")]:
        rows = "; ".join(f"{where} {ms} ms ({n} calls)" for ms, n, where in fig[key][:6])
        lines.append(f"  host time by function, {key[8:]}: {rows}")
    for tag in ("eval", "train"):
        c = fig.get(f"compile_{tag}_qdq")
        if c:
            reasons = Counter(c["recompile_reasons"])
            lines.append(
                f"  recompiles ({tag}): " + "; ".join(f"{r} ×{n}" for r, n in reasons.items())
            )
            if c["error"]:
                lines.append(f"  {c['error']}")
    return "\n".join(lines)


def _commit() -> str:
    """HEAD's short hash, ``+ changes in src`` when the working tree's ``src/`` differs from it."""
    root = str(Path(__file__).resolve().parents[1])

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", root, *args], capture_output=True, text=True, check=False
        )
        return done.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + (" + changes in src" if git("status", "--porcelain", "src") else "")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS),
                   help="tiny_cnn, tiny_vit or torchvision names")  # fmt: skip
    p.add_argument("--size", type=int, default=32, help="image side (32)")
    p.add_argument("--repeats", type=int, default=31, help="paired timings per ratio (median)")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs first")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1)")
    p.add_argument("--no-time", dest="time", action="store_false", help="counts only")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="skip torch.compile")
    p.add_argument("--backend", default="eager", help="dynamo backend (eager, aot_eager)")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="also profile N calls of each subject (host time by function)")  # fmt: skip
    p.add_argument("--json", type=Path, help="write every figure and cause here")
    p.add_argument("--gpu-path", action="store_true", help="count qdq's GPU code path: its Triton "
                   "kernels run by Triton's CPU interpreter (TRITON_INTERPRET=1), counts only")  # fmt: skip
    args = p.parse_args()
    if args.gpu_path and os.environ.get("TRITON_INTERPRET") != "1":  # read when qdq is imported
        os.execve(
            sys.executable, [sys.executable, *sys.argv], {**os.environ, "TRITON_INTERPRET": "1"}
        )
    if args.gpu_path:
        args.time = args.compile = False  # the interpreter's time is no GPU's; compile: no kernels
        if not qdq.kernels.usable(torch.zeros(8)):
            sys.exit(
                "--gpu-path: qdq's Triton kernels do not serve the CPU here (is Triton installed?)"
            )
    torch.set_num_threads(args.threads)
    figures: dict[str, dict[str, Any]] = {}
    for name in args.models:
        t0 = time.perf_counter()
        s = Subjects(name, args.size)
        fig = count_figures(s)
        if args.time:
            fig.update(time_figures(s, args.repeats, args.warmup))
        if args.compile:
            fig.update(compile_figures(s, args.backend))
        if args.profile:
            fig.update(profile_figures(s, args.profile))
        figures[name] = fig
        print(f"{name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    path = "GPU path (Triton interpreted) · " if args.gpu_path else ""
    head = (f"{date.today()} · commit {_commit()} · {path}torch {torch.__version__} · CPU, "
            f"{torch.get_num_threads()} thread(s) · batch 1 (steps: 2) × 3×{args.size}×{args.size} · "
            f"times: median of {args.repeats} paired ratios · compile backend {args.backend}")  # fmt: skip
    print(head)
    print(table(figures))
    print()
    for name, fig in figures.items():
        print(causes(name, fig))
    if args.json:
        meta = {"date": str(date.today()), "commit": _commit(), "torch": torch.__version__,
                "gpu_path": args.gpu_path,
                "threads": torch.get_num_threads(), "size": args.size, "backend": args.backend}  # fmt: skip
        args.json.write_text(json.dumps({**meta, "models": figures}, indent=1) + "\n")


if __name__ == "__main__":
    main()
