"""DistributedDataParallel plumbing of :func:`qdq.qat.finetune` (no-ops in a single process)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = [
    "active",
    "barrier",
    "is_main_process",
    "mean_over_ranks",
    "shard_batch",
    "world_size",
    "wrap_ddp",
]


def active() -> bool:
    """``torch.distributed`` is initialised with more than one process."""
    d = torch.distributed
    return bool(d.is_available() and d.is_initialized() and d.get_world_size() > 1)


def world_size() -> int:
    return torch.distributed.get_world_size() if active() else 1


def rank() -> int:
    return torch.distributed.get_rank() if active() else 0


def is_main_process() -> bool:
    return rank() == 0


def barrier() -> None:
    if active():
        torch.distributed.barrier()


def wrap_ddp(model: nn.Module) -> nn.Module:
    """``model`` wrapped in DistributedDataParallel when distributed (on its GPU with nccl),
    else ``model`` itself. Gradients are averaged over ranks; buffers (amax, BatchNorm
    statistics) are broadcast from rank 0 at every forward."""
    if not active():
        return model
    from torch.nn.parallel import DistributedDataParallel

    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    ids = [device.index] if device.type == "cuda" and device.index is not None else None
    return DistributedDataParallel(model, device_ids=ids)


def shard_batch(batch: Any) -> Any:
    """This rank's slice (along dim 0) of every tensor of a global batch; other values as they are.

    Raises:
        ValueError: a tensor with fewer rows than there are ranks.
    """
    if not active():
        return batch
    n, r = world_size(), rank()

    def cut(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            if value.shape[0] < n:
                raise ValueError(
                    f"a batch of {value.shape[0]} rows cannot be split over {n} ranks; use "
                    "batches of at least one row per rank, or shard=False with per-rank data"
                )
            return torch.tensor_split(value, n)[r]
        if isinstance(value, dict):
            return {k: cut(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
            return type(value)(cut(v) for v in value)
        return value

    return cut(batch)


def mean_over_ranks(value: torch.Tensor) -> float:
    """The mean of a scalar over ranks (the value itself in a single process)."""
    if not active():
        return float(value)
    t = value.detach().to(torch.float64).reshape(1).clone()
    if torch.distributed.get_backend() == "nccl":
        t = t.cuda()
    torch.distributed.all_reduce(t)
    return float(t.item()) / world_size()
