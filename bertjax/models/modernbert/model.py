"""ModernBERT in Flax linen, as transformers' `ModernBertForMaskedLM` computes it (Warner et al. 2024).

Pre-normalisation encoder without biases, rotary positions (global layers and sliding-window layers with their
own bases), GeGLU feed-forward, a global layer every few layers and a banded `local_attention // 2`-each-side
window in the others, no token types and no NSP. The MLM head is dense → activation → norm → the decoder tied
to the token embeddings, with its own bias.

Packed rows: `input_mask` holds per token 0 for padding, else its instance's number (1..k), as for BERT
(attention.py); pass each token's position within its instance as `position_ids`, and rotary positions restart
there while attention never crosses instances. Parameters carry logical axis names (embed, heads, kv, mlp,
vocab) for the trainer's shardings (training/sharding.py).
"""

from __future__ import annotations

from typing import Any, Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.models import attention as attention_lib
from bertjax.models import layers
from bertjax.models import partitioning
from bertjax.models.modernbert.config import ModernBertConfig

Array = jax.Array
Dtype = Any


@flax.struct.dataclass
class ModernBertOutput:
    mlm_logits: Array  # [batch, predictions or length, vocab], float32
    sequence_output: Array  # [batch, length, hidden]: the final norm's output
    # With output_hidden_states=True: the embeddings' output then each layer's (before the final norm).
    hidden_states: Optional[tuple[Array, ...]] = None


def weight_init(std: float, cutoff: float, names: tuple[Optional[str], ...]):
    # transformers' trunc_normal_(std, a=-cutoff·std, b=cutoff·std)
    return nn.with_logical_partitioning(nn.initializers.truncated_normal(std, lower=-cutoff, upper=cutoff), names)


def init_stds(config: ModernBertConfig) -> dict[str, float]:
    """transformers' ModernBertPreTrainedModel._init_weights: inputs, outputs (scaled by depth), embeddings."""
    r = config.initializer_range
    return {
        "in": r,
        "out": r / (2.0 * config.num_hidden_layers) ** 0.5,
        "embedding": r,
        "final_out": config.hidden_size**-0.5,
    }


def make_norm(config: ModernBertConfig, dtype: Dtype, name: str) -> nn.LayerNorm:
    settings = dict(
        epsilon=config.norm_eps,
        use_bias=config.norm_bias,
        use_fast_variance=False,
        scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("embed",)),
        name=name,
    )
    return nn.LayerNorm(dtype=dtype, **settings)


def head_dense(config: ModernBertConfig, dtype: Dtype) -> nn.Dense:
    """The prediction head's dense layer (transformers' head.dense): the masked LM's and every fine-tuning head's."""
    std, cut = init_stds(config), config.initializer_cutoff_factor
    return nn.Dense(
        config.hidden_size,
        use_bias=config.classifier_bias,
        dtype=dtype,
        kernel_init=weight_init(std["out"], cut, ("embed", "mlp")),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("mlp",)),
    )


