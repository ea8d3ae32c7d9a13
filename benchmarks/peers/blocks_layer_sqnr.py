"""qdq and ModelOpt NVFP4/MXFP8, layer by layer (issue 60): each ``nn.Linear`` whose ``forward``
runs, its output's SQNR against FP32's on the same evaluation samples, in qdq's plan on ModelOpt's
layer set (``benchmarks/blocks_layer_set.py``) and in ModelOpt's fake-quantized model (its default
config; the CPU stand-in of ``blocks_peers.py`` for its CUDA-only block kernels, which is its own
``NVFP4QTensor``/``MXFP8QTensor`` arithmetic), its patch convolution left float as its export
leaves it (:data:`EXPORT_FLOAT`), so both quantize the same layers.

Why: on rows whose FP32 logits are nearly tied (random weights: the Swin row's median top-1/top-2
margin is 0.15 of a logit standard deviation), top-1 agreement follows the last layer's noise more
than the model's accuracy; the per-layer SQNR and the output cosine say which quantization is
closer to FP32.

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
    seen: dict[str, torch.Tensor] = {}
    modules = dict(model.named_modules())
    hooks = [modules[n].register_forward_hook(
        lambda _m, _i, o, n=n: seen.__setitem__(n, o.detach().clone())) for n in names]  # fmt: skip
    with torch.no_grad():
        out = model(x)
    for h in hooks:
        h.remove()
    return out, seen


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
