"""Per-quantizer comparison of torch fake quant with its ONNX export in ONNX Runtime.

The machinery behind :func:`qdq.backends.parity.parity` with ``per_layer=True``: the ONNX graph
extended with the tensors entering each QuantizeLinear and leaving each DequantizeLinear
(:func:`with_quantizer_outputs`), hooks on torch's quantizers that record them and, for the
isolated view, replace each output by ORT's (:class:`Recorder`), and the folding of one batch's
call sites into a :class:`LayerParity` (:func:`fold`): free-running codes, Q/DQ bit-exactness, and
isolated codes beyond a rounding-boundary flip (instance rows matched as a set for per-image
detectors).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from qdq.lint.formats import is_dequantize
from qdq.quant import BlockQuantizer, Quantizer, fake_quant, scale_from_amax
from qdq.quant.blocks import block_scales
from qdq.quant.blocks_fp4 import e8m0_scale
from qdq.quant.primitives import FP8_MAX

__all__ = [
    "EXPLAINED_FRACTION",
    "LayerParity",
    "Recorder",
    "cosine",
    "fold",
    "with_quantizer_outputs",
]

#: A code that differs while the pre-quantization values differ by less than this fraction of the
#: quantization step is a rounding-boundary flip (float accumulation order), not a real mismatch.
EXPLAINED_FRACTION = 0.01


@dataclass(frozen=True)
class LayerParity:
    """One activation quantizer, torch vs ORT, summed over call sites and batches.

    Attributes:
        max_abs_diff: free-running, largest |torch - ORT| of the dequantized output.
        cosine: free-running, smallest cosine of the dequantized outputs.
        differing_codes: free-running, elements whose INT8 code differs (includes flips that
            cascaded from earlier layers).
        elements: elements compared.
        qdq_mismatches: ORT's own pre-quantization tensor fake-quantized by torch vs ORT's
            DequantizeLinear output, bitwise: a test of the Q/DQ numerics alone. Must be 0.
        isolated_codes: isolated (teacher-forced), elements whose code differs.
        unexplained_codes: isolated codes that differ by more than a rounding-boundary flip.
        isolated_max_abs_diff: isolated, largest |torch - ORT| before quantization.
        rows: ``instance_rows=True`` only: instance rows compared (leading axis of a call site
            whose leading size is above 1 at batch 1: RoIs, detections).
        reselected_rows: of ``rows``, torch rows that no ORT row of the same call matches within
            rounding: an instance the two runtimes selected differently (a score or IoU within
            rounding of a threshold or top-k cut upstream). Their codes are not in
            ``unexplained_codes``.
    """

    max_abs_diff: float
    cosine: float
    differing_codes: int
    elements: int
    qdq_mismatches: int = 0
    isolated_codes: int = 0
    unexplained_codes: int = 0
    isolated_max_abs_diff: float = 0.0
    rows: int = 0
    reselected_rows: int = 0

    @property
    def code_mismatch_rate(self) -> float:
        """Free-running ``differing_codes / elements``."""
        return self.differing_codes / self.elements if self.elements else 0.0

    @property
    def isolated_mismatch_rate(self) -> float:
        """Isolated ``isolated_codes / elements``."""
        return self.isolated_codes / self.elements if self.elements else 0.0


class Recorder:
    """Hooks on the quantizers: record inputs and outputs per call; optionally replace each
    output by the matching ORT tensor (same call site, matched by shape).

    Every recorded tensor is a copy and every replacement a fresh tensor: the model may write
    into a quantizer's output in place afterwards (RepGhostNet's ``x += shortcut`` on the
    output of an identity ``relu`` whose input is quantized), which would otherwise change the
    record and the ORT tensor the replacement was made from."""

    def __init__(
        self, quantizers: dict[str, Quantizer], forced: dict[str, list[np.ndarray]] | None = None
    ) -> None:
        self.quantizers = quantizers
        self.forced = {p: list(v) for p, v in forced.items()} if forced is not None else None
        self.inputs: dict[str, list[torch.Tensor]] = {}
        self.outputs: dict[str, list[torch.Tensor]] = {}
        self.order: list[str] = []
        self._hooks: list[Any] = []

    def __enter__(self) -> Recorder:
        for path, q in self.quantizers.items():
            self._hooks.append(q.register_forward_hook(self._hook(path)))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    def _hook(self, path: str) -> Any:
        def hook(module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor | None:
            if path not in self.inputs:
                self.order.append(path)
            self.inputs.setdefault(path, []).append(args[0].detach().clone())
            self.outputs.setdefault(path, []).append(output.detach().clone())
            if self.forced is None:
                return None
            pending = self.forced.get(path, [])
            match = next((i for i, t in enumerate(pending) if t.shape == output.shape), None)
            if match is None:
                return None
            return torch.tensor(pending.pop(match), device=output.device, dtype=output.dtype)

        return hook


def _take(calls: list[torch.Tensor], shape: tuple[int, ...]) -> np.ndarray | None:
    """Pop the first recorded call of ``shape`` (one call site per ONNX tap)."""
    match = next((i for i, t in enumerate(calls) if tuple(t.shape) == shape), None)
    return calls.pop(match).cpu().numpy() if match is not None else None


def fold(
    old: LayerParity | None,
    q: Quantizer,
    sites: list[tuple[str, str]],
    by_name: dict[str, np.ndarray],
    free: Recorder,
    isolated: Recorder,
    path: str,
    instance_rows: bool = False,
) -> LayerParity:
    """Fold every call site of quantizer ``path`` in one batch into its running statistics."""
    lp = old or LayerParity(0.0, 1.0, 0, 0)
    if isinstance(q, BlockQuantizer):
        return _fold_block(lp, q, sites, by_name, free, isolated, path)
    free_out = list(free.outputs.get(path, []))
    iso_in = list(isolated.inputs.get(path, []))
    for pre_name, value_name in sites:
        pre, value = by_name[pre_name], by_name[value_name]
        scale = _scale(q, value.ndim)
        ours_on_theirs = fake_quant(
            torch.from_numpy(pre),
            q.amax.detach().cpu(),
            axis=q.spec.axis,
            narrow_range=q.spec.narrow_range,
            fmt=q.spec.format,
        ).numpy()
        exact = int((ours_on_theirs.view(np.int32) != value.view(np.int32)).sum())
        lp = replace(lp, qdq_mismatches=lp.qdq_mismatches + exact)
        ours = _take(free_out, value.shape)
        if ours is not None:
            lp = _free_running(lp, ours, value, _codes(ours, scale, q) != _codes(value, scale, q))
        ours_pre = _take(iso_in, pre.shape)
        if ours_pre is not None:
            ours_pre = ours_pre.astype(np.float32)
            if instance_rows and pre.ndim >= 2 and pre.shape[0] > 1:
                lp = _isolated_rows(lp, q, ours_pre, pre, scale)
            else:
                lp = _isolated(lp, q, ours_pre, pre, scale)
    return lp


def _free_running(
    lp: LayerParity, ours: np.ndarray, value: np.ndarray, codes: np.ndarray
) -> LayerParity:
    """``lp`` with one free-running call site: torch's output ``ours`` against ORT's ``value``
    (``codes``: the elements whose code differs)."""
    return replace(
        lp,
        max_abs_diff=max(lp.max_abs_diff, float(np.abs(ours - value).max(initial=0.0))),
        cosine=min(lp.cosine, cosine(ours, value)),
        differing_codes=lp.differing_codes + int(codes.sum()),
        elements=lp.elements + codes.size,
    )


def _fold_block(
    lp: LayerParity,
    q: BlockQuantizer,
    sites: list[tuple[str, str]],
    by_name: dict[str, np.ndarray],
    free: Recorder,
    isolated: Recorder,
    path: str,
) -> LayerParity:
    """:func:`fold` for a block-format activation quantizer (NVFP4, MXFP8). Its scales are the
    blocks' own, computed at run time from the tensor itself, so a "code" is compared as the
    dequantized value, bitwise; a value whose block scale moved because the block's largest
    element crossed a rounding boundary differs with no gap of its own, and counts as a flip."""
    free_out = list(free.outputs.get(path, []))
    iso_in = list(isolated.inputs.get(path, []))
    for pre_name, value_name in sites:
        pre = np.ascontiguousarray(by_name[pre_name], dtype=np.float32)
        value = np.ascontiguousarray(by_name[value_name], dtype=np.float32)
        theirs = q.fake_quant_value(torch.from_numpy(pre)).numpy()
        exact = int((theirs.view(np.int32) != value.view(np.int32)).sum())
        lp = replace(lp, qdq_mismatches=lp.qdq_mismatches + exact)
        ours = _take(free_out, value.shape)
        if ours is not None:
            ours = np.ascontiguousarray(ours, dtype=np.float32)
            lp = _free_running(lp, ours, value, ours.view(np.int32) != value.view(np.int32))
        ours_pre = _take(iso_in, pre.shape)
        if ours_pre is not None:
            ours_pre = np.ascontiguousarray(ours_pre, dtype=np.float32)
            mine = q.fake_quant_value(torch.from_numpy(ours_pre)).numpy()
            differ = mine.view(np.int32) != theirs.view(np.int32)
            gap = np.abs(ours_pre - pre)
            unexplained = differ & (gap >= EXPLAINED_FRACTION * _block_step(q, pre))
            lp = replace(
                lp,
                isolated_codes=lp.isolated_codes + int(differ.sum()),
                unexplained_codes=lp.unexplained_codes + int(unexplained.sum()),
                isolated_max_abs_diff=max(lp.isolated_max_abs_diff, float(gap.max(initial=0.0))),
            )
    return lp


def _block_step(q: BlockQuantizer, x: np.ndarray) -> np.ndarray:
    """The quantization step at each element of ``x`` in ``q``'s block format: the element
    grid's spacing around ``|x| / s`` (E2M1: 0.5 below 2, 1 below 4, 2 above; E4M3: ``2**(e-3)``,
    ``2**-9`` below ``2**-6``) times the element's block scale ``s``."""
    t = torch.from_numpy(x)
    axis = q.spec.axis if q.spec.axis is not None else -1
    fmt = q.block_format
    sb, gs = block_scales(t, fmt, q._amax_arg(), axis, check_amax=False)
    s = sb * gs if gs is not None else e8m0_scale(sb) if fmt.element == "e4m3" else sb
    size = fmt.block_size or 1
    scale = s.repeat_interleave(size, dim=axis).numpy().astype(np.float64)
    mag = np.abs(x.astype(np.float64)) / scale
    if fmt.element == "e2m1":
        spacing = np.where(mag < 2, 0.5, np.where(mag < 4, 1.0, 2.0))
    else:
        exponent = np.floor(np.log2(np.maximum(np.minimum(mag, FP8_MAX), 2.0**-6)))
        spacing = np.ldexp(1.0, (exponent - 3).astype(np.int64))
    return spacing * scale


