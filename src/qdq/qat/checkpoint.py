"""Atomic QAT checkpoints: everything needed to continue at the same step with the same losses.

A checkpoint holds the model's ``state_dict`` (weights, amax, learned amax), the optimizer's and
scheduler's state, the step and epoch counters, the position inside the epoch, the losses so far,
the torch random state and the settings it was written under. It is written to a temporary file
beside the target and renamed, so a run killed while writing leaves the previous checkpoint whole.
It is read back with ``torch.load(..., weights_only=True)``: no pickled code runs.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch

from qdq._io import atomic_write_bytes

__all__ = ["CHECKPOINT_NAME", "CheckpointError", "load_checkpoint", "save_checkpoint"]

#: the file :func:`qdq.qat.finetune` keeps in its ``checkpoint_dir``
CHECKPOINT_NAME = "qat-last.pt"
_FORMAT = "qdq-qat-checkpoint/1"


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed (unreadable, another format, other settings)."""


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` (tensors, numbers, strings, lists, dicts) to ``path`` atomically."""
    buffer = io.BytesIO()
    torch.save({"format": _FORMAT, **state}, buffer)
    return atomic_write_bytes(path, buffer.getvalue())


def load_checkpoint(path: str | Path, *, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (safely: ``weights_only=True``).

    Args:
        path: the file.
        settings: when given, the checkpoint's ``"settings"`` must equal it (a resumed run with
            other epochs, batch counts or seeds would not continue the same curve).

    Raises:
        CheckpointError: unreadable, not a qdq QAT checkpoint, or other settings.
    """
    p = Path(path)
    try:
        state = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as err:
        raise CheckpointError(
            f"{p}: not a readable checkpoint ({type(err).__name__}: {err})"
        ) from None
    if not isinstance(state, dict) or state.get("format") != _FORMAT:
        raise CheckpointError(f"{p}: not a qdq QAT checkpoint (expected format {_FORMAT!r})")
    if settings is not None and state.get("settings") != settings:
        saved = state.get("settings") or {}
        diff = sorted(k for k in set(saved) | set(settings) if saved.get(k) != settings.get(k))
        raise CheckpointError(
            f"{p} was written with other settings ({', '.join(diff)}: "
            + "; ".join(f"{k}={saved.get(k)!r} → {settings.get(k)!r}" for k in diff[:4])
            + "); resume with the same settings, or pass resume=False to start over"
        )
    return state
