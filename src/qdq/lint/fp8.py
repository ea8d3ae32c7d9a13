"""FP8 rules F01-F09: where TensorRT has FP8 (E4M3) kernels and where an FP8 Q/DQ costs time or
does not build, predicted from the ONNX graph and the target (GPU, TensorRT version, build flags).

The rule ids are those of qdq's planner (:mod:`qdq.rules.tensorrt`, F01-F06), which decides the
same questions before export; F07 is the linter's own (the build flags). Every rule names its
source; ``docs/lint.md`` ("FP8") lists them.

* F01: FP8 needs compute capability 8.9+ (Ada, Hopper, Blackwell): ERROR on an older GPU, INFO
  when the target names none.
* F02: grouped and depthwise convolutions have no optimized FP8 kernel (TensorRT recommends INT8
  for ConvNets with them); FP8 ConvTranspose: TensorRT documents FP8 convolutions only.
* F03: an FP8 convolution with <= 16 input or output channels (ModelOpt keeps it out of FP8), or
  a kernel area above 32 (TensorRT has no FP8 kernel: FP16/FP32 fallback).
* F04: an FP8 GEMM with K or N below 16 (ModelOpt skips it: no efficient tensor-core tile).
* F05: one format per layer and per tensor: an activation and weight in different formats do not
  fuse; a tensor quantized to both INT8 and FP8 is written float and quantized twice; a layer
  quantized in the other format than its producer costs a standalone Quantize (INFO).
* F06: per-channel FP8 weights: no FP8 kernel for convolutions; GEMMs from TensorRT 10.6 (Hopper)
  and 10.7 (Ada).
* F07: a weakly typed build of an FP8 Q/DQ model without the FP8 builder flag.
* F08: an FP8 attention's softmax output quantized at another scale than 1/448 (INFO: the scale
  TensorRT's fused FP8 attention is built from; ModelOpt's FP8 exporter inserts it).
* F09: FP8 convolutions in a ConvNet that has grouped or depthwise convolutions (INFO: TensorRT
  recommends INT8 for such ConvNets; every block then crosses a format boundary).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from qdq.lint.attention import attention_cores
from qdq.lint.blocks import block_no_kernel
from qdq.lint.findings import ERROR, INFO, WARN, Finding
from qdq.lint.formats import FORMATS, FP8, is_qdq

if TYPE_CHECKING:
    from qdq.lint.graph import LintGraph
    from qdq.lint.target import Target

__all__ = ["check_fp8", "conv_shape", "no_kernel"]

_NOTES = "TensorRT 10.12/10.13 release notes, Limitations"
_MODELOPT = (
    "NVIDIA/Model-Optimizer modelopt/onnx/quantization/graph_utils.py "
    "(find_nodes_from_convs_to_exclude, _MIN_CHANNELS_FP8 = 16; find_nodes_from_matmul_to_exclude, "
    "_MIN_MATMUL_DIM = 16)"
)
_MAX_FP8_KERNEL_AREA = 32
_MIN_FP8_CHANNELS = 16  # exclusive: <= 16 is left out
_MIN_GEMM_DIM = 16


def conv_shape(g: LintGraph, node: Any) -> tuple[int, int, int, tuple[int, ...]] | None:
    """``(groups, input channels, output channels, kernel)`` of a Conv/ConvTranspose from its
    constant weight (``None`` when the weight is not a constant)."""
    if node.op_type not in ("Conv", "ConvTranspose") or len(node.input) < 2:
        return None
    w = g.qinput(node.input[1])
    weight = g.const.get(w.source if w is not None else node.input[1])
    if weight is None or weight.ndim < 3:
        return None
    group = next((a.i for a in node.attribute if a.name == "group"), 1) or 1
    a, b = int(weight.shape[0]), int(weight.shape[1])
    if node.op_type == "Conv":
        return group, b * group, a, tuple(int(k) for k in weight.shape[2:])
    return group, a, b * group, tuple(int(k) for k in weight.shape[2:])


def _per_channel(g: LintGraph, node: Any) -> bool:
    """The weight's DequantizeLinear has more than one scale."""
    dq = g.weight_dq(node.input[1]) if len(node.input) > 1 else None
    scale = g.const.get(dq.input[1]) if dq is not None and len(dq.input) > 1 else None
    return scale is not None and np.asarray(scale).size > 1


