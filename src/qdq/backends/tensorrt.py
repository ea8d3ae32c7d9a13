"""TensorRT on an NVIDIA GPU: build an engine from Q/DQ ONNX, read its layer report, time it.

The official ``tensorrt`` Python package (extra ``qdq[trt]``) is imported lazily by the functions
that need it, so importing this module needs neither TensorRT nor a GPU. Device buffers are torch
CUDA tensors (``IExecutionContext.set_tensor_address`` + ``execute_async_v3`` on a torch CUDA
stream); there is no pycuda dependency. TensorRT >= 8.6 is needed (the name-based tensor API).

Builds are strongly typed from TensorRT 10.12 on (TensorRT 11 only builds strongly typed networks):
precision comes from the ONNX, Q/DQ decide INT8. Older versions build weakly typed with the INT8 and
FP16 builder flags, where Q/DQ nodes (explicit quantization) decide INT8.

Example:
    >>> from qdq.backends.tensorrt import tensorrt_available
    >>> ok, why = tensorrt_available()
    >>> isinstance(ok, bool) and isinstance(why, str)
    True
"""

from __future__ import annotations

import logging
import re
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from qdq._io import atomic_write_bytes
from qdq.lint.engine_report import EngineReport, parse_engine_report

__all__ = [
    "EngineBuildError",
    "build_engine",
    "engine_layer_report",
    "tensorrt_available",
    "time_engine",
]

_log = logging.getLogger("qdq.tensorrt")
_INSTALL = "pip install 'qdq[trt]' on a machine with an NVIDIA GPU and its CUDA driver"
MIN_VERSION = (8, 6)
STRONGLY_TYPED_FROM = (10, 12)

ShapeSpec = Sequence[int] | tuple[Sequence[int], Sequence[int], Sequence[int]]


class EngineBuildError(RuntimeError):
    """TensorRT could not parse the ONNX or build the engine; the message carries its errors."""


def tensorrt_available() -> tuple[bool, str]:
    """Whether TensorRT can run here, and why not (module missing, too old, no CUDA GPU).

    Example:
        >>> ok, why = tensorrt_available()
        >>> ok or "install" in why or "GPU" in why
        True
    """
    try:
        trt = _trt()
    except ImportError as err:
        return False, str(err)
    if not torch.cuda.is_available():
        return False, _no_gpu_message()
    return True, f"TensorRT {trt.__version__} on {torch.cuda.get_device_name()}"


def build_engine(
    onnx_path: str | Path,
    *,
    workspace_mb: int = 2048,
    strongly_typed: bool | None = None,
    timing_cache: str | Path | None = None,
    input_shapes: Mapping[str, ShapeSpec] | None = None,
) -> bytes:
    """Build a serialized TensorRT engine (with detailed profiling verbosity) from an ONNX file.

    Args:
        onnx_path: the Q/DQ ONNX, e.g. from :func:`qdq.export_onnx`.
        workspace_mb: the builder's workspace memory pool, in MiB.
        strongly_typed: ``None`` chooses by version: strongly typed from TensorRT 10.12, else
            weakly typed with the INT8 and FP16 builder flags (explicit quantization).
        timing_cache: a timing-cache file, read if it exists and written back after the build.
        input_shapes: per input name, one shape or ``(min, opt, max)`` for the optimization
            profile; dynamic dimensions of inputs not named here become 1.

    Raises:
        FileNotFoundError: ``onnx_path`` does not exist.
        ValueError: a bad argument, or a typing mode this TensorRT cannot build.
        ImportError: TensorRT is not installed (or is older than 8.6).
        RuntimeError: no CUDA GPU.
        EngineBuildError: the ONNX parser or the builder failed (with their messages).

    Example:
        >>> build_engine("model.qdq.onnx")  # doctest: +SKIP
    """
    path = Path(onnx_path)
    if not path.is_file():
        raise FileNotFoundError(f"no ONNX file at {path}")
    if isinstance(workspace_mb, bool) or not isinstance(workspace_mb, int) or workspace_mb <= 0:
        raise ValueError(f"workspace_mb must be a positive int, got {workspace_mb!r}")
    trt = _trt()
    _require_gpu()
    version = _version(trt)
    strong = version >= STRONGLY_TYPED_FROM if strongly_typed is None else strongly_typed
    weak_flags = hasattr(trt.BuilderFlag, "INT8") and hasattr(trt.BuilderFlag, "FP16")
    if strong and not hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):
        raise ValueError(f"TensorRT {trt.__version__} has no strongly typed networks")
    if not strong and not weak_flags:
        raise ValueError(f"TensorRT {trt.__version__} builds only strongly typed networks")
    logger = _logger(trt)
    builder = trt.Builder(logger)
    flags = 0
    if version < (10, 0):
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    if strong:
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(path)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise EngineBuildError(f"TensorRT's ONNX parser rejected {path}:\n" + "\n".join(errors))
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mb << 20)
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    if not strong:
        config.set_flag(trt.BuilderFlag.INT8)
        config.set_flag(trt.BuilderFlag.FP16)
    _add_profile(builder, network, config, dict(input_shapes or {}))
    cache_path = Path(timing_cache) if timing_cache is not None else None
    if cache_path is not None:
        data = cache_path.read_bytes() if cache_path.is_file() else b""
        config.set_timing_cache(config.create_timing_cache(data), False)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise EngineBuildError(
            f"TensorRT failed to build an engine from {path}:\n" + "\n".join(logger.errors)
        )
    if cache_path is not None:
        atomic_write_bytes(cache_path, bytes(config.get_timing_cache().serialize()))
    _log.info("built a TensorRT %s engine from %s", trt.__version__, path)
    return bytes(serialized)


