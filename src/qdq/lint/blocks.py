"""Block-format rules M01-M05 (issue 60): where TensorRT has NVFP4, MXFP8 and INT4 weight-only
kernels, predicted from the ONNX graph and the target (GPU, TensorRT version).

* M01: a block format on a convolution: TensorRT's FP4, MX and INT4 weight-only kernels are GEMMs
  (MatMul/Gemm); ModelOpt quantizes convolutions FP8 or INT8 instead. The layer runs float behind
  standalone Dequantize layers, or the build fails.
* M02: a block format on a target without its kernels: NVFP4 needs a Blackwell GPU (compute
  capability 10.0+) and TensorRT 10.8+, MXFP8 Blackwell and TensorRT 10.12+, INT4 weight-only
  TensorRT 10.0+. ERROR when the target's GPU or version lacks them, INFO when it names no GPU.
* M03: a blocked axis whose length is not a whole number of blocks.
* M04: a block size other than the format's (NVFP4 16, MXFP8 32) or an INT4 block below 16.
* M05: a blocked DequantizeLinear whose scale does not fit its values along its axis (ONNX's
  ``DequantizeLinear``-21: the scale has the values' shape with the blocked axis divided by the
  block size). ModelOpt 0.47's INT4 export writes ``axis=0`` on a ``transB`` Gemm weight whose
  scale is blocked along axis 1: the parser rejects the node, or blocks the wrong axis.

:func:`require_kernels` refuses a target for a format with the same message, for a caller that
chooses a target for a format (``ValueError``).

Example:
    >>> from qdq.lint.target import parse_target
    >>> kernels_missing(parse_target("trt10.8-blackwell"), "nvfp4")
    ''
    >>> kernels_missing(parse_target("trt10.12-hopper"), "nvfp4")
    'NVFP4 needs a Blackwell GPU (compute capability 10.0+); trt10.12-hopper names hopper (9.0)'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from qdq.lint.findings import ERROR, INFO, WARN, Finding
from qdq.lint.formats import (
    BLOCK_FORMATS,
    DYNAMIC_QUANTIZE,
    FORMATS,
    INT4W,
    block_attrs,
    is_dequantize,
)

if TYPE_CHECKING:
    from qdq.lint.graph import LintGraph
    from qdq.lint.target import Target

__all__ = ["block_no_kernel", "check_blocks", "kernels_missing", "require_kernels"]

_SRC = (
    "NVIDIA/Model-Optimizer modelopt/torch/quantization/export_onnx.py (export_fp4, "
    "export_mxfp8, export_int4); TensorRT 10.0/10.8/10.12 release notes"
)
_MIN_INT4_BLOCK = 16


def kernels_missing(t: Target, fmt: str) -> str:
    """Why the target has no ``fmt`` kernels ('' when it has them, or may: no GPU named)."""
    row = FORMATS[fmt]
    if row.min_trt is not None and not t.at_least(*row.min_trt):
        need = ".".join(map(str, row.min_trt))
        return f"{row.label} needs TensorRT {need}+; {t.label} is TensorRT {t.version[0]}.{t.version[1]}"
    if t.runs(row.compute_capability) is False:
        need = ".".join(map(str, row.compute_capability or ()))
        have = ".".join(map(str, t.compute_capability or ()))
        return (
            f"{row.label} needs a Blackwell GPU (compute capability {need}+); {t.label} names "
            f"{t.gpu} ({have})"
        )
    return ""


def require_kernels(t: Target, fmt: str) -> None:
    """Refuse ``t`` for ``fmt`` when its TensorRT or GPU has no kernels for it.

    Raises:
        ValueError: naming the format, the target and what it lacks.

    Example:
        >>> from qdq.lint.target import parse_target
        >>> require_kernels(parse_target("trt11-b200"), "nvfp4")
        >>> require_kernels(parse_target("trt10.5-blackwell"), "nvfp4")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: target trt10.5-blackwell cannot run NVFP4: NVFP4 needs TensorRT 10.8+; ...
    """
    if fmt not in BLOCK_FORMATS:
        raise ValueError(f"{fmt!r} is no block format; choose one of {sorted(BLOCK_FORMATS)}")
    missing = kernels_missing(t, fmt)
    if missing:
        raise ValueError(f"target {t.label} cannot run {FORMATS[fmt].label}: {missing}")


def block_no_kernel(node: Any, fmt: str) -> str:
    """Why TensorRT has no ``fmt`` kernel for the weighted op ``node`` ('' when it has one or
    ``fmt`` is no block format): its block-format kernels are GEMMs only."""
    if fmt in BLOCK_FORMATS and node.op_type in ("Conv", "ConvTranspose"):
        return f"no {FORMATS[fmt].label} convolution in TensorRT"
    return ""


def check_blocks(g: LintGraph, t: Target) -> list[Finding]:
    """M01-M05 on a graph with block-format Q/DQ (none on an INT8/FP8 graph).

    Args:
        g: the indexed graph.
        t: the target (its TensorRT version and GPU decide M02).
    """
    nodes = [
        n
        for n in g.nodes
        if (is_dequantize(n) or n.op_type in DYNAMIC_QUANTIZE) and g.qdq_format(n) in BLOCK_FORMATS
    ]
    if not nodes:
        return []
    out: list[Finding] = []
    for fmt in sorted({g.qdq_format(n) for n in nodes}):
        out.extend(_target(g, t, fmt, [n for n in nodes if g.qdq_format(n) == fmt]))
    for node in g.nodes:
        if g.weighted(node) and not g.folded_node(node):
            fmt = _block_weight(g, node)
            if fmt and block_no_kernel(node, fmt):
                out.append(_conv(g, node, fmt))
    for n in nodes:
        out.extend(_blocks(g, n))
    return out


def _block_weight(g: LintGraph, node: Any) -> str:
    """The block format of a weighted op's weight DequantizeLinear ('' when none)."""
    dq = g.weight_dq(node.input[1]) if len(node.input) > 1 else None
    fmt = g.qdq_format(dq) if dq is not None else ""
    return fmt if fmt in BLOCK_FORMATS else ""


