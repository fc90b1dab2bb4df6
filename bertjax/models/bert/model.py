"""BERT in Flax linen, exactly as google-research/bert and Hugging Face's `BertForPreTraining` define it.

Post-LayerNorm encoder, absolute learned positions, exact (erf) GELU, MLM decoder tied to the word
embeddings. Every parameter carries logical axis names (batch, length, embed, heads, kv, mlp, vocab,
layers); only the trainer decides how those map onto a device mesh (models/partitioning.py, training/sharding.py).

Implementation choices that leave fp32 numerics unchanged are constructor arguments, not config:
layers as a Python loop or `nn.scan`, rematerialisation policy, compute dtype.

Mixed precision (`dtype=jnp.bfloat16`, config.model.dtype): where each value is bf16 and where float32.
  - Parameters are float32 always (and so are their gradients and the optimizer); each layer casts its
    weights to the compute dtype where it uses them (Dense/Embed `dtype=`, the fused QKV kernel's astype).
  - Activations between layers (embeddings, residual stream, FFN) are bf16.
  - LayerNorm statistics are float32 (flax reduces bf16 inputs in float32); its output is bf16.
  - Attention scores accumulate in float32 (`preferred_element_type`), the softmax is float32, the
    probabilities are cast to bf16 for the context matmul (splash and cuDNN accumulate in float32 inside).
  - MLM and NSP logits are cast to float32 (the MLM bias is added in float32), so the loss and every
    metric are float32 (metrics.py). tests/test_model.py holds each stage to measured tolerances.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.models import attention as attention_lib
from bertjax.models import partitioning
from bertjax.models.bert.config import (  # noqa: F401  (re-exported: model.BertConfig, model.SIZES, ...)
    CONFIG_FIELDS,
    FIXED_HF_FIELDS,
    SIZES,
    TRAINING_ONLY_FIELDS,
    BertConfig,
    config_for_size,
)
from bertjax.models.bert.encoder import (  # noqa: F401  (re-exported: model.BertLayer, ...)
    BertEncoder,
    BertLayer,
    make_dense,
    weight_init,
    make_layer_norm,
    bias_zeros,
)
from bertjax.models.layers import (  # noqa: F401  (re-exported: model.Dropout, model.DTYPES, ...)
    ACTIVATIONS,
    DTYPES,
    REMAT_POLICIES,
    DenseActivation,
    Dropout,
    Embed,
    hash_bits,
    param_count,
)

Array = jax.Array
Dtype = Any


@flax.struct.dataclass
class BertOutput:
    mlm_logits: Array  # [batch, predictions or length, vocab], float32
    nsp_logits: Array  # [batch, 2], float32
    sequence_output: Optional[Array]  # [batch, length, hidden]; None with predictions_only
    pooled_output: Array  # [batch, hidden]
    # With output_hidden_states=True: num_hidden_layers + 1 arrays [batch, length, hidden], the embeddings'
    # output then each layer's (Hugging Face's order; the last is sequence_output). None otherwise.
    hidden_states: Optional[tuple[Array, ...]] = None


class BertEmbeddings(nn.Module):
    config: BertConfig
    dtype: Dtype = jnp.float32

    def setup(self):
        cfg = self.config
        embed = functools.partial(Embed, features=cfg.hidden_size, dtype=self.dtype)
        self.word_embeddings = embed(cfg.vocab_size, embedding_init=weight_init(cfg, ("vocab", "embed")))
        self.position_embeddings = embed(cfg.max_position_embeddings, embedding_init=weight_init(cfg, (None, "embed")))
        self.token_type_embeddings = embed(cfg.type_vocab_size, embedding_init=weight_init(cfg, (None, "embed")))
        self.layer_norm = make_layer_norm(cfg, self.dtype, "LayerNorm")
        self.dropout = Dropout(cfg.hidden_dropout_prob)

    def __call__(
        self, input_ids: Array, segment_ids: Array, deterministic: bool, position_ids: Optional[Array] = None
    ) -> Array:
        positions = jnp.arange(input_ids.shape[-1])[None, :] if position_ids is None else position_ids
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        x = x + self.token_type_embeddings(segment_ids)
        x = self.layer_norm(x)
        x = partitioning.constrain(x, ("batch", "length", "embed"))
        return self.dropout(x, deterministic=deterministic)


# How a BERT is computed, the same fields on every module that holds the encoder (pre-training, fine-tuning).
COMPUTE_FIELDS = ("dtype", "scan_layers", "remat_policy", "attention", "packed", "recompute_activation", "scan_unroll")


def compute_fields(module: nn.Module) -> dict[str, Any]:
    """`module`'s COMPUTE_FIELDS, for the BertModel or BertEncoder it builds."""
    return {name: getattr(module, name) for name in COMPUTE_FIELDS}


