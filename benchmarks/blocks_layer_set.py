"""qdq's block formats on ModelOpt's layer set (issue 60): the ``vit`` and ``swin`` rows of
``blocks.py`` (and the ConvNet rows ``efficientnet-lite0`` and ``crepe-tiny``, scored by their
own metric too) like for like with ModelOpt's default configs, which quantize only the ``nn.Linear``
modules whose ``forward`` runs. On the ViT that is the MLPs and the head (25 GEMMs): torchvision's
``MultiheadAttention`` projections, the attention products and the patch convolution stay float.
On the Swin it is the MLPs, the patch-merging reductions and the head (28 GEMMs): its window
attention calls ``F.linear`` with the ``qkv``/``proj`` weights, so those, the attention products
and the patch convolution (ModelOpt's export leaves it float) stay float. qdq's plans quantize
those too, so ``blocks.py``'s table compares more quantized layers against fewer; this script
excludes them (``Override(exclude=True)``) and scores qdq's torch fake-quant model (equal to its
export in ONNX Runtime, ``blocks.py``) on the same samples.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/blocks_layer_set.py WORK [--row swin]
[FORMAT ...]`` with ``WORK`` a ``blocks.py`` work directory of the row (its ``calib.npz`` /
``eval.npz``; row default ``vit``, formats default ``mxfp8 nvfp4 int4w``). Prints top-1 agreement
and mean cosine with FP32; asserts nothing.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

import qdq
from qdq.config import Override, QuantConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fp8_models
from fp8 import scored

#: per row, what ModelOpt's default configs leave float (they quantize the nn.Linear modules
#: whose forward runs)
MODELOPT_FLOAT = {
    "vit": (
        Override(op="matmul", exclude=True),  # attention products
        Override(module_type=torch.nn.MultiheadAttention, exclude=True),  # in/out projections
        Override(regex="conv_proj", exclude=True),  # the patch convolution
    ),
    "swin": (
        Override(op="matmul", exclude=True),  # attention products
        Override(regex=r"\.attn\.(qkv|proj)$", exclude=True),  # called through F.linear
        Override(regex=r"^features\.0\.0$", exclude=True),  # the patch convolution
    ),
    # the ConvNets: ModelOpt's NVFP4/MXFP8 configs quantize their classifier Linear alone (its
    # exports leave every convolution float: EfficientNet-Lite0 3 of 103 quantizers, CREPE 6 of
    # 7 weighted layers float)
    "efficientnet-lite0": (Override(op="conv", exclude=True),),
    "crepe-tiny": (Override(op="conv", exclude=True),),
}


def main() -> None:
    args = sys.argv[1:]
    row = "vit"
    if "--row" in args:
        k = args.index("--row")
        row = args[k + 1]
        del args[k : k + 2]
    if row not in MODELOPT_FLOAT:
        sys.exit(f"--row {row!r}: one of {', '.join(MODELOPT_FLOAT)}")
    work = Path(args[0])
    formats = args[1:] or ["mxfp8", "nvfp4", "int4w"]
    cal = torch.from_numpy(next(iter(np.load(work / "calib.npz").values())))
    ev = torch.from_numpy(next(iter(np.load(work / "eval.npz").values())))
    model = fp8_models.build(fp8_models.ROWS[row])

    def outputs(m: torch.nn.Module) -> torch.Tensor:
        with torch.no_grad():
            return torch.cat([m(ev[i : i + 32]) for i in range(0, len(ev), 32)])

    ref = outputs(model)
    meta = json.loads((work / "meta.json").read_text()) if row in fp8_models.ZOO else None
    print("format  quantizers                     top-1    cosine   (vs FP32, eval samples)"
          + (f"   {meta['metric_name']}" if meta else ""))  # fmt: skip
    for fmt in formats:
        prepared = qdq.prepare(
            model, (cal[:1],), QuantConfig(format=fmt, overrides=MODELOPT_FLOAT[row])
        )
        qdq.calibrate(
            prepared, [cal[i : i + 8] for i in range(0, len(cal), 8)], show_progress=False
        )
        if fmt == "int4w":  # as qdq quantize does (stage int4_clip)
            from qdq.ptq.awq_model import awq_clip

            awq_clip(
                prepared, [cal[i : i + 8] for i in range(0, len(cal), 8)], num_batches=2, sweeps=0
            )
        counts: dict[str, int] = {}
        for q in qdq.quantizers_of(prepared).values():
            counts[q.spec.format] = counts.get(q.spec.format, 0) + 1
        out = outputs(prepared)
        cos = torch.nn.functional.cosine_similarity(out, ref, dim=1).mean().item()
        top1 = (out.argmax(1) == ref.argmax(1)).float().mean().item()
        line = f"{fmt:7s} {counts!s:30s} {top1:.4f}   {cos:.5f}"
        if meta is not None:  # the zoo row's own metric, scored as blocks.py scores every cell
            with tempfile.TemporaryDirectory() as tmp:
                np.savez(Path(tmp) / "out.npz", out0=out.numpy())
                line += f"   {scored(work, meta, Path(tmp) / 'out.npz')['metric']:.4f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
