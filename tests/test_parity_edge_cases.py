"""torch fake quant vs exported ONNX on EfficientNet-Lite0's edge cases, in a few layers.

The structure of an MBConv network with TF "SAME" padding: a Conv2d subclass that pads
asymmetrically with ``F.pad`` before the convolution, BatchNorm, ReLU6, a depthwise convolution
with dead (all-zero) channels whose weight scale is floored at export, a residual Add and a
linear head. Random weights, no download.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qdq
from qdq.backends.onnxruntime import parity, run, session
from qdq.quant import MIN_SCALE


class SamePadConv(nn.Conv2d):
    """TF 'SAME' padding computed for a static input size (like ``Conv2dStaticSamePadding``)."""

    def __init__(
        self, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, size: int = 16
    ) -> None:
        super().__init__(cin, cout, k, stride, groups=groups, bias=False)
        total = max((math.ceil(size / stride) - 1) * stride + k - size, 0)
        self.pad = (total // 2, total - total // 2, total // 2, total - total // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.pad(x, self.pad)
        return F.conv2d(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)


class Block(nn.Module):
    def __init__(self, c: int, expand: int = 4) -> None:
        super().__init__()
        mid = c * expand
        self.expand = SamePadConv(c, mid, 1)
        self.bn0 = nn.BatchNorm2d(mid, eps=1e-3)
        self.depthwise = SamePadConv(mid, mid, 3, groups=mid, size=8)
        self.bn1 = nn.BatchNorm2d(mid, eps=1e-3)
        self.project = SamePadConv(mid, c, 1)
        self.bn2 = nn.BatchNorm2d(c, eps=1e-3)
        self.act = nn.ReLU6()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.bn0(self.expand(x)))
        y = self.act(self.bn1(self.depthwise(y)))
        return self.bn2(self.project(y)) + x


class TinyEfficientNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = SamePadConv(3, 16, 3, stride=2)  # pads (0, 1, 0, 1): asymmetric
        assert self.stem.pad == (0, 1, 0, 1)
        self.bn = nn.BatchNorm2d(16, eps=1e-3)
        self.act = nn.ReLU6()
        self.block = Block(16)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block(self.act(self.bn(self.stem(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


def _model() -> TinyEfficientNet:
    torch.manual_seed(0)
    model = TinyEfficientNet()
    with torch.no_grad():
        for bn in (model.bn, model.block.bn0, model.block.bn1, model.block.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.2, 2.0)
            bn.weight.uniform_(0.5, 2.0)
            bn.bias.uniform_(-0.5, 0.5)
        dw = model.block.depthwise.weight
        dw[:4] = 0.0  # dead channels: amax 0, scale floored
        dw[4:6] = 1e-9  # below 2**-24: floored too, but not zero
        model.block.bn1.running_var[:4] = 1e-6  # a dead channel's running statistics
    return model.eval()


@pytest.fixture(scope="module")
def calibrated() -> tuple[nn.Module, torch.Tensor]:
    model = _model()
    gen = torch.Generator().manual_seed(1)
    calib = [torch.randn(8, 3, 16, 16, generator=gen) for _ in range(4)]
    prepared = qdq.prepare(model, (calib[0],))
    quantizers = set(qdq.quantizers_of(prepared))
    for layer in ("stem", "block.expand", "block.depthwise", "block.project", "fc"):
        assert {f"{layer}.weight_quantizer", f"{layer}.input_quantizer"} <= quantizers, layer
    qdq.calibrate(prepared, calib, method="max", show_progress=False)
    x = torch.randn(32, 3, 16, 16, generator=gen)
    return prepared, x


def _weight_dq(path: Path) -> dict[str, np.ndarray]:
    """ORT's DequantizeLinear outputs of every weight quantizer, by quantizer path."""
    model = onnx.load(str(path))
    names = {}
    for node in model.graph.node:
        head, _, tail = node.name.rpartition("/")
        if head.endswith("weight_quantizer") and tail == "DequantizeLinear":
            names[head] = node.output[0]
            model.graph.output.append(onnx.helper.make_empty_tensor_value_info(node.output[0]))
    sess = session(model)
    outs = dict(
        zip(
            [o.name for o in sess.get_outputs()],
            run(sess, [torch.zeros(1, 3, 16, 16)]),
            strict=True,
        )
    )
    return {path: outs[name] for path, name in names.items()}


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_edge_cases_agree(calibrated, tmp_path: Path, exporter: str) -> None:
    prepared, x = calibrated
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = qdq.export_onnx(prepared, (x[:1],), tmp_path / "m.onnx", exporter=exporter)
    assert out.floored == {"block.depthwise.weight_quantizer": [0, 1, 2, 3, 4, 5]}
    assert any("floored" in str(w.message) for w in caught)
    nodes = onnx.load(str(out.path)).graph.node
    assert sum(n.op_type == "Conv" for n in nodes) == 4
    # every weight dequantizes bit for bit as in torch, the floored channels included
    for path, theirs in _weight_dq(out.path).items():
        q = prepared.get_submodule(path)
        owner = prepared.get_submodule(path.removesuffix(".weight_quantizer"))
        ours = q(owner.weight.detach()).numpy()
        assert ours.view(np.int32).tolist() == theirs.view(np.int32).tolist(), path
    dw_scale = qdq.scale_from_amax(prepared.get_submodule("block.depthwise.weight_quantizer").amax)
    assert float(dw_scale[0]) == float(np.float32(MIN_SCALE))  # the float32 floor
    report = parity(prepared, out.path, [x[:16], x[16:]], per_layer=True)
    assert list(report.layers) == [
        "stem.input_quantizer",
        "block.expand.input_quantizer",  # also the residual's skip input
        "block.depthwise.input_quantizer",
        "block.project.input_quantizer",
        "pool.input_quantizer",
        "fc.input_quantizer",
    ]
    for path, lp in report.layers.items():
        assert lp.qdq_mismatches == 0, path
        assert lp.unexplained_codes == 0, path  # in isolation: float rounding at most
        assert lp.isolated_mismatch_rate < 1e-3, path
    assert report.layers["stem.input_quantizer"].differing_codes == 0
    assert report.top1_agreement == 1.0
    assert report.first_unexplained is None
    assert report.max_rel_diff < 1e-2


