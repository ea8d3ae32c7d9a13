"""The AWQ clip search (:mod:`qdq.ptq.awq`) on a prepared model: every INT4 weight quantizer.

:func:`awq_clip` runs the float model (every quantizer bypassed, as AWQ measures) on the first
``num_batches`` calibration batches, accumulates each INT4 GEMM's input Gram matrix through a tap
on the call-site runtime (so ``nn.Linear``, its subclasses, functional ``F.linear`` and GPT-2's
``Conv1D`` through ``torch.addmm`` are all seen, with the weight the model passed), and sets each
INT4 weight quantizer's amax (``BlockQuantizer.set_amax``, per block or per channel as it holds
it; ``amax_method`` becomes ``"awq"``). Per output row the new amax is kept only where it lowers
the row's output error on those inputs against the amax the quantizer held (``max`` or ``mse``),
so the pass never makes a layer's in-sample output error larger. The report gives each layer's
output SQNR before and after, in-sample.

Weights whose quantizer is not INT4 (NVFP4, MXFP8: their block scales follow from the data),
not in ``QUANTIZE`` mode, not 2-D, or whose input the tap cannot name are left as they are, with
a note.

Example:
    >>> import torch, qdq
    >>> from qdq.config import QuantConfig
    >>> torch.manual_seed(0)
    <torch._C.Generator object at ...>
    >>> net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.GELU(), torch.nn.Linear(32, 64))
    >>> m = qdq.prepare(net, (torch.randn(2, 64),), config=QuantConfig(format="int4w"))
    >>> data = [torch.randn(16, 64) * torch.linspace(0.1, 5.0, 64) for _ in range(2)]
    >>> report = awq_clip(m, data)
    >>> [(r.name, r.block_size) for r in report.rows]
    [('0:weight', 64), ('2:weight', 32)]
    >>> all(r.sqnr_after_db >= r.sqnr_before_db for r in report.rows)
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from qdq._modes import eval_no_grad
from qdq._progress import progress
from qdq.api import plan_of, quantizers_of
from qdq.calib.blocks import CLIP_GRID
from qdq.debug.stats import finite_fields
from qdq.graph.calls import SiteKey
from qdq.graph.runtime import ArgRef, Call, Site, runtime_of
from qdq.ptq import _layers
from qdq.ptq.awq import InputGram, awq_clip_amax, output_error
from qdq.ptq.report import StepReport
from qdq.quant import QuantMode, quantizer_mode
from qdq.quant.block_quantizer import BlockQuantizer
from qdq.quant.blocks import block_amax, block_fake_quant

__all__ = ["AwqClip", "AwqClipRow", "awq_clip"]


@dataclass(frozen=True)
class AwqClipRow:
    """The clip search of one INT4 weight.

    Attributes:
        name: the weight quantizer's name (``"encoder.0.fc1:weight"``).
        quantizer: its module path.
        block_size: INT4 block size (``None``: per channel).
        tokens: input rows the search saw.
        clipped: the share of blocks (or channels) whose amax is now under their abs max.
        sqnr_before_db: the layer's output SQNR with the amax it held, on those inputs.
        sqnr_after_db: the same with the new amax.
    """

    name: str
    quantizer: str
    block_size: int | None
    tokens: int
    clipped: float
    sqnr_before_db: float
    sqnr_after_db: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (a non-finite number is ``null``)."""
        return finite_fields(self)


@dataclass(frozen=True)
class AwqClip(StepReport):
    """What :func:`awq_clip` did: one row per INT4 weight, in the order of the model's calls."""

    rows: tuple[AwqClipRow, ...]
    batches: int
    sweeps: int
    notes: tuple[str, ...] = ()

    key: ClassVar[str] = "awq_clip"
    columns: ClassVar[tuple[tuple[str, Callable[[Any], str]], ...]] = (
        ("layer", lambda r: r.name),
        ("block", lambda r: "channel" if r.block_size is None else str(r.block_size)),
        ("clipped", lambda r: f"{100 * r.clipped:.1f}%"),
        ("SQNR dB", lambda r: f"{r.sqnr_before_db:.2f}"),
        ("after", lambda r: f"{r.sqnr_after_db:.2f}"),
    )

    def summary(self) -> str:
        """One line: layers searched and the median output SQNR gain."""
        if not self.rows:
            return "AWQ clip search: no INT4 weight"
        gains = sorted(r.sqnr_after_db - r.sqnr_before_db for r in self.rows)
        return (
            f"AWQ clip search on {len(self.rows)} INT4 weights: median layer output SQNR gain "
            f"{gains[len(gains) // 2]:+.2f} dB (in-sample)"
        )

    def fields(self) -> dict[str, Any]:
        """The data used and the coordinate-descent sweeps."""
        return {"method": "awq_clip", "batches": self.batches, "sweeps": self.sweeps}


