"""``format="mixed"`` on a target with NVFP4 kernels (issue 60): the GEMMs that can run NVFP4 are
measured in it too and a tensor runs NVFP4 where it is as accurate as the better 8-bit format
(``NVFP4_MARGIN_DB``, 0 dB: the faster format takes a tie), or with ``objective="speed"`` where
every reader measures at least ``NVFP4_MIN_DB``; a target without NVFP4 kernels keeps today's
choice. The tie mechanism is exercised on the tiny transformer with the margin set to 3 dB
(``wide_margin``): there its ``embed`` is 1.7 dB behind FP8, so the default keeps it FP8.

The tiny transformer: an input projection ``embed`` whose weights sit on NVFP4's grid (a model
fine-tuned for NVFP4) and whose input had a planted spike in one calibration batch (the per-tensor
amax FP8 and NVFP4 calibrate by max is 60000 times the other batches' values: FP8's fixed grid
runs out of range, NVFP4's block scales follow each block), so NVFP4 is as accurate as FP8 there;
then LayerNorm -> Q/K/V -> attention -> O, LayerNorm -> MLP, a head. LayerNorm 1 has three
outlier channels (gain 300); every GEMM but ``embed`` measurably prefers INT8 or FP8.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import qdq
from qdq import QuantConfig
from qdq.accuracy import formats
from qdq.accuracy.format_noise import Nvfp4Measure, db, nvfp4_gemm
from qdq.accuracy.formats import MARGIN_DB, MIN_DB, NVFP4_MIN_DB, FormatChoice, choose_formats
from qdq.config import Override
from qdq.pipeline.formats import has_nvfp4

SPIKE = 6e4

WIDE = 3.0  # the tie margin the mechanism tests use (the default is 0 dB)


@pytest.fixture
def wide_margin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(formats, "NVFP4_MARGIN_DB", WIDE)


class TinyTransformer(nn.Module):
    def __init__(self, d: int = 64, heads: int = 4, c: int = 32) -> None:
        super().__init__()
        self.embed = nn.Linear(c, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.head = nn.Linear(d, 16)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        b, t, d = x.shape
        y = self.ln1(x)
        q, k, v = (
            m(y).view(b, t, self.heads, -1).transpose(1, 2) for m in (self.q, self.k, self.v)
        )
        a = (q @ k.transpose(-2, -1) * (d // self.heads) ** -0.5).softmax(-1)
        x = x + self.o((a @ v).transpose(1, 2).reshape(b, t, d))
        x = x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))
        return self.head(x)


def _model() -> TinyTransformer:
    from qdq.quant.blocks import NVFP4, block_fake_quant

    torch.manual_seed(0)
    net = TinyTransformer().eval()
    with torch.no_grad():
        net.embed.weight.copy_(block_fake_quant(net.embed.weight, NVFP4))  # NVFP4-trained
        net.ln1.weight[:3] = 300.0  # outlier channels into Q/K/V
    return net


def _batches(spike: float = SPIKE) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    cal = [torch.randn(4, 16, 32, generator=g) for _ in range(4)]
    cal[3][0, 0, 0] = spike  # one value of one calibration batch
    return cal


@pytest.fixture(scope="module")
def calibrated() -> tuple[TinyTransformer, nn.Module, list[torch.Tensor]]:
    net, cal = _model(), _batches()
    prepared = qdq.prepare(net, (cal[0][:1],), QuantConfig(format="mixed"))
    qdq.calibrate(prepared, cal, show_progress=False)
    return net, prepared, cal


def _expected(choice: FormatChoice, speed: bool) -> dict[str, str]:
    """The documented rule applied to the rows' own numbers: per input tensor, NVFP4 when its
    mean SQNR over the readers is within MARGIN_DB of the better 8-bit format's (readers not
    under MIN_DB in every format), or (speed) when each reader is at >= NVFP4_MIN_DB."""
    out = {}
    tensors: dict[str, list] = {}
    for r in choice.rows:
        tensors.setdefault(r.tensor, []).append(r)
    for rows in tensors.values():
        fine = [r for r in rows if max(r.int8_db, r.fp8_db, r.nvfp4_db) >= MIN_DB]
        mean = lambda key, rs: sum(getattr(r, key) for r in rs) / len(rs)  # noqa: E731
        tie = bool(fine) and mean("nvfp4_db", fine) >= max(
            mean("int8_db", fine), mean("fp8_db", fine)) - formats.NVFP4_MARGIN_DB  # fmt: skip
        floor = speed and min(r.nvfp4_db for r in rows) >= NVFP4_MIN_DB
        for r in rows:
            out[r.layer] = "nvfp4" if floor or (tie and r in fine) else "8-bit/fp16"
    return out


def test_accuracy_objective_takes_nvfp4_only_where_as_accurate(calibrated, wide_margin) -> None:
    net, prepared, cal = calibrated
    choice = choose_formats(prepared, cal[0], nvfp4=True)
    rows = {r.layer: r for r in choice.rows}
    print("\n" + "\n".join(f"{r.layer}: INT8 {r.int8_db} FP8 {r.fp8_db} NVFP4 {r.nvfp4_db} -> "
                           f"{r.chosen} ({r.rule})" for r in choice.rows))  # fmt: skip
    assert set(rows) == {"embed", "q", "k", "v", "o", "fc1", "fc2", "head"}
    assert all(r.nvfp4_db is not None for r in choice.rows)  # every GEMM: K % 16 == 0, N >= 16
    got = {x: "nvfp4" if r.chosen == "nvfp4" else "8-bit/fp16" for x, r in rows.items()}
    assert got == _expected(choice, speed=False)
    # the planted spike: FP8 runs out of range, NVFP4's block scales do not; within the margin
    e = rows["embed"]
    assert e.chosen == "nvfp4" and e.rule == "F07" and "within 3 dB of FP8" in e.reason
    assert e.nvfp4_db >= e.fp8_db - WIDE and e.fp8_db >= MIN_DB and e.int8_db < MIN_DB
    # the others measurably prefer an 8-bit format (NVFP4 > 10 dB behind), Q/K/V together
    for x in ("q", "k", "v", "o", "fc1", "fc2", "head"):
        r = rows[x]
        assert r.chosen in ("int8", "fp8") and max(r.int8_db, r.fp8_db) - r.nvfp4_db > 10, r
        assert "NVFP4" in r.reason and "not within 3 dB" in r.reason
    assert {rows[x].chosen for x in "qkv"} == {"int8"} and rows["q"].tensor == rows["v"].tensor
    assert Override(name="embed", format="nvfp4") in choice.overrides
    assert not any(o.format == "nvfp4" and o.name != "embed" for o in choice.overrides)
    assert "1 of 8 NVFP4-capable GEMMs to NVFP4" in choice.summary()
    # the report: the old keys as they were, NVFP4's added
    d = choice.to_dict()
    assert {"summary", "rows", "followed", "reformats", "dropped", "timed_on"} <= set(d)
    assert d["nvfp4"] is True and d["objective"] == "accuracy"
    old = {"layer", "tensor", "int8_db", "fp8_db", "planned", "chosen", "reason", "rule",
           "int8_ms", "fp8_ms"}  # fmt: skip
    assert old < set(d["rows"][0]) and "nvfp4_db" in d["rows"][0]
    # the plan without the changes keeps every planned format (the reformat check's baseline)
    assert choice.unchanged is not None and not choice.unchanged.changes
    assert "would cost reformats" in {r.layer: r for r in choice.unchanged.rows}["embed"].reason

    # end to end: the planner runs embed in NVFP4 (rule USER) and the rest as chosen
    again = qdq.prepare(net, (cal[0][:1],), QuantConfig(format="mixed", overrides=choice.overrides))
    plan = qdq.plan_of(again)
    fmt = {p.name: (p.spec.format, p.format_rule) for p in plan.points
           if p.decision == "quantize" and p.spec is not None}  # fmt: skip
    assert fmt["embed:weight"] == ("nvfp4", "USER") and fmt["embed:input"] == ("nvfp4", "USER")
    assert plan.point("embed:weight").spec.block_size == 16
    assert fmt["q:weight"][0] == "int8" and fmt["fc1:input"][0] == "int8"
    qdq.calibrate(again, cal, show_progress=False)
    with torch.no_grad():
        assert torch.isfinite(again(cal[0])).all()


def test_speed_objective_takes_nvfp4_above_the_floor(calibrated, wide_margin) -> None:
    _, prepared, cal = calibrated
    choice = choose_formats(prepared, cal[0], nvfp4=True, objective="speed")
    rows = {r.layer: r for r in choice.rows}
    got = {x: "nvfp4" if r.chosen == "nvfp4" else "8-bit/fp16" for x, r in rows.items()}
    assert got == _expected(choice, speed=True)
    assert all(r.chosen == "nvfp4" for r in choice.rows)  # 17-21 dB here, all above 15 dB
    assert rows["embed"].rule == "F07"  # as accurate: the accuracy rule already took it
    assert {r.rule for r in choice.rows if r.layer != "embed"} == {"T02"}
    assert "at least 15 dB on every reader" in rows["q"].reason
    assert "7 at >= 15 dB by --objective speed" in choice.summary()
    assert choice.to_dict()["objective"] == "speed"
    # the 8-bit T02 count leaves the NVFP4 rows out: no GPU was given
    assert "by predicted time" not in choice.summary()


def test_speed_floor_takes_nvfp4_only_where_predicted_faster(
    calibrated, monkeypatch, wide_margin
) -> None:
    """With the target's GPU the floor also needs a faster NVFP4 (T02, kernel rule K08): this
    model's GEMMs (16 rows) are the launch floor on a B200, so NVFP4 gains nothing and only the
    accuracy rule's tie (``embed``, within the 3 dB test margin) stays; predicted faster (a time
    model that says so), the floor takes every layer again."""
    from qdq.accuracy import format_time
    from qdq.lint.speed.gpus import find_gpu

    _, prepared, cal = calibrated
    b200 = find_gpu("b200")
    choice = choose_formats(prepared, cal[0], gpu=b200, nvfp4=True, objective="speed")
    rows = {r.layer: r for r in choice.rows}
    assert [x for x, r in rows.items() if r.chosen == "nvfp4"] == ["embed"]  # by accuracy (F07)
    assert "predicted no faster in NVFP4 on NVIDIA B200" in rows["q"].reason
    assert "(T02)" in rows["q"].reason
    real = format_time.nvfp4_times

    def fast(shapes, gpu):  # type: ignore[no-untyped-def]
        return {x: ms / 4 for x, ms in real(shapes, gpu).items()}

    monkeypatch.setattr(formats, "nvfp4_times", fast)
    choice = choose_formats(prepared, cal[0], gpu=b200, nvfp4=True, objective="speed")
    assert all(r.chosen == "nvfp4" for r in choice.rows)
    assert "predicted faster on NVIDIA B200" in {r.layer: r for r in choice.rows}["q"].reason


def test_nvfp4_times_by_shape() -> None:
    """A wide GEMM is faster in NVFP4 than in INT8/FP8 on a B200; a tiny one is the launch floor
    in both; a convolution has no NVFP4 time, and a GPU without FP4 kernels none at all."""
    from qdq.accuracy.format_time import TIME_TIE, LayerShape, format_times, nvfp4_times
    from qdq.lint.speed.gpus import find_gpu

    shapes = {
        "wide": LayerShape("gemm", (4096, 4096), (4096, 4096)),
        "tiny": LayerShape("gemm", (16, 64), (64, 64)),
        "conv": LayerShape("conv", (8, 64, 32, 32), (64, 64, 3, 3), (8, 64, 32, 32)),
    }
    b200 = find_gpu("b200")
    four, eight = nvfp4_times(shapes, b200), format_times(shapes, b200)
    assert set(four) == {"wide", "tiny"}
    assert four["wide"] < min(eight["wide"]) * 0.6
    assert four["tiny"] >= min(eight["tiny"]) * (1 - TIME_TIE)
    assert nvfp4_times(shapes, find_gpu("h100")) == {}


def test_speed_floor_refuses_nvfp4_where_its_block_scales_run_subnormal() -> None:
    """A spike 10^6 above the other batches: NVFP4's E4M3 block scales fall under the per-tensor
    scale's range (3 dB), every format is under 20 dB: FP16, by either objective."""
    net, cal = _model(), _batches(1e6)
    prepared = qdq.prepare(net, (cal[0][:1],), QuantConfig(format="mixed"))
    qdq.calibrate(prepared, cal, show_progress=False)
    for objective in ("accuracy", "speed"):
        choice = choose_formats(prepared, cal[0], nvfp4=True, objective=objective)
        e = {r.layer: r for r in choice.rows}["embed"]
        assert e.nvfp4_db is not None and e.nvfp4_db < NVFP4_MIN_DB
        assert e.chosen == "fp16" and Override(name="embed", exclude=True) in choice.overrides
        assert ("under the 15 dB floor" in e.reason) == (objective == "speed")


