"""ONNX Runtime on CPU with exact Q/DQ semantics, and torch ↔ ORT parity checks.

Sessions use ``GraphOptimizationLevel.ORT_ENABLE_BASIC``: Q/DQ nodes run as written. (At
``ORT_ENABLE_ALL`` ORT fuses them into integer kernels that saturate on AVX2 CPUs without VNNI and
do not represent TensorRT.) onnxruntime is imported lazily (extra ``qdq[onnx]``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from qdq.quant import fake_quant

__all__ = ["LayerParity", "ParityReport", "parity", "run", "session"]


def _ort() -> Any:
    try:
        import onnxruntime
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("onnxruntime is not installed: pip install 'qdq[onnx]'") from err
    return onnxruntime


def session(model: str | Path | bytes | Any, *, threads: int | None = None) -> Any:
    """An ``InferenceSession`` on the CPU at ``ORT_ENABLE_BASIC`` (exact Q/DQ).

    Args:
        model: a path, serialized bytes, or an ``onnx.ModelProto``.
        threads: intra-op threads (default: ORT's choice).
    """
    ort = _ort()
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    if threads is not None:
        opts.intra_op_num_threads = threads
    if hasattr(model, "SerializeToString"):
        model = model.SerializeToString()
    elif isinstance(model, (str, Path)):
        if not Path(model).is_file():
            raise FileNotFoundError(f"no ONNX file at {model}")
        model = str(model)
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def run(sess: Any, inputs: Sequence[torch.Tensor | np.ndarray]) -> list[np.ndarray]:
    """Run ``sess`` on positional inputs; return all outputs as numpy arrays."""
    names = [i.name for i in sess.get_inputs()]
    if len(inputs) != len(names):
        raise ValueError(f"the ONNX model takes {len(names)} inputs ({names}), got {len(inputs)}")
    feed = {
        n: (x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x))
        for n, x in zip(names, inputs, strict=True)
    }
    return list(sess.run(None, feed))


@dataclass(frozen=True)
class LayerParity:
    """One quantizer's dequantized output, torch vs ORT.

    ``differing_codes`` counts elements whose integer code differs. Once float ops (conv, BN) sit
    before a quantizer, the two frameworks accumulate in different orders, so a value that lands
    within ~1e-7 of a rounding boundary can round to the neighbouring code; the first quantizer
    (fed by the network input) must match exactly.
    """

    max_abs_diff: float
    cosine: float
    differing_codes: int
    elements: int
    qdq_mismatches: int = 0

    # ``qdq_mismatches``: ORT's own pre-quantization tensor fake-quantized by torch (qdq.fake_quant
    # with this quantizer's amax) vs ORT's DequantizeLinear output — a test of the Q/DQ numerics
    # alone, free of upstream float differences. It must be 0.

    @property
    def code_mismatch_rate(self) -> float:
        """``differing_codes / elements``."""
        return self.differing_codes / self.elements if self.elements else 0.0


@dataclass(frozen=True)
class ParityReport:
    """torch fake-quant vs ONNX Runtime on the same batches.

    Attributes:
        max_abs_diff: largest |torch - ORT| over all outputs and batches.
        max_rel_diff: ``max_abs_diff`` divided by the largest |torch| value.
        min_cosine: smallest per-batch cosine similarity of the flattened outputs.
        top1_agreement: fraction of rows whose argmax agrees (2-D outputs), else ``None``.
        layers: per quantizer path, a :class:`LayerParity` (``per_layer=True`` only).
    """

    max_abs_diff: float
    max_rel_diff: float
    min_cosine: float
    top1_agreement: float | None
    batches: int
    layers: dict[str, LayerParity] = field(default_factory=dict)


def parity(
    prepared: nn.Module,
    onnx_model: str | Path | Any,
    batches: Iterable[torch.Tensor | Sequence[torch.Tensor]],
    *,
    per_layer: bool = False,
) -> ParityReport:
    """Compare ``prepared`` (fake quant in torch) with its exported ONNX in ORT, batch by batch.

    With ``per_layer=True`` every quantizer's dequantized output is also compared by name (the
    ONNX graph is extended with those tensors as outputs; the file is not changed).
    """
    import onnx

    model = onnx_model if hasattr(onnx_model, "graph") else onnx.load(str(onnx_model))
    taps: dict[str, list[tuple[str, str]]] = {}
    if per_layer:
        model = _with_quantizer_outputs(model, taps)
    sess = session(model)
    captured: dict[str, list[torch.Tensor]] = {}
    hooks = []
    scales: dict[str, np.ndarray] = {}
    if per_layer:
        for path, module in prepared.named_modules():
            if path in taps:
                hooks.append(module.register_forward_hook(_capture(captured, path)))
                amax = getattr(module, "amax", torch.ones(()))
                scales[path] = (
                    torch.clamp(amax.detach().float() / 127, min=2.0**-24 / 127)
                ).numpy()
    out_names = [o.name for o in sess.get_outputs()]
    n_out = len(out_names) - 2 * sum(len(v) for v in taps.values())
    max_abs = max_ref = 0.0
    min_cos = 1.0
    agree = rows = 0
    layer_stats: dict[str, LayerParity] = {}
    count = 0
    was_training = prepared.training
    prepared.eval()
    try:
        with torch.no_grad():
            for batch in batches:
                captured.clear()
                inputs = [batch] if isinstance(batch, torch.Tensor) else list(batch)
                ours = _flatten_outputs(prepared(*inputs))
                theirs = run(sess, inputs)
                for a, b in zip(ours, theirs[:n_out], strict=True):
                    a_np = a.detach().cpu().numpy()
                    max_abs = max(max_abs, float(np.abs(a_np - b).max(initial=0.0)))
                    max_ref = max(max_ref, float(np.abs(a_np).max(initial=0.0)))
                    min_cos = min(min_cos, _cosine(a_np, b))
                    if a_np.ndim == 2:
                        agree += int((a_np.argmax(1) == b.argmax(1)).sum())
                        rows += a_np.shape[0]
                by_name = dict(zip(out_names, theirs, strict=True))
                for path, sites in taps.items():
                    calls = list(captured.get(path, []))
                    for pre_name, value_name in sites:
                        pre, value = by_name[pre_name], by_name[value_name]
                        match = next(
                            (i for i, t in enumerate(calls) if t.shape == value.shape), None
                        )
                        ours_t = calls.pop(match).cpu().numpy() if match is not None else None
                        layer_stats[path] = _layer(
                            layer_stats.get(path), prepared, path, ours_t, pre, value, scales[path]
                        )
                count += 1
    finally:
        prepared.train(was_training)
        for h in hooks:
            h.remove()
    if count == 0:
        raise ValueError("parity needs at least one batch")
    rel = max_abs / max_ref if max_ref > 0 else max_abs
    return ParityReport(max_abs, rel, min_cos, agree / rows if rows else None, count, layer_stats)


def _capture(store: dict[str, list[torch.Tensor]], path: str) -> Any:
    def hook(module: nn.Module, args: Any, output: torch.Tensor) -> None:
        store.setdefault(path, []).append(output.detach())

    return hook


def _layer(
    old: LayerParity | None,
    prepared: nn.Module,
    path: str,
    ours: np.ndarray | None,
    pre: np.ndarray,
    value: np.ndarray,
    scale: np.ndarray,
) -> LayerParity:
    """Fold one call site of quantizer ``path`` into its running :class:`LayerParity`."""
    amax = getattr(prepared.get_submodule(path), "amax", None)
    assert isinstance(amax, torch.Tensor)
    ours_on_theirs = fake_quant(torch.from_numpy(pre), amax).numpy()
    exact = int((ours_on_theirs.view(np.int32) != value.view(np.int32)).sum())
    prev = old or LayerParity(0.0, 1.0, 0, 0)
    if ours is None:  # no torch tensor of that shape at this call site: numerics check only
        return LayerParity(prev.max_abs_diff, prev.cosine, prev.differing_codes, prev.elements,
                           prev.qdq_mismatches + exact)  # fmt: skip
    codes = np.round(ours / scale) != np.round(value / scale)
    return LayerParity(
        max(prev.max_abs_diff, float(np.abs(ours - value).max(initial=0.0))),
        min(prev.cosine, _cosine(ours, value)),
        prev.differing_codes + int(codes.sum()),
        prev.elements + codes.size,
        prev.qdq_mismatches + exact,
    )


def _with_quantizer_outputs(model: Any, taps: dict[str, list[tuple[str, str]]]) -> Any:
    """A copy of ``model`` that also outputs, for every activation quantizer, the tensor entering
    its QuantizeLinear and the tensor leaving its DequantizeLinear."""
    import onnx

    extended = onnx.ModelProto()
    extended.CopyFrom(model)
    existing = {o.name for o in extended.graph.output}
    quantize = {n.output[0]: n for n in extended.graph.node if n.op_type == "QuantizeLinear"}
    for node in extended.graph.node:
        if node.op_type != "DequantizeLinear" or "/" not in node.name:
            continue
        path, _, tail = node.name.rpartition("/")
        if not re.fullmatch(r"DequantizeLinear(_\d+)?", tail) or path.endswith("weight_quantizer"):
            continue  # weights, and the per-consumer copies ("....1") of a DequantizeLinear
        q = quantize.get(node.input[0])
        if q is None:
            continue
        taps.setdefault(path, []).append((q.input[0], node.output[0]))
        for name in (q.input[0], node.output[0]):
            if name not in existing:
                extended.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
                existing.add(name)
    return extended


def _flatten_outputs(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in _flatten_outputs(v)]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in _flatten_outputs(v)]
    return []


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    na, nb = np.linalg.norm(a64), np.linalg.norm(b64)
    if na == 0.0 or nb == 0.0:
        return 1.0 if na == nb else 0.0
    return float(a64 @ b64 / (na * nb))
