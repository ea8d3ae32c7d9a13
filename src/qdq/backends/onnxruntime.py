"""ONNX Runtime on CPU with exact Q/DQ semantics, and torch ↔ ORT parity checks.

:func:`parity` and its reports live in :mod:`qdq.backends.parity` and are re-exported here.

Sessions use ``GraphOptimizationLevel.ORT_ENABLE_BASIC``: Q/DQ nodes run as written. (At
``ORT_ENABLE_ALL`` ORT fuses them into integer kernels that saturate on AVX2 CPUs without VNNI and
do not represent TensorRT.) One basic-level rewrite is switched off: ``WeightBiasQuantization``
(ORT 1.2x+) turns the float bias of a Conv/ConvTranspose/Gemm whose input and weight are
dequantized into int32 at scale ``s_x * s_w``, Q/DQ nodes that are not in the file. With a small
input scale the bias overflows int32 (yolov8n-seg's mask upsample ConvTranspose: bias 0.061 at
``3.75e-8 * 4.92e-4`` is 3.3e9 steps; its output was off by 0.10 of 0.061 and the export failed
verification), and TensorRT adds the bias in float anyway. onnxruntime is imported lazily (extra
``qdq[onnx]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from qdq.backends.parity import LayerParity, ParityReport, parity

__all__ = ["DISABLED_OPTIMIZERS", "LayerParity", "ParityReport", "parity", "run", "session"]

#: ORT graph rewrites that add arithmetic the ONNX file does not have (see the module docstring)
DISABLED_OPTIMIZERS = ("WeightBiasQuantization",)


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
    return ort.InferenceSession(
        model,
        opts,
        providers=["CPUExecutionProvider"],
        disabled_optimizers=list(DISABLED_OPTIMIZERS),
    )


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
