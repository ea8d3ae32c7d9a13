"""ONNX Runtime sessions on CPU with exact Q/DQ semantics, and runs of them (:func:`session`,
:func:`run`; :mod:`qdq.backends.onnxruntime` is the public name, with the parity checks beside).

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

from qdq.backends.blocks_reference import for_session

__all__ = ["DISABLED_OPTIMIZERS", "run", "session"]

#: ORT graph rewrites that add arithmetic the ONNX file does not have (see the module docstring)
DISABLED_OPTIMIZERS = ("WeightBiasQuantization",)


def _ort() -> Any:
    try:
        import onnxruntime
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("onnxruntime is not installed: pip install 'qdq[onnx]'") from err
    return onnxruntime


def session(
    model: str | Path | bytes | Any,
    *,
    threads: int | None = None,
    base_dir: str | Path | None = None,
) -> Any:
    """An ``InferenceSession`` on the CPU at ``ORT_ENABLE_BASIC`` (exact Q/DQ).

    Args:
        model: a path (a model with external data finds its data file beside it), serialized
            bytes, or an ``onnx.ModelProto``. A ``ModelProto`` past protobuf's 2 GB limit is
            written with external data to a temporary directory and loaded from there.
        threads: intra-op threads (default: ORT's choice).
        base_dir: where the external-data files of a ``ModelProto`` or bytes loaded with
            ``onnx.load(..., load_external_data=False)`` lie (the ONNX file's directory).

    Raises:
        FileNotFoundError: no file at the path.
        ValueError: a ``ModelProto`` refers to external data and ``base_dir`` is not given.
    """
    ort = _ort()
    model = for_session(model)  # TensorRT's block forms in exact standard ops (issue 60)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    if threads is not None:
        opts.intra_op_num_threads = threads
    if base_dir is not None:
        opts.add_session_config_entry(
            "session.model_external_initializers_file_folder_path", str(base_dir)
        )
    if not isinstance(model, (str, Path, bytes)):  # an onnx.ModelProto
        from qdq.export.external import has_external_data, too_large

        if has_external_data(model):  # read without its data: small, the data stays on disk
            if base_dir is None:
                raise ValueError(
                    f"the ONNX model {model.graph.name!r} keeps its weights in an external-data "
                    "file; pass the ONNX file's path, or base_dir= (the directory of that file)"
                )
        elif too_large(model):
            return _large_session(model, opts)
        model = model.SerializeToString()
    elif isinstance(model, (str, Path)):
        if not Path(model).is_file():
            raise FileNotFoundError(f"no ONNX file at {model}")
        model = str(model)
    return _create(ort, model, opts)


def _create(ort: Any, model: str | bytes, opts: Any) -> Any:
    return ort.InferenceSession(
        model,
        opts,
        providers=["CPUExecutionProvider"],
        disabled_optimizers=list(DISABLED_OPTIMIZERS),
    )


def _large_session(model: Any, opts: Any) -> Any:
    """A session on a ``ModelProto`` past 2 GB: a copy written with external data to a temporary
    directory (ONNX Runtime holds the data once the session exists)."""
    import tempfile

    import onnx

    from qdq.export.external import save_external

    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # save_external moves the data out of the proto it writes
    with tempfile.TemporaryDirectory(prefix="qdq-ort-") as tmp:
        path = Path(tmp) / "model.onnx"
        save_external(copy, path)
        del copy
        return _create(_ort(), str(path), opts)


def run(sess: Any, inputs: Sequence[torch.Tensor | np.ndarray]) -> list[np.ndarray]:
    """Run ``sess`` on positional inputs (``forward``'s order; those the exporter dropped as
    unread are left out by name, :func:`qdq._io.feed_by_name`); return all outputs as numpy
    arrays."""
    from qdq._io import feed_by_name

    arrays = [x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
              for x in inputs]  # fmt: skip
    feed = feed_by_name([i.name for i in sess.get_inputs()], arrays)
    return list(sess.run(None, feed))
