"""Fine-tuning heads: BERT "with just one additional output layer", and the `trainer.Task` that trains it.

The head modules live with their family (models/bert/heads.py `BertForFinetuning`, models/modernbert/heads.py
`ModernBertForFinetuning`); `from_config` picks the family's; the task's targets, loss and accuracy sums are
its task kind's (finetuning/tasks/). BERT's is `BertModel` (the pre-trained body, under `bert/`, the same
parameters as pre-training) plus one dense layer named as in Hugging Face's `BertFor*` classes, so that
models/bert/hf.py exports it as
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

from bertjax.models import attention as attention_lib
from bertjax.training import metrics as metrics_lib
from bertjax import models as models_lib
from bertjax.models.layers import DTYPES
from bertjax.finetuning import tasks as tasks_lib
from bertjax.training import trainer as trainer_lib
from bertjax.data.pretraining import pipeline as pipeline_lib

Array = jax.Array


def model_for(architecture: Any, task: str, num_labels: int, **compute: Any) -> nn.Module:
    """The fine-tuning module of `architecture`'s family (BertForFinetuning, ModernBertForFinetuning) with the
    head config.task supplies (none: the encoder alone), in the loop layout unless `compute` says otherwise
    (dtype, scan_layers, remat_policy, attention, packed, window_block, ...)."""
    family = models_lib.of(architecture)
    head = tasks_lib.get(task).head(num_labels)
    if head is not None and head.hf_class not in family.heads.HEADS:
        raise ValueError(
            f"config.task={task!r} has no {family.name} head ({family.name} builds "
            f"{', '.join(family.heads.HEADS)}); fine-tune a BERT model for it."
        )
    return family.heads.finetuning_model(architecture, head, **compute)


def from_config(
    cfg: Any, architecture: Any, task: str, num_labels: int, platform: Optional[str] = None, packed: bool = False
) -> nn.Module:
    """`config.model` (how to compute: dtype, scan, remat, attention) around `architecture` (what the
    weights are: the init_from checkpoint's)."""
    platform = platform or jax.default_backend()
    implementation = attention_lib.choose(cfg.attention, architecture.attention_probs_dropout_prob, platform)
    return model_for(
        architecture,
        task,
        num_labels,
        dtype=DTYPES[cfg.dtype],
        scan_layers=cfg.layer_scan(platform),
        scan_unroll=cfg.scan_unroll,
        remat_policy=cfg.remat_policy,
        attention=implementation,
        packed=packed,
        window_block=cfg.window_block,
        recompute_activation=cfg.activation_recompute(platform),
    )


# --- Batches -----------------------------------------------------------------------------------------


def batch_shapes(
    task: str, regression: bool, batch_size: int, seq_len: int, slots: int = 0
) -> dict[str, tuple[tuple[int, ...], Any]]:
    """Name → (shape, dtype) of a fine-tuning batch: the inputs, the task's targets, `example_weight`
    (0 for the rows that pad the last eval batch). `slots` > 0: packed rows of up to that many examples
    (finetuning/example_packing.py), with their positions and [CLS] slots, and a label per slot."""
    row, tokens = (batch_size,), (batch_size, seq_len)
    out = {name: (tokens, np.int32) for name in ("input_ids", "segment_ids", "input_mask")}
    if slots:
        out.update(
            position_ids=(tokens, np.int32),
            cls_positions=((batch_size, slots), np.int32),
            cls_weights=((batch_size, slots), np.float32),
        )
    out.update(tasks_lib.get(task).targets(regression, batch_size, seq_len, slots))
    out[pipeline_lib.EXAMPLE_WEIGHT] = (row, np.float32)
    return out


# --- Losses and metrics as (sum, count) pairs -----------------------------------------------------------


def packed_inputs(batch: trainer_lib.Batch) -> dict:
    """The keyword arguments a packed batch adds to `apply`; {} for padded rows."""
    if "cls_positions" not in batch:
        return {}
    return {"position_ids": batch["position_ids"], "cls_positions": batch["cls_positions"]}


def _example_weights(batch: trainer_lib.Batch) -> Array:
    """Each example's weight: per row ([batch]), or packed per [CLS] slot ([batch, k])."""
    weight = batch[pipeline_lib.EXAMPLE_WEIGHT]
    return batch["cls_weights"] * weight[:, None] if "cls_weights" in batch else weight


def _sums(
    model: nn.Module, name: str, regression: bool, params: Any, batch: trainer_lib.Batch, rng: Optional[Array]
) -> metrics_lib.Metrics:
    """The task's weighted loss and accuracy sums of one batch (dropout on when rng is given)."""
    logits = model.apply(
        {"params": params},
        input_ids=batch["input_ids"],
        segment_ids=batch["segment_ids"],
        input_mask=batch["input_mask"],
        deterministic=rng is None,
        rngs=None if rng is None else {"dropout": rng},
        **packed_inputs(batch),
    )
    weight = batch[pipeline_lib.EXAMPLE_WEIGHT]
    examples = _example_weights(batch)
    rows = jnp.sum(examples)
    sums = tasks_lib.get(name).sums(logits, batch, regression, examples, weight)
    return dict(sums, **trainer_lib.row_counts(batch, rows if "cls_weights" in batch else None))


def _denominator(task: str, batch: trainer_lib.Batch) -> Array:
    return tasks_lib.get(task).denominator(batch, _example_weights(batch), batch[pipeline_lib.EXAMPLE_WEIGHT])


def _loss(sums: metrics_lib.Metrics, denominator: Array) -> Array:
    total = sums["mse"][0] if "mse" in sums else sums["cross_entropy"][0]
    return total / jnp.maximum(denominator, 1.0)


def _predict(model: nn.Module, params: Any, batch: trainer_lib.Batch) -> dict[str, Array]:
    return {
        "logits": model.apply(
            {"params": params},
            input_ids=batch["input_ids"],
            segment_ids=batch["segment_ids"],
            input_mask=batch["input_mask"],
            **packed_inputs(batch),
        )
    }


def task(
    model: nn.Module, name: str, regression: bool, seq_len: int, packed_rows: int = 0, slots: int = 0
) -> trainer_lib.Task:
    """The `trainer.Task` that fine-tunes `model` for config.task `name` on batches of `batch_shapes`: padded rows,
    one example each, or (`packed_rows` > 0) that many packed rows of up to `slots` examples for every global
    batch."""

    def shapes(global_batch: int) -> dict:
        return batch_shapes(name, regression, packed_rows or global_batch, seq_len, slots)

    return trainer_lib.Task(
        model=model,
        forward_sums=functools.partial(_sums, model, name, regression),
        loss_denominators=functools.partial(_denominator, name),
        loss=_loss,
        batch_shapes=shapes,
        seq_len=seq_len,
        flops_per_row=metrics_lib.flops_per_sequence(model.config, seq_len, num_predictions=0),
        predict=functools.partial(_predict, model),
    )


def with_pretrained_body(params: Any, pretrained: Any) -> Any:
    """A head model's fresh `params` with the parts a pre-trained model gives it (`pretrained.load(...,
    encoder_only=True)`: BERT's `bert/`; ModernBERT's `model/` and its prediction head, as transformers loads
    them); the new output layer keeps its initialisation."""
    return dict(params, **pretrained)
