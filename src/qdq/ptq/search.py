"""Recipe search (issue 33): which PTQ steps help this model, chosen by measurement.

The best set of PTQ steps differs per model (docs/ptq.md): EfficientNet-Lite0 gains most from
kernel-sum rounding and bias correction, MTCNN RNet from equalization and AdaRound, Fashion-MNIST
from none. :func:`search` tries candidate recipes on a held-out part of the calibration data and
keeps the best:

1. the float model is prepared and calibrated once (once more, on its equalized copy, for the
   recipes that equalize): every candidate starts from a copy of that calibrated model, so the
   one calibration collection serves them all;
2. each candidate runs its steps (:data:`qdq.ptq.step.STEPS`, in pipeline order) on the
   calibration batches and is scored on the held-out batches: by ``score(model)`` when given
   (a task metric, higher is better), else by the mean cosine similarity of its outputs with the
   FP32 model's, sample by sample;
3. the kept recipe has the best score; a simpler recipe (fewer steps) within ``tie`` of it wins
   over it, so that a step stays only where it measurably helps.

The held-out batches must not be the evaluation samples the results are published on: the
figure that decides is never the figure that is reported. Candidates run in the order given
(:data:`CANDIDATES` by default), and once ``budget`` seconds have passed the rest are listed as
skipped (the candidate running when the budget runs out finishes).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from qdq._modes import eval_no_grad
from qdq._progress import progress
from qdq.calib.batches import expected_inputs, run_batch
from qdq.ptq.step import STEPS, StepReport, step_runs

__all__ = ["CANDIDATES", "Recipe", "SearchResult", "Trial", "recipe", "search"]

#: a recipe's parts as written in its name (:attr:`qdq.ptq.step.Step.part`), and the step each
#: one runs, in pipeline order
PARTS = {s.part: s.key for s in STEPS}

#: the candidates :func:`search` tries by default: the data-free rounding first, then by the gain
#: measured per second on the zoo (docs/ptq.md) — kernel-sum + bias before bias alone, whose cost
#: is the same (bias correction dominates it: 279 s of 292 on EfficientNet-Lite0 at 224², where
#: the search's budget then stopped before kernel-sum + bias, the zoo's best there) — AdaRound last
CANDIDATES: tuple[str, ...] = (
    "none",
    "kernel-sum",
    "kernel-sum+bias",
    "bias",
    "method",
    "method+kernel-sum+bias",
    "equalize",
    "equalize+kernel-sum+bias",
    "adaround",
    "adaround+bias",
    "equalize+adaround",
    "equalize+adaround+bias",
)


@dataclass(frozen=True)
class Recipe:
    """A set of PTQ steps.

    Attributes:
        name: ``"none"`` or its parts joined by ``+`` in pipeline order
            (``"equalize+kernel-sum+bias"``).
        steps: the step keys (:data:`qdq.ptq.step.STEPS`), in pipeline order.
    """

    name: str
    steps: tuple[str, ...]

    @property
    def equalize(self) -> bool:
        """Whether the float model is equalized before calibration."""
        return "equalize" in self.steps


def recipe(name: str) -> Recipe:
    """Parse a recipe name: ``"none"`` or parts of :data:`PARTS` joined by ``+``, in any order.

    Raises:
        ValueError: an unknown part, a repeated one, or both roundings.

    Example:
        >>> recipe("bias+kernel-sum")
        Recipe(name='kernel-sum+bias', steps=('kernel_sum', 'bias_correction'))
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(
            f"a recipe is 'none' or parts of {list(PARTS)} joined by '+', got {name!r}"
        )
    if name.strip() == "none":
        return Recipe("none", ())
    parts = [p.strip() for p in name.split("+")]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise ValueError(
            f"unknown recipe part(s) {unknown} in {name!r}; the parts are {list(PARTS)}"
        )
    if len(set(parts)) != len(parts):
        raise ValueError(f"recipe {name!r} names a part twice")
    if {"kernel-sum", "adaround"} <= set(parts):
        raise ValueError(f"recipe {name!r}: kernel-sum and adaround are two roundings, pick one")
    chosen = [s for s in STEPS if s.part in parts]  # pipeline order
    return Recipe("+".join(s.part for s in chosen), tuple(s.key for s in chosen))