class BertModel(nn.Module):
    """Embeddings, encoder and pooler: Hugging Face's `BertModel`."""

    config: BertConfig
    dtype: Dtype = jnp.float32
    scan_layers: bool = False
    remat_policy: str = "none"
    attention: str = "xla"
    packed: bool = False
    recompute_activation: bool = False  # the GELU's backward recomputes it (layers.DenseActivation)
    scan_unroll: int = 0  # scanned layers per loop iteration, 0 all (BertEncoder's)

    def setup(self):
        cfg = self.config
        self.embeddings = BertEmbeddings(cfg, self.dtype)
        self.encoder = BertEncoder(cfg, **compute_fields(self))
        self.pooler = make_dense(cfg, cfg.hidden_size, ("embed", "mlp"), self.dtype, "pooler")

    def __call__(
        self,
        input_ids: Array,
        segment_ids: Array,
        input_mask: Array,
        deterministic: bool = True,
        position_ids: Optional[Array] = None,
        cls_positions: Optional[Array] = None,
        output_hidden_states: bool = False,
        pooled_only: bool = False,
        extra_rows: Optional[Array] = None,
    ) -> tuple[Array, ...]:
        """(sequence output, pooled output), and with `output_hidden_states` a third item, the embeddings'
        output then each layer's (BertOutput.hidden_states). The pooler reads the [CLS] at position 0, or
        with `cls_positions` [batch, k] the [CLS] of each of a packed row's instances ([batch, k, hidden]).
        `pooled_only`: the last layer computes only the [CLS] rows the pooler reads, then the positions in
        `extra_rows` [batch, r] if given, and the sequence output is those rows ([batch, 1 or k (+ r), hidden]):
        heads that read only these (sequence classification; pre-training's masked positions) skip most of
        the last layer, ~7% of a 12-layer model's step."""
        x = self.embeddings(input_ids, segment_ids, deterministic, position_ids)
        # Key padding (and, packed, other instances) as an additive bias, as BERT and HF build it.
        attention_bias = attention_lib.xla_bias(input_mask, self.packed) if self.attention == "xla" else None
        rows = None
        if pooled_only:
            rows = jnp.zeros((x.shape[0], 1), jnp.int32) if cls_positions is None else cls_positions.astype(jnp.int32)
            if extra_rows is not None:
                rows = jnp.concatenate([rows, extra_rows.astype(jnp.int32)], axis=1)
        x, hidden_states = self.encoder(x, attention_bias, input_mask, deterministic, output_hidden_states, rows)
        if pooled_only:
            cls = x[:, 0] if cls_positions is None else x[:, : cls_positions.shape[1]]
        else:
            cls = (
                x[:, 0]
                if cls_positions is None
                else jnp.take_along_axis(x, cls_positions[..., None].astype(jnp.int32), axis=1)
            )
        pooled = jnp.tanh(self.pooler(cls))
        return (x, pooled, hidden_states) if output_hidden_states else (x, pooled)