def test_without_nvfp4_kernels_the_choice_is_todays(calibrated, monkeypatch) -> None:
    _, prepared, cal = calibrated
    today = choose_formats(prepared, cal[0])
    for kwargs in ({"nvfp4": False}, {"nvfp4": False, "objective": "speed"}):
        other = choose_formats(prepared, cal[0], **kwargs)
        assert [(r.layer, r.chosen, r.reason, r.rule) for r in other.rows] == [
            (r.layer, r.chosen, r.reason, r.rule) for r in today.rows]  # fmt: skip
        assert other.overrides == today.overrides
    assert all(r.nvfp4_db is None for r in today.rows) and today.to_dict()["nvfp4"] is False
    assert "both formats" in today.summary() and "NVFP4" not in today.summary()
    assert "nvfp4" not in {r.chosen for r in today.rows}
    with pytest.raises(ValueError, match="objective must be one of accuracy, speed"):
        choose_formats(prepared, cal[0], objective="fast")


@pytest.mark.parametrize(
    ("target", "has"),
    [("trt10.8-blackwell", True), ("trt11-b200", True), ("trt10.12-sm120", True),
     ("trt10-hopper", False), ("trt10.5-blackwell", False), ("trt10.12", False), ("trt10", False),
     ("nonsense", False)],
)  # fmt: skip
def test_has_nvfp4_names_blackwell_and_trt10_8(target: str, has: bool) -> None:
    assert has_nvfp4(target) is has


