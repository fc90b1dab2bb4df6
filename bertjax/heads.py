"""Fine-tuning heads: BERT "with just one additional output layer", and the `trainer.Task` that trains it.

Each head is `BertModel` (the pre-trained body, under `bert/`, the same parameters as pre-training)
plus one dense layer named as in Hugging Face's `BertFor*` classes, so that `hf.py` exports it as
`BertForSequenceClassification` / `BertForTokenClassification` / `BertForQuestionAnswering`:
  sequence_classification  dropout + `classifier` on the pooled [CLS] (one output and MSE for regression)
  token_classification     dropout + `classifier` on every token; only a word's first piece is scored
  question_answering       `qa_outputs` (start, end) on every token; the loss is the mean of the two
Logits and losses are float32 whatever the compute dtype.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax import attention as attention_lib
from bertjax import metrics as metrics_lib
from bertjax import model as model_lib
from bertjax import trainer as trainer_lib
from bertjax.data import pipeline as pipeline_lib

TASKS = ("sequence_classification", "token_classification", "question_answering")
Array = jax.Array


def _head(config: model_lib.BertConfig, features: int, dtype: Any, name: str) -> nn.Dense:
    init = nn.with_logical_partitioning(nn.initializers.truncated_normal(config.initializer_range), ("embed", None))
    return nn.Dense(features, dtype=dtype, kernel_init=init,
                    bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), (None,)), name=name)


class BertForFinetuning(nn.Module):
    """The pre-trained body and one output layer for `task`; returns float32 logits: [batch, num_labels]
    (sequence_classification), [batch, length, num_labels] (token_classification), or
    [batch, length, 2] (question_answering: start, end)."""

    config: model_lib.BertConfig
    task: str
    num_labels: int
    dtype: Any = jnp.float32
    scan_layers: bool = False
    remat_policy: str = "none"
    attention: str = "xla"

    def setup(self):
        cfg = self.config
        self.bert = model_lib.BertModel(cfg, self.dtype, self.scan_layers, self.remat_policy, self.attention)
        self.dropout = model_lib.Dropout(cfg.hidden_dropout_prob)
        if self.task == "question_answering":
            self.qa_outputs = _head(cfg, 2, self.dtype, "qa_outputs")
        else:
            self.classifier = _head(cfg, self.num_labels, self.dtype, "classifier")

    def __call__(self, input_ids: Array, segment_ids: Array, input_mask: Array, deterministic: bool = True) -> Array:
        # Sequence classification reads only [CLS]: its last layer computes that row alone.
        sequence, pooled = self.bert(input_ids, segment_ids, input_mask, deterministic,
                                     pooled_only=self.task == "sequence_classification")
        if self.task == "question_answering":  # no dropout before qa_outputs, as BERT's run_squad.py
            return self.qa_outputs(sequence).astype(jnp.float32)
        hidden = pooled if self.task == "sequence_classification" else sequence
        return self.classifier(self.dropout(hidden, deterministic=deterministic)).astype(jnp.float32)


def from_config(cfg: Any, architecture: model_lib.BertConfig, task: str, num_labels: int,
                platform: Optional[str] = None) -> BertForFinetuning:
    """`config.model` (how to compute: dtype, scan, remat, attention) around `architecture` (what the
    weights are: the init_from checkpoint's)."""
    implementation = attention_lib.choose(cfg.attention, architecture.attention_probs_dropout_prob,
                                          platform or jax.default_backend())
    return BertForFinetuning(architecture, task, num_labels, dtype=model_lib.DTYPES[cfg.dtype],
                             scan_layers=cfg.scan_layers, remat_policy=cfg.remat_policy, attention=implementation)


# --- Batches -----------------------------------------------------------------------------------------

def batch_shapes(task: str, regression: bool, batch_size: int, seq_len: int) -> dict[str, tuple[tuple[int, ...], Any]]:
    """Name → (shape, dtype) of a fine-tuning batch: the inputs, the task's targets, `example_weight`
    (0 for the rows that pad the last eval batch)."""
    row, tokens = (batch_size,), (batch_size, seq_len)
    out = {name: (tokens, np.int32) for name in ("input_ids", "segment_ids", "input_mask")}
    if task == "sequence_classification":
        out["label"] = (row, np.float32 if regression else np.int32)
    elif task == "token_classification":
        out.update(label_ids=(tokens, np.int32), label_weights=(tokens, np.float32))
    else:
        out.update(start_positions=(row, np.int32), end_positions=(row, np.int32))
    out[pipeline_lib.EXAMPLE_WEIGHT] = (row, np.float32)
    return out


# --- Losses and metrics as (sum, count) pairs -----------------------------------------------------------

def _cross_entropy(logits: Array, labels: Array) -> Array:
    return -jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), labels[..., None], axis=-1)[..., 0]


