"""Forward hooks that compare the FP32 and the INT8 run of a prepared model, tensor by tensor."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

from qdq.debug.stats import ErrorSums
from qdq.quant import BlockQuantizer, Quantizer, QuantMode
from qdq.quant.primitives import fake_quant_unchecked

__all__ = ["Taps", "first_tensor", "int8_modes", "is_weight"]


class Taps:
    """Forward hooks: the FP32 pass stores tensors, the INT8 pass is compared with them.

    Quantizer hooks copy their tensor at once (the tracker of :mod:`qdq.graph.calls` does not
    count torch calls made inside a quantizer). Module hooks copy theirs with ``__torch_function__``
    disabled (the tracker does not see the copy, so its call ordinals are untouched): the model
    may write into a module's output in place afterwards (RepGhostNet's ``x += shortcut`` on an
    identity ``relu``'s output). They are compared after the forward.
    """

    def __init__(
        self, quantizers: dict[str, Quantizer], modules: dict[str, nn.Module], root: nn.Module
    ) -> None:
        self.quantizers, self.modules, self.root = quantizers, modules, root
        self.phase = "fp32"
        self.sums: dict[str, ErrorSums] = {}
        self.order: list[str] = []
        self.samples = 0
        self.notes: list[str] = []
        self._fp32: dict[str, list[torch.Tensor]] = {}
        self._int8: dict[str, list[torch.Tensor]] = {}
        self._calls: dict[str, int] = {}  # INT8 calls of each activation quantizer, this batch
        self._handles: list[Any] = []

    def __enter__(self) -> Taps:
        for path, q in self.quantizers.items():
            self._handles.append(q.register_forward_hook(self._quantizer_hook(path)))
        for path, m in self.modules.items():
            self._handles.append(m.register_forward_hook(self._keep(f"module:{path}")))
        self._handles.append(self.root.register_forward_hook(self._root_hook, with_kwargs=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _quantizer_hook(self, path: str) -> Any:
        weight = is_weight(self.quantizers[path])

        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if not isinstance(output, torch.Tensor):
                return
            if weight:  # the float weight is the input; compared once
                if self.phase == "int8" and path not in self.sums:
                    self._sums(path).add(args[0], output)
            elif self.phase == "fp32":
                if path not in self.order:
                    self.order.append(path)
                x = output.detach().clone()
                self._fp32.setdefault(path, []).append(x)
                self._sums(f"iso:{path}").add(x, _fake_quant(self.quantizers[path], x))
            else:
                calls = self._fp32.get(path, [])
                k = self._calls.get(path, 0)
                self._calls[path] = k + 1
                if k < len(calls) and calls[k].shape == output.shape:
                    self._sums(path).add(calls[k], output, self.quantizers[path].amax)
                    self._sums(f"in:{path}").add(calls[k], args[0])
                    calls[k] = calls[k].new_empty(0)  # free the FP32 copy early
                else:
                    self._note(f"{path}: its calls differ between the FP32 and INT8 runs")

        return hook

    def _keep(self, key: str) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            store = self._fp32 if self.phase == "fp32" else self._int8
            store.setdefault(key, []).append(_copy(output))

        return hook

    def _root_hook(self, module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        self._keep("model:output")(module, args, output)
        if self.phase == "fp32":
            leaves = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            self.samples += int(leaves[0].shape[0]) if leaves and leaves[0].dim() else 1

    def compare(self) -> None:
        """After the INT8 pass: compare the kept module outputs; drop the batch's tensors."""
        for key, ref in self._fp32.items():
            if not key.startswith(("module:", "model:")):
                if self._calls.get(key, 0) != len(ref):
                    self._note(f"{key}: its calls differ between the FP32 and INT8 runs")
                continue
            got = self._int8.get(key, [])
            for a, b in zip(ref, got, strict=False):
                x, y = first_tensor(a), first_tensor(b)
                if x is not None and y is not None and x.shape == y.shape:
                    self._sums(key).add(x, y)
            if len(got) != len(ref):
                self._note(f"{key}: its calls differ between the FP32 and INT8 runs")
        self._fp32.clear()
        self._int8.clear()
        self._calls.clear()

    def _sums(self, key: str) -> ErrorSums:
        return self.sums.setdefault(key, ErrorSums())

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)


def _fake_quant(q: Quantizer, x: torch.Tensor) -> torch.Tensor:
    """``x`` through ``q``'s Q/DQ whatever its mode (the FP32 run bypasses every quantizer)."""
    if isinstance(q, BlockQuantizer):
        return q.fake_quant_value(x)
    return fake_quant_unchecked(
        x,
        q.amax,
        num_bits=q.spec.num_bits,
        axis=q.spec.axis,
        narrow_range=q.spec.narrow_range,
        fmt=q.spec.format,
    )


def first_tensor(value: Any) -> torch.Tensor | None:
    return next((t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)), None)


def is_weight(q: Quantizer) -> bool:
    return q.name.endswith(":weight")


@contextlib.contextmanager
def int8_modes(quantizers: dict[str, Quantizer]) -> Iterator[None]:
    """The INT8 model as the user set it up: calibrating quantizers quantize, bypassed ones stay."""
    saved = {path: q.mode for path, q in quantizers.items()}
    try:
        for q in quantizers.values():
            if q.mode is QuantMode.CALIBRATE:
                q.mode = QuantMode.QUANTIZE
        yield
    finally:
        for path, q in quantizers.items():
            q.mode = saved[path]


def _copy(output: Any) -> Any:
    """``output`` with every tensor copied, unseen by any ``__torch_function__`` mode."""
    with torch._C.DisableTorchFunction():
        return tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, output)
