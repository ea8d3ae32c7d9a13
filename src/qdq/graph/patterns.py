"""Op kinds of fx nodes: one vocabulary for module, functional and method forms.

``op_kind(node, modules)`` maps ``nn.ReLU()``, ``F.relu``, ``torch.relu`` and ``x.relu()`` all to
``"act"``, ``x + y``/``torch.add`` to ``"add"``, ``torch.cat`` to ``"cat"``, and so on. The planner
and the rules only ever look at kinds, never at concrete callables.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

__all__ = [
    "COPY_KINDS",
    "DATA_MOVEMENT_KINDS",
    "EPILOGUE_KINDS",
    "PASS_THROUGH_KINDS",
    "WEIGHTED_KINDS",
    "call_name",
    "conv_groups",
    "op_kind",
    "tensor_inputs",
    "weight_arg",
]

WEIGHTED_KINDS = frozenset({"conv", "conv_transpose", "linear", "matmul"})
#: data movement: TensorRT moves Q/DQ across these (no arithmetic on values)
COPY_KINDS = frozenset({"copy", "identity"})
#: ops Q/DQ commute with, so scales on both sides must be shared
PASS_THROUGH_KINDS = frozenset({"copy", "identity", "max_pool", "pad", "resize"})
#: ...and a cyclic shift (``torch.roll``: Swin's shifted windows), data movement written as Slices
#: and a Concat in ONNX, which TensorRT moves a Quantize across: one scale across it (S03). The
#: searches for a quantized reader downstream (S02, P06, P17, the P04 fan-out readers) do not
#: look through it: on Swin V2's post-norm blocks P17 across a roll measured P04 9 -> 4 but
#: P05 3 -> 8 and 15 more unfused Q/DQ (the next block's residual Add reads the sum in float)
DATA_MOVEMENT_KINDS = PASS_THROUGH_KINDS | {"roll"}
#: ...and a ReLU-family activation, which TensorRT fuses into the PointWise layer before it
#: (an Add's, a gating Mul's): that layer's output is what the activation's reader quantizes
THROUGH_ACT_KINDS = PASS_THROUGH_KINDS | {"act"}
#: what TensorRT fuses after a weighted op (its epilogue)
EPILOGUE_KINDS = frozenset({"bn", "act", "silu", "hardswish", "sigmoid", "bias"})

_MODULE_KINDS: tuple[tuple[tuple[type[nn.Module], ...], str], ...] = (
    ((nn.Conv1d, nn.Conv2d, nn.Conv3d), "conv"),
    ((nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d), "conv_transpose"),
    ((nn.Linear,), "linear"),
    ((nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d), "bn"),
    ((nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.Hardtanh, nn.ELU, nn.PReLU, nn.Mish), "act"),
    ((nn.SiLU,), "silu"),
    ((nn.Hardswish,), "hardswish"),
    ((nn.Sigmoid, nn.Hardsigmoid), "sigmoid"),
    ((nn.GELU,), "gelu"),
    ((nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d), "max_pool"),
    ((nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d), "max_pool"),
    ((nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d), "avg_pool"),
    ((nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d), "avg_pool"),
    ((nn.Flatten, nn.Unflatten, nn.PixelShuffle, nn.PixelUnshuffle, nn.ChannelShuffle), "copy"),
    ((nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d), "identity"),
    ((nn.Softmax, nn.LogSoftmax), "softmax"),
    ((nn.LayerNorm, nn.GroupNorm, nn.RMSNorm), "norm"),
    ((nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d), "norm"),
    ((nn.MultiheadAttention,), "attention"),
)

_FUNCTION_KINDS: dict[Callable[..., Any], str] = {
    F.conv1d: "conv",
    F.conv2d: "conv",
    F.conv3d: "conv",
    F.conv_transpose1d: "conv_transpose",
    F.conv_transpose2d: "conv_transpose",
    F.conv_transpose3d: "conv_transpose",
    F.linear: "linear",
    torch.matmul: "matmul",
    operator.matmul: "matmul",
    torch.mm: "matmul",
    torch.bmm: "matmul",
    torch.addmm: "matmul",  # addmm(bias, x, W): transformers' Conv1D (GPT-2), W of (in, out)
    operator.add: "add",
    operator.iadd: "add",
    torch.add: "add",
    operator.mul: "mul",
    operator.imul: "mul",
    torch.mul: "mul",
    torch.cat: "cat",
    torch.concat: "cat",
    torch.concatenate: "cat",
    F.max_pool1d: "max_pool",
    F.max_pool2d: "max_pool",
    F.max_pool3d: "max_pool",
    F.adaptive_max_pool1d: "max_pool",
    F.adaptive_max_pool2d: "max_pool",
    torch.mean: "mean",
    F.avg_pool1d: "avg_pool",
    F.avg_pool2d: "avg_pool",
    F.avg_pool3d: "avg_pool",
    F.adaptive_avg_pool1d: "avg_pool",
    F.adaptive_avg_pool2d: "avg_pool",
    F.adaptive_avg_pool3d: "avg_pool",
    F.relu: "act",
    torch.relu: "act",
    F.relu6: "act",
    F.leaky_relu: "act",
    F.hardtanh: "act",
    F.elu: "act",
    torch.clamp: "act",
    torch.clip: "act",
    torch.sigmoid: "sigmoid",
    F.sigmoid: "sigmoid",
    F.hardsigmoid: "sigmoid",
    F.silu: "silu",
    F.hardswish: "hardswish",
    F.gelu: "gelu",
    F.pad: "pad",
    torch.flatten: "copy",
    torch.reshape: "copy",
    torch.permute: "copy",
    torch.transpose: "copy",
    torch.squeeze: "copy",
    torch.unsqueeze: "copy",
    torch.chunk: "copy",
    torch.split: "copy",
    operator.getitem: "copy",
    F.pixel_shuffle: "copy",
    torch.roll: "roll",
    F.dropout: "identity",
    F.interpolate: "resize",
    F.softmax: "softmax",
    torch.softmax: "softmax",
    F.layer_norm: "norm",
    F.group_norm: "norm",  # timm's GroupNorm1 calls it from its own forward
    F.instance_norm: "norm",
    F.rms_norm: "norm",
    F.batch_norm: "bn",
}

_METHOD_KINDS: dict[str, str] = {
    **dict.fromkeys(
        (
            "view",
            "reshape",
            "flatten",
            "permute",
            "transpose",
            "contiguous",
            "squeeze",
            "unsqueeze",
            "chunk",
            "split",
            "view_as",
            "reshape_as",
        ),
        "copy",
    ),
    **dict.fromkeys(("relu", "relu_", "clamp", "clamp_", "clip"), "act"),
    "sigmoid": "sigmoid",
    "roll": "roll",
    "add": "add",
    "add_": "add",
    "mul": "mul",
    "mul_": "mul",
    "matmul": "matmul",
    "addmm": "matmul",
    "mean": "mean",
    "softmax": "softmax",
    **dict.fromkeys(("size", "dim", "numel"), "shape"),
}


#: third-party modules that are the identity at inference (matched by class name, so the core
#: imports neither torchvision nor timm): stochastic depth / drop path
_IDENTITY_AT_INFERENCE = frozenset({"StochasticDepth", "DropPath"})
#: torchvision.ops.stochastic_depth(input, p, mode, training): the identity when training=False
_IDENTITY_FUNCTIONS = frozenset({"stochastic_depth", "drop_path"})


#: region samplers with no INT8 kernel in TensorRT (torchvision.ops.roi_align and its
#: ``torch.ops.torchvision.roi_align``), matched by name so the core does not import torchvision
_SAMPLER_FUNCTIONS = frozenset({"roi_align"})


def call_name(node: fx.Node) -> str:
    """The name a call node calls: a method's (``"pow"``), a function's ``__name__``
    (``"addmm"``); ``""`` for module calls and the rest."""
    if node.op == "call_method":
        return str(node.target)
    return str(getattr(node.target, "__name__", "")) if node.op == "call_function" else ""


def _callable_name(target: Any) -> str:
    name = getattr(target, "__name__", None)
    return (name if isinstance(name, str) else str(target)).rpartition(".")[2]


def op_kind(node: fx.Node, modules: dict[str, nn.Module]) -> str:
    """Return the op kind of ``node`` (``"other"`` for anything not in the vocabulary).

    Also: ``"placeholder"``, ``"output"``, ``"get_attr"``; ``"shape"`` for size queries;
    ``"resize_linear"`` for non-nearest interpolation; ``"pad"`` only for constant-zero padding;
    ``"avg_pool"`` for ``x.mean`` over spatial dims; ``"bias"`` for adding a constant;
    ``"roi_align"`` for torchvision's RoIAlign.
    """
    if node.op in ("placeholder", "output", "get_attr"):
        return node.op
    if node.op == "call_module":
        mod = modules.get(str(node.target))
        if isinstance(mod, nn.Upsample):
            return "resize" if mod.mode == "nearest" else "resize_linear"
        if isinstance(mod, (nn.ZeroPad1d, nn.ZeroPad2d, nn.ZeroPad3d)):
            return "pad"
        if isinstance(mod, (nn.ConstantPad1d, nn.ConstantPad2d, nn.ConstantPad3d)):
            return "pad" if float(mod.value) == 0.0 else "other"
        for types, module_kind in _MODULE_KINDS:
            if isinstance(mod, types):
                return module_kind
        if type(mod).__name__ in _IDENTITY_AT_INFERENCE:
            return "identity"
        return "other"
    if node.op == "call_function":
        found = _FUNCTION_KINDS.get(node.target) if callable(node.target) else None
        if found is None and getattr(node.target, "__name__", "") in _IDENTITY_FUNCTIONS:
            training = node.kwargs.get("training", node.args[3] if len(node.args) > 3 else True)
            return "identity" if training is False else "other"
        if found is None and _callable_name(node.target) in _SAMPLER_FUNCTIONS:
            return "roi_align"
        if found is None:
            return "other"
        kind: str = found
        if kind == "pad":
            mode = node.kwargs.get("mode", node.args[2] if len(node.args) > 2 else "constant")
            value = node.kwargs.get("value", node.args[3] if len(node.args) > 3 else None)
            return "pad" if mode == "constant" and not value else "other"
        if kind == "resize":
            mode = node.kwargs.get("mode", node.args[3] if len(node.args) > 3 else "nearest")
            return "resize" if mode == "nearest" else "resize_linear"
        if kind == "copy" and node.target is operator.getitem and _is_shape(node.args[0]):
            return "shape"
        if kind == "mean":  # torch.mean(x, (2, 3)): onnx2torch's GlobalAveragePool
            return "avg_pool" if _is_spatial_mean(node) else "other"
        return _refine_binary(node, kind)
    if node.op == "call_method":
        if str(node.target) in _CAST_METHODS and _keeps_dtype(node):
            return "identity"
        method_kind = _METHOD_KINDS.get(str(node.target), "other")
        if method_kind == "mean":
            return "avg_pool" if _is_spatial_mean(node) else "other"
        return _refine_binary(node, method_kind)
    return "other"


#: tensor methods that only convert (dtype, device): the identity when the dtype is kept
_CAST_METHODS = frozenset({"to", "type_as", "float", "type"})


def _keeps_dtype(node: fx.Node) -> bool:
    """Whether a cast's recorded output has its input's dtype (timm's ``.type_as(v)`` after
    the RoPE Concat, ``.to(x.dtype)``): a no-op the exporter drops, which Q/DQ placement must
    look through (the Concat before it feeds the attention's quantized MatMul)."""
    src = node.args[0] if node.args else None
    if not isinstance(src, fx.Node):
        return False
    dtype_in = getattr(src.meta.get("tensor_meta"), "dtype", None)
    dtype_out = getattr(node.meta.get("tensor_meta"), "dtype", None)
    return dtype_in is not None and dtype_in == dtype_out


def _refine_binary(node: fx.Node, kind: str) -> str:
    """An add with one constant operand is a bias add (an epilogue), not a residual add."""
    if kind == "add" and len(tensor_inputs(node)) < 2:
        return "bias"
    return kind


def _is_shape(arg: Any) -> bool:
    if not isinstance(arg, fx.Node):
        return False
    if arg.op == "call_method":
        return arg.target in ("size", "dim")
    return bool(arg.op == "call_function" and arg.target is getattr and arg.args[1] == "shape")


def _is_spatial_mean(node: fx.Node) -> bool:
    """``x.mean((2, 3))`` / ``x.mean((-2, -1))`` on NCHW: a global average pool."""
    dims = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else None)
    if isinstance(dims, int):
        dims = (dims,)
    if not isinstance(dims, (tuple, list)) or not dims:
        return False
    return bool(all(isinstance(d, int) and d >= 2 for d in dims) or sorted(dims) == [-2, -1])