def no_kernel(g: LintGraph, node: Any, fmt: str) -> str:
    """Why TensorRT has no ``fmt`` kernel for the weighted op ``node`` ('' when it has one), so
    that the layer runs float behind standalone Dequantize layers: an FP8 convolution with a
    kernel area above 32 (FP16/FP32 fallback kernels, release notes) or per-channel FP8 weights
    (no FP8 implementation, NVIDIA/Model-Optimizer#118); a block format on a convolution
    (:func:`qdq.lint.blocks.block_no_kernel`)."""
    if fmt != FP8:
        return block_no_kernel(node, fmt)
    if node.op_type != "Conv":
        return ""
    shape = conv_shape(g, node)
    if shape is not None and math.prod(shape[3]) > _MAX_FP8_KERNEL_AREA:
        return f"no FP8 convolution for a kernel area above {_MAX_FP8_KERNEL_AREA}"
    if _per_channel(g, node):
        return "no FP8 convolution for per-channel FP8 weights"
    return ""


def check_fp8(g: LintGraph, t: Target) -> list[Finding]:
    """F01-F09 on a graph with FP8 Q/DQ (none on an INT8-only graph).

    Args:
        g: the indexed graph.
        t: the target (its GPU decides F01 and F06 on GEMMs; its flags F07).
    """
    qdq = [n for n in g.nodes if is_qdq(n)]
    fp8 = [n for n in qdq if g.qdq_format(n) == FP8]
    if not fp8:
        return []
    out = _target_rules(g, t, fp8)
    for node in g.nodes:
        if g.weighted(node) and not g.folded_node(node):
            out.extend(_layer_rules(g, t, node))
    out.extend(_tensor_formats(g))
    out.extend(_softmax_scales(g))
    out.extend(_depthwise_convnet(g))
    return out


def _depthwise_convnet(g: LintGraph) -> list[Finding]:
    """F09 (INFO): FP8 (ungrouped) convolutions in a graph that has grouped/depthwise ones."""
    grouped, fp8_convs = [], []
    for node in g.nodes:
        shape = conv_shape(g, node) if node.op_type == "Conv" else None
        if shape is None:
            continue
        if shape[0] > 1:
            grouped.append(g.name(node))
        elif g.weighted(node) and g.weighted_format(node) == FP8:
            fp8_convs.append(g.name(node))
    if not grouped or not fp8_convs:
        return []
    some = _first_three(fp8_convs)
    return [
        Finding(
            "F09",
            INFO,
            tuple(fp8_convs[:10]),
            f"{len(fp8_convs)} FP8 convolution(s) ({some}) in a ConvNet with {len(grouped)} "
            f"grouped/depthwise convolution(s) ({grouped[0]}, ...)",
            "TensorRT runs the grouped/depthwise convolutions INT8 or FP16, so each FP8 "
            "convolution between them sits behind a format boundary, and FP8 convolutions are no "
            "faster than INT8 ones",
            "quantize this ConvNet's convolutions INT8 (qdq's FP8 plans do: rule F09), its GEMMs "
            "and attention FP8",
            f"{_NOTES} ('INT8 is still recommended for ConvNets containing these convolution "
            "ops'); NVIDIA/TensorRT#4524",
        )
    ]


