"""``qdq quantize --format fp8`` and ``qdq.pipeline.quantize(format="fp8")`` end to end (issue 49):
the plan's formats, FP8 layers calibrated by max and INT8 ones by mse by default, the export at
opset 19, ONNX Runtime agreeing with the torch fake-quant model, the formats in the report; the
bad inputs refused."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from qdq.cli.main import main
from qdq.pipeline import quantize

pytest.importorskip("onnxruntime")

MODEL_PY = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Net(nn.Module):
        '''A stem (3 channels: INT8, F03), a 7x7 conv (INT8, F03), FP8 convs, a head.'''

        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.stem = nn.Conv2d(3, 32, 3, padding=1)
            self.big = nn.Conv2d(32, 32, 7, padding=3)
            self.pw = nn.Conv2d(32, 64, 1)
            self.c2 = nn.Conv2d(64, 64, 3, padding=1)
            self.fc = nn.Linear(64, 32)

        def forward(self, x):
            x = torch.relu(self.stem(x))
            x = torch.relu(self.big(x))
            y = torch.relu(self.pw(x))
            y = y + torch.relu(self.c2(y))
            return self.fc(y.mean((2, 3)))


    def build():
        return Net().eval()
    """
)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("fp8job")
    model = root / "net.py"
    model.write_text(MODEL_PY)
    data = root / "x.npy"
    np.save(data, np.random.default_rng(0).standard_normal((48, 3, 12, 12)).astype(np.float32))
    return model, data


def test_fp8_job_end_to_end(files, tmp_path: Path) -> None:
    model, data = files
    res = quantize(f"{model}:build", str(data), out=tmp_path / "out", format="fp8", ptq="none",
                   show_progress=False)  # fmt: skip
    report = res.report
    # FP8: pw and c2 (input, weight each); INT8: the stem (F03), the 7x7 conv (F03), the pool
    # and the head reading it (F05: TensorRT has no FP8 pooling to write FP8)
    assert report["settings"]["format"] == {"fp8": 4, "int8": 7}
    assert report["settings"]["opset"] == 19
    assert report["settings"]["method"] == "max (FP8) / mse (INT8)"
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    methods = {q["path"]: (q["format"], q["method"]) for q in manifest["quantizers"]}
    assert methods["pw.input_quantizer"] == ("fp8", "max")
    assert methods["big.input_quantizer"] == ("int8", "mse")
    # the exported ONNX in ONNX Runtime agrees with the fake-quant model
    int8, torch_fq = report["int8"], report["int8_torch"]
    assert int8["cosine_mean"] == pytest.approx(torch_fq["cosine_mean"], abs=1e-5)
    assert int8["cosine_mean"] > 0.99
    quantizers = {q["path"]: q["format"] for q in report["quantizers"]}
    assert quantizers["pw.input_quantizer"] == "fp8" and quantizers["big.input_quantizer"] == "int8"
    page = (tmp_path / "out" / "report.html").read_text()
    assert "FP8 (F01)" in page and "INT8 (F03)" in page  # the plan table's format column
    # qdq parity plans the model again in the recorded formats and finds no unexplained code
    code = main(["parity", str(tmp_path / "out" / "model.qdq.onnx"), "--model", f"{model}:build",
                 "--data", str(data), "--json"])  # fmt: skip
    assert code == 0


def test_fp8_job_takes_an_explicit_method_and_refuses_entropy(files, tmp_path: Path) -> None:
    model, data = files
    with pytest.raises(ValueError, match="no FP8 meaning"):
        quantize(f"{model}:build", str(data), out=tmp_path / "a", format="fp8", calib="entropy",
                 ptq="none", show_progress=False)  # fmt: skip
    with pytest.raises(ValueError, match="unknown format 'fp16'"):
        quantize(f"{model}:build", str(data), out=tmp_path / "b", format="fp16")
    with pytest.raises(ValueError, match="opset >= 19"):
        quantize(f"{model}:build", str(data), out=tmp_path / "c", format="fp8", opset=17,
                 ptq="none", show_progress=False)  # fmt: skip
    assert not (tmp_path / "c" / "model.qdq.onnx").exists()
    res = quantize(f"{model}:build", str(data), out=tmp_path / "d", format="fp8", calib="mse",
                   ptq="none", show_progress=False)  # fmt: skip
    manifest = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert {q["method"] for q in manifest["quantizers"] if q["kind"] == "input"} == {"mse"}
    assert res.report["settings"]["method"] == "mse"


