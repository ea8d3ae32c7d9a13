"""Cross-layer equalization (:mod:`qdq.ptq.equalize`): same float function, narrower spread, only
where a per-channel scale commutes, and a better INT8 model where channel ranges differ."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import qdq
from qdq.config import QuantConfig
from qdq.ptq.equalize import equalize
from qdq.quant import QuantMode


def _spread_channels(layer: nn.Module, wide: int, factor: float) -> None:
    """Make the first ``wide`` output channels of ``layer`` ``factor`` times wider."""
    with torch.no_grad():
        layer.weight[:wide] *= factor
        if layer.bias is not None:
            layer.bias[:wide] *= factor


class ConvChain(nn.Module):
    """conv → BN → ReLU → max-pool → dropout → conv, then a conv → ReLU6 → conv pair that must
    not be equalized (a clip at 6 does not commute with a scale)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.pool = nn.MaxPool2d(2)
        self.drop = nn.Dropout(0.1)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
        self.conv3 = nn.Conv2d(16, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.drop(self.pool(torch.relu(self.bn1(self.conv1(x)))))
        return self.conv3(nn.functional.relu6(self.conv2(y)))


class Heads(nn.Module):
    """linear → PReLU → three linear heads reading the same features (MTCNN's shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(12, 32)
        self.act = nn.PReLU(32)
        self.box = nn.Linear(32, 4)
        self.cls = nn.Linear(32, 2)
        self.marks = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        f = self.act(self.body(x))
        return self.box(f), self.cls(f), self.marks(f)


def _conv_chain() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = ConvChain()
    with torch.no_grad():
        model.bn1.running_mean.uniform_(-0.2, 0.2)
        model.bn1.running_var.uniform_(0.5, 2.0)
        model.bn1.weight.uniform_(0.5, 1.5)
        model.bn1.bias.uniform_(0.0, 0.5)
    _spread_channels(model.bn1, 4, 40.0)
    return model.eval(), torch.randn(32, 3, 8, 8)


def _heads() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(1)
    model = Heads()
    _spread_channels(model.body, 3, 30.0)
    return model.eval(), torch.randn(64, 12)


def _outputs(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    with torch.no_grad():
        out = model(x)
    return list(out) if isinstance(out, tuple) else [out]


@pytest.mark.parametrize("build", [_conv_chain, _heads])
def test_the_float_function_is_kept_and_the_user_model_untouched(build) -> None:
    model, x = build()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    eq = equalize(model, (x[:1],), [x[:16], x[16:]])
    assert eq.rows
    for a, b in zip(_outputs(eq.model, x), _outputs(model, x), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert eq.model is not model


def test_pairs_follow_the_graph_and_stop_at_a_clip() -> None:
    model, x = _conv_chain()
    eq = equalize(model, (x[:1],), [x])
    # the BatchNorm is what gets divided; conv2 -> relu6 -> conv3 is left alone, with a note
    assert [(r.producer, r.consumers) for r in eq.rows] == [("bn1", ("conv2",))]
    assert eq.rows[0].through == ("bn1", "relu", "pool", "drop")
    assert any("conv2 -> relu6" in n for n in eq.notes)
    torch.testing.assert_close(eq.model.conv1.weight, model.conv1.weight)  # rows untouched

    model, x = _heads()
    eq = equalize(model, (x[:1],), [x])
    assert [(r.producer, sorted(r.consumers)) for r in eq.rows] == [
        ("body", ["box", "cls", "marks"])
    ]


def test_the_spread_narrows_and_alpha_one_makes_every_channel_equal() -> None:
    model, x = _heads()
    half = equalize(model, (x[:1],), [x], alpha=0.5).rows[0]
    full = equalize(model, (x[:1],), [x], alpha=1.0).rows[0]
    assert half.spread_before > 10
    assert 1.0 <= half.spread_after < half.spread_before
    assert full.spread_after == pytest.approx(1.0, rel=1e-6)
    # measured on the equalized copy: every live channel now spans the same range
    eq = equalize(model, (x[:1],), [x], alpha=1.0).model
    with torch.no_grad():
        r = eq.act(eq.body(x)).abs().amax(dim=0)
    live = r > 0
    assert float(r[live].max() / r[live].min()) == pytest.approx(1.0, rel=1e-4)


@pytest.mark.parametrize(
    ("model", "why"),
    [
        (nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU6(), nn.Conv2d(8, 8, 3)), "a clip"),
        (nn.Sequential(nn.Conv2d(3, 8, 3), nn.SiLU(), nn.Conv2d(8, 8, 3)), "not homogeneous"),
        (nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3, groups=8)), "grouped"),
        (nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 36, 4)), "flat"),
    ],
)
def test_no_pair_where_a_scale_does_not_commute(model: nn.Module, why: str) -> None:
    x = torch.randn(4, 3, 8, 8)
    eq = equalize(model.eval(), (x[:1],), [x])
    assert eq.rows == (), why
    for a, b in zip(_outputs(eq.model, x), _outputs(model, x), strict=True):
        assert torch.equal(a, b)


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(8, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.conv3 = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv1(x))
        return self.conv3(torch.relu(self.conv2(y) + y))  # y also feeds the residual add


class Shared(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv1(x))) + self.head(x)  # one weight, two inputs


@pytest.mark.parametrize("cls", [Residual, Shared])
def test_no_pair_through_a_branch_or_onto_a_shared_weight(cls: type[nn.Module]) -> None:
    torch.manual_seed(0)
    model, x = cls().eval(), torch.randn(4, 8, 6, 6)
    eq = equalize(model, (x[:1],), [x])
    assert eq.rows == ()


def _int8_error(model: nn.Module, x: torch.Tensor, ref: list[torch.Tensor]) -> float:
    prepared = qdq.prepare(model, (x[:1],), QuantConfig.tensorrt(disable=("performance",)))
    qdq.calibrate(prepared, [x], method="max", show_progress=False)
    out = _outputs(prepared, x)
    return sum(float((a - b).pow(2).sum() / b.pow(2).sum()) for a, b in zip(out, ref, strict=True))


@pytest.mark.parametrize("build", [_conv_chain, _heads])
def test_the_int8_model_is_closer_to_fp32(build) -> None:
    model, x = build()
    ref = _outputs(model, x)
    plain = _int8_error(model, x, ref)
    equalized = _int8_error(equalize(model, (x[:1],), [x]).model, x, ref)
    assert equalized < 0.7 * plain


def test_the_equalized_model_exports_like_any_other(tmp_path) -> None:
    pytest.importorskip("onnxruntime")
    from qdq.backends.onnxruntime import run, session

    model, x = _heads()
    eq = equalize(model, (x[:1],), [x]).model
    prepared = qdq.prepare(eq, (x[:1],), QuantConfig.tensorrt(disable=("performance",)))
    qdq.calibrate(prepared, [x], show_progress=False)
    path = tmp_path / "eq.onnx"
    qdq.export_onnx(prepared, (x[:8],), path, exporter="torchscript", dynamic_batch=True)
    with qdq.quantizer_mode(prepared, QuantMode.QUANTIZE):
        expected = _outputs(prepared, x[:8])
    got = run(session(path), [x[:8]])
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(torch.as_tensor(a), b, rtol=1e-4, atol=1e-5)


def test_bad_arguments_are_named() -> None:
    model, x = _heads()
    with pytest.raises(ValueError, match=r"alpha must be a number in \(0, 1\]"):
        equalize(model, (x[:1],), [x], alpha=0.0)
    with pytest.raises(ValueError, match="alpha must be a number in"):
        equalize(model, (x[:1],), [x], alpha=True)
    with pytest.raises(ValueError, match="num_batches"):
        equalize(model, (x[:1],), [x], num_batches=0)
    with pytest.raises(ValueError, match="saw no batches"):
        equalize(model, (x[:1],), [])
    with pytest.raises(TypeError, match="torch.nn.Module"):
        equalize(lambda t: t, (x[:1],), [x])  # type: ignore[arg-type]


def test_the_report_is_plain_data() -> None:
    model, x = _conv_chain()
    eq = equalize(model, (x[:1],), [x])
    d = eq.to_dict()
    assert d["alpha"] == 0.5 and d["guarded"] and d["rows"][0]["producer"] == "bn1"
    assert d["rows"][0]["alpha"] == 0.5
    assert "cross-layer equalization of 1/1 pair(s) (alpha 0.5, where the" in eq.summary()
    assert "bn1" in eq.format() and eq.to_json().startswith("{")


def _hurt_by_equalizing() -> tuple[nn.Module, torch.Tensor]:
    """Equal activation channels read by a diagonal 1x1 conv with column norms 0.01 .. 1: every
    weight row holds one value (quantized exactly at any scale), so scaling only spreads the
    activation and its per-tensor quantization gets worse."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 1)).eval()
    with torch.no_grad():
        model[0].weight.copy_(torch.randn(1, 3, 3, 3).expand(8, -1, -1, -1))
        model[2].weight.zero_()
        model[2].weight[:, :, 0, 0] = torch.diag(torch.logspace(-2, 0, 8))
    return model, torch.randn(16, 3, 10, 10)


def test_the_guard_equalizes_a_pair_only_where_its_consumers_gain() -> None:
    torch.manual_seed(3)
    flat = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3)).eval()
    hurt = _hurt_by_equalizing()
    forced = equalize(hurt[0], (hurt[1][:1],), [hurt[1]], guard=False).rows[0]
    assert forced.error_after > 1.2 * forced.error_before
    assert equalize(hurt[0], (hurt[1][:1],), [hurt[1]]).rows[0].alpha is None
    cases = [(flat, torch.randn(16, 3, 10, 10)), _heads(), _conv_chain(), hurt]
    for model, x in cases:
        for alpha in (0.25, 0.5, 1.0):
            guarded = equalize(model, (x[:1],), [x], alpha=alpha)
            forced = equalize(model, (x[:1],), [x], alpha=alpha, guard=False)
            for row, other in zip(guarded.rows, forced.rows, strict=True):
                assert other.alpha == alpha and other.error_before == row.error_before
                if other.error_after < other.error_before:
                    assert row.alpha == alpha and row.error_after == other.error_after
                else:  # left alone: the error it would have cost is in the forced row
                    assert row.alpha is None and row.error_after == row.error_before


