"""Block-format weight calibration (issue 60): ``max``/``mse`` per block and the AWQ clip search."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qdq.calib.blocks import CLIP_GRID, block_sq_error, block_weight_amax, clip_grid
from qdq.ptq.awq import (
    InputGram,
    awq_clip_amax,
    awq_scale_search,
    output_error,
    output_sqnr_db,
)
from qdq.quant.blocks import INT4, MXFP8, NVFP4, block_amax, block_fake_quant

BLOCKS = (None, 2, 8, 16, 32)


def _heavy(rows: int, cols: int, seed: int, df: float = 2.0) -> torch.Tensor:
    """Student-t weights (heavy tails: a few large values per block)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        t = torch.distributions.StudentT(torch.tensor(df)).sample((rows, cols))
    return (t * 0.02).float()


def _inputs(tokens: int, k: int, seed: int, spread: float = 3.0) -> torch.Tensor:
    """Inputs with outlier channels (log-normal channel scales), as transformer activations."""
    gen = torch.Generator().manual_seed(seed)
    scales = (torch.rand(k, generator=gen) * spread).exp()
    return torch.randn(tokens, k, generator=gen) * scales


def _gram(x: torch.Tensor) -> torch.Tensor:
    g = InputGram(x.shape[-1])
    g.add(x)
    return g.gram


# ------------------------------------------------------------------------------ max and mse
@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 2**31 - 1),
    st.sampled_from(BLOCKS),
    st.integers(1, 6),
    st.integers(1, 4),
    st.sampled_from((1.0, 2.0, 5.0, 100.0)),
)
def test_int4_mse_never_worse_than_max_per_block(
    seed: int, block: int | None, rows: int, nblocks: int, df: float
) -> None:
    cols = (block or 16) * nblocks
    w = _heavy(rows, cols, seed, df)
    fmt = INT4.with_block_size(block)
    ax = 0 if block is None else -1
    a_max = block_weight_amax(w, fmt, ax, "max")
    a_mse = block_weight_amax(w, fmt, ax, "mse")
    assert a_mse.shape == a_max.shape == block_amax(w, fmt, ax).shape
    e_max = block_sq_error(w, block_fake_quant(w, fmt, a_max, ax), fmt, ax)
    e_mse = block_sq_error(w, block_fake_quant(w, fmt, a_mse, ax), fmt, ax)
    assert bool((e_mse <= e_max).all())
    # every amax is a grid ratio times the block max (the exact candidate that was measured)
    for am, bm in zip(a_mse.flatten().tolist(), a_max.flatten().tolist(), strict=True):
        assert any(am == float(torch.tensor(bm) * r) for r in CLIP_GRID)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 4), st.integers(1, 3))
def test_nvfp4_mse_never_worse_than_max(seed: int, rows: int, nblocks: int) -> None:
    w = _heavy(rows, 16 * nblocks, seed)
    e = []
    for method in ("max", "mse"):
        amax = block_weight_amax(w, NVFP4, -1, method)
        assert amax.shape == ()
        e.append(float(block_sq_error(w, block_fake_quant(w, NVFP4, amax), NVFP4).sum()))
    assert e[1] <= e[0]


@pytest.mark.parametrize("block", [128, 32, None])
def test_mse_reduces_error_on_heavy_tails(block: int | None) -> None:
    w = _heavy(64, 256, seed=3, df=2.0)
    fmt = INT4.with_block_size(block)
    ax = 0 if block is None else -1
    err = {}
    for method in ("max", "mse"):
        q = block_fake_quant(w, fmt, block_weight_amax(w, fmt, ax, method), ax)
        err[method] = float(block_sq_error(w, q, fmt, ax).sum())
    assert err["mse"] < 0.9 * err["max"]