def test_the_job_measures_nvfp4_on_a_blackwell_target_only(monkeypatch, wide_margin) -> None:
    """plan_config: trt10-hopper passes nvfp4=False (today's plan), trt10.12-blackwell True and
    keeps the NVFP4 change when the linter counts no more reformats with it."""
    import qdq.pipeline.formats as stage
    from qdq.pipeline.inputs import ForwardInputs
    from qdq.pipeline.stages import Stages

    calls: list[dict] = []
    real = stage.choose_formats

    def spy(prepared, batch, **kw):  # type: ignore[no-untyped-def]
        calls.append(kw)
        return real(prepared, batch, **kw)

    monkeypatch.setattr(stage, "choose_formats", spy)
    monkeypatch.setattr(stage, "reformats", lambda *a: 4)  # the count itself: other tests
    net, cal = _model(), torch.cat(_batches())
    got = {}
    for target in ("trt10-hopper", "trt10.12-blackwell"):
        config, choice = stage.plan_config(
            Stages(None), net, (cal[:1],), cal, ForwardInputs("tensor"), size=4, static=False,
            device="cpu", fmt="mixed", exporter="torchscript", target=target)  # fmt: skip
        assert choice is not None
        got[target] = {o.name: o.format for o in config.overrides}
    assert [c["nvfp4"] for c in calls] == [False, True]
    assert "nvfp4" not in got["trt10-hopper"].values()
    assert got["trt10.12-blackwell"]["embed"] == "nvfp4"
    assert {k: v for k, v in got["trt10.12-blackwell"].items() if k != "embed"} == {
        k: v for k, v in got["trt10-hopper"].items() if k != "embed"}  # fmt: skip


