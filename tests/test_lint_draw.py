"""``qdq.lint.draw``: the predicted engine as a Graphviz drawing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

import qdq
from qdq.lint.draw import DrawError, layer_graph, render_svg, to_dot

pytest.importorskip("onnxruntime")


class Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, padding=1)
        self.block1 = nn.Sequential(nn.Conv2d(32, 32, 3, padding=1), nn.ReLU())
        self.block2 = nn.Sequential(
            nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1)
        )
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block2(self.block1(self.stem(x)))
        return self.head(y.mean((2, 3)))


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, qdq.lint.LintReport]:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    m = qdq.prepare(Blocks().eval(), (x,))
    qdq.calibrate(m, [x], show_progress=False)
    path = tmp_path_factory.mktemp("draw") / "m.onnx"
    qdq.export_onnx(m, (x,), path, exporter="torchscript")
    return path, qdq.lint.lint(path)


def test_layers_edges_and_precisions(exported) -> None:
    path, report = exported
    g = layer_graph(path, report.layers)
    layers = [n for n in g.nodes if n.kind == "layer"]
    assert len(layers) == sum(1 for ly in report.layers if ly.kind != "qdq")
    assert {n.kind for n in g.nodes} >= {"input", "output", "layer", "qdq"}
    by_scope = {n.scope: n for n in layers}
    assert by_scope[("block1", "0")].precisions == (("int8", 1),)
    assert by_scope[("head",)].precisions[0][0] == "fp16"  # P14: the 10-class head stays float
    ids = {n.scope: n.id for n in layers}
    assert (ids[("block1", "0")], ids[("block2", "0")], "int8") in g.edges
    # dicts from report.json draw the same graph
    assert layer_graph(path, [ly.to_dict() for ly in report.layers]) == g


def test_collapse_by_scope(exported) -> None:
    path, report = exported
    g = layer_graph(path, report.layers)
    dot = to_dot(g, max_nodes=4)
    assert 'label="block2\\n2 layers: 2 INT8"' in dot  # a group with its precision mix
    assert "\\nblock2.0\\n" not in dot and "\\nblock1.0\\n" in dot  # block1 has one layer
    full = to_dot(g)
    assert "subgraph cluster_" in full and 'label="block2"' in full
    with pytest.raises(ValueError, match="max_nodes"):
        to_dot(g, max_nodes=1)


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz dot is not installed")
def test_render_svg(exported) -> None:
    path, report = exported
    svg = render_svg(to_dot(layer_graph(path, report.layers)))
    assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    with pytest.raises(DrawError, match="failed"):
        render_svg("digraph {")


def test_missing_dot_is_a_clear_error(monkeypatch) -> None:
    import qdq.lint.draw as draw

    monkeypatch.setattr(draw.shutil, "which", lambda name: None)
    with pytest.raises(DrawError, match="apt-get install graphviz"):
        render_svg("digraph { a }")