def _first_three(names: list[str]) -> str:
    """``"a, b, c"``, and ``", ..."`` after them when there are more."""
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def _softmax_scales(g: LintGraph) -> list[Finding]:
    """F08 (INFO): an FP8 attention whose probabilities' Quantize has another scale than 1/448."""
    out: list[Finding] = []
    wanted = float(np.float32(1.0 / 448.0))
    for a in attention_cores(g):
        if a.fmt != FP8:
            continue
        q = next(m for m in a.members if m.op_type == "QuantizeLinear")
        scale = g.const.get(q.input[1]) if len(q.input) > 1 else None
        if scale is None or np.asarray(scale).size != 1:
            continue
        value = float(np.asarray(scale, dtype=np.float32).reshape(()))
        if value == wanted:
            continue
        out.append(
            Finding(
                "F08",
                INFO,
                (g.name(q), g.name(a.context)),
                f"{g.name(q)}: the FP8 softmax output of the attention ending at "
                f"{g.name(a.context)} is quantized at scale {value:.6g}, not 1/448",
                "TensorRT's fused FP8 attention (MHA-v2) is built from a data-independent softmax "
                "Q/DQ at scale 1/448; a calibrated scale below it also clips the largest "
                "probabilities",
                "quantize the softmax output at amax 1 (scale 1/448); qdq's FP8 plans do (F08)",
                "NVIDIA/Model-Optimizer PR 1289 (its FP8 ONNX exporter inserts the softmax Q/DQ "
                "at the fixed scale 1/448 for the MHA-v2 fusion); qdq rule F08",
            )
        )
    return out


def _target_rules(g: LintGraph, t: Target, fp8: list[Any]) -> list[Finding]:
    """F01 (the GPU) and F07 (the build flags)."""
    names = tuple(g.name(n) for n in fp8[:10])
    some = _first_three(list(names))  # names: the first 10, so "..." iff more than 3
    need = FORMATS[FP8].compute_capability or (0, 0)
    runs = t.runs(need)
    out: list[Finding] = []
    cc = ".".join(map(str, need))
    if runs is False:
        have = ".".join(map(str, t.compute_capability or ()))
        out.append(
            Finding(
                "F01",
                ERROR,
                names,
                f"{len(fp8)} FP8 Q/DQ node(s) ({some}) on {t.label}: "
                f"{t.gpu} (compute capability {have}) has no FP8 kernels; FP8 needs {cc}+ "
                "(Ada, Hopper, Blackwell)",
                "the engine does not build: 'Networks with FP8 Q/DQ layers require hardware "
                "with FP8 support'",
                "quantize these layers INT8 for this GPU (qdq quantize --format int8), or target "
                "an Ada/Hopper/Blackwell GPU",
                "NVIDIA/Model-Optimizer#70 (TensorRT 10.3 on an RTX A6000, Ampere)",
            )
        )
    elif runs is None:
        out.append(
            Finding(
                "F01",
                INFO,
                names,
                f"{len(fp8)} FP8 Q/DQ node(s) ({some}): FP8 needs compute capability {cc}+ "
                f"and {t.label} names no GPU",
                "builds only on Ada, Hopper or Blackwell GPUs",
                "name the GPU in the target (--target trt10-hopper, trt10-ada, trt10-sm89) to check",
                "NVIDIA/Model-Optimizer#70; TensorRT-RTX 'Working with Quantized Types' (FP8 on "
                "compute capability 8.9 or later)",
            )
        )
    if not t.strongly_typed and not t.flags & {FORMATS[FP8].build_flag, "best"}:
        out.append(
            Finding(
                "F07",
                WARN,
                names,
                f"weakly typed build with flags {sorted(t.flags) or 'none'} of a model with "
                f"{len(fp8)} FP8 Q/DQ node(s) ({some}): FP8 layer selection is off without --fp8",
                "the FP8 Q/DQ layers do not get FP8 kernels (BuilderFlag::kFP8 enables them)",
                "build with --fp8 (trtexec --int8 --fp16 --fp8), or --stronglyTyped on TensorRT "
                ">= 10.12 (TensorRT 10.2 chose FP8 convolutions only when strongly typed)",
                "TensorRT BuilderFlag kFP8; NVIDIA/TensorRT#3987",
            )
        )
    return out


