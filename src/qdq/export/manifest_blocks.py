"""The manifest entries of block-format quantizers (NVFP4, MXFP8, INT4: issue 60).

Besides the fields every entry has (``format``, ``axis``, ``amax``, ``channels``), a block
quantizer's entry records ``block_size`` (``null``: INT4 per channel), ``role``
(``"weight"``/``"activation"``), ``amax_shape`` (INT4's per-block layout, ``[]`` per tensor) and
``scale``: the float32 scale the exported graph holds, computed by
:func:`qdq.quant.blocks.block_scales` (NVFP4: the per-tensor ``amax / 2688``; INT4: ``amax / 7``
per block or channel; MXFP8: ``null``, its E8M0 scales are each block's own). MXFP8's amax is
the observed abs max, for the reports; an MXFP8 quantizer that saw no data records ``null``.

:func:`block_form_of` reads the manifest's ``"block_form"``: the form its ONNX writes MXFP8 in
(``"onnx"``, ``"trt"``: :mod:`qdq.export.blocks_trt`), for exporting again in the same form.

:func:`entry_block_amax` reads such an entry back for :func:`qdq.export.manifest.load_calibration`:
format and block size must be the model's, the amax finite and non-negative in the recorded
layout; every refusal is a ``ValueError`` naming the manifest and the quantizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from qdq.export.manifest_io import SCHEMA, read_manifest, short
from qdq.quant.blocks import BLOCK_FORMATS, block_scales

__all__ = ["block_entry", "block_form_of", "entry_block_amax", "is_block"]

_FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def is_block(q: Any) -> bool:
    """Whether quantizer ``q`` is of a block format (its spec says so)."""
    return bool(getattr(q.spec, "is_block", False))


def block_entry(q: Any) -> dict[str, Any]:
    """The block-format fields of ``q``'s manifest entry (module docstring).

    Example:
        >>> from types import SimpleNamespace
        >>> from qdq.config import QuantSpec
        >>> q = SimpleNamespace(spec=QuantSpec.block("nvfp4"), role="activation",
        ...                     amax=torch.tensor(2688.0))
        >>> block_entry(q)["scale"], block_entry(q)["block_size"]
        (1.0, 16)
    """
    amax = q.amax.detach().to(torch.float32).cpu()
    return {
        "block_size": q.spec.block_size,
        "role": getattr(q, "role", None),
        "amax_shape": list(amax.shape) if amax.numel() else None,
        "scale": _scale(q.spec, amax),
    }


def _scale(spec: Any, amax: torch.Tensor) -> float | list[float] | None:
    if not amax.numel() or spec.format == "mxfp8":
        return None
    fmt = BLOCK_FORMATS[spec.format].with_block_size(spec.block_size)
    if spec.format == "nvfp4":
        _, gs = block_scales(torch.zeros(1, fmt.block_size or 16), fmt, amax.reshape(()))
        assert gs is not None
        return float(gs)
    if fmt.block_size is None:
        fake, a = torch.zeros(amax.numel()), amax.reshape(-1)
    else:  # a tensor whose per-block amax has amax's layout, blocked along its last axis
        a = amax.reshape(-1) if amax.dim() == 0 else amax
        fake = torch.zeros(*a.shape[:-1], a.shape[-1] * fmt.block_size)
    scale, _ = block_scales(fake, fmt, a, -1 if fmt.block_size else 0)
    return [float(v) for v in scale.flatten()]


def entry_block_amax(p: Path, path: str, entry: dict[str, Any], q: Any) -> torch.Tensor | None:
    """The amax of a block quantizer's manifest entry, shaped for ``q`` (``None``: an MXFP8
    entry that records none).

    Raises:
        ValueError: another format or block size than the model's, a malformed or negative
            amax, or a layout that does not fit; naming the manifest and the quantizer.
    """
    where = f"{p}: quantizer {path!r}"
    fmt, size = entry.get("format"), entry.get("block_size")
    if fmt != q.spec.format:
        raise ValueError(
            f"{where} is {short(fmt)} in the manifest but {q.spec.format!r} in the model"
        )
    if size != q.spec.block_size or isinstance(size, bool):
        raise ValueError(
            f"{where} has block_size={short(size)} in the manifest but {q.spec.block_size!r} "
            "in the model"
        )
    if "axis" not in entry or entry["axis"] != q.spec.axis or isinstance(entry["axis"], bool):
        raise ValueError(
            f"{where} has axis={short(entry.get('axis'))} in the manifest but "
            f"axis={q.spec.axis!r} in the model"
        )
    raw = entry.get("amax")
    if raw is None or raw == []:
        if fmt == "mxfp8":
            return None
        raise ValueError(f"{where} has no 'amax'")
    values = raw if isinstance(raw, list) else [raw]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise ValueError(f"{where}: amax must be a number or a list of numbers, got {short(raw)}")
    bad = [i for i, v in enumerate(values) if not 0 <= v <= _FLOAT32_MAX]
    if bad:
        raise ValueError(f"{where}: amax has negative or non-finite values at index {bad[:8]}")
    amax = torch.tensor([float(v) for v in values], dtype=torch.float32)
    shape = entry.get("amax_shape")
    if shape is not None:
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise ValueError(f"{where}: 'amax_shape' must be a list of sizes, got {short(shape)}")
        if int(torch.tensor(shape).prod()) != amax.numel():
            raise ValueError(
                f"{where}: 'amax_shape' {shape} holds {int(torch.tensor(shape).prod())} values, "
                f"amax has {amax.numel()}"
            )
        amax = amax.reshape(shape)
    return q.check_amax_shape(amax, source=str(p))


def block_form_of(manifest: str | Path) -> str:
    """The form the manifest's ONNX writes MXFP8 in: its ``"block_form"``, ``"onnx"`` when it
    records none (a manifest without block quantizers, or written before the field existed).
    ``qdq.export_onnx(..., block_form=block_form_of(m))`` exports again in the same form.

    Example:
        >>> import json, tempfile, os
        >>> from qdq.export.manifest_io import SCHEMA
        >>> path = os.path.join(tempfile.mkdtemp(), "m.manifest.json")
        >>> _ = open(path, "w").write(json.dumps({"schema": SCHEMA, "block_form": "trt"}))
        >>> block_form_of(path)
        'trt'

    Raises:
        FileNotFoundError / ValueError: no manifest, or not a qdq manifest (its schema); a
            ``"block_form"`` that is not one of :data:`qdq.export.blocks_trt.BLOCK_FORMS`,
            naming the manifest.
    """
    from qdq.export.blocks_trt import BLOCK_FORMS

    p = Path(manifest)
    if not p.is_file():
        raise FileNotFoundError(f"no manifest at {p}")
    doc = read_manifest(p)  # untrusted input: bounded size and depth
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        got = short(doc.get("schema")) if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(f"{p}: expected schema {SCHEMA!r}, got {got}")
    form = doc.get("block_form", "onnx")
    if form not in BLOCK_FORMS:
        raise ValueError(
            f"{p}: block_form must be one of {', '.join(map(repr, BLOCK_FORMS))}, got {short(form)}"
        )
    return str(form)
