"""Per-image mode of ``qdq quantize``: models that return one detection list per image.

torchvision's Faster/Keypoint/Mask R-CNN return, in eval mode, ``[{"boxes": (k_i, 4),
"labels": (k_i,), "scores": (k_i,), ...} per image]`` after NMS, ``k_i`` varying from image to
image: no output holds one row per sample. When the check stage sees such an output
(:func:`per_image_keys`), the job runs at **batch 1**: calibration, evaluation and the export
(TorchScript tracing fixes the batch anyway; the ONNX's outputs are image 0's tensors in the dict's
key order). ``report.json`` says ``"per_image": true`` and ``settings.batch_size`` is 1.

INT8 is compared with FP32 per image by :func:`qdq.pipeline.detections.detection_agreement`; the
headline is ``detection_f1``. A user metric, a dataset's task metric, ``--max-drop`` and QAT score
batch-major outputs and are refused in this mode; labels are ignored (with a warning).

The export is checked per quantizer (:func:`check_export`) instead of by the element-wise check
of :mod:`qdq.export.verify`, which cannot work after NMS (see there).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from qdq._modes import eval_no_grad
from qdq._progress import progress
from qdq.debug.stats import sample_cosines
from qdq.pipeline.detections import Detections, detection_agreement, is_detection_dict, match
from qdq.pipeline.device import module_device, to_device
from qdq.pipeline.evaluate import Measured
from qdq.pipeline.inputs import ForwardInputs, Inputs, batches, call, num_samples
from qdq.pipeline.stages import Stages

__all__ = [
    "check_export",
    "compare_lists",
    "evaluate",
    "headline",
    "ort_detections",
    "per_image_keys",
    "refuse_options",
    "score_model",
    "torch_detections",
]


def per_image_keys(output: Any, n: int) -> tuple[str, ...] | None:
    """The keys of a per-image detection output, else ``None``.

    ``output`` is per-image when it is a list or tuple of ``n`` dicts with the same keys, each
    one image's detections (:func:`~qdq.pipeline.detections.is_detection_dict`: ``boxes``
    ``(k, 4)``, ``scores`` ``(k,)``, every tensor ``k`` long).
    """
    if not isinstance(output, (list, tuple)) or len(output) != n or n < 1:
        return None
    if not all(is_detection_dict(d) for d in output):
        return None
    keys = tuple(output[0])
    return keys if all(tuple(d) == keys for d in output) else None


def refuse_options(spec: str, *, metric: bool, max_drop: bool, qat: bool) -> None:
    """Options that score batch-major outputs cannot run in per-image mode.

    Raises:
        ValueError: naming the option and why.
    """
    what = [
        name
        for name, on in (
            ("a metric (--metric or the dataset's task metric)", metric),
            ("--max-drop", max_drop),
            ("QAT", qat),
        )
        if on
    ]
    if what:
        raise ValueError(
            f"the model {spec} returns per-image detection lists (per-image mode, batch 1): "
            f"{' and '.join(what)} cannot score them (they take batch-major output tensors); "
            "run without, or wrap the model so that it returns the network's raw tensors"
        )


def _as_detections(tensors: Sequence[torch.Tensor], keys: Sequence[str]) -> Detections:
    if len(tensors) != len(keys):
        raise ValueError(f"{len(tensors)} output tensors for the detection keys {list(keys)}")
    return {k: t.detach().cpu() for k, t in zip(keys, tensors, strict=True)}


def torch_detections(model: nn.Module, x: Inputs, *, desc: str, show: bool) -> list[Detections]:
    """``model``'s detections for every sample of ``x``, one image at a time (eval, no grad)."""
    out = []
    device = module_device(model)
    with eval_no_grad(model):
        for b, _ in progress(batches(x, 1, True), total=num_samples(x), desc=desc, enabled=show):
            result = call(model, to_device(b, device))
            if not isinstance(result, (list, tuple)) or len(result) != 1:
                raise ValueError(f"{desc}: expected one detection dict for one image")
            out.append({k: v.detach().cpu() for k, v in dict(result[0]).items()})
    return out


def ort_detections(
    path: str | Path,
    x: Inputs,
    keys: Sequence[str],
    *,
    desc: str,
    show: bool,
    forward: ForwardInputs,
) -> list[Detections]:
    """The exported model's detections in ONNX Runtime (CPU, ``ORT_ENABLE_BASIC``), one image
    at a time; its outputs are one image's tensors in the order of ``keys``."""
    from qdq.backends.onnxruntime import run, session

    sess = session(path)
    out = []
    for b, _ in progress(batches(x, 1, True), total=num_samples(x), desc=desc, enabled=show):
        arrays = run(sess, forward.tensors(b))
        out.append(_as_detections([torch.from_numpy(a) for a in arrays], keys))
    return out


