"""torch fake quant vs its exported Q/DQ ONNX in ONNX Runtime: end to end and per quantizer.

Two per-layer views (``per_layer=True``), both keyed by quantizer path in torch's execution order:

* **free-running**: both models run on the same input; every quantizer's dequantized output is
  compared. A code that flips in one layer changes the input of every later one, so in a deep
  network a single flip near the input can cascade into many differing codes downstream.
* **isolated** (teacher-forced): torch runs again with every quantizer's output *replaced by ORT's
  dequantized tensor*, so each layer of torch starts from exactly ORT's input; what reaches each
  quantizer then differs only by that one layer's float arithmetic. A differing code is
  *explained by accumulation order* when the two pre-quantization values are within
  :data:`EXPLAINED_FRACTION` of a quantization step of each other (they straddle a rounding
  boundary); anything else (a misplaced quantizer, a different scale, a different op) is
  *unexplained*, and the first layer with such codes is where the two models really differ.

End to end, rounding-boundary flips cascade: in a deep INT8 network a flip near the input changes
many codes downstream, and where two classes are nearly tied the top-1 class can differ although
no layer computes anything different. ``reference=True`` measures that noise floor: a float64 copy
of the fake-quant model (products and sums of INT8 codes are then exact, as in TensorRT's integer
accumulation; only the float epilogues round) runs on the same batches, and both torch float32 and
ORT are compared with it (:class:`ReferenceParity`). When ORT is as close to the exact reference
as torch's own float32 forward is, a torch-vs-ORT top-1 difference is float accumulation order.
Row by row (:meth:`ReferenceParity.top1_flips_beyond_rounding`): a row whose ORT top-1 differs
from the reference's is a near-tie, and the difference rounding, only when the reference's margin
between the two classes is within twice the largest deviation of torch's float32 forward from the
reference on that output (the measured float32 rounding scale of this model and data).

onnxruntime and onnx are imported lazily.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from qdq.backends.parity_layers import (
    EXPLAINED_FRACTION,
    LayerParity,
    Recorder,
    cosine,
    fold,
    with_quantizer_outputs,
)
from qdq.quant import Quantizer

__all__ = ["EXPLAINED_FRACTION", "LayerParity", "ParityReport", "ReferenceParity", "parity"]


@dataclass(frozen=True)
class ReferenceParity:
    """torch float32 and ORT, each against the float64 fake-quant model (the exact reference).

    Attributes:
        torch_top1: top-1 agreement of torch's float32 forward with the reference (2-D outputs).
        onnx_top1: top-1 agreement of ONNX Runtime with the reference (2-D outputs).
        torch_max_abs_diff: largest |torch float32 - reference| over all outputs and batches.
        onnx_max_abs_diff: largest |ORT - reference|.
        error: why the reference could not run (then every figure is ``None``/``nan``).
        torch_max_abs_diff_by_output: ``torch_max_abs_diff`` per model output (flattened output
            order; 0.0 for an output never compared): the float32 rounding scale of each.
        onnx_max_abs_diff_by_output: ``onnx_max_abs_diff`` per model output.
        torch_top1_flips: one ``(output, margin)`` per row (2-D outputs) whose torch top-1 differs
            from the reference's; ``margin``: the reference's value of its own top class minus
            its value of torch's (float64, >= 0): how far from a tie the row is.
        onnx_top1_flips: the same for ORT's top-1.
    """

    torch_top1: float | None
    onnx_top1: float | None
    torch_max_abs_diff: float
    onnx_max_abs_diff: float
    error: str | None = None
    torch_max_abs_diff_by_output: tuple[float, ...] = ()
    onnx_max_abs_diff_by_output: tuple[float, ...] = ()
    torch_top1_flips: tuple[tuple[int, float], ...] = ()
    onnx_top1_flips: tuple[tuple[int, float], ...] = ()

    def explains_top1(self, tolerance: float = 0.0) -> bool:
        """ORT agrees with the exact reference (almost, ``tolerance``) as often as torch's own
        float32 forward does: top-1 differences between the two are then float rounding."""
        if self.error is not None or self.torch_top1 is None or self.onnx_top1 is None:
            return False
        return self.onnx_top1 >= self.torch_top1 - tolerance

    def top1_flips_beyond_rounding(self) -> tuple[tuple[int, float], ...]:
        """ORT's top-1 differences from the exact reference that float rounding cannot explain.

        A row's top class can move from ``a`` to ``b`` only when its values of ``a`` and ``b``
        move, together, by at least the reference margin ``ref[a] - ref[b]``: one of them by at
        least half of it. The scale of float32 rounding for this model and data is measured, on
        the same rows, by torch's own float32 forward: its largest deviation from the reference
        on that output, ``d``. ORT computes the same function in float32 in another order, so a
        row it flips with a margin of at most ``2 d`` is a near-tie that rounding decides; a
        flip with a larger margin needs ORT to stray from the exact model further than float32
        rounding ever did: an export defect. ORT's own deviation is not the scale, since a
        defect inflates it.

        Returns:
            the ``(output, margin)`` of each such row, from :attr:`onnx_top1_flips`; empty when
            every ORT flip is a near-tie (or the reference did not run: see :attr:`error`).
        """
        scale = self.torch_max_abs_diff_by_output
        return tuple(
            (i, m) for i, m in self.onnx_top1_flips if i >= len(scale) or m > 2.0 * scale[i]
        )


@dataclass(frozen=True)
class ParityReport:
    """torch fake-quant vs ONNX Runtime on the same batches.

    Attributes:
        max_abs_diff: largest |torch - ORT| over all outputs and batches.
        max_rel_diff: ``max_abs_diff`` divided by the largest |torch| value.
        min_cosine: smallest per-batch cosine similarity of the flattened outputs.
        top1_agreement: fraction of rows whose argmax agrees (2-D outputs), else ``None``.
        batches: how many batches were compared.
        layers: per activation quantizer path, a :class:`LayerParity`, in torch's execution order
            (``per_layer=True`` only).
        reference: torch and ORT against the float64 fake-quant model (``reference=True`` only).
        size_differs: outputs (by index) whose size differs between torch and ORT, with the first
            differing shapes: a size that depends on values (detections kept after thresholds
            and NMS) where values near a threshold differ. They are left out of every end-to-end
            figure; the per-layer comparison still covers the layers before them.
    """

    max_abs_diff: float
    max_rel_diff: float
    min_cosine: float
    top1_agreement: float | None
    batches: int
    layers: dict[str, LayerParity] = field(default_factory=dict)
    reference: ReferenceParity | None = None
    size_differs: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)

    @property
    def first_diverging(self) -> str | None:
        """The first quantizer (execution order) with a differing code, free-running."""
        return next((n for n, lp in self.layers.items() if lp.differing_codes), None)

    @property
    def first_unexplained(self) -> str | None:
        """The first quantizer whose isolated codes differ beyond a rounding-boundary flip."""
        return next((n for n, lp in self.layers.items() if lp.unexplained_codes), None)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (layer rates and the first diverging layers included)."""
        layers = {
            name: {
                **asdict(lp),
                "code_mismatch_rate": lp.code_mismatch_rate,
                "isolated_mismatch_rate": lp.isolated_mismatch_rate,
            }
            for name, lp in self.layers.items()
        }
        return {
            "max_abs_diff": self.max_abs_diff,
            "max_rel_diff": self.max_rel_diff,
            "min_cosine": self.min_cosine,
            "top1_agreement": self.top1_agreement,
            "batches": self.batches,
            "first_diverging": self.first_diverging,
            "first_unexplained": self.first_unexplained,
            "reference": None if self.reference is None else asdict(self.reference),
            "size_differs": {
                str(i): {"torch": list(a), "onnx": list(b)}
                for i, (a, b) in self.size_differs.items()
            },
            "layers": layers,
        }


