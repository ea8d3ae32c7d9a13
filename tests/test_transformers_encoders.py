"""Hugging Face ``transformers`` encoders through the main job (issue 35, what works today): a
BERT classifier and a bare BERT encoder built from small configs with random weights, token data
in a ``.npz`` whose arrays are named after ``forward``'s parameters (``input_ids``,
``attention_mask``, optional ``labels``), ``ModelOutput`` outputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from qdq.pipeline import DataOptions, PtqOptions, quantize

transformers = pytest.importorskip("transformers")


def _config(**extra: object):
    return transformers.BertConfig(
        vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=32, **extra,
    )  # fmt: skip


def _tokens(path: Path, n: int = 48, length: int = 16, labels: bool = True) -> Path:
    """Random token ids with right padding (lengths 6 to ``length``) and a matching mask."""
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 500, (n, length)).astype(np.int64)
    mask = np.ones((n, length), np.int64)
    for i, used in enumerate(rng.integers(6, length + 1, n)):
        mask[i, used:] = 0
        ids[i, used:] = 0
    arrays = {"input_ids": ids, "attention_mask": mask}
    if labels:
        arrays["labels"] = rng.integers(0, 3, n)
    np.savez(path, **arrays)
    return path


def _run(model: torch.nn.Module, data: Path, out: Path) -> dict:
    quantize(model, str(data), out=out, ptq=PtqOptions(), show_progress=False,
             data_options=DataOptions(calib_samples=16, eval_samples=32))  # fmt: skip
    return json.loads((out / "report.json").read_text())


def test_bert_classifier_quantizes_on_token_arrays(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(_config(num_labels=3)).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    r = _run(model, _tokens(tmp_path / "tokens.npz"), tmp_path / "bert")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # untouched
    # the arrays are its keyword inputs, in forward's order; labels are never an input
    assert [i["name"] for i in r["data"]["inputs"]] == ["input_ids", "attention_mask"]
    assert r["metric_name"] == "top1_accuracy"  # labels given: accuracy of the logits
    first = r["outputs"][0]
    assert first["kind"] == "class_vector" and "logits" in (first["name"] or "")
    # measured (16 / 32 samples, mse, random weights): cosine 0.9989, top-1 agreement 1.0
    assert first["cosine_mean"] > 0.99 and first["top1_agreement"] >= 0.9
    # every GEMM and both attention products INT8 but the 64 -> 3 classifier (P14)
    assert r["lint_verdict"] == "PASS"
    assert r["lint"]["int8_weighted_layers"] == r["lint"]["weighted_layers"] - 1
    assert [s["name"] for s in r["skipped_layers"]] == ["classifier"]


def test_bert_encoder_without_a_head_is_scored_on_its_pooled_embedding(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = transformers.BertModel(_config()).eval()
    r = _run(model, _tokens(tmp_path / "tokens.npz", labels=False), tmp_path / "enc")
    names = [o["name"] for o in r["outputs"]]
    assert names == ["output['last_hidden_state']", "output['pooler_output']"], names
    # the pooled embedding is no class vector: compared by cosine, and it is the headline
    kinds = [(o["kind"], o["figure"]) for o in r["outputs"]]
    assert kinds == [("tensor", "cosine"), ("embedding", "cosine")], kinds
    assert r["metric_name"] == "embedding_cosine"
    assert r["headline"]["output"] == 1 and r["headline"]["kind"] == "embedding"
    assert r["int8_metric"] == pytest.approx(r["outputs"][1]["cosine_mean"], abs=1e-9)
    assert r["fp32_metric"] == pytest.approx(1.0)
    # measured: last_hidden_state 0.99986, pooler_output 0.99978
    assert all(o["cosine_mean"] > 0.99 for o in r["outputs"])
    assert r["lint_verdict"] == "PASS"


class MeanPooled(torch.nn.Module):
    """A sentence-transformers-style encoder: BERT, then the mask-weighted mean of the last
    hidden state, returned as sentence-transformers names it."""

    def __init__(self) -> None:
        super().__init__()
        self.bert = transformers.BertModel(_config(), add_pooling_layer=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict:
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return {"sentence_embedding": (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)}


def test_a_mean_pooled_sentence_encoder_takes_a_list_of_tokenizer_batches(tmp_path: Path) -> None:
    """In-memory data: a list of tokenizer-style batch dicts, straight to ``qdq.quantize``."""
    torch.manual_seed(0)
    arrays = np.load(_tokens(tmp_path / "t.npz", labels=False))
    batches = [
        {k: torch.from_numpy(arrays[k][i : i + 8]) for k in ("input_ids", "attention_mask")}
        for i in range(0, 48, 8)
    ]
    model = MeanPooled().eval()
    result = quantize(model, batches, out=tmp_path / "st", ptq=PtqOptions(), show_progress=False,
                      data_options=DataOptions(calib_samples=16, eval_samples=32))  # fmt: skip
    r = result.report
    assert "in memory: 6 batches of 48 samples" in r["data"]["split"]
    assert [i["name"] for i in r["data"]["inputs"]] == ["input_ids", "attention_mask"]
    assert r["metric_name"] == "embedding_cosine" and r["headline"]["output"] == 0
    assert r["outputs"][0]["kind"] == "embedding"
    assert r["int8_metric"] > 0.99 and r["lint_verdict"] == "PASS"
