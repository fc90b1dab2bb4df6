"""BERT's fine-tuning heads (finetuning/heads.py trains them; bert/hf.py exports them as BertFor<Task>): the
pre-trained body (`BertModel`, under `bert/`) and one output layer named as in transformers' classes."""

from __future__ import annotations

from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.models.bert.config import BertConfig
from bertjax.models.bert.model import BertModel, compute_fields
from bertjax.models.head import Head
from bertjax.models.layers import Dropout

Array = jax.Array

# transformers' BertFor<...> classes: BERT builds every head a task can ask for.
HEADS = ("SequenceClassification", "TokenClassification", "QuestionAnswering")


def _head(config: BertConfig, features: int, dtype: Any, name: str) -> nn.Dense:
    init = nn.with_logical_partitioning(nn.initializers.truncated_normal(config.initializer_range), ("embed", None))
    return nn.Dense(
        features,
        dtype=dtype,
        kernel_init=init,
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), (None,)),
        name=name,
    )


class BertForFinetuning(nn.Module):
    """The pre-trained body and the `head` a task asks for; returns float32 logits: [batch, outputs] (a pooled
    head) or [batch, length, outputs] (a tokens head). Without a head, the body's hidden states (an embedder)."""

    config: BertConfig
    head: Optional[Head]
    dtype: Any = jnp.float32
    scan_layers: bool = False
    remat_policy: str = "none"
    attention: str = "xla"
    packed: bool = False  # rows hold several examples (finetuning/example_packing.py): input_mask numbers them 1..k
    recompute_activation: bool = False  # the GELU's backward recomputes it (layers.DenseActivation)
    scan_unroll: int = 0  # scanned layers per loop iteration, 0 all (BertEncoder's)

    def setup(self):
        cfg = self.config
        self.bert = BertModel(cfg, **compute_fields(self))
        self.dropout = Dropout(cfg.hidden_dropout_prob)
        if self.head is None:  # an embedder (contrastive retrieval): the body's hidden states, no output layer
            return
        self.output_layer = _head(cfg, self.head.outputs, self.dtype, self.head.name)

    def __call__(
        self,
        input_ids: Array,
        segment_ids: Array,
        input_mask: Array,
        deterministic: bool = True,
        position_ids: Optional[Array] = None,
        cls_positions: Optional[Array] = None,
    ) -> Array:
        """Packed rows pass each token's position within its example (`position_ids`) and each example's
        [CLS] (`cls_positions` [batch, k]): a pooled head then gives [batch, k, outputs]. Without a head the last
        layer's hidden states [batch, length, hidden], float32."""
        # A pooled head reads only [CLS]: the last layer computes those rows alone.
        sequence, pooled = self.bert(
            input_ids,
            segment_ids,
            input_mask,
            deterministic,
            position_ids=position_ids,
            cls_positions=cls_positions,
            pooled_only=self.head is not None and self.head.reads == "pooled",
        )
        if self.head is None:
            return sequence.astype(jnp.float32)
        hidden = pooled if self.head.reads == "pooled" else sequence
        if self.head.dropout:
            hidden = self.dropout(hidden, deterministic=deterministic)
        return self.output_layer(hidden).astype(jnp.float32)

    def init_head(self, hidden: Array) -> Array:
        """The output layer alone: `init` with this method creates its params and no encoder's, with the
        values a full init gives it (Flax derives each submodule's key from its name); the body comes from
        init_from, and a full init of a BERT-Base body costs seconds on a CPU."""
        return self.output_layer(hidden)

    def fresh_head(self, rng: Array) -> dict:
        """Unboxed initial params of the output layer (`init_head`), on the host; none for an embedder."""
        if self.head is None:
            return {}
        hidden = jnp.zeros((1, self.config.hidden_size), jnp.float32)
        return jax.device_get(nn.meta.unbox(self.init(rng, hidden, method=BertForFinetuning.init_head)["params"]))


def finetuning_model(
    architecture: BertConfig, head: Optional[Head], window_block: int = -1, **compute: Any
) -> BertForFinetuning:
    del window_block  # ModernBERT's sliding-window layers; BERT attends globally
    return BertForFinetuning(architecture, head, **compute)