@dataclass
class _Layer:
    path: str
    quantizer: BlockQuantizer
    sites: list[tuple[SiteKey, ArgRef]] = field(default_factory=list)
    gram: InputGram | None = None
    weight: torch.Tensor | None = None
    order: int = -1


def awq_clip(
    prepared: nn.Module,
    data: Iterable[Any],
    *,
    num_batches: int = 4,
    grid: Sequence[float] = CLIP_GRID,
    sweeps: int = 1,
    show_progress: bool = False,
) -> AwqClip:
    """Set every INT4 weight quantizer's amax by the AWQ clip search on the layer's output.

    Args:
        prepared: a model from :func:`qdq.prepare` with INT4 weights (``format="int4w"``).
        data: batches as :func:`qdq.calibrate` takes them (the first ``num_batches`` are used).
        num_batches: batches whose inputs enter the search.
        grid: clip ratios (:data:`qdq.calib.blocks.CLIP_GRID`: 1.00 down to 0.50 by 0.01).
        sweeps: coordinate-descent sweeps on the whole row error (:func:`~qdq.ptq.awq.awq_clip_amax`).
        show_progress: a progress bar over the layers.

    Returns:
        :class:`AwqClip`, one row per INT4 weight reached by the data.

    Raises:
        ValueError: not a prepared call-site model, a bad ``num_batches``/``grid``/``sweeps``,
            or no batch in ``data``.
    """
    plan_of(prepared)
    runtime = runtime_of(prepared)
    if runtime is None:
        raise ValueError(
            "awq_clip needs a model prepared at call sites; this one was prepared by module "
            "replacement (qdq.prepare could not record it)"
        )
    if isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 1:
        raise ValueError(f"num_batches must be an int >= 1, got {num_batches!r}")
    if isinstance(sweeps, bool) or not isinstance(sweeps, int) or sweeps < 0:
        raise ValueError(f"sweeps must be an int >= 0, got {sweeps!r}")
    batches = [b for b, _ in zip(data, range(num_batches), strict=False)]
    if not batches:
        raise ValueError("awq_clip needs at least one calibration batch; data was empty")
    layers, notes = _find(prepared, runtime.sites)
    index = {key: (layer, ref) for layer in layers for key, ref in layer.sites}
    seen = 0

    def tap(key: SiteKey, site: Site, func: Any, raw: Call, applied: Call) -> Any:
        nonlocal seen
        hit = index.get(key) or index.get((key[0], key[1], None))
        if hit is not None:
            layer, ref = hit
            _observe(layer, ref, raw, notes)
            if layer.order < 0:
                layer.order, seen = seen, seen + 1
        return _layers.invoke(func, applied)

    with eval_no_grad(prepared), quantizer_mode(prepared, QuantMode.BYPASS), \
            _layers.tapped(prepared, tap):  # fmt: skip
        _layers.run_batches(prepared, batches)
    reached = sorted((ly for ly in layers if ly.gram is not None), key=lambda ly: ly.order)
    for ly in layers:
        if ly.gram is None and not any(
            n.startswith(f"skipped {ly.quantizer.name}:") for n in notes
        ):
            notes.append(f"skipped {ly.quantizer.name}: not reached by the data")
    rows = [
        _search(ly, grid, sweeps)
        for ly in progress(reached, total=len(reached), desc="AWQ clip", enabled=show_progress)
    ]
    return AwqClip(tuple(rows), len(batches), sweeps, tuple(notes))


