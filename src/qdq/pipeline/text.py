"""Text data for ``qdq quantize --data FILE.txt --tokenizer DIR [--max-length N]``.

The file holds one sample per line (UTF-8; blank lines skipped), either the text alone or
``label<TAB>text``: every line labelled or none. A label is a class index (``0``, ``1`` ...) or a
class name, which the model's ``config.label2id`` maps when it has one (a Hugging Face
classifier), else the sorted distinct names do (``0`` for the first), as the split note says.

The tokenizer is a local folder (``save_pretrained``'s, read with ``local_files_only``: nothing is
downloaded). Every line is truncated and padded to ``max_length`` tokens (default 128, at most
the tokenizer's ``model_max_length``): one shape for every batch and for the export. Only the
arrays ``forward`` takes are kept (DistilBERT has no ``token_type_ids``), passed by name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from qdq.pipeline.inputs import parameter_names

__all__ = ["DEFAULT_MAX_LENGTH", "token_arrays"]

DEFAULT_MAX_LENGTH = 128


def token_arrays(
    path: Path, tokenizer: str | Path, max_length: int | None, model: nn.Module | None
) -> tuple[dict[str | None, np.ndarray], str]:
    """The named arrays of a text file (``input_ids``, ``attention_mask`` ..., ``labels`` when
    labelled) and a note for the split line.

    Raises:
        ImportError: ``transformers`` is missing (the ``transformers`` extra).
        FileNotFoundError / ValueError: no tokenizer folder, an unreadable one, an empty file,
            labels on some lines only, a bad ``max_length``; each naming the file or folder.
    """
    try:
        from transformers import AutoTokenizer
    except ImportError as err:
        raise ImportError(
            "text data needs the transformers package: pip install 'qdq[transformers]'"
        ) from err
    folder = Path(tokenizer)
    if not folder.is_dir():
        raise FileNotFoundError(f"--tokenizer {folder}: no such folder (a save_pretrained folder)")
    try:
        tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as err:
        raise ValueError(f"--tokenizer {folder}: cannot load a tokenizer from it ({err})") from err
    length = _max_length(max_length, tok)
    texts, names = _lines(path)
    encoded = tok(texts, padding="max_length", truncation=True, max_length=length,
                  return_tensors="np")  # fmt: skip
    params = parameter_names(model) if model is not None else []
    arrays: dict[str | None, np.ndarray] = {
        k: np.asarray(v).astype(np.int64) for k, v in encoded.items() if not params or k in params
    }
    if "input_ids" not in arrays:
        raise ValueError(f"{path}: the model's forward takes no input_ids ({params})")
    truncated = sum(len(ids) > length for ids in tok(texts, truncation=False)["input_ids"])
    note = f"; {len(texts)} lines tokenized by {folder.name} to {length} tokens"
    if truncated:
        note += f" ({truncated} truncated)"
    if names is not None:
        labels, how = _labels(names, model, path)
        arrays["labels"] = labels
        note += f"; labels {how}"
    return arrays, note


def _max_length(max_length: int | None, tok: Any) -> int:
    limit = getattr(tok, "model_max_length", None)
    limit = limit if isinstance(limit, int) and 0 < limit < 1_000_000 else None
    if max_length is None:
        return min(DEFAULT_MAX_LENGTH, limit) if limit else DEFAULT_MAX_LENGTH
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
        raise ValueError(f"--max-length must be an int >= 2, got {max_length!r}")
    if limit is not None and max_length > limit:
        raise ValueError(f"--max-length {max_length} exceeds the tokenizer's limit of {limit}")
    return max_length


def _lines(path: Path) -> tuple[list[str], list[str] | None]:
    """The texts, and the label of each line when every line has one (``label<TAB>text``)."""
    rows = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not rows:
        raise ValueError(f"{path} holds no text lines")
    tabbed = ["\t" in row for row in rows]
    if not any(tabbed):
        return rows, None
    if not all(tabbed):
        first = tabbed.index(False) + 1
        raise ValueError(
            f"{path}: some lines are label<TAB>text and others are not (line {first} of the "
            "non-blank lines has no tab); label every line or none"
        )
    pairs = [row.split("\t", 1) for row in rows]
    return [text for _, text in pairs], [label.strip() for label, _ in pairs]


def _labels(names: list[str], model: nn.Module | None, path: Path) -> tuple[np.ndarray, str]:
    if all(n.isdigit() for n in names):
        return np.asarray([int(n) for n in names], np.int64), "as class indices"
    config = getattr(model, "config", None)
    label2id = getattr(config, "label2id", None) or {}
    if label2id and all(n in label2id for n in names):
        return np.asarray([int(label2id[n]) for n in names], np.int64), "by config.label2id"
    classes = sorted(set(names))
    unknown = [n for n in classes if label2id and n not in label2id]
    if unknown:
        raise ValueError(
            f"{path}: labels {unknown[:5]} are not in the model's config.label2id "
            f"({sorted(label2id)[:10]})"
        )
    index = {n: i for i, n in enumerate(classes)}
    shown = ", ".join(f"{n}={i}" for n, i in list(index.items())[:10])
    return np.asarray([index[n] for n in names], np.int64), f"by sorted name ({shown})"
