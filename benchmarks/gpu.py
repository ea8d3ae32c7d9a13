"""qdq on a GPU (or the CPU): the cost of each verb as a ratio to the float model's, per model,
side by side with ModelOpt run in its own environment (issue 32).

Figures (``gpu_common.FIGURES``), each the median over ``--repeats`` of a paired ratio (the
subject and its float baseline timed back to back, alternating, after warm-up), in one process:
calibration (max, mse) × one FP32 pass over the same batches; the fake-quant forward × the FP32
forward (one batch); the QAT step (forward, a mean-square loss, backward, SGD) × the float
model's step, in fp32 and under bf16 autocast; and the same forward and steps under
``torch.compile`` (compiled against compiled). A cell that cannot run says ``fails: <error>``.

ModelOpt is never a qdq dependency: ``benchmarks/peers/gpu_peers.py`` runs in the peer environment
(``--peer-python``) as a subprocess and prints its figures as JSON; they are merged into one table.
How to run it here and on the GPU machine: ``benchmarks/README.md`` (section "GPU cost").

Usage::

    PYTHONPATH=src .venv/bin/python benchmarks/gpu.py                       # CUDA when present
    PYTHONPATH=src .venv/bin/python benchmarks/gpu.py --device cpu --threads 2 \\
        --models resnet18 --batch 8 --batches 4 --size 224
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import date
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_common as common
import qdq

HERE = Path(__file__).resolve().parent
GPU_MODELS = ("resnet50", "efficientnet_b0", "vit_b_16")


def measure(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """qdq's figures for one model."""
    dev, reps, warm = args.device, args.repeats, args.warmup
    model = common.build(name, dev)
    data = common.batches(args.batches, args.batch, args.size, dev)

    def r(subject: Any, baseline: Any, repeats: int = reps) -> float:
        return common.paired_ratio(subject, baseline, dev, repeats, warm)

    fp32_pass = common.forward_pass(model, data)
    prepared = qdq.prepare(model, (data[0][:1],))
    out: dict[str, Any] = {}
    for method in ("max", "mse") if not args.only_compiled else ():

        def calib(m: str = method) -> None:
            qdq.calibrate(prepared, data, method=m, show_progress=False)

        common.put_cell(out, f"calib_{method}", lambda c=calib: r(c, fp32_pass, max(3, reps // 2)))
    qdq.calibrate(prepared, data, method="max", show_progress=False)
    qat = qdq.qat.prepare(prepared).train()
    out.update(common.forward_and_step_ratios(
        prepared, qat, model, data[0], dev, r, args.compile, eager_too=not args.only_compiled))  # fmt: skip
    return out


def peers(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """ModelOpt's figures from the peer environment, or none and why."""
    py = Path(args.peer_python)
    if not py.is_file():
        return {}, f"no peer environment at {py} (benchmarks/README.md, GPU cost)"
    cmd = [str(py), str(HERE / "peers" / "gpu_peers.py"), "--models", *args.models,
           "--batch", str(args.batch), "--batches", str(args.batches), "--size", str(args.size),
           "--device", args.device, "--repeats", str(args.repeats), "--warmup", str(args.warmup)]  # fmt: skip
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if not args.compile:
        cmd.append("--no-compile")
    if args.only_compiled:
        cmd.append("--only-compiled")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # not qdq's src/
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        return {}, f"peer run failed (exit {done.returncode}): {done.stderr.strip()[-300:]}"
    result = json.loads(lines[-1])
    return result["models"], f"ModelOpt {result['version']}"


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def table(ours: dict[str, dict[str, Any]], theirs: dict[str, dict[str, Any]]) -> str:
    models = list(ours)
    head = "| | " + " | ".join(f"{m}: qdq | {m}: ModelOpt" for m in models) + " |"
    rule = "|---|" + "---|---|" * len(models)
    rows = [head, rule]
    for key, label in common.FIGURES:
        cells = []
        for m in models:
            cells += [_fmt(ours[m].get(key)), _fmt(theirs.get(m, {}).get(key))]
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> None:
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if cuda else "cpu")
    p.add_argument("--models", nargs="+", help=f"torchvision names (GPU: {' '.join(GPU_MODELS)}; "
                   "CPU: resnet18)")  # fmt: skip
    p.add_argument("--batch", type=int, help="images per batch (GPU 64, CPU 8)")
    p.add_argument("--batches", type=int, help="calibration batches (GPU 8, CPU 4)")
    p.add_argument("--size", type=int, default=224, help="image side (224)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per figure (median)")
    p.add_argument("--warmup", type=int, default=2, help="untimed runs first")
    p.add_argument("--threads", type=int, help="torch threads (CPU)")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="skip torch.compile")
    p.add_argument("--only-compiled", action="store_true", help="only the torch.compile figures")
    p.add_argument("--peer-python", default="/tmp/peers/bin/python", help="ModelOpt's python")
    p.add_argument("--no-peers", action="store_true", help="qdq only")
    args = p.parse_args()
    on_gpu = torch.device(args.device).type == "cuda"
    args.models = args.models or list(GPU_MODELS if on_gpu else ("resnet18",))
    args.batch = args.batch or (64 if on_gpu else 8)
    args.batches = args.batches or (8 if on_gpu else 4)
    if args.threads:
        torch.set_num_threads(args.threads)
    where = (
        torch.cuda.get_device_name(args.device)
        if on_gpu
        else f"CPU, {torch.get_num_threads()} threads"
    )
    fused = qdq.kernels.usable(torch.zeros(8, device=args.device))
    where += f" · fused kernels {'on' if fused else 'off'}"
    ours = {}
    for name in args.models:
        ours[name] = measure(name, args)
        print(f"{name}: {json.dumps(ours[name])}", file=sys.stderr, flush=True)
    theirs, peer = ({}, "peers skipped") if args.no_peers else peers(args)
    print(f"{date.today()} · {where} · torch {torch.__version__} · qdq {qdq.__version__} · {peer}")
    print(f"{args.batches} batches of {args.batch} × 3×{args.size}×{args.size}; median of "
          f"{args.repeats} after {args.warmup} warm-up; ratios to the float model's figure")  # fmt: skip
    print(table(ours, theirs))


if __name__ == "__main__":
    main()
