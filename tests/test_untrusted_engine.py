"""Engine reports and ``report.json`` from someone else (issue 57): ``qdq engine draw | diff |
compare | report`` read and write only where they should, fail with one line naming the file and
the key (exit 3, no traceback), never print NaN/Infinity or raw control characters, and draw
hostile names as well-formed XML; a seeded fuzz of the real fixtures checks that the reader
raises nothing but :class:`~qdq.lint.engine_report.EngineReportError`."""

from __future__ import annotations

import copy
import json
import math
import random
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from lint_graphs import t01
from qdq.cli.main import main
from qdq.lint.compare import compare_engines
from qdq.lint.compare_draw import comparison_svg
from qdq.lint.draw import dot_available, to_dot
from qdq.lint.engine_draw import draw_engine_svg, engine_graph
from qdq.lint.engine_report import (
    EngineReportError,
    load_engine_report,
    parse_engine_report,
)
from qdq.lint.speed.engine_time import time_engine
from qdq.lint.text import visible
from qdq.lint.untrusted_json import UntrustedJSONError, json_depth, parse_json
from trt_engines import engine_file

GRAPH = engine_file("resnet18-a100-qat")
PROFILE = engine_file("resnet18-a100-qat", "profile")
HOSTILE_NAMES = ("\x1b[2J", "\x1b]0;title\x07", "<script>alert(1)</script>", "a & b", "\x00",
                 "&#x1b;", "\x9b31m", "\u202eevil", "\ud800", '"quoted"\\', "]]>")  # fmt: skip


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _graph() -> dict[str, Any]:
    return json.loads(GRAPH.read_text(encoding="utf-8"))


def _one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 3, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "\x1b" not in err and "\x00" not in err
    for needle in needles:
        assert needle in err, (needle, err)


# ------------------------------------------------------------------ report: confined to OUT
def _out(tmp_path: Path, files: Any, **extra: Any) -> Path:
    import onnx

    out = tmp_path / "OUT"
    out.mkdir()
    onnx.save(t01(), out / "model.qdq.onnx")
    report = {"metric_name": "top1", "fp32_metric": 0.9, "int8_metric": 0.9, "lint": None,
              "model": {"spec": "m.py:build"}, "files": files, **extra}  # fmt: skip
    (out / "report.json").write_text(json.dumps(report), encoding="utf-8")
    return out


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


@pytest.mark.parametrize(
    ("files", "key"),
    [
        ({"html": "../X.html"}, "files.html"),
        ({"html": "sub/../../X.html"}, "files.html"),
        ({"html": "/ABS/X.html"}, "files.html"),  # made absolute in the test
        ({"html": "link/X.html"}, "files.html"),  # a symbolic link out of OUT
        ({"html": "model.qdq.onnx"}, "files.html"),  # would overwrite the model
        ({"html": ["r.html"]}, "files.html"),
        ({"html": ""}, "files.html"),
        ({"onnx": "../outside.onnx"}, "files.onnx"),
        ({"onnx": "/ABS/outside.onnx"}, "files.onnx"),
        ({"onnx": "link/outside.onnx"}, "files.onnx"),
        ({"onnx": {"a": 1}}, "files.onnx"),
        ({"onnx": "a\x00b"}, "files.onnx"),
        ("oops", "'files'"),
        ([1, 2], "'files'"),
    ],
)
def test_report_reads_and_writes_only_inside_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], files: Any, key: str
) -> None:
    import onnx

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "X.html").write_text("the user's own page")
    onnx.save(t01(), outside / "outside.onnx")
    if isinstance(files, dict):
        files = {k: v.replace("/ABS", str(outside)) if isinstance(v, str) else v
                 for k, v in files.items()}  # fmt: skip
    out = _out(tmp_path, files)
    (out / "link").symlink_to(outside, target_is_directory=True)
    before = _tree(tmp_path)
    code, _, err = _run(capsys, "engine", "report", str(out), str(GRAPH))
    _one_line_error(code, err, str(out / "report.json"), key)
    assert _tree(tmp_path) == before  # nothing written, in OUT or outside