def _target(g: LintGraph, t: Target, fmt: str, nodes: list[Any]) -> list[Finding]:
    """M02: the target's TensorRT or GPU has no kernels for ``fmt``."""
    names = tuple(g.name(n) for n in nodes[:10])
    some = ", ".join(names[:3]) + (", ..." if len(nodes) > 3 else "")
    label = FORMATS[fmt].label
    missing = kernels_missing(t, fmt)
    if missing:
        return [
            Finding(
                "M02",
                ERROR,
                names,
                f"{len(nodes)} {label} node(s) ({some}) on {t.label}: {missing}",
                f"the engine does not build, or its {label} layers run without {label} kernels",
                f"target a GPU and TensorRT with {label} kernels (--target trt10.12-blackwell, "
                "trt11-b200, trt10.12-sm120), or quantize these layers INT8/FP8",
                _SRC,
            )
        ]
    if t.runs(FORMATS[fmt].compute_capability) is None:
        return [
            Finding(
                "M02",
                INFO,
                names,
                f"{len(nodes)} {label} node(s) ({some}): {label} needs a Blackwell GPU and "
                f"{t.label} names no GPU",
                "builds only on Blackwell GPUs (compute capability 10.0 and newer)",
                "name the GPU in the target (--target trt10.12-blackwell, trt11-b200, "
                "trt10.12-sm100, trt10.12-sm120) to check",
                _SRC,
            )
        ]
    return []


