"""The GPU table of the engine-time model: what each GPU can compute and move per second.

Every figure is a vendor's public specification (docs/engine_time.md lists the sources): dense
peak throughput per precision (no structured sparsity), memory bandwidth, SM count, boost clock,
L2 size and compute capability. A precision missing from ``tflops`` has no kernels on that GPU
(FP8 before Ada, TF32 before Ampere): a layer asking for it is refused.

``fp16`` is the rate of TensorRT's FP16 kernels, which accumulate in FP16
(``..._f16f16_f16f16_f16`` tactics); on GeForce/TITAN parts that is the full tensor-core rate,
twice the FP32-accumulate figure NVIDIA also lists. ``fp32`` is the CUDA-core rate; FP32 layers
of a TensorRT build run on TF32 tensor cores where the GPU has them (TensorRT enables TF32 by
default).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["GPU", "GPUS", "find_gpu", "gpu_names"]


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

    def peak(self, precision: str) -> float | None:
        """Dense peak TFLOPS of ``precision`` on this GPU, ``None`` when it has no such kernels."""
        return self.tflops.get(precision)


GPUS: tuple[GPU, ...] = (
    GPU("a100-sxm4-40gb", "NVIDIA A100 SXM4 40 GB", (8, 0), 108, 1410,
        {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0, "int8": 624.0},
        1555.0, 40.0, "NVIDIA A100 datasheet", ("a100", "a100-40gb", "a100-sxm")),
    GPU("titan-rtx", "NVIDIA TITAN RTX", (7, 5), 72, 1770,
        {"fp32": 16.3, "fp16": 130.5, "int8": 261.0},
        672.0, 6.0, "NVIDIA TITAN RTX / Turing architecture whitepaper", ("titanrtx",)),
    GPU("rtx3090", "NVIDIA GeForce RTX 3090", (8, 6), 82, 1695,
        {"fp32": 35.6, "tf32": 35.6, "fp16": 142.0, "bf16": 142.0, "int8": 284.0},
        936.0, 6.0, "NVIDIA Ampere GA102 whitepaper", ("rtx-3090", "geforce-rtx-3090")),
    GPU("rtx3060-laptop", "NVIDIA GeForce RTX 3060 Laptop GPU", (8, 6), 30, 1425,
        {"fp32": 10.9, "tf32": 10.9, "fp16": 43.7, "bf16": 43.7, "int8": 87.5},
        336.0, 3.0, "NVIDIA GeForce RTX 3060 Laptop specifications, GA106", ("rtx3060laptop",)),
)  # fmt: skip


def _key(text: str) -> str:
    return "".join(c for c in text.lower() if c.isalnum())


def gpu_names() -> list[str]:
    """The canonical names, in table order."""
    return [g.name for g in GPUS]


def find_gpu(name: str | GPU) -> GPU:
    """The GPU named ``name`` (canonical name or alias, case-insensitive, ``-``/``_``/spaces ignored).

    Raises:
        ValueError: no GPU of the table has that name (the message lists them).

    Example:
        >>> find_gpu("A100").name, find_gpu("rtx_3090").name
        ('a100-sxm4-40gb', 'rtx3090')
    """
    if isinstance(name, GPU):
        return name
    key = _key(str(name))
    for gpu in GPUS:
        if key in {_key(gpu.name), *(_key(a) for a in gpu.aliases)}:
            return gpu
    raise ValueError(
        f"unknown GPU {name!r}; known: {', '.join(gpu_names())} (qdq engine time --list-gpus)"
    )