def test_report_json_itself_is_confined_and_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _out(tmp_path, {})
    elsewhere = tmp_path / "report.json"
    elsewhere.write_text((out / "report.json").read_text())
    (out / "report.json").unlink()
    (out / "report.json").symlink_to(elsewhere)
    code, _, err = _run(capsys, "engine", "report", str(out), str(GRAPH))
    _one_line_error(code, err, "report.json", "outside")
    cases = [
        ("[" * 5000 + "]" * 5000, "nests deeper"),
        ('{"files": {}, "fp32_metric": NaN}', "NaN"),
        ("[1, 2]", "must be a JSON object"),
        ('{"model": "m", "files": {}}', "'model'"),
        ('{"stage_errors": [{"stage": 1}], "files": {}}', "'stage_errors'"),
        ("\xff\xfe{", "not UTF-8"),
    ]
    for text, needle in cases:
        (out / "report.json").unlink()
        (out / "report.json").write_bytes(text.encode("latin-1"))
        code, _, err = _run(capsys, "engine", "report", str(out), str(GRAPH))
        _one_line_error(code, err, "report.json", needle)
    assert not (out / "report.html").exists()


def test_report_writes_inside_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _out(tmp_path, {"html": "pages/engine.html", "onnx": "model.qdq.onnx"})
    code, stdout, err = _run(capsys, "engine", "report", str(out), str(GRAPH))
    assert code == 0, err
    page = out / "pages" / "engine.html"
    assert page.is_file() and "37-layer engine" in stdout
    assert not [p.name for p in page.parent.iterdir() if p.name.endswith(".tmp")]  # atomic


# ------------------------------------------------------------------ one-line errors, exit 3
def _with(mutate: Any) -> dict[str, Any]:
    raw = _graph()
    mutate(raw)
    return raw


def _set(path: tuple[Any, ...], value: Any) -> Any:
    def mutate(raw: Any) -> None:
        for k in path[:-1]:
            raw = raw[k]
        raw[path[-1]] = value

    return mutate


LAYER_CASES: list[tuple[str, Any, str]] = [
    ("deep", "[" * 100_000 + "]" * 100_000, "nests deeper than 64"),
    ("deep-name", _with(_set(("Layers", 0, "Name"), json.loads("[" * 60 + "]" * 60))), "'Name'"),
    ("dict-name", _with(_set(("Layers", 0, "Name"), {"a": ["b"]})), "'Name' must be a string"),
    ("list-name", _with(_set(("Layers", 3, "Name"), ["Conv_0"])), "layer 3"),
    ("inf-dims", '{"Layers": [{"Name": "c", "Inputs": [{"Name": "x", "Dimensions": [Infinity]}]}]}',
     "Infinity"),
    ("big-dims", '{"Layers": [{"Name": "c", "Inputs": [{"Name": "x", "Dimensions": [1e999]}]}]}',
     "out of range"),
    ("float-dims", _with(_set(("Layers", 0, "Inputs", 0, "Dimensions"), [1.5, 3])), "Dimensions"),
    ("huge-dims", _with(_set(("Layers", 0, "Inputs", 0, "Dimensions"), [2**70])), "64-bit"),
    ("long-int", '{"Layers": [{"Name": "c", "OutMaps": ' + "9" * 5000 + "}]}", "5000 digits"),
    ("inputs-oops", _with(_set(("Layers", 2, "Inputs"), "oops")), "'Inputs' must be an array"),
    ("tensor-number", _with(_set(("Layers", 2, "Outputs"), [7])), "a tensor must be an object"),
    ("format-list", _with(_set(("Layers", 0, "Outputs", 0, "Format/Datatype"), ["Int8"])),
     "'Format/Datatype'"),
    ("weights-str", _with(_set(("Layers", 1, "Weights"), "Int8")), "'Weights'"),
    ("metadata-dict", _with(_set(("Layers", 1, "Metadata"), {"x": 1})), "'Metadata'"),
    ("bindings", _with(_set(("Bindings",), [1, 2])), "'Bindings'"),
    ("io-oops", _with(_set(("I/O Tensors",), "oops")), "'I/O Tensors'"),
    ("truncated", GRAPH.read_text()[:5000], "not valid JSON"),
    ("utf16", GRAPH.read_text().encode("utf-16"), "not UTF-8"),
    ("escape-name", _with(_set(("Layers", 0, "Name"), "\x1b[2J\x1b]0;t\x07")) | {"Bindings": [0]},
     "'Bindings'"),
]  # fmt: skip


def _write(path: Path, content: Any) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_text(json.dumps(content), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("case", "content", "needle"), LAYER_CASES, ids=[c[0] for c in LAYER_CASES]
)
def test_hostile_layer_reports_fail_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, content: Any, needle: str
) -> None:
    bad = _write(tmp_path / f"{case}.json", content)
    model = tmp_path / "m.onnx"
    argvs = [
        ["engine", "draw", str(bad), "-o", str(tmp_path / "x.svg")],
        ["engine", "compare", str(GRAPH), str(bad), "--json"],
        ["engine", "diff", str(model), str(bad), "-o", str(tmp_path / "x.html")],
        ["engine", "time", str(bad), "--gpu", "a100"],
    ]
    for argv in argvs:
        code, out, err = _run(capsys, *argv)
        _one_line_error(code, err, str(bad), needle)
        assert out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == [bad.name]  # nothing written
    with pytest.raises(EngineReportError, match=str(bad.name)):
        load_engine_report(bad)