def tensor_inputs(node: fx.Node) -> list[tuple[int, fx.Node]]:
    """``(position, producer)`` of the activation inputs of ``node``.

    Positions index ``node.args`` (for ``cat``, the position inside the list). ``get_attr``
    producers (parameters/buffers), shape computations and a cast's dtype template are not
    activations.
    """
    if node.op == "call_function" and node.target in (torch.cat, torch.concat, torch.concatenate):
        seq = node.args[0] if node.args else node.kwargs.get("tensors", ())
        items = list(seq) if isinstance(seq, (list, tuple)) else []
    elif node.op == "call_method" and node.target in _CAST_METHODS:
        items = list(node.args[:1])  # x.type_as(y), x.to(y): y gives only a dtype (and device)
    else:
        items = list(node.args)
    return [(i, a) for i, a in enumerate(items) if isinstance(a, fx.Node) and _is_activation(a)]


def _is_activation(arg: Any) -> bool:
    """A floating-point tensor computed at run time from the inputs (not a parameter, buffer, a
    value computed only from those — ``self.gamma.reshape(1, -1, 1, 1)`` —, shape arithmetic or
    a bool/int tensor such as a mask)."""
    if not isinstance(arg, fx.Node) or arg.op == "get_attr":
        return False
    dtype = getattr(arg.meta.get("tensor_meta"), "dtype", None)
    if isinstance(dtype, torch.dtype) and not dtype.is_floating_point:
        return False  # a mask or an index (bool/int): nothing to quantize
    if "type" in arg.meta:  # shape-propagated graph: trust the recorded result type
        return "tensor_meta" in arg.meta and not _constant(arg)
    if arg.op == "call_method" and arg.target in ("size", "dim", "numel"):
        return False
    if arg.op == "call_function" and arg.target is getattr:
        return False
    return not (
        arg.op == "call_function" and arg.target is operator.getitem and _is_shape(arg.args[0])
    )


