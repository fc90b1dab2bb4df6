"""ModernBERT's fine-tuning heads (finetuning/heads.py trains them; modernbert/hf.py exports them as
transformers' ModernBertFor<Task>): the encoder, its prediction head (as a masked LM's) and a classifier."""

from __future__ import annotations

from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.models import attention as attention_lib
from bertjax.models import layers
from bertjax.models.head import Head
from bertjax.models.modernbert.config import ModernBertConfig
from bertjax.models.modernbert.model import weight_init, init_stds, make_norm, encoder_of, head_dense

Array = jax.Array
Dtype = Any

# The transformers ModernBertFor<...> classes ported here (not yet its QuestionAnswering).
HEADS = ("SequenceClassification", "TokenClassification")


class ModernBertForFinetuning(nn.Module):
    """The encoder with transformers' task head: the prediction head (dense → activation → norm, the MLM
    head's own weights when fine-tuning starts from a masked-LM checkpoint, as transformers loads them), dropout
    and a classifier. A pooled head pools by `config.classifier_pooling`: the first token (cls) or the mean over
    real tokens (mean); a tokens head classifies every token. Without a head, the encoder's states (an embedder).

    Packed rows (heads.py) pass each token's position within its example (`position_ids`) and each example's
    first token (`cls_positions` [batch, k]): a pooled head then gives [batch, k, outputs], each
    example pooled over its own tokens (input_mask numbers them)."""

    config: ModernBertConfig
    head: Optional[Head]
    dtype: Dtype = jnp.float32
    attention: str = "xla"
    packed: bool = False
    remat_policy: str = "none"
    window_block: int = attention_lib.AUTO_BLOCK  # ModernBertModel's
    recompute_activation: bool = False  # ModernBertModel's

    def setup(self):
        cfg = self.config
        std, cut = init_stds(cfg), cfg.initializer_cutoff_factor
        self.model = encoder_of(self)
        if self.head is None:  # an embedder (contrastive retrieval): the encoder's normed hidden states
            return
        self.head_dense = head_dense(cfg, self.dtype)
        self.head_norm = make_norm(cfg, self.dtype, "head_norm")
        self.dropout = layers.Dropout(cfg.classifier_dropout)
        self.classifier = nn.Dense(
            self.head.outputs,
            dtype=self.dtype,
            kernel_init=weight_init(std["final_out"], cut, ("embed", None)),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), (None,)),
        )

    def _pool(self, x: Array, input_mask: Array, cls_positions: Optional[Array]) -> Array:
        if self.config.classifier_pooling == "cls":
            if cls_positions is None:
                return x[:, 0]
            return jnp.take_along_axis(x, cls_positions[..., None].astype(jnp.int32), axis=1)
        if cls_positions is None:
            real = (input_mask > 0).astype(x.dtype)[..., None]
            return jnp.sum(x * real, axis=1) / jnp.sum(real, axis=1)
        # Example j of a packed row is the tokens input_mask numbers j + 1.
        slots = jnp.arange(1, cls_positions.shape[1] + 1)
        member = (input_mask[:, None, :] == slots[None, :, None]).astype(jnp.float32)  # [batch, k, length]
        summed = jnp.einsum("bkl,blh->bkh", member, x.astype(jnp.float32))
        return (summed / jnp.maximum(jnp.sum(member, axis=-1), 1.0)[..., None]).astype(x.dtype)

    def __call__(
        self,
        input_ids: Array,
        input_mask: Optional[Array] = None,
        deterministic: bool = True,
        *,
        segment_ids: Optional[Array] = None,
        position_ids: Optional[Array] = None,
        cls_positions: Optional[Array] = None,
    ) -> Array:
        del segment_ids
        if input_mask is None:
            input_mask = jnp.ones_like(input_ids)
        x, _ = self.model(input_ids, input_mask, deterministic, position_ids)
        if self.head is None:  # transformers' last_hidden_state
            return x.astype(jnp.float32)
        if self.head.reads == "pooled":
            x = self._pool(x, input_mask, cls_positions)
        x = self.head_norm(layers.ACTIVATIONS[self.config.classifier_activation](self.head_dense(x)))
        if self.head.dropout:
            x = self.dropout(x, deterministic=deterministic)
        return self.classifier(x).astype(jnp.float32)

    def init_head(self, hidden: Array) -> Array:
        """The classifier alone (its values those of a full init): the rest comes from the pre-trained model."""
        return self.classifier(hidden)

    def fresh_head(self, rng: Array) -> dict:
        if self.head is None:
            return {}
        hidden = jnp.zeros((1, self.config.hidden_size), jnp.float32)
        return jax.device_get(nn.meta.unbox(self.init(rng, hidden, method=ModernBertForFinetuning.init_head)["params"]))


def finetuning_model(
    architecture: ModernBertConfig,
    head: Optional[Head],
    scan_layers: bool = False,
    scan_unroll: int = 0,
    **compute: Any,
) -> ModernBertForFinetuning:
    del scan_layers, scan_unroll  # BERT's; ModernBERT's layers alternate kinds and run as a loop
    if head is not None and (head.hf_class not in HEADS or head.name != "classifier"):
        raise ValueError(f"bertjax's ModernBERT has no {head.hf_class} head yet (it has {', '.join(HEADS)}).")
    return ModernBertForFinetuning(architecture, head, **compute)
