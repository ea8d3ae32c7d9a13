"""``qdq quantize`` on a small multi-output model: every output in ``report.json`` (``outputs``,
``headline``), in the summary and in ``report.html``; a user metric (``--metric``, ``metric=``)
as the headline, also of the ``--max-drop`` search; its errors, raised early."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from qdq.cli.main import main
from qdq.pipeline import (
    PtqOptions,
    quantize,
)

pytest.importorskip("onnxruntime")

MODEL_PY = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F
    from torch import nn


    class Heads(nn.Module):
        '''A YOLO-style head (N, 4 + 3, 64), a class map, class logits and a scalar.'''

        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 16, 3, padding=1)
            self.box = nn.Conv2d(16, 4, 1)
            self.cls = nn.Conv2d(16, 3, 1)
            self.seg = nn.Conv2d(16, 5, 1)
            self.fc = nn.Linear(16, 10)

        def forward(self, x):
            y = F.relu(self.stem(x))
            boxes = self.box(y).flatten(2) * 8
            det = torch.cat([boxes, torch.sigmoid(self.cls(y)).flatten(2)], dim=1)
            seg_first = {"seg": self.seg(y), "logits": self.fc(y.mean((2, 3)))}
            return det, seg_first, y.mean((1, 2, 3))


    def build():
        torch.manual_seed(0)
        return Heads()


    def seg_first():
        torch.manual_seed(0)
        return SegFirst(Heads())


    class SegFirst(nn.Module):
        def __init__(self, heads):
            super().__init__()
            self.heads = heads

        def forward(self, x):
            det, d, s = self.heads(x)
            return d["seg"], det


    def mean_logit(outputs, labels):
        return float(outputs[2].mean())


    def seg_scores(outputs, labels):
        seg = outputs[0]
        hits = (seg.argmax(1).flatten(1)[:, 0] % 10 == labels).float().mean()
        return {"label_hits": float(hits), "samples": len(labels), "outputs": len(outputs)}


    def not_a_number(outputs, labels):
        return [1.0]
    """
)
FAST = ("--exporter", "torchscript", "--recipe", "none", "--no-progress")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("outputs")
    (root / "heads.py").write_text(MODEL_PY)
    x = torch.randn(24, 3, 8, 8, generator=torch.Generator().manual_seed(0)).numpy()
    np.save(root / "plain.npy", x)
    np.savez(root / "labelled.npz", x=x, y=np.arange(24) % 10)
    return {"root": root, "py": root / "heads.py", "npy": root / "plain.npy"}


def test_every_output_in_report_summary_and_html(inputs, tmp_path: Path, capsys) -> None:
    out = tmp_path / "o"
    spec = f"{inputs['py']}:build"
    assert (
        main(["quantize", "--model", spec, "--data", str(inputs["npy"]), "--out", str(out), *FAST])
        == 0
    )
    printed = capsys.readouterr().out
    r = json.loads((out / "report.json").read_text())
    assert r["metric_name"] == "box_agreement" and r["fp32_metric"] == 1.0
    assert r["headline"]["source"] == "output" and r["headline"]["kind"] == "detections"
    rows = r["outputs"]
    assert [o["name"] for o in rows] == [
        "output[0]",
        "output[1]['seg']",
        "output[1]['logits']",
        "output[2]",
    ]
    # output[1]['seg'] is 4-D but not the first output: a feature map, compared by cosine
    assert [o["kind"] for o in rows] == ["detections", "tensor", "class_vector", "tensor"]
    assert [o["figure"] for o in rows] == ["box_agreement", "cosine", "top1_agreement", "cosine"]
    assert [o["headline"] for o in rows] == [True, False, False, False]
    assert rows[0]["shape"] == [7, 64] and rows[0]["top_k"] == 6 and rows[3]["shape"] == []
    assert rows[0]["value"] == r["int8_metric"] and r["int8"]["top1_agreement"] is None
    assert all(0.9 < o["cosine_mean"] <= 1.0 + 1e-9 and o["relative_error"] < 0.2 for o in rows)
    assert rows[0]["onnx_name"] == "output" and all(o["onnx_name"] for o in rows)

    assert "box_agreement: FP32 1.0000" in printed
    assert (
        "headline: box_agreement of output 0 with FP32; detections: (N, 7, 64), 4 box entries "
        "+ 3 scores in [0, 1] per anchor (rows)"
    ) in printed
    assert "every output, INT8 (ONNX Runtime) vs FP32 (4 tensors):" in printed
    assert "  * output[0] (detections, 7x64): box_agreement" in printed
    assert "    output[1]['seg'] (tensor, 5x8x8): cosine" in printed

    html = (out / "report.html").read_text(encoding="utf-8")
    assert 'id="outputs">Every output, INT8 vs FP32 (4)' in html
    assert "<code>output[1][&#39;seg&#39;]</code>" in html and "box agreement" in html
    assert 'title="the headline metric">headline</span>' in html