def test_fp8_from_the_cli(files, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, data = files
    out = tmp_path / "cli"
    code = main(["quantize", "--model", f"{model}:build", "--data", str(data), "--out", str(out),
                 "--format", "fp8", "--recipe", "none", "--no-progress"])  # fmt: skip
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["format"] == {"fp8": 4, "int8": 7}
    assert "opset 19" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["quantize", "--model", f"{model}:build", "--format", "int4"])


def test_int8_default_is_unchanged(files, tmp_path: Path) -> None:
    model, data = files
    res = quantize(f"{model}:build", str(data), out=tmp_path / "i", ptq="none",
                   show_progress=False)  # fmt: skip
    assert res.report["settings"]["format"] == {"int8": 11}
    assert res.report["settings"]["opset"] == 17 and res.report["settings"]["method"] == "mse"


def test_fp8_max_drop_fallback_keeps_the_format(files, tmp_path: Path) -> None:
    model, data = files
    res = quantize(f"{model}:build", str(data), out=tmp_path / "f", format="fp8", ptq="none",
                   max_drop=0.0, show_progress=False)  # fmt: skip
    fb = res.report["fallback"]
    assert fb is not None and fb["max_drop"] == 0.0
    formats = res.report["settings"]["format"]
    assert formats.get("fp8", 0) > 0  # the re-planned models are FP8 plans too
    assert res.report["settings"]["opset"] == 19