def _measure(noise4: dict[str, float], members: dict[str, frozenset[str]], speed=False):
    return Nvfp4Measure(noise4, members, speed, MARGIN_DB, MIN_DB, NVFP4_MIN_DB)


def _rel(sqnr_db: float) -> float:
    return 10.0 ** (-sqnr_db / 10.0)


def test_the_rule_on_numbers() -> None:
    """Nvfp4Measure.outcome on given SQNRs: the margin, the mean over readers, the FP16 readers
    left out, the floor, one Quantize per tensor (a reader without NVFP4, another group
    member)."""
    two = ["a", "b"]
    members = {"t": frozenset(two)}

    def out(i8, f8, n4, speed=False, blocked=(), free=True, group=members):  # type: ignore[no-untyped-def]
        noise = {x: (_rel(i), _rel(f)) for x, i, f in zip(two, i8, f8, strict=True)}
        m = _measure({x: _rel(n) for x, n in zip(two, n4, strict=True) if n is not None}, group,
                     speed)  # fmt: skip
        return m.outcome("t", two, noise, list(blocked), free)

    assert out((30, 30), (25, 25), (27.0, 27.0)).keep == ("a", "b")  # within 3 dB of INT8
    assert out((30, 30), (25, 25), (26.9, 26.9)).keep == ()  # 3.1 dB behind
    assert out((30, 30), (25, 25), (29.0, 24.8)).keep == ()  # mean 26.9 vs 30: just out
    assert out((30, 30), (25, 25), (29.0, 25.2)).keep == ("a", "b")  # mean 27.1: in
    # a reader under MIN_DB in every format stays FP16 and does not count
    low = out((30, 10), (25, 12), (28.0, 11.0))
    assert low.keep == ("a",) and low.tie == ("a",)
    # the speed floor: every reader >= 15 dB
    assert out((40, 40), (30, 30), (17.0, 15.0), speed=True).keep == ("a", "b")
    assert out((40, 40), (30, 30), (17.0, 14.9), speed=True).keep == ()
    assert out((40, 40), (30, 30), (17.0, 15.0)).keep == ()  # accuracy: no floor
    # the floor needs every reader predicted faster in NVFP4 (T02)
    noise = {x: (_rel(40), _rel(30)) for x in two}
    slow = Nvfp4Measure({x: _rel(17.0) for x in two}, members, True, MARGIN_DB, MIN_DB,
                        NVFP4_MIN_DB, slower=frozenset({"b"}), gpu="NVIDIA B200")  # fmt: skip
    o = slow.outcome("t", two, noise, [], True)
    assert o.keep == () and o.slow == ("b",)
    assert "b is predicted no faster in NVFP4 on NVIDIA B200 (T02)" in o.not_why("a", False)
    # one Quantize per tensor: every reader must run NVFP4
    assert "cannot run NVFP4" in out((30, 30), (25, 25), (30.0, None)).blocker
    shared = {"t": frozenset({"a", "b", "add"})}
    assert "F14" in out((30, 30), (25, 25), (30.0, 30.0), group=shared).blocker
    assert "cannot change format" in out((30, 30), (25, 25), (30.0, 30.0), blocked=["mm"]).blocker
    assert out((30, 30), (25, 25), (30.0, 30.0), free=False).keep == ()
    assert math.isinf(db(0.0))