def rotary(position_ids: Array, head_dim: int, theta: float) -> tuple[Array, Array]:
    """(cos, sin) [batch, length, head_dim] in float32, as transformers' default RoPE."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    freqs = position_ids.astype(jnp.float32)[..., None] * inv_freq
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def _rotate(x: Array, cos: Array, sin: Array) -> Array:
    """x [batch, length, heads, head_dim] rotated in float32 (rotate_half convention)."""
    x32 = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos[:, :, None, :] + rotated * sin[:, :, None, :]).astype(x.dtype)


@jax.custom_vjp
def _gradient_barrier(x: Array) -> Array:
    """The identity, whose gradient is materialised here: without it XLA:CPU fuses the pre-norm residual
    stream's backward chain (each layer's norm gradient added on) into the weight-gradient transposes of every
    layer below, recomputing it once per layer (ModernBERT-base's CPU step 3× slower, growing with depth)."""
    return x


def _barrier_forward(x: Array) -> tuple[Array, None]:
    return x, None


def _barrier_backward(_: None, g: Array) -> tuple[Array]:
    # A conditional is never fused into its consumers, so g is computed once here (optimization_barrier is
    # expanded away before fusion on CPU). The other branch runs only when g is already NaN, and stays NaN.
    first = g.reshape(-1)[0]
    return (jax.lax.cond(first == first, lambda x: x, lambda x: x * jnp.nan, g),)


_gradient_barrier.defvjp(_barrier_forward, _barrier_backward)


class ModernBertLayer(nn.Module):
    config: ModernBertConfig
    layer: int  # its index: layer 0 has no attention norm; the layer type says global or sliding
    dtype: Dtype = jnp.float32
    deterministic: bool = True
    attention: str = "xla"  # resolved: xla | splash | cudnn
    packed: bool = False
    window_block: int = attention_lib.AUTO_BLOCK  # sliding-window layers: queries in blocks of this many (block_size)
    recompute_activation: bool = False  # GeGLU's backward recomputes it from Wi's output (layers.DenseActivation)

    @nn.compact
    def __call__(self, x: Array, bias: Optional[Array], input_mask: Array, cos: Array, sin: Array) -> Array:
        cfg = self.config
        std, cut = init_stds(cfg), cfg.initializer_cutoff_factor
        heads, head_dim = cfg.num_attention_heads, cfg.head_dim
        h = x if self.layer == 0 else make_norm(cfg, self.dtype, "attn_norm")(x)
        qkv = nn.DenseGeneral(
            (3, heads, head_dim),
            use_bias=cfg.attention_bias,
            dtype=self.dtype,
            kernel_init=weight_init(std["in"], cut, ("embed", None, "heads", "kv")),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), (None, "heads", "kv")),
            name="Wqkv",
            dot_general=layers.dot_general,
        )(h)
        q, k, v = (qkv[:, :, i] for i in range(3))
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)

        def xla_attention(q, k, v, bias):
            scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) * head_dim**-0.5
            probs = jax.nn.softmax(scores + bias, axis=-1)
            probs = layers.Dropout(cfg.attention_dropout)(probs, deterministic=self.deterministic)
            return jnp.einsum("bhqk,bkhd->bqhd", probs.astype(self.dtype), v)

        window = None if cfg.is_global(self.layer) else cfg.sliding_window
        block = window and attention_lib.block_size(self.window_block, self.attention, x.shape[1], window)
        if block:
            context = attention_lib.windowed(self.attention, q, k, v, input_mask, window, block, xla_attention)
        elif self.attention == "xla":
            context = xla_attention(q, k, v, bias)
        else:  # the kernel masks padding, other instances and (local layers) keys outside the window itself
            context = attention_lib.fused(self.attention, q, k, v, input_mask, self.packed, window)
        out = nn.DenseGeneral(
            cfg.hidden_size,
            axis=(-2, -1),
            use_bias=cfg.attention_bias,
            dtype=self.dtype,
            kernel_init=weight_init(std["out"], cut, ("heads", "kv", "embed")),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("embed",)),
            name="Wo_attn",
            dot_general=layers.dot_general,
        )(context)
        x = x + layers.Dropout(cfg.attention_dropout)(out, deterministic=self.deterministic)
        x = partitioning.constrain(x, ("batch", "length", "embed"))
        # GeGLU: Wi's two halves are the input and the gate (transformers' chunk(2)).
        h = nn.DenseGeneral(
            (2, cfg.intermediate_size),
            use_bias=cfg.mlp_bias,
            dtype=self.dtype,
            kernel_init=weight_init(std["in"], cut, ("embed", None, "mlp")),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), (None, "mlp")),
            name="Wi",
            dot_general=layers.dot_general,
        )(make_norm(cfg, self.dtype, "mlp_norm")(x))

        def geglu(h: Array) -> Array:
            return layers.ACTIVATIONS[cfg.hidden_activation](h[:, :, 0]) * h[:, :, 1]

        h = (jax.checkpoint(geglu) if self.recompute_activation else geglu)(h)
        h = layers.Dropout(cfg.mlp_dropout)(h, deterministic=self.deterministic)
        out = nn.Dense(
            cfg.hidden_size,
            use_bias=cfg.mlp_bias,
            dtype=self.dtype,
            kernel_init=weight_init(std["out"], cut, ("mlp", "embed")),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("embed",)),
            name="Wo_mlp",
            dot_general=layers.dot_general,
        )(h)
        return _gradient_barrier(partitioning.constrain(x + out, ("batch", "length", "embed")))


