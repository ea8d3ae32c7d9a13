"""``report.html`` of ``qdq quantize``: written with the other files, self-contained, and rendered by
headless Chromium without script errors, every section present (a screenshot is kept in tmp_path)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from qdq.pipeline import (
    PtqOptions,
    quantize,
)
from trt_engines import engine_file

pytest.importorskip("onnxruntime")
pytest.importorskip("jinja2")
pytest.importorskip("matplotlib")

SECTIONS = ("summary", "accuracy", "timings", "layer-errors", "histograms", "plan", "lint", "graph")
MODEL_PY = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
            self.conv2 = nn.Conv2d(32, 32, 3, padding=1)
            self.fc = nn.Linear(32, 10)

        def forward(self, x):
            y = F.relu(self.conv1(x))
            y = F.relu(self.conv2(y)) + y
            return self.fc(y.mean((2, 3)))


    def build():
        torch.manual_seed(0)
        return Net()
    """
)
# a fetch: src=/href= or CSS url()/@import pointing at a scheme or a protocol-relative address
_FETCH = re.compile(
    r"""(?:\b(?:src|href|srcset|action|data)\s*=\s*["']?\s*(?:[a-z][a-z0-9+.-]*:|//))"""
    r"""|url\(\s*["']?\s*(?:[a-z][a-z0-9+.-]*:|//)|@import""",
    re.IGNORECASE,
)


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("report")
    (root / "tiny_model.py").write_text(MODEL_PY)
    x = torch.randn(48, 3, 8, 8, generator=torch.Generator().manual_seed(0)).numpy()
    np.savez(root / "labelled.npz", x=x, y=np.arange(48) % 10)
    return quantize(
        f"{root / 'tiny_model.py'}:build",
        str(root / "labelled.npz"),
        out=root / "out",
        exporter="torchscript",
        compare_methods=True,
        show_progress=False,
        ptq=PtqOptions(),
    )


def test_report_html_is_written_and_self_contained(result: Any) -> None:
    html = result.html_path.read_text(encoding="utf-8")
    assert result.html_path == result.out_dir / "report.html"
    assert result.report["files"]["html"] == "report.html"
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    assert not _FETCH.findall(html), _FETCH.findall(html)[:5]
    assert "<link" not in html and "<iframe" not in html and "<img" not in html
    for section in SECTIONS:
        assert f'<section id="{section}">' in html, section
    # every plan decision is in the searchable table, with its rule and reason
    for point in result.report["plan"]["points"]:
        assert f"<code>{point['name']}</code>" in html
    assert 'data-filter="plan-table"' in html
    assert "P14" in html and "no INT8 tensor-core kernel" in html  # fc stays float
    assert "<svg" in html  # plots (and the drawing when dot is installed)
    if shutil.which("dot"):
        assert re.search(r'id="graph-box">\s*<svg', html) and "No drawing" not in html
        assert "Conv + Relu" in html  # a fused predicted layer


def test_report_json_has_layer_errors_and_stable_keys(result: Any) -> None:
    from qdq.pipeline.report import STABLE_KEYS

    report = json.loads(result.report_path.read_text())
    assert set(STABLE_KEYS) <= set(report)
    errors = report["layer_errors"]
    names = [r["name"] for r in errors["rows"]]
    assert sorted(names) == ["conv1:input", "conv2:input"]  # fc stays float (P14)
    sqnr = [r["accumulated"]["sqnr_db"] for r in errors["rows"]]
    assert sqnr == sorted(sqnr) and all(s > 20 for s in sqnr)  # worst first
    assert errors["rows"][0]["histogram"]["counts"] and errors["rows"][0]["weight"]["sqnr_db"] > 30
    assert {w["owner"] for w in errors["weights"]} == {"conv1", "conv2"}
    assert errors["samples"] == 24 and "layer_errors" in report["timings_s"]