def engine_layer_report(engine: bytes | str | Path) -> EngineReport:
    """The engine inspector's layer information, parsed by :func:`qdq.lint.parse_engine_report`.

    ``engine`` is a serialized engine (bytes) or a path to one. It must have been built with
    detailed profiling verbosity (as :func:`build_engine` does). An execution context with the
    optimization profile's opt shapes is attached, so dimensions and formats are concrete.

    Raises:
        ImportError, RuntimeError: no TensorRT, or no CUDA GPU.
        ValueError: the engine was built without detailed profiling verbosity.
    """
    trt = _trt()
    _require_gpu()
    engine_obj, _logger_ref = _deserialize(trt, engine)
    context = engine_obj.create_execution_context()
    for name in _io_names(trt, engine_obj, inputs=True):
        shape = tuple(engine_obj.get_tensor_shape(name))
        if any(d < 0 for d in shape):
            context.set_input_shape(name, tuple(engine_obj.get_tensor_profile_shape(name, 0)[1]))
    inspector = engine_obj.create_engine_inspector()
    inspector.execution_context = context
    return parse_engine_report(inspector.get_engine_information(trt.LayerInformationFormat.JSON))


def time_engine(
    engine: bytes | str | Path,
    inputs_or_shapes: Mapping[str, torch.Tensor | Sequence[int]]
    | Sequence[torch.Tensor | Sequence[int]],
    *,
    iterations: int = 100,
    warmup: int = 10,
) -> dict[str, float]:
    """GPU time of one inference, from CUDA events around ``execute_async_v3`` on a torch stream.

    Args:
        engine: a serialized engine (bytes) or a path to one.
        inputs_or_shapes: per engine input (by name, or positionally in the engine's order) a
            tensor, or a shape to fill with random values.
        iterations: timed runs.
        warmup: untimed runs first.

    Returns:
        ``median_ms``, ``mean_ms``, ``min_ms``, ``max_ms`` and ``iterations``.

    Example:
        >>> time_engine(engine_bytes, [(1, 3, 224, 224)])["median_ms"]  # doctest: +SKIP
        0.41
    """
    for label, value, least in (("iterations", iterations, 1), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{label} must be an int >= {least}, got {value!r}")
    trt = _trt()
    _require_gpu()
    engine_obj, _logger_ref = _deserialize(trt, engine)
    names = _io_names(trt, engine_obj, inputs=True)
    given = _by_name(names, inputs_or_shapes)
    context = engine_obj.create_execution_context()
    buffers: dict[str, torch.Tensor] = {}
    for name in names:
        dtype = _torch_dtype(engine_obj.get_tensor_dtype(name))
        value = given[name]
        if isinstance(value, torch.Tensor):
            tensor = value.detach().to(device="cuda", dtype=dtype).contiguous()
        elif dtype.is_floating_point:
            tensor = torch.randn(tuple(value), device="cuda").to(dtype)
        else:
            tensor = torch.zeros(tuple(value), device="cuda", dtype=dtype)
        context.set_input_shape(name, tuple(tensor.shape))
        buffers[name] = tensor
    for name in _io_names(trt, engine_obj, inputs=False):
        shape = tuple(context.get_tensor_shape(name))
        buffers[name] = torch.empty(
            shape, device="cuda", dtype=_torch_dtype(engine_obj.get_tensor_dtype(name))
        )
    for name, tensor in buffers.items():
        context.set_tensor_address(name, tensor.data_ptr())
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    for _ in range(warmup):
        _execute(context, stream)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iterations)]  # fmt: skip
    for start, end in events:
        start.record(stream)
        _execute(context, stream)
        end.record(stream)
    stream.synchronize()
    times = [start.elapsed_time(end) for start, end in events]
    return {
        "median_ms": statistics.median(times),
        "mean_ms": statistics.fmean(times),
        "min_ms": min(times),
        "max_ms": max(times),
        "iterations": float(iterations),
    }


