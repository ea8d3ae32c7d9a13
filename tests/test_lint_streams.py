"""The linter on the shapes of issue 47, on hand-built graphs: a Concat of Slices of one tensor
(``torch.roll`` as both exporters write it: Swin's shifted windows) is data movement, not S02b,
and a tensor read directly and through such a roll by quantized layers is no P04; a residual Add
whose skip is a transpose of a tensor a LayerNorm reads keeps the float stream (P15), not P03a.
The planner's side is ``test_placement_streams.py``."""

from __future__ import annotations

import numpy as np

from lint_graphs import G
from qdq.lint import lint


def _slice(g: G, x: str, start: int, end: int, axis: int) -> str:
    ints = [g.const(np.array([v], np.int64)) for v in (start, end, axis)]
    return g.op("Slice", [x, *ints])


def _roll(g: G, x: str, shift: int, axis: int, size: int = 8) -> str:
    return g.op(
        "Concat", [_slice(g, x, shift, size, axis), _slice(g, x, 0, shift, axis)], axis=axis
    )


def test_lint_concat_of_slices_of_one_tensor_is_a_roll_not_s02b() -> None:
    """A float tensor rolled on two axes (a Concat of two Slices each), read by a quantized
    conv: TensorRT moves the Quantize back across the Concats and Slices to the tensor."""
    g = G(32)
    y = g.op("Relu", [g.conv(g.qdq("x"), 32, 32)])
    rolled = _roll(g, _roll(g, y, 3, 2), 3, 3)
    report = lint(g.model([g.conv(g.qdq(rolled), 32, 32)], (1, 32, 8, 8)), target="trt10")
    assert not report.rules("WARN") & {"S02", "S02b", "P04"}, report.format()


def test_lint_concat_of_two_float_tensors_is_still_s02b() -> None:
    """The control: two different float tensors concatenated before a Quantize."""
    g = G(32)
    a = g.op("Relu", [g.conv(g.qdq("x"), 32, 32)])
    b = g.op("Sigmoid", [a])
    cat = g.op("Concat", [_slice(g, a, 0, 4, 2), b], axis=2)
    report = lint(g.model([g.conv(g.qdq(cat), 32, 32)], (1, 32, 8, 8)), target="trt10")
    assert "S02b" in report.rules("WARN"), report.format()


def test_lint_tensor_read_directly_and_through_a_roll_by_quantized_convs_is_no_p04() -> None:
    g = G(32)
    y = g.op("Relu", [g.conv(g.qdq("x"), 32, 32)])
    a = g.conv(g.qdq(y), 32, 32)
    b = g.conv(g.qdq(_roll(g, y, 2, 2)), 32, 32)
    report = lint(g.model([a, b], (1, 32, 8, 8)), target="trt10")
    assert "P04" not in report.rules("WARN"), report.format()


def test_lint_p15_sees_the_norm_reading_the_tensor_a_skip_is_a_transpose_of() -> None:
    """GCViT's shape as TorchScript writes it: a channels-last LayerNorm's output ``y`` is read
    by the next LayerNorm, and transposed back to NCHW for a conv block whose residual Add
    takes it as the skip (``permute(permute(y))`` cancelled). The Add keeps the float stream
    (P15, INFO), not P03a."""
    g = G(32)
    c = 32
    x = g.op("Transpose", [g.op("Relu", [g.conv(g.qdq("x"), c, c)])], perm=[0, 2, 3, 1])
    ln = [g.const(np.ones(c, np.float32)), g.const(np.zeros(c, np.float32))]
    y = g.op("LayerNormalization", [x, *ln], axis=-1)
    stream = g.op("LayerNormalization", [y, *ln], axis=-1)  # the next block's norm1
    t = g.op("Transpose", [y], perm=[0, 3, 1, 2])
    out = g.op("Add", [g.bn(g.conv(g.qdq(t), c, c), c), t])
    model = g.model([g.conv(g.qdq(out), c, c), stream], (1, c, 8, 8), opset=17)
    report = lint(model, target="trt10")
    assert "P03a" not in report.rules("WARN") and "P15" in report.rules("INFO"), report.format()
