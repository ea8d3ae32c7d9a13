"""Block-scaled formats (issue 60, numerics): INT4 block-wise and per channel equal ONNX Runtime's
QuantizeLinear/DequantizeLinear bit for bit (every code, midpoint, saturation); E2M1 rounding equals
an independent brute-force table and the ONNX reference evaluator; NVFP4's two-level scaling and
MXFP8's E8M0 scaling equal the same arithmetic written as standard ONNX operators and run by the
reference evaluator (block scales at the E4M3 and E8M0 edges); the STE; the errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from qdq.quant.blocks import (
    INT4,
    MXFP8,
    NVFP4,
    BlockFormat,
    block_amax,
    block_fake_quant,
    block_scales,
)
from qdq.quant.blocks_fp4 import E2M1_GRID, e2m1_round, e4m3_round, e8m0_exponent, e8m0_scale

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from onnx import ModelProto, TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402


def _model(nodes: list, inits: list, opset: int) -> ModelProto:
    graph = helper.make_graph(
        nodes,
        "blocks",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _ort_run(model: ModelProto, x: np.ndarray) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    (y,) = session.run(None, {"x": x})
    return np.asarray(y)


def _ref_run(model: ModelProto, x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        (y,) = ReferenceEvaluator(model).run(None, {"x": x})
    return np.asarray(y)


def _f32(v: np.ndarray | list) -> np.ndarray:
    return np.asarray(v, dtype=np.float32)


def _same_bits(ours: torch.Tensor, theirs: np.ndarray, excused: torch.Tensor | None = None) -> None:
    """Bit-identical (signed zero included; any NaN equals any NaN), except where ``excused``."""
    t = torch.from_numpy(np.ascontiguousarray(theirs, dtype=np.float32))
    same = ours.view(torch.int32) == t.view(torch.int32)
    both_nan = torch.isnan(ours) & torch.isnan(t)
    ok = same | both_nan if excused is None else same | both_nan | excused
    assert bool(ok.all()), (ours[~ok][:8].tolist(), t[~ok][:8].tolist())


# ---------------------------------------------------------------- INT4 against ONNX Runtime


def _int4_units() -> np.ndarray:
    """Values in code units: every code, every midpoint and its float32 neighbours, past the
    range, infinities, signed zeros (no NaN: ORT turns it into -8, we keep NaN)."""
    codes = np.arange(-8, 8, dtype=np.float32)
    mids = codes[:-1] + np.float32(0.5)
    beyond = _f32([7.49, 7.5, 7.51, 8.0, 9.0, -8.49, -8.5, -8.51, -9.0, 1e6, -1e6, np.inf, -np.inf])
    return np.concatenate([
        codes, mids, np.nextafter(mids, np.float32(np.inf)),
        np.nextafter(mids, np.float32(-np.inf)), beyond, _f32([0.0, -0.0, 1e-30, -1e-30]),
    ])  # fmt: skip


def _int4_case(block_size: int | None, rows: int = 3) -> tuple[torch.Tensor, torch.Tensor, int]:
    """x [rows, K] whose every block holds the probe values times its scale, and its amax."""
    units = _int4_units()
    bs = block_size or len(units)
    k = bs * math.ceil(len(units) / bs) * (1 if block_size is None else 2)
    gen = np.random.default_rng(0)
    nblocks = 1 if block_size is None else k // bs
    amax = _f32(gen.uniform(0.01, 30.0, size=(rows, nblocks)))
    amax[0, 0] = 7.0  # scale 1
    amax[-1, -1] = 0.0  # scale floored at MIN_SCALE
    scale = (torch.from_numpy(amax) / torch.tensor(7.0)).clamp(min=2.0**-24 / 127)
    tiled = np.resize(units, k).astype(np.float32)
    s_full = scale.repeat_interleave(k // nblocks, dim=1).numpy()
    x = torch.from_numpy((tiled[None, :] * s_full).astype(np.float32))
    return x, torch.from_numpy(amax if block_size else amax.reshape(-1)), k


@pytest.mark.parametrize("block_size", [32, 64, 128])
def test_int4_blockwise_qdq_equals_onnx_runtime_bit_for_bit(block_size: int) -> None:
    fmt = INT4.with_block_size(block_size)
    x, amax, k = _int4_case(block_size)
    scale, none = block_scales(x, fmt, amax)
    assert none is None and scale.shape == (3, k // block_size)
    assert torch.equal(scale, (amax / torch.tensor(7.0)).clamp(min=2.0**-24 / 127))
    zp = helper.make_tensor("z", TensorProto.INT4, list(scale.shape), [0] * scale.numel())
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=1, block_size=block_size),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=1, block_size=block_size),
    ]
    model = _model(nodes, [numpy_helper.from_array(scale.numpy(), "s"), zp], 21)
    ours = block_fake_quant(x, fmt, amax)
    _same_bits(ours, _ort_run(model, x.numpy()))
    units = (ours / scale.repeat_interleave(block_size, dim=1)).round()
    assert set(units.unique().tolist()) == set(range(-8, 8))  # every code reached


def test_int4_per_channel_qdq_equals_onnx_runtime_bit_for_bit() -> None:
    fmt = INT4.with_block_size(None)
    x, amax, _ = _int4_case(None, rows=4)
    scale, _ = block_scales(x.t().contiguous(), fmt, amax, axis=1)  # channels on axis 1
    zp = helper.make_tensor("z", TensorProto.INT4, [4], [0] * 4)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=0),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=0),
    ]
    model = _model(nodes, [numpy_helper.from_array(scale.numpy(), "s"), zp], 21)
    ours = block_fake_quant(x, fmt, amax, axis=0)
    _same_bits(ours, _ort_run(model, x.numpy()))
    assert torch.equal(block_fake_quant(x.t(), fmt, amax, axis=1), ours.t())


def test_int4_dequantize_of_every_code_equals_onnx_runtime() -> None:
    """DequantizeLinear with an INT4 initializer (the exported weight) and block_size."""
    codes = np.resize(np.arange(-8, 8), (4, 64)).astype(np.int64)
    gen = np.random.default_rng(1)
    amax = torch.from_numpy(_f32(gen.uniform(1e-3, 50.0, size=(4, 2))))
    fmt = INT4.with_block_size(32)
    dummy = torch.zeros(4, 64)
    scale, _ = block_scales(dummy, fmt, amax)
    w = helper.make_tensor("w", TensorProto.INT4, [4, 64], codes.flatten().tolist())
    node = helper.make_node("DequantizeLinear", ["w", "s"], ["y"], axis=1, block_size=32)
    graph = helper.make_graph(
        [node], "dq", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w, numpy_helper.from_array(scale.numpy(), "s")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    options = ort.SessionOptions()
    theirs = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    ).run(None, {})[0]
    x = torch.from_numpy(codes.astype(np.float32)) * scale.repeat_interleave(32, dim=1)
    _same_bits(block_fake_quant(x, fmt, amax), theirs)


def test_int4_nan_stays_nan_and_amax_defaults_to_the_blocks() -> None:
    x = torch.linspace(-3, 3, 128).reshape(2, 64)
    x[0, 3] = float("nan")
    out = block_fake_quant(x, INT4.with_block_size(32))
    assert torch.isnan(out[0, :32]).all() and not torch.isnan(out[0, 32:]).any()  # its block
    assert torch.equal(out[1], block_fake_quant(x[1:], INT4.with_block_size(32))[0])
    assert float(out[1].abs().max()) == pytest.approx(3.0)


# ---------------------------------------------------------------- E2M1, brute force and ONNX


def _e2m1_codes() -> list[tuple[int, float]]:
    """Every E2M1 code from its bits: sign, 2 exponent bits (bias 1), 1 mantissa bit."""
    out = []
    for code in range(16):
        sign, exp, man = code >> 3, (code >> 1) & 3, code & 1
        mag = man * 0.5 if exp == 0 else 2.0 ** (exp - 1) * (1 + man / 2)
        out.append((code, -mag if sign else mag))
    return out


def _e2m1_brute(x: float) -> float:
    """Nearest E2M1 value by exhaustive search; ties to the code whose mantissa bit is 0;
    saturating; the sign of x kept on zero; NaN stays NaN."""
    if math.isnan(x):
        return x
    if abs(x) > 6:
        return math.copysign(6.0, x)
    best = min(
        (c for c in _e2m1_codes() if (c[1] > 0) == (x > 0) or c[1] == 0),
        key=lambda c: (abs(abs(x) - abs(c[1])), c[0] & 1),
    )
    return math.copysign(abs(best[1]), x)


def _e2m1_probe() -> np.ndarray:
    grid = np.array(E2M1_GRID, dtype=np.float32)
    mids = (grid[:-1] + grid[1:]) / 2
    up, down = np.float32(np.inf), np.float32(-np.inf)
    special = _f32([6.5, 7.0, 100.0, 3e38, np.inf, 1e-30, 1e-45, 0.0])
    gen = np.random.default_rng(2)
    pos = np.concatenate([
        grid, mids, np.nextafter(mids, up), np.nextafter(mids, down), special,
        _f32(gen.uniform(0, 8, 4000)),
    ])  # fmt: skip
    return np.concatenate([pos, -pos, _f32([np.nan])])


def test_e2m1_codes_and_grid() -> None:
    values = sorted({abs(v) for _, v in _e2m1_codes()})
    assert tuple(values) == E2M1_GRID
    grid = torch.tensor([v for _, v in _e2m1_codes()])
    assert torch.equal(e2m1_round(grid), grid)  # every code is a fixed point (±0 included)
    torch_codes = torch.arange(256, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    assert torch_codes.dtype == torch.float4_e2m1fn_x2  # torch has the storage type, no casts


def test_e2m1_round_equals_the_brute_force_table() -> None:
    x = _e2m1_probe()
    ours = e2m1_round(torch.from_numpy(x))
    theirs = np.array([_e2m1_brute(float(v)) for v in x], dtype=np.float32)
    _same_bits(ours, theirs)
    mids = {0.25: 0.0, 0.75: 1.0, 1.25: 1.0, 1.75: 2.0, 2.5: 2.0, 3.5: 4.0, 5.0: 4.0}
    got = e2m1_round(torch.tensor(list(mids))).tolist()
    assert got == list(mids.values())  # ties to even, written out


@pytest.mark.parametrize("scale", [1.0, 0.37, 2.0**-20, 1234.5])
def test_e2m1_qdq_equals_the_onnx_reference_evaluator(scale: float) -> None:
    x = _e2m1_probe()[:-1]  # no NaN: E2M1 has none, the evaluator (ml_dtypes) gives -0
    with np.errstate(over="ignore"):  # 3e38·1234.5: inf
        x = (x.astype(np.float64) * scale).astype(np.float32)
    zp = helper.make_tensor("z", TensorProto.FLOAT4E2M1, [], [0.0])
    s = numpy_helper.from_array(np.array(scale, dtype=np.float32), "s")
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"]),
    ]
    theirs = _ref_run(_model(nodes, [s, zp], 23), x)
    s32 = torch.tensor(np.float32(scale))
    ours = e2m1_round(torch.from_numpy(x) / s32) * s32
    assert bool(_negative_zero(torch.from_numpy(x)).any())
    _same_bits(ours, theirs, _negative_zero(torch.from_numpy(x)))
    _check_negative_zero(torch.from_numpy(x), ours, theirs)


def _negative_zero(x: torch.Tensor) -> torch.Tensor:
    return (x == 0) & torch.signbit(x)


def _check_negative_zero(x: torch.Tensor, ours: torch.Tensor, theirs: np.ndarray) -> None:
    """A -0.0 input: the reference evaluator's QuantizeLinear adds the zero point before its
    FP4 cast (``-0.0 + 0.0 = +0.0``); we keep the sign, as the E2M1 code 0b1000 (-0) does and
    as our FP8 path and ONNX Runtime's FP8 QuantizeLinear do."""
    neg = _negative_zero(x)
    assert bool(torch.signbit(ours[neg]).all()) and bool((ours[neg] == 0).all())
    assert not np.signbit(theirs[neg.numpy()]).any()