def _trt() -> Any:
    """The ``tensorrt`` module, or ``ImportError`` saying how to install it."""
    try:
        import tensorrt
    except (ImportError, OSError) as err:
        raise ImportError(f"TensorRT is not installed or cannot load ({err}): {_INSTALL}") from err
    if _version(tensorrt) < MIN_VERSION:
        raise ImportError(
            f"TensorRT {tensorrt.__version__} is too old; qdq needs >= "
            f"{'.'.join(map(str, MIN_VERSION))}: {_INSTALL}"
        )
    return tensorrt


def _version(trt: Any) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", str(getattr(trt, "__version__", "")))
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def _no_gpu_message() -> str:
    return (
        "TensorRT needs a CUDA GPU, and torch.cuda.is_available() is False here: run on a machine "
        f"with an NVIDIA GPU ({_INSTALL})"
    )


def _require_gpu() -> None:
    if not torch.cuda.is_available():
        raise RuntimeError(_no_gpu_message())


def _logger(trt: Any) -> Any:
    """A TensorRT logger that forwards to ``logging`` and keeps the error messages."""

    class _Logger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            if int(severity) <= int(trt.ILogger.Severity.ERROR):
                self.errors.append(msg)
                _log.error("TensorRT: %s", msg)
            elif int(severity) == int(trt.ILogger.Severity.WARNING):
                _log.warning("TensorRT: %s", msg)
            else:
                _log.debug("TensorRT: %s", msg)

    return _Logger()


def _add_profile(builder: Any, network: Any, config: Any, shapes: dict[str, Any]) -> None:
    """One optimization profile for dynamic inputs (named shapes, else dynamic dims set to 1)."""
    inputs = [network.get_input(i) for i in range(network.num_inputs)]
    unknown = sorted(set(shapes) - {t.name for t in inputs})
    if unknown:
        raise ValueError(f"input_shapes names {unknown}, not inputs of the network")
    dynamic = [t for t in inputs if t.name in shapes or any(d < 0 for d in tuple(t.shape))]
    if not dynamic:
        return
    profile = builder.create_optimization_profile()
    for t in dynamic:
        spec = shapes.get(t.name, [max(d, 1) for d in tuple(t.shape)])
        if len(spec) == 3 and all(isinstance(s, (tuple, list)) for s in spec):
            low, opt, high = (tuple(s) for s in spec)
        else:
            low = opt = high = tuple(int(d) for d in spec)
        profile.set_shape(t.name, low, opt, high)
    config.add_optimization_profile(profile)


def _deserialize(trt: Any, engine: bytes | str | Path) -> tuple[Any, Any]:
    """The ``ICudaEngine`` (and its logger, which must outlive it)."""
    if isinstance(engine, (str, Path)):
        if not Path(engine).is_file():
            raise FileNotFoundError(f"no TensorRT engine file at {engine}")
        engine = Path(engine).read_bytes()
    if not isinstance(engine, (bytes, bytearray, memoryview)):
        raise TypeError(f"engine must be bytes or a path, got {type(engine).__name__}")
    logger = _logger(trt)
    runtime = trt.Runtime(logger)
    engine_obj = runtime.deserialize_cuda_engine(bytes(engine))
    if engine_obj is None:
        raise EngineBuildError(
            "TensorRT could not deserialize the engine:\n" + "\n".join(logger.errors)
        )
    return engine_obj, (logger, runtime)


def _io_names(trt: Any, engine: Any, *, inputs: bool) -> list[str]:
    want = trt.TensorIOMode.INPUT if inputs else trt.TensorIOMode.OUTPUT
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    return [n for n in names if engine.get_tensor_mode(n) == want]


def _by_name(names: list[str], given: Any) -> dict[str, Any]:
    if isinstance(given, Mapping):
        missing = [n for n in names if n not in given]
        extra = sorted(set(given) - set(names))
        if missing or extra:
            raise ValueError(f"the engine takes inputs {names}; missing {missing}, unknown {extra}")
        return dict(given)
    if isinstance(given, torch.Tensor) or not isinstance(given, Sequence):
        raise TypeError("inputs_or_shapes must be a mapping or a sequence of tensors or shapes")
    if len(given) != len(names):
        raise ValueError(f"the engine takes {len(names)} inputs ({names}), got {len(given)}")
    return dict(zip(names, given, strict=True))


def _torch_dtype(trt_dtype: Any) -> torch.dtype:
    table = {
        "FLOAT": torch.float32, "HALF": torch.float16, "BF16": torch.bfloat16, "INT8": torch.int8,
        "INT32": torch.int32, "INT64": torch.int64, "BOOL": torch.bool, "UINT8": torch.uint8,
        "FP8": torch.float8_e4m3fn,
    }  # fmt: skip
    name = getattr(trt_dtype, "name", str(trt_dtype)).split(".")[-1]
    if name not in table:
        raise TypeError(f"no torch dtype for the TensorRT I/O dtype {name}")
    return table[name]


def _execute(context: Any, stream: torch.cuda.Stream) -> None:
    if not context.execute_async_v3(stream.cuda_stream):
        raise RuntimeError("IExecutionContext.execute_async_v3 failed; see the TensorRT log")
