"""The TensorRT version, GPU and build configuration the linter predicts for.

``"trt10"`` means a weakly typed TensorRT 10 build with ``--int8 --fp16`` (the recipe in the rule
specification §2.1); ``"trt11"`` means strongly typed TensorRT 11. A minor version
(``"trt8.6"``, ``"trt10.5"``, ``"trt10.12"``) makes the version-dependent rules exact: the
ConvTranspose weight axis (V12), pre-quantized weights (V10) and the parser's opset range (V07).
A GPU after a dash (``"trt10-hopper"``, ``"trt10.12-ada"``, ``"trt10-sm89"``) names the compute
capability, which decides whether FP8 layers build at all (F01: 8.9 and newer) and NVFP4/MXFP8
ones (M02: Blackwell, ``"trt10.8-blackwell"``, ``"trt11-b200"``, ``"trt10.12-sm100"``,
``"trt10.12-sm120"``; :mod:`qdq.lint.blocks`). A GPU model of the
engine-time model's table (``"trt10-a100"``, ``"trt10.12-h100-sxm"``, ``"trt10-a100-80gb-pcie"``;
:mod:`qdq.lint.speed.gpus`) names its compute capability too, and the GPU the engine is timed on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from qdq.lint.speed.gpus import GPU, find_gpu

__all__ = ["FLAGS", "GPUS", "Target", "parse_target"]

FLAGS = frozenset({"int8", "fp16", "fp8", "best"})
_PATTERN = re.compile(r"^trt(\d+)(?:\.(\d+))?(?:-([a-z0-9_.-]+))?$")
#: GPU generations by compute capability (NVIDIA's CUDA GPU compute capability list): Ada (8.9),
#: Hopper (9.0) and Blackwell (10.0, 12.0) have FP8 tensor cores, the generations before do not;
#: Blackwell's have FP4 and MX tensor cores too (B200/GB200 10.0, B300/GB300 10.3, Jetson Thor
#: 11.0 in CUDA 13's numbering, RTX 50xx 12.0)
GPUS = {
    "volta": (7, 0), "turing": (7, 5), "ampere": (8, 0), "orin": (8, 7), "ada": (8, 9),
    "hopper": (9, 0), "blackwell": (10, 0), "gb200": (10, 0), "b300": (10, 3), "gb300": (10, 3),
    "thor": (11, 0), "rtx50": (12, 0),
}  # fmt: skip
_SM = re.compile(r"^sm_?(\d+)(?:\.(\d))?$")
# highest ONNX opset of the bundled parser, by first release (onnx-tensorrt docs/operators.md;
# TensorRT ONNX opset guide): 8.6 -> 17, 10.0 -> 20, 10.11 -> 23 (the 10.11 GA parser moved to
# ONNX 1.18, whose opset is 23), 11.x -> 25 (the opset guide's TensorRT 11.x row)
_MAX_OPSET = {(8, 6): 17, (10, 0): 20, (10, 11): 23, (11, 0): 25}
#: the first TensorRT that scales FP8 GEMMs per channel, by compute capability (release notes:
#: 10.6.0 "per-channel scaling for FP8 matrix multiplications on Hopper", 10.7.0 "on Ada"); no
#: other GPU is documented
_PER_CHANNEL_FP8_GEMM = {(9, 0): (10, 6), (8, 9): (10, 7)}


@dataclass(frozen=True)
class Target:
    """A TensorRT version and typing mode.

    Attributes:
        label: the target string as given (``"trt10.5"``, ``"trt10-hopper"``).
        version: ``(major, minor)``; a bare major means its first release (``"trt10"`` is 10.0).
        strongly_typed: float layers run at the ONNX dtype (always on 11.x, opt-in on 10.12+).
        flags: weak-typing precision flags (``int8``, ``fp16``, ``fp8``, ``best``); empty when
            strongly typed.
        gpu: the GPU generation (``"hopper"``), ``"sm<major><minor>"`` or the canonical name of a
            GPU model of :data:`qdq.lint.speed.gpus.GPUS` (``"a100-sxm4-40gb"``); ``None`` when
            not named.
        compute_capability: its ``(major, minor)``; ``None`` when no GPU is named.
    """

    label: str
    version: tuple[int, int]
    strongly_typed: bool
    flags: frozenset[str]
    gpu: str | None = None
    compute_capability: tuple[int, int] | None = None

    @property
    def float_dtype(self) -> str:
        """The precision non-INT8 layers of a float32 ONNX run in."""
        if self.strongly_typed:
            return "fp32"
        return "fp16" if self.flags & {"fp16", "best"} else "fp32"

    @property
    def gpu_model(self) -> GPU | None:
        """The GPU model the target names (``trt10-a100``); ``None`` for a generation, a compute
        capability or no GPU (:func:`qdq.lint.speed.gpus.gpu_for_target` picks one for those).

        Example:
            >>> parse_target("trt10-a100").gpu_model.label, parse_target("trt10-ampere").gpu_model
            ('NVIDIA A100 SXM4 40 GB', None)
        """
        if self.gpu is None or self.gpu in GPUS or _SM.match(self.gpu):
            return None
        try:
            return find_gpu(self.gpu)
        except ValueError:
            return None

    @property
    def max_opset(self) -> int | None:
        """The highest opset the target's ONNX parser reads, when known."""
        known = [k for k in _MAX_OPSET if k <= self.version]
        return _MAX_OPSET[max(known)] if known else None

    @property
    def fp8_gemm_per_channel(self) -> bool:
        """Whether the target's TensorRT builds FP8 GEMMs with per-channel weight scales (10.6+
        on Hopper, 10.7+ on Ada; ``False`` when no GPU is named).

        Example:
            >>> [parse_target(t).fp8_gemm_per_channel for t in ("trt10.6-hopper", "trt10.6-ada")]
            [True, False]
        """
        since = _PER_CHANNEL_FP8_GEMM.get(self.compute_capability or (0, 0))
        return since is not None and self.at_least(*since)

    def at_least(self, major: int, minor: int = 0) -> bool:
        """Whether the target is TensorRT ``major.minor`` or newer."""
        return self.version >= (major, minor)

    def runs(self, capability: tuple[int, int] | None) -> bool | None:
        """Whether the target's GPU has kernels needing compute ``capability`` (``None``: any GPU);
        ``None`` when the target names no GPU.

        Example:
            >>> parse_target("trt10-hopper").runs((8, 9)), parse_target("trt10-ampere").runs((8, 9))
            (True, False)
        """
        if capability is None:
            return True
        if self.compute_capability is None:
            return None
        return self.compute_capability >= capability