def weight_arg(node: fx.Node) -> tuple[int | str, fx.Node] | None:
    """``(position or keyword, get_attr node)`` of a weighted op's constant weight, if it has one.

    Conv/ConvTranspose/Linear: argument 1 (or ``weight=``). MatMul: the second operand when it is a
    parameter (``x @ W``). Returns ``None`` when the weight is itself an activation.
    """
    found = _weight_operand(node)
    return found if found is not None and found[1].op == "get_attr" else None


#: calls that only reorder a tensor's axes (a weight ``W.transpose(-1, -2)`` is still ``W``)
_AXIS_SWAPS = frozenset({"transpose", "swapaxes", "swapdims", "permute", "t"})


def transposed_weight_arg(node: fx.Node) -> tuple[fx.Node, fx.Node, int] | None:
    """``(transpose call, get_attr node, axis)`` when a MatMul's second operand is a parameter
    with its axes reordered by one call (HaloNet's ``q @ rel_k.transpose(-1, -2)``); ``axis`` is
    the parameter's axis that becomes the product's output column (the operand's last axis)."""
    found = _weight_operand(node)
    if found is None or found[1].op not in ("call_method", "call_function"):
        return None
    call = found[1]
    name = call_name(call)
    param = call.args[0] if call.args else None
    if name not in _AXIS_SWAPS or not isinstance(param, fx.Node) or param.op != "get_attr":
        return None
    ndim = len(getattr(param.meta.get("tensor_meta"), "shape", ()))
    dims = [a for a in call.args[1:] if isinstance(a, int)]
    if name == "permute" and len(call.args) == 2 and isinstance(call.args[1], (list, tuple)):
        dims = [a for a in call.args[1] if isinstance(a, int)]
    if ndim < 2 or call.kwargs:
        return None
    perm = list(range(ndim))
    if name == "t" and ndim == 2 and not dims:
        perm = [1, 0]
    elif name == "permute" and len(dims) == ndim:
        perm = [d % ndim for d in dims]
    elif name in ("transpose", "swapaxes", "swapdims") and len(dims) == 2:
        a, b = (d % ndim for d in dims)
        perm[a], perm[b] = perm[b], perm[a]
    else:
        return None
    return call, param, perm[-1]


