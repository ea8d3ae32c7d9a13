"""The device contract of issue 32 on a real model: prepare, calibrate, evaluate and export a CUDA
model without moving it by hand. Skipped without CUDA (marked ``gpu``); CI has none.

Measured on CUDA in issue 32: after ``qdq.calibrate`` every amax was on the CPU (the quantizers were
created on the CPU and the weight amax copied there), so the next forward failed with "Expected all
tensors to be on the same device"; ``export_onnx`` of a CUDA model lost its weight Q/DQ in the
dynamo export. Now each quantizer is created on the device of the module it serves, and the
exporters trace a CPU copy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import device_verbs as verbs
import qdq

SRC = Path(__file__).resolve().parents[1] / "src"

pytestmark = pytest.mark.gpu


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10),
    ).eval()  # fmt: skip


@pytest.mark.parametrize("method", ["max", "entropy", "mse", "percentile"])
def test_calibrate_keeps_every_amax_on_cuda_and_the_model_runs(method: str) -> None:
    model = _net().cuda()
    x = torch.randn(8, 3, 16, 16, device="cuda")
    prepared = qdq.prepare(model, (x[:1],))
    qdq.calibrate(prepared, [x[:4], x[4:]], method=method, show_progress=False)
    devices = {q.amax.device.type for q in qdq.quantizers_of(prepared).values()}
    assert devices == {"cuda"}
    with torch.no_grad():
        out = prepared(x)
    assert out.device.type == "cuda" and torch.isfinite(out).all()


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_the_onnx_of_a_cuda_model_is_the_onnx_of_its_cpu_copy(
    exporter: str, tmp_path: Path
) -> None:
    import onnx

    x = torch.randn(8, 3, 16, 16)
    prepared = qdq.prepare(_net().cuda(), (x[:1].cuda(),))
    qdq.calibrate(prepared, [x.cuda()], show_progress=False)
    cpu = qdq.prepare(_net(), (x[:1],))
    qdq.calibrate(cpu, [x], show_progress=False)
    a = qdq.export_onnx(prepared, (x[:1].cuda(),), tmp_path / "cuda.onnx", exporter=exporter)
    b = qdq.export_onnx(cpu, (x[:1],), tmp_path / "cpu.onnx", exporter=exporter)
    assert next(prepared.parameters()).device.type == "cuda"  # the user's model stays there
    ga, gb = onnx.load(a.path).graph, onnx.load(b.path).graph
    assert [n.op_type for n in ga.node] == [n.op_type for n in gb.node]
    assert (a.num_quantize, a.num_dequantize) == (b.num_quantize, b.num_dequantize)


# every verb on CUDA: the checks of tests/device_verbs.py (test_device_contract.py runs them on
# the CPU), a torchvision ResNet-18 at 32×32, and the CLI with --device cuda


@pytest.mark.parametrize("method", ["max", "entropy", "mse", "percentile"])
def test_calibrate_keeps_every_qdq_tensor_on_cuda(method: str) -> None:
    verbs.check_calibrate("cuda", method)


def test_fake_quant_on_cuda_computes_what_the_cpu_copy_computes() -> None:
    verbs.check_fake_quant_matches_cpu("cuda")


def test_debug_sensitivity_and_auto_quantize_on_cuda() -> None:
    verbs.check_debug_sensitivity_fallback("cuda")


def test_equalize_kernel_sums_adaround_and_bias_correction_on_cuda() -> None:
    verbs.check_ptq("cuda")


@pytest.mark.parametrize(
    "dtype", [None, torch.bfloat16, torch.float16], ids=["fp32", "bf16-autocast", "fp16-scaler"]
)
def test_qat_steps_on_cuda(dtype: torch.dtype | None) -> None:
    verbs.check_qat_steps("cuda", dtype)


def test_fp8_plan_on_cuda(tmp_path: Path) -> None:
    verbs.check_fp8("cuda", tmp_path)


def test_finetune_resumes_from_its_checkpoint_on_cuda(tmp_path: Path) -> None:
    verbs.check_finetune_resume("cuda", tmp_path)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_export_of_cuda_model_is_byte_for_byte_its_cpu_copys(exporter: str, tmp_path: Path) -> None:
    verbs.check_export_equals_cpu_copy("cuda", exporter, tmp_path)


def test_parity_of_a_cuda_model_with_its_onnx(tmp_path: Path) -> None:
    verbs.check_parity("cuda", tmp_path)


def test_resnet18_calibrates_runs_and_exports_on_cuda(tmp_path: Path) -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    net = torchvision.models.resnet18(num_classes=10).eval().cuda()
    data = [torch.randn(16, 3, 32, 32, device="cuda") for _ in range(2)]
    prepared = qdq.prepare(net, (data[0][:1],))
    qdq.calibrate(prepared, data, method="mse", show_progress=False)
    verbs.assert_on(prepared, "cuda")
    with torch.no_grad():
        assert torch.isfinite(prepared(data[1])).all()
    exported = qdq.export_onnx(prepared, (data[0][:1],), tmp_path / "r18.onnx")
    assert exported.num_quantize > 20


@pytest.mark.parametrize("verb", ["quantize", "qat"])
def test_cli_with_device_cuda(verb: str, tmp_path: Path) -> None:
    model = tmp_path / "tiny.py"
    model.write_text(
        f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from device_verbs import tiny_net\n\n\ndef build():\n    return tiny_net('cpu')\n"
    )
    x = torch.randn(48, 3, 16, 16, generator=torch.Generator().manual_seed(0)).numpy()
    np.savez(tmp_path / "data.npz", x=x, y=np.arange(48) % 10)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(SRC), os.environ.get("PYTHONPATH", "")) if p)}  # fmt: skip
    cmd = [sys.executable, "-c", "import sys; from qdq.cli.main import main; sys.exit(main())",
           verb, "--model", f"{model}:build", "--data", str(tmp_path / "data.npz"),
           "--out", str(tmp_path / "out"), "--device", "cuda", "--batch-size", "8",
           "--no-progress"]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["settings"]["device"].startswith("cuda:")
    assert (report["qat"] is not None) == (verb == "qat")
    assert report["int8"]["cosine_mean"] > 0.99


class _StdConv2d(torch.nn.Conv2d):
    """timm's StdConv2d: the weight standardized in every forward (NFNet, BiT)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = torch.nn.functional.batch_norm(
            self.weight.reshape(1, self.out_channels, -1), None, None, training=True, eps=1e-6
        ).reshape_as(self.weight)
        return torch.nn.functional.conv2d(x, w, self.bias, self.stride, self.padding)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_weight_computed_in_forward_on_cuda(exporter: str, tmp_path: Path) -> None:
    """The computed weight is calibrated on CUDA (its amax there), the model runs there, and its
    ONNX reads the weight as a constant, as the CPU copy's does."""
    import onnx

    torch.manual_seed(0)
    net = torch.nn.Sequential(_StdConv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                              _StdConv2d(16, 32, 3)).eval().cuda()  # fmt: skip
    x = torch.randn(8, 3, 12, 12, device="cuda")
    prepared = qdq.prepare(net, (x[:1],))
    qdq.calibrate(prepared, [x], show_progress=False)
    weights = [q for n, q in qdq.quantizers_of(prepared).items() if n.endswith("weight_quantizer")]
    assert len(weights) == 2 and all(q.amax.device.type == "cuda" for q in weights)
    with torch.no_grad():
        assert torch.isfinite(prepared(x)).all()
    out = qdq.export_onnx(prepared, (x[:1],), tmp_path / "std.onnx", exporter=exporter)
    ops = [n.op_type for n in onnx.load(out.path).graph.node]
    assert "BatchNormalization" not in ops and ops.count("QuantizeLinear") == 4


def test_an_encoder_quantizes_on_cuda_from_token_batches(tmp_path: Path) -> None:
    """qdq.quantize(device="cuda") on a small BERT from in-memory tokenizer batches: dynamic
    sequence export, verified; the user's model stays where it was."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=128,
                                     max_position_embeddings=64, num_labels=3)  # fmt: skip
    model = transformers.BertForSequenceClassification(config).eval()
    gen = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(4):
        ids = torch.randint(5, 500, (8, 16), generator=gen)
        mask = torch.ones_like(ids)
        mask[:, 12:] = 0
        batches.append({"input_ids": ids, "attention_mask": mask, "labels": ids[:, 0] % 3})
    result = qdq.quantize(model, batches, out=tmp_path / "bert", device="cuda", ptq="none",
                          calib="max", show_progress=False)  # fmt: skip
    r = result.report
    assert r["settings"]["device"].startswith("cuda")
    assert r["export"]["dynamic_dims"] == {"input": {"1": "sequence"}, "input1": {"1": "sequence"}}
    assert r["lint_verdict"] == "PASS" and r["int8"]["cosine_mean"] > 0.99
    assert next(model.parameters()).device.type == "cpu"