class ModernBertModel(nn.Module):
    """The encoder: token embeddings → norm → layers → final norm."""

    config: ModernBertConfig
    dtype: Dtype = jnp.float32
    attention: str = "xla"
    packed: bool = False
    remat_policy: str = "none"  # layers.REMAT_POLICIES: what each layer keeps for the backward pass
    window_block: int = attention_lib.AUTO_BLOCK  # sliding-window layers in blocks of this many queries (block_size)
    recompute_activation: bool = False  # ModernBertLayer's

    @nn.compact
    def __call__(
        self,
        input_ids: Array,
        input_mask: Array,
        deterministic: bool = True,
        position_ids: Optional[Array] = None,
        output_hidden_states: bool = False,
    ) -> tuple[Array, Optional[tuple[Array, ...]]]:
        cfg = self.config
        std, cut = init_stds(cfg), cfg.initializer_cutoff_factor
        embed = layers.Embed(
            cfg.vocab_size,
            cfg.hidden_size,
            dtype=self.dtype,
            name="tok_embeddings",
            embedding_init=weight_init(std["embedding"], cut, ("vocab", "embed")),
        )
        x = make_norm(cfg, self.dtype, "embeddings_norm")(embed(input_ids))
        x = layers.Dropout(cfg.embedding_dropout)(x, deterministic=deterministic)
        if position_ids is None:
            position_ids = jnp.broadcast_to(jnp.arange(input_ids.shape[-1]), input_ids.shape)
        rope = {
            True: rotary(position_ids, cfg.head_dim, cfg.global_rope_theta),
            False: rotary(position_ids, cfg.head_dim, cfg.local_rope_theta),
        }
        xla = self.attention == "xla"
        blocked = attention_lib.block_size(self.window_block, self.attention, input_ids.shape[-1], cfg.sliding_window)
        biases = {
            True: attention_lib.xla_bias(input_mask, True) if xla else None,
            False: attention_lib.xla_bias(input_mask, True, cfg.sliding_window) if xla and not blocked else None,
        }
        hidden = [x] if output_hidden_states else None
        layer_class = (
            ModernBertLayer
            if self.remat_policy == "none"
            else nn.remat(ModernBertLayer, policy=layers.REMAT_POLICIES[self.remat_policy])
        )
        for i in range(cfg.num_hidden_layers):
            kind = cfg.is_global(i)
            x = layer_class(
                cfg,
                i,
                self.dtype,
                deterministic,
                self.attention,
                self.packed,
                self.window_block,
                self.recompute_activation,
                name=f"layers_{i}",
            )(x, biases[kind], input_mask, *rope[kind])
            if hidden is not None:
                hidden.append(x)
        x = make_norm(cfg, self.dtype, "final_norm")(x)
        return x, tuple(hidden) if hidden is not None else None


def encoder_of(head: nn.Module) -> ModernBertModel:
    """The encoder a head module (masked LM, fine-tuning) computes with its own compute fields."""
    return ModernBertModel(
        head.config,
        head.dtype,
        head.attention,
        head.packed,
        head.remat_policy,
        head.window_block,
        head.recompute_activation,
    )


class ModernBertForMaskedLM(nn.Module):
    """The encoder and its MLM head; logits for `masked_lm_positions` [batch, predictions], or for every
    position when none are passed. `segment_ids` is accepted and ignored (ModernBERT has no token types)."""

    config: ModernBertConfig
    dtype: Dtype = jnp.float32
    attention: str = "xla"  # resolved (attention.choose): xla | splash | cudnn
    packed: bool = False  # rows of several instances (input_mask numbers them)
    remat_policy: str = "none"
    window_block: int = attention_lib.AUTO_BLOCK  # ModernBertModel's
    recompute_activation: bool = False  # ModernBertModel's

    def setup(self):
        cfg = self.config
        self.model = encoder_of(self)
        self.head_dense = head_dense(cfg, self.dtype)
        self.head_norm = make_norm(cfg, self.dtype, "head_norm")
        if cfg.decoder_bias:
            self.decoder_bias = self.param(
                "decoder_bias",
                nn.with_logical_partitioning(nn.initializers.zeros_init(), ("vocab",)),
                (cfg.vocab_size,),
                jnp.float32,
            )

    def __call__(
        self,
        input_ids: Array,
        input_mask: Optional[Array] = None,
        deterministic: bool = True,
        *,
        segment_ids: Optional[Array] = None,
        masked_lm_positions: Optional[Array] = None,
        position_ids: Optional[Array] = None,
        output_hidden_states: bool = False,
    ) -> ModernBertOutput:
        del segment_ids
        if input_mask is None:
            input_mask = jnp.ones_like(input_ids)
        sequence, hidden = self.model(input_ids, input_mask, deterministic, position_ids, output_hidden_states)
        x = sequence
        if masked_lm_positions is not None:
            x = jnp.take_along_axis(x, masked_lm_positions[..., None].astype(jnp.int32), axis=1)
        x = self.head_norm(layers.ACTIVATIONS[self.config.classifier_activation](self.head_dense(x)))
        table = self.model.variables["params"]["tok_embeddings"]["embedding"]
        table = table.value if isinstance(table, nn.meta.AxisMetadata) else table
        logits = layers.vocab_logits(x.astype(self.dtype), table)
        if self.config.decoder_bias:
            logits = logits + self.decoder_bias
        return ModernBertOutput(logits.astype(jnp.float32), sequence, hidden)


def init_params(model: ModernBertForMaskedLM, rng: Array, seq_len: int = 8) -> dict:
    ids = jnp.ones((1, seq_len), jnp.int32)
    return nn.meta.unbox(model.init(rng, ids, jnp.ones_like(ids))["params"])


