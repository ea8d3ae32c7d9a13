"""Output kinds with the model's input (``qdq.pipeline.kinds``: image-to-image outputs, overrides),
the PSNR figure, the per-sample cosine at tiny magnitudes and degenerate FP32 outputs
(``qdq.pipeline.degenerate``), on synthetic tensors."""

from __future__ import annotations

import pytest
import torch

from qdq.debug.stats import sample_cosines
from qdq.pipeline.degenerate import FLOAT16_TINY, degenerate_outputs, warning
from qdq.pipeline.evaluate import score
from qdq.pipeline.headline import kind_metric, output_kinds, output_metric
from qdq.pipeline.kinds import check_kind_name, image_input, named_kind, output_kind
from qdq.pipeline.outputs import PSNR_CAP, compare, cosines, describe, output_table, psnr

G = torch.Generator().manual_seed(0)


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=G)


def test_cosine_is_scale_invariant_down_to_denormals() -> None:
    ref = _randn(6, 3, 8, 8)
    out = ref + 0.2 * _randn(6, 3, 8, 8)
    unit = sample_cosines(out, ref)
    assert float(unit.min()) > 0.9 and float(unit.max()) < 1.0
    # 2**-100 (about 7.9e-31) scales float32 exactly: the very same cosine
    tiny = 2.0**-100
    assert torch.equal(sample_cosines(out * tiny, ref * tiny), unit)
    assert torch.equal(cosines(out * tiny, ref * tiny), unit)
    # float32 denormals (about 1e-41) keep a few digits: still the cosine, not about 0
    assert torch.allclose(sample_cosines(out * 1e-41, ref * 1e-41), unit, atol=0.02)
    row = compare(out * tiny, ref * tiny, output_kind(ref * tiny))
    assert row["cosine_mean"] == pytest.approx(float(unit.mean()), abs=1e-12)
    assert row["relative_error"] == pytest.approx(
        compare(out, ref, output_kind(ref))["relative_error"]
    )
    # two all-zero samples agree; a zero sample against a non-zero one does not; NaN stays NaN
    zeros, ones = torch.zeros(1, 4), torch.ones(1, 4)
    assert sample_cosines(zeros, zeros).tolist() == [1.0]
    assert sample_cosines(zeros, ones).tolist() == sample_cosines(ones, zeros).tolist() == [0.0]
    assert torch.isnan(sample_cosines(ones * float("nan"), ones)).all()
    assert sample_cosines(torch.tensor([2.0, -1.0]), torch.tensor([3.0, 1.0])).tolist() == [1, -1]
    with pytest.raises(ValueError, match=r"shape \(1, 4\) != reference \(1, 3\)"):
        sample_cosines(ones, torch.ones(1, 3))


def test_image_outputs_are_told_from_class_maps_by_the_input() -> None:
    rgb, latent = (3, 32, 32), (4, 8, 8)
    assert image_input([torch.zeros(2, 7), torch.zeros(2, *rgb)]) == rgb
    assert image_input([torch.zeros(2, 7)]) is None
    same = output_kind(_randn(2, 3, 32, 32), image_input=rgb)  # a denoiser, a pixel-space UNet
    assert (same.name, same.figure) == ("image", "psnr")
    assert same.describe((3, 32, 32)) == "image: (N, 3, 32, 32), the input's 3 channels at its size"
    noise = output_kind(_randn(2, 4, 8, 8), image_input=latent)  # a latent UNet's noise
    assert noise.reason == "the input's 4 channels at its size"
    vae = output_kind(_randn(2, 3, 64, 64), image_input=latent)  # a VAE decoder: 8x, 4 -> 3
    assert vae.name == "image" and vae.reason == "3 channels at 8x the input's size"
    depth = output_kind(_randn(2, 1, 32, 32), image_input=rgb, first=False)
    assert depth.name == "image" and depth.reason == "one channel at the input's size"
    seg = output_kind(_randn(2, 21, 32, 32), image_input=rgb)
    assert seg.describe((21, 32, 32)) == (
        "class_map: (N, 21, 32, 32), 21 channels at the input's size, the first output"
    )
    binary = output_kind(_randn(2, 2, 32, 32), image_input=rgb)  # 2 classes of an RGB image
    assert binary.name == "class_map"
    softmax = output_kind(_randn(2, 3, 32, 32).softmax(dim=1), image_input=rgb)
    assert softmax.name == "class_map" and "per-pixel class probabilities" in softmax.reason
    stride = output_kind(_randn(2, 3, 8, 8), image_input=rgb)  # a head at stride 4: no image
    assert stride.name == "class_map"
    # without the input (or with a non-image input) the guess is the shape's alone
    assert output_kind(_randn(2, 3, 32, 32)).name == "class_map"
    assert output_kind(_randn(2, 3, 32, 32), first=False).name == "tensor"


