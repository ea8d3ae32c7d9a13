"""AdaRound: learn, per weight, whether to round its INT8 code up or down.

Nearest rounding minimises each weight's own error, not the layer's output error. AdaRound (Nagel
et al. 2020, "Up or Down? Adaptive Rounding for Post-Training Quantization") learns the rounding
direction of every weight from a few hundred samples, layer by layer in forward order. With the
quantizer's exact per-channel scale ``s`` (``amax / 127``, unchanged) and integer range
``[qmin, qmax]`` (narrow or not, as the spec says)::

    W̃ = s · clamp(floor(W / s) + h(V), qmin, qmax)
    h(V) = clamp(sigmoid(V) · (ζ − γ) + γ, 0, 1)                  ζ = 1.1, γ = −0.1
    minimise  Σ_c (W x_fp − W̃ x_q)²_c  (mean over rows)  +  λ · Σ (1 − |2h(V) − 1|^β)

``V`` starts where ``h(V) = frac(W / s)`` (the float weight); ``λ = 0.01``; the regulariser is off
for the first 20 % of the iterations, then ``β`` goes linearly from 20 to 2, pushing every ``h``
to 0 or 1; Adam with learning rate 1e-2. At the end ``code = clamp(floor(W / s) + [h ≥ 0.5])``:
every code is the floor or the ceiling of ``W / s``, so it differs from nearest rounding by at most
one.

**Inputs (asymmetric reconstruction, as in the paper):** ``x_q`` is the layer's input in the INT8
model — everything upstream quantized, earlier layers already rounded by AdaRound, the layer's
input Q/DQ applied — and ``x_fp`` the same input in the FP32 model (every quantizer bypassed). The
layer thus also learns to compensate upstream error. Both are sampled at the same positions: from
each of ``num_samples`` samples a few output positions (im2col rows of the convolution, or rows of
a Linear input), at most :data:`MAX_ROWS` rows per layer; each iteration uses
:data:`BATCH_ROWS` of them. The layers are learned in lockstep passes (:mod:`qdq.ptq._lockstep`):
one forward of the INT8 model and one of its FP32 twin for all of them, each layer learning when
the INT8 forward reaches it (where the passes cannot run, two forwards per layer, stopped after
it); then ``iters`` small GEMMs per layer.

A layer keeps nearest rounding when the learned codes do not lower its output error on the samples
(the row says so). The codes are kept on the weight quantizer (``rounding_codes``, see
:mod:`qdq.quant.learned`): the float weight is never changed, ``BYPASS`` is the FP32 model, and
the export writes ``scale · code`` as the weight initializer of the same Q/DQ pattern
(initializer → QuantizeLinear → DequantizeLinear → Conv), which quantizes back to exactly ``code``.

Layers: Conv1d/2d/3d (grouped, depthwise) and Linear (:mod:`qdq.ptq._layers`); a module called
several times learns one rounding from all its calls.

Example:
    >>> import torch, qdq
    >>> from qdq.ptq.adaround import adaround
    >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(),
    ...                           torch.nn.Conv2d(16, 16, 3))
    >>> m = qdq.prepare(net, (torch.randn(1, 3, 12, 12),))
    >>> data = [torch.randn(16, 3, 12, 12) for _ in range(2)]
    >>> _ = qdq.calibrate(m, data, show_progress=False)
    >>> report = adaround(m, data, num_samples=32, iters=50, show_progress=False)
    >>> [r.name for r in report.rows]
    ['0:weight', '2:weight']
    >>> all(r.mse_adaround <= r.mse_nearest for r in report.rows)
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from qdq._modes import eval_no_grad
from qdq._progress import progress
from qdq.api import quantizers_of
from qdq.graph.calls import SiteKey
from qdq.graph.runtime import ArgRef, Call, Site
from qdq.ptq import _layers, _lockstep
from qdq.ptq._layers import Layer
from qdq.ptq.report import StepReport
from qdq.quant import QuantMode, quant_range, quantizer_mode, scale_from_amax

__all__ = ["Rounding", "RoundingRow", "adaround", "clear_rounding"]

ZETA, GAMMA = 1.1, -0.1
#: λ, the weight of the rounding regulariser
REG = 0.01
#: β at the start and the end of its annealing
BETA = (20.0, 2.0)
#: fraction of the iterations without the regulariser
WARMUP = 0.2
LR = 1e-2
#: rows (im2col rows / Linear input rows) sampled per layer, at most
MAX_ROWS = 4096
#: rows per optimisation step
BATCH_ROWS = 1024
SEED = 0


@dataclass(frozen=True)
class RoundingRow:
    """AdaRound on one layer.

    Attributes:
        name: the weight quantizer's name (``"layer1.conv1:weight"``).
        quantizer: its module path.
        weights: weight elements.
        changed: fraction of codes that differ from nearest rounding (each by one).
        mse_nearest: mean squared error of the layer output (INT8 input and nearest-rounded
            weight vs the FP32 output) on the sampled rows.
        mse_adaround: the same with the learned codes.
        rows: rows the layer was optimised on.
        applied: whether the codes were kept (``False``: they did not lower the error).
        calls: calls of the layer per forward.
    """

    name: str
    quantizer: str
    weights: int
    changed: float
    mse_nearest: float
    mse_adaround: float
    rows: int
    applied: bool
    calls: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable."""
        return asdict(self)