MIXED_PY = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Net(nn.Module):
        '''conv a reads a well-behaved tensor, conv b a heavy-tailed one (sinh): INT8 loses there.'''

        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.stem = nn.Conv2d(3, 32, 3, padding=1)
            self.a = nn.Conv2d(32, 64, 3, padding=1)
            self.b = nn.Conv2d(64, 64, 3, padding=1)
            self.fc = nn.Linear(64, 64)
            self.fc2 = nn.Linear(64, 32)

        def forward(self, x):
            x = torch.relu(self.stem(x))
            y = torch.sinh(6 * self.a(x))
            y = torch.relu(self.b(y))
            return self.fc2(torch.relu(self.fc(y.mean((2, 3)))))


    def build():
        return Net().eval()
    """
)


def _mixed_job(tmp_path: Path) -> Any:
    """``quantize(format="mixed")`` of MIXED_PY on 48 Gaussian images, into ``tmp_path / "m"``."""
    model = tmp_path / "mixed.py"
    model.write_text(MIXED_PY)
    data = tmp_path / "x.npy"
    np.save(data, np.random.default_rng(0).standard_normal((48, 3, 12, 12)).astype(np.float32))
    return quantize(f"{model}:build", str(data), out=tmp_path / "m", format="mixed", ptq="none",
                    show_progress=False)  # fmt: skip


def test_mixed_moves_the_conv_int8_loses_on_to_fp8(tmp_path: Path) -> None:
    res = _mixed_job(tmp_path)
    choice = res.report["settings"]["format_choice"]
    rows = {r["layer"]: r for r in choice["rows"]}
    assert rows["a"]["chosen"] == "int8" and rows["a"]["int8_db"] > rows["a"]["fp8_db"]
    assert rows["b"]["chosen"] == "fp8" and rows["b"]["fp8_db"] > rows["b"]["int8_db"] + 3
    manifest = json.loads((tmp_path / "m" / "manifest.json").read_text())
    formats = {q["path"]: q["format"] for q in manifest["quantizers"]}
    assert formats["a.weight_quantizer"] == "int8" and formats["a.input_quantizer"] == "int8"
    assert formats["b.weight_quantizer"] == "fp8" and formats["b.input_quantizer"] == "fp8"
    # the head reads the pool, which runs INT8: INT8 from the plan on (F05), not measured
    assert "fc" not in rows and formats["fc.input_quantizer"] == "int8"
    # the last GEMM is planned FP8 (F01) and measured: FP8's 3-bit mantissa loses there, so it
    # is INT8
    assert rows["fc2"]["planned"] == "fp8" and rows["fc2"]["chosen"] == "int8"
    assert formats["fc2.input_quantizer"] == "int8"
    assert res.report["settings"]["opset"] == 19
    assert "formats" in res.report["timings_s"]
    # the moves cost no reformat more than one of the single-format plans (all INT8, or as
    # planned: counted when the moves cost more than all INT8)
    counts = choice["reformats"]
    assert counts["with changes"] <= max(counts["all INT8"], counts.get("without", 0))
    assert choice["dropped"] == ""


def test_mixed_drops_changes_that_cost_reformats(tmp_path: Path, monkeypatch) -> None:
    """When the linter predicts more unfused Q/DQ with the moves than with either single-format
    plan, the job takes the all-INT8 plan (the planned FP8 GEMM measures less noise in INT8, so
    it is the more accurate single format) and says why (the counting itself: the next test)."""
    import qdq.pipeline.formats as stage

    counted: list[tuple[str, ...]] = []

    def fake(model, example, config, batch, exporter, target):  # type: ignore[no-untyped-def]
        counted.append(tuple(o.name for o in config.overrides if o.format == "fp8"))
        return 9 if any(counted[-1]) else 3

    monkeypatch.setattr(stage, "reformats", fake)
    res = _mixed_job(tmp_path)
    choice = res.report["settings"]["format_choice"]
    # all INT8 first, then the changes, then the plan as planned (the changes cost more than
    # all INT8, so the other single format's count bounds them too)
    assert counted == [(), ("b",), ()]
    assert choice["reformats"] == {"all INT8": 3, "with changes": 9, "without": 3}
    assert choice["single"] == "int8" and "9 with changes" in choice["dropped"]
    rows = {r["layer"]: r for r in choice["rows"]}
    assert rows["b"]["chosen"] == "int8" and "would cost reformats" in rows["b"]["reason"]
    assert rows["fc2"]["chosen"] == "int8" and "the all-INT8 plan" in rows["fc2"]["reason"]
    manifest = json.loads((tmp_path / "m" / "manifest.json").read_text())
    formats = {q["path"]: q["format"] for q in manifest["quantizers"]}
    assert formats["b.input_quantizer"] == "int8" and formats["b.weight_quantizer"] == "int8"
    assert formats["fc2.input_quantizer"] == "int8"


def test_reformats_counts_the_format_boundaries_of_a_plan() -> None:
    """An FP8 convolution between INT8 ones: its input is written by an INT8 layer and its
    output read by one, each a boundary the linter predicts as a reformat."""
    import torch
    from torch import nn

    from qdq import QuantConfig
    from qdq.config import Override
    from qdq.pipeline.formats import reformats

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
                        *[m for _ in range(3) for m in (nn.Conv2d(32, 32, 3, padding=1), nn.ReLU())],
                        nn.Flatten(), nn.Linear(32 * 8 * 8, 64)).eval()  # fmt: skip
    x = torch.randn(2, 3, 8, 8)
    plain = QuantConfig(format="mixed")
    moved = QuantConfig(format="mixed", overrides=(Override(name="4", format="fp8"),))
    base = reformats(net, (x,), plain, x, "torchscript", "trt10-hopper")
    assert reformats(net, (x,), moved, x, "torchscript", "trt10-hopper") >= base + 2


def test_mixed_plan_rules_and_a_users_format_override() -> None:
    import torch
    from torch import nn

    import qdq
    from qdq import QuantConfig
    from qdq.config import Override

    net = nn.Sequential(nn.Conv2d(3, 32, 3), nn.ReLU(), nn.Conv2d(32, 32, 3), nn.ReLU(),
                        nn.Conv2d(32, 32, 3), nn.Flatten(), nn.Linear(32 * 6 * 6, 64))  # fmt: skip
    cfg = QuantConfig(format="mixed", overrides=(Override(name="4", format="fp8"),))
    plan = qdq.plan_of(qdq.prepare(net.eval(), (torch.randn(1, 3, 12, 12),), cfg))
    got = {p.name: (p.spec.format, p.format_rule) for p in plan.points if p.decision == "quantize"}
    assert got["2:weight"] == ("int8", "F07") and got["2:input"] == ("int8", "F07")
    assert got["4:weight"] == ("fp8", "F06") and got["4:input"] == ("fp8", "USER")
    assert got["6:input"] == ("fp8", "F01")
    with pytest.raises(ValueError, match="format must be one of int8, fp8"):
        Override(name="x", format="mixed")


def test_mixed_attention_follows_its_gemms_to_int8_when_none_stays_fp8() -> None:
    """Gaussian activations and weights: FP8's 3-bit mantissa loses to INT8 on every GEMM, they
    move to INT8, and the attention products go with them (no FP8 island: its every operand
    would cross a format boundary); the re-planned model has no FP8 quantizer left."""
    import torch

    import qdq
    from models.attention import TinyAttention
    from qdq import QuantConfig
    from qdq.accuracy.formats import choose_formats

    torch.manual_seed(0)
    net = TinyAttention().eval()
    x = torch.randn(4, 16, 64)
    prepared = qdq.prepare(net, (x[:1],), QuantConfig(format="mixed"))
    assert {q.spec.format for q in qdq.quantizers_of(prepared).values()} == {"fp8"}  # F07
    qdq.calibrate(prepared, [x], show_progress=False)
    choice = choose_formats(prepared, x)
    assert {r.layer: r.chosen for r in choice.rows} == {"qkv": "int8", "proj": "int8"}
    assert choice.followed and all(o.format == "int8" for o in choice.overrides)
    assert "attention products INT8 with them" in choice.summary()
    assert choice.to_dict()["followed"] == list(choice.followed)
    again = qdq.prepare(net, (x[:1],), QuantConfig(format="mixed", overrides=choice.overrides))
    assert {q.spec.format for q in qdq.quantizers_of(again).values()} == {"int8"}


def test_fp8_job_lints_an_fp8_build_and_refuses_a_gpu_without_fp8(files, tmp_path: Path) -> None:
    """``trt10`` names no GPU: the job lints the build an FP8 export needs (``--fp8`` added), so
    no F07 warning; a target whose GPU has no FP8, or whose parser predates opset 19, is refused
    before anything runs."""
    model, data = files
    res = quantize(f"{model}:build", str(data), out=tmp_path / "a", format="fp8", ptq="none",
                   show_progress=False)  # fmt: skip
    rules = {f["rule"]: f["severity"] for f in res.report["lint_findings"]}
    assert "F07" not in rules and rules.get("F01") == "INFO"  # names no GPU: INFO only
    for target, match in (("trt10-ampere", "compute capability 8.9"), ("trt8.6", "opset 19")):
        with pytest.raises(ValueError, match=match):
            quantize(f"{model}:build", str(data), out=tmp_path / target, format="fp8",
                     target=target, ptq="none", show_progress=False)  # fmt: skip
        assert not (tmp_path / target).exists()
    with pytest.raises(ValueError, match="compute capability 8.9"):
        quantize(f"{model}:build", str(data), out=tmp_path / "m", format="mixed",
                 target="trt10-turing", ptq="none", show_progress=False)  # fmt: skip
