"""Shared by the placement tests on model zoos (``test_zoo_placement.py``,
``test_detector_placement.py``): input size, the cosine bar, BatchNorm statistics for random
weights, and two intra-op threads."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

#: the INT8 output must follow the float output at least this closely (cosine)
COSINE_BAR = 0.99
BATCH, SIZE = 2, 64


@pytest.fixture(scope="module", autouse=True)
def two_threads() -> Iterator[None]:
    """Two intra-op threads (the CI machine has two cores); restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def bn_calibrated(model: nn.Module, shape: tuple[int, ...], passes: int = 4, seed: int = 1):
    """A copy of ``model`` whose BatchNorm running statistics match N(0, 1) input data.

    Resets every BN's running stats, sets ``momentum=None`` (cumulative average) and runs
    ``passes`` forward passes in train mode without gradients; returns the copy in eval mode.
    """
    m = copy.deepcopy(model)
    for mod in m.modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            mod.reset_running_stats()
            mod.momentum = None
    g = torch.Generator().manual_seed(seed)
    m.train()
    with torch.no_grad():
        for _ in range(passes):
            m(torch.randn(shape, generator=g))
    return m.eval()


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return F.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0).item()


def run_no_grad(model: nn.Module, x: torch.Tensor) -> Any:
    with torch.no_grad():
        return model(x)
