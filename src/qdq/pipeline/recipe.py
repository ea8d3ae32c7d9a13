"""Calibration and the PTQ recipe in ``qdq quantize``: given, or found by the recipe search.

:func:`calibrate_and_improve` is the main job's stages from the float model to the calibrated,
improved INT8 model: equalization (when the recipe has it) → capture + plan → calibrate → the
recipe's steps after calibration, or the recipe search (the default, issue 33).

Unless a recipe is given (``--recipe NAME``, a PTQ switch, or a :class:`~qdq.pipeline.PtqOptions`),
``qdq quantize`` holds out a quarter of the calibration samples, drawn at random (:class:`SearchOptions`),
calibrates on the rest, and lets :func:`qdq.ptq.search.search` try the candidate recipes on the
held-out samples. The kept recipe then runs once more on every calibration sample (the ``refit``
stage; :attr:`SearchOptions.refit`), and that model is exported; its recipe is recorded in ``report.json``
(``ptq.recipe``, the table under ``ptq.recipe_search``), the manifest (``ptq``) and the HTML
report. The evaluation samples are never used to choose: the figure that decides is never the
one published.

The held-out score compares with the FP32 model, since calibration samples carry no labels: the
per-sample output cosine averaged over the output tensors, or, for a detector that returns
per-image detection lists, the detection F1 against FP32's detections.

The search does not run (the report says why, and the recipe is ``none``) with fewer than
:data:`MIN_SAMPLES` calibration samples, or under ``torchrun`` (the ranks would each have to
choose the same recipe: give ``--recipe``, e.g. the one a single-process run kept).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from qdq.calib.parts import CalibrationParts
from qdq.config import QuantConfig
from qdq.pipeline.budget import Budget
from qdq.pipeline.device import to_device
from qdq.pipeline.formats import method_label, plan_format
from qdq.pipeline.improve import PtqOptions, improver
from qdq.pipeline.inputs import ForwardInputs, Inputs, batches, num_samples, take
from qdq.pipeline.stages import Stages
from qdq.pipeline.timing import TIMED, per_sample
from qdq.ptq.counts import batch_of, count_macs, nominal_forward
from qdq.ptq.search import CANDIDATES, Fold, SearchResult, recipe, search
from qdq.qat import distributed as dist

__all__ = [
    "MIN_SAMPLES",
    "Calibrated",
    "SearchOptions",
    "calibrate_and_improve",
    "held_out_folds",
    "held_out_parts",
    "held_out_split",
    "run_search",
    "skipped",
]

#: the fewest calibration samples the search splits (below, the recipe is ``none``)
MIN_SAMPLES = 8
#: the seed of the draw of the held-out samples (:func:`held_out_split`)
HELD_OUT_SEED = 0


def float_model_of(model: nn.Module, equalized: Any) -> nn.Module:
    """The float model that gets quantized (the equalized copy when there is one)."""
    return model if equalized is None else equalized.model


def num_samples_of(example: tuple[Any, ...]) -> int:
    """Samples in one forward's positional inputs."""
    from qdq.calib.batches import batch_samples

    return batch_samples(example)