def test_mse_keeps_max_when_nothing_clips_better() -> None:
    # every value on the INT4 grid of its block max: max is exact, any clip only adds error
    w = torch.tensor([[7.0, -3.0, 1.0, 0.0, 2.0, -7.0, 5.0, 4.0]])
    fmt = INT4.with_block_size(8)
    assert torch.equal(block_weight_amax(w, fmt, method="mse"), torch.tensor([[7.0]]))


def test_mxfp8_has_nothing_to_search() -> None:
    w = _heavy(4, 64, seed=0)
    for method in ("max", "mse"):
        assert torch.equal(block_weight_amax(w, MXFP8, -1, method), w.abs().amax())


def test_blocks_along_axis_zero_and_zero_blocks() -> None:
    w = _heavy(64, 3, seed=1)
    w[:32, 0] = 0.0
    a = block_weight_amax(w, INT4.with_block_size(32), axis=0, method="mse")
    assert a.shape == (2, 3)
    assert a[0, 0] == 0.0  # a zero block stays at 0 (the scale floor handles it)


def test_clip_grid() -> None:
    assert CLIP_GRID[0] == 1.0 and CLIP_GRID[-1] == 0.5 and len(CLIP_GRID) == 51
    assert clip_grid(0.9, 0.05) == (1.0, 0.95, 0.9)
    with pytest.raises(ValueError, match="lowest"):
        clip_grid(0.0)
    with pytest.raises(ValueError, match="step"):
        clip_grid(0.5, 0.0)


def test_block_weight_amax_errors() -> None:
    w = torch.randn(4, 32)
    with pytest.raises(ValueError, match="method must be one of"):
        block_weight_amax(w, INT4, method="entropy")
    with pytest.raises(ValueError, match="multiple of the block size 128"):
        block_weight_amax(w, INT4, method="mse")
    with pytest.raises(ValueError, match="include 1.0"):
        block_weight_amax(w, INT4.with_block_size(32), method="mse", grid=(0.9, 0.8))
    with pytest.raises(ValueError, match="in \\(0, 1\\]"):
        block_weight_amax(w, INT4.with_block_size(32), method="mse", grid=(1.0, 1.5))
    with pytest.raises(TypeError, match="grid must be a sequence"):
        block_weight_amax(w, INT4.with_block_size(32), grid="1.0")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="floating-point"):
        block_weight_amax(torch.ones(4, 32, dtype=torch.int32), INT4.with_block_size(32))
    with pytest.raises(TypeError, match="BlockFormat"):
        block_weight_amax(w, "int4")  # type: ignore[arg-type]
    bad = w.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf"):
        block_weight_amax(bad, INT4.with_block_size(32), method="mse")
    with pytest.raises(ValueError, match="shape"):
        block_sq_error(w, w[:2], INT4.with_block_size(32))


