"""QAT under ``torchrun --nproc_per_node=2`` (gloo, CPU) vs one process on the same global batches.

Runs the worker of ``tests/test_qat_torchrun.py`` (calibrate with entropy on each rank's share of
the batches, all-reduce the histograms, LSQ QAT for 10 steps, every rank on its slice of the same
global batches) once with one process and once with two, then prints: whether every amax is
identical bit for bit across ranks and against one process, the largest difference of the loss
curve and of the trained parameters, and each run's wall time as a whole process.

Run: ``.venv/bin/python benchmarks/qat_distributed.py``. Prints figures; asserts nothing.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "qat_torchrun_worker.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(out: Path, procs: int) -> float:
    """Run the worker with ``procs`` processes; return its wall time in seconds."""
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    if procs == 1:
        cmd = [sys.executable, str(WORKER), str(out)]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={procs}",
               "--master_addr=127.0.0.1", f"--master_port={_free_port()}", str(WORKER), str(out)]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{procs}-process run failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, float, str]:
    """Largest absolute difference, the largest relative one (to the tensor's own max), and where."""
    worst = (0.0, 0.0, "")
    for k, v in a.items():
        if v.is_floating_point() and v.numel():
            diff = float((v.double() - b[k].double()).abs().max())
            rel = diff / max(float(v.double().abs().max()), 1e-12)
            worst = max(worst, (diff, rel, k))
    return worst


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        t1 = run(Path(tmp) / "one", 1)
        t2 = run(Path(tmp) / "two", 2)
        one = torch.load(Path(tmp) / "one" / "rank0.pt", weights_only=True)
        r0, r1 = (torch.load(Path(tmp) / "two" / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    amax = one["calibrated_amax"]
    same_ranks = all(torch.equal(r0["calibrated_amax"][k], r1["calibrated_amax"][k]) for k in amax)
    same_one = all(torch.equal(r0["calibrated_amax"][k], amax[k]) for k in amax)
    losses_1, losses_2 = one["losses"], r0["losses"]
    print(f"amax tensors compared: {len(amax)}")
    print(f"  rank 0 == rank 1, bit for bit:        {same_ranks}")
    print(f"  two processes == one process, bits:   {same_one}")
    print(f"QAT steps: {len(losses_1)} (one process) / {len(losses_2)} (two)")
    print(f"  loss, one process:  {' '.join(f'{v:.5f}' for v in losses_1.tolist())}")
    print(f"  loss, two processes:{' '.join(f'{v:.5f}' for v in losses_2.tolist())}")
    print(f"  max |loss difference|:            {float((losses_1 - losses_2).abs().max()):.3g}")
    diff, rel, where = _max_diff(one["state"], r0["state"])
    print(
        f"  max |parameter difference| after: {diff:.3g} ({rel:.2g} of that tensor's max, {where})"
    )
    print(f"  ranks' parameters identical:      "
          f"{all(torch.equal(r0['state'][k], r1['state'][k]) for k in r0['state'])}")  # fmt: skip
    print(f"wall time as whole processes: one {t1:.1f} s, two {t2:.1f} s (start-up included)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