def computed_weight_arg(node: fx.Node) -> tuple[int | str, fx.Node] | None:
    """``(position or keyword, node)`` of a Conv/Linear call's weight when forward computes it
    from parameters alone (weight standardization: timm's ``StdConv2d``, ``ScaledStdConv2d``)."""
    found = _weight_operand(node)
    if found is not None and found[1].op != "get_attr" and _constant(found[1]):
        return found
    return None


def _weight_operand(node: fx.Node) -> tuple[int | str, fx.Node] | None:
    """``(position or keyword, node)`` of a weighted call's second operand: argument 1, or
    ``weight=`` / ``other=``; of ``addmm(bias, x, W)``, ``W`` (argument 2 or ``mat2=``)."""
    if call_name(node) == "addmm":  # torch.addmm, Tensor.addmm
        w = node.args[2] if len(node.args) > 2 else node.kwargs.get("mat2")
        key: int | str = 2 if len(node.args) > 2 else "mat2"
        return (key, w) if isinstance(w, fx.Node) else None
    if len(node.args) > 1:
        key = 1
        w = node.args[1]
    elif "weight" in node.kwargs:
        key, w = "weight", node.kwargs["weight"]
    elif "other" in node.kwargs:
        key, w = "other", node.kwargs["other"]
    else:
        return None
    return (key, w) if isinstance(w, fx.Node) else None


def conv_groups(node: fx.Node) -> int | None:
    """``groups`` of an ``F.conv*``/``F.conv_transpose*`` call (argument 6 in both signatures, or
    ``groups=``; 1 when absent), ``None`` when it is not a literal int."""
    g = node.args[6] if len(node.args) > 6 else node.kwargs.get("groups", 1)
    return g if isinstance(g, int) else None


def _constant(node: fx.Node) -> bool:
    """Whether ``node`` is computed from no graph input (only parameters, buffers, constants);
    memoized in ``node.meta["qdq_constant"]``, walked without recursion."""
    stack = [node]
    while stack:
        n = stack[-1]
        if "qdq_constant" in n.meta:
            stack.pop()
            continue
        todo = [i for i in n.all_input_nodes if "qdq_constant" not in i.meta]
        if todo:
            stack.extend(todo)
            continue
        stack.pop()
        n.meta["qdq_constant"] = n.op != "placeholder" and all(
            i.meta["qdq_constant"] for i in n.all_input_nodes
        )
    return bool(node.meta["qdq_constant"])
