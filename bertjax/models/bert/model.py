"""BERT in Flax linen, exactly as google-research/bert and Hugging Face's `BertForPreTraining` define it.

Post-LayerNorm encoder, absolute learned positions, exact (erf) GELU, MLM decoder tied to the word
embeddings. Every parameter carries logical axis names (batch, length, embed, heads, kv, mlp, vocab,
layers); only `sharding.py` decides how those map onto a device mesh.

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
import numpy as np

from bertjax.models import attention as attention_lib
from bertjax.training import sharding as sharding_lib
from bertjax.models.bert.config import (  # noqa: F401  (re-exported: model.BertConfig, model.SIZES, ...)
    CONFIG_FIELDS,
    FIXED_HF_FIELDS,
    SIZES,
    TRAINING_ONLY_FIELDS,
    BertConfig,
    config_for_size,
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


def _init(config: BertConfig, names: tuple[Optional[str], ...]):
    return nn.with_logical_partitioning(nn.initializers.truncated_normal(config.initializer_range), names)


def _zeros(names: tuple[Optional[str], ...]):
    return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def _layer_norm(config: BertConfig, dtype: Dtype, name: str) -> nn.LayerNorm:
    # use_fast_variance=False: E[(x-mean)^2], as PyTorch computes it, for reference-exact outputs.
    return nn.LayerNorm(
        epsilon=config.layer_norm_eps,
        dtype=dtype,
        use_fast_variance=False,
        scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
        bias_init=_zeros(("embed",)),
        name=name,
    )


def _dense(config: BertConfig, features: int, names: tuple[str, str], dtype: Dtype, name: str) -> nn.Dense:
    return nn.Dense(features, dtype=dtype, kernel_init=_init(config, names), bias_init=_zeros(names[1:]), name=name)


class BertEmbeddings(nn.Module):
    config: BertConfig
    dtype: Dtype = jnp.float32

    def setup(self):
        cfg = self.config
        embed = functools.partial(Embed, features=cfg.hidden_size, dtype=self.dtype)
        self.word_embeddings = embed(cfg.vocab_size, embedding_init=_init(cfg, ("vocab", "embed")))
        self.position_embeddings = embed(cfg.max_position_embeddings, embedding_init=_init(cfg, (None, "embed")))
        self.token_type_embeddings = embed(cfg.type_vocab_size, embedding_init=_init(cfg, (None, "embed")))
        self.layer_norm = _layer_norm(cfg, self.dtype, "LayerNorm")
        self.dropout = Dropout(cfg.hidden_dropout_prob)

    def __call__(
        self, input_ids: Array, segment_ids: Array, deterministic: bool, position_ids: Optional[Array] = None
    ) -> Array:
        positions = jnp.arange(input_ids.shape[-1])[None, :] if position_ids is None else position_ids
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        x = x + self.token_type_embeddings(segment_ids)
        x = self.layer_norm(x)
        x = sharding_lib.constrain(x, ("batch", "length", "embed"))
        return self.dropout(x, deterministic=deterministic)


class _HeadsProjection(nn.Module):
    """The kernel [embed, heads, kv] and bias [heads, kv] of `nn.DenseGeneral((heads, kv))`, created with
    the same names, shapes, initialisers (same values for the same key) and logical axes, but returned
    rather than applied, so that BertLayer can fuse the query, key and value projections."""

    config: BertConfig

    @nn.compact
    def __call__(self) -> tuple[Array, Array]:
        cfg = self.config
        shape = (cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim)
        init = _init(cfg, ("embed", "heads", "kv"))
        kernel = self.param("kernel", lambda rng, s: _reshape_boxed(init(rng, (s[0], s[1] * s[2])), s), shape)
        bias = self.param("bias", _zeros(("heads", "kv")), shape[1:])
        return kernel, bias


def _reshape_boxed(value: Any, shape: tuple[int, ...]) -> Any:
    if isinstance(value, nn.meta.AxisMetadata):
        return nn.meta.replace_boxed(value, jnp.reshape(value.unbox(), shape))
    return jnp.reshape(value, shape)


class BertLayer(nn.Module):
    """One post-LayerNorm transformer layer. Signature `(x, bias, mask) -> (x, y)` so `nn.scan` can carry x
    and stack y: y is None, or with `emit_output` the layer's output again (the scan's per-layer hidden
    states). The xla attention adds `attention_bias`; fused kernels mask by `input_mask` (attention.py)."""

    config: BertConfig
    dtype: Dtype = jnp.float32
    deterministic: bool = True
    attention: str = "xla"  # resolved: xla | splash | cudnn
    packed: bool = False
    emit_output: bool = False  # output_hidden_states: return x as y too (off: the training program, unchanged)
    recompute_activation: bool = False  # the GELU's backward recomputes it (layers.DenseActivation)

    @nn.compact
    def __call__(
        self, x: Array, attention_bias: Optional[Array], input_mask: Array, rows: Optional[Array] = None
    ) -> tuple[Array, Optional[Array]]:
        """`rows` [batch, k]: compute only these positions' outputs ([batch, k, hidden]), their queries
        attending to every position's keys and values: the last layer under a head that reads only [CLS]."""
        cfg = self.config
        head_dim = cfg.head_dim
        act = ACTIVATIONS[cfg.hidden_act]

        # Query, key and value as one matmul (x is read once; one [H, 3H] weight-gradient matmul), with
        # the parameters kept as three DenseGeneral-shaped subtrees: the HF and checkpoint layout.
        projections = [_HeadsProjection(cfg, name=name)() for name in ("query", "key", "value")]
        kernel = jnp.stack([w for w, _ in projections], axis=1).astype(self.dtype)  # [embed, 3, heads, kv]
        bias = jnp.stack([b for _, b in projections]).astype(self.dtype)  # [3, heads, kv]
        attention = self.attention
        if rows is None:
            qkv = jnp.einsum("bsm,mthd->bsthd", x.astype(self.dtype), kernel) + bias
            q, k, v = (sharding_lib.constrain(qkv[:, :, i], ("batch", "length", "heads", "kv")) for i in range(3))
        else:
            kv = jnp.einsum("bsm,mthd->bsthd", x.astype(self.dtype), kernel[:, 1:]) + bias[1:]
            k, v = kv[:, :, 0], kv[:, :, 1]
            x = jnp.take_along_axis(x, rows[..., None].astype(jnp.int32), axis=1)  # the residual: those rows
            q = jnp.einsum("bsm,mhd->bshd", x.astype(self.dtype), kernel[:, 0]) + bias[0]
            attention = "xla"  # a few query rows: the plain einsums; fused kernels want whole blocks
            if attention_bias is None:
                attention_bias = attention_lib.xla_bias(input_mask, self.packed)
            if attention_bias.shape[2] > 1:  # packed: each row keeps its own instance's keys
                attention_bias = jnp.take_along_axis(attention_bias, rows[:, None, :, None].astype(jnp.int32), axis=2)
        if attention == "xla":
            # Scores and softmax in float32 whatever the compute dtype.
            scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
            scores = scores / np.sqrt(head_dim).astype(np.float32) + attention_bias
            probs = jax.nn.softmax(scores, axis=-1)
            probs = Dropout(cfg.attention_probs_dropout_prob, name="probs_dropout")(
                probs, deterministic=self.deterministic
            )
            context = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(self.dtype), v)
        else:
            context = attention_lib.fused(attention, q, k, v, input_mask, self.packed)
        attn = nn.DenseGeneral(
            cfg.hidden_size,
            axis=(-2, -1),
            dtype=self.dtype,
            name="attention_output",
            kernel_init=_init(cfg, ("heads", "kv", "embed")),
            bias_init=_zeros(("embed",)),
        )(context)
        # Named: the masks of these two must not depend on whether the kernel above has a dropout module.
        attn = Dropout(cfg.hidden_dropout_prob, name="attention_dropout")(attn, deterministic=self.deterministic)
        x = _layer_norm(cfg, self.dtype, "attention_layer_norm")(x + attn)

        h = DenseActivation(
            cfg.intermediate_size,
            dtype=self.dtype,
            kernel_init=_init(cfg, ("embed", "mlp")),
            bias_init=_zeros(("mlp",)),
            activation=act,
            recompute=self.recompute_activation,
            name="intermediate",
        )(x)
        h = sharding_lib.constrain(h, ("batch", "length", "mlp"))
        h = _dense(cfg, cfg.hidden_size, ("mlp", "embed"), self.dtype, "output")(h)
        h = Dropout(cfg.hidden_dropout_prob, name="output_dropout")(h, deterministic=self.deterministic)
        x = _layer_norm(cfg, self.dtype, "output_layer_norm")(x + h)
        x = sharding_lib.constrain(x, ("batch", "length", "embed"))
        return x, (x if self.emit_output else None)


