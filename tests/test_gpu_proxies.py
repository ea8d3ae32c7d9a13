"""The CPU proxies of qdq's GPU cost (``benchmarks/gpu_proxies.py``, issue 48), as counts.

Counts, never times: aten ops and kernels per quantizer, host synchronisations per calibration
batch and per QAT step, ``torch.compile`` recompilations, on two small models (a ConvNet and a
two-layer ViT). Each test states one of the issue's targets. Where qdq does not meet it yet the
test is a strict ``xfail`` whose reason holds today's figure: the day the cost is lowered it
fails, and whoever lowered it removes the marker.

The GPU path (the fused Triton kernels of :mod:`qdq.kernels`, taken on CUDA) is counted in a
subprocess with ``TRITON_INTERPRET=1``, where Triton's interpreter runs those kernels on this CPU
(each launch counts as one kernel).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_proxies as gp  # noqa: E402
import gpu_proxy_probes as probes  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
MODELS = ["tiny_cnn", "tiny_vit"]


@functools.cache
def counted(name: str) -> dict[str, Any]:
    """:func:`gpu_proxies.count_figures` of a small model, on one thread (the histogram's
    multi-thread path dispatches other ops)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return gp.count_figures(gp.Subjects(name))
    finally:
        torch.set_num_threads(threads)


def _xfail(reason: str) -> pytest.MarkDecorator:
    return pytest.mark.xfail(strict=True, reason=f"issue 48: {reason}")


@pytest.fixture(scope="module")
def cnn() -> gp.Subjects:
    return gp.Subjects("tiny_cnn")


# ------------------------------------------------------------------------------ the probes
def test_probe_counts_each_kind_of_host_sync_once() -> None:
    t = torch.tensor([1.0, -2.0, 3.0, 0.5])

    def syncs(fn: Any) -> list[str]:
        return [s.kind for s in probes.count(fn, host_reads=True).syncs]

    def apart() -> None:
        t.cpu()
        t.tolist()  # on a GPU: a second copy of t (on this CPU t.cpu() is t itself)

    assert syncs(lambda: t.sum().item()) == ["aten._local_scalar_dense"]
    assert (
        syncs(lambda: (bool(t[0] > 0), float(t[1]), int(t[2]))) == ["aten._local_scalar_dense"] * 3
    )
    assert syncs(lambda: t.tolist()) == ["Tensor.tolist"]
    assert syncs(lambda: t.cpu().numpy()) == ["Tensor.cpu"], "one chain, one copy"
    assert syncs(apart) == ["Tensor.cpu", "Tensor.tolist"]
    assert syncs(lambda: t.to("cpu")) == ["Tensor.to"]
    assert syncs(lambda: t[t > 0]) == ["aten.index"], "a mask index has a data-dependent shape"
    assert syncs(lambda: t.nonzero()) == ["aten.nonzero"]
    assert syncs(lambda: t.to(t.device)) == [], "follows the data: stays on a GPU"
    assert syncs(lambda: t[torch.tensor([0, 2])]) == [], "an integer index has a static shape"


def test_probe_counts_views_as_no_kernel_and_names_qdq_functions() -> None:
    t = torch.randn(4)
    assert probes.count(lambda: t.view(2, 2).t()).kernels == 0
    assert probes.count(lambda: t + 1).kernels == 1
    from qdq.quant.primitives import fake_quant

    probe = probes.count(lambda: fake_quant(t, 1.0), attribute=True)
    assert any(site.startswith("quant/primitives.py:") for site in probe.op_sites), probe.op_sites


# ------------------------------------------------------------------------ kernels and syncs
@pytest.mark.parametrize(
    "name",
    [
        "tiny_cnn",
        pytest.param("tiny_vit", marks=_xfail(
            "the bypassed tiny ViT dispatches 39 kernels per forward against the float model's "
            "21: the runtime's torch function mode turns nn.MultiheadAttention's fused fast path "
            "off")),
    ],
)  # fmt: skip
def test_bypassed_prepared_model_dispatches_the_float_kernels(name: str) -> None:
    fig = counted(name)
    assert fig["bypass_fwd_kernels"] == fig["float_fwd_kernels"]