# -------------------------------------------------------------------------------- the AWQ clip
def _reference_awq(
    w: torch.Tensor, x: torch.Tensor, block: int, grid: tuple[float, ...]
) -> torch.Tensor:
    """llm-awq's auto_clip (per block, the block's own partial output error over the tokens),
    then the per-row guard on the whole output error: loops, from X itself."""
    fmt = INT4.with_block_size(block)
    bmax = block_amax(w, fmt)
    x64 = x.double()
    amax = bmax.clone()
    for r in range(w.shape[0]):
        for g in range(w.shape[1] // block):
            cols = slice(g * block, (g + 1) * block)
            best, best_err = None, None
            for ratio in grid:
                a = bmax[r : r + 1, g : g + 1] * ratio
                e = block_fake_quant(w[r : r + 1, cols], fmt, a).double() - w[r : r + 1, cols]
                err = float((x64[:, cols] @ e[0]).square().sum())
                if best_err is None or err < best_err:
                    best, best_err = a, err
            amax[r, g] = best
    whole = [
        float((x64 @ (block_fake_quant(w, fmt, a) - w).double()[r]).square().sum())
        for a in (amax, bmax)
        for r in range(w.shape[0])
    ]
    n = w.shape[0]
    keep = torch.tensor([whole[r] < whole[n + r] for r in range(n)])
    return torch.where(keep[:, None], amax, bmax)


@pytest.mark.parametrize("seed", [5, 6, 7])
def test_awq_matches_the_reference_loop(seed: int) -> None:
    w = _heavy(6, 64, seed=seed)
    x = _inputs(200, 64, seed=seed + 100)
    grid = clip_grid(0.5, 0.05)
    got = awq_clip_amax(w, _gram(x), INT4.with_block_size(16), grid=grid, sweeps=0)
    # the Gram and the token loop sum in other orders; no two ratios come that close here
    assert torch.equal(got, _reference_awq(w, x, 16, grid))


@settings(max_examples=25, deadline=None)
@given(
    st.integers(0, 2**31 - 1),
    st.sampled_from((8, 16, 32)),
    st.integers(1, 8),
    st.integers(1, 4),
    st.integers(0, 2),
)
def test_awq_never_worse_than_max_on_its_objective(
    seed: int, block: int, rows: int, nblocks: int, sweeps: int
) -> None:
    k = block * nblocks
    w = _heavy(rows, k, seed)
    h = _gram(_inputs(3 * k, k, seed + 1))
    fmt = INT4.with_block_size(block)
    amax = awq_clip_amax(w, h, fmt, sweeps=sweeps, grid=clip_grid(0.5, 0.05))
    assert amax.shape == block_amax(w, fmt).shape
    assert bool((amax <= block_amax(w, fmt)).all())
    e_awq = output_error(w, block_fake_quant(w, fmt, amax), h)
    e_max = output_error(w, block_fake_quant(w, fmt), h)
    assert bool((e_awq <= e_max * (1 + 1e-9) + 1e-30).all())  # per row: float64 sums' order


@pytest.mark.parametrize("sweeps", [0, 1, 2])
def test_awq_reduces_output_error_with_outlier_channels(sweeps: int) -> None:
    w = _heavy(32, 128, seed=7, df=5.0)
    x = _inputs(1024, 128, seed=8)
    h = _gram(x)
    fmt = INT4.with_block_size(32)
    amax = awq_clip_amax(w, h, fmt, sweeps=sweeps)
    e_awq = float(output_error(w, block_fake_quant(w, fmt, amax), h).sum())
    e_max = float(output_error(w, block_fake_quant(w, fmt), h).sum())
    e_mse = float(
        output_error(w, block_fake_quant(w, fmt, block_weight_amax(w, fmt, method="mse")), h).sum()
    )
    assert e_awq < e_mse < e_max


def test_sweeps_never_raise_the_objective() -> None:
    w = _heavy(16, 128, seed=9)
    h = _gram(_inputs(512, 128, seed=10))
    fmt = INT4.with_block_size(16)
    errs = [
        float(
            output_error(w, block_fake_quant(w, fmt, awq_clip_amax(w, h, fmt, sweeps=s)), h).sum()
        )
        for s in (0, 1, 2)
    ]
    assert errs[1] <= errs[0] * (1 + 1e-12) and errs[2] <= errs[1] * (1 + 1e-12)


def test_awq_per_channel_is_the_exact_row_search() -> None:
    w = _heavy(5, 48, seed=11)
    h = _gram(_inputs(300, 48, seed=12))
    fmt = INT4.with_block_size(None)
    grid = clip_grid(0.5, 0.1)
    got = awq_clip_amax(w, h, fmt, axis=0, grid=grid)
    bmax = block_amax(w, fmt, 0)
    for r in range(5):
        row = w[r : r + 1]
        errs = [
            float(output_error(row, block_fake_quant(row, fmt, (bmax[r] * g).reshape(1), 0), h)[0])
            for g in grid
        ]
        assert float(got[r]) == float(bmax[r] * grid[errs.index(min(errs))])


def test_awq_errors() -> None:
    w, h = torch.randn(4, 32), torch.eye(32, dtype=torch.float64)
    fmt = INT4.with_block_size(16)
    with pytest.raises(ValueError, match="INT4 weights"):
        awq_clip_amax(w, h, NVFP4)
    with pytest.raises(ValueError, match="axis must be the input axis"):
        awq_clip_amax(w, h, fmt, axis=0)
    with pytest.raises(ValueError, match="axis must be the channel axis 0"):
        awq_clip_amax(w, h, INT4.with_block_size(None), axis=-1)
    with pytest.raises(ValueError, match="gram must be"):
        awq_clip_amax(w, torch.eye(16), fmt)
    with pytest.raises(ValueError, match="Linear weight"):
        awq_clip_amax(torch.randn(2, 4, 32), h, fmt)
    with pytest.raises(ValueError, match="sweeps"):
        awq_clip_amax(w, h, fmt, sweeps=-1)
    with pytest.raises(ValueError, match="include 1.0"):
        awq_clip_amax(w, h, fmt, grid=(0.9,))
    with pytest.raises(ValueError, match="multiple of the block size"):
        awq_clip_amax(torch.randn(4, 24), torch.eye(24), fmt)
    with pytest.raises(ValueError, match="NaN or inf"):
        awq_clip_amax(w, h * float("nan"), fmt)
    with pytest.raises(TypeError, match="BlockFormat"):
        awq_clip_amax(w, h, "int4")  # type: ignore[arg-type]


# ----------------------------------------------------------------------- Gram, SQNR and scale
def test_input_gram() -> None:
    x = torch.randn(3, 7, 5)
    g = InputGram(5)
    g.add(x[:1])
    g.add(x[1:])
    flat = x.reshape(-1, 5).double()
    assert g.tokens == 21
    assert torch.allclose(g.gram, flat.T @ flat)
    assert torch.allclose(g.mean_abs, flat.abs().mean(0))
    with pytest.raises(ValueError, match="5 features last"):
        g.add(torch.randn(2, 4))
    with pytest.raises(TypeError, match="floating-point"):
        g.add(torch.ones(2, 5, dtype=torch.int64))
    with pytest.raises(ValueError, match="seen no input"):
        _ = InputGram(2).gram
    with pytest.raises(ValueError, match="features"):
        InputGram(0)


def test_output_error_is_the_output_difference() -> None:
    w, x = torch.randn(6, 32), torch.randn(50, 32)
    q = block_fake_quant(w, INT4.with_block_size(16))
    direct = ((x.double() @ w.double().T) - (x.double() @ q.double().T)).square().sum(0)
    assert torch.allclose(output_error(w, q, _gram(x)), direct)
    assert output_sqnr_db(w, w, _gram(x)) == float("inf")


def test_awq_scale_search() -> None:
    x = _inputs(512, 64, seed=13, spread=4.0)
    stats = InputGram(64)
    stats.add(x)
    w = _heavy(16, 64, seed=14, df=5.0)
    fmt = INT4.with_block_size(32)
    found = awq_scale_search(w, stats, fmt)
    assert found.scale.shape == (64,) and found.amax.shape == (16, 2)
    e_max = float(output_error(w, block_fake_quant(w, fmt), stats.gram).sum())
    assert found.error <= e_max
    eff = found.dequantized(w, fmt)
    assert found.error == pytest.approx(float(output_error(w, eff, stats.gram).sum()), rel=1e-9)
    plain = awq_scale_search(w, stats, fmt, alphas=(0.0,))
    assert plain.alpha == 0.0 and torch.equal(plain.scale, torch.ones(64))
    with pytest.raises(ValueError, match="include 0"):
        awq_scale_search(w, stats, fmt, alphas=(0.5,))
    with pytest.raises(TypeError, match="InputGram"):
        awq_scale_search(w, stats.gram, fmt)  # type: ignore[arg-type]


# ----------------------------------------------------------------------- on a prepared model
def _prepared_int4(net: torch.nn.Module, example: torch.Tensor) -> torch.nn.Module:
    import qdq
    from qdq.config import QuantConfig

    return qdq.prepare(net, (example,), config=QuantConfig(format="int4w"))


def _outlier_batches(shape: tuple[int, ...], n: int = 3) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(21)
    scales = torch.linspace(0.1, 6.0, shape[-1])
    return [torch.randn(*shape, generator=gen) * scales for _ in range(n)]


def test_awq_clip_on_a_prepared_mlp() -> None:
    from qdq.api import quantizers_of
    from qdq.ptq.awq_model import awq_clip

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
    m = _prepared_int4(net, torch.randn(2, 256))
    qs = {q.name: q for q in quantizers_of(m).values()}
    shapes = {n: q.amax.shape for n, q in qs.items()}
    data = _outlier_batches((32, 256))
    report = awq_clip(m, data, num_batches=2)
    assert [r.name for r in report.rows] == ["0:weight", "2:weight"]
    assert report.batches == 2 and report.rows[0].tokens == 64
    for row in report.rows:
        q = qs[row.name]
        assert q.amax_method == "awq" and q.amax.shape == shapes[row.name]
        assert row.sqnr_after_db >= row.sqnr_before_db
    assert report.rows[0].sqnr_after_db > report.rows[0].sqnr_before_db + 0.5
    # the quantizer's values are the exported arithmetic on the searched amax
    w = net[0].weight.detach()
    q0 = qs["0:weight"]
    want = block_fake_quant(w, q0.block_format, q0.amax.reshape(128, -1), -1)
    assert torch.equal(q0(w), want)
    assert "awq" in report.summary().lower() and report.to_dict()["sweeps"] == 1


def test_awq_clip_gpt2_conv1d_weights_in_out() -> None:
    from transformers.pytorch_utils import Conv1D

    from qdq.api import quantizers_of
    from qdq.ptq.awq_model import awq_clip

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln = torch.nn.LayerNorm(128)
            self.up = Conv1D(256, 128)  # GPT-2's Conv1D: weight [in, out], torch.addmm
            self.down = Conv1D(128, 256)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.down(torch.relu(self.up(self.ln(x))))

    torch.manual_seed(1)
    net = Block().eval()
    m = _prepared_int4(net, torch.randn(2, 8, 128))
    before = {p: q.amax.clone() for p, q in quantizers_of(m).items()}
    report = awq_clip(m, _outlier_batches((4, 8, 128)), sweeps=0)
    assert len(report.rows) == 2
    for p, q in quantizers_of(m).items():
        assert q.amax.shape == before[p].shape
        assert bool((q.amax <= before[p] + 1e-12).all())
    assert all(r.sqnr_after_db > r.sqnr_before_db for r in report.rows)


def test_awq_clip_errors_and_nothing_to_do() -> None:
    import qdq
    from qdq.ptq.awq_model import awq_clip

    net = torch.nn.Sequential(torch.nn.Linear(128, 64))
    m = _prepared_int4(net, torch.randn(2, 128))
    with pytest.raises(ValueError, match="num_batches"):
        awq_clip(m, [torch.randn(2, 128)], num_batches=0)
    with pytest.raises(ValueError, match="sweeps"):
        awq_clip(m, [torch.randn(2, 128)], sweeps=-1)
    with pytest.raises(ValueError, match="data was empty"):
        awq_clip(m, [])
    with pytest.raises(ValueError, match="qdq.prepare"):
        awq_clip(net, [torch.randn(2, 128)])
    int8 = qdq.prepare(net, (torch.randn(2, 128),))
    qdq.calibrate(int8, [torch.randn(4, 128)], show_progress=False)
    report = awq_clip(int8, [torch.randn(4, 128)])
    assert report.rows == () and report.summary() == "AWQ clip search: no INT4 weight"
