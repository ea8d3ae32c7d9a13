"""The TensorRT version and build configuration the linter predicts for.

``"trt10"`` means a weakly typed TensorRT 10 build with ``--int8 --fp16`` (the recipe in the rule
specification §2.1); ``"trt11"`` means strongly typed TensorRT 11. A minor version
(``"trt8.6"``, ``"trt10.5"``, ``"trt10.12"``) makes the version-dependent rules exact: the
ConvTranspose weight axis (V12), pre-quantized weights (V10) and the parser's opset range (V07).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["FLAGS", "Target", "parse_target"]

FLAGS = frozenset({"int8", "fp16", "best"})
_PATTERN = re.compile(r"^trt(\d+)(?:\.(\d+))?$")
# highest ONNX opset of the bundled parser, by first release (onnx-tensorrt docs/operators.md;
# TensorRT ONNX opset guide): 8.6 -> 17, 10.0 -> 20, 11.x -> 25
_MAX_OPSET = {(8, 6): 17, (10, 0): 20, (11, 0): 25}


@dataclass(frozen=True)
class Target:
    """A TensorRT version and typing mode.

    Attributes:
        label: the target string as given (``"trt10.5"``).
        version: ``(major, minor)``; a bare major means its first release (``"trt10"`` is 10.0).
        strongly_typed: float layers run at the ONNX dtype (always on 11.x, opt-in on 10.12+).
        flags: weak-typing precision flags (``int8``, ``fp16``, ``best``); empty when strongly typed.
    """

    label: str
    version: tuple[int, int]
    strongly_typed: bool
    flags: frozenset[str]

    @property
    def float_dtype(self) -> str:
        """The precision non-INT8 layers of a float32 ONNX run in."""
        if self.strongly_typed:
            return "fp32"
        return "fp16" if self.flags & {"fp16", "best"} else "fp32"

    @property
    def max_opset(self) -> int | None:
        """The highest opset the target's ONNX parser reads, when known."""
        known = [k for k in _MAX_OPSET if k <= self.version]
        return _MAX_OPSET[max(known)] if known else None

    def at_least(self, major: int, minor: int = 0) -> bool:
        """Whether the target is TensorRT ``major.minor`` or newer."""
        return self.version >= (major, minor)


def parse_target(
    text: str | Target, *, strongly_typed: bool | None = None, flags: Iterable[str] | None = None
) -> Target:
    """Parse ``"trt<major>[.<minor>]"`` (8 to 11).

    Args:
        text: the target string (or an already parsed ``Target``, returned as is).
        strongly_typed: ``None`` for the version's default (strong on 11.x, weak before); ``True``
            on 10.12+ for ``--stronglyTyped`` builds.
        flags: weak-typing trtexec precision flags; ``None`` means ``int8`` and ``fp16``.

    Raises:
        ValueError: an unknown target, strong typing before 10.12, weak typing on 11.x, an
            unknown flag, or flags on a strongly typed build (TensorRT rejects them).
    """
    if isinstance(text, Target):
        return text
    m = _PATTERN.match(str(text).strip().lower())
    if m is None or not 8 <= int(m.group(1)) <= 11:
        raise ValueError(
            f"target must look like 'trt10', 'trt10.5', 'trt8.6' or 'trt11' "
            f"(TensorRT 8 to 11), got {text!r}"
        )
    version = (int(m.group(1)), int(m.group(2) or 0))
    strong = version >= (11, 0) if strongly_typed is None else strongly_typed
    if strong and version < (10, 12):
        raise ValueError(f"{text}: strongly typed builds need TensorRT 10.12 or newer")
    if not strong and version >= (11, 0):
        raise ValueError(f"{text}: TensorRT 11 builds are always strongly typed")
    if flags is None:
        chosen = frozenset() if strong else frozenset({"int8", "fp16"})
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
    return Target(str(text), version, strong, chosen)