@dataclass(frozen=True)
class Rounding(StepReport):
    """What :func:`adaround` did: one row per layer, in forward order."""

    rows: tuple[RoundingRow, ...]
    samples: int
    iters: int
    notes: tuple[str, ...] = ()

    key: ClassVar[str] = "adaround"
    columns: ClassVar[tuple[tuple[str, Callable[[Any], str]], ...]] = (
        ("layer", lambda r: r.name),
        ("changed", lambda r: f"{100 * r.changed:.2f}%"),
        ("MSE nearest", lambda r: f"{r.mse_nearest:.4g}"),
        ("MSE adaround", lambda r: f"{r.mse_adaround:.4g}"),
    )

    def summary(self) -> str:
        """One line: layers rounded and the median output-MSE reduction."""
        applied = [r for r in self.rows if r.applied]
        if not applied:
            return f"adaround: no layer changed ({len(self.rows)} tried)"
        ratios = sorted(r.mse_adaround / r.mse_nearest for r in applied if r.mse_nearest > 0)
        median = ratios[len(ratios) // 2] if ratios else 1.0
        changed = sum(r.changed * r.weights for r in applied) / sum(r.weights for r in applied)
        return (
            f"adaround on {len(applied)}/{len(self.rows)} layers from {self.samples} samples, "
            f"{self.iters} iterations: {100 * changed:.1f}% of codes changed, median layer "
            f"output MSE x{median:.3f} of nearest rounding"
        )

    def fields(self) -> dict[str, Any]:
        """The method, the samples and iterations, and the settings."""
        return {
            "method": "adaround",
            "samples": self.samples,
            "iters": self.iters,
            "settings": _settings(self.samples, self.iters, 0),
        }

    def flag(self, row: RoundingRow) -> str:
        """Layers whose learned codes did not lower the error keep nearest rounding."""
        return "" if row.applied else "  (kept nearest)"


def adaround(
    prepared: nn.Module,
    data: Iterable[Any],
    *,
    num_samples: int = 256,
    iters: int = 500,
    show_progress: bool = True,
) -> Rounding:
    """Learn the INT8 rounding of every weighted layer of a calibrated model, in place.

    Args:
        prepared: a calibrated model from :func:`qdq.prepare`.
        data: batches as :func:`qdq.calibrate` takes them; whole batches are taken until
            ``num_samples`` samples are reached (they are kept in memory and run twice per layer).
        num_samples: samples to learn from.
        iters: optimisation steps per layer.
        show_progress: a progress bar per layer.

    Returns:
        :class:`Rounding`, one row per layer (forward order).

    Raises:
        ValueError: not a prepared call-site model, a quantizer without amax, bad
            ``num_samples``/``iters``, or no batch in ``data``.
        qdq.quant.StaleStateError: learned state of a layer no longer fits its weight.
    """
    _layers.check_ready(prepared, "adaround")
    for what, value in (("num_samples", num_samples), ("iters", iters)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{what} must be an int >= 1, got {value!r}")
    batches, samples = [], 0
    for batch in data:
        batches.append(batch)
        samples += _layers.batch_size(batch)
        if samples >= num_samples:
            break
    if not batches:
        raise ValueError("adaround saw no batches: the data is empty")
    layers, notes = _layers.find_layers(prepared)
    notes.extend(f"skipped {x.quantizer.name}: an FP8 weight rounds to nearest (AdaRound learns "
                 "integer codes)" for x in layers if x.quantizer.spec.format != "int8")  # fmt: skip
    layers = [x for x in layers if x.quantizer.spec.format == "int8"]
    with eval_no_grad(prepared):
        _layers.survey(prepared, batches[0], layers)
    reached = sorted((x for x in layers if x.order is not None), key=lambda x: x.order or 0)
    unreached = [x.name for x in layers if x.order is None]
    if unreached:
        notes.append(f"{len(unreached)} layer(s) were not called on this data: {unreached[:5]}")
    found = _in_lockstep(prepared, reached, batches, samples, iters, notes, show_progress)
    rows = []
    for i, layer in enumerate(reached):  # layer by layer: what the lockstep passes could not do
        if layer.path not in found:
            desc = f"adaround {i + 1}/{len(reached)} {layer.name}"
            found[layer.path] = _round_layer(prepared, layer, batches, samples, iters, desc,
                                             show_progress)  # fmt: skip
        row = found[layer.path]
        if isinstance(row, str):
            notes.append(row)
        else:
            rows.append(row)
    return Rounding(tuple(rows), samples, iters, tuple(notes))


def clear_rounding(prepared: nn.Module) -> list[str]:
    """Return every layer of ``prepared`` to nearest rounding; return the quantizer paths."""
    cleared = []
    for path, q in quantizers_of(prepared).items():
        if q.has_rounding:
            q.clear_learned("rounding")
            cleared.append(path)
    return cleared


def _settings(samples: int, iters: int, rows: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "method": "adaround",
        "num_samples": samples,
        "iters": iters,
        "reg": REG,
        "beta": list(BETA),
        "warmup": WARMUP,
        "lr": LR,
        "zeta_gamma": [ZETA, GAMMA],
        "inputs": "int8 upstream vs fp32 target",
    }
    if rows:
        out["rows"] = rows
    return out


def _in_lockstep(
    prepared: nn.Module,
    ordered: list[Layer],
    batches: list[Any],
    samples: int,
    iters: int,
    notes: list[str],
    show_progress: bool,
) -> dict[str, RoundingRow | str]:
    """Round the layers in forward order in lockstep passes (:func:`qdq.ptq._lockstep.passes`),
    as :func:`qdq.ptq.bias._in_lockstep` corrects them: each layer learns its rounding when the
    INT8 forward reaches it (the twin waiting), from rows sampled at the positions the
    layer-by-layer path samples (the joined input split back into the batches), and its rounded
    output goes on downstream; a layer called several times is rounded on its own. Returns each
    layer done by path (a row, or a note); the caller rounds the others layer by layer."""
    sizes = [_layers.batch_size(b) for b in batches]
    found: dict[str, RoundingRow | str] = {}

    def sampled(x: Any, w: torch.Tensor, layer: Layer, call: Call, per_sample: int) -> Any:
        gen = torch.Generator().manual_seed(SEED)  # as _capture draws them, batch by batch
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[0] != sum(sizes):
            return None
        parts = [_rows(p, w, layer.family, call, per_sample, gen) for p in x.split(sizes)]
        return torch.cat(parts).to(torch.float32).transpose(0, 1).contiguous()

    def desc(layer: Layer) -> str:
        return f"adaround {len(found) + 1}/{len(ordered)} {layer.name}"

    def visit(layer: Layer, ref: ArgRef, fp: _lockstep.Handed, func: Any, raw: Call,
              applied: Call) -> Any:  # fmt: skip
        weight = _layers.weight_of(raw, ref)
        per_sample = max(1, math.ceil(MAX_ROWS / samples))
        x_fp = sampled(_input(fp.raw), weight, layer, fp.raw, per_sample)
        x_q = sampled(_input(applied), weight, layer, applied, per_sample)
        if x_fp is None or x_q is None or x_fp.shape != x_q.shape:
            found[layer.path] = _differ(layer)
            return _layers.invoke(func, applied)
        row = _fit(layer, x_fp, x_q, weight, samples, iters, desc(layer), show_progress)
        found[layer.path] = row
        if not row.applied:
            return _layers.invoke(func, applied)
        q = layer.quantizer  # the call again, with the learned codes (and no bias correction)
        redone = _layers.replace_weight_bias(applied, ref, q(weight),
                                             q.corrected_bias(_layers.bias_of(raw), weight))  # fmt: skip
        return _layers.invoke(func, redone)

    def alone(layer: Layer) -> RoundingRow | str:
        return _round_layer(prepared, layer, batches, samples, iters, desc(layer), show_progress)

    _lockstep.passes(prepared, ordered, batches, visit, alone, found, notes,
                     "rounded one at a time")  # fmt: skip
    return found


def _input(call: Call) -> Any:
    """The input argument of an ``F.conv*``/``F.linear`` call."""
    return call[0][0] if call[0] else call[1].get("input")


def _differ(layer: Layer) -> str:
    return f"{layer.name}: its calls differ between the FP32 and INT8 runs; left as it was"


def _round_layer(
    prepared: nn.Module,
    layer: Layer,
    batches: list[Any],
    samples: int,
    iters: int,
    desc: str,
    show_progress: bool,
) -> RoundingRow | str:
    """Learn one layer's rounding on its own (two forwards per batch, each stopped after the
    layer); a note instead when its calls differ between the passes."""
    per_sample = max(1, math.ceil(MAX_ROWS / (samples * max(1, layer.calls))))
    with eval_no_grad(prepared):
        with quantizer_mode(prepared, QuantMode.BYPASS):
            x_fp, weight = _capture(prepared, layer, batches, per_sample)
        x_q, _ = _capture(prepared, layer, batches, per_sample)
    if weight is None or x_fp.shape != x_q.shape:
        return _differ(layer)
    return _fit(layer, x_fp, x_q, weight, samples, iters, desc, show_progress)


def _fit(
    layer: Layer,
    x_fp: torch.Tensor,
    x_q: torch.Tensor,
    weight: torch.Tensor,
    samples: int,
    iters: int,
    desc: str,
    show_progress: bool,
) -> RoundingRow:
    """Learn the layer's rounding from its sampled input rows ``(groups, rows, K)`` in the FP32
    and the INT8 model; set the codes when they lower the output error."""
    q = layer.quantizer
    w = weight.detach().to(torch.float32)
    groups = x_q.shape[0]
    wg = w.reshape(groups, w.shape[0] // groups, -1)
    scale = scale_from_amax(q.amax.detach(), q.spec.num_bits).to(w.device)
    s = scale.reshape(groups, -1, 1) if scale.dim() else scale
    qmin, qmax = quant_range(q.spec.num_bits, q.spec.narrow_range)
    ws = wg / s  # exactly as the quantizer divides
    floor = torch.floor(ws)
    nearest = torch.clamp(torch.round(ws), qmin, qmax)
    target = torch.bmm(x_fp, wg.transpose(1, 2))
    up = _learn(x_q, target, ws - floor, floor, s, (qmin, qmax), iters, desc, show_progress)
    codes = torch.clamp(floor + up, qmin, qmax)
    mse_nearest = _mse(x_q, s * nearest, target)
    mse_ada = _mse(x_q, s * codes, target)
    changed = float((codes != nearest).float().mean())
    applied = mse_ada < mse_nearest and changed > 0
    if applied:
        settings = _settings(samples, iters, int(x_q.shape[1]))
        q.set_rounding(codes.reshape(w.shape), weight, settings)
    return RoundingRow(
        name=layer.name,
        quantizer=layer.path,
        weights=int(w.numel()),
        changed=changed if applied else 0.0,
        mse_nearest=mse_nearest,
        mse_adaround=mse_ada if applied else mse_nearest,
        rows=int(x_q.shape[1]),
        applied=applied,
        calls=layer.calls,
    )


def _learn(
    x: torch.Tensor,
    target: torch.Tensor,
    frac: torch.Tensor,
    floor: torch.Tensor,
    s: torch.Tensor,
    limits: tuple[int, int],
    iters: int,
    desc: str,
    show_progress: bool,
) -> torch.Tensor:
    """Optimise ``V`` (the module docstring's objective); return the hard rounding (0 or 1)."""
    p = ((frac - GAMMA) / (ZETA - GAMMA)).clamp(1e-6, 1 - 1e-6)
    v = torch.log(p / (1 - p)).requires_grad_(True)
    optimizer = torch.optim.Adam([v], lr=LR)
    gen = torch.Generator(device=x.device).manual_seed(SEED)
    rows = x.shape[1]
    warm = int(WARMUP * iters)
    with torch.enable_grad():
        for it in progress(range(iters), total=iters, desc=desc, enabled=show_progress):
            if rows > BATCH_ROWS:
                idx = torch.randint(0, rows, (BATCH_ROWS,), generator=gen, device=x.device)
                xb, tb = x[:, idx], target[:, idx]
            else:
                xb, tb = x, target
            h = _h(v)
            out = torch.bmm(xb, (s * torch.clamp(floor + h, *limits)).transpose(1, 2))
            loss = ((out - tb) ** 2).sum() / xb.shape[1]
            if it >= warm:
                rel = (it - warm) / max(1, iters - warm)
                beta = BETA[1] + (BETA[0] - BETA[1]) * (1.0 - rel)
                loss = loss + REG * (1.0 - (2.0 * h - 1.0).abs().pow(beta)).sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return (_h(v.detach()) >= 0.5).to(floor.dtype)


def _h(v: torch.Tensor) -> torch.Tensor:
    """The rectified sigmoid."""
    return torch.clamp(torch.sigmoid(v) * (ZETA - GAMMA) + GAMMA, 0.0, 1.0)


def _mse(x: torch.Tensor, wg: torch.Tensor, target: torch.Tensor) -> float:
    """Mean squared error of ``x @ wgᵀ`` (``x``: ``(groups, rows, K)``) against ``target``."""
    total, count = 0.0, 0
    wt = wg.transpose(1, 2)
    for start in range(0, x.shape[1], BATCH_ROWS):
        out = torch.bmm(x[:, start : start + BATCH_ROWS], wt)
        err = out.double() - target[:, start : start + BATCH_ROWS].double()
        total += float((err * err).sum())
        count += err.numel()
    return total / max(1, count)


def _capture(
    prepared: nn.Module, layer: Layer, batches: list[Any], per_sample: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The layer's input rows ``(groups, rows, K)`` over ``batches`` (at positions drawn from a
    fixed seed, so the FP32 and INT8 passes take the same ones) and its float weight."""
    index = _layers.index_of([layer])
    gen = torch.Generator().manual_seed(SEED)
    parts: list[torch.Tensor] = []
    weight: list[torch.Tensor] = []
    calls = 0

    def tap(key: SiteKey, site: Site, func: Any, raw: Call, applied: Call) -> Any:
        nonlocal calls
        hit = _layers.lookup(index, key)
        if hit is None:
            return _layers.invoke(func, applied)
        _, ref = hit
        w = _layers.weight_of(raw, ref)
        x = applied[0][0] if applied[0] else applied[1].get("input")
        assert isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor)
        parts.append(_rows(x, w, layer.family, applied, per_sample, gen))
        weight[:] = [w]
        calls += 1
        if calls >= layer.calls:
            raise _layers.Stop
        return _layers.invoke(func, applied)

    with _layers.tapped(prepared, tap):
        for batch in batches:
            calls = 0
            _layers.run_batches(prepared, [batch])
    if not parts:
        return torch.empty(0), None
    rows = torch.cat(parts).to(torch.float32)
    return rows.transpose(0, 1).contiguous(), weight[0]


def _pick(n: int, positions: int, per_sample: int, gen: torch.Generator) -> torch.Tensor:
    """``(n, k)`` distinct positions per sample, ``k = min(per_sample, positions)``."""
    if per_sample >= positions:
        return torch.arange(positions).expand(n, positions)
    return torch.rand(n, positions, generator=gen).argsort(dim=1)[:, :per_sample]


def _rows(
    x: torch.Tensor,
    w: torch.Tensor,
    family: str,
    call: Call,
    per_sample: int,
    gen: torch.Generator,
) -> torch.Tensor:
    """Sampled rows of the layer's input as a GEMM sees them: ``(rows, groups, K)``."""
    x = x.detach()
    if family == "linear":
        k = w.shape[1]
        xs = x.reshape(1 if x.dim() == 1 else x.shape[0], -1, k)
        pick = _pick(xs.shape[0], xs.shape[1], per_sample, gen).to(x.device)
        n_idx = torch.arange(xs.shape[0], device=x.device)[:, None]
        return xs[n_idx, pick].reshape(-1, 1, k)
    nd = w.dim() - 2
    params = _layers.conv_params(call, nd)
    kernel = tuple(w.shape[2:])
    if x.dim() == nd + 1:
        x = x.unsqueeze(0)
    x = _pad(x, params["padding"], kernel, params["dilation"])
    v = x
    for d in range(nd):
        span = params["dilation"][d] * (kernel[d] - 1) + 1
        v = v.unfold(2 + d, span, params["stride"][d])
    if any(dl > 1 for dl in params["dilation"]):
        steps: list[Any] = [slice(None, None, dl) for dl in params["dilation"]]
        v = v[(..., *steps)]
    out_dims = tuple(v.shape[2 : 2 + nd])
    n = v.shape[0]
    pick = _pick(n, math.prod(out_dims), per_sample, gen).to(x.device)
    coords = torch.unravel_index(pick, out_dims)
    n_idx = torch.arange(n, device=x.device)[:, None].expand_as(pick)
    where: list[Any] = [n_idx, slice(None), *coords]
    sel = v[tuple(where)]  # (n, k, C, *kernel)
    groups = params["groups"]
    return sel.reshape(-1, groups, (x.shape[1] // groups) * math.prod(kernel))


def _pad(
    x: torch.Tensor,
    padding: tuple[int, ...] | str,
    kernel: tuple[int, ...],
    dilation: tuple[int, ...],
) -> torch.Tensor:
    """Zero-pad as ``F.conv*d`` does (``"same"`` puts the odd extra element at the end)."""
    nd = len(kernel)
    if padding == "valid":
        return x
    if isinstance(padding, str):  # "same"
        totals = [dilation[d] * (kernel[d] - 1) for d in range(nd)]
        pairs = [(t // 2, t - t // 2) for t in totals]
    else:
        pairs = [(p, p) for p in padding]
    if not any(a or b for a, b in pairs):
        return x
    flat = [v for pair in reversed(pairs) for v in pair]
    return F.pad(x, flat)
