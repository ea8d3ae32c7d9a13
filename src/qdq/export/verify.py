"""Numeric check of an export: the ONNX in ONNX Runtime against the torch fake-quant model.

What counts as "float noise"
----------------------------
torch and ONNX Runtime run the same Q/DQ numerics (bit-exact on the same input) but accumulate
convolutions and matrix products in different orders. A value that lands within float rounding of a
code boundary is therefore sometimes quantized to the neighbouring code: an error of **one
quantization step on one element**. Quantization itself moves *every* element by up to half a step.
So the distance between the two exports of a correct graph is a small fraction of the distance that
quantization puts between the fake-quant model and the float model, and a wrong graph (a silently
specialized branch, a scale on the wrong tensor) is far beyond it. For every output the check is

    ‖ORT − torch_quant‖₂  ≤  ‖torch_quant − torch_float‖₂  +  floor · ‖torch_quant‖₂

over all check batches together, where ``torch_float`` is the same model with every quantizer
bypassed and ``floor`` absorbs float accumulation differences when quantization changes almost
nothing (1e-4, or 1e-2 for ``fp16`` exports, whose float remainder runs in half precision).
Integer and bool outputs may differ in no more elements than quantization itself changes.

In a deep network a single flipped code changes the input of every later layer, and the flips can
cascade until the two float orders differ by as much as quantization itself (measured on a
random-weight ViT-Ti with INT8 attention: 0.333 against 0.315). When an output fails the bound, a
float64 copy of the fake-quant model (exact INT8 accumulation: the arithmetic TensorRT does) is
the arbiter: the export passes when ONNX Runtime is no further from it than torch's own float32
forward is (``REFERENCE_SLACK`` times, plus the floor). A wrong graph is far from it while torch is
close, so the check keeps its teeth.
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from qdq._io import onnx_input_names
from qdq.quant import quantizer_mode

__all__ = ["FLOOR_FP16", "FLOOR_FP32", "REFERENCE_SLACK", "OutputCheck", "verify_numerics"]

_log = logging.getLogger("qdq.export")

#: Relative float floor of the comparison (see the module docstring).
FLOOR_FP32, FLOOR_FP16 = 1e-4, 1e-2
#: ORT may be this many times further than torch float32 from the float64 reference
REFERENCE_SLACK = 1.5


@dataclass(frozen=True)
class OutputCheck:
    """One output over all check batches: the three L2 distances of the module docstring."""

    name: str
    ort_vs_torch: float
    quant_noise: float
    reference: float
    first_batch: int  # the first batch whose output differs beyond tolerance on its own (or -1)

    def tolerance(self, floor: float) -> float:
        """The largest ``ort_vs_torch`` that counts as float noise."""
        return self.quant_noise + floor * self.reference


def verify_numerics(
    onnx_model: bytes | Path,
    model: nn.Module,
    batches: Sequence[tuple[Any, ...]],
    *,
    to_model: Callable[[tuple[Any, ...]], tuple[Any, ...]],
    fp16: bool,
    error: type[Exception],
) -> list[OutputCheck]:
    """Run ``onnx_model`` in ONNX Runtime and ``model`` in torch on ``batches``; compare outputs.

    Args:
        onnx_model: the serialized ONNX model, or its path (a model with external data, whose
            data file ONNX Runtime finds beside it).
        model: the model that was exported (quantizers in their export state: calibrated).
        batches: tuples of positional inputs, as given to the exporter.
        to_model: maps a batch to the model's inputs (e.g. a cast to float16).
        fp16: the export's float remainder is float16 (a looser float floor).
        error: the exception type raised on a mismatch.

    Returns:
        One :class:`OutputCheck` per output.

    Raises:
        error: ONNX Runtime cannot run the model, or an output differs beyond float noise (the
            message names the first diverging output and batch).
    """
    from qdq.backends.onnxruntime import session

    try:
        sess = session(onnx_model)
    except Exception as err:  # ORT raises its own exception types
        raise error(f"ONNX Runtime cannot load the exported model: {err}") from None
    names = [i.name for i in sess.get_inputs()]
    out_names = [o.name for o in sess.get_outputs()]
    floor = FLOOR_FP16 if fp16 else FLOOR_FP32
    sums: dict[int, list[float]] = {}
    first_bad: dict[int, int] = {}
    seen: list[tuple[Any, list[torch.Tensor], list[np.ndarray]]] = []  # (args, torch, ORT)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for b, batch in enumerate(batches):
                tensors = [a for a in batch if isinstance(a, torch.Tensor)]
                feed = {
                    n: t.detach().cpu().numpy()
                    for n, t in zip(onnx_input_names(len(tensors)), tensors, strict=True)
                }
                feed = {n: v for n, v in feed.items() if n in names}
                try:
                    theirs = sess.run(None, feed)
                except Exception as err:
                    raise error(
                        f"ONNX Runtime cannot run the exported model on check batch {b} "
                        f"(shapes {[tuple(t.shape) for t in tensors]}): {err}"
                    ) from None
                args = to_model(batch)
                quant = _flatten(model(*args))
                with quantizer_mode(model, "bypass"):
                    flt = _flatten(model(*args))
                if len(quant) != len(theirs):
                    warnings.warn(
                        f"numeric check skipped: torch returns {len(quant)} tensors, the ONNX "
                        f"model {len(theirs)} outputs",
                        stacklevel=3,
                    )
                    return []
                seen.append((args, quant, theirs))
                for i, (q, f, o) in enumerate(zip(quant, flt, theirs, strict=True)):
                    acc = sums.setdefault(i, [0.0, 0.0, 0.0])
                    d, n, r = _distances(q, f, o)
                    acc[0] += d
                    acc[1] += n
                    acc[2] += r
                    if i not in first_bad and d**0.5 > n**0.5 + floor * r**0.5:
                        first_bad[i] = b
    finally:
        model.train(was_training)
    checks = [
        OutputCheck(out_names[i], d**0.5, n**0.5, r**0.5, first_bad.get(i, -1))
        for i, (d, n, r) in sorted(sums.items())
    ]
    failed = [i for i, c in enumerate(checks) if c.ort_vs_torch > c.tolerance(floor)]
    del sess  # ORT's copy of the weights goes before the float64 copy of the model is made
    exact = _against_float64(model, seen, failed) if failed and not fp16 else {}
    for i in failed:
        c = checks[i]
        ort_ref, torch_ref = exact.get(i, (float("inf"), 0.0))
        if ort_ref <= REFERENCE_SLACK * torch_ref + floor * c.reference:
            _log.info(
                "numeric check: %s differs from torch by %.4g but is %.4g from the float64 "
                "reference, torch float32 %.4g: float accumulation order",
                c.name,
                c.ort_vs_torch,
                ort_ref,
                torch_ref,
            )
            continue
        batch_note = f" (first seen on check batch {c.first_batch})" if c.first_batch >= 0 else ""
        ref_note = (
            f"; it is {ort_ref:.4g} from the float64 fake-quant model, torch float32 {torch_ref:.4g}"
            if i in exact
            else ""
        )
        raise error(
            f"the exported ONNX does not compute what the torch model computes: output "
            f"{c.name!r} differs from torch by {c.ort_vs_torch:.4g} (L2){batch_note}, beyond "
            f"float noise (the quantization error itself, {c.quant_noise:.4g}, plus "
            f"{floor:g} x {c.reference:.4g}){ref_note}. Usually the model's forward depends on "
            "tensor values (Python control flow) or on inputs the exporter fixed; pass "
            "verify=False only if you have checked the file another way"
        )
    _log.info(
        "numeric check: %s",
        ", ".join(f"{c.name} {c.ort_vs_torch:.3g} <= {c.tolerance(floor):.3g}" for c in checks),
    )
    return checks


def _against_float64(
    model: nn.Module,
    seen: list[tuple[Any, list[torch.Tensor], list[np.ndarray]]],
    outputs: list[int],
) -> dict[int, tuple[float, float]]:
    """For each output index: L2 distances of ORT and of torch float32 to a float64 copy of
    ``model`` over the same batches (empty when the copy cannot run)."""
    try:
        exact = copy.deepcopy(model).double().eval()
        sums = {i: [0.0, 0.0] for i in outputs}
        with torch.no_grad():
            for args, quant, theirs in seen:
                wide = tuple(
                    a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                    for a in args
                )
                ref = _flatten(exact(*wide))
                for i in outputs:
                    r = ref[i].detach().cpu().numpy()
                    if not np.issubdtype(r.dtype, np.floating) or r.shape != theirs[i].shape:
                        return {}
                    q = quant[i].detach().cpu().numpy().astype(np.float64)
                    sums[i][0] += float(((theirs[i].astype(np.float64) - r) ** 2).sum())
                    sums[i][1] += float(((q - r) ** 2).sum())
    except Exception as err:  # no float64 kernel, float32-pinned model code
        _log.info("numeric check: no float64 reference (%s)", err)
        return {}
    return {i: (o**0.5, t**0.5) for i, (o, t) in sums.items()}


def _distances(q: torch.Tensor, f: torch.Tensor, o: np.ndarray) -> tuple[float, float, float]:
    """Squared L2 of ORT − quant and quant − float, and of quant; counts for non-float outputs."""
    qn = q.detach().cpu().numpy()
    fn = f.detach().cpu().numpy()
    if qn.shape != o.shape:
        return float("inf"), 0.0, 0.0
    if not np.issubdtype(qn.dtype, np.floating):
        return float((qn != o).sum()), float((qn != fn).sum()), 0.0
    q64, f64, o64 = (a.astype(np.float64) for a in (qn, fn, o))
    same_nan = np.isnan(q64) == np.isnan(o64)
    if not same_nan.all():
        return float("inf"), 0.0, 0.0
    q64, f64, o64 = (np.nan_to_num(a, nan=0.0) for a in (q64, f64, o64))
    return (
        float(np.square(o64 - q64).sum()),
        float(np.square(q64 - f64).sum()),
        float(np.square(q64).sum()),
    )


def _flatten(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in _flatten(v)]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in _flatten(v)]
    return []
