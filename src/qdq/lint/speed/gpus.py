"""The GPU table of the engine-time model: what each GPU can compute and move per second.

Every figure is a vendor's public specification (docs/engine_time.md lists the sources): dense
peak throughput per precision (no structured sparsity: the datasheets' headline figures with
sparsity are halved), memory bandwidth, SM count, boost clock, L2 size and compute capability. A
precision missing from ``tflops`` has no kernels on that GPU (TF32 and BF16 before Ampere, FP8
before Ada, FP4 before Blackwell): a layer asking for it is refused.

``fp16`` is the rate of TensorRT's FP16 kernels, which accumulate in FP16
(``..._f16f16_f16f16_f16`` tactics); on GeForce/TITAN parts that is the full tensor-core rate,
twice the FP32-accumulate figure NVIDIA also lists. ``bf16`` always accumulates in FP32 (half the
``fp16`` rate on GeForce parts); ``fp8`` on GeForce Ada is the FP32-accumulate rate (FP8 GEMMs
accumulate in FP32). ``fp32`` is the CUDA-core rate; FP32 layers of a TensorRT build run on TF32
tensor cores where the GPU has them (TensorRT enables TF32 by default). ``cuda_core`` names the
other precisions a GPU runs without tensor cores (the V100's INT8, DP4A at 4x the FP32 rate).

Names: ``find_gpu`` takes a canonical name, an alias or the device name trtexec and nvidia-smi
print (``"NVIDIA A100-SXM4-40GB"``), case-insensitively, ignoring ``-``/``_``/spaces and a leading
``NVIDIA``/``GeForce``/``Tesla``. ``a100`` is the SXM4 40 GB part, ``h100`` the SXM part.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


class TargetLike(Protocol):
    """What :func:`gpu_for_target` reads of a :class:`qdq.lint.target.Target` (which imports
    this module: the dependency runs one way)."""

    @property
    def label(self) -> str: ...

    @property
    def gpu(self) -> str | None: ...

    @property
    def compute_capability(self) -> tuple[int, int] | None: ...


__all__ = [
    "GPU",
    "GPUS",
    "PRECISIONS",
    "REPRESENTATIVES",
    "find_gpu",
    "gpu_for_target",
    "gpu_names",
    "list_gpus_table",
]

#: the precisions of ``GPU.tflops``, in the table's column order
PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "int8", "fp8", "fp4")


@dataclass(frozen=True)
class GPU:
    """One GPU of the table.

    Attributes:
        name: the canonical name (``"a100-sxm4-40gb"``).
        label: the marketing name (``"NVIDIA A100 SXM4 40 GB"``).
        aliases: other accepted spellings (matched case-insensitively, ignoring ``-``/``_``/spaces).
        compute_capability: ``(major, minor)``.
        sms: streaming multiprocessors.
        boost_mhz: boost clock.
        tflops: dense peak TFLOPS/TOPS per precision (``fp32`` CUDA cores; ``tf32``, ``fp16``,
            ``bf16``, ``int8``, ``fp8``, ``fp4`` tensor cores).
        memory_gbs: DRAM bandwidth in GB/s.
        l2_mb: L2 cache in MB.
        source: where the figures come from.
        cuda_core: precisions besides ``fp32`` whose figure is a CUDA-core rate (no tensor cores
            for them: the V100's INT8).
    """

    name: str
    label: str
    compute_capability: tuple[int, int]
    sms: int
    boost_mhz: int
    tflops: Mapping[str, float]
    memory_gbs: float
    l2_mb: float
    source: str
    aliases: tuple[str, ...] = field(default=())
    cuda_core: tuple[str, ...] = field(default=())

    def peak(self, precision: str) -> float | None:
        """Dense peak TFLOPS of ``precision`` on this GPU, ``None`` when it has no such kernels."""
        return self.tflops.get(precision)

    def tensor_cores(self, precision: str) -> bool:
        """Whether ``precision`` runs on tensor cores on this GPU."""
        return precision != "fp32" and precision in self.tflops and precision not in self.cuda_core

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict."""
        return {
            "name": self.name,
            "label": self.label,
            "aliases": list(self.aliases),
            "compute_capability": ".".join(map(str, self.compute_capability)),
            "sms": self.sms,
            "boost_mhz": self.boost_mhz,
            "tflops": dict(self.tflops),
            "memory_gbs": self.memory_gbs,
            "l2_mb": self.l2_mb,
            "source": self.source,
        }


_A100 = {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0, "int8": 624.0}
_H100_SXM = {"fp32": 67.0, "tf32": 494.5, "fp16": 989.5, "bf16": 989.5, "int8": 1979.0,
             "fp8": 1979.0}  # fmt: skip
_A100_SRC = "NVIDIA A100 Tensor Core GPU datasheet; NVIDIA A100 (Ampere GA100) whitepaper"
_H100_SRC = "NVIDIA H100 Tensor Core GPU datasheet; NVIDIA H100 (Hopper) whitepaper"
_GA102 = "NVIDIA Ampere GA102 GPU architecture whitepaper"

# figures: docs/engine_time.md (the GPU table) cites each one
GPUS: tuple[GPU, ...] = (
    GPU("a100-sxm4-40gb", "NVIDIA A100 SXM4 40 GB", (8, 0), 108, 1410, _A100, 1555.0, 40.0,
        _A100_SRC, ("a100", "a100-40gb", "a100-sxm", "a100-sxm4", "a100-sxm-40gb",
                    "a100-40gb-sxm")),
    GPU("a100-sxm4-80gb", "NVIDIA A100 SXM4 80 GB", (8, 0), 108, 1410, _A100, 2039.0, 40.0,
        _A100_SRC, ("a100-80gb", "a100-sxm-80gb", "a100-80gb-sxm", "a100-80gb-sxm4")),
    GPU("a100-pcie-40gb", "NVIDIA A100 PCIe 40 GB", (8, 0), 108, 1410, _A100, 1555.0, 40.0,
        _A100_SRC, ("a100-pcie", "a100-40gb-pcie")),
    GPU("a100-pcie-80gb", "NVIDIA A100 PCIe 80 GB", (8, 0), 108, 1410, _A100, 1935.0, 40.0,
        _A100_SRC, ("a100-80gb-pcie",)),
    GPU("h100-sxm", "NVIDIA H100 SXM5 80 GB", (9, 0), 132, 1980, _H100_SXM, 3350.0, 50.0,
        _H100_SRC, ("h100", "h100-sxm5", "h100-sxm5-80gb", "h100-80gb-hbm3")),
    GPU("h100-pcie", "NVIDIA H100 PCIe 80 GB", (9, 0), 114, 1755,
        {"fp32": 51.0, "tf32": 378.0, "fp16": 756.5, "bf16": 756.5, "int8": 1513.0,
         "fp8": 1513.0},
        2000.0, 50.0, _H100_SRC, ("h100-pcie-80gb",)),
    GPU("h200-sxm", "NVIDIA H200 SXM 141 GB", (9, 0), 132, 1980, _H100_SXM, 4800.0, 50.0,
        "NVIDIA H200 Tensor Core GPU datasheet (SMs, clock, L2: the H100 SXM's GH100)",
        ("h200", "h200-141gb", "h200-sxm-141gb")),
    GPU("b200", "NVIDIA B200 (HGX B200, 1000 W)", (10, 0), 148, 1980,
        {"fp32": 75.0, "tf32": 1100.0, "fp16": 2250.0, "bf16": 2250.0, "int8": 4500.0,
         "fp8": 4500.0, "fp4": 9000.0},
        7700.0, 126.0,
        "NVIDIA HGX B200 specifications (per GPU); SMs and L2 not published by NVIDIA: 148 SMs "
        "and 126 MB as CUDA reports them (Chips and Cheese, B200), clock from FP32 / (SMs x 256)",
        ("b200-sxm", "hgx-b200", "b200-180gb")),
    GPU("l4", "NVIDIA L4", (8, 9), 58, 2040,
        {"fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0, "int8": 242.5, "fp8": 242.5},
        300.0, 48.0,
        "NVIDIA L4 Tensor Core GPU datasheet; SMs from FP32 / (256 x clock); L2: NVIDIA Ada "
        "(AD104) architecture", ()),
    GPU("l40s", "NVIDIA L40S", (8, 9), 142, 2520,
        {"fp32": 91.6, "tf32": 183.0, "fp16": 362.05, "bf16": 362.05, "int8": 733.0,
         "fp8": 733.0},
        864.0, 96.0, "NVIDIA L40S datasheet; L2: NVIDIA Ada (AD102) architecture whitepaper", ()),
    GPU("t4", "NVIDIA T4", (7, 5), 40, 1590, {"fp32": 8.1, "fp16": 65.0, "int8": 130.0},
        320.0, 4.0, "NVIDIA T4 Tensor Core GPU datasheet; NVIDIA Turing (TU104) whitepaper",
        ()),
    GPU("v100-sxm2", "NVIDIA V100 SXM2 (16/32 GB)", (7, 0), 80, 1530,
        {"fp32": 15.7, "fp16": 125.0, "int8": 62.8},
        900.0, 6.0,
        "NVIDIA V100 Tensor Core GPU datasheet; NVIDIA Volta (GV100) whitepaper; INT8 on CUDA "
        "cores (DP4A, 4x FP32; TensorRT support matrix: INT8 yes, INT8 tensor cores no)",
        ("v100", "v100-sxm2-16gb", "v100-sxm2-32gb", "v100-sxm"), cuda_core=("int8",)),
    GPU("jetson-agx-orin-64gb", "NVIDIA Jetson AGX Orin 64 GB", (8, 7), 16, 1300,
        {"fp32": 5.3, "tf32": 21.25, "fp16": 42.5, "bf16": 42.5, "int8": 85.0},
        204.8, 4.0,
        "NVIDIA Jetson AGX Orin series data sheet and technical brief (GPU: 170 sparse INT8 "
        "TOPS, 5.3 FP32 TFLOPS); TF32/BF16 at the GA100-class tensor cores' ratios",
        ("jetson-agx-orin", "agx-orin", "agx-orin-64gb", "orin-agx")),
    GPU("rtx3060-laptop", "NVIDIA GeForce RTX 3060 Laptop GPU", (8, 6), 30, 1425,
        {"fp32": 10.9, "tf32": 10.9, "fp16": 43.7, "bf16": 21.9, "int8": 87.5},
        336.0, 3.0,
        "NVIDIA GeForce RTX 3060 Laptop specifications (3840 CUDA cores, boost 1283-1703 MHz "
        "by TGP; GA106); rates per SM and clock from the " + _GA102, ()),
    GPU("rtx3080", "NVIDIA GeForce RTX 3080 (10 GB)", (8, 6), 68, 1710,
        {"fp32": 29.8, "tf32": 29.8, "fp16": 119.0, "bf16": 59.5, "int8": 238.0},
        760.0, 5.0, _GA102, ("rtx3080-10gb",)),
    GPU("rtx3090", "NVIDIA GeForce RTX 3090", (8, 6), 82, 1695,
        {"fp32": 35.6, "tf32": 35.6, "fp16": 142.0, "bf16": 71.0, "int8": 284.0},
        936.0, 6.0, _GA102, ()),
    GPU("rtx4090", "NVIDIA GeForce RTX 4090", (8, 9), 128, 2520,
        {"fp32": 82.6, "tf32": 82.6, "fp16": 330.3, "bf16": 165.2, "int8": 660.6,
         "fp8": 330.3},
        1008.0, 72.0, "NVIDIA Ada GPU architecture whitepaper (AD102)", ()),
    GPU("titan-rtx", "NVIDIA TITAN RTX", (7, 5), 72, 1770,
        {"fp32": 16.3, "fp16": 130.5, "int8": 261.0},
        672.0, 6.0, "NVIDIA Turing GPU architecture whitepaper (TITAN RTX, TU102)", ()),
)  # fmt: skip

#: the GPU timed for a target that names a generation or a compute capability, not a model
REPRESENTATIVES: dict[tuple[int, int], str] = {
    (7, 0): "v100-sxm2", (7, 5): "t4", (8, 0): "a100-sxm4-40gb", (8, 6): "rtx3090",
    (8, 7): "jetson-agx-orin-64gb", (8, 9): "l40s", (9, 0): "h100-sxm", (10, 0): "b200",
}  # fmt: skip

_PREFIXES = ("nvidia", "geforce", "tesla")


def _key(text: str) -> str:
    """``text`` lower-cased, letters and digits only, without a vendor prefix or ``GPU`` suffix."""
    key = "".join(c for c in text.lower() if c.isalnum())
    stripped = True
    while stripped:
        stripped = False
        for prefix in _PREFIXES:
            if key.startswith(prefix):
                key, stripped = key[len(prefix) :], True
    return key[:-3] if key.endswith("gpu") else key


def _index() -> dict[str, GPU]:
    index: dict[str, GPU] = {}
    for gpu in GPUS:
        for name in (gpu.name, gpu.label, *gpu.aliases):
            index.setdefault(_key(name), gpu)
    return index


_INDEX = _index()


def gpu_names() -> list[str]:
    """The canonical names, in table order."""
    return [g.name for g in GPUS]


def find_gpu(name: str | GPU) -> GPU:
    """The GPU named ``name`` (canonical name, alias or device name, case-insensitive,
    ``-``/``_``/spaces ignored).

    Raises:
        ValueError: no GPU of the table has that name (the message lists them).

    Example:
        >>> find_gpu("A100").name, find_gpu("rtx_3090").name, find_gpu("NVIDIA H100 PCIe").name
        ('a100-sxm4-40gb', 'rtx3090', 'h100-pcie')
    """
    if isinstance(name, GPU):
        return name
    gpu = _INDEX.get(_key(str(name)))
    if gpu is None:
        raise ValueError(
            f"unknown GPU {name!r}; known: {', '.join(gpu_names())} (qdq engine time --list-gpus)"
        )
    return gpu


def gpu_for_target(target: TargetLike) -> tuple[GPU, str]:
    """The GPU a linter target names, and a note: ``""`` when the target names a model
    (``trt10-a100``), else which GPU stands for the generation or compute capability it names.

    Raises:
        ValueError: the target names no GPU, or a compute capability no GPU of the table has.

    Example:
        >>> from qdq.lint.target import parse_target
        >>> gpu_for_target(parse_target("trt10.5-rtx3090"))[0].name
        'rtx3090'
        >>> gpu, note = gpu_for_target(parse_target("trt10-hopper"))
        >>> gpu.name, note.split(":")[0]
        ('h100-sxm', 'trt10-hopper names a generation, not a GPU')
    """
    label = target.label
    if target.gpu is None:
        raise ValueError(
            f"target {label!r} names no GPU: name one after the version ({label}-a100, "
            f"{label}-hopper, {label}-sm89) or give --gpu; qdq engine time --list-gpus lists them"
        )
    model = _INDEX.get(_key(target.gpu))
    if model is not None:
        return model, ""
    cc = target.compute_capability
    have = ".".join(map(str, cc)) if cc else "?"
    rep = REPRESENTATIVES.get(cc) if cc else None
    if rep is None:
        raise ValueError(
            f"{label}: no GPU of the table has compute capability {have}; name a model of it in "
            "the target or give --gpu (qdq engine time --list-gpus lists them)"
        )
    gpu = find_gpu(rep)
    kind = "a compute capability" if target.gpu.startswith("sm") else "a generation"
    note = (
        f"{label} names {kind}, not a GPU: timing {gpu.label} ({gpu.name}), its representative "
        f"for compute capability {have}; name a model for another (qdq engine time --list-gpus)"
    )
    return gpu, note


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def list_gpus_table() -> str:
    """Every GPU of the table as fixed-width text (``qdq engine time --list-gpus``).

    Example:
        >>> print(list_gpus_table().splitlines()[0])  # doctest: +NORMALIZE_WHITESPACE
        name cc SMs MHz fp32 tf32 fp16 bf16 int8 fp8 fp4 GB/s L2_MB aliases
    """
    head = ["name", "cc", "SMs", "MHz", *PRECISIONS, "GB/s", "L2_MB", "aliases"]
    rows = [
        [
            g.name,
            ".".join(map(str, g.compute_capability)),
            str(g.sms),
            str(g.boost_mhz),
            *(_figure(g.peak(p)) + ("*" if p in g.cuda_core else "") for p in PRECISIONS),
            f"{g.memory_gbs:g}",
            f"{g.l2_mb:g}",
            ", ".join(g.aliases) or "-",
        ]
        for g in GPUS
    ]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head) - 1)]
    lines = []
    for row in [head, *rows]:
        cells = [
            row[0].ljust(widths[0]),
            *(c.rjust(w) for c, w in zip(row[1:-1], widths[1:], strict=True)),
        ]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    lines.append(
        "dense peak TFLOPS/TOPS (no sparsity); fp16 at FP16 accumulate, bf16 at FP32 accumulate; "
        "- : no kernels; * : CUDA cores, no tensor cores; names match case-insensitively, "
        "ignoring -, _, spaces and a leading NVIDIA/GeForce/Tesla; sources: docs/engine_time.md"
    )
    return "\n".join(lines)
