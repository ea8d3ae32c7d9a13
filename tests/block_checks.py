"""Bit-exact checks shared by the block-format export tests (issue 60): a float tensor equal to
another bit for bit, and every quantizer of an exported model tapped in ONNX Runtime (through
:func:`qdq.backends.blocks_reference.runnable`) against the torch fake-quant model's."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from onnx import helper

from qdq.backends.blocks_reference import runnable
from qdq.backends.ort_session import run, session


def bits(a: np.ndarray) -> np.ndarray:
    """The float32 bit patterns of ``a``."""
    return np.asarray(a, np.float32).view(np.int32)


def same(want: torch.Tensor, got: np.ndarray) -> bool:
    """Bit for bit, NaN matching NaN."""
    w = want.detach().numpy()
    nan = np.isnan(w)
    return bool(
        np.array_equal(nan, np.isnan(got)) and np.array_equal(bits(w)[~nan], bits(got)[~nan])
    )


def tapped_outputs(
    proto: Any, quantizers: dict[str, torch.nn.Module], model: torch.nn.Module, x: torch.Tensor
) -> tuple[list[np.ndarray], torch.Tensor]:
    """Run ``proto`` in ONNX Runtime with each quantizer's ``<path>/DequantizeLinear`` output
    tapped, and ``model`` in torch on ``x``; assert every tap equals the quantizer's torch output
    bit for bit. Returns ONNX Runtime's outputs (the model's first) and torch's output."""
    taps = {p: n.output[0] for n in proto.graph.node for p in quantizers
            if n.name == f"{p}/DequantizeLinear"}  # fmt: skip
    assert set(taps) == set(quantizers)
    tapped = runnable(proto)
    tapped.graph.output.extend(helper.make_empty_tensor_value_info(t) for t in taps.values())
    outs = run(session(tapped), [x])
    seen: dict[str, torch.Tensor] = {}
    hooks = [q.register_forward_hook(lambda mod, a, o, p=p: seen.__setitem__(p, o))
             for p, q in quantizers.items()]  # fmt: skip
    with torch.no_grad():
        want = model(x)
    for h in hooks:
        h.remove()
    for (p, _), got in zip(taps.items(), outs[1:], strict=True):
        assert same(seen[p], got), p
    return outs, want
