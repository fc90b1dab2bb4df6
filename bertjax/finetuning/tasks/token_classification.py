"""Token classification (NER: CoNLL files): a tag per word, scored on each word's first piece; entity F1."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from bertjax.finetuning import readers, scores
from bertjax.models.head import Head
from bertjax.finetuning.tasks.base import TaskKind, correct, cross_entropy, text_lines


class TokenClassification(TaskKind):
    name = "token_classification"
    per_token = True

    def head(self, num_labels: int) -> Head:
        return Head("tokens", num_labels, "TokenClassification")

    def primary_metric(self, regression: bool) -> str:
        return "f1"

    def read_examples(self, pattern: str, data: Any, training: bool) -> list:
        return readers.read_conll(pattern)

    def read_inputs(self, path: str, data: Any, labels: Optional[readers.LabelMap]) -> list:
        if path.endswith(".txt"):  # whitespace-tokenised words; placeholder tags, never read
            return [
                readers.TokenExample(text.split(), [labels.labels[0]] * len(text.split()), readers.Source(path, n))
                for n, text in text_lines(path)
            ]
        return readers.read_conll(path)

    def label_map(self, train_examples: list, data: Any) -> Optional[readers.LabelMap]:
        return readers.LabelMap.from_labels(tag for e in train_examples for tag in e.labels)

    def rows(self, examples, tokenizer, data, labels, training):
        return readers.token_features(examples, tokenizer, data.max_seq_length, labels)

    def targets(self, regression: bool, rows: int, seq_len: int, slots: int) -> dict:
        return {"label_ids": ((rows, seq_len), np.int32), "label_weights": ((rows, seq_len), np.float32)}

    def sums(self, logits, batch, regression, examples, weight) -> dict:
        import jax.numpy as jnp

        scored = batch["label_weights"] * weight[:, None]
        count = jnp.sum(scored)
        return {
            "cross_entropy": (jnp.sum(cross_entropy(logits, batch["label_ids"]) * scored), count),
            "accuracy": (jnp.sum(correct(logits, batch["label_ids"]) * scored), count),
        }

    def denominator(self, batch, examples, weight):
        import jax.numpy as jnp

        return jnp.sum(batch["label_weights"] * weight[:, None])

    def predictions(self, split, logits, labels, data) -> list[dict]:
        fallback = "O" if "O" in labels.labels else labels.labels[0]  # for words cut off by truncation
        predicted = logits.argmax(-1)
        out = []
        for row, (example, starts) in enumerate(zip(split.examples, split.features)):
            tags = [labels.labels[predicted[row, i]] if i >= 0 else fallback for i in starts]
            entities = [
                {"type": kind, "start": first, "end": last + 1, "text": " ".join(example.words[first : last + 1])}
                for kind, first, last in scores.entity_chunks(tags)
            ]
            out.append({"words": example.words, "prediction": tags, "entities": entities})
        return out

    def scores(self, split, logits, labels, data, predictions):
        gold = [e.labels for e in split.examples]
        return scores.entity_scores(gold, [p["prediction"] for p in predictions]), gold


KIND = TokenClassification()
