"""What :mod:`qdq.ptq` learns for a weight quantizer, and how it is kept honest.

Post-training steps may learn two things for a weighted layer. Neither touches the prepared model's
float weight or bias, so a model with every quantizer bypassed stays the exact FP32 model:

* ``rounding_codes`` (int8, the weight's shape): the INT8 code of every weight element
  (AdaRound). The quantized weight is ``scale · code``; ``amax`` and the scale never change.
* ``bias_delta`` (float32, one value per output channel): added to the layer's bias
  (bias correction); a layer without a bias gets ``bias_delta`` as its bias.

They are buffers of the weight :class:`~qdq.quant.Quantizer`, registered only once learned (a
model without them has the ``state_dict`` it always had), applied only in ``QUANTIZE`` mode and at
export. A third buffer, ``learned_record`` (UTF-8 JSON in a uint8 tensor, so that ``.half()`` and
``.to()`` leave it alone), says what was learned, with which settings, and from which float weight
and amax: :func:`fingerprint` of the weight (three float64 sums) and the amax values.

**Stale state.** Codes and delta are only right for the weight and amax they were learned from. A
quantizer re-checks both when the weight tensor or the amax is another tensor, or has been written
in place since the last check (PyTorch's version counter: optimizers, ``load_state_dict``,
``copy_``), and raises :class:`StaleStateError` when they moved. Between such events the check
costs a tuple comparison; writes through ``.data`` bypass the version counter and are not seen.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch

__all__ = [
    "LEARNED_BUFFERS",
    "PARTS",
    "StaleStateError",
    "check_fingerprint",
    "decode",
    "encode",
    "fingerprint",
    "manifest_entry",
]

#: the buffers a weight quantizer holds once :mod:`qdq.ptq` learned something
LEARNED_BUFFERS = ("rounding_codes", "bias_delta", "learned_record")
#: what may be learned, and the buffer that holds it
PARTS = {"rounding": "rounding_codes", "bias_correction": "bias_delta"}
#: relative tolerance of the fingerprint when the weight has the dtype it was learned in (float64
#: sums of the same values differ only by summation order: ~n·2⁻⁵³)
SAME_DTYPE_RTOL = 1e-8


class StaleStateError(RuntimeError):
    """Learned rounding or bias correction no longer matches the float weight or amax."""


def fingerprint(weight: torch.Tensor) -> list[float]:
    """``[Σ w·r, Σ |w|, Σ w²]`` in float64, ``r`` a ramp from 1 to 2 over the flattened weight.

    The ramp makes a permutation of the elements visible; the sums are over every element.

    Example:
        >>> fingerprint(torch.tensor([1.0, -2.0]))
        [-3.0, 3.0, 5.0]
    """
    w = weight.detach().reshape(-1).to(torch.float64)
    ramp = torch.linspace(1.0, 2.0, w.numel(), dtype=torch.float64, device=w.device)
    sums = torch.stack([(w * ramp).sum(), w.abs().sum(), (w * w).sum()])
    return [float(v) for v in sums.cpu()]


def check_fingerprint(record: dict[str, Any], weight: torch.Tensor, amax: torch.Tensor) -> str:
    """Why ``record`` does not fit ``weight`` and ``amax`` ("" when it does)."""
    info = record.get("weight", {})
    if list(weight.shape) != info.get("shape"):
        return f"the weight has shape {list(weight.shape)}, learned from {info.get('shape')}"
    saved = torch.tensor(record.get("amax", []), dtype=torch.float32)
    if saved.numel() != amax.numel() or not torch.equal(
        amax.detach().reshape(-1).cpu(), saved.to(amax.dtype)
    ):
        return "the amax changed since"
    same = str(weight.dtype) == info.get("dtype")
    rtol = SAME_DTYPE_RTOL if same else 2.0 * torch.finfo(weight.dtype).eps
    now, then = fingerprint(weight), info.get("sums", [])
    scale = [2.0 * then[1], then[1], then[2]] if len(then) == 3 else []
    if len(scale) != 3 or any(
        abs(a - b) > rtol * s + 1e-30 for a, b, s in zip(now, then, scale, strict=True)
    ):
        return "the float weight changed since"
    return ""


def encode(record: dict[str, Any], device: torch.device | str | None = None) -> torch.Tensor:
    """``record`` as UTF-8 JSON bytes in a uint8 tensor on ``device`` (the quantizer's: every
    buffer of a quantizer lives where the tensor it serves does, issue 32)."""
    data = json.dumps(record, sort_keys=True).encode("utf-8")
    return torch.tensor(list(data), dtype=torch.uint8, device=device)


def decode(buffer: torch.Tensor) -> dict[str, Any]:
    """The record stored by :func:`encode` (``{}`` for an empty buffer)."""
    if buffer.numel() == 0:
        return {}
    value = json.loads(bytes(buffer.cpu().tolist()).decode("utf-8"))
    return value if isinstance(value, dict) else {}


def manifest_entry(buffers: dict[str, torch.Tensor | None]) -> dict[str, Any] | None:
    """What a manifest records of a weight quantizer's learned state (``None`` when nothing):
    per part, the settings it was learned with and the SHA-256 of its buffer's bytes (which
    :func:`qdq.load_calibration` compares with the model's); bias correction also its mean
    ``|delta|``, rounding the number of codes.

    ``buffers``: the quantizer's ``_buffers``.
    """
    record_buffer = buffers.get("learned_record")
    record = decode(record_buffer) if isinstance(record_buffer, torch.Tensor) else {}
    out: dict[str, Any] = {}
    for part, name in PARTS.items():
        value = buffers.get(name)
        if part not in record or not isinstance(value, torch.Tensor):
            continue
        data = value.detach().cpu().contiguous()
        entry = {**record[part], "sha256": hashlib.sha256(data.numpy().tobytes()).hexdigest()}
        if part == "bias_correction":
            entry["mean_abs_delta"] = float(data.abs().mean()) if data.numel() else 0.0
        else:
            entry["codes"] = int(data.numel())
        out[part] = entry
    return out or None
