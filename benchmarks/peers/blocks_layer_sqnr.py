"""qdq and ModelOpt NVFP4/MXFP8, layer by layer (issue 60), on the ViT and Swin rows.

Two questions, on the same evaluation samples:

1. **The numerics, on the same tensor.** Each ``nn.Linear`` whose ``forward`` runs: its FP32
   input quantized by ModelOpt's own ``NVFP4QTensor``/``MXFP8QTensor`` (the CPU stand-in of
   ``blocks_peers.py``, which is ModelOpt's arithmetic, with its calibrated per-tensor amax) and by
   qdq's ``block_fake_quant`` (with qdq's): how many values differ.
2. **Each tool's model.** The Linear's output SQNR against FP32's in qdq's plan on ModelOpt's
   ``nn.Linear`` layer set (``benchmarks/blocks_layer_set.py``) and in ModelOpt's fake-quantized
   model (its default config, its patch convolution left float as its export leaves it:
   :data:`EXPORT_FLOAT`), and the SQNR of the input the Linear received. ModelOpt's model
   quantizes more than its Linears: its ``QuantMultiheadAttention`` (ViT) and the Swin attention's
   tensors, which its export does not carry as block GEMMs; the input column shows it (qdq's
   first MLP reads an exact input, ModelOpt's a quantized one). Column 2 is therefore not like
   for like; column 1 is.

Why: on rows whose FP32 logits are nearly tied (random weights: the Swin row's median top-1/top-2
margin is 0.11 of a logit standard deviation), top-1 agreement follows the last layer's noise more
than the model's accuracy.

Run in the peer environment, with qdq importable:
``PYTHONPATH=src /tmp/peers/bin/python benchmarks/peers/blocks_layer_sqnr.py WORK [--row swin]
[--format nvfp4]`` with ``WORK`` a ``blocks.py`` work directory of the row (``calib.npz``,
``eval.npz``; the first 32 evaluation samples are used). Prints one line per layer and a
summary; asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from blocks_peers import CONFIGS, stand_in  # noqa: E402

import fp8_models  # noqa: E402
from blocks_layer_set import MODELOPT_FLOAT  # noqa: E402

#: the modules ModelOpt quantizes in torch but its ONNX export leaves float (the patch
#: convolutions: no block-quantized convolution exports), disabled here as in the export
EXPORT_FLOAT = {"vit": ("conv_proj",), "swin": ("features.0.0",)}


def _sqnr(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float(10 * torch.log10((ref**2).sum() / ((y - ref) ** 2).sum().clamp_min(1e-30)))


def _outputs(
    model: torch.nn.Module, x: torch.Tensor, names: list[str]
) -> tuple[torch.Tensor, dict]:
    """The model's output on ``x`` and each named Linear's (input, output) as it ran; the input
    as the Linear receives it, before its own input quantizer (both tools quantize inside the
    layer's ``forward``)."""
    seen: dict[str, list[torch.Tensor]] = {n: [torch.empty(0), torch.empty(0)] for n in names}
    modules = dict(model.named_modules())

    def keep(n: str, k: int, t: torch.Tensor) -> None:
        seen[n][k] = t.detach().clone()

    hooks = []
    for n in names:
        hooks.append(modules[n].register_forward_pre_hook(lambda _m, i, n=n: keep(n, 0, i[0])))
        hooks.append(modules[n].register_forward_hook(lambda _m, _i, o, n=n: keep(n, 1, o)))
    with torch.no_grad():
        out = model(x)
    for h in hooks:
        h.remove()
    return out, seen


def _same_tensor(fmt: str, names: list[str], r: dict, qdq_modules: dict, mo_modules: dict
                 ) -> tuple[int, int, int, int]:  # fmt: skip
    """``(values that differ, values, layers whose calibrated amax differ, layers)`` when each
    Linear's FP32 input is quantized by ModelOpt's arithmetic and by qdq's with one amax
    (ModelOpt's calibrated one; MXFP8 has none). Layers whose reduction is not whole blocks are
    left out (qdq refuses them; ModelOpt pads)."""
    from blocks_peers import _stand_in_values

    from qdq.quant.blocks import MXFP8, NVFP4, block_fake_quant

    differ = total = amax_differ = layers = 0
    block = 16 if fmt == "nvfp4" else 32
    for n in names:
        x = r[n][0].float()
        if x.shape[-1] % block:
            continue
        layers += 1
        if fmt == "nvfp4":
            amax = mo_modules[n].input_quantizer.amax.float()
            mine = qdq_modules[f"{n}.input_quantizer"].amax
            amax_differ += int(not torch.equal(amax.reshape(()), mine.float().reshape(())))
            y_mo = _stand_in_values(x, 16, amax, (2, 1), (4, 3))
            y_q = block_fake_quant(x, NVFP4, amax.reshape(()), -1)
        else:
            y_mo = _stand_in_values(x, 32, None, (4, 3), (8, 0))
            y_q = block_fake_quant(x, MXFP8, None, -1)
        differ += int((y_mo != y_q).sum())
        total += y_q.numel()
    return differ, total, amax_differ, layers


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("work", type=Path)
    p.add_argument("--row", default="swin", choices=sorted(MODELOPT_FLOAT))
    p.add_argument("--format", default="nvfp4", choices=("nvfp4", "mxfp8"))
    a = p.parse_args()
    import modelopt.torch.quantization as mtq

    import qdq
    from qdq.config import QuantConfig

    stand_in()
    cal = torch.from_numpy(next(iter(np.load(a.work / "calib.npz").values())))
    ev = torch.from_numpy(next(iter(np.load(a.work / "eval.npz").values())))[:32]
    batches = [cal[i : i + 8] for i in range(0, len(cal), 8)]
    fp = fp8_models.build(fp8_models.ROWS[a.row])
    probe: dict[str, int] = {}
    hooks = [m.register_forward_hook(lambda *_, n=n: probe.__setitem__(n, 1))
             for n, m in fp.named_modules() if isinstance(m, torch.nn.Linear)]  # fmt: skip
    with torch.no_grad():
        fp(ev[:1])
    for h in hooks:
        h.remove()
    names = [n for n, _ in fp.named_modules() if n in probe]  # the Linears whose forward runs
    ref, r = _outputs(fp, ev, names)
    q = qdq.prepare(fp, (cal[:1],), QuantConfig(format=a.format, overrides=MODELOPT_FLOAT[a.row]))
    qdq.calibrate(q, batches, show_progress=False)
    qo, qs = _outputs(q, ev, names)
    mo = mtq.quantize(fp8_models.build(fp8_models.ROWS[a.row]), getattr(mtq, CONFIGS[a.format]),
                      lambda m: [m(b) for b in batches])  # fmt: skip
    modules = dict(mo.named_modules())
    for name in EXPORT_FLOAT[a.row]:
        for attr in ("input_quantizer", "weight_quantizer"):
            getattr(modules[name], attr).disable()
    mo_out, ms = _outputs(mo, ev, names)
    same = _same_tensor(a.format, names, r, dict(q.named_modules()), modules)
    print(f"{a.row} {a.format}, each Linear's FP32 input quantized by both with ModelOpt's amax: "
          f"{same[0]} of {same[1]} values differ ({same[3]} layers; their calibrated amax differ "
          f"on {same[2]})")  # fmt: skip
    print(f"{a.row} {a.format}: output SQNR of each Linear vs FP32 (dB), {len(ev)} samples")
    print("(and of the input it read, before its own input quantizer)")
    print(f"{'layer':32s} {'qdq':>7s} {'ModelOpt':>9s}   {'in: qdq':>8s} {'ModelOpt':>9s}")
    diffs = []
    for n in names:
        sq, sm = _sqnr(qs[n][1], r[n][1]), _sqnr(ms[n][1], r[n][1])
        iq, im = _sqnr(qs[n][0], r[n][0]), _sqnr(ms[n][0], r[n][0])
        diffs.append(sq - sm)
        print(f"{n:32s} {sq:7.2f} {sm:9.2f}   {iq:8.2f} {im:9.2f}")
    ahead = sum(d >= 0 for d in diffs)
    print(f"qdq at or above ModelOpt on {ahead} of {len(diffs)} layers; mean difference "
          f"{np.mean(diffs):+.2f} dB (min {min(diffs):+.2f}, max {max(diffs):+.2f})")  # fmt: skip
    for label, out in (("qdq", qo), ("ModelOpt", mo_out)):
        top1 = (out.argmax(1) == ref.argmax(1)).float().mean().item()
        cos = torch.nn.functional.cosine_similarity(out, ref, dim=1).mean().item()
        print(f"{label:9s} output: top-1 agreement {top1:.4f}, cosine {cos:.5f}")
    top2 = ref.topk(2, dim=1).values
    margin = ((top2[:, 0] - top2[:, 1]) / ref.std(1)).median().item()
    print(f"FP32 median top-1/top-2 logit margin: {margin:.3f} of a logit standard deviation")


if __name__ == "__main__":
    main()