def _isolated(
    lp: LayerParity, q: Quantizer, ours: np.ndarray, theirs: np.ndarray, scale: np.ndarray
) -> LayerParity:
    differ, unexplained, gap = _differ(q, ours, theirs, scale)
    return replace(
        lp,
        isolated_codes=lp.isolated_codes + int(differ.sum()),
        unexplained_codes=lp.unexplained_codes + int(unexplained.sum()),
        isolated_max_abs_diff=max(lp.isolated_max_abs_diff, float(gap.max(initial=0.0))),
    )


def _differ(
    q: Quantizer, ours: np.ndarray, theirs: np.ndarray, scale: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Elements whose code differs, those of them beyond a rounding-boundary flip, and
    ``|ours - theirs|``."""
    differ = _codes(ours, scale, q) != _codes(theirs, scale, q)
    gap = np.abs(ours - theirs)
    return differ, differ & (gap >= EXPLAINED_FRACTION * _step(ours, scale, q)), gap


def _isolated_rows(
    lp: LayerParity, q: Quantizer, ours: np.ndarray, theirs: np.ndarray, scale: np.ndarray
) -> LayerParity:
    """:func:`_isolated` over instance rows matched as a set (``parity(instance_rows=True)``)."""
    scale = np.broadcast_to(scale, ours.shape)
    n = ours.shape[0]

    def unexplained(i: int, j: int) -> np.ndarray:
        return _differ(q, ours[i], theirs[j], scale[i])[1]

    pairs = {i: i for i in range(n) if not unexplained(i, i).any()}
    left = [i for i in range(n) if i not in pairs]
    taken = set(pairs.values())
    free = [j for j in range(n) if j not in taken]
    if left and free:  # the same instance at another index (one selected or dropped before it)
        a = torch.from_numpy(ours[left].reshape(len(left), -1)).double()
        b = torch.from_numpy(theirs[free].reshape(len(free), -1)).double()
        nearest = torch.cdist(a, b, p=1).argsort(dim=1)[:, :4].tolist()
        candidates = {i: [free[c] for c in order] for i, order in zip(left, nearest, strict=True)}
        for i in left:  # equal within rounding
            j = next(
                (j for j in candidates[i] if j not in taken and not unexplained(i, j).any()), None
            )
            if j is not None:
                pairs[i] = j
                taken.add(j)
        for i in left:  # the same instance with some values wrong: compared
            j = next((j for j in candidates[i] if j not in taken), None)
            if i not in pairs and j is not None and unexplained(i, j).mean() < 0.5:
                pairs[i] = j
                taken.add(j)
    index = np.array(sorted(pairs), dtype=np.int64)
    matched = np.array([pairs[i] for i in index], dtype=np.int64)
    if len(index):
        lp = _isolated(lp, q, ours[index], theirs[matched], scale[index])
    return replace(lp, rows=lp.rows + n, reselected_rows=lp.reselected_rows + n - len(index))


def _codes(x: np.ndarray, scale: np.ndarray, q: Quantizer) -> np.ndarray:
    """``q``'s codes of ``x``: integers, or FP8 values (as float32) for an FP8 quantizer."""
    if q.spec.format == "fp8":
        scaled = torch.from_numpy(np.ascontiguousarray(x / scale, dtype=np.float32))
        return scaled.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float().numpy()
    qmin = -127 if q.spec.narrow_range else -128
    return np.clip(np.round(x / scale), qmin, 127)


def _step(x: np.ndarray, scale: np.ndarray, q: Quantizer) -> np.ndarray:
    """The quantization step at each element of ``x``: the scale (INT8), or the spacing of the
    FP8 grid around ``|x| / scale`` times the scale (``2**(e-3)`` for a normal E4M3 value of
    exponent ``e``, ``2**-9`` below ``2**-6``), at least INT8's step at the same amax
    (``amax / 127``): float accumulation noise scales with the tensor's magnitude, not with the
    element's, so near zero, where FP8's steps are tiny, a conv output computed in another order
    moves by more than 1 % of the local step (measured: 3.4e-8 on a value of 2.5e-5 whose FP8
    step is 3.0e-6, in a tensor with amax 0.68)."""
    scale = np.broadcast_to(scale, x.shape)
    if q.spec.format != "fp8":
        return scale
    mag = np.minimum(np.abs(x / scale), FP8_MAX).astype(np.float64)
    exponent = np.floor(np.log2(np.maximum(mag, 2.0**-6)))
    local = np.ldexp(1.0, (exponent - 3).astype(np.int64)) * scale
    return np.maximum(local, scale * (FP8_MAX / 127.0))


def _scale(q: Quantizer, ndim: int) -> np.ndarray:
    """The float32 scale torch and the exporter use, broadcastable to an ``ndim`` tensor."""
    scale = scale_from_amax(q.amax.detach().cpu(), fmt=q.spec.format).numpy()
    if q.spec.axis is not None and scale.ndim == 1:
        shape = [1] * ndim
        shape[q.spec.axis] = -1
        scale = scale.reshape(shape)
    return scale


def with_quantizer_outputs(model: Any, taps: dict[str, list[tuple[str, str]]]) -> Any:
    """A copy of ``model`` that also outputs, for every activation quantizer, the tensor entering
    its QuantizeLinear (a block format's: TensorRT's dynamic block quantize) and the tensor
    leaving its DequantizeLinear."""
    import onnx

    extended = onnx.ModelProto()
    extended.CopyFrom(model)
    existing = {o.name for o in extended.graph.output}
    quantize = {
        n.output[0]: n
        for n in extended.graph.node
        if n.op_type == "QuantizeLinear" and n.output and n.input  # malformed: ORT says why
    }
    # a block format's activation: TensorRT's dynamic block quantize, its values' output read
    # by the quantizer's last DequantizeLinear (qdq.export.blocks_onnx)
    dynamic = {
        n.output[0]: n
        for n in extended.graph.node
        if n.domain == "trt" and n.op_type.endswith("DynamicQuantize") and n.output and n.input
    }
    for node in extended.graph.node:
        # ONNX's DequantizeLinear, or TensorRT's MXFP8 one (block_form="trt")
        if not is_dequantize(node) or "/" not in node.name or not node.output:
            continue
        path, _, tail = node.name.rpartition("/")
        if not re.fullmatch(r"DequantizeLinear(_\d+)?", tail) or path.endswith("weight_quantizer"):
            continue  # weights, and the per-consumer copies ("....1") of a DequantizeLinear
        q = (quantize.get(node.input[0]) or dynamic.get(node.input[0])) if node.input else None
        if q is None:
            continue
        taps.setdefault(path, []).append((q.input[0], node.output[0]))
        for name in (q.input[0], node.output[0]):
            if name not in existing:
                extended.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
                existing.add(name)
    return extended


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    na, nb = np.linalg.norm(a64), np.linalg.norm(b64)
    if na == 0.0 or nb == 0.0:
        return 1.0 if na == nb else 0.0
    return float(a64 @ b64 / (na * nb))
