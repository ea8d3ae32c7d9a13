"""QAT under ``torchrun --nproc_per_node=2`` on CPU (gloo): identical amax on both ranks, the same
result as one process on the same global batches, and kill + resume at the same step."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("qat_torchrun_worker.py")
SRC = Path(__file__).resolve().parents[1] / "src"

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="torch.distributed with gloo is needed",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(out: Path, *extra: str, procs: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        p for p in (str(SRC), os.environ.get("PYTHONPATH", "")) if p)}  # fmt: skip
    if procs == 1:
        cmd = [sys.executable, str(WORKER), str(out), *extra]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={procs}",
               "--master_addr=127.0.0.1", f"--master_port={_free_port()}",
               str(WORKER), str(out), *extra]  # fmt: skip
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def _load(path: Path) -> dict:
    return torch.load(path, weights_only=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("torchrun")
    single = _run(root / "single", procs=1)
    assert single.returncode == 0, single.stderr[-3000:]
    double = _run(root / "double", procs=2)
    assert double.returncode == 0, double.stderr[-3000:]
    return {"root": root, "single": root / "single", "double": root / "double"}


def test_both_ranks_hold_identical_amax_equal_to_one_process(runs: dict[str, Path]) -> None:
    one = _load(runs["single"] / "rank0.pt")
    r0, r1 = (_load(runs["double"] / f"rank{r}.pt") for r in (0, 1))
    for name, value in one["calibrated_amax"].items():
        assert torch.equal(r0["calibrated_amax"][name], r1["calibrated_amax"][name]), name
        assert torch.equal(r0["calibrated_amax"][name], value), name  # the union, bit for bit
    for key, value in r0["state"].items():  # DDP keeps the ranks in step
        assert torch.equal(value, r1["state"][key]), key


def test_two_processes_compute_what_one_computes(runs: dict[str, Path]) -> None:
    one = _load(runs["single"] / "rank0.pt")
    two = _load(runs["double"] / "rank0.pt")
    assert len(one["losses"]) == len(two["losses"]) == 10
    torch.testing.assert_close(two["losses"], one["losses"], rtol=1e-4, atol=1e-5)
    for key, value in one["state"].items():
        if value.is_floating_point():
            torch.testing.assert_close(two["state"][key], value, rtol=1e-3, atol=1e-4)


def test_killed_run_resumes_at_the_same_step(runs: dict[str, Path]) -> None:
    out, ckpt = runs["root"] / "killed", runs["root"] / "ckpt"
    killed = _run(out, "--kill-at", "5", "--ckpt", str(ckpt), procs=2)
    assert killed.returncode != 0
    assert (ckpt / "qat-last.pt").is_file() and not (out / "rank0.pt").exists()
    resumed = _run(out, "--ckpt", str(ckpt), procs=2)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    full = _load(runs["double"] / "rank0.pt")
    for rank in (0, 1):
        again = _load(out / f"rank{rank}.pt")
        assert again["resumed_from"] == 4  # the checkpoint of step 4, mid-epoch 1
        torch.testing.assert_close(again["losses"], full["losses"], rtol=1e-6, atol=1e-7)
        for key, value in full["state"].items():
            torch.testing.assert_close(again["state"][key], value, rtol=1e-5, atol=1e-6)


def test_sync_is_a_no_op_in_one_process() -> None:
    import qdq

    cal = qdq.HistogramCalibrator()
    cal.collect(torch.linspace(-2, 2, 101))
    before = cal.compute_amax("mse")
    cal.sync()
    assert cal.num_batches == 1 and torch.equal(cal.compute_amax("mse"), before)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3))
    m = qdq.prepare(net, (torch.randn(1, 3, 8, 8),))
    qdq.qat.distributed.sync_calibration(m)  # nothing collected, nothing initialised: fine
    assert qdq.qat.distributed.world_size() == 1 and qdq.qat.distributed.is_main_process()