def module_param_counts(params: dict) -> list[tuple[str, int]]:
    """Parameter count per module for the summary, the layers folded into one row (layer 0, without the
    attention norm, is the smaller)."""
    model = params["model"]
    stack = [model[f"layers_{i}"] for i in range(sum(k.startswith("layers_") for k in model))]
    rows = [
        (
            "model/tok_embeddings + embeddings_norm",
            layers.param_count(model["tok_embeddings"]) + layers.param_count(model["embeddings_norm"]),
        ),
        (f"model/layers ({len(stack)} × {layers.param_count(stack[-1]):,})", layers.param_count(stack)),
        ("model/final_norm", layers.param_count(model["final_norm"])),
    ]
    rows.append(
        (
            "head (dense, norm, decoder bias; decoder tied)",
            layers.param_count({k: v for k, v in params.items() if k != "model"}),
        )
    )
    return rows


def dummy_inputs(batch: int = 1, seq_len: int = 8) -> dict[str, Array]:
    """Shapes-only inputs for `init` and `eval_shape`."""
    ids = jnp.zeros((batch, seq_len), jnp.int32)
    return dict(input_ids=ids, input_mask=jnp.ones_like(ids))


def pretraining_inputs(batch: dict) -> dict:
    """What the trainer's batch adds to `apply` beyond ids, mask and masked positions: a packed row's
    per-instance positions, where rotary positions restart."""
    return {"position_ids": batch["position_ids"]} if "position_ids" in batch else {}


def from_architecture(config: ModernBertConfig, scan_layers: bool = False, **compute: Any) -> ModernBertForMaskedLM:
    """The masked LM of an architecture (`compute`: dtype, remat_policy, ...; scan_layers is BERT's)."""
    del scan_layers
    return ModernBertForMaskedLM(config, **compute)


def from_config(cfg: Any, platform: Optional[str] = None, packed: bool = False) -> ModernBertForMaskedLM:
    """`config.model` (family modernbert) → the model, as models/bert/model.py's `from_config` for BERT."""
    cfg.validate()
    platform = platform or jax.default_backend()
    implementation = attention_lib.choose(cfg.attention, cfg.attention_probs_dropout_prob, platform)
    return ModernBertForMaskedLM(
        cfg.architecture,
        dtype=layers.DTYPES[cfg.dtype],
        attention=implementation,
        packed=packed,
        remat_policy=cfg.remat_policy,
        window_block=cfg.window_block,
        recompute_activation=cfg.activation_recompute(platform),
    )


BODY = "model"  # the encoder's subtree
ENCODER = (BODY, "head_dense", "head_norm")  # what fine-tuning takes from a masked LM, as transformers does


def flops_per_sequence(
    config: ModernBertConfig,
    seq_len: int,
    num_predictions: Optional[int] = None,
    training: bool = True,
    window_saves: bool = True,
) -> float:
    """Model FLOPs of one sequence, as metrics.flops_per_sequence counts BERT's: matmuls only, 2·m·n·k each;
    training = 3 × forward. Per layer: the fused QKV and output projections (2·L·H·3H + 2·L·H²), scores and
    context (2·2·L·K·H, K the keys a query attends: L in a global layer, 2·(local_attention // 2) + 1 at most
    in a sliding one when `window_saves`, as kernels that skip blocks outside the window do; the xla kernel
    computes all L), GeGLU (2·L·H·2I + 2·L·I·H). The MLM head's dense and tied vocab projection on P positions
    (every position when num_predictions is None)."""
    h, i, v = config.hidden_size, config.intermediate_size, config.vocab_size
    length = int(seq_len)
    p = length if num_predictions is None else int(num_predictions)
    forward = 0
    for layer in range(config.num_hidden_layers):
        keys = length if (config.is_global(layer) or not window_saves) else min(length, 2 * config.sliding_window + 1)
        forward += 2 * length * h * 3 * h + 2 * length * h * h + 2 * 2 * length * keys * h
        forward += 2 * length * h * 2 * i + 2 * length * i * h
    forward += 2 * p * h * h + 2 * p * h * v
    return float(3 * forward if training else forward)


def stack_layers(params: dict, num_layers: int) -> dict:
    """The scan layout is BERT's: ModernBERT's layers alternate kinds and run as a loop, so its parameters
    have one layout."""
    del num_layers
    return params


def unstack_layers(params: dict) -> dict:
    return params


def encoder_states(
    config: ModernBertConfig, params: dict, input_ids: Array, segment_ids: Array, input_mask: Array
) -> tuple[Array, ...]:
    """Every layer's output of the encoder alone (`params`: the BODY subtree), the embeddings' first and the
    last after the final norm, as transformers' ModernBertModel(output_hidden_states=True) gives them."""
    del segment_ids  # ModernBERT has no token types
    last, hidden = ModernBertModel(config).apply(
        {"params": params}, input_ids, input_mask, deterministic=True, output_hidden_states=True
    )
    return (*hidden[:-1], last)
