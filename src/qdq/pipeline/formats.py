"""The stage ``formats`` of ``qdq quantize --format mixed`` (issue 49): the plan's config.

``--format int8`` / ``fp8`` plan with ``QuantConfig(format=...)`` directly. ``mixed`` first plans
each layer in the format TensorRT runs fastest (rule F07: convolutions INT8, GEMMs and attention
FP8), calibrates that plan on a few calibration batches, measures each INT8 convolution's
quantization noise in INT8 and in FP8 (:func:`qdq.accuracy.formats.choose_formats`) and moves to
FP8 the input tensors where INT8 loses; the job then runs with those overrides.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import islice
from typing import Any

from torch import nn

from qdq.accuracy.formats import FormatChoice, choose_formats
from qdq.config import QuantConfig
from qdq.pipeline.device import to_device
from qdq.pipeline.inputs import ForwardInputs, Inputs, batches
from qdq.pipeline.stages import Stages

__all__ = ["FORMAT_BATCHES", "method_label", "plan_config", "plan_format"]

#: calibration batches the mixed plan's measurement calibrates on (its amax; the noise is
#: measured on the first)
FORMAT_BATCHES = 4


def plan_config(
    stages: Stages,
    model: nn.Module,
    example: tuple[Any, ...],
    cal: Inputs,
    inputs: ForwardInputs,
    *,
    size: int,
    static: bool,
    device: Any,
    fmt: str,
) -> tuple[QuantConfig, FormatChoice | None]:
    """The job's :class:`QuantConfig` for ``fmt``, and for ``"mixed"`` what was measured."""
    import qdq

    config = QuantConfig(format=fmt)
    if fmt != "mixed":
        return config, None
    with stages("formats") as st:
        prepared = qdq.prepare(model, example, config)
        some = [to_device(inputs.arguments(b), device)
                for b, _ in islice(batches(cal, size, static), FORMAT_BATCHES)]  # fmt: skip
        qdq.calibrate(prepared, some, show_progress=False)
        choice = choose_formats(prepared, some[0])
        st.detail = choice.summary()
    return replace(config, overrides=choice.overrides), choice


def method_label(calib: str | None) -> str:
    """The calibration method as the job prints it (``None``: each quantizer's own, the default
    of an FP8 plan)."""
    return calib if calib is not None else "max (FP8) / mse (INT8)"


def plan_format(prepared: nn.Module) -> dict[str, int]:
    """How many quantizers of ``prepared`` each format has (``{"int8": n, "fp8": m}``)."""
    from collections import Counter

    import qdq

    counts = Counter(q.spec.format for q in qdq.quantizers_of(prepared).values())
    return dict(sorted(counts.items()))
