"""The optional TensorRT backend: lazy import, clear errors, build logic (on a stand-in module), GPU."""

from __future__ import annotations

import enum
import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from qdq.backends import tensorrt as trt_backend
from qdq.backends.tensorrt import (
    EngineBuildError,
    build_engine,
    engine_layer_report,
    tensorrt_available,
    time_engine,
)

INT8 = "Thirty-two wide channel vectorized row major Int8 format"
LAYER_INFO = {
    "Layers": [
        {"Name": "QuantizeLinear_0", "LayerType": "Reformat", "ParameterType": "Reformat",
         "Origin": "QDQ", "Inputs": [{"Name": "input", "Dimensions": [4, 3, 8, 8],
                                      "Format/Datatype": "Row major linear FP32"}],
         "Outputs": [{"Name": "q", "Dimensions": [4, 3, 8, 8], "Format/Datatype": INT8}]},
        {"Name": "w + QuantizeLinear_1 + Conv_2", "LayerType": "CaskConvolution",
         "ParameterType": "Convolution", "Weights": {"Type": "Int8", "Count": 432},
         "Inputs": [{"Name": "q", "Dimensions": [4, 3, 8, 8], "Format/Datatype": INT8}],
         "Outputs": [{"Name": "output", "Dimensions": [4, 16, 6, 6],
                      "Format/Datatype": "Row major linear FP32"}]},
    ],
    "Bindings": ["input", "output"],
}  # fmt: skip