def _scan_unroll(config: BertConfig) -> int:
    """Layers per scan iteration. On the CPU the scan is unrolled: XLA:CPU's while loop zero-fills the
    stacked residual and gradient buffers and copies each layer's weights out of the stack, a fifth of
    a BERT-base step; unrolled, the params keep their stacked layout and the same numerics."""
    return config.num_hidden_layers if jax.default_backend() == "cpu" else 1


class BertEncoder(nn.Module):
    config: BertConfig
    dtype: Dtype = jnp.float32
    scan_layers: bool = False
    remat_policy: str = "none"
    attention: str = "xla"
    packed: bool = False
    recompute_activation: bool = False

    @nn.compact
    def __call__(
        self,
        x: Array,
        attention_bias: Optional[Array],
        input_mask: Array,
        deterministic: bool,
        output_hidden_states: bool = False,
        last_rows: Optional[Array] = None,
    ) -> tuple[Array, Optional[tuple[Array, ...]]]:
        """(last layer's output, hidden states or None): with `output_hidden_states`, the input then each
        layer's output; under scan, the scan's stacked per-layer outputs (ys), so the layer stays scanned.
        With `last_rows` [batch, k] the last layer computes only those positions ([batch, k, hidden])."""
        if last_rows is not None and output_hidden_states:
            raise ValueError("output_hidden_states needs every position of the last layer; last_rows drops them.")
        if last_rows is not None and self.scan_layers and not self.is_initializing():
            return self._scan_then_rows(x, attention_bias, input_mask, deterministic, last_rows), None
        layer_cls = BertLayer
        if self.remat_policy != "none":
            layer_cls = nn.remat(BertLayer, policy=REMAT_POLICIES[self.remat_policy], prevent_cse=not self.scan_layers)
        if self.scan_layers:
            stack = nn.scan(
                layer_cls,
                variable_axes={"params": 0},
                split_rngs={"params": True, "dropout": True},
                in_axes=(nn.broadcast, nn.broadcast),
                length=self.config.num_hidden_layers,
                metadata_params={nn.PARTITION_NAME: "layers"},
                unroll=_scan_unroll(self.config),
            )
            inputs = x
            x, ys = stack(**self._layer_fields(deterministic), emit_output=output_hidden_states, name="layers")(
                x, attention_bias, input_mask
            )
            if last_rows is not None:  # initialising: the parameters are the same, the rows the output's
                return jnp.take_along_axis(x, last_rows[..., None].astype(jnp.int32), axis=1), None
            if not output_hidden_states:
                return x, None
            return x, (inputs, *(ys[i] for i in range(self.config.num_hidden_layers)))
        hidden_states = [x]
        last = self.config.num_hidden_layers - 1
        for i in range(self.config.num_hidden_layers):
            x, _ = layer_cls(**self._layer_fields(deterministic), name=f"layer_{i}")(
                x, attention_bias, input_mask, last_rows if i == last else None
            )
            hidden_states.append(x)
        return x, (tuple(hidden_states) if output_hidden_states else None)

    def _layer_fields(self, deterministic: bool) -> dict:
        return dict(
            config=self.config,
            dtype=self.dtype,
            deterministic=deterministic,
            attention=self.attention,
            packed=self.packed,
            recompute_activation=self.recompute_activation,
        )

    def _scan_then_rows(
        self, x: Array, attention_bias: Optional[Array], input_mask: Array, deterministic: bool, rows: Array
    ) -> Array:
        """The scanned stack's parameters ([layers, ...], as nn.scan made them) run as a scan of all but the
        last layer, then the last layer on `rows` only: nn.scan cannot run its last iteration differently.
        Same parameters and numerics; dropout keys split per layer from the module's key (other masks than
        nn.scan would draw, as reproducible)."""
        stacked = self.variables["params"]["layers"]
        layer = BertLayer(**self._layer_fields(deterministic), parent=None)

        def apply(params, x, key, layer_rows):
            return layer.apply(
                {"params": params},
                x,
                attention_bias,
                input_mask,
                layer_rows,
                rngs={} if key is None else {"dropout": key},
            )[0]

        if self.remat_policy != "none":
            apply = jax.checkpoint(apply, policy=REMAT_POLICIES[self.remat_policy])
        n = self.config.num_hidden_layers
        keys = None if deterministic else jax.random.split(self.make_rng("dropout"), n)
        first = (jax.tree.map(lambda a: a[:-1], stacked), None if keys is None else keys[:-1])
        x, _ = jax.lax.scan(
            lambda x, layer_in: (apply(layer_in[0], x, layer_in[1], None), None),
            x,
            first,
            unroll=max(1, min(_scan_unroll(self.config), n - 1)),
        )
        return apply(jax.tree.map(lambda a: a[-1], stacked), x, None if keys is None else keys[-1], rows)