def _correct(logits: Array, labels: Array) -> Array:
    return (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)


def _sums(model: BertForFinetuning, regression: bool, params: Any, batch: trainer_lib.Batch,
          rng: Optional[Array]) -> metrics_lib.Metrics:
    """The task's weighted loss and accuracy sums of one batch (dropout on when rng is given)."""
    logits = model.apply({"params": params}, batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                         deterministic=rng is None, rngs=None if rng is None else {"dropout": rng})
    weight = batch[pipeline_lib.EXAMPLE_WEIGHT]
    rows = jnp.sum(weight)
    if model.task == "sequence_classification" and regression:
        error = (logits[:, 0] - batch["label"]) ** 2
        sums = {"mse": (jnp.sum(error * weight), rows)}
    elif model.task == "sequence_classification":
        sums = {"cross_entropy": (jnp.sum(_cross_entropy(logits, batch["label"]) * weight), rows),
                "accuracy": (jnp.sum(_correct(logits, batch["label"]) * weight), rows)}
    elif model.task == "token_classification":
        scored = batch["label_weights"] * weight[:, None]
        count = jnp.sum(scored)
        sums = {"cross_entropy": (jnp.sum(_cross_entropy(logits, batch["label_ids"]) * scored), count),
                "accuracy": (jnp.sum(_correct(logits, batch["label_ids"]) * scored), count)}
    else:
        start, end = logits[..., 0], logits[..., 1]
        both = _cross_entropy(start, batch["start_positions"]) + _cross_entropy(end, batch["end_positions"])
        sums = {"cross_entropy": (jnp.sum(0.5 * both * weight), rows),
                "span_accuracy": (jnp.sum(_correct(start, batch["start_positions"]) *
                                          _correct(end, batch["end_positions"]) * weight), rows)}
    return dict(sums, **trainer_lib.row_counts(batch))


def _denominator(task: str, batch: trainer_lib.Batch) -> Array:
    weight = batch[pipeline_lib.EXAMPLE_WEIGHT]
    if task == "token_classification":
        return jnp.sum(batch["label_weights"] * weight[:, None])
    return jnp.sum(weight)


def _loss(sums: metrics_lib.Metrics, denominator: Array) -> Array:
    total = sums["mse"][0] if "mse" in sums else sums["cross_entropy"][0]
    return total / jnp.maximum(denominator, 1.0)


def _predict(model: BertForFinetuning, params: Any, batch: trainer_lib.Batch) -> dict[str, Array]:
    return {"logits": model.apply({"params": params}, batch["input_ids"], batch["segment_ids"], batch["input_mask"])}


def task(model: BertForFinetuning, regression: bool, seq_len: int) -> trainer_lib.Task:
    """The `trainer.Task` that fine-tunes `model` on batches of `batch_shapes`."""
    return trainer_lib.Task(
        model=model, forward_sums=functools.partial(_sums, model, regression),
        loss_denominators=functools.partial(_denominator, model.task), loss=_loss,
        batch_shapes=functools.partial(batch_shapes, model.task, regression, seq_len=seq_len),
        seq_len=seq_len, flops_per_row=metrics_lib.flops_per_sequence(model.config, seq_len, num_predictions=0),
        predict=functools.partial(_predict, model))


def with_pretrained_body(params: Any, pretrained: Any) -> Any:
    """A head model's fresh `params` with the body (`bert/…`) replaced by a pre-trained model's; the pre-
    training heads (MLM, NSP) are left behind, the new output layer keeps its initialisation."""
    return dict(params, bert=pretrained["bert"])
