"""The engine-time model's GPU table (qdq.lint.speed.gpus) and the targets that name its GPUs."""

from __future__ import annotations

import re

import pytest

from qdq.lint import parse_target
from qdq.lint.speed.cost import CostLayer, UnsupportedPrecisionError, layer_time
from qdq.lint.speed.gpus import (
    GPUS,
    PRECISIONS,
    REPRESENTATIVES,
    _key,
    find_gpu,
    gpu_for_target,
    gpu_names,
    list_gpus_table,
)
from qdq.lint.target import GPUS as GENERATIONS

#: the GPUs and spellings issue 58 asks for, and the device names trtexec/nvidia-smi print
SPELLINGS = {
    "a100": "a100-sxm4-40gb", "A100-80GB-PCIe": "a100-pcie-80gb", "a100_pcie": "a100-pcie-40gb",
    "a100-sxm4-80gb": "a100-sxm4-80gb", "h100-sxm": "h100-sxm", "H100": "h100-sxm",
    "h100-pcie": "h100-pcie", "h200": "h200-sxm", "B200": "b200", "l4": "l4", "L40S": "l40s",
    "t4": "t4", "v100": "v100-sxm2", "jetson-agx-orin": "jetson-agx-orin-64gb",
    "rtx3060-laptop": "rtx3060-laptop", "RTX 3080": "rtx3080", "rtx3090": "rtx3090",
    "rtx_4090": "rtx4090", "titan-rtx": "titan-rtx", "TITAN RTX": "titan-rtx",
    "NVIDIA GeForce RTX 3060 Laptop GPU": "rtx3060-laptop", "NVIDIA GeForce RTX 3090": "rtx3090",
    "NVIDIA A100-SXM4-40GB": "a100-sxm4-40gb", "NVIDIA A100 80GB PCIe": "a100-pcie-80gb",
    "NVIDIA H100 80GB HBM3": "h100-sxm", "NVIDIA H100 PCIe": "h100-pcie", "Tesla T4": "t4",
    "Tesla V100-SXM2-16GB": "v100-sxm2",
}  # fmt: skip


@pytest.mark.parametrize(("spelling", "name"), SPELLINGS.items())
def test_common_spellings_resolve(spelling: str, name: str) -> None:
    assert find_gpu(spelling).name == name


def test_every_name_and_alias_resolves_to_its_gpu_and_no_two_gpus_share_one() -> None:
    owner: dict[str, str] = {}
    for gpu in GPUS:
        assert find_gpu(gpu.name) is gpu and find_gpu(gpu.label) is gpu
        for alias in gpu.aliases:
            assert find_gpu(alias) is gpu, alias
            assert find_gpu(alias.upper().replace("-", " ")) is gpu, alias
        keys = [_key(n) for n in (gpu.name, *gpu.aliases)]
        assert len(set(keys)) == len(keys), f"{gpu.name}: an alias repeats a name: {keys}"
        for key in keys:
            assert owner.setdefault(key, gpu.name) == gpu.name, f"{key} names two GPUs"
    assert len(gpu_names()) == len(set(gpu_names())) == len(GPUS) >= 18
    # a generation or sm form is never a model name (a target's generation keeps its meaning)
    assert not set(owner) & {_key(g) for g in GENERATIONS}
    assert not any(k.startswith("sm") and k[2:].isdigit() for k in owner)


def test_the_fitted_gpus_keep_their_names_and_figures() -> None:
    a100 = find_gpu("a100-sxm4-40gb")
    assert (a100.sms, a100.boost_mhz, a100.memory_gbs, a100.l2_mb) == (108, 1410, 1555.0, 40.0)
    assert dict(a100.tflops) == {"fp32": 19.5, "tf32": 156, "fp16": 312, "bf16": 312, "int8": 624}
    titan = find_gpu("titan-rtx")
    assert dict(titan.tflops) == {"fp32": 16.3, "fp16": 130.5, "int8": 261.0}
    assert (titan.sms, titan.memory_gbs) == (72, 672.0)
    rtx3090, laptop = find_gpu("rtx3090"), find_gpu("rtx3060-laptop")
    assert (rtx3090.tflops["fp16"], rtx3090.tflops["int8"], rtx3090.memory_gbs) == (142, 284, 936)
    assert (laptop.sms, laptop.tflops["fp16"], laptop.memory_gbs) == (30, 43.7, 336.0)


