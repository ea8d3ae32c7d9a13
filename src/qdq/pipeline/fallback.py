"""``--max-drop`` in the main job: :func:`qdq.auto_quantize` scored by the report's headline metric."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from torch import nn

from qdq.config import QuantConfig
from qdq.pipeline.data import QuantData
from qdq.pipeline.evaluate import score, torch_outputs
from qdq.pipeline.models import ModelSource

__all__ = ["fallback_search"]


def fallback_search(
    source: ModelSource,
    float_model: nn.Module,
    qdata: QuantData,
    example: tuple[Any, ...],
    prepared: nn.Module,
    calib_batches: list[Any],
    max_drop: float,
    calib: str | None,
    percentile: float | None,
    exporter: str,
    target: str,
    size: int,
    static: bool,
    show: bool,
    improve: Any,
    config: QuantConfig | None = None,
) -> Any:
    """:func:`qdq.auto_quantize` from the calibrated model, scored by the report's metric in torch.

    ``float_model`` is what was prepared (the user's model, or its equalized copy); the FP32
    reference is always the user's model. ``config``: the plan's (its format and overrides);
    ``calib`` ``None``: each quantizer's own method (max for FP8 quantizers, mse for INT8 ones).
    """
    from qdq.accuracy import auto_quantize

    every = qdata.metric is not None
    ref = torch_outputs(source.module, qdata.evaluation, size, static=static, desc="FP32",
                        show=False, every=every)  # fmt: skip

    def metric(model: nn.Module) -> float:
        outs = torch_outputs(model, qdata.evaluation, size, static=static, desc="INT8",
                             show=False, every=every)  # fmt: skip
        return float(score(outs, ref, qdata.labels, qdata.metric, qdata.targets)["metric"])

    cfg = QuantConfig.tensorrt(
        method=calib or "mse", percentile=99.99 if percentile is None else percentile
    )
    if config is not None:
        cfg = replace(cfg, format=config.format, overrides=config.overrides,
                      fp8_gemm_per_channel=config.fp8_gemm_per_channel)  # fmt: skip
    return auto_quantize(
        float_model,
        example,
        calib_batches,
        metric=metric,
        max_drop=max_drop,
        config=cfg,
        method=calib,
        prepared=prepared,
        improve=improve,
        fp32_metric=metric(source.module),
        exporter=exporter,
        target=target,
        show_progress=show,
    )