def test_isolated_comparison_finds_a_real_mismatch(calibrated, tmp_path: Path) -> None:
    """A weight changed in the ONNX only: the layer after it differs beyond float rounding,
    and the isolated view names it even though the free-running view sees the cascade."""
    prepared, x = calibrated
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = qdq.export_onnx(prepared, (x[:1],), tmp_path / "m.onnx")
    model = onnx.load(str(out.path))
    for init in model.graph.initializer:
        if init.name.endswith("block.expand.weight") or init.name == "block.expand.weight":
            w = onnx.numpy_helper.to_array(init).copy()
            w[:, :] = -w[:, :]
            init.CopyFrom(onnx.numpy_helper.from_array(w, init.name))
            break
    else:
        pytest.fail("no block.expand.weight initializer")
    report = parity(prepared, model, [x], per_layer=True)
    assert report.first_unexplained == "block.depthwise.input_quantizer"
    assert report.first_diverging == "block.depthwise.input_quantizer"
    assert report.layers["block.expand.input_quantizer"].unexplained_codes == 0
    doc = report.to_dict()
    assert doc["first_unexplained"] == "block.depthwise.input_quantizer"
    assert doc["layers"]["block.depthwise.input_quantizer"]["isolated_mismatch_rate"] > 0.01


class _Taps(nn.Module):
    """Returns the tensor a quantizer reads as well as the result (YOLO heads return features)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = F.relu(self.conv1(x))
        return h, self.conv2(h)


class _InPlaceResidual(nn.Module):
    """RepGhostNet's block: ``relu(cheap(x1) + bn(x1))`` with an identity ``relu`` whose input
    the planner quantizes, then ``y += x`` written into that quantizer's output in place."""

    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.primary = nn.Sequential(nn.Conv2d(c, c, 1), nn.BatchNorm2d(c), nn.ReLU())
        self.cheap = nn.Sequential(nn.Conv2d(c, c, 3, 1, 1, groups=c), nn.BatchNorm2d(c))
        self.fusion_bn = nn.BatchNorm2d(c)
        self.relu = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = self.primary(x)
        y = self.relu(self.cheap(x1) + self.fusion_bn(x1))
        y += x
        return y


