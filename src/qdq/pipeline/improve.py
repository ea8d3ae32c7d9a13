"""The PTQ switches of ``qdq quantize``: method per quantizer, AdaRound, bias correction.

Run after calibration, in that order — activation ranges first, then the weights' rounding on
those inputs, then the bias for what error remains — on the calibration batches. Each step's
report goes into ``report.json["ptq"]`` under its name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

__all__ = ["ROUNDINGS", "PtqOptions", "improver"]

ROUNDINGS = ("nearest", "adaround")


@dataclass(frozen=True)
class PtqOptions:
    """Which PTQ improvements run after calibration (all off by default).

    Attributes:
        method_per_quantizer: choose each activation quantizer's calibration method from its
            histogram by its layer's output error (:func:`qdq.ptq.methods.choose_methods`).
        rounding: ``"nearest"`` or ``"adaround"`` (:func:`qdq.ptq.adaround.adaround`).
        bias_correction: correct each weighted layer's bias (:func:`qdq.ptq.bias.correct_bias`).
        adaround_samples / adaround_iters: AdaRound's samples and iterations per layer.
    """

    method_per_quantizer: bool = False
    rounding: str = "nearest"
    bias_correction: bool = False
    adaround_samples: int = 256
    adaround_iters: int = 500

    def __post_init__(self) -> None:
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"unknown rounding {self.rounding!r}; choose one of {ROUNDINGS}")
        for name in ("adaround_samples", "adaround_iters"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")

    @property
    def active(self) -> bool:
        """Whether any step runs."""
        return self.method_per_quantizer or self.bias_correction or self.rounding != "nearest"

    def describe(self) -> str:
        """``"method per quantizer + AdaRound + bias correction"`` (``"none"`` when inactive)."""
        parts = []
        if self.method_per_quantizer:
            parts.append("method per quantizer")
        if self.rounding == "adaround":
            parts.append("AdaRound")
        if self.bias_correction:
            parts.append("bias correction")
        return " + ".join(parts) or "none"


def improver(
    options: PtqOptions, batches: list[Any], show_progress: bool
) -> tuple[Callable[[nn.Module], None], dict[str, Any]]:
    """``(improve, reports)``: ``improve(prepared)`` runs the steps; ``reports`` holds the JSON of
    the latest run of each step (a fallback search re-plans and improves again)."""
    reports: dict[str, Any] = {}

    def improve(prepared: nn.Module) -> None:
        if options.method_per_quantizer:
            from qdq.ptq.methods import choose_methods

            reports["method_per_quantizer"] = choose_methods(
                prepared, batches, show_progress=show_progress
            ).to_dict()
        if options.rounding == "adaround":
            from qdq.ptq.adaround import adaround

            rounding = adaround(
                prepared,
                batches,
                num_samples=options.adaround_samples,
                iters=options.adaround_iters,
                show_progress=show_progress,
            )
            reports["adaround"] = {"summary": rounding.summary(), **rounding.to_dict()}
        if options.bias_correction:
            from qdq.ptq.bias import correct_bias

            bias = correct_bias(prepared, batches, show_progress=show_progress)
            reports["bias_correction"] = {"summary": bias.summary(), **bias.to_dict()}

    return improve, reports
