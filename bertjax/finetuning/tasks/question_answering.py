"""Extractive question answering (SQuAD v1.1 / v2.0): strided windows of long contexts, one a row; the best
span cut from the original context; the official script's EM and F1."""

from __future__ import annotations

import logging
from typing import Any, Optional

import numpy as np

from bertjax.config.convert import bad_value
from bertjax.finetuning import readers, scores, squad
from bertjax.models.head import Head
from bertjax.finetuning.tasks.base import TaskKind, correct, cross_entropy

log = logging.getLogger(__name__)


class QuestionAnswering(TaskKind):
    name = "question_answering"
    packs = False  # one window a row: a context's windows are scored together

    def validate(self, data: Any) -> None:
        super().validate(data)
        room = data.max_seq_length - data.max_query_length - 3
        if not 0 < data.doc_stride < room:
            raise bad_value(
                "config.data.doc_stride",
                data.doc_stride,
                f"must be > 0 and leave room for the question: below max_seq_length - max_query_length - 3 = {room}.",
            )

    def head(self, num_labels: int) -> Head:
        del num_labels  # a span's start and end, whatever the labels
        return Head("tokens", 2, "QuestionAnswering", name="qa_outputs", dropout=False)  # as BERT's run_squad.py

    def primary_metric(self, regression: bool) -> str:
        return "f1"

    def read_examples(self, pattern: str, data: Any, training: bool) -> list:
        # Training leaves out (and counts) questions whose answer offsets do not match their text.
        examples, stats = squad.read_squad(pattern, require_answers=training)
        log.info("data: %s: %s", pattern, stats)
        return examples

    def read_inputs(self, path: str, data: Any, labels: Optional[readers.LabelMap]) -> list:
        return squad.read_squad(path, require_answers=False)[0]

    def label_map(self, train_examples: list, data: Any) -> Optional[readers.LabelMap]:
        return None

    def rows(self, examples, tokenizer, data, labels, training):
        arrays, features = squad.qa_features(
            examples, tokenizer, data.max_seq_length, data.doc_stride, data.max_query_length, training=training
        )
        return arrays, features, 0

    def targets(self, regression: bool, rows: int, seq_len: int, slots: int) -> dict:
        return {"start_positions": ((rows,), np.int32), "end_positions": ((rows,), np.int32)}

    def sums(self, logits, batch, regression, examples, weight) -> dict:
        import jax.numpy as jnp

        start, end = logits[..., 0], logits[..., 1]
        both = cross_entropy(start, batch["start_positions"]) + cross_entropy(end, batch["end_positions"])
        rows = jnp.sum(examples)
        return {
            "cross_entropy": (jnp.sum(0.5 * both * weight), rows),
            "span_accuracy": (
                jnp.sum(correct(start, batch["start_positions"]) * correct(end, batch["end_positions"]) * weight),
                rows,
            ),
        }

    def predictions(self, split, logits, labels, data) -> list[dict]:
        answers = squad.qa_predictions(
            split.examples,
            split.features,
            logits[..., 0],
            logits[..., 1],
            n_best_size=data.n_best_size,
            max_answer_length=data.max_answer_length,
            version_2=data.version_2_with_negative,
            null_score_diff_threshold=data.null_score_diff_threshold,
        )
        return [{"id": e.qid, "question": e.question, "prediction": answers.get(e.qid, "")} for e in split.examples]

    def scores(self, split, logits, labels, data, predictions):
        gold = [[text for text, _ in e.answers] or [""] for e in split.examples]
        result = scores.squad_scores(
            {p["id"]: p["prediction"] for p in predictions}, {e.qid: g for e, g in zip(split.examples, gold)}
        )
        return result, gold


KIND = QuestionAnswering()