def _find(prepared: nn.Module, sites: dict[SiteKey, Site]) -> tuple[list[_Layer], list[str]]:
    """The INT4 weight quantizers at the planned call sites; a note for each one skipped."""
    paths = {id(q): p for p, q in quantizers_of(prepared).items()}
    layers: dict[str, _Layer] = {}
    notes: list[str] = []
    for key, site in sites.items():
        for ref, q in site.actions:
            if not isinstance(q, BlockQuantizer) or q.role != "weight" or q.spec.format != "int4":
                continue
            if q.mode is not QuantMode.QUANTIZE:
                _note(notes, f"skipped {q.name}: its quantizer is set to {q.mode.value}")
                continue
            layers.setdefault(paths[id(q)], _Layer(paths[id(q)], q)).sites.append((key, ref))
    return list(layers.values()), notes


def _observe(layer: _Layer, ref: ArgRef, raw: Call, notes: list[str]) -> None:
    """Add a call's input to the layer's Gram (weight ``[out, in]`` or ``[in, out]``)."""
    args, kwargs = raw
    weight = _layers.weight_of(raw, ref)
    # F.linear(x, W) / matmul(x, W): x first; addmm(bias, x, W): x second
    x = (args[1] if len(args) > 1 else kwargs.get("mat1")) if ref in (2, "mat2") else (
        args[0] if args else kwargs.get("input"))  # fmt: skip
    red = _reduction_axis(layer.quantizer)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or red is None:
        _note(notes, f"skipped {layer.quantizer.name}: not a 2-D GEMM weight")
        return
    k = weight.shape[red]
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.shape[-1] != k:
        _note(notes, f"skipped {layer.quantizer.name}: its input is not a float tensor [..., {k}]")
        return
    if layer.gram is None:
        layer.gram = InputGram(k)
    layer.gram.add(x)
    layer.weight = weight.detach()


def _note(notes: list[str], text: str) -> None:
    if text not in notes:
        notes.append(text)


def _reduction_axis(q: BlockQuantizer) -> int | None:
    """The weight's input (reduction) axis: the blocked axis, or the other one per channel."""
    axis = q.spec.axis
    if axis is None or axis not in (-2, -1, 0, 1):
        return None
    axis %= 2
    return axis if q.spec.block_size is not None else 1 - axis


def _search(layer: _Layer, grid: Sequence[float], sweeps: int) -> AwqClipRow:
    """The clip search of one layer, on the device of its inputs; the quantizer's amax set."""
    q, gram, weight = layer.quantizer, layer.gram, layer.weight
    assert gram is not None and weight is not None
    red = _reduction_axis(q)
    assert red is not None
    h = gram.gram
    fmt = q.block_format
    blocked = fmt.block_size is not None
    flip = red == 0 and blocked  # a weight [in, out] blocked along 0: amax [in/bs, out]
    w = (weight.T if red == 0 else weight).to(device=h.device, dtype=torch.float32)
    ax = -1 if blocked else 0
    before = q.amax.detach().to(device=h.device, dtype=torch.float32)
    before = before.T if flip else before
    found = awq_clip_amax(w, h, fmt, ax, grid=grid, sweeps=sweeps)
    e_before = output_error(w, block_fake_quant(w, fmt, before, ax), h)
    e_found = output_error(w, block_fake_quant(w, fmt, found, ax), h)
    better = e_found < e_before  # per row: the search only where it beats the amax held
    amax = torch.where(better[:, None] if blocked else better, found, before)
    err = torch.where(better, e_found, e_before)
    clipped = float((amax < block_amax(w, fmt, ax)).float().mean())
    q.set_amax(amax.T.contiguous() if flip else amax)
    q.amax_method = "awq"
    signal = float(output_error(torch.zeros_like(w), w, h).sum())
    return AwqClipRow(
        name=q.name,
        quantizer=layer.path,
        block_size=fmt.block_size,
        tokens=gram.tokens,
        clipped=clipped,
        sqnr_before_db=_db(signal, float(e_before.sum())),
        sqnr_after_db=_db(signal, float(err.sum())),
    )


def _db(signal: float, noise: float) -> float:
    return math.inf if noise <= 0 else 10.0 * math.log10(signal / noise)