@pytest.mark.parametrize("name", MODELS)
def test_fake_quant_forward_makes_no_host_sync(name: str) -> None:
    assert counted(name)["fq_fwd_syncs"] == 0


@pytest.mark.parametrize("name", MODELS)
def test_qat_step_makes_no_host_sync(name: str) -> None:
    fig = counted(name)
    assert fig["qat_step_syncs"] == 0 == fig["float_step_syncs"]


@pytest.mark.parametrize("name", MODELS)
def test_calibration_batch_makes_at_most_one_host_sync(name: str) -> None:
    """The histograms collect on the device, nothing read back per quantizer (before: 24 and 54
    syncs per batch: float(max|x|), bool(min < 0) and torch.bincount per quantizer call). On
    the CPU, where a read costs nothing, the calibrator reads the range and the sign (no abs
    pass); a device without the fused kernels reads nothing: that is the path counted."""
    assert counted(name)["calib_batch_syncs"] <= 1


@pytest.mark.parametrize("name", MODELS)
def test_computing_every_amax_makes_two_host_syncs_in_all(name: str) -> None:
    """The calibrators' statistics in one read back, the amax checks and warnings in one more,
    whatever the number of quantizers (before: 30 and 80 computing the mse amax, 5 per
    quantizer). The max figure is left out here: the benchmark counts that calibration on the
    CPU's path, whose batches read their range and sign."""
    assert counted(name)["calib_mse_amax_syncs"] <= 2


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("tiny_cnn", marks=_xfail(
            "the fake-quant forward adds 2.67 kernels per quantizer on the CPU path (x / scale, "
            "round_, clamp_, addcmul; the scale kept per amax: 4.0 before; a weight quantized "
            "once): one needs a fused kernel, which the CPU has not")),
        pytest.param("tiny_vit", marks=_xfail("3.46 kernels per quantizer (4.8 before)")),
    ],
)  # fmt: skip
def test_fake_quant_forward_adds_one_kernel_per_quantizer(name: str) -> None:
    assert counted(name)["fq_fwd_kernels_per_q"] <= 1


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("tiny_cnn", marks=_xfail(
            "the QAT forward adds 4.42 kernels per quantizer and the backward 3.25 on the CPU "
            "path (every weight re-quantized per step, per channel; counted after a first step, "
            "which makes each scale and clipping bound once: 6.42 at that step; the backward "
            "5.42 before the bound was kept with the scale)")),
        pytest.param("tiny_vit", marks=_xfail(
            "4.77 forward (6.77 at the first step), 2.12 backward (4.19 before) per quantizer")),
    ],
)  # fmt: skip
def test_qat_adds_one_kernel_per_quantizer_forward_and_backward(name: str) -> None:
    fig = counted(name)
    assert fig["qat_fwd_kernels_per_q"] <= 1
    assert fig["qat_bwd_kernels_per_q"] <= 1


# ----------------------------------------------------------------------------- torch.compile
@pytest.fixture(scope="module")
def compiled_eval(cnn: gp.Subjects) -> dict[str, probes.Compiled]:
    return _compiled(cnn, cnn.prepared, probes.EVAL_SEQUENCE)


@pytest.fixture(scope="module")
def compiled_train(cnn: gp.Subjects) -> dict[str, probes.Compiled]:
    return _compiled(cnn, cnn.qat, probes.TRAIN_SEQUENCE)


def _compiled(s: gp.Subjects, subject: torch.nn.Module, steps: Any) -> dict[str, probes.Compiled]:
    """The float model and ``subject`` over ``steps``, both with ``fullgraph=True``."""
    run = {
        who: probes.compile_sequence(model, steps, s.sample, fullgraph=True)
        for who, model in (("float", s.model), ("qdq", subject))
    }
    assert run["float"].error is None, run["float"].error
    return run


@pytest.mark.parametrize("sequence", ["compiled_eval", "compiled_train"])
def test_compiled_models_hold_fullgraph_over_the_sequence(
    sequence: str, request: pytest.FixtureRequest
) -> None:
    run = request.getfixturevalue(sequence)
    assert run["qdq"].error is None, run["qdq"].error
    assert not run["qdq"].graph_breaks
    assert run["qdq"].limit_hit == 0
    assert run["qdq"].graphs <= run["float"].graphs, "one graph per compilation, as the float"


