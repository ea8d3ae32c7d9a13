"""Export failures seen in the zoo sweep (benchmarks/zoo_sweep.py) that qdq fixes itself:
timm's ``forward(x, attn_mask=None, is_causal=False)`` under the TorchScript exporter, graphs
whose nodes are not in topological order, and ops newer than the chosen opset."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qdq

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


class _Attention(nn.Module):
    """timm's attention signature: defaults the example input does not pass."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.proj = nn.Linear(16, 16)

    def forward(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False
    ) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
        return self.proj(y)


def test_torchscript_export_keeps_python_defaults_of_forward(tmp_path) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    prepared = qdq.prepare(_Attention().eval(), (x,))
    qdq.calibrate(prepared, [x], show_progress=False)
    # torch alone fails: the default is_causal=False is appended to the traced inputs as a tensor
    with pytest.raises(Exception, match="is_causal"):
        torch.onnx.export(
            _Attention().eval(), (x,), tmp_path / "plain.onnx", dynamo=False, opset_version=17
        )
    out = qdq.export_onnx(prepared, (x,), tmp_path / "m.onnx", exporter="torchscript", verify=True)
    graph = onnx.load(str(out.path)).graph
    assert [i.name for i in graph.input] == ["input"]  # is_causal is no graph input
    assert "forward" not in prepared.__dict__  # the export's view of forward is gone
    assert out.num_quantize >= 4


class _Fold(nn.Module):
    """``F.fold`` (timm's VOLO outlook attention): ONNX ``Col2Im``, opset 18 only."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cols = F.unfold(self.conv(x), 2, stride=2)
        return F.fold(cols, (8, 8), 2, stride=2)


def test_downgrade_names_an_op_the_target_opset_lacks() -> None:
    from onnx import TensorProto, helper

    from qdq.export.opset import NewerOpError, downgrade

    node = helper.make_node("Col2Im", ["x", "size", "block"], ["y"], name="blocks.0/Col2Im")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("x",)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            helper.make_tensor("size", TensorProto.INT64, [2], [8, 8]),
            helper.make_tensor("block", TensorProto.INT64, [2], [2, 2]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(
        NewerOpError, match=r"Col2Im \(opset 18\+\) at blocks\.0/Col2Im.*opset=18"
    ) as err:
        downgrade(model, 17)
    assert err.value.ops == {"Col2Im": 18}


@pytest.fixture(scope="module")
def fold() -> nn.Module:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    prepared = qdq.prepare(_Fold().eval(), (x,))
    qdq.calibrate(prepared, [x], show_progress=False)
    return prepared


def test_op_newer_than_the_opset_is_refused_with_the_opset_to_use(fold, tmp_path) -> None:
    x = torch.randn(2, 3, 8, 8)
    with pytest.raises(ValueError, match=r"Col2Im \(opset 18\+\) at .*export with opset=18"):
        qdq.export_onnx(fold, (x,), tmp_path / "m.onnx", exporter="dynamo", opset=17)
    with (
        pytest.warns(UserWarning, match="dynamo export failed"),
        pytest.raises(
            qdq.export.ExportError, match=r"(?s)dynamo: NewerOpError: .*opset=18.*torchscript:"
        ),
    ):
        qdq.export_onnx(fold, (x,), tmp_path / "m.onnx", exporter="auto", opset=17)
    assert list(tmp_path.iterdir()) == []
    out = qdq.export_onnx(fold, (x,), tmp_path / "m.onnx", exporter="auto", opset=18, verify=True)
    assert out.exporter == "dynamo" and out.opset == 18
    assert any(n.op_type == "Col2Im" for n in onnx.load(str(out.path)).graph.node)


class _Clamps(nn.Module):
    """One tensor clamped three times with different bounds (timm's Gemma 4 ViT q/k/v inputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        for i in range(3):
            self.register_buffer(f"lo{i}", torch.tensor(-1.0 - i))
            self.register_buffer(f"hi{i}", torch.tensor(1.0 + i))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * 2
        bounds = [(getattr(self, f"lo{i}"), getattr(self, f"hi{i}")) for i in range(3)]
        return sum(p(torch.clamp(x, lo, hi)) for p, (lo, hi) in zip(self.proj, bounds, strict=True))


def test_dynamo_clip_bounds_lost_by_onnxscript_are_registered(tmp_path) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(4, 8) * 3
    prepared = qdq.prepare(_Clamps().eval(), (x,))
    qdq.calibrate(prepared, [x], show_progress=False)
    out = qdq.export_onnx(prepared, (x,), tmp_path / "m.onnx", exporter="dynamo", verify=True)
    graph = onnx.load(str(out.path)).graph
    clips = [n for n in graph.node if n.op_type == "Clip"]
    defined = {i.name for i in graph.initializer} | {o for n in graph.node for o in n.output}
    assert len(clips) == 3 and all(i in defined for n in clips for i in n.input[1:])


class _StdConv2d(nn.Conv2d):
    """timm's ``StdConv2d`` (NFNet, BiT): the weight is standardized in every forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = F.batch_norm(
            self.weight.reshape(1, self.out_channels, -1), None, None, training=True, eps=1e-6
        ).reshape_as(self.weight)
        return F.conv2d(x, w, self.bias, self.stride, self.padding)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_weight_standardized_in_forward_exports_as_an_int8_constant(tmp_path, exporter) -> None:
    import numpy as np
    import onnxruntime as ort

    from qdq.lint import lint

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = nn.Sequential(
        _StdConv2d(16, 32, 3, padding=1), nn.ReLU(), _StdConv2d(32, 32, 3), nn.ReLU()
    ).eval()
    x = torch.randn(2, 16, 12, 12)
    prepared = qdq.prepare(net, (x,))
    qdq.calibrate(prepared, [x], show_progress=False)
    path = tmp_path / "m.onnx"
    qdq.export_onnx(prepared, (x,), path, exporter=exporter)
    model = onnx.load(str(path))
    ops = [n.op_type for n in model.graph.node]
    # the standardization is evaluated once: each Conv reads Q/DQ of a constant weight
    assert "BatchNormalization" not in ops and "ReduceMean" not in ops
    assert ops.count("Conv") == 2 and ops.count("QuantizeLinear") == 4
    inits = {i.name for i in model.graph.initializer}
    weight_q = [n for n in model.graph.node if n.name.endswith("weight_quantizer/QuantizeLinear")]
    assert len(weight_q) == 2 and all(q.input[0] in inits for q in weight_q)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    with torch.no_grad():
        want = prepared(x).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    report = lint(path)
    assert report.verdict == "PASS", [f.rule for f in report.findings]
    assert not [f for f in report.findings if f.rule == "V05"]


class _UnusedMiddle(nn.Module):
    """DeBERTa-v2's shape: a parameter in the middle the graph never reads (``type_vocab_size``
    0 leaves ``token_type_ids`` unused); TorchScript drops it from the ONNX inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)

    def forward(self, x: torch.Tensor, unused: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return self.conv(x) * scale


def test_an_input_the_exporter_dropped_is_left_out_by_name_not_shifted(tmp_path) -> None:
    import numpy as np

    from qdq._io import feed_by_name
    from qdq.backends.onnxruntime import run, session

    torch.manual_seed(0)
    args = (torch.randn(2, 3, 8, 8), torch.randn(2, 5), torch.full((2, 1, 1, 1), 3.0))
    prepared = qdq.prepare(_UnusedMiddle().eval(), args)
    qdq.calibrate(prepared, [args], show_progress=False)
    out = qdq.export_onnx(prepared, args, tmp_path / "m.onnx", exporter="torchscript")
    sess = session(out.path)
    assert [i.name for i in sess.get_inputs()] == ["input", "input2"]  # input1 dropped
    got = run(sess, list(args))[0]  # by position, `scale` would have met input1's slot
    with torch.no_grad():
        want = prepared(*args).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="takes 2 inputs"):
        feed_by_name(["a", "b"], [1, 2, 3])


