"""Fidelity on every built-in pretrained model (issue 17, item 3): the torch fake-quant model and
its exported Q/DQ ONNX, run in ONNX Runtime, compute the same thing.

Per zoo entry: calibrate with the default method on the entry's own data, export with the default
exporter, then :func:`qdq.backends.parity.parity` (per layer, with the float64 reference) on
evaluation samples the calibration never saw. Asserted:

* every Q/DQ pair is bit-exact on ORT's own input, and every INT8 code that differs when a layer is
  fed ORT's own input is a rounding-boundary flip (float accumulation order), none beyond;
* top-1 agrees on every sample, or ORT is at least as close to the exact (float64) fake-quant
  model as torch's own float32 forward is (then the flips are float rounding, not the export);
* the task metric (pitch accuracy, face accuracy, detection F1) scored from ORT's outputs equals
  the one scored from torch's.

The counts behind each verdict print with ``-s``.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

import qdq
from qdq.backends.parity import parity
from qdq.pipeline.evaluate import ort_outputs, torch_outputs
from qdq.zoo.registry import MODELS, get_dataset, get_model

pytest.importorskip("onnxruntime")

#: (calibration, evaluation) samples per entry: small, but enough for every class of sample
SAMPLES = {
    "fashion-mnist-resnet": (64, 256),
    "efficientnet-lite0": (16, 32),
    "crepe-tiny": (16, 96),
    "mtcnn-rnet": (32, 96),
    "mtcnn-onet": (32, 96),
    "ppocr-det": (4, 6),
}
BATCH = 16


def _batches(x: torch.Tensor) -> list[torch.Tensor]:
    return list(x.split(BATCH))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_zoo_model_and_export_agree(name: str, tmp_path: Path) -> None:
    entry = get_model(name)
    missing = entry.missing()
    if missing:
        pytest.skip(f"{name} needs: {'; '.join(missing)}")
    assert name in SAMPLES, f"new zoo entry {name}: give it sample counts in SAMPLES"
    torch.manual_seed(0)
    dataset = get_dataset(entry.dataset)
    loaded = dataset.load(*SAMPLES[name], 0)
    prepared = qdq.prepare(entry.build().eval(), (loaded.calibration[:2],))
    qdq.calibrate(prepared, _batches(loaded.calibration), show_progress=False)
    path = tmp_path / f"{name}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # exporter chatter; the parity below is the check
        qdq.export_onnx(prepared, (loaded.calibration[:2],), path)

    report = parity(prepared, path, _batches(loaded.evaluation), per_layer=True, reference=True)

    layers = report.layers
    assert layers, "no activation quantizer was compared"
    flips = sum(lp.isolated_codes for lp in layers.values())
    elements = sum(lp.elements for lp in layers.values())
    print(
        f"\n{name}: {len(layers)} quantizers, {flips}/{elements} codes differ in isolation "
        f"(rounding-boundary flips), first diverging {report.first_diverging}, "
        f"top-1 {report.top1_agreement}, max abs diff {report.max_abs_diff:.3g}, "
        f"cosine {report.min_cosine:.6f}, reference {report.reference}"
    )
    assert {n: lp.qdq_mismatches for n, lp in layers.items() if lp.qdq_mismatches} == {}
    assert {n: lp.unexplained_codes for n, lp in layers.items() if lp.unexplained_codes} == {}
    # a flip moves a value by one step; more than a few in a thousand is not accumulation order
    assert flips <= 2e-3 * elements
    ref = report.reference
    assert ref is not None
    if report.top1_agreement is not None and report.top1_agreement < 1.0:
        assert ref.explains_top1(), (
            f"top-1 {report.top1_agreement:.2%}, ORT vs float64 {ref.onnx_top1}, "
            f"torch vs float64 {ref.torch_top1}"
        )
    assert report.min_cosine > 0.999

    if dataset.metric is not None:
        ours = torch_outputs(prepared, loaded.evaluation, BATCH, static=False, desc="", show=False,
                             every=True)  # fmt: skip
        theirs = ort_outputs(path, loaded.evaluation, BATCH, static=False, desc="", show=False,
                             every=True)  # fmt: skip
        fig_torch = dataset.metric.score(ours, ours, loaded.targets)
        fig_onnx = dataset.metric.score(theirs, ours, loaded.targets)
        print(f"{name}: {dataset.metric.name} torch {fig_torch} / ORT {fig_onnx}")
        assert fig_onnx[dataset.metric.name] == fig_torch[dataset.metric.name]
