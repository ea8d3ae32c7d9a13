"""qdq rows of ``benchmarks/accuracy.py``: every method at the default placement, at full INT8
coverage, and at the coverage of a peer that keeps some weighted layers float.

* ``default``: ``QuantConfig.tensorrt()``;
* ``full``: ``QuantConfig.tensorrt(disable=("performance",))`` (H02/P14 off: every weighted layer
  INT8). When its plan equals the default plan, its rows reuse the default rows' ONNX;
* ``float as <peer>``: full coverage with exactly the layers a peer's ONNX leaves float excluded
  (``QuantConfig.exclude(name=...)``), so that peer is compared at its own INT8 coverage. The layer
  names come from the peer's ONNX node names (``/block.0/conv/Conv`` → ``block.0.conv``, the
  TorchScript exporter's scopes).

Time: ``prepare`` + ``calibrate`` (one histogram pass, then the method; run twice when under
30 s, the faster run counts), then ``export_onnx``.
"""

from __future__ import annotations

import contextlib
import io
import time
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

import qdq
from accuracy_table import Row, timed
from qdq.config import QuantConfig

__all__ = ["PLACEMENTS", "float_weighted", "matched_rows", "qdq_rows"]

PLACEMENTS: dict[str, QuantConfig] = {
    "default": QuantConfig.tensorrt(),
    "full": QuantConfig.tensorrt(disable=("performance",)),
}
T = TypeVar("T")
_WEIGHTED_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


def quiet(fn: Callable[[], T]) -> T:
    """``fn()`` with warnings and stdout swallowed."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        return fn()


def _placement_key(prepared: nn.Module) -> tuple[tuple[str, str], ...]:
    """What a plan quantizes: (point, decision) pairs, in plan order."""
    return tuple((p.name, p.decision) for p in qdq.plan_of(prepared).points)


def _make(
    row: Row,
    model: nn.Module,
    cfg: QuantConfig,
    batches: list[torch.Tensor],
    exporter: str,
    fp32_s: float,
) -> None:
    """prepare + calibrate (timed as calibration), export (timed); failures become the note."""
    example, path = batches[0][:1], str(row.onnx)
    try:

        def step() -> nn.Module:
            prepared = qdq.prepare(model, (example,), cfg)
            return qdq.calibrate(prepared, batches, method=row.method, show_progress=False)

        prepared, row.calib_s = quiet(partial(timed, step))
        row.calib_x = row.calib_s / fp32_s
        start = time.perf_counter()
        exported = quiet(
            lambda: qdq.export_onnx(prepared, (example,), path, exporter=exporter, overwrite=True)
        )
        row.export_s = time.perf_counter() - start
        if exporter == "auto" and exported.exporter != "dynamo":
            row.note = f"exported by {exported.exporter} (the dynamo export failed)"
    except Exception as err:  # one failing row never stops the table
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        row.note, row.onnx = f"not run: {type(err).__name__}: {first}"[:200], None


def qdq_rows(
    model: nn.Module,
    batches: list[torch.Tensor],
    work: Path,
    methods: tuple[str, ...],
    exporter: str,
    fp32_s: float,
    log: Callable[[str], None],
) -> list[Row]:
    """Every method at the default placement and at full coverage."""
    example = batches[0][:1]
    keys = {  # also the untimed warm-up of prepare
        name: _placement_key(quiet(partial(qdq.prepare, model, (example,), cfg)))
        for name, cfg in PLACEMENTS.items()
    }
    warm = quiet(lambda: qdq.prepare(model, (example,)))  # and of calibrate
    quiet(lambda: qdq.calibrate(warm, batches[:1], method="max", show_progress=False))
    rows: list[Row] = []
    for placement, cfg in PLACEMENTS.items():
        for method in methods:
            row = Row("qdq", method, placement, onnx=str(work / f"qdq-{placement}-{method}.onnx"))
            same = next(
                (r for r in rows if r.method == method and keys[r.placement] == keys[placement]),
                None,
            )
            rows.append(row)
            if same is not None:
                row.onnx, row.calib_s, row.calib_x = same.onnx, same.calib_s, same.calib_x
                row.export_s = same.export_s
                row.note = f"the plan of [{same.placement}] (no layer is kept float by H02/P14)"
                log(f"  {row.label}: {row.note}, its ONNX")
                continue
            _make(row, model, cfg, batches, exporter, fp32_s)
            log(f"  {row.label}: {row.note or f'calibrated in {row.calib_s:.2f} s'}")
    return rows


def float_weighted(path: str, float_nodes: tuple[str, ...]) -> list[str]:
    """The weighted ONNX nodes (as the linter counts them) among ``float_nodes``."""
    import onnx

    graph = onnx.load(path, load_external_data=False).graph
    consts = {i.name for i in graph.initializer} | {
        o for n in graph.node if n.op_type == "Constant" for o in n.output
    }
    floats = set(float_nodes)
    return [
        n.name
        for n in graph.node
        if n.name in floats
        and n.op_type in _WEIGHTED_OPS
        and len(n.input) >= 2
        and (n.op_type != "MatMul" or n.input[1] in consts or _through_dq(graph, n.input[1]))
    ]


def _through_dq(graph: Any, tensor: str) -> bool:
    return any(n.op_type == "DequantizeLinear" and tensor in n.output for n in graph.node)


def module_of(node_name: str, modules: set[str]) -> str | None:
    """``/layer1/conv1/Conv`` → ``layer1.conv1`` when that module exists, else ``None``."""
    parts = [p for p in node_name.split("/") if p]
    if len(parts) < 2:
        return None
    name = ".".join(parts[:-1])
    return name if name in modules else None


def matched_rows(
    rows: list[Row],
    model: nn.Module,
    batches: list[torch.Tensor],
    work: Path,
    methods: tuple[str, ...],
    exporter: str,
    fp32_s: float,
    log: Callable[[str], None],
) -> list[Row]:
    """qdq rows at the coverage of every peer row no qdq row has (see the module docstring)."""
    have = {r.int8_layers for r in rows if r.tool == "qdq" and r.ran}
    modules = {n for n, _ in model.named_modules() if n}
    done: set[tuple[str, ...]] = set()
    out: list[Row] = []
    for peer in rows:
        if peer.tool in ("fp32", "qdq") or not peer.ran or peer.int8_layers in have:
            continue
        if not peer.float_layers or peer.weighted_layers is None:
            continue
        names = [module_of(n, modules) for n in peer.float_layers]
        if any(n is None for n in names):
            log(f"  {peer.label}: float layers {peer.float_layers} do not map to modules; no match")
            continue
        key = tuple(sorted(str(n) for n in names))
        if key in done:
            continue
        done.add(key)
        cfg = PLACEMENTS["full"]
        for n in key:
            cfg = cfg.exclude(name=n)
        shown = ", ".join(key[:3]) + (f" +{len(key) - 3}" if len(key) > 3 else "")
        tag = "-".join(k.replace(".", "_") for k in key)[:60]
        for method in methods:
            row = Row(
                "qdq",
                method,
                f"float as {peer.tool}: {shown}",
                onnx=str(work / f"qdq-match-{tag}-{method}.onnx"),
            )
            _make(row, model, cfg, batches, exporter, fp32_s)
            out.append(row)
            log(f"  {row.label}: {row.note or f'calibrated in {row.calib_s:.2f} s'}")
    return out
