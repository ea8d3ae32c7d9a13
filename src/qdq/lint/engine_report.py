"""Read TensorRT engine layer information (``trtexec --exportLayerInfo``) into plain data.

Both JSON schemas are accepted: TensorRT 8–10 (``{"Layers": [...], "Bindings": [...]}`` with one
``Format/Datatype`` string per tensor) and TensorRT 11 (``"I/O Tensors"`` objects and separate
``Format``/``DataType`` fields), as well as a bare list of layers. Layers of optimization profile
N >= 1 carry a ``" [profile N]"`` suffix. A profile JSON (``--exportProfile``) adds per-layer times,
a trex ``*.build.metadata.json`` the build options. Nothing here needs TensorRT or a GPU.

Example:
    >>> int8 = "Thirty-two wide channel vectorized row major Int8 format"
    >>> report = parse_engine_report([{"Name": "Conv_0 + Relu_1", "LayerType": "CaskConvolution",
    ...     "Inputs": [{"Name": "x", "Dimensions": [1, 3, 8, 8], "Format/Datatype": int8}],
    ...     "Outputs": [{"Name": "y", "Format/Datatype": "Row major linear FP32"}],
    ...     "ParameterType": "Convolution", "Weights": {"Type": "Int8", "Count": 216}}])
    >>> layer = report.find("Relu_1")
    >>> layer.input_precision, layer.output_precision, layer.weights_dtype
    ('int8', 'fp32', 'int8')
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from qdq.lint.engine_fields import (
    MAX_MS,
    EngineReportError,
    array,
    dims,
    json_kind,
    keys,
    milliseconds,
    quote,
    text,
)
from qdq.lint.formats import is_quantized
from qdq.lint.untrusted_json import UntrustedJSONError, load_json, parse_json

__all__ = [
    "DTYPES",
    "MAX_MS",
    "EngineIOTensor",
    "EngineLayer",
    "EngineReport",
    "EngineReportError",
    "EngineTensor",
    "load_engine_report",
    "normalize_dtype",
    "parse_engine_report",
]

DTYPES = ("int8", "fp16", "fp32", "bf16", "fp8", "int32", "int64", "bool", "uint8", "fp4", "int4")
_DTYPE_WORDS = {
    "int8": "int8", "fp16": "fp16", "half": "fp16", "float16": "fp16", "fp32": "fp32",
    "float": "fp32", "float32": "fp32", "bf16": "bf16", "bfloat16": "bf16", "fp8": "fp8",
    "float8": "fp8", "e4m3": "fp8", "fp8e4m3": "fp8", "e5m2": "fp8", "fp8e5m2": "fp8",
    "int32": "int32", "int64": "int64", "bool": "bool", "uint8": "uint8", "fp4": "fp4",
    "float4": "fp4", "e2m1": "fp4", "fp4e2m1": "fp4", "int4": "int4",
}  # fmt: skip
_WEIGHTED = ("convolution", "deconvolution", "convactpool", "fullyconnected", "matrixmultiply",
             "matmul", "gemm")  # fmt: skip
_PROFILE_SUFFIX = re.compile(r" \[profile (\d{1,9})\]$")
_ONNX_LAYER = "[ONNX Layer:"
_ONNX_LAYER_END = re.compile(r"\](?=\[|$)")
_WRAPPERS = ("PWN(", "fusedPointwiseNode(")
_UNWRAP_DEPTH = 8  # PWN(PWN(...)) deeper than this is kept as one name
_PARENS_OR_COMMA = re.compile(r"[(),]")


def normalize_dtype(text: str | None) -> str | None:
    """The dtype named in a TensorRT format or data-type string, as one of :data:`DTYPES`.

    Example:
        >>> normalize_dtype("Thirty-two wide channel vectorized row major Int8 format")
        'int8'
        >>> normalize_dtype("Half"), normalize_dtype("DataType.BF16"), normalize_dtype("kLINEAR")
        ('fp16', 'bf16', None)
    """
    for word in re.findall(r"[A-Za-z0-9]+", text or ""):
        low = word.lower()
        if low in _DTYPE_WORDS:
            return _DTYPE_WORDS[low]
        if low.startswith("k") and low[1:] in _DTYPE_WORDS:  # TensorRT enum names: kHALF, kINT8
            return _DTYPE_WORDS[low[1:]]
    return None


@dataclass(frozen=True)
class EngineTensor:
    """One tensor a layer reads or writes: ``format`` is TensorRT's text, ``dtype`` normalised."""

    name: str
    dims: tuple[int, ...]
    format: str
    dtype: str | None


