"""Hand-built ONNX graphs in TensorRT Model Optimizer's block-format forms, for the linter tests.

Read from NVIDIA/Model-Optimizer (commit 5a4242f): ``modelopt/torch/quantization/export_onnx.py``
(``export_fp4``: ``trt::TRT_FP4DynamicQuantize`` for activations, then two DequantizeLinear;
``export_mxfp8``: ``trt::TRT_MXFP8DynamicQuantize``) and ``modelopt/onnx/export/nvfp4_exporter.py``
(weights: a FLOAT4E2M1 initializer, ``DequantizeLinear(E4M3 block scales, FP32 per-tensor scale)``
as the scale of ``DequantizeLinear(w_f4, block_size=16, axis=-1)``, then Transpose and a Cast to
FP16 in front of the MatMul). The INT4 weight-only form is ``DequantizeLinear(INT4, scale,
axis=0, block_size)`` read by a MatMul whose activation is float (opset 21).

ModelOpt 0.47's real MXFP8 exports (measured on its ViT and BERT exports, issue 60) are opset 20
with ``trt::TRT_MXFP8DequantizeLinear`` for activations and weights, its E8M0 scales typed UINT8
(the exponent byte, bias 127) and ``output_dtype`` FLOAT16 (``modelopt/onnx/export/
mxfp8_exporter.py``: ``compute_scales``, ``post_process``); its INT4 export leaves
``trt::DequantizeLinear`` at opset 20 (``export_int4``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import TensorProto, helper, numpy_helper


class Builder:
    """Nodes and initializers of one graph, a layer at a time."""

    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self.inits: list[Any] = []

    def init(self, name: str, dtype: int, dims: list[int], fill: float = 1.0) -> str:
        count = int(np.prod(dims)) if dims else 1
        self.inits.append(helper.make_tensor(name, dtype, dims, [fill] * count))
        return name

    def node(self, op: str, ins: list[str], outs: list[str], name: str, **attrs: Any) -> None:
        self.nodes.append(helper.make_node(op, ins, outs, name=name, **attrs))

    def fp4_act(self, x: str, p: str) -> str:
        """ModelOpt's NVFP4 activation: dynamic quantize, then two DequantizeLinear."""
        gs = self.init(f"{p}.gs", TensorProto.FLOAT, [], 0.01)
        self.nodes.append(
            helper.make_node(
                "TRT_FP4DynamicQuantize", [x, gs], [f"{p}.x4", f"{p}.s8"], name=f"{p}.dynq",
                domain="trt", axis=-1, block_size=16, scale_type=TensorProto.FLOAT8E4M3FN,
            )
        )  # fmt: skip
        self.node("DequantizeLinear", [f"{p}.s8", gs], [f"{p}.s32"], f"{p}.act_dq1")
        self.node(
            "DequantizeLinear", [f"{p}.x4", f"{p}.s32"], [f"{p}.xq"], f"{p}.act_dq2",
            axis=-1, block_size=16,
        )  # fmt: skip
        return f"{p}.xq"

    def fp4_weight(self, p: str, n: int, k: int, block: int = 16) -> str:
        """ModelOpt's NVFP4 weight ``[n, k]``: FP4 values, E4M3 block scales, FP32 scale."""
        w = self.init(f"{p}.w_f4", TensorProto.FLOAT4E2M1, [n, k], 1.0)
        sb = self.init(f"{p}.w_f8_scale", TensorProto.FLOAT8E4M3FN, [n, max(k // block, 1)], 1.0)
        gs = self.init(f"{p}.w_f32_scale", TensorProto.FLOAT, [], 0.001)
        self.node("DequantizeLinear", [sb, gs], [f"{p}.ws"], f"{p}.w_dq1")
        self.node(
            "DequantizeLinear", [w, f"{p}.ws"], [f"{p}.wq"], f"{p}.w_dq2", axis=-1, block_size=block
        )
        return f"{p}.wq"

    def nvfp4_linear(self, x: str, p: str, n: int, k: int) -> str:
        """``x @ W.T`` as ModelOpt writes an NVFP4 Linear (Transpose, Casts to FP16, MatMul)."""
        xq = self.fp4_act(x, p)
        wq = self.fp4_weight(p, n, k)
        self.node("Transpose", [wq], [f"{p}.wt"], f"{p}.transpose", perm=[1, 0])
        self.node("Cast", [xq], [f"{p}.x16"], f"{p}.cast_x", to=TensorProto.FLOAT16)
        self.node("Cast", [f"{p}.wt"], [f"{p}.w16"], f"{p}.cast_w", to=TensorProto.FLOAT16)
        self.node("MatMul", [f"{p}.x16", f"{p}.w16"], [f"{p}.y16"], f"{p}.matmul")
        self.node("Cast", [f"{p}.y16"], [f"{p}.y"], f"{p}.cast_y", to=TensorProto.FLOAT)
        return f"{p}.y"

    def mxfp8_linear(self, x: str, p: str, n: int, k: int) -> str:
        """An MXFP8 Linear: dynamic MX quantize of the activation, E4M3 weights, E8M0 scales."""
        self.nodes.append(
            helper.make_node(
                "TRT_MXFP8DynamicQuantize", [x], [f"{p}.x8", f"{p}.se"], name=f"{p}.dynq",
                domain="trt", axis=-1, block_size=32, output_dtype=TensorProto.FLOAT8E4M3FN,
            )
        )  # fmt: skip
        self.node(
            "DequantizeLinear", [f"{p}.x8", f"{p}.se"], [f"{p}.xq"], f"{p}.act_dq",
            axis=-1, block_size=32,
        )  # fmt: skip
        w = self.init(f"{p}.w_e4m3", TensorProto.FLOAT8E4M3FN, [n, k], 1.0)
        s = self.init(f"{p}.w_e8m0", TensorProto.FLOAT8E8M0, [n, k // 32], 1.0)
        self.node("DequantizeLinear", [w, s], [f"{p}.wq"], f"{p}.w_dq", axis=-1, block_size=32)
        self.node("Transpose", [f"{p}.wq"], [f"{p}.wt"], f"{p}.transpose", perm=[1, 0])
        self.node("MatMul", [f"{p}.xq", f"{p}.wt"], [f"{p}.y"], f"{p}.matmul")
        return f"{p}.y"

    def modelopt_mx_act(self, x: str, p: str, axis: int = -1) -> str:
        """ModelOpt 0.47's MXFP8 activation: ``TRT_MXFP8DynamicQuantize``, then
        ``trt::TRT_MXFP8DequantizeLinear`` of its E4M3 values and UINT8 exponents."""
        self.nodes.append(
            helper.make_node(
                "TRT_MXFP8DynamicQuantize", [x], [f"{p}.x8", f"{p}.se"], name=f"{p}.dynq",
                domain="trt", axis=axis, block_size=32, output_dtype=TensorProto.FLOAT8E4M3FN,
            )
        )  # fmt: skip
        self.nodes.append(
            helper.make_node(
                "TRT_MXFP8DequantizeLinear", [f"{p}.x8", f"{p}.se"], [f"{p}.xq"],
                name=f"{p}.act_dq", domain="trt", axis=axis, block_size=32,
                output_dtype=TensorProto.FLOAT16,
            )
        )  # fmt: skip
        return f"{p}.xq"

    def modelopt_mx_weight(self, p: str, dims: list[int], axis: int = -1) -> str:
        """ModelOpt 0.47's MXFP8 weight: an E4M3 initializer and UINT8 exponent bytes (127: a
        scale of 1) blocked by 32 along ``axis``, read by ``trt::TRT_MXFP8DequantizeLinear``."""
        ax = axis % len(dims)
        w = self.init(f"{p}.weight", TensorProto.FLOAT8E4M3FN, dims, 1.0)
        sdims = [d // 32 if i == ax else d for i, d in enumerate(dims)]
        s = self.init(f"{p}.weight_quantizer/scale", TensorProto.UINT8, sdims, 127)
        self.nodes.append(
            helper.make_node(
                "TRT_MXFP8DequantizeLinear", [w, s], [f"{p}.wq"], name=f"{p}.w_dq", domain="trt",
                axis=axis, block_size=32, output_dtype=TensorProto.FLOAT16,
            )
        )  # fmt: skip
        return f"{p}.wq"

    def modelopt_mxfp8_linear(self, x: str, p: str, n: int, k: int) -> str:
        """``x @ W.T + b`` as ModelOpt 0.47 exports an MXFP8 Linear (opset 20, domain ``trt``)."""
        xq = self.modelopt_mx_act(x, p)
        wq = self.modelopt_mx_weight(p, [n, k])
        self.node("Transpose", [wq], [f"{p}.wt"], f"{p}.transpose", perm=[1, 0])
        self.node("MatMul", [xq, f"{p}.wt"], [f"{p}.mm"], f"{p}.matmul")
        b = self.init(f"{p}.bias", TensorProto.FLOAT16, [n], 0.0)  # the FP16 MatMul's type
        self.node("Add", [f"{p}.mm", b], [f"{p}.y"], f"{p}.add")
        return f"{p}.y"

    def int4w_linear(self, x: str, p: str, n: int, k: int, block: int = 32) -> str:
        """An INT4 weight-only MatMul: ``W [k, n]`` blocked along k, a float activation."""
        w = self.init(f"{p}.w_int4", TensorProto.INT4, [k, n], 1.0)
        s = self.init(f"{p}.w_scale", TensorProto.FLOAT, [max(k // block, 1), n], 0.01)
        self.node("DequantizeLinear", [w, s], [f"{p}.wq"], f"{p}.w_dq", axis=0, block_size=block)
        self.node("MatMul", [x, f"{p}.wq"], [f"{p}.y"], f"{p}.matmul")
        return f"{p}.y"

    def model(self, x_shape: list[int], y: str, opset: int) -> Any:
        graph = helper.make_graph(
            self.nodes,
            "blocks",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
            [helper.make_tensor_value_info(y, TensorProto.FLOAT, None)],
            self.inits,
        )
        opsets = [helper.make_opsetid("", opset), helper.make_opsetid("trt", 1)]
        return helper.make_model(graph, opset_imports=opsets)


def nvfp4_mlp(hidden: int = 64, width: int = 32) -> Any:
    """ModelOpt's NVFP4 export of ``Linear(width, hidden) -> ReLU -> Linear(hidden, width)``."""
    b = Builder()
    h = b.nvfp4_linear("x", "fc1", hidden, width)
    b.inits.append(numpy_helper.from_array(np.zeros(hidden, np.float32), "fc1.bias"))
    b.node("Add", [h, "fc1.bias"], ["fc1.out"], "fc1.add")
    b.node("Relu", ["fc1.out"], ["act"], "relu")
    y = b.nvfp4_linear("act", "fc2", width, hidden)
    return b.model([2, 8, width], y, 17)  # ModelOpt exports NVFP4 at opset 17


def mxfp8_mlp(hidden: int = 64, width: int = 32) -> Any:
    """Two MXFP8 Linears with a ReLU between them (opset 24: E8M0 scales)."""
    b = Builder()
    h = b.mxfp8_linear("x", "fc1", hidden, width)
    b.node("Relu", [h], ["act"], "relu")
    y = b.mxfp8_linear("act", "fc2", width, hidden)
    return b.model([2, 8, width], y, 24)


def modelopt_mxfp8_mlp(hidden: int = 64, width: int = 32) -> Any:
    """ModelOpt 0.47's MXFP8 export of ``Linear(width, hidden) -> ReLU -> Linear(hidden,
    width)``: ``trt::TRT_MXFP8DequantizeLinear`` with UINT8 exponent scales, opset 20."""
    b = Builder()
    h = b.modelopt_mxfp8_linear("x", "fc1", hidden, width)
    b.node("Relu", [h], ["act"], "relu")
    y = b.modelopt_mxfp8_linear("act", "fc2", width, hidden)
    return b.model([2, 8, width], y, 20)


def modelopt_mxfp8_conv() -> Any:
    """A 3x3 convolution in ModelOpt's MXFP8 form (TensorRT has no MX convolution), blocked
    along the input channels."""
    b = Builder()
    xq = b.modelopt_mx_act("x", "conv", axis=1)
    wq = b.modelopt_mx_weight("conv", [32, 64, 3, 3], axis=1)
    b.node("Conv", [xq, wq], ["y"], "conv", pads=[1, 1, 1, 1])
    return b.model([1, 64, 8, 8], "y", 20)


def modelopt_int4w_mlp(hidden: int = 64, width: int = 32, block: int = 32) -> Any:
    """:func:`int4w_mlp` as ModelOpt 0.47 writes it: ``trt::DequantizeLinear`` at opset 20."""
    b = Builder()
    h = b.int4w_linear("x", "fc1", hidden, width, block)
    b.node("Relu", [h], ["act"], "relu")
    y = b.int4w_linear("act", "fc2", width, hidden, block)
    for n in b.nodes:
        if n.op_type == "DequantizeLinear":
            n.domain = "trt"
    return b.model([2, 8, width], y, 20)


def int4w_mlp(hidden: int = 64, width: int = 32, block: int = 32) -> Any:
    """Two INT4 weight-only MatMuls with a ReLU between them (opset 21)."""
    b = Builder()
    h = b.int4w_linear("x", "fc1", hidden, width, block)
    b.node("Relu", [h], ["act"], "relu")
    y = b.int4w_linear("act", "fc2", width, hidden, block)
    return b.model([2, 8, width], y, 21)


def nvfp4_conv() -> Any:
    """NVFP4 on a 3x3 convolution (TensorRT has none), blocked along the input channels."""
    b = Builder()
    xq = b.fp4_act("x", "conv")
    w = b.init("conv.w_f4", TensorProto.FLOAT4E2M1, [32, 32, 3, 3], 1.0)
    sb = b.init("conv.w_f8_scale", TensorProto.FLOAT8E4M3FN, [32, 2, 3, 3], 1.0)
    gs = b.init("conv.w_f32_scale", TensorProto.FLOAT, [], 0.001)
    b.node("DequantizeLinear", [sb, gs], ["conv.ws"], "conv.w_dq1")
    b.node("DequantizeLinear", [w, "conv.ws"], ["conv.wq"], "conv.w_dq2", axis=1, block_size=16)
    b.node("Conv", [xq, "conv.wq"], ["y"], "conv", pads=[1, 1, 1, 1])
    return b.model([1, 32, 8, 8], "y", 17)
