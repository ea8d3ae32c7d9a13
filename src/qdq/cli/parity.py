"""``qdq parity``: does an exported Q/DQ ONNX compute what the torch fake-quant model computes?

The torch side is rebuilt from the user's model spec, prepared with the default config and given
the calibration stored in the manifest beside the ONNX (``X.onnx.manifest.json`` for ``X.onnx``, or a
``manifest.json`` that names ``X.onnx``, as ``qdq quantize`` writes), so it is the same calibrated
model that was exported. Both run on the data spec's batches.

The manifest is untrusted input (:mod:`qdq.export.manifest_io`): it is read within bounds, the
files it names stay in its folder, and the ONNX file must be the one it was written with (same
SHA-256, external data included) before the model spec's code runs or any data is read; a
mismatch is an error (exit 2) unless ``ignore_hash`` (``--ignore-hash``) turns it into a note.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_THRESHOLD", "failures", "run_parity"]

DEFAULT_THRESHOLD = 0.01


def run_parity(
    onnx_path: str,
    *,
    model: str,
    data: str,
    threshold: float = DEFAULT_THRESHOLD,
    batch_size: int | None = None,
    reference: bool = True,
    as_json: bool = False,
    ignore_hash: bool = False,
) -> int:
    """Compare and print; return 0 within ``threshold``, 1 past it, 2 when an input is unusable
    (a manifest that does not describe ``onnx_path`` included, unless ``ignore_hash``)."""
    if not 0.0 <= threshold <= 1.0:
        print(f"qdq parity: error: --threshold must be in [0, 1], got {threshold}", file=sys.stderr)
        return 2
    try:
        report, manifest = _compare(onnx_path, model, data, batch_size, reference, ignore_hash)
    except Exception as err:  # user code and files: any failure is one line, no traceback
        print(f"qdq parity: error: {_one_line(err)}", file=sys.stderr)
        return 2
    failed = failures(report, threshold)
    if as_json:
        doc = {"onnx": onnx_path, "manifest": str(manifest), "threshold": threshold,
               "passed": not failed, "failures": failed, **report.to_dict()}  # fmt: skip
        print(json.dumps(doc, indent=2))
    else:
        print(_format(report, onnx_path, manifest, threshold, failed))
    return 1 if failed else 0


def failures(report: Any, threshold: float) -> list[str]:
    """Why ``report`` (a :class:`~qdq.backends.parity.ParityReport`) fails ``threshold``.

    Fails when top-1 disagreement exceeds ``threshold`` and the float64 reference (when run) does
    not show it to be float rounding (ORT agrees with exact arithmetic, within ``threshold``, as
    often as torch's own float32 forward does), when a layer fed ORT's own input
    (isolated) differs on more than ``threshold`` of its codes, when any isolated code differs
    beyond a rounding-boundary flip, when a Q/DQ pair is not bit-exact, or when an output's size
    differs (a value-dependent size, e.g. detections after NMS).
    """
    out = []
    ref = report.reference
    top1 = report.top1_agreement
    noise = ref is not None and ref.explains_top1(threshold)
    if top1 is not None and 1.0 - top1 > threshold and not noise:
        why = ""
        if ref is not None and ref.onnx_top1 is not None:
            why = (
                f"; vs the float64 reference ORT agrees on {ref.onnx_top1:.2%}, "
                f"torch float32 on {ref.torch_top1:.2%}"
            )
        out.append(f"top-1 agreement {top1:.2%} < {1.0 - threshold:.2%}{why}")
    for i, (ours, theirs) in report.size_differs.items():
        out.append(
            f"output {i}: {ours} in torch, {theirs} in ONNX Runtime (a value-dependent size, "
            "e.g. detections after NMS: values near its threshold differ)"
        )
    for name, lp in report.layers.items():
        if lp.isolated_mismatch_rate > threshold:
            out.append(f"{name}: {lp.isolated_mismatch_rate:.3%} of codes differ in isolation")
        if lp.unexplained_codes:
            out.append(f"{name}: {lp.unexplained_codes} codes differ beyond float rounding")
        if lp.qdq_mismatches:
            out.append(f"{name}: {lp.qdq_mismatches} Q/DQ outputs not bit-exact")
    return out


def _compare(
    onnx_path: str,
    model_spec: str,
    data_spec: str,
    batch_size: int | None,
    reference: bool,
    ignore_hash: bool,
) -> Any:
    import qdq
    from qdq.backends.parity import parity
    from qdq.export.manifest import OnnxMismatchError, check_onnx, config_of, find_manifest
    from qdq.specs import load_data_spec, load_model_spec

    path = Path(onnx_path)
    if not path.is_file():
        raise FileNotFoundError(f"no ONNX file at {path}")
    manifest = find_manifest(path)  # X.onnx.manifest.json, or manifest.json naming X.onnx
    config = config_of(manifest)  # reads and checks the manifest before anything runs
    try:  # the ONNX given is the file the manifest was written with: no decoy, no edit
        check_onnx(manifest, path)
    except OnnxMismatchError as err:
        if not ignore_hash:
            raise ValueError(f"{err}; --ignore-hash compares them anyway") from None
        print(f"qdq parity: note: {_one_line(err)}; comparing them anyway (--ignore-hash)",
              file=sys.stderr)  # fmt: skip
    batches = load_data_spec(data_spec, batch_size=batch_size)
    float_model = load_model_spec(model_spec)
    # the recorded formats (an FP8 or mixed export): each layer planned as it was exported
    prepared = qdq.prepare(float_model, (batches[0],), config)
    qdq.load_calibration(prepared, manifest, verify_onnx=False)  # checked above
    report = parity(prepared, path, batches, per_layer=True, reference=reference)
    return report, manifest


def _one_line(err: BaseException) -> str:
    """``err`` as one line; control characters (from node names in the ONNX, say: an ORT error
    quotes them) are written as visible escapes, never sent to the terminal raw."""
    from qdq.lint.text import visible

    text = visible(" ".join(str(err).split()), keep="") or type(err).__name__
    return (
        text
        if isinstance(err, (ValueError, FileNotFoundError))
        else f"{type(err).__name__}: {text}"
    )


def _reference_lines(ref: Any) -> list[str]:
    if ref is None:
        return []
    if ref.error is not None:
        return [f"  float64 reference   not run: {ref.error}"]
    top1 = (
        ""
        if ref.torch_top1 is None
        else f"top-1 agreement torch {ref.torch_top1:.2%}, ORT {ref.onnx_top1:.2%}; "
    )
    return [
        f"  float64 reference   {top1}max |diff| torch {ref.torch_max_abs_diff:.3g}, "
        f"ORT {ref.onnx_max_abs_diff:.3g}",
    ]


def _format(
    report: Any, onnx_path: str, manifest: Path, threshold: float, failed: list[str]
) -> str:
    lines = [f"parity of {onnx_path} (calibration from {manifest}) over {report.batches} batches"]
    if report.top1_agreement is not None:
        note = ""
        ref = report.reference
        if report.top1_agreement < 1.0 and ref is not None and ref.explains_top1(threshold):
            note = " (float rounding: ORT is as close to the float64 reference as torch)"
        lines.append(f"  top-1 agreement     {report.top1_agreement:.2%}{note}")
    lines += [
        f"  max |torch - ORT|   {report.max_abs_diff:.3g} (relative {report.max_rel_diff:.2g})",
        f"  min cosine          {report.min_cosine:.6f}",
        *_reference_lines(report.reference),
        f"  first diverging     {report.first_diverging or '-'} (free-running)",
        f"  first unexplained   {report.first_unexplained or '-'} (isolated, beyond float rounding)",
        f"  {'quantizer':<44} {'free-running':>13} {'isolated':>10} {'unexplained':>11} {'Q/DQ':>5}",
    ]
    for name, lp in report.layers.items():
        lines.append(
            f"  {name:<44} {lp.code_mismatch_rate:>13.4%} {lp.isolated_mismatch_rate:>10.4%} "
            f"{lp.unexplained_codes:>11} {lp.qdq_mismatches:>5}"
        )
    verdict = "FAIL" if failed else "PASS"
    lines.append(f"verdict: {verdict} (threshold {threshold:g})")
    lines += [f"  - {f}" for f in failed]
    return "\n".join(lines)