@dataclass(frozen=True)
class EngineIOTensor:
    """An engine input or output (``mode`` ``"input"``/``"output"``, ``None`` if unknown)."""

    name: str
    mode: str | None
    dims: tuple[int, ...]
    dtype: str | None
    format: str = ""


@dataclass(frozen=True)
class EngineLayer:
    """One engine layer (often several fused network layers).

    Attributes:
        name: TensorRT's name, fused names joined with ``" + "`` (as in the profile JSON).
        layer_type: implementation family (``CaskConvolution``, ``Reformat``, ``NoOp``, ...).
        parameter_type: logical type (``Convolution``, ``Reformat``, ...), if given.
        inputs, outputs: the activation tensors (weights are not among them).
        origin: ``"QDQ"`` or ``"REFORMAT"`` on reformat layers.
        tactic: the kernel name (``TacticName``), if any.
        weights_dtype: normalised ``Weights.Type`` (``ConvWeights`` for ConvActPool).
        onnx_nodes: the network layer names it absorbed: ``Name`` split on ``" + "``/``" || "``
            (``PWN(...)`` unwrapped) plus ``[ONNX Layer: ...]`` entries of ``Metadata``.
        profile: the optimization profile (from a ``" [profile N]"`` suffix, else 0).
        median_ms, average_ms: from the profile JSON, when one was given and names this layer.
        constants: TensorRT 10+ ``Constants`` tensors (weights of fused regions).
        raw: the layer's JSON object, for any other field (``Kernel``, ``OutMaps``, ...).
    """

    name: str
    layer_type: str
    parameter_type: str | None
    inputs: tuple[EngineTensor, ...]
    outputs: tuple[EngineTensor, ...]
    origin: str | None = None
    tactic: str | None = None
    weights_dtype: str | None = None
    onnx_nodes: tuple[str, ...] = ()
    profile: int = 0
    median_ms: float | None = None
    average_ms: float | None = None
    constants: tuple[EngineTensor, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def compute_inputs(self) -> tuple[EngineTensor, ...]:
        """Inputs that are not constants (weights)."""
        const = {t.name for t in self.constants}
        return tuple(t for t in self.inputs if t.name not in const)

    @property
    def input_precision(self) -> str | None:
        """dtype of the first compute input (a fused residual addend is a later input)."""
        return next((t.dtype for t in self.compute_inputs if t.dtype), None)

    @property
    def output_precision(self) -> str | None:
        """dtype of the first output."""
        return next((t.dtype for t in self.outputs if t.dtype), None)

    @property
    def is_reformat(self) -> bool:
        """A ``Reformat`` layer (builder-inserted or an unfused Q/DQ)."""
        return "Reformat" in (self.layer_type, self.parameter_type)

    @property
    def is_qdq_reformat(self) -> bool:
        """An unfused Q/DQ: a Reformat of origin QDQ, or a Scale whose input XOR output is quantized
        (INT8 or FP8)."""
        if self.is_reformat:
            return (self.origin or "").upper() == "QDQ"
        if "Scale" in (self.layer_type, self.parameter_type) and self.inputs and self.outputs:
            return is_quantized(self.inputs[0].dtype) != is_quantized(self.outputs[0].dtype)
        return False

    @property
    def is_weighted(self) -> bool:
        """A Convolution/Deconvolution/FullyConnected/MatMul/Gemm-like compute layer."""
        kinds = f"{self.layer_type} {self.parameter_type or ''}".lower()
        return any(k in kinds for k in _WEIGHTED)


@dataclass(frozen=True)
class EngineReport:
    """A parsed engine report.

    Attributes:
        layers: every engine layer in TensorRT's order.
        io_tensors: the engine inputs and outputs (from ``I/O Tensors``, or ``Bindings`` completed
            from the layers' tensors).
        schema: ``"trt11"`` when split ``Format``/``DataType`` fields or ``I/O Tensors`` were seen,
            else ``"trt8-10"``.
        build_metadata: the trex ``*.build.metadata.json`` object, if given.
        profile_count: iterations of the profile run (the profile's ``count`` record), if any.
        unmatched_timings: median ms of profile records that name no layer.
        has_timings: whether a profile JSON was read.
    """

    layers: tuple[EngineLayer, ...]
    io_tensors: tuple[EngineIOTensor, ...] = ()
    schema: str = "trt8-10"
    build_metadata: dict[str, Any] | None = None
    profile_count: int | None = None
    unmatched_timings: dict[str, float] = field(default_factory=dict)
    has_timings: bool = False

    @property
    def build_precision(self) -> str | None:
        """``build_options.Precision`` of the build metadata (``"FP32+FP16+INT8"``), if known."""
        options = (self.build_metadata or {}).get("build_options") or {}
        precision = options.get("Precision") if isinstance(options, dict) else None
        return precision if isinstance(precision, str) else None

    def reformats(self, origin: str | None = None) -> tuple[EngineLayer, ...]:
        """Reformat layers, optionally only those of ``origin`` (``"QDQ"``/``"REFORMAT"``)."""
        want = origin.upper() if origin is not None else None
        return tuple(
            x for x in self.layers
            if x.is_reformat and (want is None or (x.origin or "").upper() == want)
        )  # fmt: skip

    def qdq_reformats(self) -> tuple[EngineLayer, ...]:
        """Unfused Q/DQ layers (see :attr:`EngineLayer.is_qdq_reformat`)."""
        return tuple(x for x in self.layers if x.is_qdq_reformat)

    def layers_by_precision(
        self, which: Literal["input", "output"] = "input"
    ) -> dict[str | None, tuple[EngineLayer, ...]]:
        """Layers grouped by compute-input (or output) precision; ``None``: no typed tensor."""
        groups: dict[str | None, list[EngineLayer]] = {}
        for x in self.layers:
            key = x.input_precision if which == "input" else x.output_precision
            groups.setdefault(key, []).append(x)
        return {k: tuple(v) for k, v in groups.items()}

    def int8_layers(self) -> tuple[EngineLayer, ...]:
        """Layers that compute on INT8 inputs (reformats, unfused Q/DQ and NoOps excluded)."""
        return tuple(
            x for x in self.layers
            if x.input_precision == "int8" and x.layer_type != "NoOp"
            and not (x.is_reformat or x.is_qdq_reformat)
        )  # fmt: skip

    def quantized_layers(self, precision: str | None = None) -> tuple[EngineLayer, ...]:
        """Layers that compute on quantized inputs (INT8 or FP8, or only ``precision``);
        reformats, unfused Q/DQ and NoOps excluded.

        Example:
            >>> fp8 = "Row major linear FP8 format"
            >>> r = parse_engine_report([{"Name": "Gemm_3", "LayerType": "gemm",
            ...     "Inputs": [{"Name": "a", "Format/Datatype": fp8}], "Outputs": []}])
            >>> [x.name for x in r.quantized_layers("fp8")], r.int8_layers()
            (['Gemm_3'], ())
        """
        return tuple(
            x for x in self.layers
            if is_quantized(x.input_precision) and x.layer_type != "NoOp"
            and not (x.is_reformat or x.is_qdq_reformat)
            and (precision is None or x.input_precision == precision)
        )  # fmt: skip

    def weighted_layers(self) -> tuple[EngineLayer, ...]:
        """Convolution/Deconvolution/FullyConnected/MatMul/Gemm-like layers (ConvActPool too)."""
        return tuple(x for x in self.layers if x.is_weighted)

    def find(self, onnx_node_name: str, *, profile: int = 0) -> EngineLayer | None:
        """The layer that absorbed ONNX node ``onnx_node_name`` (``None`` if none names it).

        Example:
            >>> r = parse_engine_report([{"Name": "w + QuantizeLinear_7 + Conv_9",
            ...     "LayerType": "CaskConvolution", "Inputs": [], "Outputs": []}])
            >>> r.find("Conv_9").name
            'w + QuantizeLinear_7 + Conv_9'
        """
        return next(
            (x for x in self.layers if x.profile == profile and onnx_node_name in x.onnx_nodes),
            None,
        )

    def total_median_ms(self) -> float:
        """Sum of the per-layer median times of the profile JSON (all its records).

        Raises:
            ValueError: no profile JSON was given.
        """
        if not self.has_timings:
            raise ValueError("this engine report has no timings; pass profile_json")
        return sum(x.median_ms or 0.0 for x in self.layers) + sum(self.unmatched_timings.values())


def load_engine_report(
    graph_json: str | Path,
    profile_json: str | Path | None = None,
    metadata_json: str | Path | None = None,
) -> EngineReport:
    """Read ``trtexec --exportLayerInfo`` JSON (and optionally ``--exportProfile`` and build metadata).

    The files are read as untrusted input: within the size and nesting limits of
    :mod:`qdq.lint.untrusted_json`, every field the reader uses checked for its type, every time
    finite, non-negative and at most :data:`MAX_MS`.

    Args:
        graph_json: the layer-information file (written with ``--profilingVerbosity=detailed``).
        profile_json: the per-layer profile file, for :attr:`EngineLayer.median_ms`.
        metadata_json: trex's ``*.build.metadata.json``.

    Raises:
        FileNotFoundError: a file does not exist.
        EngineReportError: (a ``ValueError``) a file is not JSON, breaks a limit or is not of the
            expected shape (layers given as plain strings mean the engine was built without
            detailed profiling verbosity); the message names the file and the field.

    Example:
        >>> import json, os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "m.graph.json")
        >>> with open(path, "w") as fh:
        ...     json.dump({"Layers": [{"Name": "QuantizeLinear_2", "LayerType": "Reformat",
        ...         "Origin": "QDQ", "Inputs": [], "Outputs": []}], "Bindings": []}, fh)
        >>> len(load_engine_report(path).qdq_reformats())
        1
    """
    files = {"layers": graph_json, "profile": profile_json, "metadata": metadata_json}
    profile = None if profile_json is None else _read_json(profile_json, "profile JSON", "profile")
    meta = (
        None
        if metadata_json is None
        else _read_json(metadata_json, "build metadata JSON", "metadata")
    )
    layers = _read_json(graph_json, "layer-information JSON", "layers")
    try:
        return parse_engine_report(layers, profile, meta)
    except EngineReportError as err:
        raise EngineReportError(f"{files[err.part]}: {err}", err.part) from None


def parse_engine_report(
    layer_info: str | bytes | dict[str, Any] | list[Any],
    profile: list[Any] | None = None,
    build_metadata: dict[str, Any] | None = None,
) -> EngineReport:
    """Like :func:`load_engine_report` for JSON text or already-decoded objects.

    ``layer_info`` is what ``IEngineInspector.get_engine_information(LayerInformationFormat.JSON)``
    returns, or the decoded object; ``profile`` the decoded ``--exportProfile`` list.

    Raises:
        EngineReportError: as :func:`load_engine_report` (``part`` says which input is wrong).
    """
    if isinstance(layer_info, (str, bytes)):
        try:
            layer_info = parse_json(layer_info, "engine layer information")
        except UntrustedJSONError as err:
            raise EngineReportError(f"engine layer information is not JSON: {err.reason}") from None
    if isinstance(layer_info, list):
        raw_layers, io_raw, bindings = layer_info, None, None
    elif isinstance(layer_info, dict) and isinstance(layer_info.get("Layers"), list):
        raw_layers = layer_info["Layers"]
        io_raw, bindings = layer_info.get("I/O Tensors"), layer_info.get("Bindings")
    else:
        raise EngineReportError(
            "engine layer information must be a list of layers or an object with a 'Layers' list, "
            f"got {type(layer_info).__name__}"
            + (f" with keys {keys(layer_info)}" if isinstance(layer_info, dict) else "")
        )
    bad = next((x for x in raw_layers if not isinstance(x, dict)), None)
    if isinstance(bad, str):
        raise EngineReportError(
            f"the engine report lists layers as plain names (first: {quote(bad)}): the engine "
            "was built without detailed profiling verbosity; rebuild with trtexec "
            "--profilingVerbosity=detailed (or ProfilingVerbosity.DETAILED in the builder config)"
        )
    if bad is not None:
        raise EngineReportError(
            f"engine layer entries must be JSON objects, got {type(bad).__name__}"
        )
    nameless = next((x for x in raw_layers if "Name" not in x), None)
    if nameless is not None:
        profile_like = "name" in nameless or "count" in nameless or "averageMs" in nameless
        raise EngineReportError(
            "not a trtexec --exportLayerInfo report: a layer entry has no 'Name' (keys: "
            f"{keys(nameless, 6)})"
            + ("; this looks like the --exportProfile JSON" if profile_like else "")
        )
    if build_metadata is not None and not isinstance(build_metadata, dict):
        raise EngineReportError("build metadata JSON must be an object", "metadata")
    timings, count = _timings(profile)
    layers = tuple(_layer(x, i, timings) for i, x in enumerate(raw_layers))
    names = {x.name for x in layers}
    unmatched = {k: v[0] for k, v in timings.items() if k not in names and v[0] is not None}
    split = isinstance(io_raw, list) or any(
        isinstance(t, dict) and ("DataType" in t or "Datatype" in t) and "Format/Datatype" not in t
        for x in raw_layers for t in [*(x.get("Inputs") or []), *(x.get("Outputs") or [])]
    )  # fmt: skip
    if io_raw is not None and not isinstance(io_raw, list):
        raise EngineReportError(f"'I/O Tensors' must be an array, got {json_kind(io_raw)}")
    io = _io_tensors(io_raw) if isinstance(io_raw, list) else _from_bindings(bindings, layers)
    schema = "trt11" if split else "trt8-10"
    return EngineReport(layers, io, schema, build_metadata, count, unmatched, profile is not None)


def _read_json(path: str | Path, what: str, part: str) -> Any:
    try:
        return load_json(path, what)
    except UntrustedJSONError as err:
        raise EngineReportError(str(err), part) from None


def _timings(profile: Any) -> tuple[dict[str, tuple[float | None, float | None]], int | None]:
    """``{layer name: (median ms, average ms)}`` and the iteration count of a profile JSON."""
    if profile is None:
        return {}, None
    if not isinstance(profile, list):
        raise EngineReportError(
            f"profile JSON must be a list of records, got {type(profile).__name__}", "profile"
        )
    out: dict[str, tuple[float | None, float | None]] = {}
    count: int | None = None
    for k, rec in enumerate(profile):
        if not isinstance(rec, dict):
            raise EngineReportError(
                f"profile JSON records must be objects, got {json_kind(rec)} (record {k})",
                "profile",
            )
        if "name" in rec:
            name = text(rec, "name", f"profile record {k}", "profile") or ""
            where = f"profile record {k} ({quote(name)})"
            out[name] = (
                milliseconds(rec, "medianMs", where),
                milliseconds(rec, "averageMs", where),
            )
        elif "count" in rec:
            value = rec["count"]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise EngineReportError(
                    f"profile record {k}: 'count' must be an integer >= 0, got {json_kind(value)}",
                    "profile",
                )
            count = value
    return out, count


def _tensor(raw: Any, where: str) -> EngineTensor:
    if isinstance(raw, str):
        return EngineTensor(raw, (), "", None)
    if not isinstance(raw, dict):
        raise EngineReportError(f"{where}: a tensor must be an object, got {json_kind(raw)}")
    name = text(raw, "Name", where) or ""
    where = f"{where} tensor {quote(name)}"
    combined = text(raw, "Format/Datatype", where) or text(raw, "Format/DataType", where)
    fmt = combined or text(raw, "Format", where) or ""
    dtype_text = text(raw, "DataType", where) or text(raw, "Datatype", where)
    dtype = normalize_dtype(dtype_text) if dtype_text else normalize_dtype(fmt)
    return EngineTensor(name, dims(raw.get("Dimensions"), where), fmt, dtype)


def _layer(
    raw: dict[str, Any], index: int, timings: dict[str, tuple[float | None, float | None]]
) -> EngineLayer:
    where = f"layer {index}"
    name = text(raw, "Name", where)
    if name is None:
        raise EngineReportError(f"{where}: 'Name' must be a string, got null")
    where = f"layer {index} ({quote(name)})"
    match = _PROFILE_SUFFIX.search(name)
    base = name[: match.start()] if match else name
    weights = raw.get("Weights") if raw.get("Weights") is not None else raw.get("ConvWeights")
    if weights is not None and not isinstance(weights, dict):
        raise EngineReportError(f"{where}: 'Weights' must be an object, got {json_kind(weights)}")
    wtype = text(weights, "Type", f"{where} weights") if weights else None
    metadata = text(raw, "Metadata", where)
    median, average = timings.get(name, (None, None))
    constants = [t for t in array(raw, "Constants", where) if not isinstance(t, str)]
    return EngineLayer(
        name=name,
        layer_type=text(raw, "LayerType", where) or "",
        parameter_type=text(raw, "ParameterType", where),
        inputs=tuple(_tensor(t, f"{where} input") for t in array(raw, "Inputs", where)),
        outputs=tuple(_tensor(t, f"{where} output") for t in array(raw, "Outputs", where)),
        origin=text(raw, "Origin", where),
        tactic=text(raw, "TacticName", where),
        weights_dtype=normalize_dtype(wtype) if wtype else None,
        onnx_nodes=_fused_names(base, metadata),
        profile=int(match.group(1)) if match else 0,
        median_ms=median,
        average_ms=average,
        constants=tuple(_tensor(t, f"{where} constant") for t in constants),
        raw=raw,
    )


def _fused_names(name: str, metadata: str | None) -> tuple[str, ...]:
    """Network layer names in a fused ``Name`` and in ``Metadata``, deduplicated, in order."""
    found: list[str] = []
    for part in re.split(r" \+ | \|\| ", name):
        found.extend(_unwrap(part.strip()))
    for chunk in re.split("[\x1e\x1f]", metadata or ""):
        found.extend(_onnx_layers(chunk.strip()))
    return tuple(dict.fromkeys(n for n in found if n))


def _onnx_layers(chunk: str) -> list[str]:
    """The names in ``[ONNX Layer: NAME]`` entries of one ``Metadata`` chunk: ``NAME`` runs to the
    first ``]`` that ends the chunk's line or starts another ``[`` entry (one linear scan)."""
    out: list[str] = []
    for line in chunk.split("\n"):
        start = line.find(_ONNX_LAYER)
        while start >= 0:
            body = start + len(_ONNX_LAYER)
            while body < len(line) and line[body].isspace():
                body += 1
            end = _ONNX_LAYER_END.search(line, body + 1)
            if end is None:
                break
            out.append(line[body : end.start()].strip())
            start = line.find(_ONNX_LAYER, end.end())
    return out


def _unwrap(token: str, depth: int = 0) -> list[str]:
    """``PWN(Clip_16)`` -> ``["Clip_16"]``; ``PWN(PWN(A, B), C)`` -> ``["A", "B", "C"]``."""
    for prefix in _WRAPPERS:
        if depth < _UNWRAP_DEPTH and token.startswith(prefix) and token.endswith(")"):
            inner, level, start, parts = token[len(prefix) : -1], 0, 0, []
            for m in _PARENS_OR_COMMA.finditer(inner) if "," in inner else ():
                ch = m.group()
                level += (ch == "(") - (ch == ")")
                if ch == "," and level == 0:
                    parts.append(inner[start : m.start()])
                    start = m.end()
            parts.append(inner[start:])
            return [n for p in parts for n in _unwrap(p.strip(), depth + 1)]
    return [token]


def _io_tensors(raw: Sequence[Any]) -> tuple[EngineIOTensor, ...]:
    """TensorRT 11 ``I/O Tensors`` objects."""
    out = []
    for k, t in enumerate(raw):
        if not isinstance(t, dict):
            raise EngineReportError(f"'I/O Tensors' entries must be objects, got {json_kind(t)}")
        name = text(t, "Name", f"I/O tensor {k}") or ""
        where = f"I/O tensor {k} ({quote(name)})"
        infos = array(t, "ProfileInfo", where) or [{}]
        fmt = (text(infos[0], "Format", where) or "") if isinstance(infos[0], dict) else ""
        mode = (text(t, "IOMode", where) or "").lower() or None
        dtype = normalize_dtype(text(t, "DataType", where) or text(t, "Datatype", where) or fmt)
        out.append(EngineIOTensor(name, mode, dims(t.get("Dimensions"), where), dtype, fmt))
    return tuple(out)


def _from_bindings(bindings: Any, layers: Sequence[EngineLayer]) -> tuple[EngineIOTensor, ...]:
    """TensorRT 8–10 ``Bindings`` (names only): mode, dims and dtype from the layers' tensors."""
    if bindings is None:
        bindings = []
    if not isinstance(bindings, list) or not all(isinstance(b, str) for b in bindings):
        bad = (
            bindings
            if not isinstance(bindings, list)
            else next(b for b in bindings if not isinstance(b, str))
        )
        raise EngineReportError(f"'Bindings' must be an array of strings, got {json_kind(bad)}")
    seen = {t.name: (t, "input") for x in reversed(layers) for t in x.inputs}
    seen.update({t.name: (t, "output") for x in layers for t in x.outputs})
    out = []
    for name in bindings:
        t, mode = seen.get(name, (EngineTensor(name, (), "", None), None))
        out.append(EngineIOTensor(name, mode, t.dims, t.dtype, t.format))
    return tuple(out)