def test_a_pair_with_nothing_to_move_is_left_alone() -> None:
    # identical channels and identical consumer columns: every alpha gives s = 1
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 1)).eval()
    with torch.no_grad():
        model[0].weight.copy_(torch.randn(1, 3, 3, 3).expand(8, -1, -1, -1))
        model[0].bias.fill_(0.1)
        model[2].weight.copy_(torch.randn(4, 1, 1, 1).expand(-1, 8, -1, -1))
    x = torch.randn(8, 3, 10, 10)
    eq = equalize(model, (x[:1],), [x])
    (row,) = eq.rows
    assert not row.equalized and row.alpha is None
    assert row.error_after == row.error_before and row.scale_min == row.scale_max == 1.0
    assert "1 pair(s) found, none improved" in eq.summary()
    for a, b in zip(eq.model.state_dict().values(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b)


class Padded(nn.Module):
    """CREPE's layer: conv → ReLU → BatchNorm → max-pool → zero pad (of height) → conv."""

    def __init__(self, pad: tuple[int, ...]) -> None:
        super().__init__()
        self.pad = pad
        self.conv1 = nn.Conv2d(1, 8, (5, 1))
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8 + (pad[-1] if len(pad) > 4 else 0), 4, (3, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.max_pool2d(self.bn(torch.relu(self.conv1(x))), (2, 1))
        return self.conv2(nn.functional.pad(y, self.pad))


def test_zero_padding_is_crossed_unless_it_pads_the_channels() -> None:
    torch.manual_seed(0)
    x = torch.randn(8, 1, 32, 1)
    model = Padded((0, 0, 3, 4)).eval()
    _spread_channels(model.bn, 2, 20.0)
    eq = equalize(model, (x[:1],), [x], guard=False)
    assert [(r.producer, r.through) for r in eq.rows] == [
        ("bn", ("relu", "bn", "max_pool2d", "pad"))
    ]
    torch.testing.assert_close(eq.model(x), model(x), rtol=1e-4, atol=1e-5)
    channels = Padded((0, 0, 0, 0, 0, 2)).eval()  # two more channels: not a per-channel op
    assert equalize(channels, (x[:1],), [x]).rows == ()


def test_an_unbatched_conv_is_not_paired() -> None:
    # (C, H, W) with H == C: dimension 1 is the height, so no per-channel scale applies there
    model = nn.Sequential(nn.Conv2d(4, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 2, 1)).eval()
    x = torch.randn(4, 6, 6)
    eq = equalize(model, (x,), [x])
    assert eq.rows == ()
    batched = torch.randn(2, 4, 6, 6)
    assert len(equalize(model, (batched[:1],), [batched], guard=False).rows) == 1


def test_torchvision_resnet18_pairs_every_block_and_keeps_its_function() -> None:
    models = pytest.importorskip("torchvision.models")
    torch.manual_seed(0)
    model = models.resnet18(num_classes=10).eval()
    x = torch.randn(4, 3, 64, 64)
    eq = equalize(model, (x[:1],), [x], guard=False)
    # conv1 -> bn1 -> relu -> conv2 inside each BasicBlock; the stem and every block output also
    # feed a residual add, so they pair with nothing
    assert [r.producer for r in eq.rows] == [
        f"layer{i}.{j}.bn1" for i in range(1, 5) for j in range(2)
    ]
    assert all(r.consumers == (r.producer.replace("bn1", "conv2"),) for r in eq.rows)
    with torch.no_grad():
        torch.testing.assert_close(eq.model(x), model(x), rtol=1e-4, atol=1e-4)
