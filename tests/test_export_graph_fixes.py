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

