"""Where ``qdq.export_onnx`` spends its time, per stage, for each exporter.

Run: ``.venv/bin/python benchmarks/export_stages.py [--model resnet18] [--repeat 3]`` (prints a
table; asserts nothing). Each stage is timed by wrapping the function that runs it for the duration
of one export (the wrapper is removed afterwards); nested stages are reported on their own lines
and are not subtracted from their parents. The first export of each exporter is a warm-up (imports,
kernel caches) and is not counted; the table shows the median over ``--repeat`` exports.

Stages: ``check forward`` (qdq: one torch forward checking per-channel amax), ``torch.export``
(capture), ``decompositions`` (torch.onnx: run_decompositions), ``translation`` (torch.onnx: FX to
ONNX IR), ``version conversion`` and ``onnx optimizer`` (onnxscript), ``serialize`` (IR to
ModelProto), ``downgrade`` (qdq: opset 18 to the target), ``torchscript export`` (tracing and
translation, TorchScript), ``postprocess`` (qdq), ``validate`` (qdq: checker, strict shape
inference), ``verify in ORT`` (qdq: ORT against torch fake-quant and float forwards).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import statistics
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import qdq
from export import _models  # the benchmark models of benchmarks/export.py

_CORE = "torch.onnx._internal.exporter._core"
# (label, module, attribute[, class]) of every timed function
_STAGES: tuple[tuple[str, str, str], ...] = (
    ("check forward", "qdq.export.onnx_export", "_check_forward"),
    ("onnx registry", "torch.onnx._internal.exporter._registration.ONNXRegistry", "from_torchlib"),
    ("torch.export", "torch.export", "export"),
    ("decompositions", _CORE, "_prepare_exported_program_for_export"),
    ("translation", _CORE, "_exported_program_to_onnx_program"),
    ("version conversion", f"{_CORE}.onnxscript_apis", "convert_version"),
    ("onnx optimizer", "torch.onnx._internal.exporter._onnx_program.ONNXProgram", "optimize"),
    ("serialize", "torch.onnx._internal.exporter._onnx_program.ir.serde", "serialize_model"),
    ("downgrade", "qdq.export.opset", "downgrade"),
    ("torchscript export", "torch.onnx._internal.torchscript_exporter.utils", "export"),
    ("postprocess", "qdq.export.postprocess", "postprocess"),
    ("validate", "qdq.export.validate", "validate_export"),
    ("verify in ORT", "qdq.export.verify", "verify_numerics"),
    ("manifest", "qdq.export.manifest", "build_manifest"),
    ("write", "qdq.export.onnx_export", "atomic_write_files"),
)


def _owner(path: str) -> Any:
    """The module (or class inside a module) named by a dotted path."""
    parts = path.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for name in parts[k:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(path)


@contextlib.contextmanager
def _timed(seconds: dict[str, float], cpu: dict[str, float]) -> Iterator[None]:
    """Wrap every stage function so that its wall time adds to ``seconds[label]`` and its CPU
    time (this process, all threads) to ``cpu[label]``."""
    undo: list[tuple[Any, str, Any]] = []

    def wrap(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kw: Any) -> Any:
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kw)
            finally:
                seconds[label] += time.perf_counter() - t0
                cpu[label] += time.process_time() - c0

        return timed

    try:
        for label, owner_path, attr in _STAGES:
            owner = _owner(owner_path)
            original = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
            undo.append((owner, attr, original))
            timed = wrap(label, getattr(owner, attr))
            if isinstance(original, classmethod):  # called on the class: already bound
                timed = staticmethod(timed)
            setattr(owner, attr, timed)
        yield
    finally:
        for owner, attr, original in reversed(undo):
            setattr(owner, attr, original)


def _print(title: str, table: dict[str, dict[str, list[float]]]) -> None:
    exporters = list(table)
    print(title)
    print(f"{'stage':<22}" + "".join(f"{e:>14}" for e in exporters))
    for label in [*(s[0] for s in _STAGES), "total"]:
        cells = [statistics.median(table[e][label]) if table[e][label] else None for e in exporters]
        if any(c is not None for c in cells):
            row = "".join(f"{c:>14.2f}" if c is not None else f"{'-':>14}" for c in cells)
            print(f"{label:<22}{row}")
    dyn, ts = (statistics.median(table[e]["total"]) for e in exporters)
    print(f"{'dynamo / torchscript':<22}{dyn / ts:>14.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="resnet18", choices=sorted(_models()))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--opset", type=int, default=17)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    model, data = _models()[args.model]()
    x = data[0][:1]
    prepared = qdq.prepare(model, (x,))
    qdq.calibrate(prepared, data, show_progress=False)
    exporters = ("dynamo", "torchscript")
    wall: dict[str, dict[str, list[float]]] = {e: defaultdict(list) for e in exporters}
    cpu: dict[str, dict[str, list[float]]] = {e: defaultdict(list) for e in exporters}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat + 1):  # alternate the exporters: load changes hit both
            for exporter in exporters:
                w: dict[str, float] = defaultdict(float)
                c: dict[str, float] = defaultdict(float)
                path = Path(tmp) / f"{exporter}.onnx"
                t0, c0 = time.perf_counter(), time.process_time()
                with _timed(w, c):
                    qdq.export_onnx(
                        prepared, (x,), path, exporter=exporter, opset=args.opset, overwrite=True
                    )
                w["total"], c["total"] = time.perf_counter() - t0, time.process_time() - c0
                if i:  # the first export of each exporter is the warm-up
                    for label in w:
                        wall[exporter][label].append(w[label])
                        cpu[exporter][label].append(c[label])
    what = f"{args.model}, opset {args.opset}, {args.threads} thread(s), median of {args.repeat}"
    _print(f"{what}: wall seconds", wall)
    _print(f"{what}: CPU seconds", cpu)


if __name__ == "__main__":
    main()