@pytest.mark.parametrize(
    ("op", "x", "w", "axes", "red"),
    [("linear", (2, 64), (32, 64), (0, None), -1),
     ("linear", (2, 40), (32, 40), (0, None), None),  # K % 16
     ("linear", (2, 64), (8, 64), (0, None), None),  # N < 16
     ("matmul", (2, 64), (64, 48), (-1, None), -2),  # x @ W, W [K, N]
     ("matmul", (2, 64), (48, 64), (0, 0), -1),  # x @ W.t(), W [N, K]
     ("matmul", (2, 64), (64, 64), (0, 0), -1),  # square, output axis 0
     ("matmul", (2, 64), (64, 64), (-1, None), -2),  # square, output axis last
     ("conv", (2, 64, 4, 4), (64, 64, 1, 1), (0, None), None)],
)  # fmt: skip
def test_which_gemms_can_run_nvfp4(op, x, w, axes, red) -> None:
    assert nvfp4_gemm(op, torch.zeros(x), torch.zeros(w), axes) == red


def test_default_margin_never_takes_a_less_accurate_nvfp4(calibrated) -> None:
    """The default NVFP4_MARGIN_DB (0): embed is 1.7 dB behind FP8, so it stays FP8 and no
    layer of the tiny transformer runs NVFP4 by accuracy."""
    _, prepared, cal = calibrated
    assert formats.NVFP4_MARGIN_DB == 0.0
    choice = choose_formats(prepared, cal[0], nvfp4=True)
    rows = {r.layer: r for r in choice.rows}
    assert rows["embed"].chosen == "fp8" and rows["embed"].nvfp4_db < rows["embed"].fp8_db
    assert "less accurate than FP8" in rows["embed"].reason
    assert not any(r.chosen == "nvfp4" for r in choice.rows)


