"""PTQ vs QAT on the zoo, every figure measured through the export in ONNX Runtime.

For each model, on its own calibration and evaluation data, at full INT8 coverage
(``QuantConfig.tensorrt(disable=("performance",))``):

* PTQ: mse calibration (the default), exported, measured in ONNX Runtime (``ORT_ENABLE_BASIC``);
* QAT: :func:`qdq.qat.prepare` on that PTQ model, :func:`qdq.qat.finetune` by distillation
  against the FP32 copy on the calibration samples (no labels: the "calibration-style data"),
  amax frozen and amax learned (LSQ), exported and measured the same way;
* wall time per QAT epoch vs one epoch of the float model trained by the same loop (same
  batches, same Distiller loss, same optimizer), as a ratio within this run.

``--train-samples N`` fine-tunes on N samples drawn like the calibration samples (the zoo dataset
loaded with ``calib_samples=N``: Fashion-MNIST training images, crops from the calibration half of
EfficientNet's photos) instead of the calibration samples themselves; calibration and evaluation
are unchanged (evaluation stays disjoint from both).

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/qat.py [--models a,b] [--epochs N] [--lr X]
[--train-samples N]``.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import qdq
from ptq import FULL, Bench, _figures, log, quiet
from qdq.pipeline.data import DataOptions, resolve_data
from qdq.pipeline.evaluate import batches

MODELS = ("fashion-mnist-resnet", "efficientnet-lite0")


def train_batches(b: Bench, samples: int | None) -> list[torch.Tensor]:
    """The calibration batches, or ``samples`` samples drawn like them (see the module doc)."""
    if not samples:
        return b.calib
    data = resolve_data(None, b.source.zoo, DataOptions(calib_samples=samples))
    return [x for x, _ in batches(data.calibration, b.size, b.static)]


def float_epoch_seconds(
    b: Bench, train: list[torch.Tensor], output: str, lr: float, epochs: int
) -> float:
    """Seconds per epoch of the float model over the QAT batches, trained like QAT
    trains (timed right before each QAT run, over as many epochs, so the ratio is fair)."""
    model = copy.deepcopy(b.source.module).train()
    for m in model.modules():  # the same frozen BatchNorm as qdq.qat.prepare's default
        if isinstance(m, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):
            m.register_forward_pre_hook(lambda mod, args: setattr(mod, "training", False))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    with qdq.qat.Distiller(model, output=output) as d:
        start = time.perf_counter()
        for _ in range(epochs):
            for x in train:
                loss = d.loss(model(x), x)
                opt.zero_grad()
                loss.backward()
                opt.step()
        return (time.perf_counter() - start) / epochs


def run_model(name: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    b = Bench(name, args.batch)
    output = "kl" if b.data.labels is not None or name == "efficientnet-lite0" else "mse"
    log(f"== {name}: FP32 {b.fp32['metric']:.4f}; {len(b.calib)} calibration batches")
    prepared = quiet(lambda: qdq.prepare(b.source.module, (b.example,), FULL))
    quiet(lambda: qdq.calibrate(prepared, b.calib, show_progress=False))
    train = train_batches(b, args.train_samples)
    log(f"  QAT trains on {sum(len(x) for x in train)} samples in {len(train)} batches")
    out: dict[str, Any] = {"model": name, "fp32": _figures(b.fp32), "train_samples": sum(
        len(x) for x in train)}  # fmt: skip
    out["ptq"] = _figures(b.through_export(prepared, tmp, "ptq"))
    log(f"  PTQ (mse)            {out['ptq']['metric']:.4f}  agree {out['ptq']['agreement']}  "
        f"cos {out['ptq']['cosine']:.5f}")  # fmt: skip
    variants = {"frozen": ("QAT frozen amax", None), "lsq": ("QAT LSQ amax", "lsq")}
    for key in args.variants.split(","):
        label, learn = variants[key]
        float_s = (
            float_epoch_seconds(b, train, output, args.lr, args.epochs) if args.timing else None
        )
        qat = quiet(lambda learn=learn: qdq.qat.prepare(prepared, learn_amax=learn))
        result = quiet(lambda qat=qat: qdq.qat.finetune(
            qat, train, epochs=args.epochs, lr=args.lr, distill_output=output,
            show_progress=False))  # fmt: skip
        got = _figures(b.through_export(qat, tmp, label.split()[-2]))
        per_epoch = result.seconds / args.epochs
        got.update(
            epochs=args.epochs,
            steps=result.steps,
            first_loss=result.losses[0],
            last_loss=result.losses[-1],
            seconds_per_epoch=round(per_epoch, 2),
            float_epoch_seconds=None if float_s is None else round(float_s, 2),
            x_float_epoch=None if float_s is None else round(per_epoch / float_s, 2),
        )
        ratio = "" if float_s is None else f" = {per_epoch / float_s:.2f}× float"
        out[label] = got
        log(f"  {label:<20} {got['metric']:.4f}  agree {got['agreement']}  cos "
            f"{got['cosine']:.5f}  loss {result.losses[0]:.4g} → {result.losses[-1]:.4g}  "
            f"{per_epoch:.1f} s/epoch{ratio}")  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--train-samples", type=int, default=None)
    p.add_argument("--variants", default="frozen,lsq", help="frozen, lsq or both (amax)")
    p.add_argument("--no-timing", dest="timing", action="store_false",
                   help="skip the float epochs the QAT epoch time is compared with")  # fmt: skip
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            results.append(run_model(name, args, Path(tmp)))
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
