"""One training epoch on Fashion-MNIST, QAT or float, for a whole-process timing comparison.

``--mode qat``: the calibrated model from :func:`qdq.qat.prepare` (amax frozen, BatchNorm frozen);
``--mode float``: the float model with BatchNorm frozen the same way. Both train ``--batches``
batches of 64 training images with cross-entropy and Adam, one thread. Time the two as whole
processes side by side (e.g. ``/usr/bin/time -v``, alternating runs) and quote the ratio; the set-up
(imports, data, prepare and calibration) is the same in both except qdq's prepare + calibrate,
which ``--setup-only`` times alone.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/qat_epoch.py --mode qat|float [--batches 100]``.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

import qdq
from qdq.zoo import fashion_mnist as fm


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("qat", "float"), required=True)
    p.add_argument("--batches", type=int, default=100)
    p.add_argument("--setup-only", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = fm.load_pretrained()
    images, labels = fm.load_split("train")
    train = [(images[i : i + 64], labels[i : i + 64]) for i in range(0, 64 * args.batches, 64)]
    calib = fm.calibration_batches(8, 32)
    prepared = qdq.prepare(model, (calib[0][:1],))
    qdq.calibrate(prepared, calib, show_progress=False)
    if args.mode == "qat":
        net = qdq.qat.prepare(prepared)
    else:
        net = model.train()
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.register_forward_pre_hook(lambda mod, a: setattr(mod, "training", False))
    if args.setup_only:
        return 0
    opt = torch.optim.Adam(net.parameters(), lr=1e-5)
    start = time.perf_counter()
    for x, y in train:
        loss = F.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"{args.mode}: {args.batches} steps in {time.perf_counter() - start:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