def _layer_rules(g: LintGraph, t: Target, node: Any) -> list[Finding]:
    """F02-F06 on one weighted op."""
    name = g.name(node)
    fmt = g.weighted_format(node)
    if fmt is None:
        return _mixed(g, node, name)
    if fmt != FP8:
        return []
    if node.op_type == "ConvTranspose":
        return [
            Finding(
                "F02",
                INFO,
                (name,),
                f"{name}: FP8 ConvTranspose",
                "TensorRT documents FP8 convolution kernels, not FP8 deconvolution: it may run "
                "FP16 behind standalone Q/DQ",
                "verify on the GPU, or quantize it INT8",
                f"{_NOTES} (FP8 convolutions); qdq rule F02",
            )
        ]
    if node.op_type == "Conv":
        return _conv_rules(g, node, name)
    return _gemm_rules(g, t, node, name)


def _mixed(g: LintGraph, node: Any, name: str) -> list[Finding]:
    """F05: activation and weight both through DequantizeLinear, in different formats."""
    act = g.qinput(node.input[0])
    dq = g.weight_dq(node.input[1])
    if act is None or dq is None:
        return []
    a, w = FORMATS[act.fmt].label, FORMATS[g.qdq_format(dq)].label
    return [
        Finding(
            "F05",
            WARN,
            (name, g.name(act.dq), g.name(dq)),
            f"{name}: activation quantized {a} but weights {w}",
            f"no mixed {a}/{w} kernel: {node.op_type} runs float behind two standalone "
            "Dequantize layers",
            f"quantize {name}'s activation and weights in one format",
            "qdq rule F05; reference/tensorrt-qdq-rules.md §1.6 (a weighted op fuses with its "
            "input and weight DequantizeLinear)",
        )
    ]


def _conv_rules(g: LintGraph, node: Any, name: str) -> list[Finding]:
    """F02 (grouped/depthwise), F03 (channels, kernel area), F06 (per-channel weights)."""
    out: list[Finding] = []
    shape = conv_shape(g, node)
    if shape is not None:
        group, cin, cout, kernel = shape
        area = math.prod(kernel)
        if group > 1:
            what = "depthwise" if group == cin else "grouped"
            out.append(
                Finding(
                    "F02",
                    WARN,
                    (name,),
                    f"{name}: FP8 {what} convolution (group={group}, {cin}->{cout} channels)",
                    "TensorRT has no optimized FP8 kernel for grouped or depthwise convolutions: "
                    "a slow kernel or FP16 fallback",
                    f"quantize {name} INT8 (TensorRT recommends INT8 for ConvNets with grouped "
                    "or depthwise convolutions)",
                    f"{_NOTES}; NVIDIA/TensorRT#4524",
                )
            )
        elif cin <= _MIN_FP8_CHANNELS or cout <= _MIN_FP8_CHANNELS:
            out.append(
                Finding(
                    "F03",
                    WARN,
                    (name,),
                    f"{name}: FP8 convolution with {cin}->{cout} channels (<= {_MIN_FP8_CHANNELS})",
                    "small FP8 convolutions are slower than FP16 ones; ModelOpt leaves them out "
                    "of FP8",
                    f"leave {name} FP16 or quantize it INT8",
                    _MODELOPT,
                )
            )
        if area > _MAX_FP8_KERNEL_AREA:
            out.append(
                Finding(
                    "F03",
                    WARN,
                    (name,),
                    f"{name}: FP8 convolution with a {'x'.join(map(str, kernel))} kernel "
                    f"(area {area} > {_MAX_FP8_KERNEL_AREA})",
                    "TensorRT's FP8 convolutions do not support kernels this large: it runs "
                    "FP16/FP32 fallback kernels behind standalone Q/DQ",
                    f"remove the FP8 Q/DQ before {name}, or quantize it INT8",
                    f"{_NOTES}; {_MODELOPT}",
                )
            )
    if _per_channel(g, node):
        out.append(
            Finding(
                "F06",
                WARN,
                (name,),
                f"{name}: per-channel FP8 convolution weights",
                "TensorRT found no FP8 implementation for them (every tactic of the weight "
                "quantization skipped; the engine ran slower than FP16): the convolution runs "
                "float",
                f"quantize {name}'s weights per tensor (one scale), as ModelOpt's FP8 recipes do",
                "NVIDIA/Model-Optimizer#118 (TensorRT 10.7); ModelOpt FP8_DEFAULT_CFG (axis None)",
            )
        )
    return out


