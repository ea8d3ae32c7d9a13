"""The standard QAT schedule as an optimizer + scheduler factory.

pytorch-quantization's user guide and ModelOpt recommend: fine-tune for about 10 % of the original
training epochs, starting from 1 % of the original initial learning rate, with cosine decay down to
1 % of that, and keep the calibrated scales frozen. :func:`recipe` builds exactly that for a model
prepared by :func:`qdq.qat.prepare`; learned amax (if any) goes in its own parameter group without
weight decay.

Example:
    >>> import torch
    >>> net = torch.nn.Linear(4, 2)
    >>> opt, sched, plan = recipe(net, original_epochs=90, original_lr=0.1, steps_per_epoch=100)
    >>> plan.epochs, plan.lr, plan.total_steps
    (9, 0.001, 900)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from qdq.qat.prepare import qat_state
from qdq.quant import Quantizer

__all__ = ["OPTIMIZERS", "Recipe", "parameter_groups", "recipe"]

OPTIMIZERS = ("sgd", "adam", "adamw")


@dataclass(frozen=True)
class Recipe:
    """The schedule :func:`recipe` built (plain data; recorded in the manifest).

    Attributes:
        epochs: fine-tuning epochs (``max(1, round(epoch_fraction · original_epochs))``).
        lr: the starting learning rate (``lr_fraction · original_lr``).
        final_lr: the last step's learning rate (``final_fraction · lr``).
        steps_per_epoch, total_steps: the cosine schedule's length.
        optimizer, momentum, weight_decay: the optimizer's settings.
    """

    epochs: int
    lr: float
    final_lr: float
    steps_per_epoch: int
    total_steps: int
    optimizer: str
    momentum: float
    weight_decay: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return dataclasses.asdict(self)


def parameter_groups(model: nn.Module, weight_decay: float = 0.0) -> list[dict[str, Any]]:
    """The model's trainable parameters in two groups: the rest (with ``weight_decay``) and
    learned amax (without: decaying a clipping range only shrinks it)."""
    amax_ids = {
        id(q._parameters["amax"])
        for q in model.modules()
        if isinstance(q, Quantizer) and q._parameters.get("amax") is not None
    }
    rest: list[nn.Parameter] = []
    amax: list[nn.Parameter] = []
    for p in model.parameters():
        if p.requires_grad:
            (amax if id(p) in amax_ids else rest).append(p)
    groups: list[dict[str, Any]] = [{"params": rest, "weight_decay": weight_decay}]
    if amax:
        groups.append({"params": amax, "weight_decay": 0.0})
    return groups


def recipe(
    model: nn.Module,
    *,
    original_epochs: int,
    original_lr: float,
    steps_per_epoch: int,
    optimizer: str = "sgd",
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    epoch_fraction: float = 0.1,
    lr_fraction: float = 0.01,
    final_fraction: float = 0.01,
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler, Recipe]:
    """Build the standard QAT optimizer and per-step cosine scheduler.

    Args:
        model: the model to train (usually from :func:`qdq.qat.prepare`).
        original_epochs: epochs of the float model's original training.
        original_lr: its initial learning rate.
        steps_per_epoch: optimizer steps per epoch (``len(train_loader)``).
        optimizer: ``"sgd"`` (with ``momentum``), ``"adam"`` or ``"adamw"``.
        momentum: SGD momentum.
        weight_decay: for every parameter except learned amax.
        epoch_fraction, lr_fraction, final_fraction: the recipe's three numbers (0.1, 0.01, 0.01).

    Returns:
        ``(optimizer, scheduler, plan)``: call ``scheduler.step()`` after every optimizer step,
        for ``plan.total_steps`` steps.

    Raises:
        ValueError: a non-positive count or rate, a fraction outside (0, 1], an unknown optimizer.
    """
    for name, value in (("original_epochs", original_epochs), ("steps_per_epoch", steps_per_epoch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if not (
        isinstance(original_lr, (int, float)) and math.isfinite(original_lr) and original_lr > 0
    ):
        raise ValueError(f"original_lr must be a positive number, got {original_lr!r}")
    for name, frac in (
        ("epoch_fraction", epoch_fraction),
        ("lr_fraction", lr_fraction),
        ("final_fraction", final_fraction),
    ):
        if not 0.0 < float(frac) <= 1.0:
            raise ValueError(f"{name} must be in (0, 1], got {frac!r}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    if weight_decay < 0 or momentum < 0:
        raise ValueError("weight_decay and momentum must be >= 0")
    epochs = max(1, round(epoch_fraction * original_epochs))
    lr = float(original_lr) * lr_fraction
    final_lr = lr * final_fraction
    total = epochs * steps_per_epoch
    groups = parameter_groups(model, weight_decay)
    opt: torch.optim.Optimizer
    if optimizer == "sgd":
        opt = torch.optim.SGD(groups, lr=lr, momentum=momentum)
    elif optimizer == "adam":
        opt = torch.optim.Adam(groups, lr=lr)
    else:
        opt = torch.optim.AdamW(groups, lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total, eta_min=final_lr)
    plan = Recipe(
        epochs=epochs,
        lr=lr,
        final_lr=final_lr,
        steps_per_epoch=steps_per_epoch,
        total_steps=total,
        optimizer=optimizer,
        momentum=float(momentum) if optimizer == "sgd" else 0.0,
        weight_decay=float(weight_decay),
    )
    state = qat_state(model)
    if state is not None:
        state.recipe = plan.to_dict()
    return opt, sched, plan
