"""What ``qdq quantize`` does around calibration to improve the INT8 model.

Before :func:`qdq.prepare`: cross-layer equalization (``--equalize``,
:func:`qdq.ptq.equalize.equalize`) of a copy of the float model; it changes float weights, so the
activation ranges are calibrated on the equalized copy.

After calibration, PTQ switches: method per quantizer, weight rounding (kernel-sum or AdaRound),
bias correction. Run in that order — activation ranges first, then the weights' rounding on
those inputs, then the bias for what error remains — on the calibration batches. Each step's
report goes into ``report.json["ptq"]`` under its name.

QAT (``--qat-epochs N``, :class:`QatOptions`): after PTQ and fallback, the model is fine-tuned by
distillation against its FP32 copy on the calibration batches (no labels needed), with
:func:`qdq.qat.finetune`; its report goes into ``report.json["qat"]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from qdq.ptq.search import recipe
from qdq.ptq.step import STEPS, step_runs

__all__ = ["ROUNDINGS", "PtqOptions", "QatOptions", "improver", "run_qat"]

ROUNDINGS = ("nearest", "kernel-sum", "adaround")


@dataclass(frozen=True)
class PtqOptions:
    """Which PTQ improvements run (all off by default).

    Attributes:
        equalize: cross-layer equalization of the float model before calibration
            (:func:`qdq.ptq.equalize.equalize`, ``alpha`` 0.5).
        method_per_quantizer: choose each activation quantizer's calibration method from its
            histogram by its layer's output error (:func:`qdq.ptq.methods.choose_methods`).
        rounding: ``"nearest"``, ``"kernel-sum"`` (data-free,
            :func:`qdq.ptq.kernel_sums.kernel_sum_rounding`) or ``"adaround"``
            (:func:`qdq.ptq.adaround.adaround`).
        bias_correction: correct each weighted layer's bias (:func:`qdq.ptq.bias.correct_bias`).
        adaround_samples / adaround_iters: AdaRound's samples and iterations per layer.
    """

    method_per_quantizer: bool = False
    rounding: str = "nearest"
    equalize: bool = False
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
        return self.equalize or self.after_calibration

    @property
    def after_calibration(self) -> bool:
        """Whether a step runs on the calibrated model (all but equalization)."""
        return self.method_per_quantizer or self.bias_correction or self.rounding != "nearest"

    @classmethod
    def from_recipe(
        cls, name: str, *, adaround_samples: int = 256, adaround_iters: int = 500
    ) -> PtqOptions:
        """The options of a recipe name (:func:`qdq.ptq.search.recipe`: ``"none"`` or parts
        such as ``"equalize+kernel-sum+bias"``), e.g. the one a recipe search kept.

        Raises:
            ValueError: not a recipe name.
        """
        steps = recipe(name).steps
        rounding = (
            "kernel-sum"
            if "kernel_sum" in steps
            else "adaround"
            if "adaround" in steps
            else "nearest"
        )
        return cls(
            method_per_quantizer="method_per_quantizer" in steps,
            rounding=rounding,
            equalize="equalize" in steps,
            bias_correction="bias_correction" in steps,
            adaround_samples=adaround_samples,
            adaround_iters=adaround_iters,
        )

    @property
    def recipe(self) -> str:
        """The recipe name of these options (``"none"``, ``"equalize+adaround+bias"``), which
        :meth:`from_recipe` turns back into them."""
        on = {
            "equalize": self.equalize,
            "method_per_quantizer": self.method_per_quantizer,
            "kernel_sum": self.rounding == "kernel-sum",
            "adaround": self.rounding == "adaround",
            "bias_correction": self.bias_correction,
        }
        return "+".join(s.part for s in STEPS if on[s.key]) or "none"

    def describe(self) -> str:
        """``"method per quantizer + AdaRound + bias correction"`` (``"none"`` when inactive)."""
        parts = ["equalization"] if self.equalize else []
        if self.method_per_quantizer:
            parts.append("method per quantizer")
        if self.rounding == "adaround":
            parts.append("AdaRound")
        elif self.rounding == "kernel-sum":
            parts.append("kernel-sum rounding")
        if self.bias_correction:
            parts.append("bias correction")
        return " + ".join(parts) or "none"


def improver(
    options: PtqOptions, batches: list[Any], show_progress: bool
) -> tuple[Callable[[nn.Module], None], dict[str, Any]]:
    """``(improve, reports)``: ``improve(prepared)`` runs the steps after calibration in pipeline
    order (:data:`qdq.ptq.step.STEPS`); ``reports`` holds each step's report
    (:meth:`~qdq.ptq.step.StepReport.to_report`) from its latest run (a fallback search re-plans
    and improves again)."""
    reports: dict[str, Any] = {}
    chosen = recipe(options.recipe).steps  # pipeline order; equalization ran before prepare
    runs = step_runs(
        batches,
        adaround_samples=options.adaround_samples,
        adaround_iters=options.adaround_iters,
        show_progress=show_progress,
    )

    def improve(prepared: nn.Module) -> None:
        for key in chosen:
            if key in runs:
                reports[key] = runs[key](prepared).to_report()

    return improve, reports


@dataclass(frozen=True)
class QatOptions:
    """Quantization-aware fine-tuning in ``qdq quantize`` (off when ``epochs`` is 0).

    Attributes:
        epochs: passes over the calibration batches.
        lr: Adam's starting learning rate (cosine decay to 1 %).
        learn_amax: ``None`` (frozen), ``"lsq"`` or ``"pact"``.
        bn: ``"freeze"``, ``"fold"`` or ``"train"`` (:func:`qdq.qat.prepare`).
        distill_output: the output term, ``"mse"`` or ``"kl"`` (logits).
    """

    epochs: int = 0
    lr: float = 1e-5
    learn_amax: str | None = None
    bn: str = "freeze"
    distill_output: str = "mse"

    def __post_init__(self) -> None:
        if isinstance(self.epochs, bool) or not isinstance(self.epochs, int) or self.epochs < 0:
            raise ValueError(f"qat epochs must be an int >= 0, got {self.epochs!r}")
        if not (isinstance(self.lr, (int, float)) and 0 < self.lr < float("inf")):
            raise ValueError(f"qat lr must be a positive number, got {self.lr!r}")
        if self.learn_amax not in (None, "lsq", "pact"):
            raise ValueError(f"learn_amax must be None, 'lsq' or 'pact', got {self.learn_amax!r}")
        if self.bn not in ("freeze", "fold", "train"):
            raise ValueError(f"bn must be 'freeze', 'fold' or 'train', got {self.bn!r}")
        if self.distill_output not in ("mse", "kl"):
            raise ValueError(f"distill_output must be 'mse' or 'kl', got {self.distill_output!r}")

    @property
    def active(self) -> bool:
        """Whether QAT runs."""
        return self.epochs > 0


def run_qat(
    prepared: nn.Module,
    batches: list[Any],
    example_inputs: tuple[Any, ...],
    options: QatOptions,
    show_progress: bool,
) -> tuple[nn.Module, dict[str, Any]]:
    """Fine-tune a copy of ``prepared``; return it and its report (``report.json["qat"]``).

    ``example_inputs``: the positional inputs of one forward (as for :func:`qdq.prepare`).
    """
    import qdq

    model = qdq.qat.prepare(
        prepared, learn_amax=options.learn_amax, bn=options.bn, example_inputs=example_inputs
    )
    result = qdq.qat.finetune(
        model,
        batches,
        epochs=options.epochs,
        lr=options.lr,
        distill_output=options.distill_output,
        show_progress=show_progress,
    )
    model.eval()
    state = qdq.qat.qat_state(model)
    report = {
        "summary": (
            f"{result.steps} steps over {options.epochs} epoch(s) on {len(batches)} calibration "
            f"batches, distillation loss {result.losses[0]:.4g} → {result.losses[-1]:.4g}"
        ),
        "epochs": options.epochs,
        "steps": result.steps,
        "lr": options.lr,
        "seconds": result.seconds,
        "seconds_per_epoch": result.seconds / options.epochs,
        "first_loss": result.losses[0],
        "last_loss": result.losses[-1],
        "losses": result.losses,
        "state": state.to_dict() if state is not None else None,
    }
    return model, report