def _gemm_rules(g: LintGraph, t: Target, node: Any, name: str) -> list[Finding]:
    """F04 (K or N < 16) and F06 (per-channel FP8 GEMM scales before 10.6 / 10.7)."""
    out: list[Finding] = []
    kn = g.gemm_kn(node)
    if kn is not None and min(kn) < _MIN_GEMM_DIM:
        out.append(
            Finding(
                "F04",
                WARN,
                (name,),
                f"{name}: FP8 GEMM with K={kn[0]}, N={kn[1]} (< {_MIN_GEMM_DIM})",
                "no efficient FP8 tensor-core tile: the Q/DQ costs more than the GEMM gains "
                "(ModelOpt skips such GEMMs)",
                f"leave {name} float (no Q/DQ on its input and weight)",
                _MODELOPT,
            )
        )
    if _per_channel(g, node) and not t.fp8_gemm_per_channel:
        out.append(
            Finding(
                "F06",
                INFO,
                (name,),
                f"{name}: per-channel FP8 GEMM weights",
                "supported from TensorRT 10.6 on Hopper and 10.7 on Ada; "
                f"{t.label} is not known to build them",
                f"verify on the GPU, or quantize {name}'s weights per tensor",
                "TensorRT 10.6.0 and 10.7.0 release notes (per-channel scaling for FP8 GEMMs)",
            )
        )
    return out


def _tensor_formats(g: LintGraph) -> list[Finding]:
    """F05: one tensor quantized to INT8 by some readers and to FP8 by others (WARN); a Quantize
    of a weighted layer's output into the other format (INFO: a format boundary)."""
    out: list[Finding] = []
    sources = dict.fromkeys(n.input[0] for n in g.nodes if n.op_type == "QuantizeLinear")
    for t in sources:
        if g.is_const(t):
            continue
        qs = [c for c in g.consumers.get(t, []) if c.op_type == "QuantizeLinear"]
        formats = sorted({FORMATS[g.qdq_format(q)].label for q in qs})
        if len(formats) == 1:
            out.extend(_boundary(g, t, qs))
        if len(formats) > 1:
            out.append(
                Finding(
                    "F05",
                    WARN,
                    (t, *(g.name(q) for q in qs)),
                    f"tensor {t} is quantized to {' and '.join(formats)} by different readers",
                    "its producer writes float and every Quantize of it runs standalone",
                    f"quantize {t} in one format for all its readers",
                    "qdq rule F05 (one Quantize per tensor)",
                )
            )
    return out


def _boundary(g: LintGraph, tensor: str, qs: list[Any]) -> list[Finding]:
    """F05 INFO: ``tensor`` ends a quantized weighted layer's epilogue and is quantized to the
    other format: that layer writes float and the Quantize runs standalone."""
    producer = g.backbone(tensor)
    made = g.weighted_format(producer) if producer is not None else None
    to = g.qdq_format(qs[0])
    if made is None or made == to:
        return []
    q, p, a, b = g.name(qs[0]), g.name(producer), FORMATS[made].label, FORMATS[to].label
    return [
        Finding(
            "F05",
            INFO,
            (q, p),
            f"{q}: {b} Quantize of the output of {p}, which runs {a}: a format boundary",
            f"{p} writes float and {q} runs as a standalone Quantize (one {a} -> {b} reformat)",
            "keep neighbouring layers in one format where the accuracy allows",
            "qdq rule F05; reference/tensorrt-qdq-rules.md §1.6 (a layer writes a quantized "
            "output only for readers that quantize it)",
        )
    ]