def _matched_cosines(
    outs: Sequence[Detections], refs: Sequence[Detections], key: str
) -> list[float]:
    """Per image: the cosine of ``key``'s values over the matched pairs (1.0 for two empty
    lists; 0.0 when either has detections but nothing matched)."""
    values = []
    for out, ref in zip(outs, refs, strict=True):
        m = match(out, ref)
        if not m.pairs:
            values.append(1.0 if m.count_out == m.count_ref == 0 else 0.0)
            continue
        i = torch.tensor([p[0] for p in m.pairs])
        j = torch.tensor([p[1] for p in m.pairs])
        a = out[key][i].double().flatten()
        b = ref[key][j].double().flatten()
        values.append(float(sample_cosines(a[None], b[None])[0]))  # at any magnitude
    return values


def _relative(outs: Sequence[Detections], refs: Sequence[Detections], key: str) -> float | None:
    diff = norm = 0.0
    for out, ref in zip(outs, refs, strict=True):
        m = match(out, ref)
        if m.pairs:
            i = torch.tensor([p[0] for p in m.pairs])
            j = torch.tensor([p[1] for p in m.pairs])
            a, b = out[key][i].double(), ref[key][j].double()
            diff += float(((a - b) ** 2).sum())
            norm += float((b**2).sum())
    if norm > 0:
        return math.sqrt(diff / norm)
    return 0.0 if diff == 0 else None


