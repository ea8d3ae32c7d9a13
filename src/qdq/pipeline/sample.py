"""The first check of ``qdq.quantize``: the float model runs on one data sample, and a failure
says which shapes met (the data's — every input's —, the model's first weighted layer's or
exported input shape)."""

from __future__ import annotations

import torch
from torch import nn

from qdq.pipeline.data import QuantData
from qdq.pipeline.evaluate import output_tensors
from qdq.pipeline.inputs import Inputs, call, input_items
from qdq.pipeline.models import ModelSource

__all__ = ["check_batch_major", "check_sample", "shape_message"]


def check_sample(source: ModelSource, x: Inputs, qdata: QuantData) -> list[torch.Tensor]:
    """Run the float model on one sample (``x``: one tensor, a tuple of positional or a dict of
    keyword inputs); a failure names the data's and the model's shapes."""
    was_training = source.module.training
    try:
        source.module.eval()
        with torch.no_grad():
            return output_tensors(call(source.module, x), f"the model {source.spec}")
    except ValueError as err:
        if "returned no tensor" in str(err):
            raise
        raise ValueError(shape_message(source, x, qdata, err)) from None
    except Exception as err:  # user code: any failure becomes one message
        raise ValueError(shape_message(source, x, qdata, err)) from None
    finally:
        source.module.train(was_training)


def check_batch_major(outs: list[torch.Tensor], n: int, names: tuple[str, ...], spec: str) -> None:
    """Every output tensor must hold one row per sample (dimension 0 of size ``n``).

    The job scores and compares outputs sample by sample (and the export's batch dimension is
    dynamic). Per-image detection lists (torchvision's R-CNNs: ``[{"boxes": (k_i, 4), "scores":
    (k_i,), ...} per image]``) are recognised before this check and run in per-image mode
    (:mod:`qdq.pipeline.per_image`); any other output that is not batch-major (a batch-reduced
    value, per-image lists without ``boxes`` and ``scores``) is refused here, before anything
    long runs, with what to do instead.

    Raises:
        ValueError: naming the first such output, its shape and the sample count.
    """
    for i, t in enumerate(outs):
        if t.dim() == 0 or t.shape[0] != n:
            name = names[i] if len(names) == len(outs) else f"output {i}"
            shape = tuple(t.shape)
            samples = "1 sample" if n == 1 else f"{n} samples"
            raise ValueError(
                f"the model {spec} returns {name} of shape {shape} for {samples}: qdq quantize "
                "needs every output tensor to hold one row per sample (dimension 0), to compare "
                "INT8 with FP32 sample by sample. Per-image lists are compared only as detections "
                "(one dict per image with boxes (k, 4) and scores (k,), as torchvision's R-CNNs "
                "return); else wrap the model so that it returns the network's raw tensors before "
                "post-processing (backbone and heads; post-processing stays float in TensorRT "
                "anyway), or quantize it from Python with qdq.prepare / qdq.calibrate / "
                "qdq.export_onnx and your own evaluation"
            )


def shape_message(source: ModelSource, x: Inputs, qdata: QuantData, err: Exception) -> str:
    why = " ".join(str(err).split())[:300]
    expects = ""
    if source.input_shape is not None:
        expects = f"; {source.spec} was exported for input shape {source.input_shape}"
    else:
        first = next(
            (
                m
                for m in source.module.modules()
                if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear))
            ),
            None,
        )
        if isinstance(first, nn.Linear):
            expects = f"; its first weighted layer is {first} (input features {first.in_features})"
        elif first is not None:
            expects = (
                f"; its first weighted layer is {type(first).__name__} with "
                f"{first.in_channels} input channels"
            )
    if isinstance(x, torch.Tensor):
        sample = f"a data sample of shape {tuple(x.shape)} ({x.dtype})"
    else:
        shapes = ", ".join(f"{n} {tuple(t.shape)} ({t.dtype})" for n, t in input_items(x))
        sample = f"a data sample of inputs {shapes}"
    return (
        f"the model {source.spec} fails on {sample} from {qdata.source}: "
        f"{type(err).__name__}: {why}{expects}"
    )