def test_parity_when_the_model_writes_into_a_quantizer_output(tmp_path: Path) -> None:
    """The per-quantizer check keeps its own copies: an in-place ``+=`` after a quantizer changed
    the recorded torch output and the ORT tensor forced into the isolated run, and every element
    of that quantizer was counted as a Q/DQ mismatch."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, 1, 1), _InPlaceResidual(), _InPlaceResidual(), nn.Conv2d(16, 16, 1)
    ).eval()
    x = torch.randn(2, 3, 8, 8)
    prepared = qdq.prepare(model, (x[:1],))
    qdq.calibrate(prepared, [x], method="max", show_progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = qdq.export_onnx(prepared, (x[:1],), tmp_path / "m.onnx", verify=False)
    report = parity(prepared, out.path, [x[:1]], per_layer=True)
    assert "1.relu.input_quantizer" in report.layers  # the quantizer written into
    assert all(lp.qdq_mismatches == 0 for lp in report.layers.values()), report.layers
    assert report.first_unexplained is None and report.min_cosine > 0.999


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_parity_when_a_tapped_tensor_is_also_a_model_output(exporter: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    prepared = qdq.prepare(_Taps().eval(), (x,))
    qdq.calibrate(prepared, [x], show_progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = qdq.export_onnx(prepared, (x,), tmp_path / "m.onnx", exporter=exporter)
    report = parity(prepared, out.path, [x], per_layer=True)
    assert report.min_cosine > 0.9999  # both outputs compared, the tap not mistaken for one
    assert "conv2.input_quantizer" in report.layers
    assert report.layers["conv2.input_quantizer"].qdq_mismatches == 0


def test_float64_reference_is_the_noise_floor(calibrated, tmp_path: Path) -> None:
    """torch float32 and ORT both agree with the exact-accumulation float64 copy, which runs
    without touching the prepared model."""
    prepared, x = calibrated
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = qdq.export_onnx(prepared, (x[:1],), tmp_path / "m.onnx")
    before = {k: v.clone() for k, v in prepared.state_dict().items()}
    report = parity(prepared, out.path, [x[:16], x[16:]], reference=True)
    ref = report.reference
    assert ref is not None and ref.error is None
    assert ref.torch_top1 == 1.0 and ref.onnx_top1 == 1.0
    assert 0.0 < ref.torch_max_abs_diff < 1e-2 and 0.0 < ref.onnx_max_abs_diff < 1e-2
    assert ref.explains_top1()
    assert ref.torch_max_abs_diff_by_output == (ref.torch_max_abs_diff,)  # one output
    assert ref.onnx_max_abs_diff_by_output == (ref.onnx_max_abs_diff,)
    assert ref.torch_top1_flips == ref.onnx_top1_flips == ref.top1_flips_beyond_rounding() == ()
    assert report.to_dict()["reference"]["onnx_top1"] == 1.0
    after = prepared.state_dict()
    assert all(after[k].dtype == v.dtype and torch.equal(after[k], v) for k, v in before.items())
    assert parity(prepared, out.path, [x]).reference is None  # only when asked


def test_float64_reference_exposes_a_wrong_export(calibrated, tmp_path: Path) -> None:
    """A weight changed in the ONNX only: ORT strays from the exact reference while torch does
    not, so the top-1 difference is not float rounding and the parity check fails."""
    from qdq.cli.parity import failures

    prepared, x = calibrated
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = qdq.export_onnx(prepared, (x[:1],), tmp_path / "m.onnx")
    model = onnx.load(str(out.path))
    init = next(i for i in model.graph.initializer if i.name.endswith("fc.weight"))
    w = onnx.numpy_helper.to_array(init)
    init.CopyFrom(onnx.numpy_helper.from_array(np.ascontiguousarray(w[::-1]), init.name))
    report = parity(prepared, model, [x], reference=True)
    ref = report.reference
    assert ref is not None and ref.torch_top1 == 1.0
    assert ref.onnx_top1 is not None and ref.onnx_top1 < 0.5
    assert not ref.explains_top1(0.01)
    # the flipped rows are no near-ties: their float64 margins dwarf float32 rounding
    beyond = ref.top1_flips_beyond_rounding()
    assert len(beyond) == len(ref.onnx_top1_flips) == round((1 - ref.onnx_top1) * len(x))
    assert min(m for _, m in beyond) > 2 * ref.torch_max_abs_diff
    (message,) = failures(report, 0.01)
    assert "float64 reference ORT agrees on" in message and "torch float32 on 100.00%" in message


def test_top1_flips_are_judged_by_their_distance_from_a_tie() -> None:
    """A row ORT flips is excused when its float64 margin is within twice torch's float32
    deviation on that output, whatever the other outputs' scales."""
    from qdq.backends.parity import ReferenceParity

    flips = ((0, 0.15), (0, 0.25), (1, 3.9), (1, 4.1), (0, 0.0))
    ref = ReferenceParity(1.0, 0.9, 2.0, 5.0, None, (0.1, 2.0), (0.3, 5.0), (), flips)
    assert ref.top1_flips_beyond_rounding() == ((0, 0.25), (1, 4.1))
    assert ReferenceParity(1.0, 1.0, 0.1, 0.1).top1_flips_beyond_rounding() == ()
    exact = ReferenceParity(1.0, 0.5, 0.0, 0.0, None, (0.0,), (0.0,), (), ((0, 1e-12),))
    assert exact.top1_flips_beyond_rounding() == ((0, 1e-12),)  # no rounding at all: no excuse


