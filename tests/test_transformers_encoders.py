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

import qdq
import qdq.lint
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


_WORDS = ["good", "bad", "film", "plot", "actor", "great", "awful", "the", "a", "was", "is"]


def _tokenizer(folder: Path) -> Path:
    """A WordPiece tokenizer built offline from a small vocabulary, saved as a folder."""
    vocab = folder / "vocab.txt"
    folder.mkdir(parents=True, exist_ok=True)
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *_WORDS]) + "\n")
    tok = transformers.BertTokenizerFast(vocab_file=str(vocab))
    tok.save_pretrained(str(folder))
    return folder


def _sentences(path: Path, n: int, labelled: str | None) -> Path:
    rng = np.random.default_rng(1)
    lines = []
    for i in range(n):
        text = " ".join(rng.choice(_WORDS, int(rng.integers(3, 12))))
        if labelled == "names":
            text = f"{['negative', 'neutral', 'positive'][i % 3]}\t{text}"
        elif labelled == "indices":
            text = f"{i % 3}\t{text}"
        lines.append(text)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_text_lines_with_a_local_tokenizer_through_the_cli(tmp_path: Path) -> None:
    """``--data reviews.tsv --tokenizer DIR --max-length 12``: label<TAB>text lines, the labels
    named as the model's config.label2id names them."""
    from qdq.cli.main import main

    (tmp_path / "tm.py").write_text(
        "import transformers, torch\n"
        "def build():\n"
        "    torch.manual_seed(0)\n"
        "    cfg = transformers.BertConfig(vocab_size=16, hidden_size=64, num_hidden_layers=2,\n"
        "        num_attention_heads=4, intermediate_size=128, max_position_embeddings=32,\n"
        "        num_labels=3, id2label={0: 'negative', 1: 'neutral', 2: 'positive'},\n"
        "        label2id={'negative': 0, 'neutral': 1, 'positive': 2})\n"
        "    return transformers.BertForSequenceClassification(cfg).eval()\n"
    )
    tok = _tokenizer(tmp_path / "tok")
    data = _sentences(tmp_path / "reviews.tsv", 40, "names")
    out = tmp_path / "q"
    args = ["quantize", "--model", f"{tmp_path / 'tm.py'}:build", "--data", str(data),
            "--tokenizer", str(tok), "--max-length", "12", "--calib-samples", "16",
            "--recipe", "none", "--calib", "max", "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(args) == 0
    r = json.loads((out / "report.json").read_text())
    assert "40 lines tokenized by tok to 12 tokens" in r["data"]["split"]
    assert "labels by config.label2id" in r["data"]["split"]
    names = [i["name"] for i in r["data"]["inputs"]]
    assert names == ["input_ids", "attention_mask", "token_type_ids"]
    assert all(i["shape"] == [12] for i in r["data"]["inputs"])
    assert r["metric_name"] == "top1_accuracy" and r["lint_verdict"] == "PASS"


def test_text_data_refusals_name_the_file_or_flag(tmp_path: Path) -> None:
    from qdq.pipeline.data import resolve_data

    tok = _tokenizer(tmp_path / "tok")
    data = _sentences(tmp_path / "plain.txt", 8, None)
    bert = transformers.BertModel(_config())
    with pytest.raises(ValueError, match="give --tokenizer DIR"):
        resolve_data(str(data))
    with pytest.raises(FileNotFoundError, match="no such folder"):
        resolve_data(str(data), options=DataOptions(tokenizer=str(tmp_path / "none")))
    with pytest.raises(ValueError, match="--max-length must be an int >= 2"):
        resolve_data(str(data), options=DataOptions(tokenizer=str(tok), max_length=1))
    mixed = tmp_path / "mixed.tsv"
    mixed.write_text("1\tgood film\ngood plot\n")
    with pytest.raises(ValueError, match="label every line or none"):
        resolve_data(str(mixed), options=DataOptions(tokenizer=str(tok)))
    np.save(tmp_path / "x.npy", np.zeros((4, 3), np.float32))
    with pytest.raises(ValueError, match="--tokenizer is for text files"):
        resolve_data(str(tmp_path / "x.npy"), options=DataOptions(tokenizer=str(tok)))
    # unlabelled lines: inputs only; indices as labels
    plain = resolve_data(
        str(data), options=DataOptions(tokenizer=str(tok), max_length=8), model=bert
    )
    assert plain.labels is None and isinstance(plain.calibration, dict)
    assert plain.calibration["input_ids"].shape[1] == 8
    indexed = _sentences(tmp_path / "idx.tsv", 8, "indices")
    labelled = resolve_data(str(indexed), options=DataOptions(tokenizer=str(tok)), model=bert)
    assert labelled.labels is not None and "as class indices" in labelled.split


# ------------------------------------------------------------------------------------ families
#: (row of tests/models/real.py, exporter): each family once, the exporters alternating
FAMILIES = [
    ("bert_tiny", "torchscript"),
    ("distilbert_tiny", "dynamo"),
    ("roberta_tiny", "torchscript"),
    ("albert_tiny", "dynamo"),
    ("deberta_v2_tiny", "torchscript"),
    ("electra_tiny", "dynamo"),
    ("bert_tokens_tiny", "dynamo"),
    ("meanpool_tiny", "torchscript"),
]


def _batches(vocab: int, length: int, n: int = 6, seed: int = 0) -> list[dict]:
    """Tokenizer-style batches of 8 rows: random ids, a padded tail per row."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        b_ids = torch.randint(5, vocab, (8, length), generator=gen)
        b_mask = torch.ones_like(b_ids)
        for row, used in enumerate(torch.randint(4, length + 1, (8,), generator=gen)):
            b_mask[row, used:] = 0
        out.append({"input_ids": b_ids * b_mask, "attention_mask": b_mask})
    return out


@pytest.mark.parametrize(("row", "exporter"), FAMILIES, ids=[f"{r}-{e}" for r, e in FAMILIES])
def test_family_quantizes_with_a_dynamic_sequence_length(row: str, exporter: str, tmp_path) -> None:
    """Each family through ``qdq.quantize`` on token batches: exported with a dynamic batch *and*
    sequence length (verified on half the length), every GEMM and attention product INT8 but the
    3-class head (P14), and the ONNX runs at another batch and a longer sequence as torch does."""
    from models.real import ARCHS, TOKEN_LENGTH
    from qdq.backends.onnxruntime import run, session

    torch.manual_seed(0)
    rm = ARCHS[row].build()
    vocab = int(rm.model.config.vocab_size) if hasattr(rm.model, "config") else 500
    data = _batches(vocab, TOKEN_LENGTH)
    result = quantize(rm.model, data, out=tmp_path / row, exporter=exporter,
                      calib="max", ptq="none", show_progress=False)  # fmt: skip
    r = result.report
    assert r["export"]["exporter"] == exporter
    dims = r["export"]["dynamic_dims"]
    assert set(dims) <= {"input", "input1"} and all(d == {"1": "sequence"} for d in dims.values())
    assert "input" in dims
    assert r["lint"]["int8_weighted_layers"] >= r["lint"]["weighted_layers"] - 1
    assert {s["rule"] for s in r["skipped_layers"]} <= {"P14"}
    placement = {f["rule"] for f in r["lint_findings"] if f["severity"] == "WARN"}
    assert placement <= ({"P04"} if row.startswith("deberta") else set()), placement
    assert r["int8"]["cosine_mean"] > 0.99
    # batch 3, 24 tokens (the export saw 16): ONNX Runtime against torch fake-quant
    longer = _batches(vocab, 24, n=1, seed=7)[0]
    args = (longer["input_ids"][:3], longer["attention_mask"][:3])
    got = run(session(result.onnx_path), list(args))[0]
    with torch.no_grad():
        out = result.prepared(*args)
    want = next(iter(out.values())) if isinstance(out, dict) else out[0]
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-3, atol=1e-3)


def test_token_classifier_is_scored_per_token_with_padding_ignored(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = transformers.BertForTokenClassification(_config(num_labels=3)).eval()
    rng = np.random.default_rng(0)
    path = _tokens(tmp_path / "tokens.npz", labels=False)
    arrays = dict(np.load(path))
    labels = rng.integers(0, 3, arrays["input_ids"].shape)
    labels[arrays["attention_mask"] == 0] = -100  # padding is not scored
    np.savez(path, **arrays, labels=labels)
    r = _run(model, path, tmp_path / "tok")
    assert r["metric_name"] == "token_accuracy" and r["headline"]["source"] == "labels"
    assert "-100 ignored" in r["headline"]["text"]
    # random labels: FP32 scores about a third; INT8 keeps its token predictions
    assert 0.0 < r["fp32_metric"] < 1.0 and abs(r["int8_metric"] - r["fp32_metric"]) < 0.1
    assert r["outputs"][0]["shape"] == [16, 3] and r["lint_verdict"] == "PASS"
    bad = dict(arrays, labels=np.where(labels == -100, -5, labels))
    np.savez(tmp_path / "bad.npz", **bad)
    with pytest.raises(ValueError, match=r"negative labels \(-5\)"):
        _run(model, tmp_path / "bad.npz", tmp_path / "bad")


def test_eager_and_sdpa_attention_get_the_same_placement(tmp_path: Path) -> None:
    """qdq records SDPA as its component operations: eager and SDPA BERT get the same plan and
    the same INT8 attention products, and both export with TorchScript."""
    torch.manual_seed(0)
    ids = torch.randint(5, 500, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    counts = {}
    for attn in ("eager", "sdpa"):
        torch.manual_seed(0)
        model = transformers.BertForSequenceClassification._from_config(
            _config(num_labels=3), attn_implementation=attn
        ).eval()
        prepared = qdq.prepare(model, (ids, mask))
        plan = qdq.plan_of(prepared)
        counts[attn] = (
            plan.counts()["quantize"],
            sorted(p.consumer for p in plan.points if p.rule == "P16" and p.quantized) != [],
        )
        qdq.calibrate(prepared, [(ids, mask)], show_progress=False)
        out = qdq.export_onnx(prepared, (ids, mask), tmp_path / f"{attn}.onnx",
                              exporter="torchscript")  # fmt: skip
        report = qdq.lint.lint(out.path)
        assert (
            report.verdict == "PASS"
            and len(
                [
                    ly
                    for ly in report.layers
                    if ly.kind == "attention" and ly.input_precision == "int8"
                ]
            )
            == 2
        )
    assert counts["eager"] == counts["sdpa"] and counts["eager"][1]


def test_sensitivity_ranks_the_units_of_an_encoder_on_token_data() -> None:
    """Where INT8 costs accuracy: every unit scored one-off on token batches (QKV inputs, the
    FFN input after GELU, the attention products), worst first."""
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(_config(num_labels=3)).eval()
    ids = torch.randint(5, 500, (8, 16))
    mask = torch.ones_like(ids)
    prepared = qdq.prepare(model, (ids[:2], mask[:2]))
    qdq.calibrate(prepared, [(ids, mask)], show_progress=False)
    result = qdq.sensitivity(prepared, [(ids, mask)], show_progress=False)
    names = [row.name for row in result.rows]
    ops = {op for row in result.rows for op in row.ops}
    assert {"linear", "matmul"} <= ops, ops  # GEMM inputs and the attention products
    assert any("intermediate.dense:input" in n for n in names)  # after GELU
    damages = [row.damage for row in result.rows]
    assert damages == sorted(damages, reverse=True) and damages[0] > 0