# ---------------------------------------------------------------- NVFP4 two-level scaling


def _nvfp4_reference(x: np.ndarray, gs: np.float32) -> tuple[np.ndarray, np.ndarray]:
    """NVFP4 as standard ONNX operators (opset 23) in the reference evaluator: block amax,
    ``/ (gs·6)``, QuantizeLinear to E4M3 (saturate), zero block scale -> 1.0, DequantizeLinear
    with the per-tensor scale (the exported weight's first DQ), then the FP4 Q/DQ with
    block_size 16. Returns (output, float block scales)."""
    r, k = x.shape
    one = numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one")
    zero = numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero")
    inits = [
        numpy_helper.from_array(np.array([r, k // 16, 16], dtype=np.int64), "shape"),
        numpy_helper.from_array(np.array([-1], dtype=np.int64), "axes"),
        numpy_helper.from_array(np.array(gs, dtype=np.float32), "gs"),
        numpy_helper.from_array(np.array(6.0, dtype=np.float32), "six"),
        one, zero,
        helper.make_tensor("z8", TensorProto.FLOAT8E4M3FN, [], [0.0]),
        helper.make_tensor("z4", TensorProto.FLOAT4E2M1, [r, k // 16], [0.0] * (r * k // 16)),
    ]  # fmt: skip
    n = helper.make_node
    nodes = [
        n("Reshape", ["x", "shape"], ["xb"]),
        n("Abs", ["xb"], ["ab"]),
        n("ReduceMax", ["ab", "axes"], ["bamax"], keepdims=0),
        n("Mul", ["gs", "six"], ["gs6"]),
        n("Div", ["bamax", "gs6"], ["raw"]),
        n("QuantizeLinear", ["raw", "one", "z8"], ["sb8"], saturate=1),
        n("DequantizeLinear", ["sb8", "one", "z8"], ["sbf"]),
        n("Equal", ["sbf", "zero"], ["is0"]),
        n("Where", ["is0", "one", "sbf"], ["sbg"]),
        n("QuantizeLinear", ["sbg", "one", "z8"], ["sb8g"]),
        n("DequantizeLinear", ["sb8g", "gs", "z8"], ["s"]),
        n("QuantizeLinear", ["x", "s", "z4"], ["q"], axis=1, block_size=16),
        n("DequantizeLinear", ["q", "s", "z4"], ["y"], axis=1, block_size=16),
    ]
    graph = helper.make_graph(
        nodes, "nvfp4", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("sbg", TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)
    with np.errstate(all="ignore"):
        y, sbg = ReferenceEvaluator(model).run(None, {"x": x})
    return np.asarray(y), np.asarray(sbg)


def _nvfp4_case() -> torch.Tensor:
    """Rows of 4 blocks of 16: normal data over 12 decades, a zero block, blocks whose E4M3
    scale is subnormal or underflows to 0, one holding the tensor amax (scale 448), every E2M1
    midpoint on exact power-of-two scales, ±0, infinities."""
    gen = np.random.default_rng(3)
    rows = [gen.standard_normal(64) * 10.0 ** gen.uniform(-6, 6) for _ in range(12)]
    x = np.stack(rows).astype(np.float32)
    mids = _f32([6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -0.75, -1.25, -1.75, -2.5,
                 -3.5, -5, 0])  # fmt: skip
    x[0, :16] = 0.0
    x[1, :16] = mids * 2.0**-12  # tensor amax 2688·2**-4 below: block scale 2**-8, exact
    x[1, 16:32] = mids * 2.0**-6  # block scale 2**-2
    x[1, 32:48] = _f32(np.nextafter(mids, np.float32(np.inf))) * 2.0**-6
    x[1, 48:64] = _f32([2688 * 2.0**-4] + [0.0] * 15)  # the tensor amax: block scale 448
    x[2, :16] = gen.standard_normal(16) * 1e-9  # E4M3 block scale underflows to 0 -> 1.0
    x[2, 16:32] = gen.uniform(-4e-5, 4e-5, 16)  # a subnormal E4M3 block scale (amax 5)
    x[2, 32:48] = _f32([-0.0, 0.0] * 8)
    x[2, 48:64] = _f32([np.inf, -np.inf] + [1.0] * 14)
    return torch.from_numpy(x)


def _nvfp4_scales(
    x: torch.Tensor, amax: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    sb, gs = block_scales(x, NVFP4, amax)
    assert gs is not None
    return sb, gs


def test_nvfp4_equals_the_two_level_onnx_reference_bit_for_bit() -> None:
    x = _nvfp4_case()
    finite = x[:, :48].clone()
    two = x[:2].clone()  # tensor amax = 2688·2**-4 exactly: power-of-two scales
    for case, amax in ((two, None), (finite, None), (x, torch.tensor(5.0))):
        sb, gs = _nvfp4_scales(case, amax)
        ref_y, ref_sb = _nvfp4_reference(case.numpy(), np.float32(gs))
        _same_bits(sb, ref_sb)
        ours = block_fake_quant(case, NVFP4, amax)
        _same_bits(ours, ref_y, _negative_zero(case))
        _check_negative_zero(case, ours, ref_y)
    sb, gs = _nvfp4_scales(two)
    assert float(gs) == 2.0**-4 and sb[1].tolist() == [2.0**-8, 2.0**-2, 2.0**-2, 448.0]
    out = block_fake_quant(two, NVFP4)
    s = float(gs) * 2.0**-8
    assert (out[1, :16] / s).tolist() == [6, 0, 1, 1, 2, 2, 4, 4, -0.0, -1, -1, -2, -2, -4, -4, 0]


def test_nvfp4_block_scale_edges() -> None:
    x = _nvfp4_case()
    sb, gs = _nvfp4_scales(x, torch.tensor(5.0))
    assert float(gs) == np.float32(5.0) / np.float32(2688.0)
    assert float(sb[0, 0]) == 1.0  # zero block: 1.0, and its values stay 0
    assert float(sb[2, 0]) == 1.0  # underflow to 0 in E4M3: 1.0, values come out ±0
    assert 0 < float(sb[2, 1]) < 2.0**-6  # an E4M3 subnormal
    assert float(sb.max()) == 448.0  # blocks past the calibrated amax saturate the scale
    out = block_fake_quant(x, NVFP4, torch.tensor(5.0))
    assert bool((out[2, :16] == 0).all()) and not torch.isnan(out[:, :48]).any()
    assert float(out[2, 48]) == float(6 * (sb[2, 3] * gs))  # inf saturates
    assert (out[2, 32:48].view(torch.int32) == x[2, 32:48].view(torch.int32)).all()  # ±0
    zeros = torch.zeros(2, 16)
    assert torch.equal(block_fake_quant(zeros, NVFP4), zeros)  # amax 0: floored gs, no NaN
    nan = torch.ones(1, 32)
    nan[0, 3] = float("nan")
    out = block_fake_quant(nan, NVFP4, torch.tensor(1.0))
    assert torch.isnan(out[0, :16]).all() and torch.equal(out[0, 16:], torch.ones(16))


# ---------------------------------------------------------------- MXFP8 and E8M0


def _ceil_exp(amax: float) -> float:
    """Smallest e with 2**e >= fl32(amax / 448), clamped to [-127, 127], by search."""
    if math.isnan(amax):
        return math.nan
    v = float(np.float32(amax) / np.float32(448.0))
    if math.isinf(v):
        return 127.0
    e = -127
    while e < 127 and 2.0**e < v:
        e += 1
    return float(e)


def _floor_exp(amax: float) -> float:
    """OCP MX: floor(log2(amax)) - 8, by search, clamped to [-127, 127]."""
    if math.isnan(amax):
        return math.nan
    if amax == 0:
        return -127.0
    if math.isinf(amax):
        return 127.0
    e = 200
    while 2.0**e > amax:
        e -= 1
    return float(min(max(e - 8, -127), 127))


def _amax_probe() -> np.ndarray:
    powers = [448 * 2.0**k for k in range(-140, 118, 7)] + [2.0**k for k in range(-149, 128, 5)]
    p = _f32(powers)
    special = _f32([0.0, 1e-45, 448.0, 449.0, 511.0, 512.0, 3.4e38, np.inf, np.nan, 1.0])
    gen = np.random.default_rng(4)
    rand = _f32(10.0 ** gen.uniform(-40, 38, 2000))
    return np.concatenate([p, np.nextafter(p, np.float32(0)), np.nextafter(p, np.float32(np.inf)),
                           special, rand])  # fmt: skip


@pytest.mark.parametrize(("rule", "expected"), [("ceil", _ceil_exp), ("floor", _floor_exp)])
def test_e8m0_exponent_equals_a_search(rule: str, expected: object) -> None:
    amax = _amax_probe()
    ours = e8m0_exponent(torch.from_numpy(amax), rule).numpy()
    theirs = np.array([expected(float(a)) for a in amax], dtype=np.float32)  # type: ignore[operator]
    np.testing.assert_array_equal(ours, theirs)
    scale = e8m0_scale(torch.from_numpy(ours))
    finite = ~np.isnan(ours)
    assert [float(s) for s in scale[finite]] == [2.0 ** int(e) for e in ours[finite]]


def test_e8m0_ceil_equals_onnx_cast_round_up_saturate() -> None:
    amax = _amax_probe()
    v = amax / np.float32(448.0)
    n = helper.make_node
    model = _model(
        [n("Cast", ["x"], ["e"], to=TensorProto.FLOAT8E8M0, round_mode="up", saturate=1),
         n("Cast", ["e"], ["y"], to=TensorProto.FLOAT)], [], 25,
    )  # fmt: skip
    theirs = _ref_run(model, v)
    ours = e8m0_scale(e8m0_exponent(torch.from_numpy(amax)))
    # the evaluator rounds a float32 subnormal v <= 2**-127 up to 2**-126 (it adds one to the
    # exponent field 0 when the fraction is not 0), and casts inf to NaN despite saturate=1
    # (the operator's table: E8M0_MAX); we follow the exact rule (2**-127, as ModelOpt's
    # ceil(max(log2(v), -127))) and the table (2**127)
    vt = torch.from_numpy(v)
    tiny = (vt > 0) & (vt <= 2.0**-127)
    excused = tiny | torch.isinf(vt)
    assert int(tiny.sum()) > 10 and torch.isinf(vt).any()
    _same_bits(ours, theirs, excused)
    assert bool((ours[tiny] == 2.0**-127).all()) and bool((theirs[tiny.numpy()] == 2.0**-126).all())
    assert bool((ours[torch.isinf(vt)] == 2.0**127).all())


def _mxfp8_reference(x: np.ndarray) -> np.ndarray:
    """MXFP8 as ONNX operators (opset 25): block amax / 448, Cast to FLOAT8E8M0 (round up,
    saturate), QuantizeLinear to E4M3 with block_size 32, DequantizeLinear with the E8M0 scale."""
    r, k = x.shape
    n = helper.make_node
    inits = [
        numpy_helper.from_array(np.array([r, k // 32, 32], dtype=np.int64), "shape"),
        numpy_helper.from_array(np.array([-1], dtype=np.int64), "axes"),
        numpy_helper.from_array(np.array(448.0, dtype=np.float32), "emax"),
        helper.make_tensor("z8", TensorProto.FLOAT8E4M3FN, [r, k // 32], [0.0] * (r * k // 32)),
    ]
    nodes = [
        n("Reshape", ["x", "shape"], ["xb"]),
        n("Abs", ["xb"], ["ab"]),
        n("ReduceMax", ["ab", "axes"], ["bamax"], keepdims=0),
        n("Div", ["bamax", "emax"], ["v"]),
        n("Cast", ["v"], ["e"], to=TensorProto.FLOAT8E8M0, round_mode="up", saturate=1),
        n("Cast", ["e"], ["s"], to=TensorProto.FLOAT),
        n("QuantizeLinear", ["x", "s", "z8"], ["q"], axis=1, block_size=32, saturate=1),
        n("DequantizeLinear", ["q", "e"], ["y"], axis=1, block_size=32,
          output_dtype=TensorProto.FLOAT),
    ]  # fmt: skip
    return _ref_run(_model(nodes, inits, 25), x)


def _mxfp8_case() -> torch.Tensor:
    gen = np.random.default_rng(5)
    rows = [gen.standard_normal(64) * 10.0 ** gen.uniform(-35, 35) for _ in range(10)]
    x = np.stack(rows).astype(np.float32)
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
    vals = np.unique(codes[np.isfinite(codes) & (codes >= 0)])
    mids = (vals[:-1] + vals[1:]) / 2
    x[0, :32] = 0.0
    x[0, 32:64] = _f32([448.0, *list(mids[-31:])]) * 2.0**-3  # block scale 2**-3 exactly
    x[1, :32] = _f32([449.0, *list(mids[:31])]) * 2.0**-3  # 449 rounds the scale up to 2**-2
    x[1, 32:64] = _f32([2.0**-149, 2.0**-140] + [0.0] * 30)  # scale 2**-127, float32 subnormals
    x[2, :32] = _f32([3.4e38, -3.4e38] + [1.0] * 30)  # scale 2**120
    x[2, 32:64] = _f32([np.inf] + [2.0] * 31)  # inf: scale 2**127, the rest 0
    x[3, :32] = _f32([-0.0, 0.0] * 16)
    return torch.from_numpy(x)


def test_mxfp8_equals_the_onnx_reference_bit_for_bit() -> None:
    x = _mxfp8_case()
    ours = block_fake_quant(x, MXFP8)
    excused = torch.zeros_like(x, dtype=torch.bool)
    excused[2, 32:] = True  # inf: the evaluator's NaN scale (see the E8M0 cast test)
    theirs = _mxfp8_reference(x.numpy())
    _same_bits(ours, theirs, excused)
    assert np.isnan(theirs[2, 32:]).all()
    assert ours[2, 32] == float("inf") and bool((ours[2, 33:] == 0).all())  # 448·2**127
    e, _ = block_scales(x, MXFP8)
    assert (
        e[0].tolist() == [-127, -3] and e[1].tolist() == [-2, -127] and e[2].tolist() == [120, 127]
    )
    unit = ours[0, 32:] / 2.0**-3  # the E4M3 midpoints rounded to even on an exact scale
    expected = torch.from_numpy(x[0, 32:].numpy() / 2.0**-3).to(torch.float8_e4m3fn).float()
    assert torch.equal(unit, expected)


def test_mxfp8_ocp_floor_rule_saturates_the_block_max() -> None:
    fmt = BlockFormat("mxfp8", "e4m3", 32, "e8m0", e8m0_rule="floor")
    x = torch.full((1, 32), 1.0)
    x[0, 0] = 511.0
    e, _ = block_scales(x, fmt)
    assert e.tolist() == [[0.0]] and block_fake_quant(x, fmt)[0, 0] == 448.0
    assert block_scales(x, MXFP8)[0].tolist() == [[1.0]] and block_fake_quant(x, MXFP8)[0, 0] == 512


# ---------------------------------------------------------------- STE, dtypes, axes, errors


@pytest.mark.parametrize(
    ("fmt", "amax"),
    [(NVFP4, torch.tensor(2.0)), (MXFP8, None), (INT4.with_block_size(32), torch.tensor([[2.0]]))],
)
def test_ste_passes_inside_each_blocks_clip_range(fmt: BlockFormat, amax: object) -> None:
    x = torch.linspace(-4, 4, 32).reshape(1, 32)
    x = x.clone().requires_grad_(True)
    out = block_fake_quant(x, fmt, amax)  # type: ignore[arg-type]
    out.backward(torch.full_like(out, 3.0))
    assert x.grad is not None
    if fmt is MXFP8:  # the scale rounds up: nothing clips
        assert torch.equal(x.grad, torch.full_like(x, 3.0))
        return
    sb, gs = block_scales(x.detach(), fmt, amax)  # type: ignore[arg-type]
    s = sb * gs if gs is not None else sb
    inside = x.detach().abs() <= s.repeat_interleave(16 if fmt is NVFP4 else 32, dim=1) * fmt.qmax
    assert 0 < int(inside.sum()) < 32
    assert torch.equal(x.grad, torch.where(inside, 3.0, 0.0))


def test_ste_zero_at_nan_and_no_graph_without_grad() -> None:
    x = torch.ones(1, 16)
    x[0, 1] = float("nan")
    x.requires_grad_(True)
    block_fake_quant(x, NVFP4, torch.tensor(1.0)).sum().backward()
    assert x.grad is not None and x.grad[0, 1] == 0
    assert block_fake_quant(torch.ones(1, 16), NVFP4).grad_fn is None


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("fmt", [NVFP4, MXFP8, INT4.with_block_size(32)])
def test_half_inputs_are_computed_in_float32(dtype: torch.dtype, fmt: BlockFormat) -> None:
    torch.manual_seed(0)
    x = (torch.randn(4, 64) * 3).to(dtype)
    out = block_fake_quant(x, fmt)
    assert out.dtype == dtype
    assert torch.equal(out, block_fake_quant(x.float(), fmt).to(dtype))


def test_blocks_along_another_axis_and_higher_rank() -> None:
    torch.manual_seed(1)
    x = torch.randn(2, 64, 3)
    for fmt in (NVFP4, MXFP8, INT4.with_block_size(32)):
        moved = block_fake_quant(x.transpose(1, 2).contiguous(), fmt, axis=-1)
        assert torch.equal(block_fake_quant(x, fmt, axis=1), moved.transpose(1, 2))
    assert block_amax(x, NVFP4, axis=1).shape == (2, 4, 3)
    assert block_amax(x, INT4.with_block_size(None), axis=1).shape == (64,)


def test_clear_errors() -> None:
    with pytest.raises(ValueError, match=r"nvfp4: axis 1 of shape \(2, 24\) has 24 elements, "
                       r"not a multiple of the block size 16"):  # fmt: skip
        block_fake_quant(torch.ones(2, 24), NVFP4)
    with pytest.raises(ValueError, match="block size 32"):
        block_fake_quant(torch.ones(48, 2), MXFP8, axis=0)
    with pytest.raises(ValueError, match="out of range"):
        block_fake_quant(torch.ones(2, 16), NVFP4, axis=2)
    with pytest.raises(ValueError, match="MXFP8 scales are the blocks' own"):
        block_fake_quant(torch.ones(1, 32), MXFP8, torch.tensor(1.0))
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite and >= 0"):
            block_fake_quant(torch.ones(1, 16), NVFP4, bad)
    with pytest.raises(ValueError, match="amax has 1 values, expected 2"):
        block_fake_quant(torch.ones(1, 64), INT4.with_block_size(32), torch.tensor(1.0))
    with pytest.raises(TypeError, match="floating-point"):
        block_fake_quant(torch.ones(1, 16, dtype=torch.int32), NVFP4)
    with pytest.raises(ValueError, match="0-d"):
        block_fake_quant(torch.tensor(1.0), NVFP4)
    with pytest.raises(ValueError, match="even int >= 2, got 3"):
        INT4.with_block_size(3)
    with pytest.raises(ValueError, match="only INT4 may be per channel"):
        NVFP4.with_block_size(None)
    with pytest.raises(ValueError, match="unknown element type 'e3m2'"):
        BlockFormat("x", "e3m2", 32, "e8m0")
    with pytest.raises(ValueError, match="unknown E8M0 rule 'nearest'"):
        e8m0_exponent(torch.ones(1), "nearest")


def test_nvfp4_block_scale_divides_by_the_product_gs_times_6() -> None:
    """``block_amax / (gs·6)`` (ModelOpt's ``per_block_amax / (6.0 * weights_scaling_factor_2)``),
    not ``block_amax / 6 / gs``: for this block amax the two fall either side of the E4M3
    midpoint 1.0625 (1.0 against 1.125)."""
    x = torch.zeros(1, 16)
    x[0, 0] = float(np.float32(0.011858259327709675))
    sb, gs = _nvfp4_scales(x, torch.tensor(5.0))
    assert sb.tolist() == [[1.0]]
    other = e4m3_round(x.abs().amax() / torch.tensor(6.0) / gs)
    assert float(other) == 1.125
    ref_y, ref_sb = _nvfp4_reference(x.numpy(), np.float32(gs))
    _same_bits(sb, ref_sb)
    _same_bits(block_fake_quant(x, NVFP4, torch.tensor(5.0)), ref_y)
