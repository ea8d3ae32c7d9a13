"""The quantization manifest: every quantizer's module path, rule, group, calibration, amax, scale
and ONNX node names, as versioned JSON beside the ONNX file; ``load_calibration`` restores amax."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from qdq._version import __version__
from qdq.api import plan_of, quantizers_of
from qdq.graph.plan import QuantPlan
from qdq.quant import Quantizer, scale_from_amax

__all__ = ["SCHEMA", "build_manifest", "load_calibration"]

SCHEMA = "qdq.manifest/1"


def _values(t: torch.Tensor) -> float | list[float]:
    flat = t.detach().to(torch.float32).cpu()
    return float(flat) if flat.dim() == 0 else [float(v) for v in flat.flatten()]


def build_manifest(
    plan: QuantPlan, quantizers: dict[str, Quantizer], model: Any, *, exporter: str, opset: int
) -> str:
    """The manifest JSON text for an export."""
    nodes: dict[str, list[str]] = {}
    for n in model.graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            nodes.setdefault(n.name.split("/")[0], []).append(n.name)
    by_path = {g.quantizer: g for g in plan.groups if g.quantizer}
    entries = []
    for path, q in quantizers.items():
        group = by_path.get(path)
        leader = plan.point(group.leader) if group is not None else None
        entries.append(
            {
                "path": path,
                "name": q.name,
                "kind": leader.kind if leader else "input",
                "rule": leader.rule if leader else "USER",
                "group": group.id if group else None,
                "members": list(group.members) if group else [],
                "calibrator": q.calib.calibrator,
                "method": q.calib.method,
                "num_bits": q.spec.num_bits,
                "axis": q.spec.axis,
                "amax": _values(q.amax),
                "scale": _values(scale_from_amax(q.amax)),
                "onnx_nodes": nodes.get(path, []),
            }
        )
    doc = {
        "schema": SCHEMA,
        "qdq_version": __version__,
        "model": plan.model,
        "exporter": exporter,
        "opset": opset,
        "quantizers": entries,
    }
    return json.dumps(doc, indent=2) + "\n"


def load_calibration(prepared: nn.Module, manifest: str | Path) -> nn.Module:
    """Restore every quantizer's amax from a manifest (no data needed); return ``prepared``.

    Raises:
        FileNotFoundError: no manifest at that path.
        ValueError: wrong schema, or the manifest does not match the model (missing quantizers
            or a different number of channels), naming the quantizer.
    """
    plan_of(prepared)
    p = Path(manifest)
    if not p.is_file():
        raise FileNotFoundError(f"no manifest at {p}")
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{p} is not valid JSON: {err}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ValueError(
            f"{p}: expected schema {SCHEMA!r}, got {doc.get('schema') if isinstance(doc, dict) else doc!r}"
        )
    quantizers = quantizers_of(prepared)
    entries = {e["path"]: e for e in doc["quantizers"]}
    missing = sorted(set(quantizers) - set(entries))
    if missing:
        raise ValueError(
            f"{p} has no entry for quantizers {missing[:5]}: it belongs to another model"
        )
    for path, q in quantizers.items():
        amax = torch.tensor(entries[path]["amax"], dtype=torch.float32)
        expected = 1 if q.spec.axis is None else None
        if expected == 1 and amax.numel() != 1:
            raise ValueError(
                f"{p}: quantizer {path!r} is per-tensor but the manifest has {amax.numel()} values"
            )
        q.set_amax(amax)
    return prepared
