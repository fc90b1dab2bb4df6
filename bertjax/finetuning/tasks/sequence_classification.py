"""Sequence (and sequence-pair) classification — GLUE, sentiment — and regression (STS-B: one float label, MSE)."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from bertjax.finetuning import readers, scores
from bertjax.models.head import Head
from bertjax.finetuning.tasks.base import TaskKind, correct, cross_entropy, text_lines


class SequenceClassification(TaskKind):
    name = "sequence_classification"

    def validate(self, data: Any) -> None:
        pass  # regression is this task's

    def head(self, num_labels: int) -> Head:
        return Head("pooled", num_labels, "SequenceClassification")  # one output for a regression

    def primary_metric(self, regression: bool) -> str:
        return "pearson" if regression else "accuracy"

    def read_examples(self, pattern: str, data: Any, training: bool) -> list:
        return readers.read_text_examples(pattern, regression=data.regression)  # files, or tfds:NAME:SPLIT

    def read_inputs(self, path: str, data: Any, labels: Optional[readers.LabelMap]) -> list:
        if path.endswith(".txt"):  # `a ||| b` for a pair, as google-research/bert's extract_features.py
            lines = text_lines(path)
            pairs = [text.split(" ||| ", 1) + [None] for _, text in lines]
            return [
                readers.TextExample(pair[0], pair[1], None, readers.Source(path, n))
                for (n, _), pair in zip(lines, pairs)
            ]
        return readers.read_text_examples(path, regression=data.regression, require_labels=False)

    def label_map(self, train_examples: list, data: Any) -> Optional[readers.LabelMap]:
        return None if data.regression else readers.LabelMap.from_labels(e.label for e in train_examples)

    def rows(self, examples, tokenizer, data, labels, training):
        arrays, truncated = readers.text_features(examples, tokenizer, data.max_seq_length, labels)
        return arrays, None, truncated

    def targets(self, regression: bool, rows: int, seq_len: int, slots: int) -> dict:
        return {"label": ((rows, slots) if slots else (rows,), np.float32 if regression else np.int32)}

    def sums(self, logits, batch, regression, examples, weight) -> dict:
        import jax.numpy as jnp

        count = jnp.sum(examples)
        if regression:
            return {"mse": (jnp.sum((logits[..., 0] - batch["label"]) ** 2 * examples), count)}
        return {
            "cross_entropy": (jnp.sum(cross_entropy(logits, batch["label"]) * examples), count),
            "accuracy": (jnp.sum(correct(logits, batch["label"]) * examples), count),
        }

    def predictions(self, split, logits, labels, data) -> list[dict]:
        if data.regression:
            return [{"prediction": float(p)} for p in logits[:, 0]]
        probabilities = np.exp(logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True))
        return [
            {"prediction": labels.labels[p], "probability": round(float(probabilities[i, p]), 6)}
            for i, p in enumerate(logits.argmax(-1))
        ]

    def scores(self, split, logits, labels, data, predictions):
        truth = split.arrays["label"]
        if data.regression:
            result = scores.regression_scores(truth, logits[:, 0])
        else:
            log_probs = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
            result = dict(
                scores.classification_scores(truth, logits.argmax(-1), len(labels.labels)),
                cross_entropy=float(-np.mean(log_probs[np.arange(len(truth)), truth])),
            )
        return result, [float(t) if data.regression else labels.labels[t] for t in truth]

    def prediction_record(self, example: Any, prediction: dict) -> dict:
        return {"text": example.text_a, **({"text_b": example.text_b} if example.text_b else {}), **prediction}


KIND = SequenceClassification()
