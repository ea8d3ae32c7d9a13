"""Rule P15's readers: a tensor a normalization reads is a float stream, read in float by all.

A normalization (LayerNorm, GroupNorm, InstanceNorm, RMSNorm) has no INT8 path in TensorRT: the
tensor it reads is written in float. Any other reader that takes that tensor in INT8 then needs
a standalone Quantize beside the float read (a mixed-precision fan-out, lint P04): a tensor is
quantized for all its readers or none, and with a normalization among them, none. Rule P15
already keeps such a tensor's residual Add float (a pre-norm block's skip); here its weighted
readers stay float too:

* diffusers' ResNet block ``conv_shortcut(x) + conv2(silu(norm2(conv1(silu(norm1(x))))))``: the
  1x1 ``conv_shortcut`` reads the block input ``x`` that ``norm1`` reads — on the UNet's up path
  ``x`` is the skip Concat ``cat(h, skip)``, so the Concat then has no quantized reader either
  and stays float (S02), and the down-path tensors it concatenates are no longer written twice;
* the same block in a VAE decoder, after an upsampler changed the channel count.

A weighted op reads ``x`` through data movement (a reshape, a nearest resize, a zero pad, a max
pool: a Quantize moves back across them to ``x``) or an average pool (its input would be
quantized, P06); the normalization reads ``x`` through data movement too. NVIDIA's own INT8
recipes for diffusion UNets (TensorRT ``demo/Diffusion``, ModelOpt's diffusers examples) leave
``conv_shortcut`` float as well. Whether a standalone Quantize in front of a 1x1 conv costs more
than running that conv in FP16 is not measured here: the placement follows the rule spec's P04
(all readers or none) and costs no reformat.
"""

from __future__ import annotations

import torch.fx as fx

from qdq.graph.context import PlanContext
from qdq.graph.patterns import PASS_THROUGH_KINDS, call_name, tensor_inputs

__all__ = ["norm_reader", "stream_norm"]

#: ops a weighted op may read its input through and still read the same tensor in INT8: data
#: movement (the Quantize moves back across it, S03) and average pools (quantized at their
#: input, P06)
_TO_SOURCE = PASS_THROUGH_KINDS | {"avg_pool"}


def stream_norm(ctx: PlanContext, x: fx.Node) -> fx.Node | None:
    """The normalization reading ``x``, or a tensor ``x`` is data movement of (an average pool
    of), through data movement; ``None`` when there is none."""
    node: fx.Node | None = x
    seen: set[fx.Node] = set()
    while node is not None and node not in seen:
        seen.add(node)
        norm = norm_reader(ctx, node)
        if norm is not None:
            return norm
        ins = tensor_inputs(node)
        node = ins[0][1] if ctx.kinds[node] in _TO_SOURCE and len(ins) == 1 else None
    return None


def norm_reader(
    ctx: PlanContext, node: fx.Node, through: frozenset[str] = PASS_THROUGH_KINDS
) -> fx.Node | None:
    """A normalization reading ``node``'s output, through ops of the kinds ``through`` (data
    movement): a LayerNorm/GroupNorm/InstanceNorm/RMSNorm, module or functional, or one written
    as arithmetic (:func:`_norm_statistic`)."""
    stack, seen = [node], {node}
    while stack:
        x = stack.pop()
        for u in x.users:
            if ctx.kinds[u] == "norm" or _norm_statistic(ctx, u, x):
                return u
            if ctx.kinds[u] in through and u not in seen:
                seen.add(u)
                stack.append(u)
    return None


#: a hand-written normalization's statistic of its input ``x``: the mean square, the variance
_POW = frozenset({"pow", "__pow__", "square"})
_VARIANCE = frozenset({"var", "var_mean", "std", "std_mean"})


def _norm_statistic(ctx: PlanContext, u: fx.Node, x: fx.Node) -> bool:
    """Whether ``u`` starts a normalization written as arithmetic on ``x``: an RMSNorm's
    ``x.pow(2).mean(-1, keepdim=True)`` (T5's, LLaMA's and their kin in ``transformers``), a
    LayerNorm's ``u = x.mean(dim, keepdim=True)`` then ``x - u`` (ConvNeXt's channels-first one),
    ``x.var(...)``. Lowered to ONNX arithmetic, it reads ``x`` in float as a LayerNorm does."""
    name = call_name(u)
    if name in _VARIANCE:
        return True
    if name in _POW:
        exponent = u.args[1] if len(u.args) > 1 else u.kwargs.get("exponent", 2)
        squared = isinstance(exponent, (int, float)) and exponent == 2
        return squared and any(call_name(r) == "mean" for r in u.users)
    if name != "mean" or ctx.kinds[u] != "other" or not u.kwargs.get("keepdim", False):
        return False
    return any(call_name(r) == "sub" for r in u.users if x in r.args)  # x.sub(u), x - u
