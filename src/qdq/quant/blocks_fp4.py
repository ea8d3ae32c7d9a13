"""The element and scale grids of the block-scaled formats (issue 60): E2M1, E4M3 and E8M0.

Each function maps float32 values onto one grid exactly and returns float32 (the values, not
packed codes), so that a fake quantization is ``grid(x / s) * s`` in float32 as ONNX
``QuantizeLinear`` → ``DequantizeLinear`` computes it.

* :func:`e2m1_round`: FP4 E2M1 (``±{0, 0.5, 1, 1.5, 2, 3, 4, 6}``), round to nearest, ties to
  even (the value whose mantissa bit is 0), saturating at ±6 (±inf too), signed zero kept, as
  ONNX ``QuantizeLinear`` to ``FLOAT4E2M1`` (opset 23). E2M1 has no NaN: ONNX's reference
  evaluator (through ml_dtypes) turns NaN into -0; we keep NaN, so a NaN input shows up in the
  output (as it does for FP8). Written by us, exact: inside each binade the grid is evenly
  spaced, so the value is an integer rounding (half to even) of ``|x|`` times a power of two.
* :func:`e4m3_round`: FP8 E4M3FN, saturating at ±448 (torch's cast, ties to even), as
  ``QuantizeLinear`` with a ``float8e4m3fn`` zero point and ``saturate=1``.
* :func:`e8m0_exponent`: the power-of-two scale of an MX block from the block's amax, two rules:
  ``"ceil"`` (NVIDIA: the smallest ``2**e >= amax / 448``; ONNX ``Cast`` to ``FLOAT8E8M0`` with
  ``round_mode="up"``, ``saturate=1``; ModelOpt's ``compute_e8m0``; cuDNN's block scale
  quantize "round up"), which never saturates an element, and ``"floor"`` (the OCP MX v1.0
  spec's conversion: ``floor(log2(amax)) - emax``, ``emax = 8`` for E4M3), which saturates the
  block's largest values to ±448. Both clamp to E8M0's [-127, 127]; a zero amax gives 2**-127
  and +inf 2**127 (the ``Cast`` table's saturation). ONNX's reference evaluator differs on two
  inputs no real block has: it casts inf to NaN, and a float32 subnormal ``amax / 448 <= 2**-127``
  to 2**-126 (tests/test_block_numerics.py names both).
"""

from __future__ import annotations

import torch

__all__ = [
    "E2M1_GRID",
    "E2M1_MAX",
    "E4M3_MAX",
    "E8M0_MAX_EXP",
    "E8M0_MIN_EXP",
    "E8M0_RULES",
    "e2m1_round",
    "e4m3_round",
    "e8m0_exponent",
    "e8m0_scale",
]

#: The largest E2M1 magnitude.
E2M1_MAX = 6.0
#: The non-negative E2M1 values, code 0..7 (codes 8..15 are their negatives).
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
#: The largest finite float8 E4M3FN value.
E4M3_MAX = 448.0
#: The exponent range of an E8M0 scale (``2**-127`` is code 0, ``2**127`` code 254; 255 is NaN).
E8M0_MIN_EXP, E8M0_MAX_EXP = -127, 127
#: ``emax`` of the E4M3 element type (448 = 1.75·2**8): the OCP rule's offset.
_E4M3_EMAX = 8
#: How an MX block's E8M0 scale is derived from its amax (see the module docstring).
E8M0_RULES = ("ceil", "floor")


def e2m1_round(x: torch.Tensor) -> torch.Tensor:
    """Round float32 ``x`` to the nearest E2M1 value (ties to even), saturating at ±6.

    Example:
        >>> e2m1_round(torch.tensor([0.25, 0.75, 2.5, 5.0, 5.1, 100.0, -0.1])).tolist()
        [0.0, 1.0, 2.0, 4.0, 6.0, 6.0, -0.0]
    """
    a = x.abs().clamp(max=E2M1_MAX)  # NaN stays NaN
    # step 0.5 below 2, 1 in [2, 4), 2 in [4, 6]: each is round-half-even of an exact multiple
    fine = (a * 2).round_().mul_(0.5)
    mid = a.round()
    coarse = (a * 0.5).round_().mul_(2)
    q = torch.where(a < 2, fine, torch.where(a < 4, mid, coarse))
    return torch.copysign(q, x)


def e4m3_round(x: torch.Tensor) -> torch.Tensor:
    """Float32 ``x`` on the E4M3FN grid as float32: saturated to ±448 (inf too, NaN stays NaN),
    rounded to nearest, ties to even.

    Example:
        >>> e4m3_round(torch.tensor([0.3, 17.0, 500.0])).tolist()
        [0.3125, 16.0, 448.0]
    """
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)


def e8m0_exponent(amax: torch.Tensor, rule: str = "ceil") -> torch.Tensor:
    """The E8M0 exponent (float32 holding an integer in [-127, 127], NaN for a NaN amax) of MX
    blocks with the given float32 ``amax`` and E4M3 elements.

    ``"ceil"``: the smallest ``e`` with ``2**e >= fl32(amax / 448)``. ``"floor"`` (OCP):
    ``floor(log2(amax)) - 8``. Both are computed exactly from the float32 bits (``frexp``, not a
    floating-point ``log2``); a zero amax gives -127 (E8M0 code 0), +inf saturates to 127, and
    both clamp to [-127, 127].

    Example:
        >>> e8m0_exponent(torch.tensor([448.0, 449.0, 0.0, 1.0]))
        tensor([   0.,    1., -127.,   -8.])
        >>> e8m0_exponent(torch.tensor([448.0, 511.0, 512.0]), rule="floor")
        tensor([0., 0., 1.])
    """
    if rule not in E8M0_RULES:
        raise ValueError(f"unknown E8M0 rule {rule!r}; choose one of {E8M0_RULES}")
    a = amax.to(torch.float32)
    v = a / torch.full((), E4M3_MAX, dtype=torch.float32, device=a.device) if rule == "ceil" else a
    mant, exp = torch.frexp(v)  # v = mant * 2**exp, mant in [0.5, 1) (0 for v == 0)
    expf = exp.to(torch.float32)
    # "ceil": ceil(log2 v), exp - 1 on an exact power of two, else exp; "floor": floor(log2 v) - emax
    e = torch.where(mant == 0.5, expf - 1, expf) if rule == "ceil" else expf - 1 - _E4M3_EMAX
    e = torch.where(v == 0, torch.full_like(e, E8M0_MIN_EXP), e)
    e = torch.where(torch.isposinf(v), torch.full_like(e, E8M0_MAX_EXP), e)
    e = e.clamp(E8M0_MIN_EXP, E8M0_MAX_EXP)
    return torch.where(torch.isnan(v), torch.full_like(e, float("nan")), e)


def e8m0_scale(exponent: torch.Tensor) -> torch.Tensor:
    """``2**exponent`` in float32 (exact; ``2**-127`` is a float32 subnormal), NaN for NaN.

    Example:
        >>> e8m0_scale(torch.tensor([0.0, -3.0, 127.0]))
        tensor([1.0000e+00, 1.2500e-01, 1.7014e+38])
    """
    e = torch.nan_to_num(exponent, nan=0.0).to(torch.int32)
    # the float32 bits of 2**e: a normal number's biased exponent, or 2**-127's subnormal bit
    bits = torch.where(e >= -126, (e + 127) << 23, torch.full_like(e, 1 << 22))
    return torch.where(torch.isnan(exponent), exponent, bits.view(torch.float32))