PROFILE_CASES: list[tuple[str, str, str]] = [
    ("nan", '[{"count": 3}, {"name": "Conv_0", "medianMs": NaN}]', "NaN"),
    ("inf", '[{"name": "Conv_0", "medianMs": Infinity}]', "Infinity"),
    ("overflow", '[{"name": "Conv_0", "averageMs": -1e999}]', "out of range"),
    ("negative", '[{"name": "Conv_0", "medianMs": -0.5}]', "'medianMs' is -0.5"),
    ("absurd", '[{"name": "Conv_0", "medianMs": 1e300}]', "finite, >= 0"),
    ("string-time", '[{"name": "Conv_0", "medianMs": "0.1"}]', "must be a number"),
    ("name-list", '[{"name": ["Conv_0"], "medianMs": 0.1}]', "'name' must be a string"),
    ("count", '[{"count": "many"}]', "'count'"),
    ("not-a-list", '{"name": "Conv_0"}', "must be a list"),
]


@pytest.mark.parametrize(
    ("case", "text", "needle"), PROFILE_CASES, ids=[c[0] for c in PROFILE_CASES]
)
def test_hostile_profiles_fail_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, text: str, needle: str
) -> None:
    bad = _write(tmp_path / f"{case}.profile.json", text)
    for argv in (
        ["engine", "draw", str(GRAPH), "--profile", str(bad), "-o", str(tmp_path / "x.svg")],
        ["engine", "compare", str(GRAPH), str(GRAPH), "--profiles", str(PROFILE), str(bad)],
        ["engine", "time", str(GRAPH), "--gpu", "a100", "--profile", str(bad)],
    ):
        code, out, err = _run(capsys, *argv)
        _one_line_error(code, err, str(bad), needle)
        assert "Infinity" not in out and "NaN" not in out and "inf ms" not in out
    with pytest.raises(EngineReportError) as info:
        load_engine_report(GRAPH, bad)
    assert info.value.part == "profile"


def test_non_finite_times_from_python_are_refused_too() -> None:
    layers = [{"Name": "Conv_0", "LayerType": "CaskConvolution", "Inputs": [], "Outputs": []}]
    for value in (math.nan, math.inf, -1.0):
        with pytest.raises(EngineReportError, match="finite, >= 0"):
            parse_engine_report(layers, [{"name": "Conv_0", "medianMs": value}])


def test_compare_json_stays_strict_json_at_the_extremes(capsys: pytest.CaptureFixture[str]) -> None:
    layers = [{"Name": "Conv_0", "LayerType": "CaskConvolution", "ParameterType": "Convolution",
               "Inputs": [], "Outputs": []}]  # fmt: skip
    slow = parse_engine_report(layers, [{"name": "Conv_0", "medianMs": 1e9}])
    fast = parse_engine_report(layers, [{"name": "Conv_0", "medianMs": 5e-324}])
    c = compare_engines(slow, fast)
    assert c.speedup is None  # 1e9 / 5e-324 is past a float
    decoded = json.loads(c.to_json(), parse_constant=lambda name: pytest.fail(name))
    assert decoded["speedup"] is None and "inf" not in c.format().lower().replace("info", "")
    ET.fromstring(comparison_svg(c))


# ------------------------------------------------------------------ hostile names
def _hostile_engine() -> dict[str, Any]:
    raw = _graph()
    for i, name in enumerate(HOSTILE_NAMES):
        layer = raw["Layers"][i + 1]
        layer["Name"] = f"{layer['Name']}{name}"
        for t in layer["Outputs"]:
            t["Name"] = f"{name}{t['Name']}"
    raw["Layers"][-1]["Name"] = "/sc\x1bope/" + "a" * 5 + "/Conv&amp;"
    return raw


def _no_control(text: str) -> None:
    bad = {c for c in text if (ord(c) < 32 and c not in "\n\t\r") or 0x7F <= ord(c) <= 0x9F}
    assert not bad, bad
    assert not any(0xD800 <= ord(c) <= 0xDFFF or c in "\u202e" for c in text)


