"""Engine time without a GPU: a GPU table and a fitted time model of TensorRT layers.

:mod:`qdq.lint.speed.gpus` holds the GPUs, :mod:`qdq.lint.speed.cost` the model of one layer,
:mod:`qdq.lint.speed.engine` reads a real engine report into the model's layers; docs/engine_time.md
explains the model, its fitted parameters and its error.
"""