class BertModel(nn.Module):
    """Embeddings, encoder and pooler: Hugging Face's `BertModel`."""

    config: BertConfig
    dtype: Dtype = jnp.float32
    scan_layers: bool = False
    remat_policy: str = "none"
    attention: str = "xla"
    packed: bool = False
    recompute_activation: bool = False  # the GELU's backward recomputes it (layers.DenseActivation)

    def setup(self):
        cfg = self.config
        self.embeddings = BertEmbeddings(cfg, self.dtype)
        self.encoder = BertEncoder(
            cfg, self.dtype, self.scan_layers, self.remat_policy, self.attention, self.packed, self.recompute_activation
        )
        self.pooler = _dense(cfg, cfg.hidden_size, ("embed", "mlp"), self.dtype, "pooler")

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

    def setup(self):
        cfg = self.config
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(f"remat_policy={self.remat_policy!r} is not one of {list(REMAT_POLICIES)}.")
        if self.attention not in attention_lib.IMPLEMENTATIONS or self.attention == "auto":
            raise ValueError(f"attention={self.attention!r} is not one of xla, splash, cudnn.")
        self.bert = BertModel(
            cfg, self.dtype, self.scan_layers, self.remat_policy, self.attention, self.packed, self.recompute_activation
        )
        self.transform = _dense(cfg, cfg.hidden_size, ("embed", "mlp"), self.dtype, "transform")
        self.transform_layer_norm = _layer_norm(cfg, self.dtype, "transform_layer_norm")
        self.mlm_bias = self.param("mlm_bias", _zeros(("vocab",)), (cfg.vocab_size,))
        self.nsp = _dense(cfg, 2, ("embed", None), self.dtype, "nsp")

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
    )


def encoder_states(
    config: BertConfig, params: dict, input_ids: Array, segment_ids: Array, input_mask: Array
) -> tuple[Array, ...]:
    """Every layer's output of the encoder alone (`params`: the BODY subtree), the embeddings' first."""
    _, _, hidden = BertModel(config).apply(
        {"params": params}, input_ids, segment_ids, input_mask, deterministic=True, output_hidden_states=True
    )
    return hidden