def test_hostile_names_are_escaped_in_text_and_drawings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    layers = _write(tmp_path / "hostile\x1b[31m.graph.json", _hostile_engine())
    engine = load_engine_report(layers, PROFILE)
    dot = to_dot(engine_graph(engine), title=layers.name)
    _no_control(dot)
    assert "\\\\x1b[2J" in dot and "&amp;#x1b;" in dot  # visible, and not an XML reference
    charts = tmp_path / "c.svg"
    code, out, err = _run(capsys, "engine", "compare", str(layers), str(GRAPH), "--top", "100",
                          "--profiles", str(PROFILE), str(PROFILE), "-o", str(charts))  # fmt: skip
    assert code == 0, err
    _no_control(out)
    assert "\\x1b[2J" in out and "\\x1b]0;title\\x07" in out and "\\u202e" in out
    svg = charts.read_text(encoding="utf-8")
    _no_control(svg)
    ET.fromstring(svg.split("\n", 1)[1])  # after the XML declaration
    code, out, _ = _run(capsys, "engine", "compare", str(layers), str(GRAPH), "--json")
    assert code == 0 and "\x1b" not in out and json.loads(out)["layers"] == [37, 37]
    if not dot_available():
        pytest.skip("Graphviz dot is not installed: the rendered SVG is not checked")
    drawing = tmp_path / "e.svg"
    code, out, err = _run(capsys, "engine", "draw", str(layers), "--profile", str(PROFILE),
                          "-o", str(drawing))  # fmt: skip
    assert code == 0, err
    _no_control(out)
    text = drawing.read_text(encoding="utf-8")
    _no_control(text)
    root = ET.fromstring(text.split("\n", 1)[1])
    shown = "\n".join([e.text or "" for e in root.iter()])
    shown += "\n".join(v for e in root.iter() for v in e.attrib.values())
    assert "\\x1b[2J" in shown and "<script>" in shown and "&#x1b;" in shown  # as text
    _no_control(draw_engine_svg(engine, max_nodes=5))  # collapsed: scope names drawn too