class _Float32Only(nn.Module):
    """Builds a float32 tensor in forward: cannot run as a float64 copy."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) @ torch.eye(4, dtype=torch.float32)


def test_float64_reference_that_cannot_run_says_why(tmp_path: Path) -> None:
    from qdq.cli.parity import failures

    torch.manual_seed(0)
    x = torch.randn(16, 8)
    prepared = qdq.prepare(_Float32Only().eval(), (x,))
    qdq.calibrate(prepared, [x], show_progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = qdq.export_onnx(prepared, (x,), tmp_path / "m.onnx")
    report = parity(prepared, out.path, [x], reference=True)
    assert report.top1_agreement == 1.0  # the torch-vs-ORT comparison is unaffected
    ref = report.reference
    assert ref is not None and ref.torch_top1 is None and not ref.explains_top1()
    assert ref.error is not None and ref.error.startswith("float64 forward failed: RuntimeError")
    assert failures(report, 0.01) == []


def test_top1_flips_within_the_noise_floor_pass() -> None:
    """A deep INT8 model flips near-tied rows under any float reordering: when ORT agrees with
    the exact reference as often as torch does, the flips are not a failure; when it does not,
    or no reference ran, they are."""
    from qdq.backends.parity import ParityReport, ReferenceParity
    from qdq.cli.parity import failures

    def report(torch_top1: float, onnx_top1: float) -> ParityReport:
        ref = ReferenceParity(torch_top1, onnx_top1, 0.35, 0.35)
        return ParityReport(0.35, 0.02, 0.999, 123 / 128, 8, reference=ref)

    assert failures(report(120 / 128, 121 / 128), 0.01) == []
    assert failures(report(120 / 128, 119 / 128), 0.01) == []  # within the threshold
    assert len(failures(report(120 / 128, 110 / 128), 0.01)) == 1
    assert len(failures(replace(report(1.0, 1.0), reference=None), 0.01)) == 1


def test_export_check_consults_the_float64_reference_and_still_fails_a_wrong_graph(
    calibrated, tmp_path: Path
) -> None:
    """verify_numerics: a correct export passes; a weight changed in the ONNX fails even after
    the float64 second opinion, which the message reports."""
    from qdq.export import ExportError
    from qdq.export.verify import verify_numerics

    prepared, x = calibrated
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = qdq.export_onnx(prepared, (x[:1],), tmp_path / "m.onnx")
    batches = [(x[:16],), (x[16:],)]
    ok = verify_numerics(
        out.path.read_bytes(), prepared, batches, to_model=tuple, fp16=False, error=ExportError
    )
    assert ok and all(c.ort_vs_torch <= c.tolerance(1e-4) for c in ok)
    model = onnx.load(str(out.path))
    init = next(i for i in model.graph.initializer if i.name.endswith("fc.weight"))
    w = onnx.numpy_helper.to_array(init)
    init.CopyFrom(onnx.numpy_helper.from_array(np.ascontiguousarray(w[::-1]), init.name))
    with pytest.raises(ExportError, match="from the float64 fake-quant model, torch float32"):
        verify_numerics(
            model.SerializeToString(), prepared, batches, to_model=tuple, fp16=False,
            error=ExportError,
        )  # fmt: skip


def test_outputs_whose_size_depends_on_values_are_set_aside() -> None:
    # detections after NMS: torch and ORT may keep different numbers of boxes
    from qdq.backends.parity import _EndToEnd
    from qdq.cli.parity import failures

    ends = _EndToEnd()
    ends.add([torch.eye(3), torch.zeros(25, 4)], [np.eye(3, dtype=np.float32), np.ones((30, 4))])
    ends.add([torch.eye(3), torch.zeros(7, 4)], [np.eye(3, dtype=np.float32), np.ones((8, 4))])
    report = ends.report(2, {}, None, False)
    assert report.size_differs == {1: ((25, 4), (30, 4))}  # the first differing shapes
    assert report.max_abs_diff == 0.0 and report.top1_agreement == 1.0  # output 1 left out
    assert report.to_dict()["size_differs"] == {"1": {"torch": [25, 4], "onnx": [30, 4]}}
    assert failures(report, 0.01) == [
        "output 1: (25, 4) in torch, (30, 4) in ONNX Runtime (a value-dependent size, e.g. "
        "detections after NMS: values near its threshold differ)"
    ]
    with pytest.raises(ValueError, match="torch returned 1 output tensors, the ONNX 2"):
        ends.add([torch.eye(3)], [np.eye(3), np.zeros((30, 4))])


def test_a_large_bias_at_a_tiny_input_scale_is_added_in_float(tmp_path) -> None:
    """ORT's WeightBiasQuantization rewrite (on at ORT_ENABLE_BASIC) turns a float bias into int32
    at scale s_x * s_w; here 0.06 / (~1e-8 * ~2e-5) overflows int32 and ORT's output moved by
    ~4e-4 (yolov8n-seg's mask upsample: 0.10, a failed export verification). Our sessions switch
    it off: the ONNX computes what torch's fake-quant model computes, bit for bit."""
    import numpy as np

    import qdq
    from qdq.backends.onnxruntime import run, session

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(16, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.ConvTranspose2d(32, 16, 2, stride=2),
    ).eval()
    with torch.no_grad():
        net[2].bias.fill_(0.06)
        net[2].weight.mul_(0.01)
    x = torch.rand(4, 16, 8, 8, generator=torch.Generator().manual_seed(0)) * 1e-6
    prepared = qdq.prepare(net, (x[:1],))
    qdq.calibrate(prepared, [x], method="max", show_progress=False)
    out = qdq.export_onnx(prepared, (x[:1],), tmp_path / "m.onnx", check_inputs=[(x,)])
    with torch.no_grad():
        expected = prepared(x).numpy()
    assert np.array_equal(run(session(out.path), [x])[0], expected)


def test_instance_rows_selected_differently_are_counted_apart_from_wrong_values() -> None:
    """Per-image detectors: a RoI that one runtime's top-k or NMS selected and the other's did
    not changes a whole row (and shifts the rows after it); a wrong export changes every row."""
    from qdq.backends.parity_layers import LayerParity, _isolated_rows

    q = qdq.Quantizer(qdq.QuantSpec(), name="roi")
    scale = np.array(0.05, dtype=np.float32)
    gen = np.random.default_rng(0)
    ours = gen.uniform(-4, 4, (12, 6, 3, 3)).astype(np.float32)
    theirs = ours.copy()
    theirs[4:11] = ours[5:12]  # ORT dropped torch's RoI 4 ...
    theirs[11] = gen.uniform(-4, 4, (6, 3, 3))  # ... and selected another one last
    theirs[0] += 1e-6  # rounding, explained
    empty = LayerParity(0.0, 1.0, 0, 0)
    lp = _isolated_rows(empty, q, ours, theirs, scale)
    assert (lp.rows, lp.reselected_rows, lp.unexplained_codes) == (12, 1, 0)
    wrong = _isolated_rows(empty, q, ours, theirs * 1.1, scale)  # e.g. a wrong weight upstream
    assert wrong.reselected_rows == 12
    one_value = theirs.copy()
    one_value[2, 0, 0, 0] += 0.5  # one value wrong in a row: the same instance, compared
    lp = _isolated_rows(empty, q, ours, one_value, scale)
    assert (lp.reselected_rows, lp.unexplained_codes) == (1, 1)
