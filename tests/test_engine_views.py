"""Engine views on the real trtexec reports (``tests/fixtures/trt-engines/``): drawings of real
engines (parsed as SVG: one node per layer, precision colours, labels), the engine comparison
(totals equal to the profile, precision mix), the docs' committed drawings, and ``qdq engine`` /
``qdq lint --draw`` end to end (exit codes, one-line errors)."""

from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

import qdq.lint.draw as draw_module
from lint_graphs import t01
from qdq.cli.main import main
from qdq.lint.compare import compare_engines, compute_precision
from qdq.lint.compare_draw import comparison_svg
from qdq.lint.draw import MARK_COLOR, PRECISION_COLORS, dot_available, to_dot
from qdq.lint.engine_draw import draw_engine_svg, engine_graph, short_format
from qdq.lint.engine_report import EngineReport, load_engine_report, parse_engine_report
from trt_engines import PREFIXES, engine_file

DOCS = Path(__file__).resolve().parents[1] / "docs"
needs_dot = pytest.mark.skipif(not dot_available(), reason="Graphviz dot is not installed")
SVG = "{http://www.w3.org/2000/svg}"


def _load(prefix: str, profile: bool = True) -> EngineReport:
    return load_engine_report(
        engine_file(prefix), engine_file(prefix, "profile") if profile else None
    )


def _nodes(svg: str) -> dict[str, tuple[str, set[str]]]:
    """``{node title: (its text, its fill colours)}`` of a Graphviz SVG."""
    root = ET.fromstring(svg)
    out = {}
    for g in root.iter(f"{SVG}g"):
        if g.get("class") != "node":
            continue
        title = g.findtext(f"{SVG}title") or ""
        text = "\n".join(t.text or "" for t in g.iter(f"{SVG}text"))
        fills = {e.get("fill", "") for e in g.iter() if e.get("fill")}
        out[title] = (text, fills)
    return out


# ------------------------------------------------------------------ the drawing as data
@pytest.mark.parametrize("prefix", PREFIXES)
def test_one_node_per_layer_and_tensor_edges(prefix: str) -> None:
    engine = _load(prefix)
    g = engine_graph(engine)
    layers = [n for n in g.nodes if n.kind in ("layer", "qdq", "reformat")]
    assert len(layers) == len(engine.layers)
    assert sum(n.kind == "qdq" for n in g.nodes) == len(engine.qdq_reformats())
    assert sum(n.kind == "reformat" for n in g.nodes) == len(engine.reformats()) - len(
        engine.qdq_reformats()
    )
    assert [n.kind for n in g.nodes].count("input") == 1
    assert [n.kind for n in g.nodes].count("output") == 1
    ids = {n.id for n in g.nodes}
    assert all(a in ids and b in ids for a, b, _ in g.edges)
    # every layer but the first is fed by another layer or the input
    fed = {b for _, b, _ in g.edges}
    assert all(n.id in fed for n in layers)
    # shares of the latency add up to the profiled layers' share of the total
    assert sum(n.share or 0.0 for n in layers) == pytest.approx(
        sum(x.median_ms or 0.0 for x in engine.layers) / engine.total_median_ms()
    )
    assert all(label.count("\n") == 1 for label in g.edge_labels.values())


def test_resnet18_qat_labels() -> None:
    g = engine_graph(_load("resnet18-a100-qat"))
    by_label = {n.label.split("\n")[0]: n for n in g.nodes}
    conv1 = by_label["QuantizeLinear_7 + Conv_9"]
    assert conv1.label.split("\n")[1:] == [
        "Convolution 7×7 /2 → 64",
        "INT8 CHW4 → FP32 linear",
        "0.202 ms · 18.4 %",
    ]
    assert conv1.precisions == (("int8", 1),) and conv1.scope == ("conv1",)
    assert by_label["MaxPool_12"].precisions == (("fp32", 1),)
    assert by_label["GlobalAveragePool_246"].precisions == (("fp16", 1),)
    q = by_label["QuantizeLinear_15"]
    assert q.kind == "qdq" and "FP16 CHW32 → INT8 CHW32" in q.label
    assert "32×64×56×56\nINT8 CHW32" in g.edge_labels.values()
    assert any(n.label.startswith("Reformat\n") for n in g.nodes if n.kind == "reformat")


def test_fp16_engine_has_no_int8_and_names_copies() -> None:
    g = engine_graph(_load("resnet18-a100-fp16"))
    precisions = {p for n in g.nodes for p, _ in n.precisions}
    assert "int8" not in precisions and "fp16" in precisions
    assert any(n.label.startswith("copy → Conv_5 + Add_6 + Relu_7") for n in g.nodes)