def test_unknown_gpu_is_refused_with_the_list() -> None:
    with pytest.raises(ValueError, match=r"unknown GPU 'a1000'.*a100-sxm4-40gb.*--list-gpus"):
        find_gpu("a1000")
    with pytest.raises(ValueError, match="unknown GPU"):
        find_gpu("NVIDIA")


@pytest.mark.parametrize("gpu", GPUS, ids=lambda g: g.name)
def test_figures_are_positive_dense_and_consistent(gpu) -> None:
    cc = gpu.compute_capability
    assert set(gpu.tflops) <= set(PRECISIONS) and "fp32" in gpu.tflops and "fp16" in gpu.tflops
    assert all(v > 0 for v in gpu.tflops.values())
    assert gpu.sms > 0 and gpu.boost_mhz > 0 and gpu.memory_gbs > 0 and gpu.l2_mb > 0
    assert gpu.source
    # the CUDA-core rate is SMs x FP32 lanes x 2 x clock (64 lanes per SM on GV100, TU10x, GA100)
    lanes = 64 if cc in {(7, 0), (7, 5), (8, 0)} else 128
    assert gpu.tflops["fp32"] == pytest.approx(gpu.sms * lanes * 2 * gpu.boost_mhz / 1e6, rel=0.02)
    # precisions exist exactly from the generation that has kernels for them
    assert ("tf32" in gpu.tflops) == ("bf16" in gpu.tflops) == (cc >= (8, 0))
    assert ("fp8" in gpu.tflops) == (cc >= (8, 9))
    assert ("fp4" in gpu.tflops) == (cc >= (10, 0))
    peak = gpu.tflops
    assert peak["fp16"] > peak["fp32"] and peak.get("tf32", 0) <= peak["fp16"]
    assert peak.get("bf16", 0) <= peak["fp16"]
    if gpu.tensor_cores("int8"):  # dense INT8 is twice dense FP16 (a sparse figure would be 4x)
        assert 1.9 <= peak["int8"] / peak["fp16"] <= 2.1
    else:
        assert gpu.name == "v100-sxm2" and peak["int8"] == pytest.approx(4 * peak["fp32"], 0.01)
    if "fp8" in peak:
        assert peak["fp16"] <= peak["fp8"] <= peak["int8"]
    if "fp4" in peak:
        assert peak["fp4"] == pytest.approx(2 * peak["fp8"])


def test_an_fp8_layer_on_a_gpu_without_fp8_is_refused_naming_the_gpu() -> None:
    layer = CostLayer("conv1", "conv", "fp8", macs=1e9, read_bytes=1e6, write_bytes=1e6,
                      weight_bytes=4e4, gemm=(4096, 64, 576))  # fmt: skip
    for name in ("a100", "rtx3090", "t4", "jetson-agx-orin"):
        with pytest.raises(
            UnsupportedPrecisionError, match=rf"conv1.*{re.escape(find_gpu(name).label)}.*FP8"
        ):
            layer_time(layer, find_gpu(name))
    assert layer_time(layer, find_gpu("h100")).ms > 0
    fp4 = CostLayer("fc", "gemm", "fp4", macs=1e9, gemm=(1024, 1024, 1024))
    with pytest.raises(UnsupportedPrecisionError, match="H100.*FP4"):
        layer_time(fp4, find_gpu("h100"))
    assert layer_time(fp4, find_gpu("b200")).ms > 0