@dataclass(frozen=True)
class SearchOptions:
    """The recipe search of ``qdq quantize`` (its default when no recipe is given).

    Attributes:
        budget: at most these seconds for the search (``--search-budget``; ``None``: no clock
            of its own). The clock stops work: a result it cut says so (``budget.clock``).
        candidates: the recipe names tried, in order (:data:`qdq.ptq.search.CANDIDATES`).
        held_out: the share of the calibration samples held out to score on (a seeded draw:
            :func:`held_out_split`).
        folds: how many disjoint held-out shares the search may score on (cross-fitting,
            :func:`held_out_folds`; at most ``1 / held_out``): the candidates still in contention
            after the first are calibrated without, and scored on, each further share in turn,
            each share with ``budget`` seconds again. 1: the first share only.
        refit: run the kept recipe once more on every calibration sample, the held-out ones
            included, and export that model (``False``: export the searched model, calibrated
            without the held-out samples; saves one calibration and the recipe's steps).
        adaround_samples / adaround_iters: AdaRound's settings for the candidates with it.

    Example:
        >>> SearchOptions(budget=120).held_out
        0.25
    """

    budget: float | None = None
    candidates: tuple[str, ...] = CANDIDATES
    held_out: float = 0.25
    refit: bool = True
    folds: int = 4
    adaround_samples: int = 256
    adaround_iters: int = 500

    def __post_init__(self) -> None:
        b = self.budget
        if b is not None and (
            isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 <= b < math.inf
        ):
            raise ValueError(f"search budget must be a number of seconds >= 0, got {b!r}")
        if isinstance(self.candidates, str) or not self.candidates:
            raise ValueError(
                f"candidates must be a non-empty sequence of recipe names, got {self.candidates!r}"
            )
        object.__setattr__(self, "candidates", tuple(recipe(c).name for c in self.candidates))
        if not isinstance(self.refit, bool):
            raise ValueError(f"refit must be True or False, got {self.refit!r}")
        h = self.held_out
        if isinstance(h, bool) or not isinstance(h, (int, float)) or not 0 < h < 1:
            raise ValueError(f"held_out must be a share strictly between 0 and 1, got {h!r}")
        f = self.folds
        if isinstance(f, bool) or not isinstance(f, int) or f < 1:
            raise ValueError(f"folds must be an int >= 1, got {f!r}")
        for name in ("adaround_samples", "adaround_iters"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")


def held_out_split(cal: Inputs, options: SearchOptions) -> tuple[Inputs, Inputs | None, str]:
    """``(fit, held, why)``: the calibration samples the search calibrates on and the ones it
    scores on (``options.held_out`` of them, at least one, drawn by a permutation seeded with
    :data:`HELD_OUT_SEED`; both keep the samples' order); ``held`` is ``None`` when there are
    too few samples to split, and ``why`` then says so."""
    n = num_samples(cal)
    if n < MIN_SAMPLES:
        return (
            cal,
            None,
            (
                f"not run: {n} calibration sample(s), the search needs at least {MIN_SAMPLES} to hold "
                "some out (give more with --calib-samples, or a recipe with --recipe)"
            ),
        )
    fit, held = held_out_folds(cal, options)[0]
    return fit, held, ""


def held_out_folds(cal: Inputs, options: SearchOptions) -> list[tuple[Inputs, Inputs]]:
    """``(fit, held)`` per fold (``options.folds`` of them, ``n ≥ MIN_SAMPLES`` samples): fold
    ``k`` holds out the ``k``-th share of ``options.held_out`` of the samples in the order of a
    permutation seeded with :data:`HELD_OUT_SEED` (disjoint shares, at least one sample each)
    and fits on the rest; both keep the samples' order."""
    parts = _part_indices(cal, options)
    out = []
    for k in range(len(parts) - 1):
        rest = torch.cat([p for i, p in enumerate(parts) if i != k])
        out.append((take(cal, rest.sort().values), take(cal, parts[k])))
    return out


def held_out_parts(cal: Inputs, options: SearchOptions) -> list[Inputs]:
    """The calibration samples in the parts the folds are made of: each fold's held-out share
    (:func:`held_out_folds`), then the samples no fold holds out (possibly none); fold ``k``
    fits on every part but the ``k``-th."""
    return [take(cal, p) for p in _part_indices(cal, options)]


def _part_indices(cal: Inputs, options: SearchOptions) -> list[torch.Tensor]:
    n = num_samples(cal)
    held = min(n - 1, max(1, round(n * options.held_out)))
    # a seeded draw, not the last samples: calibration data is often ordered (by class, by
    # source file), and the last quarter of MTCNN's crops (faces first) held out non-faces only,
    # which ranked the recipes unlike the evaluation crops did
    order = torch.randperm(n, generator=torch.Generator().manual_seed(HELD_OUT_SEED))
    folds = min(options.folds, n // held)
    parts = [order[k * held : (k + 1) * held].sort().values for k in range(folds)]
    return [*parts, order[folds * held :].sort().values]


def skipped(why: str) -> dict[str, Any]:
    """``report.json["ptq"]["recipe_search"]`` of a search that did not run."""
    return {"summary": f"recipe search {why}", "kept": "none", "steps": [], "reason": why,
            "rows": [], "notes": [why]}  # fmt: skip


def run_search(
    float_model: nn.Module,
    example: tuple[Any, ...],
    calibrated: nn.Module,
    calib_batches: list[Any],
    held: Inputs,
    *,
    inputs: ForwardInputs,
    size: int,
    static: bool,
    device: torch.device,
    method: str | None,
    percentile: float | None,
    seconds: float,
    options: SearchOptions,
    per_image: tuple[str, ...] | None,
    show_progress: bool,
    folds: list[tuple[Inputs, Inputs, Callable[[], nn.Module] | None]] | None = None,
    budget: float | None = None,
    refit: float = 0.0,
    forward: float | None = None,
    config: QuantConfig | None = None,
    work: float | None = None,
    ceiling: float | None = None,
    macs: int | None = None,
) -> SearchResult:
    """Search the recipe of ``calibrated`` (``float_model`` prepared and calibrated on
    ``calib_batches`` in ``seconds``) on the held-out samples ``held``, then, for the candidates
    still in contention, on each further ``(fit, held, calibrated)`` of ``folds``
    (``calibrated()``: the model calibrated on ``fit`` without running data, or ``None``), in
    the counted ``work`` (nominal seconds, :mod:`qdq.ptq.counts`; default: the search's own),
    stopped by the clock only past ``budget`` seconds (default: ``options.budget``; ``None``:
    no clock) or the hard ``ceiling``; ``refit``: the share of the samples the kept recipe is
    refitted on (its cost is held back); ``forward``: a fake-quant forward's seconds per sample,
    when timed; ``macs``: the float model's multiply-accumulates per sample, when counted.
    The result's ``model`` is the kept one, with its recipe recorded
    (:func:`qdq.ptq.search.recipe_of`)."""

    def scorer(samples: Inputs) -> Callable[[nn.Module], float] | None:
        if per_image is None:
            return None  # the search's output cosine
        from qdq.pipeline import per_image as lists  # detection lists: F1 vs FP32's, per image

        refs = lists.torch_detections(float_model, samples, desc="FP32 (held out)", show=False)

        def score(m: nn.Module) -> float:
            return float(
                lists.score_model(m, samples, refs, per_image, "held out", False)["metric"]
            )

        return score

    def batched(x: Inputs) -> list[Any]:
        return _device_batches(x, inputs, size, static, device)

    more = [Fold(batched(fit), batched(out), scorer(out), make) for fit, out, make in folds or []]
    if budget is None:
        budget = options.budget
    return search(
        float_model,
        example,
        calib_batches,
        batched(held),
        score=scorer(held),
        score_name="output cosine" if per_image is None else "detection F1 vs FP32",
        method=method,
        percentile=percentile,
        candidates=options.candidates,
        budget=budget,
        adaround_samples=options.adaround_samples,
        adaround_iters=options.adaround_iters,
        calibrated=calibrated,
        calibration_seconds=seconds,
        folds=more,
        show_progress=show_progress,
        refit=refit,
        forward_seconds=forward,
        config=config,
        work=work,
        ceiling=ceiling,
        macs=macs,
    )


@dataclass(frozen=True)
class Calibrated:
    """What :func:`calibrate_and_improve` made.

    Attributes:
        prepared: the calibrated model, its recipe's steps applied.
        float_model: the float model it was prepared from (equalized when the recipe says so).
        options: the recipe that ran (given, or kept by the search).
        batches: the calibration batches it was calibrated on (without the held-out ones).
        improve: ``improve(prepared)`` runs the recipe's steps after calibration on another
            calibrated model (the fallback search re-plans); ``None`` when there are none.
        ptq: ``report.json["ptq"]`` (``None``: no recipe given and no search).
        searched: whether the recipe search chose the recipe.
    """

    prepared: nn.Module
    float_model: nn.Module
    options: PtqOptions
    batches: list[Any]
    improve: Callable[[nn.Module], None] | None
    ptq: dict[str, Any] | None
    searched: bool


def calibrate_and_improve(
    stages: Stages,
    model: nn.Module,
    cal: Inputs,
    inputs: ForwardInputs,
    example: tuple[Any, ...],
    *,
    size: int,
    static: bool,
    device: torch.device,
    calib: str | None,
    percentile: float | None,
    ptq: PtqOptions | SearchOptions | None,
    per_image: tuple[str, ...] | None,
    show_progress: bool,
    budget: Budget | None = None,
    no_search: str = "",
    config: QuantConfig | None = None,
) -> Calibrated:
    """The stages ``equalize`` (a recipe with it) → ``capture_plan`` → ``calibrate`` → ``ptq``
    (a given recipe's steps) or ``recipe_search`` → ``refit`` (``ptq`` a :class:`SearchOptions`
    or ``None``).

    ``cal``: the calibration samples (the search holds out its share of them); ``inputs``: how
    they meet ``model.forward``; ``example``: one forward's positional inputs; ``budget``: the
    job's time budget, planned after calibration (:meth:`Budget.plan`), whose share the search
    and the refit get; ``config``: the plan's :class:`~qdq.config.QuantConfig` (its format and the
    layers a mixed plan moved; default ``QuantConfig.tensorrt()``); ``calib`` ``None``:
    each quantizer's own method (an FP8 plan: max for FP8 layers, mse for INT8 ones);
    ``no_search``: why the search must not run (recipe ``none``), if it must
    not.

    With the search, calibration collects the statistics of each part of the calibration
    samples the folds are made of apart (:func:`qdq.calibrate_parts`): the model the search
    starts from (calibrated without the first fold's held-out share), every further fold's and
    the refit's (every sample) come from them without running a batch again
    (:func:`qdq.calibrate_from`).
    """
    import qdq

    options = ptq if isinstance(ptq, PtqOptions) else None  # a recipe given: no search
    searching = ptq if isinstance(ptq, SearchOptions) else None if options else SearchOptions()
    held, not_searched, every = None, "", cal
    if searching is not None:
        if no_search:
            not_searched = no_search
        elif dist.world_size() > 1:
            not_searched = ("not run under torchrun (every rank would have to choose alike): "
                            "give --recipe, e.g. the one a single-process run kept")  # fmt: skip
        else:
            cal, held, not_searched = held_out_split(cal, searching)
    options = options or PtqOptions()
    parts = None
    if held is not None and searching is not None and not options.equalize:
        parts = [_device_batches(x, inputs, size, static, device)
                 for x in held_out_parts(every, searching)]  # fmt: skip
    calib_batches = _device_batches(cal, inputs, size, static, device)
    held_note = "" if held is None else f"; {num_samples(held)} more held out for the recipe search"
    prepared, equalized, collected = _calibrated(
        stages, model, example, calib_batches, options, calib=calib, percentile=percentile,
        samples=num_samples(cal), note=held_note, show_progress=show_progress, parts=parts,
        config=config,
    )  # fmt: skip
    calibration = stages.timings["calibrate"]
    macs: int | None = None
    if budget is not None:  # the stages to come: their work counted, their seconds predicted
        with stages("budget") as st:
            from qdq.ptq.search import _size

            batch, limit = calib_batches[0], None if static else TIMED
            # calibration ran real forwards on every sample: a forward costs at most that
            bound = calibration / max(num_samples(every if parts is not None else cal), 1)
            params, layers = _size(prepared)
            macs = count_macs(float_model_of(model, equalized), example, num_samples_of(example))
            # the fake-quant forward does the float one's work and more: it bounds it too
            int8 = per_sample(prepared, batch, bound=bound, limit=limit)
            budget.plan(points=len(qdq.plan_of(prepared).points),
                        fp32=per_sample(model, batch, bound=int8, limit=limit), int8=int8,
                        search=searching is not None and held is not None,
                        nominal=nominal_forward(params if macs is None else macs, layers,
                                                batch_of(calib_batches)))  # fmt: skip
            st.detail = budget.describe()
    float_model = model if equalized is None else equalized.model  # what gets quantized
    found, refit_share = None, num_samples(every) / max(num_samples(cal), 1)
    if searching is not None and held is not None:
        seconds = stages.timings["capture_plan"] + calibration * num_samples(cal) / max(
            num_samples(every), 1
        )  # one prepare + calibrate on a fold's samples
        allowed = _search_seconds(budget, searching)
        need = 2 * (budget.per_sample if budget else 0.0) * num_samples(held)  # score one
        if allowed is not None and allowed <= need:  # the clock: the user's own seconds
            given = searching.budget is not None and allowed == searching.budget
            source = (
                f"--search-budget {allowed:g} s"
                if given
                else (f"the time budget leaves it {allowed:.1f} s,")
            )
            not_searched = (
                f"not run: {source} less than scoring one recipe takes (~{need:.1f} s); give "
                f"a larger {'--search-budget' if given else '--time-budget'}, or --recipe NAME"
            )
            if budget is not None:
                budget.skip("recipe_search", "every candidate", not_searched)
                budget.clocked("the recipe search did not run")
            held = None
    if searching is not None and held is not None:
        with stages("recipe_search") as st:
            folds: list[tuple[Inputs, Inputs, Callable[[], nn.Module] | None]] = []
            for k, (fit, out) in enumerate(held_out_folds(every, searching)[1:], start=1):
                make: Callable[[], nn.Module] | None = None
                if collected is not None:
                    make = partial(_from_parts, prepared, collected, k, calib, percentile)
                folds.append((fit, out, make))
            found = run_search(model, example, prepared, calib_batches, held, inputs=inputs,
                               size=size, static=static, device=device, method=calib,
                               percentile=percentile, seconds=seconds, options=searching,
                               per_image=per_image, show_progress=show_progress, folds=folds,
                               budget=allowed, refit=refit_share if searching.refit else 0.0,
                               forward=budget.per_sample if budget else None,
                               config=config, macs=macs,
                               work=budget.search_work() if budget else None,
                               ceiling=budget.search_ceiling() if budget else None)  # fmt: skip
            if budget is not None:
                for cut in found.clock_cut:
                    budget.clocked(f"recipe search: {cut}")
            assert found.model is not None and found.float_model is not None
            prepared, float_model = (found.model, found.float_model) if collected is None else (
                prepared, found.float_model)  # fmt: skip
            options = PtqOptions.from_recipe(
                found.kept.name,
                adaround_samples=searching.adaround_samples,
                adaround_iters=found.iters or searching.adaround_iters,
            )
            st.detail = f"{found.summary()} in {found.spent:.1f} s"
            if found.budget is not None:
                st.detail += f" (budget {found.budget:.0f} s)"
            if found.clock_cut:
                st.detail += f"; the clock cut {len(found.clock_cut)} run(s) from the plan"
    refit = found is not None and searching is not None and searching.refit
    if refit and budget is not None and found is not None:
        room = budget.left() - budget.reserved()  # infinite without --time-budget (the ceiling)
        if found.refit_estimate > room:
            refit = False
            budget.skip("refit", found.kept.name,
                        f"its estimate ({found.refit_estimate:.1f} s) exceeds what the budget "
                        f"leaves ({max(room, 0):.1f} s): the searched model is exported, "
                        "calibrated without the held-out samples")  # fmt: skip
            budget.clocked("the refit on every calibration sample did not run")
    if found is not None and not refit:
        assert found.model is not None
        prepared = found.model
    if refit:  # the kept recipe again, on every calibration sample (none held out)
        with stages("refit") as st:
            calib_batches = _device_batches(every, inputs, size, static, device)
            if collected is not None and not options.equalize:  # no batch runs again
                prepared = qdq.calibrate_from(prepared, collected, None, calib,
                                              percentile=percentile)  # fmt: skip
                float_model = model
            else:
                prepared, equalized, _ = _calibrated(
                    _unstaged, model, example, calib_batches, options, calib=calib,
                    percentile=percentile, samples=num_samples(every), note="",
                    show_progress=False, config=config,
                )  # fmt: skip
                float_model = model if equalized is None else equalized.model
            improve, reports = improver(options, calib_batches, show_progress)
            improve(prepared)
            st.detail = f"{options.recipe} on all {num_samples(every)} calibration samples"
    else:
        improve, reports = improver(options, calib_batches, show_progress)
    if budget is not None:
        budget.recipe = options.recipe
    if found is not None:
        if not refit:  # the kept candidate's step reports
            reports.update({r.key: r.to_report() for r in found.reports})
        reports[found.key] = found.to_report()
    elif searching is not None:
        reports["recipe_search"] = skipped(not_searched)
    elif options.after_calibration:
        with stages("ptq") as st:
            improve(prepared)
            st.detail = "; ".join(str(r.get("summary", name)) for name, r in reports.items())
    if equalized is not None:
        reports[equalized.key] = equalized.to_report()
    return Calibrated(
        prepared=prepared,
        float_model=float_model,
        options=options,
        batches=calib_batches,
        improve=improve if options.after_calibration else None,
        ptq={"steps": options.describe(), "recipe": options.recipe, **reports}
        if options.active or searching is not None
        else None,
        searched=found is not None,
    )


def _search_seconds(budget: Budget | None, options: SearchOptions) -> float | None:
    """The search's seconds by the clock: what ``--time-budget`` leaves it, and at most
    ``--search-budget`` (``None``: neither; its work is counted, not timed)."""
    given = options.budget
    allowed = None if budget is None else budget.search_seconds()
    if allowed is None or given is None:
        return given if allowed is None else allowed
    return min(allowed, given)


def _from_parts(
    prepared: nn.Module,
    collected: CalibrationParts,
    fold: int,
    calib: str | None,
    percentile: float | None,
) -> nn.Module:
    """A copy of ``prepared`` calibrated on every part but the ``fold``-th."""
    import qdq

    keep = [i for i in range(len(collected.parts)) if i != fold]
    return qdq.calibrate_from(qdq.copy_prepared(prepared), collected, keep, calib,
                              percentile=percentile)  # fmt: skip


def _device_batches(
    x: Inputs, inputs: ForwardInputs, size: int, static: bool, device: torch.device
) -> list[Any]:
    """``x`` in batches of ``size``, laid out for ``forward`` (:class:`ForwardInputs`), on
    ``device``."""
    return [to_device(inputs.arguments(b), device) for b, _ in batches(x, size, static)]


def _unstaged(name: str) -> contextlib.AbstractContextManager[Any]:
    """A stand-in for :class:`~qdq.pipeline.stages.Stages` inside one stage (the refit): no
    timing, no callback; ``detail`` is accepted and dropped."""
    return contextlib.nullcontext(SimpleNamespace(detail=""))


def _calibrated(
    stage: Callable[[str], contextlib.AbstractContextManager[Any]],
    model: nn.Module,
    example: tuple[Any, ...],
    calib_batches: list[Any],
    options: PtqOptions,
    *,
    calib: str | None,
    percentile: float | None,
    samples: int,
    note: str,
    show_progress: bool,
    parts: list[list[Any]] | None = None,
    config: QuantConfig | None = None,
) -> tuple[nn.Module, Any, CalibrationParts | None]:
    """``(prepared, equalized, collected)``: the stages ``equalize`` (when ``options`` has it;
    its report or ``None``) → ``capture_plan`` → ``calibrate`` on ``calib_batches`` (``samples``
    of them; ``note`` ends the calibrate stage's detail). With ``parts`` (the batches of the
    parts the search's folds are made of: the held-out shares, then the rest), calibration runs
    every part's batches once, keeping their statistics apart (``collected``), and the model is
    calibrated on every part but the first (``calib_batches``' samples)."""
    import qdq

    float_model, equalized = model, None
    if options.equalize:
        with stage("equalize") as st:
            from qdq.ptq.equalize import equalize

            equalized = equalize(model, example, calib_batches, show_progress=show_progress)
            float_model = equalized.model
            st.detail = equalized.summary()
    with stage("capture_plan") as st:
        prepared = qdq.prepare(float_model, example, config)
        st.detail = qdq.plan_of(prepared).summary().splitlines()[0]
    collected = None
    with stage("calibrate") as st:
        if parts is not None:
            collected = qdq.calibrate_parts(prepared, parts, calib, percentile=percentile,
                                            show_progress=show_progress)  # fmt: skip
            qdq.calibrate_from(prepared, collected, range(1, len(parts)), calib,
                               percentile=percentile)  # fmt: skip
            total = sum(map(len, parts))
            st.detail = (
                f"{method_label(calib, plan_format(prepared))} on {samples} samples (one histogram "
                f"pass over all {total} batches, "
                f"each fold's share kept apart){note}"
            )
        else:
            qdq.calibrate(
                prepared,
                calib_batches[dist.rank() :: dist.world_size()],  # torchrun: a share per rank
                method=calib,
                percentile=percentile,
                show_progress=show_progress,
            )
            label = method_label(calib, plan_format(prepared))
            st.detail = f"{label} on {samples} samples (one histogram pass){note}"
    return prepared, equalized, collected
