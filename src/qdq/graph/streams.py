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
from qdq.graph.patterns import PASS_THROUGH_KINDS, tensor_inputs

__all__ = ["stream_norm"]

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
        norm = _norm_reader(ctx, node)
        if norm is not None:
            return norm
        ins = tensor_inputs(node)
        node = ins[0][1] if ctx.kinds[node] in _TO_SOURCE and len(ins) == 1 else None
    return None


def _norm_reader(ctx: PlanContext, node: fx.Node) -> fx.Node | None:
    """A normalization reading ``node``'s output, through data movement."""
    stack, seen = [node], {node}
    while stack:
        for u in stack.pop().users:
            if ctx.kinds[u] == "norm":
                return u
            if ctx.kinds[u] in PASS_THROUGH_KINDS and u not in seen:
                seen.add(u)
                stack.append(u)
    return None
