"""Worker of tests/test_qat_torchrun.py: calibrate, QAT-fine-tune, save what each rank holds.

Run as ``python qat_torchrun_worker.py OUT [--kill-at N] [--ckpt DIR]`` (one process) or under
``torchrun --nproc_per_node=2`` (gloo on CPU). Every rank calibrates on its own share of the
calibration batches (rank r takes batches r, r+world, ...) and fine-tunes on the same global
batches, each rank taking its slice (qdq.qat.finetune's default).
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import qdq


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.conv2(y)) + y
        return self.fc(y.mean(dim=(2, 3)))


def _direct_calibrators(rank: int, world: int) -> dict[str, torch.Tensor]:
    """Per-channel max and a histogram that only rank 0 feeds, synchronised directly."""
    g = torch.Generator().manual_seed(7)
    shares = [torch.randn(5, 6, generator=g) * (1 + r) for r in range(2)]
    per_channel = qdq.MaxCalibrator(axis=1)
    hist = qdq.HistogramCalibrator()
    for r, share in enumerate(shares):
        if r % world == rank:
            per_channel.collect(share)
        if r == 0 and rank == 0:
            hist.collect(share * 3)
    per_channel.sync()
    hist.sync()
    return {"direct:max_axis1": per_channel.compute_amax(),
            "direct:hist_entropy": hist.compute_amax("entropy"),
            "direct:hist_batches": torch.tensor(hist.num_batches)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--kill-at", type=int, default=None)
    parser.add_argument("--ckpt", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank() if world > 1 else 0
    torch.manual_seed(0)
    net = Net().eval()
    g = torch.Generator().manual_seed(1)
    calib = [torch.randn(8, 3, 8, 8, generator=g) * (1 + i) for i in range(4)]
    train = [(torch.randn(8, 3, 8, 8, generator=g), torch.randint(0, 16, (8,), generator=g))
             for _ in range(5)]  # fmt: skip
    prepared = qdq.prepare(net, (calib[0][:1],))
    qdq.calibrate(prepared, calib[rank::world], method="entropy", show_progress=False)
    amax = {n: q.amax.detach().clone() for n, q in qdq.quantizers_of(prepared).items()}
    amax.update(_direct_calibrators(rank, world))
    qat = qdq.qat.prepare(prepared, learn_amax="lsq")

    def on_step(step: int, loss: float) -> None:
        if args.kill_at is not None and step == args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # as a scheduler's kill: no cleanup at all

    result = qdq.qat.finetune(
        qat,
        train,
        lambda out, batch: F.cross_entropy(out, batch[1]),
        epochs=2,
        lr=1e-2,
        checkpoint_dir=args.ckpt,
        checkpoint_every=2,
        show_progress=False,
        on_step=on_step,
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "calibrated_amax": amax,
            "losses": torch.tensor(result.losses, dtype=torch.float64),
            "resumed_from": -1 if result.resumed_from is None else result.resumed_from,
            "state": {k: v.detach().clone() for k, v in qat.state_dict().items()},
        },
        out / f"rank{rank}.pt",
    )
    if world > 1:
        # both ranks reach teardown together: a rank destroying its group while the other still
        # talks to it can make gloo's connection threads abort the other (seen once under load:
        # "terminate called without an active exception", SIGABRT)
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
