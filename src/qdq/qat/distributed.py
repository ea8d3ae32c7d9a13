"""``torch.distributed`` helpers: synchronised calibration and the DDP plumbing of
:func:`qdq.qat.finetune`. Every function is a no-op (or the identity) in a single process.

Under ``torchrun`` each rank calibrates on its own share of the data; :func:`sync_calibration`
(called by :func:`qdq.calibrate` itself) all-reduces the statistics so that every rank computes
identical amax, bit for bit, equal to a single process's on the union of the batches: max
calibrators take the element-wise max, histograms (whose power-of-two grid makes merging exact)
add their int64 counts. See ``docs/distributed.md``.

:func:`process_group` is what ``qdq quantize`` / ``qdq qat`` do when ``torchrun`` launched them
(``WORLD_SIZE`` > 1) and no group is initialised yet: nccl with each rank on ``cuda:LOCAL_RANK``
when the job runs on CUDA, gloo on the CPU; the group is destroyed when the job ends.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from qdq.calib.base import distributed_active
from qdq.quant import quantizers_of

__all__ = [
    "active",
    "barrier",
    "is_main_process",
    "launch_plan",
    "mean_over_ranks",
    "process_group",
    "rank",
    "shard_batch",
    "world_size",
    "wrap_ddp",
]


def active() -> bool:
    """``torch.distributed`` is initialised with more than one process."""
    return distributed_active()


def world_size() -> int:
    """The number of processes (1 when not distributed)."""
    return torch.distributed.get_world_size() if active() else 1


def rank() -> int:
    """This process's rank (0 when not distributed)."""
    return torch.distributed.get_rank() if active() else 0


def is_main_process() -> bool:
    """Rank 0: the one that writes files."""
    return rank() == 0


def barrier() -> None:
    """Wait for every rank."""
    if active():
        torch.distributed.barrier()


def sync_calibration(prepared: nn.Module, group: object = None) -> None:
    """All-reduce the calibration statistics of every activation quantizer of ``prepared``.

    Every rank must call it (it is a collective), after collecting and before computing amax;
    :func:`qdq.calibrate` does. Quantizers are visited in module-path order on every rank.
    """
    if not distributed_active(group):
        return
    for _, q in sorted(quantizers_of(prepared).items()):
        if not q.name.endswith(":weight"):
            q.calibrator.sync(group)


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


def launch_plan(
    device: torch.device, env: Mapping[str, str] | None = None
) -> tuple[str, torch.device] | None:
    """``(backend, this rank's device)`` when ``torchrun`` launched this process with more than
    one rank (``WORLD_SIZE`` > 1 in ``env``, default ``os.environ``), else ``None``.

    On CUDA: nccl, the rank on ``cuda:LOCAL_RANK``; on the CPU: gloo.

    Raises:
        ValueError: an explicit GPU other than ``cuda:LOCAL_RANK`` (two ranks would share it),
            or a ``WORLD_SIZE`` / ``LOCAL_RANK`` that is not a number.

    Example:
        >>> launch_plan(torch.device("cuda"), {"WORLD_SIZE": "2", "LOCAL_RANK": "1"})
        ('nccl', device(type='cuda', index=1))
        >>> launch_plan(torch.device("cpu"), {"WORLD_SIZE": "2", "LOCAL_RANK": "1"})
        ('gloo', device(type='cpu'))
        >>> launch_plan(torch.device("cpu"), {}) is None
        True
    """
    env = os.environ if env is None else env
    world = _env_int(env, "WORLD_SIZE", 1)
    if world <= 1:
        return None
    if device.type != "cuda":
        return "gloo", torch.device("cpu")
    local = _env_int(env, "LOCAL_RANK", 0)
    if device.index is not None and device.index != local:
        raise ValueError(
            f"under torchrun each rank runs on cuda:LOCAL_RANK, but this rank (LOCAL_RANK "
            f"{local}) was given {device}; pass --device cuda (device='cuda')"
        )
    return "nccl", torch.device("cuda", local)


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not a number") from None


@contextlib.contextmanager
def process_group(device: torch.device) -> Iterator[torch.device]:
    """Initialise the process group when ``torchrun`` launched this process and none is yet;
    yield this rank's device (``device`` itself otherwise); destroy the group it created at exit.

    nccl on CUDA (``torch.cuda.set_device(cuda:LOCAL_RANK)`` first), gloo on the CPU
    (:func:`launch_plan`). A group the caller initialised is used as it is and left alone.
    """
    plan = launch_plan(device)
    d = torch.distributed
    if plan is None or (d.is_available() and d.is_initialized()):
        yield device if plan is None else plan[1]
        return
    backend, rank_device = plan
    if not d.is_available():
        raise RuntimeError("WORLD_SIZE > 1 (torchrun), but this torch has no torch.distributed")
    if rank_device.type == "cuda":
        torch.cuda.set_device(rank_device)
    d.init_process_group(backend)
    try:
        yield rank_device
    finally:
        d.destroy_process_group()
