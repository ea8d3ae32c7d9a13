"""The main job's arguments checked before anything runs (:func:`qdq.pipeline.quantize`): each
bad value refused with a message naming it."""

from __future__ import annotations

from qdq.config import CALIBRATION_METHODS, PLAN_FORMATS
from qdq.pipeline.improve import PtqOptions
from qdq.pipeline.recipe import SearchOptions

__all__ = [
    "block_form",
    "check_format_target",
    "check_method",
    "check_options",
    "default_target",
]

#: plan formats with block-scaled layers -> the linter's name of their format
_BLOCK_PLANS = {"nvfp4": "nvfp4", "mxfp8": "mxfp8", "int4w": "int4w"}
#: block plan formats -> the quantizer format their GEMMs get (its opset: the export's own
#: qdq.export.blocks_onnx.required_opset, in the job's block_form)
_PLAN_QUANT_FORMAT = {"nvfp4": "nvfp4", "mxfp8": "mxfp8", "int4w": "int4"}


def check_options(
    batch_size: object, max_drop: object, ptq: PtqOptions | SearchOptions | str | None
) -> PtqOptions | SearchOptions | None:
    """Check the batch size, ``max_drop`` and the PTQ recipe; return the recipe (a name parsed).

    Raises:
        ValueError: a batch size that is not a positive int, a negative or infinite
            ``max_drop``, an unknown recipe name.
        TypeError: ``ptq`` of another type.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if max_drop is not None and (
        isinstance(max_drop, bool)
        or not isinstance(max_drop, (int, float))
        or not 0 <= max_drop < float("inf")
    ):
        raise ValueError(f"max_drop must be a number >= 0 (metric units), got {max_drop!r}")
    if isinstance(ptq, str):  # a recipe name
        ptq = PtqOptions.from_recipe(ptq)
    elif ptq is not None and not isinstance(ptq, (PtqOptions, SearchOptions)):
        raise TypeError(
            "ptq must be None or a SearchOptions (the recipe search), or a recipe: its name "
            f"('kernel-sum+bias', 'none') or a PtqOptions; got {type(ptq).__name__}"
        )
    return ptq


def check_method(calib: str | None, fmt: str) -> str | None:
    """The calibration method every quantizer uses: ``calib``, else mse (INT8) or ``None`` in an
    FP8 or mixed plan (each quantizer's own: max for FP8 layers, mse for INT8 ones).

    Example:
        >>> check_method(None, "int8"), check_method(None, "fp8"), check_method("max", "fp8")
        ('mse', None, 'max')

    Raises:
        ValueError: an unknown format or method, or entropy with FP8.
    """
    if fmt not in PLAN_FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(PLAN_FORMATS)}")
    if calib is not None and calib not in CALIBRATION_METHODS:
        raise ValueError(
            f"unknown calibration method {calib!r}; choose one of {', '.join(CALIBRATION_METHODS)}"
        )
    if calib in ("entropy", "mse") and fmt in _BLOCK_PLANS:
        raise ValueError(
            f"calib={calib!r} optimises a per-tensor grid; a {fmt} plan's block scales are the "
            "blocks' own and its activations calibrate their per-tensor amax by max (ModelOpt's "
            "recipe): use max or percentile, or leave the method to each quantizer"
        )
    if calib == "entropy" and fmt != "int8":
        raise ValueError(
            "calib='entropy' is TensorRT's procedure on INT8's 127 levels and has no FP8 meaning; "
            f"use max (TensorRT's FP8 recipes), mse or percentile with format={fmt!r}"
        )
    if calib is None:  # an FP8 plan: each quantizer's own method (max for FP8, mse for INT8)
        calib = "mse" if fmt == "int8" else None
    return calib


def default_target(fmt: str) -> str:
    """The linter's target when the job names none: ``trt10``; for NVFP4 and MXFP8 a Blackwell
    GPU with TensorRT 10.12, the first release with both kernels (FP4 from 10.8, MX from 10.12;
    a parser reading opset 23 from 10.11): MXFP8 is exported there in TensorRT's form
    (:func:`block_form`: ``TRT_MXFP8DequantizeLinear`` of UINT8 exponents, opset 19), as
    TensorRT Model Optimizer exports it, since ONNX's own (FLOAT8E8M0 scales, opset 24) needs
    TensorRT 11's parser; a weakly typed build as the FP8 and NVFP4 defaults. For INT4
    weight-only TensorRT 10.12 (kernels from 10.0, opset 21 read from 10.11).

    Example:
        >>> [default_target(f) for f in ("int8", "nvfp4", "mxfp8", "int4w")]
        ['trt10', 'trt10.12-blackwell', 'trt10.12-blackwell', 'trt10.12']
    """
    if fmt in ("nvfp4", "mxfp8"):
        return "trt10.12-blackwell"
    if fmt == "int4w":  # INT4 kernels from 10.0, a parser reading opset 21 from 10.11
        return "trt10.12"
    return "trt10"


def check_format_target(fmt: str, target: str) -> tuple[str, ...] | None:
    """Check that the linter's ``target`` can build a ``fmt`` plan; return the weak-typing build
    flags the job lints with (``None``: the target's own).

    An FP8 or mixed plan needs a GPU of compute capability 8.9+ (Ada, Hopper, Blackwell) and a
    TensorRT whose ONNX parser reads opset 19 (FP8 ``QuantizeLinear``): 10.0 or newer. A weakly
    typed target that names no GPU (``trt10``) lints with ``--fp8`` added to its flags: an FP8
    export is built with it (``trtexec --int8 --fp16 --fp8``), and without it every FP8 job
    would warn F07 about a build nobody should run.

    Example:
        >>> check_format_target("int8", "trt10"), check_format_target("fp8", "trt10")
        (None, ('fp16', 'int8', 'fp8'))

    A block-format plan (``nvfp4``, ``mxfp8``, ``int4w``) needs the target's kernels: NVFP4 a
    Blackwell GPU and TensorRT 10.8+, MXFP8 Blackwell and 10.12+, INT4 weight-only TensorRT 10.0+
    (the linter's rule M02, :func:`qdq.lint.blocks.require_kernels`); its convolutions and
    attention run FP8, so NVFP4 and MXFP8 plans lint with ``--fp8`` too on a weakly typed target.
    MXFP8 is exported in TensorRT's form where the target's parser cannot read opset 24
    (:func:`block_form`), so TensorRT 10.12+ on Blackwell builds it.

    Raises:
        ValueError: FP8 or mixed with a target whose GPU has no FP8, or whose parser predates
            opset 19; a block format on a target without its kernels.
    """
    from qdq.lint import parse_target

    t = parse_target(target)
    if fmt == "int8":
        return None
    if fmt in _BLOCK_PLANS:
        return _check_block_target(fmt, target)
    if t.runs((8, 9)) is False:
        have = ".".join(map(str, t.compute_capability or ()))
        raise ValueError(
            f"format={fmt!r} needs FP8 tensor cores (compute capability 8.9+: Ada, Hopper, "
            f"Blackwell); target {target!r} is {t.gpu} ({have}): use format='int8', or a target "
            "naming an FP8 GPU (trt10-ada, trt10-hopper, trt10-blackwell)"
        )
    if t.max_opset is not None and t.max_opset < 19:
        raise ValueError(
            f"format={fmt!r} exports FP8 Q/DQ at opset 19, which the ONNX parser of target "
            f"{target!r} does not read (it reads up to opset {t.max_opset}): target TensorRT 10 "
            "or newer (trt10, trt10-hopper)"
        )
    if t.strongly_typed or t.flags & {"fp8", "best"}:
        return None
    return (*sorted(t.flags), "fp8")


def block_form(fmt: str, target: str) -> str:
    """The form the job exports MXFP8 in for ``target`` (``export_onnx(block_form=...)``):
    ``"trt"`` (TensorRT's ``TRT_MXFP8DequantizeLinear`` of UINT8 exponents, opset 19) for an
    MXFP8 plan whose target's ONNX parser cannot read opset 24 (TensorRT 10.12..10.x), else
    ``"onnx"`` (ONNX's ``FLOAT8E8M0`` ``DequantizeLinear``, opset 24: TensorRT 11+, or a target
    whose parser's opsets are unknown). Other formats have one form: ``"onnx"``.

    Example:
        >>> block_form("mxfp8", "trt10.12-blackwell"), block_form("mxfp8", "trt11-b200")
        ('trt', 'onnx')
        >>> block_form("nvfp4", "trt10.12-blackwell")
        'onnx'
    """
    from qdq.export.blocks_trt import form_for
    from qdq.lint import parse_target

    return form_for(fmt, parse_target(target).max_opset)


def _check_block_target(fmt: str, target: str) -> tuple[str, ...] | None:
    """:func:`check_format_target` for a block-format plan."""
    from qdq.lint import parse_target
    from qdq.lint.blocks import require_kernels

    t = parse_target(target)
    try:
        require_kernels(t, _BLOCK_PLANS[fmt])
    except ValueError as err:
        raise ValueError(
            f"format={fmt!r}: {err}; choose a target that has them (trt10.12-blackwell, "
            "trt10.12-b200, trt11-b200) or another format"
        ) from None
    from qdq.export.blocks_onnx import required_opset

    need = required_opset({_PLAN_QUANT_FORMAT[fmt]}, block_form(fmt, target))[0]
    if t.max_opset is not None and t.max_opset < need:
        raise ValueError(
            f"format={fmt!r} exports its block DequantizeLinear at opset {need} (the first whose "
            f"types it needs), which the ONNX parser of target {target!r} does not read (it reads "
            f"up to opset {t.max_opset}): target TensorRT 10.11 or newer (trt10.12-blackwell, "
            "trt11-b200)"
        )
    if fmt == "int4w" or t.strongly_typed or t.flags & {"fp8", "best"}:
        return None
    return (*sorted(t.flags), "fp8")
