"""Build and run a single QuantizeLinear → DequantizeLinear graph in ONNX Runtime (test oracle)."""

from __future__ import annotations

import numpy as np


def ort_qdq(x: np.ndarray, scale: np.ndarray, axis: int | None, opset: int = 13) -> np.ndarray:
    """Run ``DequantizeLinear(QuantizeLinear(x))`` in ORT at ``ORT_ENABLE_BASIC`` (exact Q/DQ)."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    scale = np.asarray(scale, dtype=np.float32)
    zero = np.zeros(scale.shape, dtype=np.int8)
    attrs = {} if axis is None else {"axis": axis}
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **attrs),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], **attrs),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))],
        initializer=[numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zero, "z")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    onnx.checker.check_model(model)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(
        model.SerializeToString(),
        opts,
        providers=["CPUExecutionProvider"],
        disabled_optimizers=["WeightBiasQuantization"],  # as qdq.backends.onnxruntime.session
    )
    return sess.run(["y"], {"x": x.astype(np.float32)})[0]
