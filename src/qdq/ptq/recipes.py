"""A PTQ recipe (a set of steps, :func:`recipe` parses its name) and a :class:`Trial` of one in
the recipe search (:mod:`qdq.ptq.search`): plain data, below the search, its schedule
(:mod:`qdq.ptq.schedule`) and its race (:mod:`qdq.ptq.race`), which all read them."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from qdq.ptq.step import STEPS

__all__ = ["PARTS", "Recipe", "Trial", "recipe"]

#: a recipe's parts as written in its name (:attr:`qdq.ptq.step.Step.part`), and the step each
#: one runs, in pipeline order
PARTS = {s.part: s.key for s in STEPS}


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
        status: ``"scored"``, ``"scored on k of n folds (left the race)"`` (or ``(budget)``),
            ``"skipped (budget: needs ~X s, Y s left)"``, ``"stopped (budget: ...)"`` (it ran past
            the budget's end and its estimate) or ``"failed: <error>"``.
        steps: each step's one-line summary.
        folds: the folds it was scored on (:func:`search`'s ``folds``; 1: the first split only).
        iters: AdaRound's iterations, when the budget shortened them (else ``None``).
    """

    recipe: str
    score: float | None
    seconds: float
    status: str
    steps: tuple[str, ...] = ()
    folds: int = 1
    iters: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable (a non-finite score is ``null``)."""
        out = asdict(self)
        out["steps"] = list(self.steps)
        if self.score is not None and not math.isfinite(self.score):
            out["score"] = None
        return out
