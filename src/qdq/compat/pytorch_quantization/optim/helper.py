"""``pytorch_quantization.optim.helper``: pick parameters by name for QAT optimizers.

Patterns are regular expressions searched (``re.search``) in the names of
``model.named_parameters()``; e.g. ``["clip.clip_value"]`` selects the learned amax ranges and
``["weight$"]`` the weights, so they can get their own learning rate or be frozen.

Example:
    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    >>> groups = group_parameters(model, [["0\\\\."], ["1\\\\."]], lrs=[0.1, 0.01])
    >>> [len(list(g["params"])) for g in groups], [g["lr"] for g in groups]
    ([2, 2], [0.1, 0.01])
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["freeze_parameters", "group_parameters", "match_parameters", "quant_weight_inplace"]

_log = logging.getLogger(__name__)


def match_parameters(model: nn.Module, patterns: Sequence[str]) -> Iterator[nn.Parameter]:
    """Yield the parameters whose name matches any of ``patterns`` (a parameter matching several
    patterns is yielded once per match, as upstream).

    Args:
        model: the module whose ``named_parameters()`` are searched.
        patterns: regular expressions, searched anywhere in the name.
    """
    for name, param in model.named_parameters():
        for pattern in patterns:
            if re.search(pattern, name):
                yield param


def group_parameters(
    model: nn.Module,
    patterns_list: Sequence[list[str]],
    lrs: Sequence[float] | None = None,
    momentums: Sequence[float] | None = None,
    weight_decays: Sequence[float] | None = None,
) -> list[dict[str, Any]]:
    """Parameter groups for a torch optimizer, one per list of patterns.

    Args:
        model: the module.
        patterns_list: a list of lists of patterns; group ``i`` holds the parameters matching any
            pattern of ``patterns_list[i]`` (the lists should not overlap: not checked).
        lrs, momentums, weight_decays: per-group ``lr``/``momentum``/``weight_decay``, one per list.

    Returns:
        ``[{"params": <generator>, "lr": ..., ...}, ...]`` (``params`` is consumed once).

    Raises:
        TypeError: an entry of ``patterns_list`` that is not a list, or option lists of another
            length than ``patterns_list``.
    """
    groups: list[dict[str, Any]] = []
    for patterns in patterns_list:
        if not isinstance(patterns, list):
            raise TypeError("patterns_list must be list of list of patterns")
        groups.append({"params": match_parameters(model, patterns)})
    options = (("lr", "lrs", lrs), ("momentum", "momentums", momentums),
               ("weight_decay", "weight_decays", weight_decays))  # fmt: skip
    for key, arg_name, values in options:
        if values is None:
            continue
        if len(values) != len(patterns_list):
            raise TypeError(f"len({arg_name}) must match len(patterns_list)")
        for group, value in zip(groups, values, strict=True):
            group[key] = value
    return groups


def freeze_parameters(model: nn.Module, patterns: Sequence[str]) -> None:
    """Set ``requires_grad = False`` on the parameters whose name matches any of ``patterns``."""
    for name, param in model.named_parameters():
        if any(re.search(pattern, name) for pattern in patterns):
            _log.info("Freeze %s.", name)
            param.requires_grad = False


def quant_weight_inplace(model: nn.Module) -> None:
    """Replace the weight of every module with a weight quantizer by its quantized value.

    For relax-and-round style training; with a real (``fake_quant=False``) quantizer the weight
    becomes integer codes, which is only meant for inference (a warning is logged).
    """
    for name, module in model.named_modules():
        quantizer = getattr(module, "_weight_quantizer", None)
        if quantizer is None:
            continue
        if not quantizer.fake_quant:
            _log.warning(
                "In-place real quantization is VERY dangerous and should be used for inference "
                "only. Make sure that is the desired behavior."
            )
        _log.info("In-place quantize weight of %s", name)
        weight: Any = module.weight
        with torch.no_grad():
            weight.data.copy_(quantizer(weight))