def compare_lists(
    outs: Sequence[Detections],
    refs: Sequence[Detections],
    keys: Sequence[str],
    names: Sequence[str] | None = None,
    onnx_names: Sequence[str | None] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``outs`` (INT8 or FP32) against ``refs`` (FP32), per image.

    Returns:
        The score (``metric``: ``detection_f1``; ``cosine_mean``/``cosine_min``: per image, of
        the matched pairs' boxes; ``top1_agreement``: ``None``; ``detections``: every figure of
        :func:`~qdq.pipeline.detections.detection_agreement`) and one row per output key
        (``report.json: outputs``): ``boxes`` is the ``detection_list`` row with the figures,
        every other key a ``tensor`` row compared over the matched pairs.
    """
    figures = detection_agreement(outs, refs)
    box_cos = _matched_cosines(outs, refs, "boxes")
    result = {
        "metric": figures["detection_f1"],
        "cosine_mean": sum(box_cos) / len(box_cos),
        "cosine_min": min(box_cos),
        "top1_agreement": None,
        "detections": figures,
    }
    rows = []
    for index, key in enumerate(keys):
        cos = box_cos if key == "boxes" else _matched_cosines(outs, refs, key)
        row: dict[str, Any] = {
            "index": index,
            "name": None if names is None else names[index],
            "onnx_name": None if onnx_names is None else onnx_names[index],
            "shape": ["k", *refs[0][key].shape[1:]],
            "headline": key == "boxes",
            "kind": "detection_list" if key == "boxes" else "tensor",
            "figure": "detection_f1" if key == "boxes" else "cosine",
            "value": figures["detection_f1"] if key == "boxes" else sum(cos) / len(cos),
            "cosine_mean": sum(cos) / len(cos),
            "cosine_min": min(cos),
            "relative_error": _relative(outs, refs, key),
        }
        if key == "boxes":
            row.update(figures)
        row[row["figure"]] = row["value"]
        rows.append(row)
    return result, rows


def headline(keys: Sequence[str]) -> dict[str, Any]:
    """``report.json: headline`` in per-image mode."""
    labels = ", same label" if "labels" in keys else ""
    return {
        "name": "detection_f1",
        "source": "output",
        "output": list(keys).index("boxes"),
        "kind": "detection_list",
        "text": (
            "detection_f1 of the per-image detection lists with FP32 (greedy matching by FP32's "
            f"score order, IoU >= 0.5{labels}; batch 1)"
        ),
    }


def check_export(path: str | Path, model: nn.Module, x: Inputs, forward: ForwardInputs) -> int:
    """Check the export of a per-image model against ``model`` (the exported fake-quant model),
    per quantizer, on every sample of ``x`` (one image at a time).

    The element-wise check of :mod:`qdq.export.verify` cannot work after NMS, and neither can a
    tight tolerance on the detections: a box whose score or IoU lies within float rounding of a
    threshold (score, NMS IoU, the top-k cut of proposals or detections) is kept by one runtime
    and dropped by the other, the RoIs change with it, and in a deep network one flipped code
    cascades. Measured on random-weight R-CNNs at 64x64: ONNX Runtime and torch list the same
    detections to 1e-4 on five images in six of Faster R-CNN, but on one image in six of Keypoint
    R-CNN. So the export is checked where float order cannot matter, by
    :func:`qdq.backends.parity.parity` with ``per_layer=True``: at every activation quantizer,
    ONNX Runtime's DequantizeLinear output must equal torch's fake-quant of the same tensor bit
    for bit (``qdq_mismatches``: a wrong scale), and, fed ONNX Runtime's own inputs
    (teacher-forced), torch's codes may differ from ONNX Runtime's by rounding-boundary flips
    only (``unexplained_codes``: wrong weights, a missing or misplaced Q/DQ, a wrong op in
    between). Teacher forcing does not reach the float selections (proposal top-k, NMS) that pick
    the RoIs a box head reads, so there the rows are matched as a set (``instance_rows``): a RoI
    that only one runtime selected is counted apart and tolerated for a minority of the rows
    (Keypoint R-CNN at one thread: its box head's input, 24676 codes, about two RoIs). Not
    covered: a defect after the last activation quantizer (the last layers' weights);
    ``report.json: int8_torch.vs_onnxruntime`` gives the detections' agreement.

    Returns:
        The number of activation quantizers compared.

    Raises:
        qdq.export.ExportError: ONNX Runtime cannot run the file, or a quantizer differs (the
            message names the first one and the counts).
    """
    from qdq.backends.parity import parity
    from qdq.export import ExportError

    images = [forward.tensors(b) for b, _ in batches(x, 1, True)]
    try:
        report = parity(model, path, images, per_layer=True, instance_rows=True)
    except Exception as err:  # ORT raises its own exception types
        raise ExportError(f"ONNX Runtime cannot run the exported model: {err}") from None
    bad = [
        (name, lp)
        for name, lp in report.layers.items()
        if lp.qdq_mismatches or lp.unexplained_codes or 2 * lp.reselected_rows > lp.rows
    ]
    if bad:
        name, lp = bad[0]
        rows = f", {lp.reselected_rows} of {lp.rows} instance rows unmatched" if lp.rows else ""
        raise ExportError(
            "the exported ONNX does not compute what the torch model computes: at "
            f"{len(bad)} of {len(report.layers)} activation quantizers ONNX Runtime differs from "
            f"torch beyond float rounding, first {name} ({lp.qdq_mismatches} Q/DQ outputs differ "
            f"on the same input, {lp.unexplained_codes} codes differ by more than a rounding "
            f"flip when fed ONNX Runtime's own inputs{rows}). Usually a wrong scale or wrong "
            "weights in the file, or a forward that depends on inputs the exporter fixed"
        )
    return len(report.layers)


def score_model(
    model: nn.Module,
    x: Inputs,
    refs: Sequence[Detections],
    keys: Sequence[str],
    desc: str,
    show: bool,
) -> dict[str, Any]:
    """``model``'s detections on ``x`` scored against FP32's (``compare_lists``' score)."""
    return compare_lists(torch_detections(model, x, desc=desc, show=show), refs, keys)[0]


def evaluate(
    stages: Stages,
    prepared: nn.Module,
    float_model: nn.Module,
    onnx_path: str | Path,
    x: Inputs,
    keys: Sequence[str],
    forward: ForwardInputs,
    names: Sequence[str] | None,
    show: bool,
    label: str = "INT8",
) -> Measured:
    """The ``fp32_eval`` and ``int8_eval`` stages in per-image mode (``stages``: the job's
    :class:`~qdq.pipeline.stages.Stages`): FP32's detections, the FP32, quantized (ONNX Runtime)
    and quantized (torch fake-quant) scores, the outputs table and the headline; ``label`` names
    the quantized model (:func:`qdq.pipeline.report.format_label`)."""
    from qdq.pipeline.outputs import onnx_output_names

    with stages("fp32_eval") as st:
        ref = torch_detections(float_model, x, desc="FP32 (torch)", show=show)
        fp32 = compare_lists(ref, ref, keys)[0]
        mean = fp32["detections"]["detections_fp32"]
        st.detail = f"{fp32['metric']:.4f} on {len(ref)} images ({mean:.1f} detections each)"
    with stages("int8_eval") as st:
        ort = ort_detections(onnx_path, x, keys, desc=f"{label} (ONNX Runtime)", show=show,
                             forward=forward)  # fmt: skip
        onnx_names = onnx_output_names(onnx_path, len(keys))
        names = names if names is not None and len(names) == len(keys) else None
        int8, outputs = compare_lists(ort, ref, keys, names, onnx_names)
        fq = torch_detections(prepared, x, desc=f"{label} (torch fake-quant)", show=show)
        int8_torch = compare_lists(fq, ref, keys)[0]
        int8_torch["vs_onnxruntime"] = compare_lists(fq, ort, keys)[0]
        st.detail = f"{label} {int8['metric']:.4f} (torch fake-quant {int8_torch['metric']:.4f})"
    return Measured(list(ref), fp32, int8, int8_torch, outputs, headline(keys))