@pytest.mark.parametrize(
    ("text", "short"),
    [
        ("Four wide channel vectorized row major Int8 format", "CHW4"),
        ("Channel major FP16 format where channel % 4 == 0", "HWC4"),
        ("Row major linear FP32", "linear"),
        ("Thirty-two wide channel vectorized row major format (kCHW32)", "CHW32"),
        ("Row major linear FP32 format (kLINEAR)", "linear"),
    ],
)
def test_short_format(text: str, short: str) -> None:
    assert short_format(text) == short


def _as_trt11(prefix: str) -> dict[str, Any]:
    """The fixture in TensorRT 11's schema: split Format/DataType, an I/O Tensors list."""
    raw = json.loads(engine_file(prefix).read_text())
    layers = copy.deepcopy(raw["Layers"])
    for layer in layers:
        for t in (*layer["Inputs"], *layer["Outputs"]):
            text = t.pop("Format/Datatype")
            dtype = "Int8" if "Int8" in text else "Half" if "FP16" in text else "Float"
            t["Format"], t["DataType"] = text.replace(" Int8", "").replace(" FP16", ""), dtype
    io = [
        {"Name": layers[0]["Inputs"][0]["Name"], "IOMode": "Input", "DataType": "Float",
         "Dimensions": layers[0]["Inputs"][0]["Dimensions"]},
        {"Name": layers[-1]["Outputs"][0]["Name"], "IOMode": "Output", "DataType": "Float",
         "Dimensions": layers[-1]["Outputs"][0]["Dimensions"]},
    ]  # fmt: skip
    return {"Layers": layers, "I/O Tensors": io}


def test_trt11_schema_draws_the_same() -> None:
    old = engine_graph(_load("resnet18-a100-qat", profile=False))
    new = engine_graph(parse_engine_report(_as_trt11("resnet18-a100-qat")))
    assert [(n.kind, n.label, n.precisions) for n in new.nodes] == [
        (n.kind, n.label, n.precisions) for n in old.nodes
    ]
    assert new.edges == old.edges and new.edge_labels == old.edge_labels


def _chain(n: int, scoped: bool = False) -> list[dict[str, Any]]:
    """An engine of ``n`` INT8 convs in a chain, named like ``Conv_12`` or, ``scoped``, like a
    TorchScript-exported detector (``/model.3/m.1/cv2/conv/Conv``)."""

    def t(i: int) -> dict[str, Any]:
        return {
            "Name": f"t{i}",
            "Dimensions": [1, 8, 4, 4],
            "Format/Datatype": "Thirty-two wide channel vectorized row major Int8 format",
        }

    def name(i: int) -> str:
        return f"/model.{i // 12}/m.{i % 12 // 4}/cv{i % 4}/conv/Conv" if scoped else f"Conv_{i}"

    return [{"Name": name(i), "LayerType": "CaskConvolution", "ParameterType": "Convolution",
             "Inputs": [t(i)], "Outputs": [t(i + 1)]} for i in range(n)]  # fmt: skip


def test_a_300_layer_engine_without_scopes_collapses_into_runs() -> None:
    engine = parse_engine_report(_chain(300))
    dot = to_dot(engine_graph(engine, max_nodes=60), max_nodes=60)
    lines = [line.strip() for line in dot.splitlines() if "->" not in line]
    boxes = [line for line in lines if line.startswith(("E", "G"))]
    assert 10 <= len(boxes) <= 60
    assert "layers 0–9" in dot and "10 layers: 10 INT8" in dot


def test_a_300_layer_detector_collapses_by_module_scope() -> None:
    engine = parse_engine_report(_chain(300, scoped=True))
    g = engine_graph(engine)
    assert g.nodes[0].scope == ("model", "0", "m", "0", "cv0", "conv")
    dot = to_dot(g, max_nodes=60)
    lines = [line.strip() for line in dot.splitlines() if "->" not in line]
    groups = [line for line in lines if line.startswith("G")]
    boxes = [line for line in lines if line.startswith(("E", "G"))]
    assert len(boxes) <= 60 and groups
    # the first blocks are one box each, the later ones one box per sub-module, boxed by block
    assert 'G0 [label="model.0.m\\n12 layers: 12 INT8"' in dot
    assert '"model.8.m.0\\n4 layers: 4 INT8"' in dot and 'label="model.8"; labeljust' in dot