def parity(
    prepared: nn.Module,
    onnx_model: str | Path | Any,
    batches: Iterable[torch.Tensor | Sequence[torch.Tensor]],
    *,
    per_layer: bool = False,
    reference: bool = False,
    instance_rows: bool = False,
) -> ParityReport:
    """Compare ``prepared`` (fake quant in torch) with its exported ONNX in ORT, batch by batch.

    With ``per_layer=True`` every activation quantizer is also compared by name, free-running and
    isolated (see the module docstring); the ONNX graph is extended with the tensors entering
    each QuantizeLinear and leaving each DequantizeLinear as outputs (the file is not changed).
    With ``reference=True`` a float64 copy of ``prepared`` also runs (see the module docstring);
    ``prepared`` itself is not changed.

    ``instance_rows=True`` (per-image detectors, batches of one): a quantizer input whose leading
    axis is longer than 1 holds one row per instance (RoI, detection) that upstream data-dependent
    ops selected (top-k, NMS, score thresholds). Teacher forcing replaces quantized activations,
    not those float selections, so a score within rounding of a cut can select another instance
    in torch than in ORT, and that whole row differs. Isolated rows are then matched as a set:
    a torch row equal within rounding to an ORT row of the same call (at any index) is compared
    with it (a row whose nearest ORT row differs beyond rounding in under half its elements is the
    same instance with wrong values: compared, its codes unexplained); one that matches none is
    counted in :attr:`LayerParity.reselected_rows`, not in ``unexplained_codes``. A wrong weight,
    scale or op changes every row, not a few.

    Example:
        >>> report = parity(prepared, "model.onnx", [x], per_layer=True)  # doctest: +SKIP
        >>> report.top1_agreement, report.first_diverging, report.first_unexplained  # doctest: +SKIP
        (1.0, None, None)
    """
    import onnx

    from qdq.backends.ort_session import run, session

    base_dir = None  # a file's external data (models past 2 GB) stays on disk, read by ORT
    if hasattr(onnx_model, "graph"):
        model = onnx_model
    else:
        model = onnx.load(str(onnx_model), load_external_data=False)
        base_dir = Path(onnx_model).parent
    taps: dict[str, list[tuple[str, str]]] = {}
    n_out = len(model.graph.output)  # a tapped tensor may already be a model output
    if per_layer:
        model = with_quantizer_outputs(model, taps)
    sess = session(model, base_dir=base_dir)
    quantizers = {
        p: m for p, m in prepared.named_modules() if p in taps and isinstance(m, Quantizer)
    }
    out_names = [o.name for o in sess.get_outputs()]
    ends = _EndToEnd()
    exact, ref_error = _float64_copy(prepared) if reference else (None, None)
    stats: dict[str, LayerParity] = {}
    order: dict[str, None] = {}
    count = 0
    device = next((t.device for t in (*prepared.parameters(), *prepared.buffers())), None)
    was_training = prepared.training
    prepared.eval()
    try:
        with torch.no_grad():
            for batch in batches:
                inputs = [batch] if isinstance(batch, torch.Tensor) else list(batch)
                theirs = run(sess, inputs)  # ORT on the CPU; torch where the model is
                inputs = [
                    t.to(device) if isinstance(t, torch.Tensor) and device is not None else t
                    for t in inputs
                ]
                by_name = dict(zip(out_names, theirs, strict=True))
                with Recorder(quantizers) as free:
                    ours = _flatten_outputs(prepared(*inputs))
                ends.add(ours, theirs[:n_out])
                if exact is not None:
                    try:
                        ends.add_reference(_flatten_outputs(exact(*_float64(inputs))))
                    except Exception as err:  # an op with no float64 kernel, dtype-pinned code
                        exact, ref_error = None, f"float64 forward failed: {_one_line(err)}"
                        ends.drop_reference()
                if quantizers:
                    forced = {p: [by_name[v] for _, v in sites] for p, sites in taps.items()}
                    with Recorder(quantizers, forced) as isolated:
                        prepared(*inputs)
                    for path in [*free.order, *isolated.order]:
                        order.setdefault(path)
                    for path, q in quantizers.items():
                        stats[path] = fold(
                            stats.get(path),
                            q,
                            taps[path],
                            by_name,
                            free,
                            isolated,
                            path,
                            instance_rows,
                        )
                count += 1
    finally:
        prepared.train(was_training)
    if count == 0:
        raise ValueError("parity needs at least one batch")
    ordered = {p: stats[p] for p in order if p in stats}
    ordered.update(stats)
    return ends.report(count, ordered, ref_error if reference else None, reference)


