"""Contrastive retrieval: an encoder fine-tuned into a sentence embedder on (query, positive[, hard negatives])
pairs, with sentence-transformers' MultipleNegativesRankingLoss over the whole global batch (contrastive.py).

Input: JSON Lines, one object a line, `{"query": …, "positive": …}` and optionally `"negatives": [ … ]`. Every row
gives the same number of hard negatives (config.data.hard_negatives: -1 = as many as the first row gives; K = the
first K of each row). A batch row is one pair: the query's tokens ([pairs, max_query_length]) and its documents'
([pairs, 1 + K, max_seq_length]), the positive first; so a short query never pays for a passage's length. Each
document carries a hash of its text: a batch's candidate that is the same text as a query's positive is not counted
as that query's negative (the duplicates sentence-transformers' NoDuplicatesBatchSampler keeps out of a batch).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Optional

import numpy as np

from bertjax.config.convert import bad_value
from bertjax.runtime import files
from bertjax.finetuning import readers
from bertjax.finetuning.tasks.base import TaskKind, text_lines

QUERY_KEYS = ("query_ids", "query_mask")
DOCUMENT_KEYS = ("document_ids", "document_mask", "document_hash")
POOLING_MODES = ("mean", "cls")


class PairExample:
    """A query, its positive, its hard negatives, and where the row was read."""

    __slots__ = ("query", "positive", "negatives", "source")

    def __init__(self, query: str, positive: str, negatives: tuple[str, ...], source: readers.Source):
        self.query, self.positive, self.negatives, self.source = query, positive, negatives, source


def _text(row: dict, key: str, where: str) -> str:
    value = row.get(key)
    if isinstance(value, str) and value.strip():
        return value
    what = f"no {key!r}" if value is None else f"an empty {key!r}" if isinstance(value, str) else f"a non-text {key!r}"
    raise ValueError(
        f'{where}: the row has {what}; write one object a line, {{"query": …, "positive": …}} with optional '
        '"negatives": [ … ].'
    )


def read_pairs(pattern: str, hard_negatives: int = -1, require_positive: bool = True) -> list[PairExample]:
    """The pairs of one JSON Lines file (or a glob of them), each mistake one sentence naming the file and line."""
    paths = files.glob(pattern) if any(c in pattern for c in "*?[") else [pattern]
    if not paths:
        raise FileNotFoundError(f"{pattern} matches no file; name a JSON Lines file of query/positive pairs.")
    examples: list[PairExample] = []
    wanted = hard_negatives
    for path in paths:
        if not files.isfile(path):
            raise FileNotFoundError(f"{path} does not exist; name a JSON Lines file of query/positive pairs.")
        for number, line in enumerate(readers.read_text(path).splitlines(), 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not JSON ({e.msg} at column {e.colno}); write one object a line.") from None
            if not isinstance(row, dict):
                raise ValueError(f'{where}: a JSON {type(row).__name__}, not an object with "query" and "positive".')
            query = _text(row, "query", where)
            positive = _text(row, "positive", where) if require_positive or "positive" in row else ""
            negatives = row.get("negatives", [])
            if not isinstance(negatives, list) or not all(isinstance(n, str) and n.strip() for n in negatives):
                raise ValueError(f'{where}: "negatives" must be a list of non-empty texts.')
            if wanted < 0:
                wanted = len(negatives)  # the first row sets the count
            if len(negatives) < wanted:
                raise ValueError(
                    f"{where}: the row gives {len(negatives)} hard negatives, fewer than the {wanted} "
                    f"{'the first row gives' if hard_negatives < 0 else 'config.data.hard_negatives asks for'}; give "
                    "every row as many, or set config.data.hard_negatives to the fewest a row gives (0: none)."
                )
            examples.append(PairExample(query, positive, tuple(negatives[:wanted]), readers.Source(path, number)))
    if not examples:
        raise ValueError(f'{pattern} holds no pairs; write one {{"query": …, "positive": …}} object a line.')
    return examples


def text_hash(text: str) -> int:
    """A document's identity for the duplicate mask: 31 bits of its sha1 (int32, never the padding's 0)."""
    return int.from_bytes(hashlib.sha1(text.encode("utf-8")).digest()[:4], "little") & 0x7FFFFFFF or 1


def encode_texts(tokenizer: Any, texts: list[str], length: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(ids [n, length], mask [n, length], how many were truncated): each text framed as the tokenizer frames one
    text ([CLS] … [SEP]), cut to fit."""
    frame = tokenizer.frame()
    room = length - frame.single_specials
    ids = np.full((len(texts), length), frame.pad_id, np.int32)
    mask = np.zeros((len(texts), length), np.int32)
    truncated = 0
    for i, pieces in enumerate(tokenizer.encode_batch(texts)):
        truncated += len(pieces) > room
        row = frame.single(pieces[:room])
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    return ids, mask, truncated


