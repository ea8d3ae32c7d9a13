"""The fused Triton kernels (qdq.kernels): the same bits as the torch path, a fallback that costs
speed and never a number. On the CPU through Triton's interpreter (a subprocess with
TRITON_INTERPRET=1, which Triton reads at import); on a GPU (marked ``gpu``) compiled."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kernel_checks
from qdq import kernels

pytest.importorskip("triton")

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([str(SRC), str(HERE), os.environ.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": path, **env},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_kernels_give_the_torch_paths_bits_in_the_interpreter() -> None:
    done = _run("import kernel_checks; kernel_checks.main()", TRITON_INTERPRET="1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "kernel checks passed" in done.stdout


def test_a_failed_self_check_warns_once_and_keeps_the_torch_path() -> None:
    code = (
        "import warnings, torch\nfrom qdq import kernels\n"
        "kernels.register_check(lambda device: 'planted difference')\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    x = torch.randn(8)\n"
        "    assert not kernels.usable(x) and not kernels.usable(x)\n"
        "print(len(seen), seen[0].message)\n"
    )
    done = _run(code, TRITON_INTERPRET="1")
    assert done.returncode == 0, done.stderr[-3000:]
    count, message = done.stdout.split(" ", 1)
    assert count == "1" and "planted difference" in message and "torch path" in message


def test_importing_qdq_registers_the_self_check() -> None:
    from qdq import kernel_check

    assert kernels._check is kernel_check.check


def test_a_device_is_not_served_without_a_registered_check() -> None:
    """The check lives above the kernels (qdq.kernel_check) and is registered on import: with none
    registered, a device's first use warns and keeps the torch path, as after a failed check; a
    check registered later serves it from its next use."""
    code = (
        "import warnings, torch\nfrom qdq import kernel_check, kernels\n"
        "kernels.register_check(None)\n"
        "x = torch.randn(8)\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    assert not kernels.usable(x) and not kernels.usable(x)\n"
        "assert kernels.self_check('cpu') is not None\n"
        "kernels.register_check(kernel_check.check)\n"
        "print(len(seen), kernels.usable(x), seen[0].message)\n"
    )
    done = _run(code, TRITON_INTERPRET="1")
    assert done.returncode == 0, done.stderr[-3000:]
    count, served, message = done.stdout.split(" ", 2)
    assert count == "1" and served == "True"
    assert "no self-check is registered" in message and "torch path" in message


def test_the_self_check_catches_a_planted_kernel_fault() -> None:
    code = (
        "from qdq import kernels\n"
        "fq, ste, hist = kernels.fake_quant, kernels.ste_grad, kernels.abs_histogram\n"
        "kernels.fake_quant = lambda x, a, lo, hi: fq(x, a, lo, hi) * 1.0001\n"
        "print(kernels.self_check('cpu'))\n"
        "kernels.fake_quant, kernels.ste_grad = fq, lambda x, a, q, g: ste(x, a, q, g) * 0\n"
        "print(kernels.self_check('cpu'))\n"
        "def shifted(x, grid):\n"
        "    counts, stats, pad = hist(x, grid)\n"
        "    counts[1] += 1\n"
        "    return counts, stats, pad\n"
        "kernels.ste_grad, kernels.abs_histogram = ste, shifted\n"
        "print(kernels.self_check('cpu'))\n"
        "kernels.abs_histogram = hist\n"
        "print(kernels.self_check('cpu'), kernels._CHECKED)\n"
    )
    done = _run(code, TRITON_INTERPRET="1")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("fake_quant differs") and lines[1].startswith("ste_grad differs")
    assert lines[2].startswith("abs_histogram differs") and lines[3] == "None {}"


def test_qdq_kernels_0_turns_them_off() -> None:
    done = _run(
        "import torch\nfrom qdq import kernels\nprint(kernels.usable(torch.randn(8)))",
        TRITON_INTERPRET="1",
        QDQ_KERNELS="0",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "False"


def test_cpu_tensors_keep_the_torch_path_without_the_interpreter() -> None:
    if kernels._INTERPRET:
        pytest.skip("this process runs Triton's interpreter")
    assert not kernels.usable(torch.randn(4, 4))


@pytest.mark.gpu
def test_kernels_pass_their_self_check_and_serve_cuda_tensors() -> None:
    assert kernels.self_check("cuda") is None
    x = torch.randn(2, 3, 4, 4, device="cuda")
    assert kernels.usable(x) and kernels.usable(x.to(memory_format=torch.channels_last))
    assert kernels.usable(x.bfloat16()) and kernels.usable(x.half())
    assert not kernels.usable(x.transpose(0, 2)) and not kernels.usable(x.double())


@pytest.mark.gpu
def test_fused_fake_quant_and_grad_match_the_torch_path_on_cuda() -> None:
    dtypes = (torch.float32, torch.float16, torch.bfloat16)
    assert kernel_checks.check_fake_quant_and_grad("cuda", dtypes) == 9


@pytest.mark.gpu
def test_fused_per_channel_weights_and_views_match_the_torch_path_on_cuda() -> None:
    dtypes = (torch.float32, torch.float16, torch.bfloat16)
    assert kernel_checks.check_per_channel_weights("cuda", dtypes) == 9
    assert kernel_checks.check_views("cuda", dtypes) == 3


@pytest.mark.gpu
def test_device_histogram_matches_the_torch_path_on_cuda() -> None:
    kernel_checks.check_histogram("cuda")


@pytest.mark.gpu
def test_fused_fake_quant_of_a_large_tensor_matches_the_cpu() -> None:
    x = torch.randn(64, 256, 56, 56, device="cuda") * 4
    amax = torch.tensor(3.3, device="cuda")
    from qdq.quant.primitives import fake_quant_unchecked

    assert kernels.usable(x)
    got = fake_quant_unchecked(x, amax).cpu()
    want = fake_quant_unchecked(x.cpu(), amax.cpu())
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@pytest.mark.gpu
def test_the_scale_of_a_cuda_amax_is_the_one_the_exporter_writes() -> None:
    # torch's CUDA division by a Python number multiplies by its float32 reciprocal (one bit
    # lost); the scale must be the IEEE quotient computed on the CPU at export
    from qdq.quant.primitives import fake_quant_unchecked, scale_from_amax

    amax = torch.rand(200_000, generator=torch.Generator().manual_seed(3)) * 10
    for bits in (8, 4):
        got = scale_from_amax(amax.cuda(), bits).cpu()
        assert torch.equal(got.view(torch.int32), scale_from_amax(amax, bits).view(torch.int32))
    x = torch.randn(4096, generator=torch.Generator().manual_seed(4)) * 3
    for value in amax[:200].tolist():
        a = torch.tensor(value)
        with kernels.unfused("cuda"):
            got = fake_quant_unchecked(x.cuda(), a.cuda(), num_bits=4).cpu()
        assert torch.equal(got, fake_quant_unchecked(x, a, num_bits=4)), value


def test_the_first_use_under_no_grad_passes_the_self_check() -> None:
    """Calibration (no_grad) and evaluation (inference_mode) are where a tensor first meets the
    kernels: the self-check's gradient comparison must run there too. On the H200 it failed ("element
    0 of tensors does not require grad") and every later call took the slow torch path."""
    code = (
        "import warnings, torch\nfrom qdq import kernels\n"
        "with torch.no_grad():\n"
        "    assert kernels.self_check('cpu') is None\n"
        "with warnings.catch_warnings(record=True) as seen, torch.inference_mode():\n"
        "    warnings.simplefilter('always')\n"
        "    assert kernels.usable(torch.randn(8))\n"
        "assert not [w for w in seen if 'self-check' in str(w.message)]\n"
        "print('ok')\n"
    )
    done = _run(code, TRITON_INTERPRET="1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"
