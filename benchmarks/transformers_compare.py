"""qdq against ModelOpt on Hugging Face encoders (issue 35): the same models, tokens and FP32 ONNX.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/transformers_compare.py [--rows bert_tiny ...]
[--peer-python /tmp/peers/bin/python] [--work DIR]``. Prints one table; asserts nothing.

Per row of ``tests/models/real.py`` (random weights from a config; the ``*_base`` rows are base
size at 128 tokens): 64 calibration and 128 evaluation samples of random tokens with a padded
tail per row (seeded), the same for every tool.

1. **FP32**: ``torch.onnx.export`` (TorchScript, opset 17, dynamic batch and sequence);
2. **qdq**: ``qdq.prepare`` + ``qdq.calibrate`` (``max``, and ``mse``, qdq's default) +
   ``qdq.export_onnx`` (dynamo, dynamic batch and sequence) at the default placement;
3. **ModelOpt** torch and ONNX (``benchmarks/peers/transformers_peers.py``, in the peer
   environment ``--peer-python``; without it those rows say ``not run``).

Every ONNX runs in ONNX Runtime on the CPU at ``ORT_ENABLE_BASIC`` (exact Q/DQ) on the evaluation
tokens: cosine of the logits with the FP32 ONNX (mean and minimum per sample) and top-1 agreement.
``qdq.lint.lint`` of each gives INT8 coverage (predicted INT8 weighted layers / weighted layers,
attention MatMuls INT8 / attention MatMuls), the verdict and its warning rules.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path.insert(0, str(TESTS))

import qdq  # noqa: E402
from models.real import BENCH_ARCHS  # noqa: E402

ROWS = ("bert_tiny", "distilbert_tiny", "roberta_tiny", "deberta_v2_tiny", "bert_base")


def tokens(vocab: int, length: int, n: int, seed: int, pad: int) -> dict[str, np.ndarray]:
    gen = np.random.default_rng(seed)
    ids = gen.integers(5, vocab, (n, length))
    mask = np.ones((n, length), np.int64)
    for i, used in enumerate(gen.integers(max(2, length // 4), length + 1, n)):
        mask[i, used:] = 0
        ids[i, used:] = pad
    return {"input_ids": ids.astype(np.int64), "attention_mask": mask}


def run_onnx(path: Path, data: dict[str, np.ndarray], size: int = 16) -> np.ndarray:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    outs = []
    for i in range(0, len(data["input_ids"]), size):
        arrays = [data["input_ids"][i : i + size], data["attention_mask"][i : i + size]]
        feed = dict(zip(names, arrays[: len(names)], strict=True))
        outs.append(sess.run(None, feed)[0])
    return np.concatenate(outs)


def compare(out: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    a, b = (
        out.reshape(len(out), -1).astype(np.float64),
        ref.reshape(len(ref), -1).astype(np.float64),
    )
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-30)
    top1 = float((out.argmax(-1) == ref.argmax(-1)).mean())
    return {"cos_mean": float(cos.mean()), "cos_min": float(cos.min()), "top1": top1}


def lint_cells(path: Path) -> dict[str, Any]:
    report = qdq.lint.lint(path)
    attention = [ly for ly in report.layers if ly.kind == "attention"]
    warn = sorted({f.rule for f in report.findings if f.severity in ("WARN", "ERROR")})
    s = report.summary
    return {
        "int8": f"{s['int8_weighted_layers']}/{s['weighted_layers']}",
        "attention": f"{sum(ly.input_precision == 'int8' for ly in attention)}/{len(attention)}",
        "verdict": report.verdict,
        "warn": ",".join(warn) or "-",
    }


def row(name: str, work: Path, peer_python: str | None) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    rm = BENCH_ARCHS[name].build()
    model = rm.model
    length = rm.example_inputs[0].shape[1]
    pad = int(getattr(model.config, "pad_token_id", 0) or 0)
    vocab = int(model.config.vocab_size)
    calib = tokens(vocab, length, 64, 1, pad)
    evals = tokens(vocab, length, 128, 2, pad)
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / "calib.npz", **calib)
    ids, mask = torch.from_numpy(calib["input_ids"]), torch.from_numpy(calib["attention_mask"])
    fp32 = folder / "fp32.onnx"
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (ids[:2], mask[:2]), str(fp32), dynamo=False, opset_version=17,
                          input_names=["input_ids", "attention_mask"], dynamic_axes=axes)  # fmt: skip
    ref = run_onnx(fp32, evals)
    rows: list[dict[str, Any]] = []
    batches = [(ids[i : i + 16], mask[i : i + 16]) for i in range(0, len(ids), 16)]
    for method in ("max", "mse"):
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prepared = qdq.prepare(model, (ids[:2], mask[:2]))
            qdq.calibrate(prepared, batches, method=method, show_progress=False)
            seconds = time.perf_counter() - start
            path = folder / f"qdq-{method}.onnx"
            qdq.export_onnx(prepared, (ids[:2], mask[:2]), path, overwrite=True,
                            dynamic_dims={0: {1: "sequence"}, 1: {1: "sequence"}},
                            check_inputs=[(ids[:3, : max(2, length // 2)],
                                           mask[:3, : max(2, length // 2)])])  # fmt: skip
        rows.append({"model": name, "tool": f"qdq {method}", "calibrate_s": seconds,
                     **compare(run_onnx(path, evals), ref), **lint_cells(path)})  # fmt: skip
    if peer_python is None:
        rows.append({"model": name, "tool": "modelopt", "error": "not run (no --peer-python)"})
        return rows
    job = folder / "job.json"
    job.write_text(json.dumps({"row": name, "tests": str(TESTS), "fp32": str(fp32),
                               "calib": str(folder / "calib.npz"), "batch": 16}))  # fmt: skip
    done = subprocess.run([peer_python, str(Path(__file__).parent / "peers" /
                                           "transformers_peers.py"), str(job)],
                          capture_output=True, text=True, timeout=3600)  # fmt: skip
    if done.returncode != 0:
        rows.append({"model": name, "tool": "modelopt", "error": done.stderr[-500:]})
        return rows
    peers = json.loads((folder / "peers.json").read_text())
    for tool, cell in peers["rows"].items():
        if "error" in cell:
            rows.append({"model": name, "tool": tool, "error": cell["error"][:200]})
            continue
        path = Path(cell["onnx"])
        rows.append({"model": name, "tool": tool, "calibrate_s": cell["calibrate_s"],
                     **compare(run_onnx(path, evals), ref), **lint_cells(path)})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", nargs="+", default=list(ROWS), choices=sorted(BENCH_ARCHS))
    ap.add_argument("--peer-python", help="python of the ModelOpt environment")
    ap.add_argument("--work", type=Path, help="where the ONNX files go (default: a temporary)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    work = args.work or Path(tempfile.mkdtemp(prefix="qdq-hf-"))
    rows: list[dict[str, Any]] = []
    for name in args.rows:
        try:
            rows += row(name, work, args.peer_python)
        except Exception as err:  # one failing row is a row
            rows.append({"model": name, "tool": "-", "error": f"{type(err).__name__}: {err}"})
        print(f"[transformers_compare] {name} done", file=sys.stderr, flush=True)
    head = (f"{'model':18} {'tool':16} {'cos mean':>9} {'cos min':>8} {'top1':>5} "
            f"{'INT8 GEMMs':>10} {'attn INT8':>9} {'lint':5} {'warn':10} {'calib s':>7}")  # fmt: skip
    print(head)
    print("-" * len(head))
    for r in rows:
        if "error" in r:
            print(f"{r['model']:18} {r['tool']:16} {r['error']}")
            continue
        print(f"{r['model']:18} {r['tool']:16} {r['cos_mean']:9.5f} {r['cos_min']:8.5f} "
              f"{r['top1']:5.2f} {r['int8']:>10} {r['attention']:>9} {r['verdict']:5} "
              f"{r['warn']:10} {r['calibrate_s']:7.2f}")  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
