"""Execution backends: ONNX Runtime on CPU (exact Q/DQ); TensorRT (optional, lazy)."""
