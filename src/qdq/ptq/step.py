"""One shape for the PTQ steps (issue 33): what a step needs, what it changes, its report rows.

Every step is a function that changes a model in place (or returns an improved copy of the float
model, for equalization) and returns a :class:`StepReport`. The reports are frozen dataclasses
with ``rows`` (one per layer, pair or quantizer, each with ``to_dict``) and ``notes``. They share
the JSON and text plumbing here, so each step declares only its own parts:

* :attr:`StepReport.key`: its key in ``report.json["ptq"]`` and in the HTML report;
* :meth:`StepReport.fields`: the report-level settings written before the rows;
* :attr:`StepReport.columns`: the text table, as a header and a cell per column;
* :meth:`StepReport.summary`: one line.

:data:`STEPS` lists the steps in pipeline order, each as a :class:`Step` saying what it needs and
what it changes. ``qdq quantize``'s switches (:mod:`qdq.pipeline.improve`), the HTML report and the
recipe search all go through it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from qdq.ptq.report import StepReport

__all__ = ["STEPS", "Step", "StepReport", "step", "step_runs"]


@dataclass(frozen=True)
class Step:
    """A PTQ step as the pipeline and the recipe search see it.

    Attributes:
        key: its key in ``report.json["ptq"]`` (:attr:`StepReport.key`).
        label: its name in the CLI's and the report's text (``"AdaRound"``).
        part: its name in a recipe (``"adaround"``; :func:`qdq.ptq.search.recipe`).
        needs: what it runs on.
        changes: what it changes in the model.
        data_free: whether it runs without calibration batches.
    """

    key: str
    label: str
    part: str
    needs: str
    changes: str
    data_free: bool = False


#: The PTQ steps in pipeline order: equalization changes the float model before calibration, then
#: the activation ranges are chosen, then the weights' rounding on those inputs, then the bias
#: for what error remains.
STEPS: tuple[Step, ...] = (
    Step(
        "equalize",
        "cross-layer equalization",
        "equalize",
        needs="the float model and calibration batches (before qdq.prepare)",
        changes="a copy of the float model: weights rescaled per channel between layer pairs",
    ),
    Step(
        "method_per_quantizer",
        "method per quantizer",
        "method",
        needs="a calibrated model and calibration batches",
        changes="each activation quantizer's calibration method (its amax)",
    ),
    Step(
        "kernel_sum",
        "kernel-sum rounding",
        "kernel-sum",
        needs="a calibrated model",
        changes="the weights' INT8 codes (each by at most one step)",
        data_free=True,
    ),
    Step(
        "adaround",
        "AdaRound",
        "adaround",
        needs="a calibrated model and calibration batches",
        changes="the weights' INT8 codes (each by at most one step)",
    ),
    Step(
        "bias_correction",
        "bias correction",
        "bias",
        needs="a calibrated model and calibration batches",
        changes="the weighted layers' biases in the INT8 model",
    ),
)


def step(key: str) -> Step:
    """The :class:`Step` with ``key``.

    Raises:
        KeyError: no such step (the message lists them).
    """
    for s in STEPS:
        if s.key == key:
            return s
    raise KeyError(f"no PTQ step {key!r}; the steps are {[s.key for s in STEPS]}")


def step_runs(
    batches: list[Any],
    *,
    adaround_samples: int = 256,
    adaround_iters: int = 500,
    show_progress: bool = False,
) -> dict[str, Callable[[Any], StepReport]]:
    """Each step after calibration (every key of :data:`STEPS` but ``equalize``, which changes
    the float model before :func:`qdq.prepare`) as ``run(prepared) -> report``, in place on a
    calibrated model, on ``batches``. The pipeline's switches and the recipe search both run
    the steps through this."""
    from qdq.ptq.adaround import adaround
    from qdq.ptq.bias import correct_bias
    from qdq.ptq.kernel_sums import kernel_sum_rounding
    from qdq.ptq.methods import choose_methods

    return {
        "method_per_quantizer": lambda p: choose_methods(p, batches, show_progress=show_progress),
        "kernel_sum": lambda p: kernel_sum_rounding(p, batches),
        "adaround": lambda p: adaround(
            p,
            batches,
            num_samples=adaround_samples,
            iters=adaround_iters,
            show_progress=show_progress,
        ),
        "bias_correction": lambda p: correct_bias(p, batches, show_progress=show_progress),
    }