@pytest.mark.parametrize(
    ("target", "name", "capability"),
    [
        ("trt10-a100", "a100-sxm4-40gb", (8, 0)),
        ("trt10.5-rtx3090", "rtx3090", (8, 6)),
        ("trt10-l4", "l4", (8, 9)),
        ("trt10.12-h100-sxm", "h100-sxm", (9, 0)),
        ("trt10-a100-80gb-pcie", "a100-pcie-80gb", (8, 0)),
        ("trt10-jetson-agx-orin", "jetson-agx-orin-64gb", (8, 7)),
        ("TRT10-RTX3060-Laptop", "rtx3060-laptop", (8, 6)),
        ("trt8.6-titan-rtx", "titan-rtx", (7, 5)),
        ("trt10-b200", "b200", (10, 0)),
    ],
)
def test_targets_name_gpu_models(target: str, name: str, capability: tuple[int, int]) -> None:
    t = parse_target(target)
    assert (t.gpu, t.compute_capability) == (name, capability)
    assert t.gpu_model is find_gpu(name)
    assert gpu_for_target(t) == (find_gpu(name), "")
    assert ("fp8" in t.flags) == (capability >= (8, 9))  # FP8 flag as for the generation


@pytest.mark.parametrize(
    ("target", "name", "kind"),
    [
        ("trt10-hopper", "h100-sxm", "a generation"),
        ("trt10-volta", "v100-sxm2", "a generation"),
        ("trt10-turing", "t4", "a generation"),
        ("trt10-ampere", "a100-sxm4-40gb", "a generation"),
        ("trt10-orin", "jetson-agx-orin-64gb", "a generation"),
        ("trt10.12-ada", "l40s", "a generation"),
        ("trt10-blackwell", "b200", "a generation"),
        ("trt10-sm86", "rtx3090", "a compute capability"),
        ("trt10-sm_89", "l40s", "a compute capability"),
        ("trt10-sm8.0", "a100-sxm4-40gb", "a compute capability"),
        ("trt10-sm100", "b200", "a compute capability"),
    ],
)
def test_generations_and_sm_forms_time_a_representative(target: str, name: str, kind: str) -> None:
    t = parse_target(target)
    assert t.gpu_model is None
    gpu, note = gpu_for_target(t)
    assert gpu.name == name and gpu.compute_capability == t.compute_capability
    assert note.startswith(f"{t.label} names {kind}, not a GPU: timing {gpu.label} ({name})")
    assert REPRESENTATIVES[gpu.compute_capability] == name


def test_targets_without_a_gpu_to_time_are_refused() -> None:
    with pytest.raises(ValueError, match=r"'trt10' names no GPU.*--gpu.*--list-gpus"):
        gpu_for_target(parse_target("trt10"))
    with pytest.raises(ValueError, match=r"trt10-sm120: no GPU of the table has .* 12\.0.*--gpu"):
        gpu_for_target(parse_target("trt10-sm120"))
    with pytest.raises(ValueError, match=r"unknown GPU 'a1000'.*ampere.*sm89.*--list-gpus"):
        parse_target("trt10-a1000")


def test_gpu_table_text_lists_every_gpu_with_its_figures() -> None:
    lines = list_gpus_table().splitlines()
    assert lines[0].split()[:4] == ["name", "cc", "SMs", "MHz"]
    rows = {line.split()[0]: line for line in lines[1:-1]}
    assert list(rows) == gpu_names()
    at = lines[0].index("aliases")  # fixed width: every L2 figure ends two spaces before it
    assert all(line[at - 3] != " " and line[at - 2 : at] == "  " for line in lines[1:-1])
    assert rows["a100-sxm4-40gb"].split()[1:10] == [
        "8.0", "108", "1410", "19.5", "156", "312", "312", "624", "-",
    ]  # fmt: skip
    assert "a100-80gb-pcie" in rows["a100-pcie-80gb"] and "62.8*" in rows["v100-sxm2"]
    assert "docs/engine_time.md" in lines[-1]
