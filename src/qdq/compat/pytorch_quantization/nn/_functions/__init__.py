"""``pytorch_quantization.nn._functions``: the functional recurrences behind the quant RNN modules."""