class PostNorm(nn.Module):
    """A post-LayerNorm block (BERT's): the LayerNorm output feeds Q/K/V and the residual Add
    fused into ``o``, so Q/K/V's Quantize is shared with that Add's skip (rule P03)."""

    def __init__(self, d: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.ln0, self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln0(x)
        b, t, d = y.shape
        q, k, v = (
            m(y).view(b, t, self.heads, -1).transpose(1, 2) for m in (self.q, self.k, self.v)
        )
        a = (q @ k.transpose(-2, -1) * (d // self.heads) ** -0.5).softmax(-1)
        y = self.ln1(y + self.o((a @ v).transpose(1, 2).reshape(b, t, d)))
        return self.ln2(y + self.fc2(torch.nn.functional.gelu(self.fc1(y))))


def test_a_quantize_shared_with_a_residual_skip_runs_nvfp4_with_the_fused_gemm() -> None:
    """F14/F15: Q/K/V's input is also the skip of the Add fused into ``o``: the tensor runs
    NVFP4 when ``o`` does (the skip then reads float), and the planner agrees."""
    torch.manual_seed(0)
    net = PostNorm().eval()
    cal = [torch.randn(4, 16, 64, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    prepared = qdq.prepare(net, (cal[0][:1],), QuantConfig(format="mixed"))
    plan = qdq.plan_of(prepared)
    shared = next(g for g in plan.groups if "q:input" in g.members)
    assert any(m.startswith("add") for m in shared.members)  # the residual skip
    qdq.calibrate(prepared, cal, show_progress=False)
    choice = choose_formats(prepared, cal[0], nvfp4=True, objective="speed")
    assert {r.layer: r.chosen for r in choice.rows} == dict.fromkeys(
        ("q", "k", "v", "o", "fc1", "fc2"), "nvfp4")  # fmt: skip
    again = qdq.prepare(net, (cal[0][:1],), QuantConfig(format="mixed", overrides=choice.overrides))
    formats_ = {n: q.spec.format for n, q in qdq.quantizers_of(again).items()}
    assert all(f == "nvfp4" for n, f in formats_.items() if not n.startswith("matmul")), formats_


def test_the_residual_skip_waits_for_its_gemm() -> None:
    """Nvfp4Measure.outcomes: tensor ``t`` (readers a, b; its Quantize also read by the Add
    fused into ``o``) runs NVFP4 only when ``o``'s tensor does."""
    noise = {x: (_rel(40.0), _rel(30.0)) for x in ("a", "b", "o")}
    readers = {"t": ["a", "b"], "u": ["o"]}
    members = {"t": frozenset({"a", "b", "add"}), "u": frozenset({"o"})}
    planned = dict.fromkeys(("a", "b", "o"), "fp8")
    for o_db, runs in ((17.0, True), (14.0, False)):
        four = {"a": _rel(17.0), "b": _rel(17.0), "o": _rel(o_db)}
        m = Nvfp4Measure(four, members, True, MARGIN_DB, MIN_DB, NVFP4_MIN_DB, {"add": "o"})
        out = m.outcomes(readers, noise, planned)
        assert (out["t"].keep == ("a", "b")) is runs and (out["u"].keep == ("o",)) is runs
        assert ("residual Add fused into o" in out["t"].blocker) is not runs
    # an Add fused into no GEMM of the plan: F14 refuses outright
    m = Nvfp4Measure(dict.fromkeys("abo", _rel(17.0)), members, True, MARGIN_DB, MIN_DB,
                     NVFP4_MIN_DB)  # fmt: skip
    assert "F14" in m.outcomes(readers, noise, planned)["t"].blocker


def test_the_job_drops_the_nvfp4_changes_alone_when_they_cost_reformats(monkeypatch) -> None:
    """The linter predicts more unfused Q/DQ with the NVFP4 changes (an NVFP4 Q/K/V whose output
    an FP8 attention product quantizes: a format boundary), none with the 8-bit ones: the job
    keeps the 8-bit changes (the choice without NVFP4) and says why."""
    import qdq.pipeline.formats as stage
    from qdq.pipeline.inputs import ForwardInputs
    from qdq.pipeline.stages import Stages

    counted: list[tuple[str, ...]] = []

    def fake(model, example, config, batch, exporter, target):  # type: ignore[no-untyped-def]
        counted.append(tuple(sorted(o.name for o in config.overrides if o.format == "nvfp4")))
        return 9 if counted[-1] else 5

    monkeypatch.setattr(stage, "reformats", fake)
    # the speed floor alone (no time model): on the B200 this tiny model's GEMMs are predicted no
    # faster in NVFP4 (test_speed_floor_takes_nvfp4_only_where_predicted_faster)
    monkeypatch.setattr(stage, "_target_gpu", lambda target: None)
    net, cal = _model(), torch.cat(_batches())
    config, choice = stage.plan_config(
        Stages(None), net, (cal[:1],), cal, ForwardInputs("tensor"), size=4, static=False,
        device="cpu", fmt="mixed", exporter="torchscript", target="trt10.12-blackwell",
        objective="speed")  # fmt: skip
    assert choice is not None and len(counted) == 3 and counted[0] and not any(counted[1:])
    assert choice.reformats == {"with changes": 9, "without": 5, "without NVFP4": 5}
    assert (
        "the 8 NVFP4 change(s) dropped" in choice.dropped and "5 with the other" in choice.dropped
    )
    assert "nvfp4" not in {o.format for o in config.overrides}
    rows = {r.layer: r for r in choice.rows}
    assert rows["q"].chosen == "int8" and rows["q"].nvfp4_db is not None  # the 8-bit move stays
    assert ("q", "int8") in {(o.name, o.format) for o in config.overrides}