def test_psnr_against_fp32() -> None:
    ref = torch.linspace(-1, 1, 201).reshape(1, 201).repeat(3, 1)  # range 2 per sample
    out = ref + torch.tensor([[0.02], [0.002], [0.0]])
    db = psnr(out, ref)
    assert db[0] == pytest.approx(40.0) and db[1] == pytest.approx(60.0)  # 20·log10(2 / err)
    assert db[2] == PSNR_CAP  # identical: the cap, FP32's own figure
    # peak: a constant sample's largest |value|; an all-zero one gives -cap against an error
    flat = torch.full((1, 8), 0.5)
    assert psnr(flat + 0.005, flat)[0] == pytest.approx(40.0)
    assert psnr(torch.ones(1, 8), torch.zeros(1, 8)).tolist() == [-PSNR_CAP]
    assert psnr(torch.zeros(1, 8), torch.zeros(1, 8)).tolist() == [PSNR_CAP]
    assert torch.isnan(psnr(ref * float("nan"), ref)).all()

    img = _randn(4, 3, 16, 16)
    kind = output_kind(img, image_input=(3, 16, 16))
    rows = output_table([img + 0.01], [img], ["output"], None, headline=0, kinds=[kind])
    row = rows[0]
    assert row["kind"] == "image" and row["figure"] == "psnr" and row["value"] == row["psnr"]
    assert 40.0 < row["psnr_min"] <= row["psnr"] < 60.0
    assert row["kind_reason"] == "image: (N, 3, 16, 16), the input's 3 channels at its size"
    assert describe(row).startswith(f"output (image, 3x16x16): psnr {row['psnr']:.2f} dB (min ")


def test_a_kind_given_instead_of_the_guess() -> None:
    img = _randn(4, 3, 16, 16)
    given = named_kind("class_map", img)
    assert (
        given.figure == "pixel_agreement" and given.reason == "as given (output_kind='class_map')"
    )
    assert named_kind("image", _randn(4, 10)).figure == "psnr"
    with pytest.raises(ValueError, match=r"unknown output kind 'segmentation'; choose one of "):
        check_kind_name("segmentation")
    with pytest.raises(ValueError, match=r"output_kind 'class_vector' does not fit output 0 of "
                       r"shape \(N, 3, 16, 16\): a class vector is \(N, C\)"):  # fmt: skip
        named_kind("class_vector", img)
    with pytest.raises(ValueError, match="detections are"):
        named_kind("detections", _randn(4, 84, 400))  # raw logits: no scores in [0, 1]

    # bound at the check stage: the given kind, or an image guessed from the input
    bound = output_metric(["output"], [img[:1]], img[:1], "class_map")
    assert bound is not None and (bound.name, bound.kind, bound.output) == (
        "pixel_agreement",
        "class_map",
        0,
    )
    guessed = output_metric(["output"], [img[:1]], img[:1])
    assert guessed is not None and guessed.name == "psnr" and guessed.kind == "image"
    assert "peak: FP32's value range per sample" in (guessed.text or "")
    assert output_metric(["output"], [_randn(1, 10)], img[:1]) is None  # a class vector
    # every stage scores the bound figure, and the table shows the bound kind
    out = img + 0.01
    s = score([out], [img], None, guessed)
    assert s["metric"] == s["figures"]["psnr"] and s["top1_agreement"] is None
    assert set(s["figures"]) == {"psnr", "psnr_min", "cosine"}
    assert score([img], [img], None, guessed)["metric"] == PSNR_CAP
    assert [k.name for k in output_kinds([img], ["output"], _randn(4, 3, 8, 8), bound)] == [
        "class_map"
    ]
    assert output_kinds([img], ["output"], img)[0].name == "image"
    tensor = kind_metric(named_kind("tensor", img), (3, 16, 16))
    assert set(tensor.score([out], [img], None)) == {"cosine", "cosine_min"}


def test_degenerate_fp32_outputs() -> None:
    logits = _randn(8, 10)
    assert degenerate_outputs([logits, _randn(8, 4, 4)]) == []
    found = degenerate_outputs(
        [logits * 1e-41, torch.ones(8, 3), logits * float("nan"), torch.zeros(8, 2)],
        ["output[0]", "output[1]", "output[2]", "output[3]"],
    )
    assert [(d.output, d.problem) for d in found] == [
        (0, "underflow"),
        (1, "constant"),
        (2, "non_finite"),
        (3, "underflow"),
        (3, "constant"),
    ]
    assert "below float16's smallest normal number 2^-14 = 6.1e-05" in found[0].detail
    assert found[1].detail == "the same for all 8 evaluation samples (largest spread 0)"
    assert (
        found[2].detail == "80 of 80 values are NaN or infinite"
        and found[3].detail == "every value is 0"
    )
    # the threshold: float16's smallest normal, not below it
    assert (
        degenerate_outputs([torch.full((2, 1), FLOAT16_TINY) * torch.tensor([[1.0], [0.5]])]) == []
    )
    assert degenerate_outputs([torch.ones(1, 3)]) == []  # one sample: nothing to be constant across
    text = warning(found[0], True, "top1_agreement")
    assert text.startswith("the FP32 model is degenerate: output[0] underflows: its largest")
    assert "the INT8 figures (the headline top1_agreement" in text
    assert "its INT8 figures in the outputs table mean nothing" in warning(found[1], False, "x")
