"""The device contract of issue 32, as far as it can be checked without a GPU (the CUDA runs are
in ``test_gpu_contract.py``): quantizers are created on the device of the module they serve, and
the exporters trace the model itself when it is on the CPU (a copy only otherwise)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import device_verbs as verbs
import qdq
from qdq.export.onnx_export import _on_cpu
from qdq.graph.insert import _device_near


def test_a_quantizer_is_placed_on_the_device_of_the_module_it_serves() -> None:
    root = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.Module())
    root[1].add_module("head", torch.nn.Linear(4, 2, device="meta"))
    root[1].head.add_module("input_quantizer", torch.nn.Identity())
    root[1].add_module("pool_quantizer", torch.nn.Identity())
    assert _device_near(root, "1.head.input_quantizer").type == "meta"  # the Linear's own weight
    assert _device_near(root, "1.pool_quantizer").type == "cpu"  # nothing nearer: root's first
    assert _device_near(torch.nn.Module(), "q").type == "cpu"  # no tensor at all


def test_prepare_creates_every_quantizer_where_the_model_is() -> None:
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.Conv2d(16, 16, 1)
    )
    prepared = qdq.prepare(net.eval(), (torch.randn(1, 3, 8, 8),))
    weights = {p.device for p in prepared.parameters()}
    assert {q.amax.device for q in qdq.quantizers_of(prepared).values()} == weights


def test_a_cpu_model_is_exported_as_it_is_not_copied() -> None:
    net = torch.nn.Linear(4, 2)
    args = (torch.randn(1, 4),)
    model, same = _on_cpu(net, args)
    assert model is net and same is args


# every verb on the CPU through the same checks the GPU file runs on CUDA (tests/device_verbs.py)


@pytest.mark.parametrize("method", ["max", "entropy", "mse", "percentile"])
def test_calibrate_keeps_every_tensor_where_the_model_is(method: str) -> None:
    verbs.check_calibrate("cpu", method)


def test_fake_quant_of_the_model_equals_its_copy() -> None:
    verbs.check_fake_quant_matches_cpu("cpu")


def test_debug_sensitivity_and_fallback_keep_the_device() -> None:
    verbs.check_debug_sensitivity_fallback("cpu")


def test_ptq_switches_keep_the_device() -> None:
    verbs.check_ptq("cpu")


@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["fp32", "bf16"])
def test_qat_steps_in_a_users_loop(dtype: torch.dtype | None) -> None:
    verbs.check_qat_steps("cpu", dtype)


def test_finetune_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    verbs.check_finetune_resume("cpu", tmp_path)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_export_is_deterministic_for_a_copy(exporter: str, tmp_path: Path) -> None:
    verbs.check_export_equals_cpu_copy("cpu", exporter, tmp_path)


def test_parity_on_the_models_device(tmp_path: Path) -> None:
    verbs.check_parity("cpu", tmp_path)


def test_fp8_plan_on_the_models_device(tmp_path: Path) -> None:
    verbs.check_fp8("cpu", tmp_path)