def parse_target(
    text: str | Target, *, strongly_typed: bool | None = None, flags: Iterable[str] | None = None
) -> Target:
    """Parse ``"trt<major>[.<minor>][-<gpu>]"`` (TensorRT 8 to 11; a generation of :data:`GPUS`,
    ``sm<cc>`` such as ``sm89``, ``sm_90``, ``sm120``, or a GPU model such as ``a100``,
    ``h100-sxm``, ``rtx3090``: ``qdq engine time --list-gpus`` lists them).

    Args:
        text: the target string (or an already parsed ``Target``, returned as is).
        strongly_typed: ``None`` for the version's default (strong on 11.x, weak before); ``True``
            on 10.12+ for ``--stronglyTyped`` builds.
        flags: weak-typing trtexec precision flags; ``None`` means ``int8`` and ``fp16``, and
            ``fp8`` too when the named GPU has FP8 (compute capability 8.9+).

    Raises:
        ValueError: an unknown target or GPU, strong typing before 10.12, weak typing on 11.x, an
            unknown flag, or flags on a strongly typed build (TensorRT rejects them).

    Example:
        >>> t = parse_target("trt10.12-hopper")
        >>> t.version, t.gpu, t.compute_capability, sorted(t.flags)
        ((10, 12), 'hopper', (9, 0), ['fp16', 'fp8', 'int8'])
    """
    if isinstance(text, Target):
        return text
    m = _PATTERN.match(str(text).strip().lower())
    if m is None or not 8 <= int(m.group(1)) <= 11:
        raise ValueError(
            f"target must look like 'trt10', 'trt10.5', 'trt8.6', 'trt11' or with a GPU "
            f"'trt10-hopper', 'trt10.12-sm89', 'trt10-a100', 'trt10.8-blackwell', 'trt11-b200' "
            f"(TensorRT 8 to 11), got {text!r}"
        )
    version = (int(m.group(1)), int(m.group(2) or 0))
    gpu, capability = _gpu(m.group(3), text)
    strong = version >= (11, 0) if strongly_typed is None else strongly_typed
    if strong and version < (10, 12):
        raise ValueError(f"{text}: strongly typed builds need TensorRT 10.12 or newer")
    if not strong and version >= (11, 0):
        raise ValueError(f"{text}: TensorRT 11 builds are always strongly typed")
    if flags is None:
        fp8 = {"fp8"} if capability is not None and capability >= (8, 9) else set()
        chosen = frozenset() if strong else frozenset({"int8", "fp16", *fp8})
    else:
        chosen = frozenset(f.strip().lower().lstrip("-") for f in flags if f.strip())
        unknown = chosen - FLAGS
        if unknown:
            raise ValueError(f"unknown build flags {sorted(unknown)}; use {sorted(FLAGS)}")
        if strong and chosen:
            raise ValueError(
                f"{text}: precision flags {sorted(chosen)} do not exist for strongly typed builds "
                "(removed in TensorRT 11; incompatible with --stronglyTyped on 10.12+)"
            )
    return Target(str(text), version, strong, chosen, gpu, capability)


def _gpu(name: str | None, text: object) -> tuple[str | None, tuple[int, int] | None]:
    """``(generation, sm form or model name, compute capability)`` of the GPU named in a target."""
    if name is None:
        return None, None
    if name in GPUS:
        return name, GPUS[name]
    m = _SM.match(name)
    if m is not None:
        digits = m.group(1)
        if m.group(2) is not None:  # sm8.9
            return name, (int(digits), int(m.group(2)))
        if len(digits) >= 2:  # sm89, sm90, sm100, sm120
            return name, (int(digits[:-1]), int(digits[-1]))
    try:
        model = find_gpu(name)
    except ValueError:
        raise ValueError(
            f"{text}: unknown GPU {name!r}; name a generation ({', '.join(GPUS)}), a compute "
            "capability (sm75, sm86, sm89, sm90, sm100, sm120) or a GPU model (a100, h100-sxm, "
            "rtx3090, l4, ...: qdq engine time --list-gpus lists the models)"
        ) from None
    return model.name, model.compute_capability