def test_compiled_prepared_model_recompiles_no_more_than_float(
    compiled_eval: dict[str, probes.Compiled],
) -> None:
    assert len(compiled_eval["qdq"].recompiles) <= len(compiled_eval["float"].recompiles)


def test_compiled_qat_model_recompiles_no_more_than_float(
    compiled_train: dict[str, probes.Compiled],
) -> None:
    assert len(compiled_train["qdq"].recompiles) <= len(compiled_train["float"].recompiles)


# ------------------------------------------------------------------------------- the GPU path
@pytest.fixture(scope="module")
def gpu_path(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Counts of qdq's GPU code path: the benchmark run with Triton's CPU interpreter."""
    pytest.importorskip("triton")
    out = tmp_path_factory.mktemp("gpu_path") / "counts.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_proxies.py"), "--gpu-path",
           "--models", "tiny_cnn", "tiny_vit", "--json", str(out)]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(json.loads(out.read_text())["models"])


def test_gpu_path_fake_quant_forward_adds_one_kernel_per_quantizer_on_a_convnet(
    gpu_path: dict[str, dict[str, Any]],
) -> None:
    assert gpu_path["tiny_cnn"]["fq_fwd_kernels_per_q"] <= 1


def test_gpu_path_calibration_of_a_convnet_makes_no_host_sync_per_batch(
    gpu_path: dict[str, dict[str, Any]],
) -> None:
    assert gpu_path["tiny_cnn"]["calib_batch_syncs"] == 0


def test_gpu_path_calibration_of_a_vit_makes_no_host_sync_per_batch(
    gpu_path: dict[str, dict[str, Any]],
) -> None:
    assert gpu_path["tiny_vit"]["calib_batch_syncs"] == 0


def test_gpu_path_calibration_batch_bins_and_merges_in_a_few_ops(
    gpu_path: dict[str, dict[str, Any]],
) -> None:
    """A calibration batch costs each activation quantizer its binning (three kernels: the
    range, the fused histogram, the sum of its parts) and a share of one merge every
    ``MERGE_EVERY`` batches: 3.84 / 6.35 × the float forward's ops on tiny_cnn / tiny_vit
    (16.6 / 21.4 when each batch merged as it came: 30 ops per batch and quantizer)."""
    assert gpu_path["tiny_cnn"]["calib_batch_ops_x_float"] <= 5
    assert gpu_path["tiny_vit"]["calib_batch_ops_x_float"] <= 8


@_xfail(
    "on the GPU path a calibration batch costs 3.32 / 6.21 × the float forward's kernels "
    "on tiny_cnn / tiny_vit (three per activation quantizer, plus a share of the merge)"
)
def test_gpu_path_calibration_batch_costs_at_most_twice_the_float_forward(
    gpu_path: dict[str, dict[str, Any]],
) -> None:
    for fig in gpu_path.values():
        assert fig["calib_batch_kernels_x_float"] <= 2


def test_gpu_path_computing_every_amax_makes_two_host_syncs_in_all(
    gpu_path: dict[str, dict[str, Any]],
) -> None:
    """max and mse (before: 30 / 30 and 80 / 80 on tiny_cnn and tiny_vit)."""
    for name in MODELS:
        fig = gpu_path[name]
        assert fig["calib_max_amax_syncs"] <= 2 and fig["calib_mse_amax_syncs"] <= 2, name


@pytest.mark.xfail(
    strict=True,
    reason="issue 48: on the GPU path the QAT backward adds 1.25 kernels per quantizer on the "
    "tiny CNN (forward 0.92; tiny ViT 1.58 forward, 0.35 backward): 3.4 / 3.2 before, when "
    "per-channel weights took the unfused torch path, computing their scale at every call",
)
def test_gpu_path_qat_adds_one_kernel_per_quantizer_forward_and_backward(
    gpu_path: dict[str, dict[str, Any]],
) -> None:
    for fig in gpu_path.values():
        assert fig["qat_fwd_kernels_per_q"] <= 1
        assert fig["qat_bwd_kernels_per_q"] <= 1