class _MaskSkip(nn.Module):
    """transformers' masking code: in eager, ``mask.all()`` decides whether a mask is needed; under
    tracing that read is skipped, and only a size becomes a Python value."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        y = self.proj(x)
        if not torch.jit.is_tracing() and bool(mask.all()):
            return y
        pad = x.shape[1] - mask.shape[1]  # a traced size turned into an int
        if pad > 0:
            mask = F.pad(mask, (0, pad))
        return y * mask.unsqueeze(-1)


class _ValueBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        y = self.proj(x)
        if bool(mask.all()):  # read in eager and in the trace: the branch would be baked in
            return y
        return y * mask.unsqueeze(-1)


def test_torchscript_refuses_only_value_reads_the_trace_reaches(tmp_path) -> None:
    from qdq.export import ExportRefusedError

    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    mask = torch.ones(2, 5)
    mask[1, 3:] = 0
    prepared = qdq.prepare(_MaskSkip().eval(), (x, mask))
    plan = qdq.plan_of(prepared)
    assert plan.control_flow and any(
        "test_export_graph_fixes.py" in s for s in plan.control_flow_sites
    )
    qdq.calibrate(prepared, [(x, mask)], show_progress=False)
    with pytest.warns(UserWarning, match="which the trace does not reach"):
        out = qdq.export_onnx(prepared, (x, mask), tmp_path / "m.onnx", exporter="torchscript")
    assert out.exporter == "torchscript"
    branch = qdq.prepare(_ValueBranch().eval(), (x, mask))
    qdq.calibrate(branch, [(x, mask)], show_progress=False)
    with pytest.raises(ExportRefusedError, match="tensor values into Python values"):
        qdq.export_onnx(branch, (x, mask), tmp_path / "b.onnx", exporter="torchscript")
