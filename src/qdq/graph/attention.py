"""Attention as TensorRT fuses it: ``softmax(q·scale @ kᵀ [+ mask]) @ v``, written out in torch ops.

``F.scaled_dot_product_attention`` is one opaque call: nothing can be quantized inside it, and its
ONNX form (below opset 23) is torch's own decomposition, with the attention scale split between
``q`` and ``k`` after any Q/DQ we could put on them. qdq's capture and runtime therefore run it as
:func:`attention_math` (the math path torch documents for SDPA): the two batched matrix products
(BMM1 ``q @ kᵀ`` and BMM2 ``probs @ v``) and the softmax become ordinary calls that the planner
sees, and the attention scale multiplies ``q`` *before* BMM1, where TensorRT's MHA fusion wants it.
The recording and every later run of the prepared model use the same decomposition, so the plan's
call sites are reached as planned; the user's float model is never changed. ``nn.MultiheadAttention``
is seen the same way (:func:`multi_head_attention_math`): its packed q/k/v projection and
``out_proj`` are GEMMs and its products attention MatMuls.

:func:`attention_role` recognises the two products in a recorded graph, however the model wrote
them (SDPA, or ``q @ k.transpose(-2, -1)`` by hand as timm does with ``fused_attn=False``), for
rule P16 (:mod:`qdq.graph.weighted`).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F

from qdq.graph.patterns import call_name

__all__ = [
    "MAX_INT8_SEQUENCE",
    "attention_math",
    "attention_role",
    "is_mha",
    "is_sdpa",
    "key_length",
    "multi_head_attention_math",
    "probs_source",
]

#: longest key sequence whose attention products run INT8 (ModelOpt's INT8 MHA limit); beyond it
#: TensorRT's fused MHA kernels are FP16 and the MatMuls stay float (P14)
MAX_INT8_SEQUENCE = 512

#: calls that may sit between BMM1 and the softmax besides scale, mask-add and layout ops
_MASKING = frozenset(
    {"masked_fill", "masked_fill_", "div", "truediv", "to", "float", "type_as", "setitem"}
)
#: casts that may sit between the softmax and BMM2
_CASTS = frozenset({"to", "float", "type_as", "contiguous"})


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


def is_mha(func: Any) -> bool:
    """Whether ``func`` is ``torch.nn.functional.multi_head_attention_forward``
    (``nn.MultiheadAttention``'s Python path)."""
    return func is F.multi_head_attention_forward


_MHA_PARAMETERS = tuple(inspect.signature(F.multi_head_attention_forward).parameters.values())
_MHA_NAMES = tuple(p.name for p in _MHA_PARAMETERS)
_MHA_DEFAULTS = {p.name: p.default for p in _MHA_PARAMETERS if p.default is not p.empty}


def _bind_mha(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The arguments of an ``F.multi_head_attention_forward`` call by name, defaults filled in, or
    ``None`` for a call that does not bind. Plain dict work (``inspect.Signature.bind`` is not
    something ``torch.compile`` can trace)."""
    if len(args) > len(_MHA_NAMES):
        return None
    bound = dict(zip(_MHA_NAMES, args, strict=False))
    for name, value in kwargs.items():
        if name not in _MHA_NAMES or name in bound:
            return None
        bound[name] = value
    for name in _MHA_NAMES:
        if name not in bound:
            if name not in _MHA_DEFAULTS:
                return None
            bound[name] = _MHA_DEFAULTS[name]
    return bound


def multi_head_attention_math(*args: Any, **kwargs: Any) -> tuple[Any, Any] | None:
    """``F.multi_head_attention_forward`` (inference) in plain torch ops, or ``None`` when the call
    uses what this does not cover (``bias_k``/``bias_v``, ``add_zero_attn``, ``static_k``/``v``,
    dropout while training, causal masks, unbatched inputs, separate q/k/v weights, cross-attention
    with a packed weight): the caller then runs it as one op.

    Self-attention with the packed ``in_proj_weight`` (ViT, ``nn.TransformerEncoderLayer``) becomes
    one ``F.linear`` (the q/k/v GEMM), :func:`attention_math`'s products and the ``out_proj`` GEMM,
    all of which the planner sees (P01, P16).

    Example:
        >>> mha = torch.nn.MultiheadAttention(8, 2).eval()
        >>> x = torch.randn(5, 3, 8)
        >>> ref, w = mha(x, x, x)
        >>> out, w2 = multi_head_attention_math(x, x, x, 8, 2, mha.in_proj_weight,
        ...     mha.in_proj_bias, None, None, False, 0.0, mha.out_proj.weight, mha.out_proj.bias,
        ...     training=False)
        >>> bool(torch.allclose(out, ref, atol=1e-6)), bool(torch.allclose(w, w2, atol=1e-6))
        (True, True)
    """
    a = _bind_mha(args, kwargs)
    if a is None:
        return None
    query, key, value = a["query"], a["key"], a["value"]
    unsupported = (
        a["bias_k"] is not None
        or a["bias_v"] is not None
        or a["add_zero_attn"]
        or a["static_k"] is not None
        or a["static_v"] is not None
        or (a["training"] and a["dropout_p"] > 0.0)
        or a["is_causal"]
        or a["use_separate_proj_weight"]
        or a["in_proj_weight"] is None
        or not (query is key and key is value)
        or query.dim() != 3
    )
    if unsupported:
        return None
    length, batch, embed = query.shape
    heads = int(a["num_heads"])
    head_dim = embed // heads
    q, k, v = F.linear(query, a["in_proj_weight"], a["in_proj_bias"]).chunk(3, dim=-1)

    def split(t: torch.Tensor) -> torch.Tensor:  # (L, N, E) -> (N, heads, L, head_dim)
        return t.reshape(length, batch, heads, head_dim).permute(1, 2, 0, 3)

    mask = _additive_mask(a["attn_mask"], a["key_padding_mask"], batch, heads, length, q.dtype)
    scores = (split(q) * (1.0 / math.sqrt(head_dim))) @ split(k).transpose(-2, -1)
    if mask is not None:
        scores = scores + mask
    probs = scores.softmax(dim=-1)
    context = (probs @ split(v)).permute(2, 0, 1, 3).reshape(length * batch, embed)
    out = F.linear(context, a["out_proj_weight"], a["out_proj_bias"]).view(length, batch, embed)
    if not a["need_weights"]:
        return out, None
    return out, probs.mean(dim=1) if a["average_attn_weights"] else probs


def _additive_mask(
    attn_mask: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
    batch: int,
    heads: int,
    length: int,
    dtype: torch.dtype,
) -> torch.Tensor | None:
    """``attn_mask`` ((L, S) or (N·heads, L, S)) and ``key_padding_mask`` ((N, S)) as one float
    mask broadcastable to (N, heads, L, S): ``True`` (masked out) becomes ``-inf``."""

    def additive(m: torch.Tensor) -> torch.Tensor:
        if m.dtype == torch.bool:
            return torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(m, float("-inf"))
        return m.to(dtype)

    mask = None
    if attn_mask is not None:
        mask = additive(attn_mask)
        if mask.dim() == 3:
            mask = mask.reshape(batch, heads, length, mask.shape[-1])
    if key_padding_mask is not None:
        padding = additive(key_padding_mask).reshape(batch, 1, 1, key_padding_mask.shape[-1])
        mask = padding if mask is None else mask + padding
    return mask


def attention_role(node: fx.Node, kinds: dict[fx.Node, str]) -> str | None:
    """``"scores"`` for BMM1, ``"context"`` for BMM2 of one attention core as TensorRT fuses it
    (and as :mod:`qdq.lint.attention` predicts it), else ``None``: BMM1's product reaches a softmax
    through scale, mask, bias and layout ops only (a relative-position bias written back with
    ``attn[...] = ...``, as MViTv2 does, included), and the softmax output reaches an operand of
    BMM2 through layout ops only. A product with only half of that -- ConViT's gated positional
    attention, the probabilities mixed before BMM2; CoaT's and EfficientViM's softmax over keys
    or states, no BMM1 in front of it -- is no fused MHA: both its MatMuls stay FP16 (P14)."""
    if kinds.get(node) != "matmul":
        return None
    softmax = _softmax_after(node, kinds)
    if softmax is not None and _context_after(softmax, kinds) is not None:
        return "scores"
    for arg in node.args[:2]:
        src = probs_source(arg, kinds)
        if src is not None and _scores_before(src, kinds) is not None:
            return "context"
    return None


def _softmax_after(node: fx.Node, kinds: dict[fx.Node, str]) -> fx.Node | None:
    """The softmax that ``node``'s product reaches through :func:`_between` ops, or ``None``."""
    return _first_user(node, kinds, "softmax", _between)


def _first_user(
    node: fx.Node,
    kinds: dict[fx.Node, str],
    kind: str,
    through: Callable[[fx.Node, dict[fx.Node, str]], bool],
) -> fx.Node | None:
    """The first node of ``kind`` that reads ``node``'s output through ``through`` ops only."""
    stack, seen = [node], {node}
    while stack:
        n = stack.pop()
        for user in n.users:
            if kinds.get(user) == kind:
                return user
            if through(user, kinds) and user not in seen:
                seen.add(user)
                stack.append(user)
    return None


def _scores_before(softmax: fx.Node, kinds: dict[fx.Node, str]) -> fx.Node | None:
    """The MatMul whose product reaches ``softmax`` through :func:`_between` ops, or ``None``."""
    stack: list[Any] = list(softmax.args[:1])
    seen: set[Any] = set()
    while stack:
        n = stack.pop()
        if not isinstance(n, fx.Node) or n in seen:
            continue
        seen.add(n)
        if kinds.get(n) == "matmul":
            return n
        if _between(n, kinds):
            stack.extend(a for a in n.args if isinstance(a, fx.Node))
    return None


def _context_after(softmax: fx.Node, kinds: dict[fx.Node, str]) -> fx.Node | None:
    """The MatMul reading ``softmax``'s output through layout ops only, or ``None``."""
    return _first_user(softmax, kinds, "matmul", _layout)


def probs_source(arg: Any, kinds: dict[fx.Node, str]) -> fx.Node | None:
    """The softmax ``arg`` is a layout view of, or ``None``."""
    src = arg
    while isinstance(src, fx.Node) and _layout(src, kinds) and src.args:
        src = src.args[0]
    return src if isinstance(src, fx.Node) and kinds.get(src) == "softmax" else None


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
    return kind == "other" and call_name(node) in _MASKING


def _layout(node: fx.Node, kinds: dict[fx.Node, str]) -> bool:
    """A layout op, dropout (identity in eval) or a cast: what may sit between the softmax and
    BMM2 inside TensorRT's MHA fusion (the probabilities' Q/DQ goes right on the softmax)."""
    kind = kinds.get(node)
    return kind in ("copy", "identity") or (kind == "other" and call_name(node) in _CASTS)
