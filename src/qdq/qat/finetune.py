"""``qdq.qat.finetune``: quantization-aware fine-tuning for users without a training loop.

One call trains a model from :func:`qdq.qat.prepare` in place: with the user's task loss, with
distillation against its frozen FP32 copy (the default when no loss is given: no labels needed),
or both. It shows progress, writes an atomic checkpoint every ``checkpoint_every`` steps and, when
a checkpoint is there, continues from it at the same step with the same losses: the data order of
every epoch comes from ``seed + epoch`` and the random state is restored where it was saved.

Under ``torchrun`` (``torch.distributed`` initialised, world size > 1) the model is wrapped in
:class:`~torch.nn.parallel.DistributedDataParallel`; by default every rank iterates the same data
and takes its slice of each (global) batch, so two processes on batches of 16 compute what one
process computes on the same batches of 16. Only rank 0 writes checkpoints; the losses reported are
averaged over ranks. See ``docs/distributed.md``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from qdq._progress import progress
from qdq.calib.batches import batch_arguments, expected_inputs, run_batch
from qdq.qat import distributed as dist
from qdq.qat.checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from qdq.qat.distill import Distiller
from qdq.qat.prepare import qat_state
from qdq.qat.recipe import parameter_groups

__all__ = ["FinetuneResult", "finetune"]

_log = logging.getLogger("qdq")
#: ``loss_fn(outputs, batch)``: the task loss of one batch
LossFn = Callable[[Any, Any], torch.Tensor]


@dataclass
class FinetuneResult:
    """What :func:`finetune` did.

    Attributes:
        model: the trained model (the one passed in, trained in place).
        losses: the loss of every step from the first (a resumed run includes the steps done
            before the interruption), averaged over ranks.
        steps: optimizer steps done in total.
        epochs: epochs completed (fractional when ``max_steps`` stopped mid-epoch).
        resumed_from: the step the run continued from, or ``None``.
        checkpoint: the last checkpoint written, or ``None``.
        seconds: wall time of this call.
    """

    model: nn.Module
    losses: list[float]
    steps: int
    epochs: float
    resumed_from: int | None
    checkpoint: Path | None
    seconds: float


def finetune(
    model: nn.Module,
    train_data: Iterable[Any],
    loss_fn: LossFn | None = None,
    *,
    epochs: int = 1,
    lr: float = 1e-5,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    distill: bool | None = None,
    distill_output: str | None = "mse",
    distill_features: Sequence[str] | str = (),
    max_steps: int | None = None,
    grad_clip: float | None = None,
    checkpoint_dir: str | Path | None = None,
    checkpoint_every: int = 100,
    resume: bool = True,
    seed: int = 0,
    shard: bool = True,
    show_progress: bool = True,
    on_step: Callable[[int, float], None] | None = None,
) -> FinetuneResult:
    """Fine-tune a QAT model in place and return what was done.

    Args:
        model: from :func:`qdq.qat.prepare`.
        train_data: a DataLoader or any re-iterable of batches (tensor, ``(inputs..., labels)``
            tuple or dict, as :func:`qdq.calibrate` takes them).
        loss_fn: ``loss_fn(outputs, batch) -> loss``; ``None`` trains by distillation only.
        epochs: passes over ``train_data``.
        lr: learning rate of the default optimizer (Adam, cosine decay to 1 % over the run;
            the yolov7 QAT recipe's order of magnitude). Ignored when ``optimizer`` is given.
        optimizer, scheduler: your own (e.g. from :func:`qdq.qat.recipe`); the scheduler is
            stepped after every optimizer step.
        distill: add the distillation loss against the frozen FP32 copy (default: only when
            ``loss_fn`` is ``None``).
        distill_output, distill_features: the :class:`~qdq.qat.Distiller`'s ``output`` and
            ``features`` (``"quantized"``: every quantized Conv/Linear, the yolov7 recipe).
        max_steps: stop after this many optimizer steps in total.
        grad_clip: clip the gradient norm to this value.
        checkpoint_dir: where to keep ``qat-last.pt`` (written every ``checkpoint_every`` steps
            and at the end); ``None`` writes none.
        resume: continue from the checkpoint in ``checkpoint_dir`` when there is one.
        seed: the data order of epoch ``e`` is drawn after ``torch.manual_seed(seed + e)``.
        shard: under ``torchrun``, give each rank its slice of every batch (``False`` when your
            data is already split per rank, e.g. by a ``DistributedSampler``).
        show_progress: progress bars (rank 0 only).
        on_step: called as ``on_step(step, loss)`` after every step (on every rank).

    Raises:
        ValueError: not a QAT model, bad counts, a one-shot iterator with several epochs or a
            checkpoint, or a checkpoint written with other settings.
        RuntimeError: a non-finite loss (naming the step).
    """
    state = qat_state(model)
    if state is None:
        raise ValueError(
            f"{type(model).__name__} was not prepared for QAT: call qdq.qat.prepare(prepared) "
            "on a calibrated model first"
        )
    _check_counts(epochs=epochs, checkpoint_every=checkpoint_every, max_steps=max_steps)
    if isinstance(train_data, Iterator) and (epochs > 1 or checkpoint_dir is not None):
        raise ValueError(
            "train_data is a one-shot iterator; pass a list or a DataLoader so that each epoch "
            "(and a resumed run) can iterate it again"
        )
    if not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    use_distill = loss_fn is None if distill is None else distill
    if loss_fn is None and not use_distill:
        raise ValueError("nothing to train on: give loss_fn, or distill=True")
    started = time.perf_counter()
    n_batches = _len_or_none(train_data)
    per_epoch = n_batches
    own_optimizer = optimizer is None
    if optimizer is None:
        optimizer = torch.optim.Adam(parameter_groups(model), lr=lr)
        total = (n_batches * epochs) if n_batches else (max_steps or 1)
        if max_steps is not None:
            total = min(total, max_steps)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
            optimizer, T_max=max(1, total), eta_min=lr * 0.01
        )
    settings = {
        "epochs": epochs,
        "seed": seed,
        "batches_per_epoch": n_batches,
        "world_size": dist.world_size(),
        "max_steps": max_steps,
        "shard": shard,
    }
    ckpt = Path(checkpoint_dir) / CHECKPOINT_NAME if checkpoint_dir is not None else None
    step, epoch, in_epoch, losses, rng = 0, 0, 0, [], None
    resumed_from = None
    if ckpt is not None and resume and ckpt.exists():
        saved = load_checkpoint(ckpt, settings=settings)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        if scheduler is not None and saved.get("scheduler") is not None:
            scheduler.load_state_dict(saved["scheduler"])
        step, epoch, in_epoch = int(saved["step"]), int(saved["epoch"]), int(saved["in_epoch"])
        losses, rng = [float(v) for v in saved["losses"]], saved["rng"]
        resumed_from = step
        _log.info(
            "resuming QAT from %s at step %d (epoch %d, batch %d)", ckpt, step, epoch, in_epoch
        )
    expected = expected_inputs(model)
    net = dist.wrap_ddp(model)
    distiller = (
        Distiller(model, output=distill_output, features=distill_features) if use_distill else None
    )
    written: Path | None = None
    was_training = model.training
    model.train()
    stop = False

    def save(ep: int, pos: int) -> Path | None:
        if ckpt is None:
            return None
        if dist.is_main_process():
            save_checkpoint(
                ckpt,
                {
                    "settings": settings,
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict() if scheduler is not None else None,
                    "step": step,
                    "epoch": ep,
                    "in_epoch": pos,
                    "losses": losses,
                    "rng": torch.get_rng_state(),
                },
            )
        dist.barrier()
        return ckpt

    try:
        while epoch < epochs and not stop:
            torch.manual_seed(seed + epoch)  # the same data order in a resumed run
            skip = in_epoch
            batches = progress(
                enumerate(train_data),
                total=n_batches,
                desc=f"QAT epoch {epoch + 1}/{epochs}",
                enabled=show_progress and dist.is_main_process(),
            )
            for i, batch in batches:
                if i < skip:
                    continue
                if rng is not None:  # resumed: continue the random stream where it was saved
                    torch.set_rng_state(rng)
                    rng = None
                local = dist.shard_batch(batch) if shard else batch
                out = run_batch(net, local, step, expected)
                loss = _zero(out)
                if loss_fn is not None:
                    loss = loss + loss_fn(out, local)
                if distiller is not None:
                    args, kwargs = batch_arguments(local, step, expected)
                    loss = loss + distiller.loss(out, *args, **kwargs)
                if not bool(torch.isfinite(loss.detach())):
                    raise RuntimeError(
                        f"QAT step {step} (epoch {epoch + 1}, batch {i}): the loss is "
                        f"{float(loss.detach())}; lower the learning rate or check the data"
                    )
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if grad_clip is not None:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
                optimizer.step()
                if scheduler is not None:
                    scheduler.step()
                step += 1
                value = dist.mean_over_ranks(loss.detach())
                losses.append(value)
                in_epoch = i + 1
                if on_step is not None:
                    on_step(step, value)
                if step % checkpoint_every == 0:
                    written = save(epoch, in_epoch)
                if max_steps is not None and step >= max_steps:
                    stop = True
                    break
            if not stop:
                epoch, in_epoch = epoch + 1, 0
        written = save(epoch, in_epoch) or written
    finally:
        if distiller is not None:
            distiller.close()
        model.train(was_training)
    done = epoch + (in_epoch / per_epoch if per_epoch else 0.0)
    state.steps = step
    state.epochs = round(done, 4)
    if distiller is not None:
        state.distill = distiller.settings()
    if own_optimizer:
        state.recipe = {"optimizer": "adam", "lr": lr, "schedule": "cosine", "final_lr": lr * 0.01}
    elif state.recipe is None:
        state.recipe = {"optimizer": type(optimizer).__name__.lower()}
    return FinetuneResult(
        model=model,
        losses=losses,
        steps=step,
        epochs=state.epochs,
        resumed_from=resumed_from,
        checkpoint=written,
        seconds=time.perf_counter() - started,
    )


def _check_counts(*, epochs: int, checkpoint_every: int, max_steps: int | None) -> None:
    for name, value in (("epochs", epochs), ("checkpoint_every", checkpoint_every)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if max_steps is not None and (
        isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1
    ):
        raise ValueError(f"max_steps must be None or an int >= 1, got {max_steps!r}")


def _len_or_none(data: Any) -> int | None:
    with contextlib.suppress(TypeError):
        return len(data)
    return None


def _zero(out: Any) -> torch.Tensor:
    for t in _first_tensors(out):
        return t.new_zeros((), dtype=torch.float32)
    return torch.zeros(())


def _first_tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _first_tensors(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _first_tensors(v)
