"""The pipeline's options take the forms the CLI takes (issue 31, item 5)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from qdq.pipeline import DataOptions
from qdq.pipeline.forms import image_size, per_channel


@pytest.mark.parametrize(
    ("value", "expected"),
    [(64, (64, 64)), ((32, 48), (32, 48)), ([32, 48], (32, 48)), ("64", (64, 64)),
     ("32,48", (32, 48)), ("32x48", (32, 48)), ("32 , 48", (32, 48)), ((16,), (16, 16))],
)  # fmt: skip
def test_image_size_forms(value: object, expected: tuple[int, int]) -> None:
    assert image_size(value, "image_size") == expected
    assert DataOptions(image_size=value).image_size == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [0, -3, "a", "1,2,3", (1, 2, 3), (1.5, 2), True, 2.0, None, ""])
def test_bad_image_sizes_name_the_option(value: object) -> None:
    with pytest.raises(ValueError, match=r"^--image-size must be N or \(H, W\)"):
        image_size(value, "--image-size")


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0.5, (0.5,)), (1, (1.0,)), ((0.1, 0.2, 0.3), (0.1, 0.2, 0.3)), ("0.1,0.2,0.3", (0.1, 0.2, 0.3)),
     ([0.5], (0.5,))],
)  # fmt: skip
def test_per_channel_forms(value: object, expected: tuple[float, ...]) -> None:
    assert per_channel(value, "mean") == pytest.approx(expected)
    assert DataOptions(std=value).std == pytest.approx(expected)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["x", "0.1,,0.2", (), ("a",), True, object()])
def test_bad_per_channel_values_name_the_option(value: object) -> None:
    with pytest.raises(ValueError, match="^std must be a number"):
        DataOptions(std=value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"channels": 2}, "channels must be 1"), ({"channels": True}, "channels must be 1"),
     ({"seed": "0"}, "seed must be an int"), ({"calib_samples": 0}, "calib_samples must be")],
)  # fmt: skip
def test_other_bad_options(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DataOptions(**kwargs)  # type: ignore[arg-type]


def test_an_int_image_size_reaches_the_preprocessing(tmp_path: Path) -> None:
    """``DataOptions(image_size=64)`` used to fail in ImagePreprocess (len() of an int)."""
    pil = pytest.importorskip("PIL.Image")
    from qdq.pipeline.data import resolve_data

    rng = np.random.default_rng(0)
    for i in range(4):
        pil.fromarray((rng.random((40, 50, 3)) * 255).astype(np.uint8)).save(tmp_path / f"{i}.png")
    data = resolve_data(str(tmp_path), None, DataOptions(image_size=24, mean="0.5", std=0.25))
    assert tuple(data.calibration.shape[1:]) == (3, 24, 24)