@dataclass(frozen=True)
class Trial:
    """One candidate of the search.

    Attributes:
        recipe: its name.
        score: its held-out score (higher is better); ``None`` when it did not run.
        seconds: the time its steps and its scoring took (the shared calibrations not counted).
        status: ``"scored"``, ``"skipped (budget)"`` or ``"failed: <error>"``.
        steps: each step's one-line summary.
    """

    recipe: str
    score: float | None
    seconds: float
    status: str
    steps: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable (a non-finite score is ``null``)."""
        out = asdict(self)
        out["steps"] = list(self.steps)
        if self.score is not None and not math.isfinite(self.score):
            out["score"] = None
        return out


@dataclass(frozen=True)
class SearchResult(StepReport):
    """What :func:`search` did: one row per candidate, in the order tried.

    Attributes:
        rows: the trials.
        kept: the recipe kept.
        reason: why it was kept.
        score_name: what the score is (``"output cosine"`` or the caller's name).
        budget: the time budget in seconds; ``calibration_seconds``: one prepare + calibrate.
        held_out: held-out batches scored on.
        model: the kept prepared model (calibrated, its steps applied); not in the JSON.
    """

    rows: tuple[Trial, ...]
    kept: Recipe
    reason: str
    score_name: str
    budget: float
    calibration_seconds: float
    held_out: int
    model: nn.Module | None = field(default=None, repr=False, compare=False)
    notes: tuple[str, ...] = ()

    key: ClassVar[str] = "recipe_search"
    columns: ClassVar[tuple[tuple[str, Callable[[Any], str]], ...]] = (
        ("recipe", lambda t: t.recipe),
        ("score", lambda t: "-" if t.score is None else f"{t.score:.6f}"),
        ("seconds", lambda t: f"{t.seconds:.1f}"),
        ("status", lambda t: t.status),
    )

    def summary(self) -> str:
        """One line: the recipe kept, its score, and how many were tried."""
        scored = [t for t in self.rows if t.score is not None]
        best = next((t for t in scored if t.recipe == self.kept.name), None)
        value = "-" if best is None else f"{best.score:.6f}"
        return (
            f"recipe search: kept {self.kept.name} ({self.score_name} {value} on {self.held_out} "
            f"held-out batches) of {len(scored)} scored / {len(self.rows)} candidates"
        )

    def fields(self) -> dict[str, Any]:
        """The recipe kept and why, the score, the budget and the data."""
        return {
            "kept": self.kept.name,
            "steps": list(self.kept.steps),
            "reason": self.reason,
            "score": self.score_name,
            "budget_seconds": self.budget,
            "calibration_seconds": self.calibration_seconds,
            "held_out_batches": self.held_out,
        }

    def flag(self, row: Trial) -> str:
        """The kept row is marked."""
        return "  <- kept" if row.recipe == self.kept.name else ""


def search(
    model: nn.Module,
    example_inputs: Sequence[Any],
    calib_data: Iterable[Any],
    held_out: Iterable[Any],
    *,
    score: Callable[[nn.Module], float] | None = None,
    score_name: str = "score",
    method: str = "mse",
    config: Any = None,
    candidates: Sequence[str] = CANDIDATES,
    budget: float | None = None,
    tie: float = 1e-4,
    adaround_samples: int = 256,
    adaround_iters: int = 500,
    show_progress: bool = False,
) -> SearchResult:
    """Try PTQ recipes and keep the best on held-out data (module docstring).

    Args:
        model: the float model (never modified).
        example_inputs: positional inputs for one forward (as for :func:`qdq.prepare`).
        calib_data: calibration batches (as :func:`qdq.calibrate` takes them).
        held_out: batches to score on, none of them calibration or evaluation samples.
        score: ``score(prepared) -> float``, higher is better (default: the mean cosine
            similarity of the first output tensor with the FP32 model's, per sample, on
            ``held_out``); ``score_name`` names it in the report.
        method: the calibration method (:func:`qdq.calibrate`).
        config: the :class:`qdq.QuantConfig` for :func:`qdq.prepare`.
        candidates: recipe names (:func:`recipe`), tried in this order.
        budget: seconds for the candidates (default: 10 × one prepare + calibrate, at least 30).
            The first candidate always runs; the rest are skipped once the budget is spent.
        tie: a recipe with fewer steps within ``tie`` of the best score is kept instead.
        adaround_samples / adaround_iters: AdaRound's settings (:func:`qdq.ptq.adaround.adaround`).

    Raises:
        ValueError: no candidates, an unknown recipe, empty calibration or held-out data, or a
            negative ``budget`` / ``tie``.

    Example:
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU()).eval()
        >>> data = [torch.randn(4, 3, 8, 8) for _ in range(3)]
        >>> found = search(net, (data[0][:1],), data[:2], data[2:], candidates=("none", "bias"))
        >>> found.kept.name in ("none", "bias")
        True
    """
    import qdq

    recipes = [recipe(c) for c in candidates]
    if not recipes:
        raise ValueError("search needs at least one candidate recipe")
    calib, held = list(calib_data), list(held_out)
    if not calib or not held:
        raise ValueError("search needs calibration batches and held-out batches (neither empty)")
    if (budget is not None and budget < 0) or tie < 0:
        raise ValueError(f"budget and tie must be >= 0, got budget={budget!r}, tie={tie!r}")
    if score is None:
        score, score_name = _output_cosine(model, held), "output cosine"
    bases: dict[bool, nn.Module] = {}
    seconds: list[float] = []

    def base(equalized: bool) -> nn.Module:
        if equalized not in bases:
            start = time.perf_counter()
            float_model = model
            if equalized:
                from qdq.ptq.equalize import equalize

                float_model = equalize(model, example_inputs, calib).model
            prepared = qdq.prepare(float_model, example_inputs, config)
            qdq.calibrate(prepared, calib, method=method, show_progress=False)
            bases[equalized] = prepared
            seconds.append(time.perf_counter() - start)
        return bases[equalized]

    base(False)
    limit = budget if budget is not None else max(30.0, 10 * seconds[0])
    spent = 0.0
    trials: list[Trial] = []
    best: tuple[float, str, nn.Module] | None = None  # the first best score, its recipe and model
    runs = step_runs(calib, adaround_samples=adaround_samples, adaround_iters=adaround_iters)
    for r in progress(recipes, total=len(recipes), desc="recipe search", enabled=show_progress):
        if trials and spent > limit:
            trials.append(Trial(r.name, None, 0.0, "skipped (budget)"))
            continue
        start = time.perf_counter()
        value: float | None = None
        summaries: tuple[str, ...] = ()
        try:
            prepared = copy.deepcopy(base(r.equalize))
            summaries = tuple(runs[s](prepared).summary() for s in r.steps if s != "equalize")
            value, status = float(score(prepared)), "scored"
        except Exception as err:  # a failing candidate is a row, not the end of the search
            status = f"failed: {type(err).__name__}: {err}"[:300]
        took = time.perf_counter() - start
        spent += took
        trials.append(Trial(r.name, value, took, status, summaries))
        if value is not None and math.isfinite(value) and (best is None or value > best[0]):
            best = (value, r.name, prepared)
    kept, reason = _choose(trials, recipes, tie)
    # only the best-scoring model was kept: a simpler recipe chosen over it is made again
    kept_model = (
        best[2] if best is not None and best[1] == kept.name else _rebuild(kept, base, runs)
    )
    return SearchResult(
        rows=tuple(trials),
        kept=kept,
        reason=reason,
        score_name=score_name,
        budget=float(limit),
        calibration_seconds=seconds[0],
        held_out=len(held),
        model=kept_model,
    )


def _choose(trials: list[Trial], recipes: list[Recipe], tie: float) -> tuple[Recipe, str]:
    """The best-scoring recipe, or a simpler one within ``tie`` of it; and why."""
    by_name = {r.name: r for r in recipes}
    scored = [t for t in trials if t.score is not None and math.isfinite(t.score)]
    if not scored:
        first = recipes[0]
        return first, f"no candidate could be scored; kept the first, {first.name}"
    top = max(scored, key=lambda t: t.score or 0.0)
    assert top.score is not None
    close = [t for t in scored if (t.score or 0.0) >= top.score - tie]
    simplest = min(close, key=lambda t: (len(by_name[t.recipe].steps), trials.index(t)))
    if simplest.recipe == top.recipe:
        return by_name[top.recipe], f"the best held-out score ({top.score:.6f})"
    return by_name[simplest.recipe], (
        f"within {tie:g} of the best held-out score ({top.recipe}: {top.score:.6f}) with fewer "
        f"steps ({simplest.score:.6f})"
    )


def _rebuild(
    kept: Recipe,
    base: Callable[[bool], nn.Module],
    runs: dict[str, Callable[[nn.Module], StepReport]],
) -> nn.Module:
    """The kept recipe's model, made again (the search keeps only the best-scoring one)."""
    prepared = copy.deepcopy(base(kept.equalize))
    for s in kept.steps:
        if s != "equalize":
            runs[s](prepared)
    return prepared


def _first_float(output: Any) -> torch.Tensor:
    leaves = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor)]
    floats = [t for t in leaves if t.is_floating_point()]
    if not floats:
        raise ValueError("the model's output holds no floating-point tensor to score")
    return floats[0]


def _output_cosine(model: nn.Module, held: list[Any]) -> Callable[[nn.Module], float]:
    """``score(prepared)``: the mean per-sample cosine similarity of the first float output with
    the FP32 model's, over the held-out batches (the FP32 outputs computed once)."""

    def outputs(m: nn.Module) -> list[torch.Tensor]:
        expected = expected_inputs(m)
        out = []
        with eval_no_grad(m):
            for i, batch in enumerate(held):
                t = _first_float(run_batch(m, batch, i, expected)).detach().float()
                out.append(t.flatten(1) if t.dim() > 1 else t.reshape(1, -1))
        return out

    reference = outputs(model)

    def cosine(prepared: nn.Module) -> float:
        sims = [
            torch.nn.functional.cosine_similarity(got, ref, dim=1, eps=1e-12)
            for got, ref in zip(outputs(prepared), reference, strict=True)
        ]
        return float(torch.cat(sims).mean())

    return cosine
