"""``qdq lint``: print the linter's verdict (and, with an engine report, what TensorRT really did)."""

from __future__ import annotations

import json
import sys
from typing import Any

__all__ = ["run_lint"]


def run_lint(model: str, *, target: str, as_json: bool, engine: str | None) -> int:
    """Lint ``model``; return 0 clean, 1 warnings, 2 errors (3 when the input cannot be read)."""
    from qdq.lint.report import lint

    try:
        report = lint(model, target=target)
        diff = _engine_diff(report, engine) if engine else None
    except (FileNotFoundError, ValueError) as err:
        print(f"qdq lint: error: {err}", file=sys.stderr)
        return 3
    if as_json:
        doc: dict[str, Any] = report.to_dict()
        if diff is not None:
            doc["engine"] = diff
        print(json.dumps(doc, indent=2))
    else:
        print(report.format())
        if diff is not None:
            print("engine report vs prediction:")
            for key, (pred, real) in diff["compare"].items():
                print(f"  {key:<22} predicted {pred:>4}  engine {real:>4}")
            for m in diff["layer_mismatches"]:
                print(
                    f"  {m['onnx_node']}: predicted {m['predicted']}, engine {m['engine']} "
                    f"({m['engine_layer']})"
                )
    return report.exit_code


def _engine_diff(report: Any, path: str) -> dict[str, Any]:
    from qdq.lint.engine_report import load_engine_report

    engine = load_engine_report(path)
    weighted = engine.weighted_layers()
    int8 = [layer for layer in weighted if layer.input_precision == "int8"]
    layers = []
    for name in [*report.int8_layers, *report.float_layers]:
        layer = engine.find(name)
        if layer is None:
            continue
        predicted = "int8" if name in report.int8_layers else "float"
        real = layer.input_precision or "?"
        if (predicted == "int8") != (real == "int8"):
            layers.append(
                {
                    "onnx_node": name,
                    "engine_layer": layer.name,
                    "predicted": predicted,
                    "engine": real,
                }
            )
    return {
        "layer_mismatches": layers,
        "path": path,
        "compare": {
            "weighted_layers": (report.summary["weighted_layers"], len(weighted)),
            "int8_weighted_layers": (report.summary["int8_weighted_layers"], len(int8)),
            "unfused_qdq": (report.summary["unfused_qdq"], len(engine.qdq_reformats())),
        },
    }
