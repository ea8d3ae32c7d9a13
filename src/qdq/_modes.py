"""Run a model for inference: eval mode and no autograd, its training flag restored after."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

__all__ = ["eval_no_grad"]


@contextlib.contextmanager
def eval_no_grad(model: nn.Module) -> Iterator[None]:
    """``model.eval()`` and ``torch.no_grad()`` inside; ``model``'s training flag restored on exit."""
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)
