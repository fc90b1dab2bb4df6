"""The contract every fine-tuning task kind implements (one module a kind, registered in __init__.py).

The arguments: `data` is config.data (FinetuneDataConfig), `labels` the run's LabelMap (None for regression
and question answering), `split` the job's Split (examples, rows, what maps rows back to examples), `logits`
the model's output for every example in input order (one padded row each), `batch` a batch of `targets`' keys
plus the inputs, `examples` each example's weight (per row, or per [CLS] slot of a packed row) and `weight` each
row's. No JAX at import: `sums` and `denominator` run while a step is traced.
"""

from __future__ import annotations

import abc
from typing import Any, Optional

import numpy as np

from bertjax.config.convert import bad_value
from bertjax.runtime import files
from bertjax.finetuning import readers
from bertjax.models.head import Head


class TaskKind(abc.ABC):
    name: str = ""  # config.task
    per_token: bool = False  # logits and targets for every token (a packed batch unpacks them per token)
    packs: bool = True  # config.data.packing puts several examples in a row
    embeds: bool = False  # trains an embedder (finetuning/retrieval_task.py): its own batch, loss and eval

    def validate(self, data: Any) -> None:
        """Refuses, in one sentence naming the field, a config.data setting that does not apply to this task."""
        if data.regression:
            raise bad_value("config.data.regression", True, f"is for sequence_classification, not {self.name}.")

    @abc.abstractmethod
    def head(self, num_labels: int) -> Optional[Head]:
        """The output layer this task puts on the encoder (what it reads, its outputs, transformers' class), which
        every family builds without knowing the task; None: the encoder alone (an embedder)."""

    @abc.abstractmethod
    def primary_metric(self, regression: bool) -> str:
        """The held-out score a sweep ranks runs by (GLUE's for the task)."""

    @abc.abstractmethod
    def read_examples(self, pattern: str, data: Any, training: bool) -> list:
        """The labelled examples of a file, glob or tfds:NAME:SPLIT."""

    @abc.abstractmethod
    def read_inputs(self, path: str, data: Any, labels: Optional[readers.LabelMap]) -> list:
        """`python -m bertjax.predict`'s inputs: the training format without labels (or .txt lines)."""

    @abc.abstractmethod
    def label_map(self, train_examples: list, data: Any) -> Optional[readers.LabelMap]:
        """The label order, from the training examples (None: no label set)."""

    @abc.abstractmethod
    def rows(
        self, examples: list, tokenizer: Any, data: Any, labels: Optional[readers.LabelMap], training: bool
    ) -> tuple[dict[str, np.ndarray], Any, int]:
        """(arrays of rows, what maps rows back to examples, how many examples were truncated to fit)."""

    @abc.abstractmethod
    def targets(self, regression: bool, rows: int, seq_len: int, slots: int) -> dict[str, tuple[tuple, Any]]:
        """Name → (shape, dtype) of the task's targets in a batch of `rows` (`slots` > 0: packed rows)."""

    @abc.abstractmethod
    def sums(self, logits: Any, batch: dict, regression: bool, examples: Any, weight: Any) -> dict:
        """The weighted loss and accuracy (sum, count) pairs of one batch (`mse` or `cross_entropy` first)."""

    def denominator(self, batch: dict, examples: Any, weight: Any) -> Any:
        """What the loss divides by: the weight of the examples scored."""
        import jax.numpy as jnp

        return jnp.sum(examples)

    @abc.abstractmethod
    def predictions(self, split: Any, logits: np.ndarray, labels: Optional[readers.LabelMap], data: Any) -> list[dict]:
        """One prediction per example."""

    @abc.abstractmethod
    def scores(
        self, split: Any, logits: np.ndarray, labels: Optional[readers.LabelMap], data: Any, predictions: list[dict]
    ) -> tuple[dict[str, float], list]:
        """(held-out scores, each example's truth as its prediction record shows it)."""

    def prediction_record(self, example: Any, prediction: dict) -> dict:
        """A line of predict's output: the prediction, with what a reader needs to match it to its input."""
        return prediction


def cross_entropy(logits: Any, labels: Any) -> Any:
    import jax

    import jax.numpy as jnp

    return -jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), labels[..., None], axis=-1)[..., 0]


def correct(logits: Any, labels: Any) -> Any:
    import jax.numpy as jnp

    return (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)


def text_lines(path: str) -> list[tuple[int, str]]:
    """A .txt file's non-empty lines, numbered from 1: predict's plain-text inputs (local or in a bucket)."""
    lines = [(i + 1, line.strip()) for i, line in enumerate(files.read_text(path).splitlines()) if line.strip()]
    if not lines:
        raise ValueError(f"{path} holds no text; write one input per line.")
    return lines
