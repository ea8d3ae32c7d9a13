"""Attention as TensorRT fuses it: ``softmax(q·scale @ kᵀ [+ mask]) @ v``, written out in torch ops.

``F.scaled_dot_product_attention`` is one opaque call: nothing can be quantized inside it, and its
ONNX form (below opset 23) is torch's own decomposition, with the attention scale split between
``q`` and ``k`` after any Q/DQ we could put on them. qdq's capture and runtime therefore run it as
:func:`attention_math` (the math path torch documents for SDPA): the two batched matrix products
(BMM1 ``q @ kᵀ`` and BMM2 ``probs @ v``) and the softmax become ordinary calls that the planner
sees, and the attention scale multiplies ``q`` *before* BMM1, where TensorRT's MHA fusion wants it.
The recording and every later run of the prepared model use the same decomposition, so the plan's
call sites are reached as planned; the user's float model is never changed.

:func:`attention_role` recognises the two products in a recorded graph, however the model wrote
them (SDPA, or ``q @ k.transpose(-2, -1)`` by hand as timm does with ``fused_attn=False``), for
rule P16 (:mod:`qdq.graph.weighted`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F

__all__ = ["MAX_INT8_SEQUENCE", "attention_math", "attention_role", "is_sdpa", "key_length"]

#: longest key sequence whose attention products run INT8 (ModelOpt's INT8 MHA limit); beyond it
#: TensorRT's fused MHA kernels are FP16 and the MatMuls stay float (P14)
MAX_INT8_SEQUENCE = 512

#: calls that may sit between BMM1 and the softmax besides scale, mask-add and layout ops
_MASKING = frozenset({"masked_fill", "masked_fill_", "div", "truediv", "to", "float", "type_as"})


def is_sdpa(func: Any) -> bool:
    """Whether ``func`` is ``torch.nn.functional.scaled_dot_product_attention``."""
    return func is F.scaled_dot_product_attention


def attention_math(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` in plain torch ops (same signature and semantics).

    Example:
        >>> q = torch.randn(1, 2, 5, 8)
        >>> ref = F.scaled_dot_product_attention(q, q, q)
        >>> bool(torch.allclose(attention_math(q, q, q), ref, atol=1e-6))
        True
    """
    size = query.shape[-1]
    factor = 1.0 / math.sqrt(size) if scale is None else scale
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        repeat = query.shape[-3] // key.shape[-3]
        key = key.repeat_interleave(repeat, dim=-3)
        value = value.repeat_interleave(repeat, dim=-3)
    scores = (query * factor) @ key.transpose(-2, -1)
    if is_causal:
        allowed = torch.ones(
            query.shape[-2], key.shape[-2], dtype=torch.bool, device=query.device
        ).tril()
        scores = scores.masked_fill(allowed.logical_not(), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(attn_mask.logical_not(), float("-inf"))
        else:
            scores = scores + attn_mask
    probs = scores.softmax(dim=-1)
    if dropout_p > 0.0:
        probs = F.dropout(probs, dropout_p)
    return probs @ value


def attention_role(node: fx.Node, kinds: dict[fx.Node, str]) -> str | None:
    """``"scores"`` for BMM1 (its product reaches a softmax), ``"context"`` for BMM2 (an operand
    comes from a softmax), else ``None``; only scale, mask and layout ops may sit in between."""
    if kinds.get(node) != "matmul":
        return None
    stack, seen = [node], {node}
    while stack:
        n = stack.pop()
        for user in n.users:
            if kinds.get(user) == "softmax":
                return "scores"
            if _between(user, kinds) and user not in seen:
                seen.add(user)
                stack.append(user)
    for arg in node.args[:2]:
        src: Any = arg
        while isinstance(src, fx.Node) and _between(src, kinds) and src.args:
            src = src.args[0]
        if isinstance(src, fx.Node) and kinds.get(src) == "softmax":
            return "context"
    return None


def key_length(node: fx.Node, role: str) -> int | None:
    """The key sequence length (the softmax axis) of an attention MatMul, from recorded shapes:
    the last dim of BMM1's product or of BMM2's first operand."""
    scores = node if role == "scores" else node.args[0]
    meta = scores.meta.get("tensor_meta") if isinstance(scores, fx.Node) else None
    shape = getattr(meta, "shape", None)
    if shape is None or len(shape) < 2:
        return None
    return int(shape[-1])


def _between(node: fx.Node, kinds: dict[fx.Node, str]) -> bool:
    kind = kinds.get(node)
    if kind in ("copy", "identity", "mul", "bias", "add"):
        return True
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    return kind == "other" and name in _MASKING
