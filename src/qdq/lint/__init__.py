"""The TensorRT linter: predict engine precision and fusion from a Q/DQ ONNX; read engine reports."""
