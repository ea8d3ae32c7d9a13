"""``qdq demo``: the pipeline as far as it goes, on the built-in Fashion-MNIST model and data.

Today that is: TensorRT-aware placement (``qdq.prepare``), one histogram calibration pass
(``qdq.calibrate``), then INT8 accuracy (fake-quant, bit-exact with ONNX Q/DQ) for every calibration
method recomputed from that single collection (``qdq.recompute_amax``). Export and the TensorRT
linter join as they land.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from qdq._io import atomic_write_text
from qdq._version import __version__
from qdq.api import calibrate, plan_of, prepare, quantizers_of, recompute_amax
from qdq.config import CALIBRATION_METHODS

__all__ = ["DemoResult", "run_demo"]


@dataclass(frozen=True)
class DemoResult:
    """Accuracy of one model variant on the test set."""

    name: str
    accuracy: float
    agreement: float  # top-1 agreement with FP32
    mean_cosine: float  # mean cosine similarity of the logits with FP32


def _logits(model: nn.Module, images: torch.Tensor, batch_size: int = 500) -> torch.Tensor:
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return torch.cat(
                [model(images[i : i + batch_size]) for i in range(0, len(images), batch_size)]
            )
    finally:
        model.train(was_training)


def _score(name: str, logits: torch.Tensor, ref: torch.Tensor, labels: torch.Tensor) -> DemoResult:
    pred = logits.argmax(dim=1)
    cos = torch.nn.functional.cosine_similarity(logits, ref, dim=1)
    return DemoResult(
        name=name,
        accuracy=float((pred == labels).float().mean()),
        agreement=float((pred == ref.argmax(dim=1)).float().mean()),
        mean_cosine=float(cos.mean()),
    )


def _export_and_check(
    qmodel: nn.Module, images: torch.Tensor, labels: torch.Tensor, ref: torch.Tensor, out_dir: Path
) -> dict[str, object]:
    """Export Q/DQ ONNX and measure its accuracy in ONNX Runtime (exact Q/DQ on CPU)."""
    try:
        from qdq.backends.onnxruntime import parity, run, session
        from qdq.export import export_onnx
    except ImportError as err:  # pragma: no cover - onnx extra missing
        print(f"  ONNX export skipped: {err}")
        return {"skipped": str(err)}
    out = export_onnx(qmodel, (images[:1],), out_dir / "demo.onnx", overwrite=True)
    sess = session(out.path)
    logits = torch.cat(
        [torch.from_numpy(run(sess, [images[i : i + 500]])[0]) for i in range(0, len(images), 500)]
    )
    res = _score("onnxruntime", logits, ref, labels)
    par = parity(qmodel, out.path, [images[:500]], per_layer=True)
    exact = sum(lp.qdq_mismatches for lp in par.layers.values()) == 0
    print(
        f"  exported {out.path} ({out.exporter}, opset {out.opset}, {out.num_quantize} Q / "
        f"{out.num_dequantize} DQ) in {out.seconds:.1f} s"
    )
    print(
        f"  ONNX Runtime INT8 accuracy {100 * res.accuracy:.2f}% (agreement with torch fake-quant "
        f"{100 * _agreement(logits, qmodel, images):.2f}%, every Q/DQ bit-exact: {exact})"
    )
    return {"path": str(out.path), "manifest": str(out.manifest_path), "accuracy": res.accuracy,
            "q": out.num_quantize, "dq": out.num_dequantize, "qdq_bit_exact": exact}  # fmt: skip


def _agreement(onnx_logits: torch.Tensor, qmodel: nn.Module, images: torch.Tensor) -> float:
    ours = _logits(qmodel, images).argmax(dim=1)
    return float((ours == onnx_logits.argmax(dim=1)).float().mean())


def run_demo(
    out_dir: str | Path = "reports",
    calib_batches: int = 8,
    calib_batch_size: int = 32,
    limit: int | None = None,
) -> int:
    """Run the demo, print the figures and write ``<out_dir>/demo.json``; return an exit code."""
    from qdq.zoo import fashion_mnist as fm

    if calib_batches < 1 or calib_batch_size < 1:
        raise ValueError("--calib-batches and --calib-batch-size must be >= 1")
    t0 = time.perf_counter()
    images, labels = fm.load_split("test")
    if limit is not None:
        if limit < 1:
            raise ValueError(f"--limit must be >= 1, got {limit}")
        images, labels = images[:limit], labels[:limit]
    model = fm.load_pretrained()
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"qdq {__version__} demo: Fashion-MNIST ResNet-ish ({n_params / 1e3:.1f}k parameters), "
        f"{len(images):,} labelled test images"
    )

    ref = _logits(model, images)
    fp32 = _score("fp32", ref, ref, labels)
    print(f"  FP32 accuracy {100 * fp32.accuracy:.2f}%", flush=True)

    qmodel = prepare(model, (images[:1],))
    plan = plan_of(qmodel)
    print("  " + plan.summary().replace("\n", "\n  "))
    batches = fm.calibration_batches(num_batches=calib_batches, batch_size=calib_batch_size)
    calibrate(qmodel, batches, show_progress=False)
    acts = {n: q for n, q in quantizers_of(qmodel).items() if not q.name.endswith(":weight")}
    print(
        f"  calibrated {len(acts)} activation quantizers on {calib_batches}x"
        f"{calib_batch_size} training images (one histogram pass, all methods below)"
    )

    results: dict[str, dict[str, object]] = {}
    print(f"  {'method':<11}{'INT8 acc':>9}{'drop':>8}{'agree':>9}{'cosine':>9}")
    for method in CALIBRATION_METHODS:
        recompute_amax(qmodel, method)
        amax = {q.name: q.amax.item() for q in acts.values()}
        res = _score(method, _logits(qmodel, images), ref, labels)
        drop = 100 * (res.accuracy - fp32.accuracy)
        print(
            f"  {method:<11}{100 * res.accuracy:8.2f}%{drop:+8.2f}{100 * res.agreement:8.2f}%"
            f"{res.mean_cosine:9.5f}",
            flush=True,
        )
        results[method] = {**res.__dict__, "amax": amax}

    best = max(results, key=lambda m: float(results[m]["accuracy"]))  # type: ignore[arg-type]
    recompute_amax(qmodel, best)
    print(f"  best method: {best}")
    onnx_summary = _export_and_check(qmodel, images, labels, ref, Path(out_dir))
    lint: dict[str, object] = {"verdict": None}
    if "path" in onnx_summary:
        from qdq.lint import lint as run_lint

        lr = run_lint(str(onnx_summary["path"]))
        s = lr.summary
        lint = {"verdict": lr.verdict, "summary": s, "findings": [f.to_dict() for f in lr.findings]}
        print(
            f"  lint verdict: {lr.verdict} (TensorRT prediction: INT8 weighted layers "
            f"{s['int8_weighted_layers']}/{s['weighted_layers']}, unfused Q/DQ {s['unfused_qdq']}, "
            f"float islands {s['float_islands']}; {len(lr.findings)} findings)"
        )
    report = {
        "qdq_version": __version__,
        "model": "qdq.zoo.fashion_mnist.ResNetish",
        "parameters": n_params,
        "dataset": "Fashion-MNIST test (Debian dataset-fashion-mnist)",
        "test_images": len(images),
        "calibration": {"batches": calib_batches, "batch_size": calib_batch_size},
        "plan": plan.to_dict(),
        "fp32": fp32.__dict__,
        "int8": results,
        "best_method": best,
        "onnx": onnx_summary,
        "lint": lint,
        "seconds": round(time.perf_counter() - t0, 2),
    }
    path = atomic_write_text(Path(out_dir) / "demo.json", json.dumps(report, indent=2) + "\n")
    print(f"  report written to {path}")
    return 0
