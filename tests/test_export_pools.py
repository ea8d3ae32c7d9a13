"""Global average pooling in the export: the dynamo exporter's ``ReduceMean`` over H, W becomes
``GlobalAveragePool`` (the same mean in ONNX Runtime), so both exporters' files lint alike."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import qdq
from qdq.backends.onnxruntime import run, session
from qdq.export import postprocess
from qdq.export.postprocess import global_average_pools

pytest.importorskip("onnxruntime")


def _reduce_mean(
    shape: tuple[int, ...], axes: list[int], keepdims: int, opset: int
) -> onnx.ModelProto:
    """``y = ReduceMean(x)``, axes as an attribute (opset < 18) or a constant input."""
    inputs, inits, attrs = ["x"], [], {"keepdims": keepdims}
    if opset >= 18:
        inputs.append("axes")
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
    else:
        attrs["axes"] = axes
    reduced = {a % len(shape) for a in axes} if axes else set(range(len(shape)))
    out = [1 if i in reduced else d for i, d in enumerate(shape) if keepdims or i not in reduced]
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", inputs, ["y"], name="pool/ReduceMean", **attrs)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)],
        initializer=inits,
    )
    opsets = [helper.make_opsetid("", opset)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


@pytest.mark.parametrize(
    ("shape", "axes", "keepdims", "opset", "ops"),
    [
        ((2, 512, 7, 7), [2, 3], 1, 13, ["GlobalAveragePool"]),
        ((2, 512, 7, 7), [-1, -2], 1, 17, ["GlobalAveragePool"]),  # the dynamo export
        ((2, 512, 7, 7), [-1, -2], 1, 18, ["GlobalAveragePool"]),  # axes as an input
        ((2, 64, 9, 5), [2, 3], 0, 18, ["GlobalAveragePool", "Squeeze"]),
        ((4, 1280, 7, 7), [-2, -1], 0, 13, ["GlobalAveragePool", "Squeeze"]),
        ((2, 8, 3, 4, 5), [2, 3, 4], 1, 13, ["GlobalAveragePool"]),  # 3-D pooling
        ((2, 16, 11), [2], 1, 13, ["GlobalAveragePool"]),  # 1-D
    ],
)
def test_a_spatial_reducemean_becomes_global_average_pool(
    shape: tuple[int, ...], axes: list[int], keepdims: int, opset: int, ops: list[str]
) -> None:
    before = _reduce_mean(shape, axes, keepdims, opset)
    after = copy.deepcopy(before)
    assert global_average_pools(after) == 1
    assert [n.op_type for n in after.graph.node] == ops
    assert after.graph.node[-1].output[0] == "y" and not [
        i for i in after.graph.initializer if i.name == "axes"
    ]
    onnx.checker.check_model(after, full_check=True)
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32) * 3
    (want,), (got,) = run(session(before), [x]), run(session(after), [x])
    # the same mean: ORT's two kernels sum in different orders (a few float32 ulps at most)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(
        got, x.mean(axis=tuple(range(2, len(shape))), keepdims=bool(keepdims)), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("axes", [[1], [3], [2], [0, 2, 3], [1, 2, 3], []])
def test_other_reductions_are_kept(axes: list[int]) -> None:
    model = _reduce_mean((2, 8, 5, 5), axes, 1, 18)
    assert global_average_pools(model) == 0
    assert [n.op_type for n in model.graph.node] == ["ReduceMean"]


def test_a_reducemean_of_unknown_rank_is_kept() -> None:
    model = _reduce_mean((2, 8, 5, 5), [2, 3], 1, 13)
    del model.graph.input[0].type.tensor_type.shape.dim[:]
    model.graph.input[0].type.tensor_type.ClearField("shape")
    assert global_average_pools(model) == 0


class _RMSNorm(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class _LayerNorm(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centred = x - x.mean(-1, keepdim=True)
        return centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + 1e-6)


@pytest.mark.parametrize("norm", [_RMSNorm, _LayerNorm])
def test_a_normalization_statistic_over_the_last_axis_stays_a_reducemean(
    norm: type[torch.nn.Module],
) -> None:
    """A (batch, tokens, channels) tensor's mean over channels is "all spatial axes" of a
    rank-3 tensor, but the mean of a ``Pow`` or a mean subtracted from its input is a
    normalization's statistic (the dynamo export of T5's RMSNorm), not a pool: made a
    GlobalAveragePool, TensorRT tooling and the linter would read the norm as an INT8 pool."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            norm().eval(), (torch.randn(2, 6, 32),), dynamo=True, opset_version=18, verbose=False
        )
    model = program.model_proto
    means = sum(n.op_type == "ReduceMean" for n in model.graph.node)
    assert means == (1 if norm is _RMSNorm else 2)
    assert global_average_pools(model) == 0
    assert [n.op_type for n in model.graph.node].count("ReduceMean") == means


def _export(prepared: torch.nn.Module, x: torch.Tensor, path: Path, exporter: str) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return qdq.export_onnx(prepared, (x,), path, exporter=exporter).path


@pytest.fixture(scope="module")
def resnet18() -> tuple[torch.nn.Module, torch.Tensor]:
    tv = pytest.importorskip("torchvision.models")
    torch.manual_seed(0)
    x = torch.randn(1, 3, 64, 64)
    prepared = qdq.prepare(tv.resnet18().eval(), (x,))
    qdq.calibrate(prepared, [torch.randn(2, 3, 64, 64) for _ in range(2)], show_progress=False)
    return prepared, x


def test_resnet18_lints_the_same_from_both_exporters(resnet18, tmp_path: Path) -> None:
    prepared, x = resnet18
    dyn = _export(prepared, x, tmp_path / "dynamo.onnx", "dynamo")
    ts = _export(prepared, x, tmp_path / "torchscript.onnx", "torchscript")
    ops = {p: {n.op_type for n in onnx.load(str(p)).graph.node} for p in (dyn, ts)}
    assert all("GlobalAveragePool" in o and "ReduceMean" not in o for o in ops.values())
    a, b = qdq.lint.lint(dyn), qdq.lint.lint(ts)
    assert a.verdict == b.verdict == "PASS"
    for key in ("unfused_qdq", "float_islands", "int8_weighted_layers", "scale_mismatches"):
        assert a.summary[key] == b.summary[key], key
    assert a.summary["unfused_qdq"] == 1 and a.summary["float_islands"] == 0
    assert [(ly.kind, ly.input_precision, ly.output_precision) for ly in a.layers] == [
        (ly.kind, ly.input_precision, ly.output_precision) for ly in b.layers
    ]


def test_the_rewrite_keeps_the_outputs(resnet18, tmp_path: Path, monkeypatch) -> None:
    """The dynamo export with and without the rewrite: same outputs in ONNX Runtime, and the
    linter reads the unrewritten ReduceMean as the same pool."""
    prepared, x = resnet18
    rewritten = _export(prepared, x, tmp_path / "gap.onnx", "dynamo")
    monkeypatch.setattr(postprocess, "global_average_pools", lambda model: 0)
    kept = _export(prepared, x, tmp_path / "mean.onnx", "dynamo")
    assert "ReduceMean" in {n.op_type for n in onnx.load(str(kept)).graph.node}
    batch = torch.randn(4, 3, 64, 64)
    (want,), (got,) = run(session(kept), [batch]), run(session(rewritten), [batch])
    # the pool output is quantized for the fc: a last-ulp difference could move a value across
    # a code boundary, which would show as one fc-input step; none does here
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    a, b = qdq.lint.lint(kept), qdq.lint.lint(rewritten)
    assert a.summary == b.summary and a.verdict == b.verdict