class Retrieval(TaskKind):
    name = "retrieval"
    embeds = True  # packed (config.data.packing): every text of a batch shares rows (finetuning/pair_packing.py)

    def validate(self, data: Any) -> None:
        super().validate(data)
        if data.pooling not in POOLING_MODES:
            raise bad_value("config.data.pooling", data.pooling, f"is not one of {list(POOLING_MODES)}.")
        if data.similarity_scale <= 0:
            raise bad_value(
                "config.data.similarity_scale", data.similarity_scale, "must be > 0 (20: temperature 0.05)."
            )
        if data.max_query_length < 3:
            raise bad_value(
                "config.data.max_query_length", data.max_query_length, "must be ≥ 3 ([CLS], a token, [SEP])."
            )

    def head(self, num_labels: int) -> None:
        del num_labels
        return None  # the encoder alone: its pooled states are the embeddings

    def primary_metric(self, regression: bool) -> str:
        return "ndcg_at_10"

    def read_examples(self, pattern: str, data: Any, training: bool) -> list:
        return read_pairs(pattern, data.hard_negatives)

    def read_inputs(self, path: str, data: Any, labels: Optional[readers.LabelMap]) -> list:
        if path.endswith(".txt"):
            return [PairExample(text, "", (), readers.Source(path, n)) for n, text in text_lines(path)]
        return read_pairs(path, 0, require_positive=False)

    def label_map(self, train_examples: list, data: Any) -> Optional[readers.LabelMap]:
        return None

    def rows(self, examples, tokenizer, data, labels, training):
        per_pair = 1 + len(examples[0].negatives)
        query_ids, query_mask, short = encode_texts(tokenizer, [e.query for e in examples], data.max_query_length)
        documents = [text for e in examples for text in (e.positive, *e.negatives)]
        doc_ids, doc_mask, cut = encode_texts(tokenizer, documents, data.max_seq_length)
        shape = (len(examples), per_pair)
        arrays = {
            "query_ids": query_ids,
            "query_mask": query_mask,
            "document_ids": doc_ids.reshape(shape + (-1,)),
            "document_mask": doc_mask.reshape(shape + (-1,)),
            "document_hash": np.array([text_hash(t) for t in documents], np.int32).reshape(shape),
        }
        return arrays, None, short + cut

    def batch_shapes(self, data: Any, rows: int, documents_per_pair: int) -> dict[str, tuple[tuple, Any]]:
        """The whole batch (this task's inputs are not the classification rows' input_ids / input_mask)."""
        query, docs = (rows, data.max_query_length), (rows, documents_per_pair, data.max_seq_length)
        return {
            "query_ids": (query, np.int32),
            "query_mask": (query, np.int32),
            "document_ids": (docs, np.int32),
            "document_mask": (docs, np.int32),
            "document_hash": ((rows, documents_per_pair), np.int32),
            "example_weight": ((rows,), np.float32),
        }

    def targets(self, regression: bool, rows: int, seq_len: int, slots: int) -> dict:
        return {}  # the pairing is the target

    def sums(self, logits, batch, regression, examples, weight) -> dict:
        raise NotImplementedError("retrieval's loss couples the batch: finetuning/retrieval_task.py computes it")

    def predictions(self, split, logits, labels, data) -> list[dict]:
        return []  # scored as a ranking (retrieval_task.evaluate), not example by example

    def scores(self, split, logits, labels, data, predictions):
        return {}, []

    def prediction_record(self, example: Any, prediction: dict) -> dict:
        return {"text": example.query, **prediction}


KIND = Retrieval()
