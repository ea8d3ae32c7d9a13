"""In-memory data for ``qdq.quantize(model, data)`` (:mod:`qdq.pipeline.memory`): tensors, dicts,
lists and DataLoaders of batches, tokenized rows; and the errors that name the culprit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from qdq.pipeline.data import resolve_data
from qdq.pipeline.memory import from_memory


class _Tokens(nn.Module):
    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        return input_ids.float() * attention_mask


def _encoding(n: int, length: int = 8) -> dict[str, torch.Tensor]:
    """A tokenizer's batch output (a ``BatchEncoding`` is a dict of 2-D tensors)."""
    return {
        "input_ids": torch.randint(1, 100, (n, length)),
        "attention_mask": torch.ones(n, length, dtype=torch.int64),
        "labels": torch.randint(0, 3, (n,)),
    }


def test_a_list_of_tokenizer_batches_becomes_keyword_inputs_and_labels() -> None:
    batches = [_encoding(4), _encoding(3)]
    inputs, labels, what = from_memory(batches, _Tokens())
    assert isinstance(inputs, dict) and list(inputs) == ["input_ids", "attention_mask"]
    assert inputs["input_ids"].shape == (7, 8) and inputs["input_ids"].dtype == torch.int64
    assert labels is not None and torch.equal(labels, torch.cat([b["labels"] for b in batches]))
    assert "2 batches of 7 samples" in what
    assert torch.equal(inputs["input_ids"][:4], batches[0]["input_ids"])  # order kept


def test_dataset_rows_are_samples_not_batches() -> None:
    rows = [
        {"input_ids": [5, 6, 7, 0], "attention_mask": [1, 1, 1, 0], "label": i % 2}
        for i in range(5)
    ]
    inputs, labels, _ = from_memory(rows, _Tokens())
    assert isinstance(inputs, dict) and inputs["input_ids"].shape == (5, 4)
    assert labels is not None and labels.tolist() == [0, 1, 0, 1, 0]


def test_a_dataloader_of_image_label_pairs_and_a_plain_tensor() -> None:
    x, y = torch.randn(10, 3, 4, 4), torch.randint(0, 5, (10,))
    loader = DataLoader(TensorDataset(x, y), batch_size=4)
    inputs, labels, _ = from_memory(loader, nn.Conv2d(3, 4, 1))
    assert torch.equal(inputs, x) and labels is not None and torch.equal(labels, y)
    inputs, labels, _ = from_memory(x.double().numpy(), nn.Conv2d(3, 4, 1))
    assert inputs.dtype == torch.float32 and inputs.shape == x.shape and labels is None


def test_positional_batches_stay_positional() -> None:
    class Two(nn.Module):
        def forward(self, a, b):
            return a + b

    batches = [(torch.randn(2, 5), torch.randn(2, 5), torch.randn(2, 5))]
    inputs, labels, _ = from_memory(batches, Two())
    assert isinstance(inputs, tuple) and len(inputs) == 3 and labels is None


class _ImageAndTokens(nn.Module):
    def forward(self, image, ids):
        return image.mean((1, 2, 3)) + ids.float().mean(1)


class _TwoImages(nn.Module):
    def forward(self, a, b):
        return a - b


def test_a_tuple_of_several_inputs_is_one_batch() -> None:
    """``(image, ids)`` for ``forward(image, ids)``: the inputs of one batch, not two batches
    of one input (which could not be joined); ``(x, labels)`` likewise; two inputs of one shape
    are one batch when ``forward`` takes two; three tensors for a one-input model stay three
    batches."""
    image, ids = torch.randn(6, 3, 4, 4), torch.randint(0, 50, (6, 7))
    inputs, labels, _ = from_memory((image, ids), _ImageAndTokens())
    assert isinstance(inputs, tuple) and labels is None
    assert torch.equal(inputs[0], image) and torch.equal(inputs[1], ids)
    y = torch.randint(0, 3, (6,))
    inputs, labels, _ = from_memory((image, y), nn.Conv2d(3, 4, 1))
    assert torch.equal(inputs, image) and labels is not None and torch.equal(labels, y)
    a, b = torch.randn(5, 8), torch.randn(5, 8)
    inputs, _, _ = from_memory((a, b), _TwoImages())
    assert isinstance(inputs, tuple) and torch.equal(inputs[0], a) and torch.equal(inputs[1], b)
    parts = (torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4))
    inputs, _, what = from_memory(parts, nn.Conv2d(3, 4, 1))
    assert inputs.shape == (6, 3, 4, 4) and "3 batches" in what


def test_in_memory_data_is_split_like_a_file() -> None:
    data = resolve_data([_encoding(6), _encoding(6)], model=_Tokens())
    assert data.labels is not None and len(data.labels) == 6  # 12 samples: 6 calibrate, 6 evaluate
    assert "in memory: 2 batches of 12 samples" in data.split


@pytest.mark.parametrize(
    ("data", "error", "words"),
    [
        ([_encoding(2, 8), _encoding(2, 9)], ValueError, ["batch 1", "'input_ids'", "max_length"]),
        ([{"input_ids": [1, 2, 3]}, {"input_ids": [1, 2]}], ValueError, ["batch 1", "(1, 2)"]),
        (
            [_encoding(2), {"input_ids": torch.zeros(2, 8, dtype=torch.int64)}],
            ValueError,
            ["batch 1"],
        ),
        (
            [{"input_ids": torch.zeros(2, 3), "pixel": torch.zeros(2, 3)}],
            ValueError,
            ["'pixel'", "forward"],
        ),
        ([], ValueError, ["empty"]),
        (42, TypeError, ["int", "DataLoader"]),
        ([{"input_ids": ["a", "b"]}], TypeError, ["'input_ids'"]),
        ([{0: torch.zeros(2, 3)}], TypeError, ["key 0"]),
    ],
)
def test_bad_in_memory_data_is_refused_naming_the_culprit(data, error, words) -> None:
    with pytest.raises(error) as caught:
        from_memory(data, _Tokens())
    assert all(w in str(caught.value) for w in words), str(caught.value)


def test_the_users_tensors_are_not_modified() -> None:
    batch = _encoding(4)
    saved = {k: v.clone() for k, v in batch.items()}
    inputs, _, _ = from_memory([batch], _Tokens())
    inputs["input_ids"].zero_()
    assert all(torch.equal(saved[k], v) for k, v in batch.items())
    assert np.all(saved["input_ids"].numpy() > 0)
