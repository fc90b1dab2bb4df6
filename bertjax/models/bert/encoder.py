"""BERT's transformer layers: one post-LayerNorm layer (fused QKV projection, attention by any kernel, the
feed-forward block) and the stack of them, as a Python loop or `nn.scan` (the layout of the parameters), with
the parameter initialisers every BERT module shares. models/bert/model.py builds the model around it.
"""

from __future__ import annotations

from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.models import attention as attention_lib
from bertjax.models.bert.config import BertConfig
from bertjax.models.layers import ACTIVATIONS, REMAT_POLICIES, DenseActivation, Dropout
from bertjax.models import layers
from bertjax.models import partitioning

Array = jax.Array
Dtype = Any


def weight_init(config: BertConfig, names: tuple[Optional[str], ...]):
    return nn.with_logical_partitioning(nn.initializers.truncated_normal(config.initializer_range), names)


def bias_zeros(names: tuple[Optional[str], ...]):
    return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def make_layer_norm(config: BertConfig, dtype: Dtype, name: str) -> nn.LayerNorm:
    # use_fast_variance=False: E[(x-mean)^2], as PyTorch computes it, for reference-exact outputs.
    return nn.LayerNorm(
        epsilon=config.layer_norm_eps,
        dtype=dtype,
        use_fast_variance=False,
        scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
        bias_init=bias_zeros(("embed",)),
        name=name,
    )


def make_dense(config: BertConfig, features: int, names: tuple[str, str], dtype: Dtype, name: str) -> nn.Dense:
    return nn.Dense(
        features,
        dtype=dtype,
        kernel_init=weight_init(config, names),
        bias_init=bias_zeros(names[1:]),
        name=name,
        dot_general=layers.dot_general,
    )


class _HeadsProjection(nn.Module):
    """The kernel [embed, heads, kv] and bias [heads, kv] of `nn.DenseGeneral((heads, kv))`, created with
    the same names, shapes, initialisers (same values for the same key) and logical axes, but returned
    rather than applied, so that BertLayer can fuse the query, key and value projections."""

    config: BertConfig

    @nn.compact
    def __call__(self) -> tuple[Array, Array]:
        cfg = self.config
        shape = (cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim)
        init = weight_init(cfg, ("embed", "heads", "kv"))
        kernel = self.param("kernel", lambda rng, s: _reshape_boxed(init(rng, (s[0], s[1] * s[2])), s), shape)
        bias = self.param("bias", bias_zeros(("heads", "kv")), shape[1:])
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
            qkv = layers.dot_general(x.astype(self.dtype), kernel, (((2,), (0,)), ((), ()))) + bias
            q, k, v = (partitioning.constrain(qkv[:, :, i], ("batch", "length", "heads", "kv")) for i in range(3))
        else:
            kv = layers.dot_general(x.astype(self.dtype), kernel[:, 1:], (((2,), (0,)), ((), ()))) + bias[1:]
            k, v = kv[:, :, 0], kv[:, :, 1]
            x = jnp.take_along_axis(x, rows[..., None].astype(jnp.int32), axis=1)  # the residual: those rows
            q = layers.dot_general(x.astype(self.dtype), kernel[:, 0], (((2,), (0,)), ((), ()))) + bias[0]
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
            kernel_init=weight_init(cfg, ("heads", "kv", "embed")),
            bias_init=bias_zeros(("embed",)),
            dot_general=layers.dot_general,
        )(context)
        # Named: the masks of these two must not depend on whether the kernel above has a dropout module.
        attn = Dropout(cfg.hidden_dropout_prob, name="attention_dropout")(attn, deterministic=self.deterministic)
        x = make_layer_norm(cfg, self.dtype, "attention_layer_norm")(x + attn)

        h = DenseActivation(
            cfg.intermediate_size,
            dtype=self.dtype,
            kernel_init=weight_init(cfg, ("embed", "mlp")),
            bias_init=bias_zeros(("mlp",)),
            activation=act,
            recompute=self.recompute_activation,
            name="intermediate",
        )(x)
        h = partitioning.constrain(h, ("batch", "length", "mlp"))
        h = make_dense(cfg, cfg.hidden_size, ("mlp", "embed"), self.dtype, "output")(h)
        h = Dropout(cfg.hidden_dropout_prob, name="output_dropout")(h, deterministic=self.deterministic)
        x = make_layer_norm(cfg, self.dtype, "output_layer_norm")(x + h)
        x = partitioning.constrain(x, ("batch", "length", "embed"))
        return x, (x if self.emit_output else None)


class BertEncoder(nn.Module):
    config: BertConfig
    dtype: Dtype = jnp.float32
    scan_layers: bool = False
    remat_policy: str = "none"
    attention: str = "xla"
    packed: bool = False
    recompute_activation: bool = False
    scan_unroll: int = 0  # scanned layers per loop iteration, 0 all (config.model.scan_unroll)

    def _unroll(self, layers: int) -> int:
        return max(1, layers if self.scan_unroll == 0 else min(self.scan_unroll, layers))  # 1 for a scan of 0

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
                unroll=self._unroll(self.config.num_hidden_layers),
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
            unroll=self._unroll(n - 1),
        )
        return apply(jax.tree.map(lambda a: a[-1], stacked), x, None if keys is None else keys[-1], rows)