def test_user_metric_from_python_is_the_headline_and_the_fallback_metric(
    inputs, tmp_path: Path
) -> None:
    seen: list[tuple[int, bool]] = []

    def mean_box(outputs: list[torch.Tensor], labels: torch.Tensor | None) -> float:
        seen.append((len(outputs), labels is None))
        return float(outputs[0][:, :4].mean())

    res = quantize(
        f"{inputs['py']}:build",
        str(inputs["npy"]),
        out=tmp_path / "o",
        exporter="torchscript",
        show_progress=False,
        metric=mean_box,
        max_drop=0.0,
        ptq=PtqOptions(),
    )
    r = res.report
    assert res.metric_name == "mean_box" and r["headline"]["source"] == "user"
    assert r["headline"]["output"] is None and "mean_box" in r["headline"]["text"]
    assert not any(o["headline"] for o in r["outputs"])
    assert r["fp32"]["figures"] == {"mean_box": r["fp32_metric"]} and r["fp32_metric"] != 1.0
    # --max-drop measured FP32 and every candidate with the same function
    assert r["fallback"]["fp32_metric"] == pytest.approx(r["fp32_metric"])
    assert seen[0] == (4, True) and set(seen) == {(4, True)}  # every output, no labels


def test_user_metric_gets_labels_and_needs_no_classifier(inputs, tmp_path: Path) -> None:
    root = inputs["root"]
    data = str(root / "labelled.npz")
    seg_first = f"{inputs['py']}:seg_first"
    with pytest.raises(ValueError, match="top-1 accuracy needs a classifier"):
        quantize(
            seg_first,
            data,
            out=tmp_path / "a",
            exporter="torchscript",
            show_progress=False,
            ptq=PtqOptions(),
        )
    res = quantize(
        seg_first,
        data,
        out=tmp_path / "b",
        exporter="torchscript",
        show_progress=False,
        metric=f"{inputs['py']}:seg_scores",
        ptq=PtqOptions(),
    )
    figures = res.report["int8"]["figures"]
    assert res.metric_name == "label_hits" and list(figures) == ["label_hits", "samples", "outputs"]
    assert figures["samples"] == 12 and figures["outputs"] == 2
    assert [o["kind"] for o in res.report["outputs"]] == ["class_map", "detections"]


@pytest.mark.parametrize(
    ("fn", "error", "message"),
    [
        ("nope", ValueError, "metric spec '{py}:nope': {py} has no attribute 'nope'"),
        ("not_a_number", TypeError, "metric {py}:not_a_number returned list ([1.0]), not a number"),
    ],
)
def test_bad_user_metric_fails_early(inputs, tmp_path: Path, fn, error, message) -> None:
    spec = f"{inputs['py']}:{fn}"
    out = tmp_path / "o"
    with pytest.raises(error) as info:
        quantize(
            f"{inputs['py']}:build", str(inputs["npy"]), out=out, metric=spec, ptq=PtqOptions()
        )
    assert message.format(py=inputs["py"]) in str(info.value)
    assert not out.exists()


def test_metric_flag_in_a_subprocess(inputs, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    base = [sys.executable, "-m", "qdq", "quantize", "--model", f"{inputs['py']}:build"]
    base += ["--data", str(inputs["npy"]), *FAST]
    ok = subprocess.run(
        [*base, "--out", str(tmp_path / "ok"), "--metric", f"{inputs['py']}:mean_logit"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert "mean_logit: FP32 " in ok.stdout
    assert f"headline: mean_logit, from the user metric {inputs['py']}:mean_logit" in ok.stdout
    assert json.loads((tmp_path / "ok" / "report.json").read_text())["metric_name"] == "mean_logit"

    bad = subprocess.run(
        [*base, "--out", str(tmp_path / "bad"), "--metric", f"{inputs['py']}:not_a_number"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert bad.returncode == 2 and not (tmp_path / "bad").exists()
    assert bad.stderr.startswith("qdq quantize: error: TypeError: metric ")
    assert "not_a_number returned list ([1.0]), not a number" in bad.stderr


class _PerImage(torch.nn.Module):
    """Per-image detection lists of varying length, as torchvision's R-CNNs return them."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)

    def forward(self, x: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        y = self.conv(x).flatten(1)
        return [{"boxes": row[: 4 * (i + 3)].reshape(-1, 4)} for i, row in enumerate(y)]  # 3+ rows


@pytest.mark.parametrize("model", [_PerImage(), torch.nn.Sequential(torch.nn.Flatten(0))])
def test_outputs_that_are_not_one_row_per_sample_are_refused_at_the_check(
    model: torch.nn.Module, tmp_path: Path
) -> None:
    from qdq.pipeline import QuantData

    x = torch.randn(8, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    data = QuantData(x[:4], x[4:], None, "tensors", "4 + 4")
    with pytest.raises(ValueError, match=r"one row per sample .*wrap the model") as err:
        quantize(model.eval(), data, out=tmp_path / "out", show_progress=False, ptq=PtqOptions())
    assert "for 1 sample:" in str(err.value)
    assert not (tmp_path / "out").exists()
