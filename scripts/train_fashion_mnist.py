"""Train the built-in Fashion-MNIST ResNetish and save its state_dict (reproducibly, on the CPU).

Usage:
    python scripts/train_fashion_mnist.py [--epochs 5] [--out PATH] [--seed 0] [--threads 2]

SGD (momentum 0.9, Nesterov, weight decay 5e-4) under a one-cycle schedule peaking at lr 0.1,
batch 128, random horizontal flips. Prints the loss and test accuracy after every epoch and writes
the checkpoint atomically (temp file in the same directory, then ``os.replace``). The default
output is the checkpoint that ``qdq.zoo.fashion_mnist.load_pretrained`` loads.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from qdq.zoo.fashion_mnist import DEFAULT_WEIGHTS, ResNetish, evaluate, load_split

BATCH_SIZE = 128
MAX_LR = 0.1
MOMENTUM = 0.9
WEIGHT_DECAY = 5e-4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5, help="training epochs (default 5)")
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_WEIGHTS, help=f"checkpoint (default {DEFAULT_WEIGHTS})"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    args = parser.parse_args(argv)
    if args.epochs <= 0:
        parser.error(f"--epochs must be positive, got {args.epochs}")
    if args.threads <= 0:
        parser.error(f"--threads must be positive, got {args.threads}")
    return args


def save_atomically(state: dict[str, torch.Tensor], out: Path) -> None:
    """Write ``state`` to ``out`` via a temp file in the same directory and ``os.replace``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the usual file mode
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)

    train_x, train_y = load_split("train")
    test_x, test_y = load_split("test")
    model = ResNetish()
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=MAX_LR,
        momentum=MOMENTUM,
        nesterov=True,
        weight_decay=WEIGHT_DECAY,
    )
    steps_per_epoch = (train_x.shape[0] + BATCH_SIZE - 1) // BATCH_SIZE
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=MAX_LR, epochs=args.epochs, steps_per_epoch=steps_per_epoch
    )

    start = time.perf_counter()
    accuracy = 0.0
    for epoch in range(1, args.epochs + 1):
        model.train()
        order = torch.randperm(train_x.shape[0])
        total_loss, seen = 0.0, 0
        for index in order.split(BATCH_SIZE):
            x, y = train_x[index], train_y[index]
            flip = torch.rand(x.shape[0]) < 0.5
            x = torch.where(flip[:, None, None, None], x.flip(3), x)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            total_loss += loss.item() * x.shape[0]
            seen += x.shape[0]
        accuracy = evaluate(model, test_x, test_y)
        print(
            f"epoch {epoch}/{args.epochs}  loss {total_loss / seen:.4f}  "
            f"test acc {accuracy:.4f}  ({time.perf_counter() - start:.0f}s)",
            flush=True,
        )

    save_atomically(model.state_dict(), args.out)
    size_kib = args.out.stat().st_size / 1024
    print(f"saved {args.out} ({size_kib:.1f} KiB), final test accuracy {accuracy:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