def _conv(g: LintGraph, node: Any, fmt: str) -> Finding:
    """M01: a block format on a convolution."""
    name, label = g.name(node), FORMATS[fmt].label
    return Finding(
        "M01",
        WARN,
        (name,),
        f"{name}: {label} weights on a {node.op_type}",
        f"TensorRT has no {label} convolution: {name} runs float behind standalone Dequantize "
        "layers, or the build fails",
        f"quantize {name} INT8 or FP8 (ModelOpt keeps convolutions out of 4-bit and MX formats)",
        _SRC,
    )


def _blocks(g: LintGraph, node: Any) -> list[Finding]:
    """M03 (blocked axis not a whole number of blocks), M04 (block size) and M05 (a scale that
    does not fit the blocked axis) on one node."""
    axis, block = block_attrs(node)
    fmt = g.qdq_format(node)
    row, name = FORMATS[fmt], g.name(node)
    out: list[Finding] = []
    if not block:
        return out
    want = row.block
    if fmt == INT4W:
        wrong = block < _MIN_INT4_BLOCK or block & (block - 1)
        want_text = f"a power of two >= {_MIN_INT4_BLOCK}"
    else:
        wrong = want is not None and block != want
        want_text = str(want)
    if wrong:
        out.append(
            Finding(
                "M04",
                WARN,
                (name,),
                f"{name}: {row.label} with blocks of {block}, not {want_text}",
                f"TensorRT's {row.label} kernels take blocks of {want_text}: the layer runs "
                "float or the build fails",
                f"quantize with blocks of {want_text}",
                _SRC,
            )
        )
    value = g.const.get(node.input[0]) if node.input else None
    if value is not None and value.ndim and -value.ndim <= axis < value.ndim:
        size = int(value.shape[axis])
        if size % block:
            out.append(
                Finding(
                    "M03",
                    ERROR,
                    (name,),
                    f"{name}: blocked axis {axis} has {size} elements, not a multiple of the "
                    f"block size {block}",
                    "TensorRT's block quantization needs whole blocks: the parser rejects it",
                    "leave this layer out of the block format, or pad its reduction axis to a "
                    f"multiple of {block}",
                    f"{_SRC}; reference/tensorrt-qdq-rules.md §1.1 (block quantization)",
                )
            )
        elif is_dequantize(node):
            out.extend(_scale_fit(g, node, value.shape, axis % value.ndim, block))
    return out


def _scale_shape(g: LintGraph, tensor: str) -> tuple[int, ...] | None:
    """The shape of a DequantizeLinear's scale: a constant, or a DequantizeLinear of one (NVFP4's
    two levels); ``None`` when it is computed."""
    value = g.const.get(tensor)
    if value is None:
        dq = g.producer.get(tensor)
        if dq is not None and is_dequantize(dq) and dq.input:
            value = g.const.get(dq.input[0])
    return None if value is None else tuple(int(d) for d in value.shape)


def _scale_fit(
    g: LintGraph, node: Any, shape: tuple[int, ...], axis: int, block: int
) -> list[Finding]:
    """M05: the scale of a blocked DequantizeLinear of values ``shape`` along ``axis``."""
    scale = _scale_shape(g, node.input[1]) if len(node.input) > 1 else None
    if scale is None:
        return []

    def want(ax: int) -> tuple[int, ...]:
        return tuple(-(-d // block) if i == ax else d for i, d in enumerate(shape))

    if scale == want(axis):
        return []
    name, label = g.name(node), FORMATS[g.qdq_format(node)].label
    fits = [ax for ax in range(len(shape)) if ax != axis and want(ax) == scale]
    hint = f" (it fits axis {fits[0]})" if fits else ""
    return [
        Finding(
            "M05",
            ERROR,
            (name,),
            f"{name}: {label} scale {list(scale)} does not fit values {list(shape)} blocked by "
            f"{block} along axis {axis} (want {list(want(axis))}){hint}",
            "the parser rejects the DequantizeLinear, or scales the wrong blocks",
            f"write axis={fits[0]}" if fits else "write the scale blocked along the node's axis",
            f"{_SRC}; ONNX DequantizeLinear-21 (blocked quantization)",
        )
    ]