# ------------------------------------------------------------------ limits stay linear
def test_pathological_names_are_read_in_linear_time() -> None:
    """Sizes where the former regular expression (quadratic) or recursion would not finish."""
    n = 200_000
    layers = [
        {"Name": "PWN(" * n + "x" + ")" * n, "LayerType": "PointWise"},
        {"Name": "PWN(" * 8 + "a," * (n // 10) + "b" + ")" * 8, "LayerType": "PointWise"},
        {"Name": "m", "Metadata": "[ONNX Layer:" + " " * n + "x"},
        {"Name": "k", "Metadata": "[ONNX Layer: a" * (n // 10)},
        {"Name": "/".join(["s"] * n) + "/Conv", "LayerType": "CaskConvolution"},
        {"Name": "q [profile " + "9" * 5000 + "]"},
    ]
    report = parse_engine_report(layers)
    assert report.layers[2].onnx_nodes == ("m",) and report.layers[5].profile == 0
    assert len(report.layers[1].onnx_nodes) == 2  # a and b
    graph = engine_graph(report)
    assert len(graph.nodes) == 6 and max(len(n.scope) for n in graph.nodes) <= 24
    assert json_depth('{"a": "[[[[", "b": [[1]]}') == 3


def test_large_engines_are_compared_and_diffed_in_linear_time() -> None:
    """10,000 layers on each side that all write and read one tensor: a longest common
    subsequence would need 10^8 cells and each standalone layer would scan 10,000 readers."""
    from qdq.lint.diff import diff_engine
    from qdq.lint.predict import PredictedLayer
    from qdq.lint.report import LintReport

    n = 10_000
    kinds = ("CaskConvolution", "CaskPooling", "PointWiseV2")

    def engine(prefix: str) -> Any:
        return parse_engine_report([
            {"Name": f"{prefix}{i}", "LayerType": kinds[i % 3], "Inputs": [{"Name": "t"}],
             "Outputs": [{"Name": "t"}]} for i in range(n)
        ])  # fmt: skip

    a, b = engine("A_"), engine("B_")
    c = compare_engines(a, b)
    assert c.matched_by == "order" and c.layers == (n, n)
    assert len(engine_graph(a, max_nodes=50).nodes) == n
    predicted = tuple(
        PredictedLayer(f"P{i}", (f"P{i}",), ("weighted", "pooling", "pointwise")[i % 3], "int8",
                       "int8") for i in range(n)
    )  # fmt: skip
    summary = {"weighted_layers": 0, "int8_weighted_layers": 0, "unfused_qdq": 0}
    diff = diff_engine(LintReport("m.onnx", "trt10", (), summary, predicted), a)
    assert diff.matched_by == "order" and len(diff.matches) == n


def test_untrusted_json_limits(tmp_path: Path) -> None:
    from qdq.lint.untrusted_json import load_json

    big = tmp_path / "big.json"
    big.write_text("[" + "0," * 1000 + "0]")
    with pytest.raises(UntrustedJSONError, match="more than the 100"):
        load_json(big, "test JSON", max_bytes=100)
    assert len(load_json(big)) == 1001
    for text in ("NaN", "[Infinity]", "1e400", "-" + "1" * 100, '{"a": [[[[1]]]]}'):
        with pytest.raises(UntrustedJSONError):
            parse_json(text, "t", max_depth=3)
    assert parse_json("\ufeff[1]") == [1] and parse_json(b'"\\ud800"') == "\ud800"
    assert visible("\ud800\x1b\u202e\n") == "\\ud800\\x1b\\u202e\n"


# ------------------------------------------------------------------ fuzz
_SWAPS: tuple[Any, ...] = (None, True, 0, -1, 1.5, 1e308, 2**63, 2**70, "", "x", "\x1b[2J<&>",
                           [], {}, [[[]]], {"Name": {"a": []}}, [1, "a", None], "Int8")  # fmt: skip


def _containers(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            if isinstance(v, (dict, list)):
                out += _containers(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            if isinstance(v, (dict, list)):
                out += _containers(v, (*path, i))
    return out


def _mutate(rng: random.Random, obj: Any) -> bytes:
    """One hostile variant of ``obj`` (a decoded fixture) as the bytes of a file."""
    obj = copy.deepcopy(obj)
    paths = _containers(obj)
    for _ in range(rng.randint(1, 4)):
        path = rng.choice(paths)
        node = obj
        try:
            for k in path:
                node = node[k]
        except (KeyError, IndexError, TypeError):
            continue
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            continue
        key = rng.choice(keys)
        op = rng.random()
        if op < 0.25:
            del node[key]
        elif op < 0.8:
            node[key] = copy.deepcopy(rng.choice(_SWAPS))
        elif op < 0.9:
            node[key] = _nest(rng.choice((10, 70)))
        else:
            node[key] = rng.choice(("\x00", "\ud800", "PWN(" * 50 + "a" + ")" * 50))
    text = json.dumps(obj)
    op = rng.random()
    if op < 0.1:
        text = text.replace("1", "NaN", 1) if rng.random() < 0.5 else text.replace("2", "1e999", 1)
    elif op < 0.2:
        return text[: rng.randrange(len(text))].encode()
    elif op < 0.25:
        return text.encode(rng.choice(("utf-16", "utf-32")))
    elif op < 0.3:
        data = bytearray(text.encode())
        for _ in range(3):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data)
    return text.encode("utf-8", "surrogatepass")


def _nest(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("seed", range(4))
def test_fuzzed_fixtures_parse_or_raise_the_readers_error(tmp_path: Path, seed: int) -> None:
    """Mutated real reports (deleted keys, swapped types, huge numbers, NaN, deep nesting, other
    encodings, truncation, flipped bytes): the reader returns or raises EngineReportError, and
    what it returns is drawn and compared without an error."""
    rng = random.Random(seed)
    graph, profile = _graph(), json.loads(PROFILE.read_text())
    base = load_engine_report(GRAPH, PROFILE)
    parsed = failed = 0
    for case in range(80):
        g = _write(
            tmp_path / f"g{case}.json", _mutate(rng, graph) if case % 3 else GRAPH.read_bytes()
        )
        p = _write(tmp_path / f"p{case}.json", _mutate(rng, profile) if case % 3 != 1 else
                   PROFILE.read_bytes())  # fmt: skip
        try:
            engine = load_engine_report(g, p)
        except EngineReportError as err:
            assert str(g) in str(err) or str(p) in str(err), err
            failed += 1
            continue
        parsed += 1
        _no_control(to_dot(engine_graph(engine, max_nodes=20), max_nodes=20))
        c = compare_engines(engine, base)
        json.loads(c.to_json())
        try:  # timed, or one line naming the layer whose dimensions cannot be timed
            timed = time_engine(engine, "a100")
            json.dumps(timed.to_dict(), allow_nan=False)
            _no_control(timed.format())
        except EngineReportError as err:
            assert "cannot be timed" in str(err), err
        _no_control(c.format())
        ET.fromstring(comparison_svg(c))
    assert parsed > 5 and failed > 5, (parsed, failed)