def test_drawing_missing_dot_leaves_a_note(result: Any, tmp_path: Path, monkeypatch) -> None:
    import qdq.lint.draw as draw
    from qdq.report import write_html

    monkeypatch.setattr(draw.shutil, "which", lambda name: None)
    out = write_html(result.report, tmp_path / "r.html", onnx_path=result.onnx_path)
    html = out.read_text()
    assert "No drawing: Graphviz &#39;dot&#39; is not installed" in html
    assert '<section id="graph">' in html


def test_renders_in_headless_chromium(result: Any, tmp_path: Path) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip(
            "Debian's chromium is not installed (make data installs it): render not checked"
        )
    page = result.html_path.resolve().as_uri()
    common = [browser, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars"]
    common += ["--host-resolver-rules=MAP * ~NOTFOUND", "--virtual-time-budget=3000"]
    dom = subprocess.run(
        [*common, "--enable-logging=stderr", "--v=0", "--dump-dom", page],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    problems = [c for c in console if re.search(r"Uncaught|Error|Failed to load", c)]
    assert not problems, problems
    assert 'data-ready="1"' in dom.stdout  # the page's script ran to its end
    for section in SECTIONS:
        assert f'id="{section}"' in dom.stdout, section
    assert re.search(r'data-count="plan-table">\d+ of \d+<', dom.stdout)  # the filter ran

    shot = tmp_path / "report.png"
    subprocess.run(
        [*common, f"--screenshot={shot}", "--window-size=1280,2400", page],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert shot.is_file() and shot.stat().st_size > 20_000, "no screenshot"
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_engine_report_adds_the_real_engine(result: Any, tmp_path: Path, capsys) -> None:
    from qdq.cli.main import main
    from qdq.lint.draw import MARK_COLOR, dot_available

    if not dot_available():
        pytest.skip("needs Graphviz dot")
    out = tmp_path / "out"
    shutil.copytree(result.out_dir, out)
    graph = engine_file("resnet18-a100-qat")
    profile = engine_file("resnet18-a100-qat", "profile")
    code = main(["engine", "report", str(out), str(graph), "--profile", str(profile)])
    assert code == 0 and "37-layer engine" in capsys.readouterr().out
    html = (out / "report.html").read_text(encoding="utf-8")
    assert '<section id="engine">' in html and 'href="#engine"' in html
    assert "engine report vs prediction" in html and "QuantizeLinear_7 + Conv_9" in html
    assert MARK_COLOR in html  # another network than this model: the layers disagree
    assert not _FETCH.search(html)
    code = main(["engine", "report", str(tmp_path / "none"), str(graph)])
    err = capsys.readouterr().err
    assert code == 3 and "no report.json" in err and len(err.strip().splitlines()) == 1


def test_quantize_with_an_engine_report(tmp_path: Path) -> None:
    from qdq.lint.draw import dot_available

    if not dot_available():
        pytest.skip("needs Graphviz dot")
    (tmp_path / "tiny_model.py").write_text(MODEL_PY)
    x = torch.randn(16, 3, 8, 8, generator=torch.Generator().manual_seed(0)).numpy()
    np.savez(tmp_path / "d.npz", x=x)
    spec, data = f"{tmp_path / 'tiny_model.py'}:build", str(tmp_path / "d.npz")
    with pytest.raises(FileNotFoundError, match="no layer-information JSON"):
        quantize(
            spec, data, out=tmp_path / "bad", engine_report=tmp_path / "none.json", ptq=PtqOptions()
        )
    assert not (tmp_path / "bad").exists()  # checked before anything runs
    res = quantize(spec, data, out=tmp_path / "out", exporter="torchscript", show_progress=False,
                   engine_report=engine_file("mobilenet-qat"),
                   engine_profile=engine_file("mobilenet-qat", "profile"), ptq=PtqOptions())  # fmt: skip
    html = res.html_path.read_text(encoding="utf-8")
    assert '<section id="engine">' in html and "Conv_12" in html and " ms · " in html
