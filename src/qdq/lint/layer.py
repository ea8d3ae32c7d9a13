"""One layer of the engine the linter predicts (:func:`qdq.lint.predict.predict_layers`): plain
data, printable and JSON-serialisable, read by the report, the drawings and the engine diff."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from qdq.lint.formats import INT8, is_quantized

__all__ = ["PLUGIN", "PredictedLayer"]

#: the precision of a plugin layer (a custom operator, rule V16): whatever the plugin implements
PLUGIN = "plugin"


@dataclass(frozen=True)
class PredictedLayer:
    """One predicted engine layer.

    Attributes:
        name: the ONNX node names joined with ``" + "``, as TensorRT names fused layers.
        nodes: those ONNX node names.
        kind: ``"weighted"``, ``"attention"`` (a fused MHA core with INT8 or FP8 products),
            ``"pooling"``, ``"concat"``, ``"pointwise"``, ``"qdq"`` (a standalone
            Quantize/Dequantize, i.e. a Q/DQ-origin reformat), ``"plugin"`` (a custom operator,
            precision ``"plugin"``: rule V16) or ``"other"``.
        input_precision, output_precision: ``"int8"``, ``"fp8"`` or the float precision of the
            target (``"fp16"`` for weakly typed INT8+FP16 builds, the ONNX dtype when strongly
            typed).
        reason: why a layer is float or standalone (empty for quantized layers).
    """

    name: str
    nodes: tuple[str, ...]
    kind: str
    input_precision: str
    output_precision: str
    reason: str = ""

    @property
    def int8(self) -> bool:
        """Whether the layer computes in INT8 (its input is INT8)."""
        return self.input_precision == INT8

    @property
    def quantized(self) -> bool:
        """Whether the layer computes in a quantized format (INT8 or FP8)."""
        return is_quantized(self.input_precision)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict."""
        return asdict(self)