class BertForPreTraining(nn.Module):
    """BERT with its masked-LM head (decoder tied to the word embeddings) and next-sentence head."""

    config: BertConfig
    dtype: Dtype = jnp.float32  # compute dtype; parameters stay float32
    scan_layers: bool = False  # nn.scan over layers: one compiled layer, params stacked on "layers"
    remat_policy: str = "none"  # one of REMAT_POLICIES
    attention: str = "xla"  # xla | splash | cudnn (attention.choose resolves config.model.attention)
    packed: bool = False  # rows hold several instances: input_mask numbers them 1..k
    recompute_activation: bool = False  # the GELU's backward recomputes it (layers.DenseActivation)
    scan_unroll: int = 0  # scanned layers per loop iteration, 0 all (BertEncoder's)

    def setup(self):
        cfg = self.config
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(f"remat_policy={self.remat_policy!r} is not one of {list(REMAT_POLICIES)}.")
        if self.attention not in attention_lib.IMPLEMENTATIONS or self.attention == "auto":
            raise ValueError(f"attention={self.attention!r} is not one of xla, splash, cudnn.")
        self.bert = BertModel(cfg, **compute_fields(self))
        self.transform = make_dense(cfg, cfg.hidden_size, ("embed", "mlp"), self.dtype, "transform")
        self.transform_layer_norm = make_layer_norm(cfg, self.dtype, "transform_layer_norm")
        self.mlm_bias = self.param("mlm_bias", bias_zeros(("vocab",)), (cfg.vocab_size,))
        self.nsp = make_dense(cfg, 2, ("embed", None), self.dtype, "nsp")

    def __call__(
        self,
        input_ids: Array,
        segment_ids: Array,
        input_mask: Array,
        masked_lm_positions: Optional[Array] = None,
        deterministic: bool = True,
        position_ids: Optional[Array] = None,
        cls_positions: Optional[Array] = None,
        output_hidden_states: bool = False,
        predictions_only: bool = False,
    ) -> BertOutput:
        """Packed rows (`packed=True`) number their instances 1..k in `input_mask` and pass each token's
        position within its instance (`position_ids`) and each instance's [CLS] (`cls_positions`
        [batch, k]): nsp_logits and pooled_output then have one row per instance ([batch, k, …]).
        `output_hidden_states` fills BertOutput.hidden_states (feature extraction). `predictions_only`
        (training): the last layer computes only the [CLS] rows and `masked_lm_positions`, all the heads
        read; the logits are the same and sequence_output is None."""
        if predictions_only and masked_lm_positions is not None and not output_hidden_states:
            rows, pooled = self.bert(
                input_ids,
                segment_ids,
                input_mask,
                deterministic,
                position_ids,
                cls_positions,
                pooled_only=True,
                extra_rows=masked_lm_positions,
            )
            hidden = rows[:, rows.shape[1] - masked_lm_positions.shape[1] :]  # after the [CLS] rows
            sequence, hidden_states = None, []
        else:
            sequence, pooled, *hidden_states = self.bert(
                input_ids, segment_ids, input_mask, deterministic, position_ids, cls_positions, output_hidden_states
            )
            # Gather first so the vocabulary projection only runs on predicted positions.
            hidden = (
                sequence
                if masked_lm_positions is None
                else jnp.take_along_axis(sequence, masked_lm_positions[..., None].astype(jnp.int32), axis=1)
            )
        hidden = ACTIVATIONS[self.config.hidden_act](self.transform(hidden))
        hidden = self.transform_layer_norm(hidden)
        logits = self.bert.embeddings.word_embeddings.attend(hidden)
        mlm_logits = logits.astype(jnp.float32) + self.mlm_bias
        nsp_logits = self.nsp(pooled).astype(jnp.float32)
        return BertOutput(
            mlm_logits=mlm_logits,
            nsp_logits=nsp_logits,
            sequence_output=sequence,
            pooled_output=pooled,
            hidden_states=hidden_states[0] if hidden_states else None,
        )

    def init_heads(self, hidden: Array, pooled: Array) -> Array:
        """The pre-training heads alone: `init` with this method creates their params and no encoder's, with
        the values a full init gives them (Flax derives each submodule's key from its name), for a checkpoint
        that has the encoder and lacks the heads (a full init of a BERT-Base body costs seconds on a CPU)."""
        return self.nsp(pooled).sum() + self.transform_layer_norm(self.transform(hidden)).sum() + self.mlm_bias.sum()


def packed_inputs(batch: dict) -> dict:
    """The keyword arguments a packed batch (records of `prepare --packing`) adds to `apply`; {} otherwise."""
    if "position_ids" not in batch:
        return {}
    return {"position_ids": batch["position_ids"], "cls_positions": batch["next_sentence_positions"]}


def flops_per_sequence(
    bert_config: BertConfig, seq_len: int, num_predictions: Optional[int] = None, training: bool = True
) -> float:
    """Model FLOPs for one sequence: matmuls only, 2·m·n·k each; training = 3 × forward (backward ≈ 2×).

    Counted: per layer the Q/K/V and attention-output projections (4·2·L·H²), scores and context
    (2·2·L²·H), the feed-forward pair (2·2·L·H·I); pooler (2·H²) and NSP head (2·H·2) on the [CLS]
    token; MLM transform (2·P·H²) and tied vocab projection (2·P·H·V) on the P gathered predictions
    (P = seq_len when num_predictions is None: the model then predicts every position). Not counted:
    embedding lookups, softmax, LayerNorm, GELU, bias adds, the optimizer update. The last layer is counted
    whole, as for any BERT, although bertjax's steps compute only the rows its heads read (`pooled_only`,
    `predictions_only`): the work saved shows as speed, and a model FLOPs share can pass 1 on few layers.
    """
    H, I, V = bert_config.hidden_size, bert_config.intermediate_size, bert_config.vocab_size
    L = int(seq_len)
    P = L if num_predictions is None else int(num_predictions)
    per_layer = 2 * L * H * H * 4 + 2 * L * L * H * 2 + 2 * L * H * I * 2
    forward = bert_config.num_hidden_layers * per_layer
    forward += 2 * H * H + 2 * H * 2  # pooler + NSP on one token
    forward += 2 * P * H * H + 2 * P * H * V  # MLM transform + vocab projection
    return float(3 * forward if training else forward)


def pretraining_inputs(batch: dict) -> dict:
    """What the trainer's batch adds to `apply` beyond ids, segments, mask and masked positions: logits of the
    masked positions only, and a packed row's per-instance positions and [CLS] positions."""
    return dict(predictions_only=True, **packed_inputs(batch))