# ----------------------------------------------------------------------- SVG (needs dot)
@needs_dot
@pytest.mark.parametrize("prefix", PREFIXES)
def test_rendered_svg_nodes_colours_and_labels(prefix: str) -> None:
    engine = _load(prefix)
    nodes = _nodes(draw_engine_svg(engine, title=prefix))
    layer_nodes = {k: v for k, v in nodes.items() if k.startswith("E")}
    assert len(layer_nodes) == len(engine.layers)
    fills = set().union(*(f for _, f in layer_nodes.values()))
    assert (PRECISION_COLORS["int8"][0] in fills) == ("qat" in prefix)
    assert (PRECISION_COLORS["qdq"][0] in fills) == bool(engine.qdq_reformats())
    texts = "\n".join(t for t, _ in layer_nodes.values())
    assert " ms · " in texts and "Convolution" in texts


@needs_dot
def test_marks_and_collapse_in_svg() -> None:
    engine = _load("mobilenet-qat")
    marked = engine.layers[3].name
    svg = draw_engine_svg(engine, max_nodes=30, marks={marked: "predicted: INT8 → FP16"})
    nodes = _nodes(svg)
    assert 15 <= sum(k.startswith(("E", "G")) for k in nodes) <= 30
    assert any(k.startswith("G") and "of the time" in t for k, (t, _) in nodes.items())
    assert MARK_COLOR in svg and "≠ predicted: INT8 → FP16" in svg


@needs_dot
def test_comparison_svg_parses() -> None:
    c = compare_engines(_load("resnet18-a100-fp16"), _load("resnet18-a100-qat"))
    root = ET.fromstring(comparison_svg(c))
    texts = [t.text or "" for t in root.iter(f"{SVG}text")]
    assert "Reformat (Q/DQ) (n 0 / 10)" in texts and "1.096" in texts


# ------------------------------------------------------------------------ comparison
def test_compare_fp16_vs_qat_resnet18() -> None:
    fp16, qat = _load("resnet18-a100-fp16"), _load("resnet18-a100-qat")
    c = compare_engines(fp16, qat, names=("fp16", "qat"))
    assert c.total_ms == (pytest.approx(1.017, abs=5e-4), pytest.approx(1.096, abs=5e-4))
    assert c.total_ms == (fp16.total_median_ms(), qat.total_median_ms())
    for k, engine in enumerate((fp16, qat)):
        by_type = sum((r.ms_a, r.ms_b)[k] or 0.0 for r in c.by_type)
        assert by_type == pytest.approx(engine.total_median_ms())
        assert sum((r.count_a, r.count_b)[k] for r in c.by_type) == len(engine.layers)
        assert sum(v[k] for v in c.precision_mix.values()) == sum(
            compute_precision(x) is not None for x in engine.layers
        )
    assert c.precision_mix == {"int8": (0, 21), "fp16": (23, 1), "fp32": (0, 1)}
    rows = {r.layer_type: r for r in c.by_type}
    assert (rows["Reformat (Q/DQ)"].count_a, rows["Reformat (Q/DQ)"].count_b) == (0, 10)
    assert c.matched_by == "order" and len(c.top) == 10
    deltas = [abs(d.delta_ms) for d in c.top]
    assert deltas == sorted(deltas, reverse=True)
    assert c.top[0].a == "Conv_0 + Relu_1" and c.top[0].b == "QuantizeLinear_7 + Conv_9"
    doc = json.loads(c.to_json())
    assert doc["total_ms"] == list(c.total_ms) and doc["precision_mix"]["int8"] == [0, 21]
    text = c.format()
    assert "total latency (sum of layer medians): A 1.017 ms, B 1.096 ms" in text


def test_compare_an_engine_with_itself_and_without_profiles() -> None:
    qat = _load("resnet18-a100-qat")
    c = compare_engines(qat, qat)
    assert c.matched_by == "name" and all(d.delta_ms == 0 for d in c.top)
    bare = compare_engines(_load("resnet18-a100-fp16", False), _load("resnet18-a100-qat", False))
    assert bare.total_ms == (None, None) and bare.speedup is None
    assert "no profile" in bare.format() and bare.precision_mix["int8"] == (0, 21)
    with pytest.raises(ValueError, match="top"):
        compare_engines(qat, qat, top=-1)


# ----------------------------------------------------------------- the docs' drawings
DOC_SVGS = {
    "engine-resnet18-a100-fp32.svg": ("resnet18-a100-fp32", None),
    "engine-resnet18-a100-fp16.svg": ("resnet18-a100-fp16", None),
    "engine-resnet18-a100-qat.svg": ("resnet18-a100-qat", None),
    "engine-mobilenet-qat.svg": ("mobilenet-qat", 30),
    "predicted-resnet18.svg": (None, None),
    "predicted-mobilenet-v2.svg": (None, 30),
    "predicted-resnet18-default.svg": (None, None),
}