def test_importing_the_backend_does_not_import_tensorrt() -> None:
    code = (
        "import sys, qdq, qdq.backends.tensorrt, qdq.lint.engine_report; "
        "print('tensorrt' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.fixture
def no_tensorrt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # `import tensorrt` raises ImportError


@pytest.fixture
def onnx_file(tmp_path: Path) -> Path:
    path = tmp_path / "m.onnx"
    path.write_bytes(b"onnx")
    return path


def test_clear_errors_without_tensorrt(no_tensorrt: None, onnx_file: Path) -> None:
    ok, why = tensorrt_available()
    assert not ok and "pip install 'qdq[trt]'" in why and "NVIDIA GPU" in why
    with pytest.raises(ImportError, match=r"TensorRT is not installed.*pip install 'qdq\[trt\]'"):
        build_engine(onnx_file)
    with pytest.raises(ImportError, match=r"qdq\[trt\]"):
        engine_layer_report(b"engine")
    with pytest.raises(ImportError, match=r"qdq\[trt\]"):
        time_engine(b"engine", [(1, 3, 8, 8)])


def test_argument_errors_come_first(no_tensorrt: None, tmp_path: Path, onnx_file: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"missing\.onnx"):
        build_engine(tmp_path / "missing.onnx")
    with pytest.raises(ValueError, match="workspace_mb"):
        build_engine(onnx_file, workspace_mb=0)
    with pytest.raises(ValueError, match="iterations"):
        time_engine(b"engine", [(1, 3, 8, 8)], iterations=0)


def _fake_tensorrt(version: str, *, weak: bool = True, strong: bool = True) -> Any:
    """A stand-in for the ``tensorrt`` module that records what the backend asks of it."""
    trt: Any = types.ModuleType("tensorrt")
    trt.__version__ = version
    trt.calls = {"flags": [], "profiles": [], "input_shapes": {}}
    trt.layer_info = json.dumps(LAYER_INFO)

    class Levels(enum.IntEnum):
        INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = range(5)

    class ILogger:
        Severity = Levels

        def __init__(self) -> None:
            pass

    class Config:
        def __init__(self) -> None:
            self.profiling_verbosity = None
            self.cache: bytes | None = None

        def set_memory_pool_limit(self, pool: int, size: int) -> None:
            trt.calls["workspace"] = size

        def set_flag(self, flag: str) -> None:
            trt.calls["flags"].append(flag)

        def add_optimization_profile(self, profile: dict[str, Any]) -> None:
            trt.calls["profiles"].append(profile)

        def create_timing_cache(self, data: bytes) -> bytes:
            return data

        def set_timing_cache(self, cache: bytes, ignore_mismatch: bool) -> None:
            self.cache = cache

        def get_timing_cache(self) -> Any:
            return types.SimpleNamespace(serialize=lambda: b"cache:" + (self.cache or b""))

    class Builder:
        def __init__(self, logger: Any) -> None:
            self.logger = logger

        def create_network(self, flags: int) -> Any:
            trt.calls["network_flags"] = flags
            inp = types.SimpleNamespace(name="input", shape=(-1, 3, 8, 8))
            return types.SimpleNamespace(num_inputs=1, get_input=lambda i: inp)

        def create_builder_config(self) -> Config:
            trt.calls["config"] = Config()
            return trt.calls["config"]

        def create_optimization_profile(self) -> Any:
            shapes: dict[str, Any] = {}
            return types.SimpleNamespace(set_shape=lambda n, *s: shapes.update({n: s}), s=shapes)

        def build_serialized_network(self, network: Any, config: Config) -> bytes | None:
            trt.calls["verbosity"] = config.profiling_verbosity
            if trt.fail_build:
                self.logger.log(Levels.ERROR, "no implementation for Conv_2")
                return None
            return b"serialized-engine"

    class OnnxParser:
        def __init__(self, network: Any, logger: Any) -> None:
            self.num_errors = 0

        def parse_from_file(self, path: str) -> bool:
            if Path(path).read_bytes() == b"bad":
                self.num_errors = 1
            return self.num_errors == 0

        def get_error(self, i: int) -> str:
            return "In node 2 (Conv): INVALID_NODE: weights must be constant"

    class Engine:
        num_io_tensors = 2

        def get_tensor_name(self, i: int) -> str:
            return ["input", "output"][i]

        def get_tensor_mode(self, name: str) -> str:
            return "in" if name == "input" else "out"

        def get_tensor_shape(self, name: str) -> tuple[int, ...]:
            return (-1, 3, 8, 8) if name == "input" else (-1, 16, 6, 6)

        def get_tensor_profile_shape(self, name: str, profile: int) -> list[tuple[int, ...]]:
            return [(1, 3, 8, 8), (4, 3, 8, 8), (8, 3, 8, 8)]

        def create_execution_context(self) -> Any:
            return types.SimpleNamespace(
                set_input_shape=lambda n, s: trt.calls["input_shapes"].update({n: s})
            )

        def create_engine_inspector(self) -> Any:
            return types.SimpleNamespace(
                execution_context=None, get_engine_information=lambda fmt: trt.layer_info
            )

    class Runtime:
        def __init__(self, logger: Any) -> None:
            pass

        def deserialize_cuda_engine(self, data: bytes) -> Engine | None:
            return Engine() if data == b"serialized-engine" else None

    trt.fail_build = False
    trt.ILogger, trt.Builder, trt.OnnxParser, trt.Runtime = ILogger, Builder, OnnxParser, Runtime
    flags = {"EXPLICIT_BATCH": 0, **({"STRONGLY_TYPED": 5} if strong else {})}
    trt.NetworkDefinitionCreationFlag = types.SimpleNamespace(**flags)
    trt.BuilderFlag = types.SimpleNamespace(**({"FP16": "FP16", "INT8": "INT8"} if weak else {}))
    trt.MemoryPoolType = types.SimpleNamespace(WORKSPACE=0)
    trt.ProfilingVerbosity = types.SimpleNamespace(DETAILED="DETAILED")
    trt.LayerInformationFormat = types.SimpleNamespace(JSON="JSON")
    trt.TensorIOMode = types.SimpleNamespace(INPUT="in", OUTPUT="out")
    return trt


@pytest.fixture
def fake_trt(monkeypatch: pytest.MonkeyPatch) -> Any:
    def install(version: str, **kwargs: bool) -> Any:
        trt = _fake_tensorrt(version, **kwargs)
        monkeypatch.setitem(sys.modules, "tensorrt", trt)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        return trt

    return install


@pytest.mark.parametrize(
    ("version", "network_flags", "builder_flags"),
    [
        ("10.12.0.36", 1 << 5, []),  # strongly typed
        ("11.0.0.1", 1 << 5, []),
        ("10.3.0.26", 0, ["INT8", "FP16"]),  # weakly typed, explicit quantization
        ("8.6.1.6", 1 << 0, ["INT8", "FP16"]),  # + EXPLICIT_BATCH before TensorRT 10
    ],
)
def test_build_engine_typing_by_version(
    fake_trt: Any, onnx_file: Path, version: str, network_flags: int, builder_flags: list[str]
) -> None:
    trt = fake_trt(version)
    assert build_engine(onnx_file, workspace_mb=64) == b"serialized-engine"
    assert trt.calls["network_flags"] == network_flags
    assert trt.calls["flags"] == builder_flags
    assert trt.calls["workspace"] == 64 << 20
    assert trt.calls["verbosity"] == "DETAILED"
    # the dynamic batch of the input gets a profile: 1 by default, or the shapes asked for
    assert trt.calls["profiles"][0].s == {"input": ((1, 3, 8, 8),) * 3}
    build_engine(onnx_file, input_shapes={"input": ((1, 3, 8, 8), (4, 3, 8, 8), (8, 3, 8, 8))})
    assert trt.calls["profiles"][1].s == {"input": ((1, 3, 8, 8), (4, 3, 8, 8), (8, 3, 8, 8))}


def test_build_engine_explicit_typing(fake_trt: Any, onnx_file: Path) -> None:
    trt = fake_trt("10.3.0.26")
    build_engine(onnx_file, strongly_typed=True)
    assert trt.calls["network_flags"] == 1 << 5 and trt.calls["flags"] == []
    fake_trt("11.0.0.1", weak=False)
    with pytest.raises(ValueError, match="only strongly typed"):
        build_engine(onnx_file, strongly_typed=False)
    fake_trt("8.6.1.6", strong=False)
    with pytest.raises(ValueError, match="no strongly typed"):
        build_engine(onnx_file, strongly_typed=True)


def test_build_engine_reports_parser_and_builder_errors(fake_trt: Any, tmp_path: Path) -> None:
    trt = fake_trt("10.12.0.36")
    bad, good = tmp_path / "bad.onnx", tmp_path / "good.onnx"
    bad.write_bytes(b"bad")
    good.write_bytes(b"good")
    with pytest.raises(EngineBuildError, match=r"parser rejected .*bad\.onnx[\s\S]*INVALID_NODE"):
        build_engine(bad)
    with pytest.raises(ValueError, match=r"\['images'\], not inputs"):
        build_engine(good, input_shapes={"images": (1, 3, 8, 8)})
    trt.fail_build = True
    with pytest.raises(EngineBuildError, match="no implementation for Conv_2"):
        build_engine(good)


def test_build_engine_timing_cache(fake_trt: Any, onnx_file: Path, tmp_path: Path) -> None:
    fake_trt("10.12.0.36")
    cache = tmp_path / "trt.cache"
    build_engine(onnx_file, timing_cache=cache)
    assert cache.read_bytes() == b"cache:"
    build_engine(onnx_file, timing_cache=cache)  # read back, then written again
    assert cache.read_bytes() == b"cache:cache:"


def test_too_old_tensorrt(fake_trt: Any, onnx_file: Path) -> None:
    fake_trt("8.5.3.1")
    with pytest.raises(ImportError, match=r"8\.5\.3\.1 is too old"):
        build_engine(onnx_file)


def test_no_gpu(fake_trt: Any, monkeypatch: pytest.MonkeyPatch, onnx_file: Path) -> None:
    fake_trt("10.12.0.36")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ok, why = tensorrt_available()
    assert not ok and "CUDA GPU" in why
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        build_engine(onnx_file)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        engine_layer_report(b"serialized-engine")


def test_engine_layer_report_parses_the_inspector(fake_trt: Any, tmp_path: Path) -> None:
    trt = fake_trt("10.12.0.36")
    report = engine_layer_report(b"serialized-engine")
    assert trt.calls["input_shapes"] == {"input": (4, 3, 8, 8)}  # opt shape for the inspector
    assert len(report.qdq_reformats()) == 1
    assert [x.input_precision for x in report.int8_layers()] == ["int8"]
    assert [(t.name, t.mode) for t in report.io_tensors] == [
        ("input", "input"),
        ("output", "output"),
    ]
    (tmp_path / "m.plan").write_bytes(b"serialized-engine")
    assert engine_layer_report(tmp_path / "m.plan").layers == report.layers
    with pytest.raises(EngineBuildError, match="deserialize"):
        engine_layer_report(b"garbage")
    trt.layer_info = json.dumps({"Layers": ["QuantizeLinear_0", "Conv_2"]})
    with pytest.raises(ValueError, match="profilingVerbosity"):
        engine_layer_report(b"serialized-engine")


def test_version_parsing() -> None:
    for text, want in [
        ("10.12.0.36", (10, 12)),
        ("8.6.1", (8, 6)),
        ("11.0", (11, 0)),
        ("", (0, 0)),
    ]:
        assert trt_backend._version(types.SimpleNamespace(__version__=text)) == want


@pytest.mark.gpu
def test_int8_engine_on_gpu(tmp_path: Path) -> None:
    pytest.importorskip("tensorrt")
    pytest.importorskip("onnx")
    import qdq

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.BatchNorm2d(64), torch.nn.ReLU(),
        torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.ReLU(),
    ).eval()  # fmt: skip
    x = torch.randn(4, 32, 32, 32)
    prepared = qdq.prepare(net, (x,))
    qdq.calibrate(prepared, [torch.randn(8, 32, 32, 32) for _ in range(4)], show_progress=False)
    exported = qdq.export_onnx(prepared, (x,), tmp_path / "m.onnx")
    engine = build_engine(exported.path, input_shapes={"input": (4, 32, 32, 32)})
    report = engine_layer_report(engine)
    convs = report.weighted_layers()
    assert convs and all(layer.input_precision == "int8" for layer in convs), [
        (layer.name, layer.input_precision) for layer in report.layers
    ]
    timing = time_engine(engine, [x], iterations=20, warmup=5)
    assert timing["median_ms"] > 0 and timing["iterations"] == 20