def _float64_copy(prepared: nn.Module) -> tuple[nn.Module | None, str | None]:
    """A float64 deep copy of ``prepared`` in eval mode, or ``None`` and why not."""
    try:
        return copy.deepcopy(prepared).double().eval(), None
    except Exception as err:  # a module that cannot be copied
        return None, f"cannot copy the model to float64: {_one_line(err)}"


def _float64(inputs: list[Any]) -> list[Any]:
    return [
        t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs
    ]


def _one_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"


class _EndToEnd:
    """Running end-to-end statistics of the model outputs."""

    def __init__(self) -> None:
        self.max_abs = self.max_ref = 0.0
        self.min_cos = 1.0
        self.agree = self.rows = 0
        self._last: list[tuple[int, np.ndarray, np.ndarray]] = []
        self._outputs = 0
        self.size_differs: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self.ref_max = [0.0, 0.0]  # torch, ORT
        self.ref_by_output: list[list[float]] = [[], []]  # per side, per output
        self.ref_flips: list[list[tuple[int, float]]] = [[], []]  # per side: (output, margin)
        self.ref_agree = [0, 0]
        self.ref_rows = 0
        self.ref_ok = True

    def add(self, ours: list[torch.Tensor], theirs: list[np.ndarray]) -> None:
        self._last = []
        self._outputs = len(ours)
        if len(ours) != len(theirs):
            raise ValueError(f"torch returned {len(ours)} output tensors, the ONNX {len(theirs)}")
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            a_np = a.detach().cpu().numpy()
            if a_np.shape != b.shape:  # a value-dependent size: detections kept after NMS
                self.size_differs.setdefault(i, (tuple(a_np.shape), tuple(b.shape)))
                continue
            self._last.append((i, a_np, b))
            self.max_abs = max(self.max_abs, float(np.abs(a_np - b).max(initial=0.0)))
            self.max_ref = max(self.max_ref, float(np.abs(a_np).max(initial=0.0)))
            self.min_cos = min(self.min_cos, cosine(a_np, b))
            if a_np.ndim == 2:
                self.agree += int((a_np.argmax(1) == b.argmax(1)).sum())
                self.rows += a_np.shape[0]

    def add_reference(self, exact: list[torch.Tensor]) -> None:
        """Compare the last :meth:`add`'s torch and ORT outputs with the float64 ones."""
        if len(exact) != self._outputs:
            raise ValueError(f"the float64 copy returned {len(exact)} outputs, not {self._outputs}")
        for i, a, b in self._last:
            r_np = exact[i].detach().cpu().numpy()
            if r_np.shape != a.shape:  # value-dependent size: not comparable
                continue
            for side, other in enumerate((a, b)):  # 0: torch, 1: ORT
                diff = float(np.abs(other.astype(np.float64) - r_np).max(initial=0.0))
                self.ref_max[side] = max(self.ref_max[side], diff)
                by_output = self.ref_by_output[side]
                by_output.extend([0.0] * (self._outputs - len(by_output)))
                by_output[i] = max(by_output[i], diff)
                if r_np.ndim == 2:
                    ours, exact_top = other.argmax(1), r_np.argmax(1)
                    self.ref_agree[side] += int((ours == exact_top).sum())
                    rows = np.flatnonzero(ours != exact_top)
                    margins = r_np[rows, exact_top[rows]] - r_np[rows, ours[rows]]
                    self.ref_flips[side].extend((i, float(m)) for m in margins)
            if r_np.ndim == 2:
                self.ref_rows += r_np.shape[0]

    def drop_reference(self) -> None:
        self.ref_ok = False

    def report(
        self, count: int, layers: dict[str, LayerParity], error: str | None, wanted: bool
    ) -> ParityReport:
        rel = self.max_abs / self.max_ref if self.max_ref > 0 else self.max_abs
        top1 = self.agree / self.rows if self.rows else None
        ref = None
        if wanted:
            if error is not None or not self.ref_ok:
                ref = ReferenceParity(None, None, float("nan"), float("nan"), error)
            else:
                rows = self.ref_rows
                ref = ReferenceParity(
                    self.ref_agree[0] / rows if rows else None,
                    self.ref_agree[1] / rows if rows else None,
                    self.ref_max[0],
                    self.ref_max[1],
                    torch_max_abs_diff_by_output=tuple(self.ref_by_output[0]),
                    onnx_max_abs_diff_by_output=tuple(self.ref_by_output[1]),
                    torch_top1_flips=tuple(self.ref_flips[0]),
                    onnx_top1_flips=tuple(self.ref_flips[1]),
                )
        return ParityReport(
            self.max_abs, rel, self.min_cos, top1, count, layers, ref, dict(self.size_differs)
        )


def _flatten_outputs(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in _flatten_outputs(v)]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in _flatten_outputs(v)]
    return []