@pytest.mark.parametrize("name", sorted(DOC_SVGS))
def test_docs_drawings_parse(name: str) -> None:
    prefix, max_nodes = DOC_SVGS[name]
    svg = (DOCS / "img" / name).read_text(encoding="utf-8")
    nodes = _nodes(svg)
    fills = set().union(*(f for _, f in nodes.values()))
    assert PRECISION_COLORS["int8"][0] in fills or prefix in ("resnet18-a100-fp32",
                                                               "resnet18-a100-fp16")  # fmt: skip
    boxes = [k for k in nodes if k[0] in "ELG"]
    if prefix is not None and max_nodes is None:
        assert len(boxes) == len(_load(prefix).layers)
    elif max_nodes is not None:
        assert 2 <= len(boxes) <= max_nodes
    assert (MARK_COLOR in svg) == name.endswith("default.svg")
    assert (DOCS / "engine.md").read_text(encoding="utf-8").count(f"img/{name}") == 1


# ------------------------------------------------------------------------------- CLI
def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_draw_and_errors(tmp_path: Path, capsys, monkeypatch) -> None:
    graph = str(engine_file("resnet18-a100-qat"))
    profile = str(engine_file("resnet18-a100-qat", "profile"))
    if dot_available():
        code, out, _ = _run(capsys, "engine", "draw", graph, "--profile", profile,
                            "-o", str(tmp_path / "e.svg"))  # fmt: skip
        assert code == 0 and "37 engine layers" in out
        assert len([k for k in _nodes((tmp_path / "e.svg").read_text()) if k[0] == "E"]) == 37
    cases = [
        (["engine", "draw", str(tmp_path / "nope.json"), "-o", str(tmp_path / "x.svg")],
         "no layer-information JSON file"),
        (["engine", "draw", profile, "-o", str(tmp_path / "x.svg")],
         "looks like the --exportProfile JSON"),
        (["engine", "draw", graph, "-o", str(tmp_path / "x.png")], "must end in .svg"),
        (["engine", "compare", graph, profile], "looks like the --exportProfile JSON"),
    ]  # fmt: skip
    for argv, message in cases:
        code, _, err = _run(capsys, *argv)
        assert code == 3 and message in err and len(err.strip().splitlines()) == 1, err
    monkeypatch.setattr(draw_module.shutil, "which", lambda _: None)
    code, _, err = _run(capsys, "engine", "draw", graph, "-o", str(tmp_path / "y.svg"))
    assert code == 3 and "Graphviz 'dot' is not installed" in err
    assert not (tmp_path / "y.svg").exists()


def test_cli_compare(tmp_path: Path, capsys) -> None:
    a, b = (str(engine_file(f"resnet18-a100-{k}")) for k in ("fp16", "qat"))
    pa, pb = (str(engine_file(f"resnet18-a100-{k}", "profile")) for k in ("fp16", "qat"))
    code, out, _ = _run(capsys, "engine", "compare", a, b, "--profiles", pa, pb)
    assert code == 0 and "A = resnet18-a100-fp16 (36 layers)" in out
    assert "Reformat (Q/DQ)" in out and "B takes 1.08x the time of A" in out
    code, out, _ = _run(capsys, "engine", "compare", a, b, "--profiles", pa, pb, "--json")
    assert code == 0 and json.loads(out)["layers"] == [36, 37]
    if dot_available():
        page = tmp_path / "c.html"
        code, _, _ = _run(capsys, "engine", "compare", a, b, "--profiles", pa, pb, "-o", str(page))
        assert code == 0 and page.read_text().count("<svg") == 3
    code, _, err = _run(capsys, "engine", "compare", a, b, "--top", "-1")
    assert code == 2 and "--top" in err


@needs_dot
def test_cli_diff_and_lint_draw(tmp_path: Path, capsys) -> None:
    import onnx

    model = tmp_path / "t01.onnx"
    onnx.save(t01(), model)
    graph = str(engine_file("resnet18-a100-qat"))
    page = tmp_path / "diff.html"
    code, out, _ = _run(capsys, "engine", "diff", str(model), graph, "-o", str(page))
    html = page.read_text()
    assert code == 1 and "engine report vs prediction" in out  # another network: disagreements
    assert html.count("<svg") == 2 and MARK_COLOR in html and "Disagreements" in html
    svg = tmp_path / "pred.svg"
    code, _, _ = _run(capsys, "lint", str(model), "--draw", str(svg))
    nodes = _nodes(svg.read_text())
    assert code in (0, 1) and any(k.startswith("L") for k in nodes)
    code, _, err = _run(capsys, "lint", str(model), "--draw", str(tmp_path / "p.png"))
    assert code == 3 and "must be an .svg file" in err