def dummy_inputs(batch: int = 1, seq_len: int = 8) -> dict[str, Array]:
    """Shapes-only inputs for `init` and `eval_shape`."""
    ids = jnp.zeros((batch, seq_len), jnp.int32)
    return dict(input_ids=ids, segment_ids=ids, input_mask=jnp.ones_like(ids))


def init_params(model: BertForPreTraining, rng: Array, seq_len: int = 8, heads_only: bool = False) -> dict:
    """Unboxed float32 parameters (logical-axis metadata stripped); `heads_only`: the MLM and NSP heads'
    alone (`BertForPreTraining.init_heads`)."""
    if heads_only:
        hidden = jnp.zeros((1, 1, model.config.hidden_size), jnp.float32)
        variables = model.init(rng, hidden, hidden[:, 0], method=BertForPreTraining.init_heads)
    else:
        variables = model.init(rng, **dummy_inputs(1, seq_len))
    return nn.meta.unbox(variables["params"])


# --- What fine-tuning takes (bert/heads.py puts the task's output layer on it) ---------------------------------

BODY = "bert"  # the encoder's subtree
ENCODER = (BODY,)  # what a fine-tuning model takes from a pre-trained one (pretrained.load(encoder_only=True))


def module_param_counts(params: dict) -> list[tuple[str, int]]:
    """Parameter count per module, encoder layers folded into one row."""
    params = unstack_layers(params)
    encoder = params["bert"]["encoder"]
    rows = [
        ("bert/embeddings", param_count(params["bert"]["embeddings"])),
        (f"bert/encoder ({len(encoder)} layers × {param_count(encoder['layer_0']):,})", param_count(encoder)),
        ("bert/pooler", param_count(params["bert"]["pooler"])),
    ]
    heads = {k: v for k, v in params.items() if k != "bert"}
    rows.append(("heads (mlm transform + bias, nsp; decoder tied)", param_count(heads)))
    return rows


# --- Loop ⇄ scan layouts. Checkpoints and HF conversion speak the loop layout (one subtree per layer).


def stack_layers(params: dict, num_layers: int) -> dict:
    """`encoder/layer_{i}/...` → `encoder/layers/...` with a leading layer axis (for scan_layers=True)."""
    params = flax.core.unfreeze(params)
    encoder = params.get("bert", {}).get("encoder", {"layers": None})  # another family's params: as they are
    if "layers" in encoder:
        return params
    layers = [encoder.pop(f"layer_{i}") for i in range(num_layers)]
    encoder["layers"] = jax.tree.map(lambda *xs: jnp.stack(xs), *layers)
    return params


def unstack_layers(params: dict) -> dict:
    """Inverse of `stack_layers`."""
    params = flax.core.unfreeze(params)
    encoder = params.get("bert", {}).get("encoder", {})  # another family's params: as they are
    if "layers" not in encoder:
        return params
    stacked = encoder.pop("layers")
    n = jax.tree.leaves(stacked)[0].shape[0]
    for i in range(n):
        encoder[f"layer_{i}"] = jax.tree.map(lambda x: x[i], stacked)
    return params


def from_architecture(config: BertConfig, **compute: Any) -> BertForPreTraining:
    """The pre-training model of an architecture (`compute`: dtype, scan_layers, remat_policy, ...)."""
    return BertForPreTraining(config, **compute)


def from_config(cfg: Any, platform: Optional[str] = None, packed: bool = False) -> BertForPreTraining:
    """`config.model` (a `config.ModelConfig`) → the model: the one place the model section becomes code.

    `platform` (cpu, gpu, tpu; default: JAX's backend) is where it will run: what `attention=auto`
    resolves to, and whether splash runs compiled or interpreted. `packed`: rows of several instances."""
    cfg.validate()
    platform = platform or jax.default_backend()
    implementation = attention_lib.choose(cfg.attention, cfg.attention_probs_dropout_prob, platform)
    return BertForPreTraining(
        cfg.architecture,
        dtype=DTYPES[cfg.dtype],
        scan_layers=cfg.layer_scan(platform),
        remat_policy=cfg.remat_policy,
        attention=implementation,
        packed=packed,
        recompute_activation=cfg.activation_recompute(platform),
        scan_unroll=cfg.scan_unroll,
    )


def encoder_states(
    config: BertConfig, params: dict, input_ids: Array, segment_ids: Array, input_mask: Array
) -> tuple[Array, ...]:
    """Every layer's output of the encoder alone (`params`: the BODY subtree), the embeddings' first."""
    _, _, hidden = BertModel(config).apply(
        {"params": params}, input_ids, segment_ids, input_mask, deterministic=True, output_hidden_states=True
    )
    return hidden
