"""Optimizers for pre-training: BERT's AdamW and LAMB, warmup + decay schedule, weight-decay mask, clipping.

The optimizer state is an ordinary optax pytree: the Adam moments `mu` / `nu` mirror the params tree
(same structure, shapes and dtypes), everything else is a scalar step count or an empty state, so it
shards like the params and orbax saves it as is. The learning rate is a pure function of the step
(`schedule`), so the train step can log `schedule(step)` without `inject_hyperparams`.

Gradient accumulation is not here: the train step sums micro-batch gradients itself and calls the
optimizer once per step.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from bertjax.config.schema import OptimConfig

# Modules whose parameters are never decayed (BERT excludes "LayerNorm", "layer_norm" and "bias").
_LAYER_NORM_MARKERS = ("layernorm", "layer_norm")
_NO_DECAY_LEAVES = ("bias", "mlm_bias")
# Name of the nn.scan'ed layer stack in bertjax.models.bert.model: leaves under it carry a leading layer axis.
SCANNED_LAYERS = "layers"


# --- Learning-rate schedule ------------------------------------------------------------------------


def schedule(cfg: OptimConfig, num_train_steps: int) -> optax.Schedule:
    """lr(step): 0 → peak linearly over warmup_steps, then `cfg.schedule` to 0 at num_train_steps.

    wsd (warmup-stable-decay) holds the peak until num_train_steps − decay_steps, then falls to 0 at
    num_train_steps by `decay_shape`: linear, or 1-sqrt (peak · (1 − sqrt(f)), f the fraction of the decay
    phase done; Hägele et al. 2024, as ModernBERT trains). A decay branch is a run whose num_train_steps ends
    decay_steps after the step it starts from, so the formula needs no branch point of its own.

    `step` counts optimizer updates already applied (optax's count), so the first update uses lr(0),
    which is 0 when warming up, as in google-research/bert. Unlike google-research/bert, whose linear
    decay runs from step 0 (so the peak is never quite reached), the decay here starts at the end of
    warmup: lr(warmup_steps) == peak (Hugging Face's get_linear_schedule_with_warmup). With
    warmup_steps=0 the first step runs at the peak.
    """
    cfg.validate(num_train_steps)
    peak = float(cfg.learning_rate)
    warmup = int(cfg.warmup_steps)
    decay = cfg.schedule
    decay_start = int(num_train_steps) - int(cfg.decay_steps) if decay == "wsd" else warmup
    decay_steps = max(int(num_train_steps) - decay_start, 1)

    def lr(step: Any) -> jax.Array:
        step = jnp.asarray(step, jnp.float32)
        warm = peak * step / max(warmup, 1)
        frac = jnp.clip((step - decay_start) / decay_steps, 0.0, 1.0)
        if decay == "wsd" and cfg.decay_shape == "1-sqrt":
            after = peak * (1.0 - jnp.sqrt(frac))
        elif decay in ("linear", "wsd"):
            after = peak * (1.0 - frac)
        elif decay == "cosine":
            after = peak * 0.5 * (1.0 + jnp.cos(jnp.pi * frac))
        else:
            after = jnp.full_like(frac, peak)
        return jnp.where(step < warmup, warm, after)

    return lr


# --- Weight-decay mask -------------------------------------------------------------------------------


def _dict_keys(path: tuple) -> list[str]:
    # Only dict keys name modules and params; GetAttrKey("value") of boxed (nn.Partitioned) leaves is skipped.
    return [str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey)]


def _decays(names: list[str]) -> bool:
    if not names:
        return True
    if names[-1] in _NO_DECAY_LEAVES:
        return False
    return not any(marker in name.lower() for name in names[:-1] for marker in _LAYER_NORM_MARKERS)


def weight_decay_mask(params: Any) -> Any:
    """True where decoupled weight decay applies: every kernel and embedding; never a bias (incl.
    `mlm_bias`) nor a LayerNorm scale/bias. Decided by path names, so scanned layers (2-D LayerNorm
    scales with a leading layer axis) are masked like the loop layout."""
    return jax.tree_util.tree_map_with_path(lambda path, _: _decays(_dict_keys(path)), params)


def _is_scanned(path: tuple) -> bool:
    return SCANNED_LAYERS in _dict_keys(path)


# --- Transformations ---------------------------------------------------------------------------------


class BertAdamState(NamedTuple):
    count: jax.Array  # updates applied (int32); unused by the update, kept for inspection
    mu: Any  # first moment, same tree as params
    nu: Any  # second moment, same tree as params


def scale_by_bert_adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6) -> optax.GradientTransformation:
    """google-research/bert's AdamWeightDecayOptimizer moments: m / (sqrt(v) + eps), *no* bias correction.

    optax.adamw (and Hugging Face's AdamW) divide m and v by (1 - b^t); BERT's TF optimizer does not, so
    its early steps are smaller (step 1: 0.1·g/(0.0316·|g| + eps) ≈ 3.16·sign(g) vs 1·sign(g)) — together
    with warmup that is how the published checkpoints were trained, so "adamw" reproduces it.
    """

    def init_fn(params: Any) -> BertAdamState:
        zeros = lambda p: jnp.zeros_like(p)  # noqa: E731
        return BertAdamState(
            count=jnp.zeros([], jnp.int32), mu=jax.tree.map(zeros, params), nu=jax.tree.map(zeros, params)
        )

    def update_fn(updates: Any, state: BertAdamState, params: Any = None):
        del params
        mu = jax.tree.map(lambda g, m: b1 * m + (1.0 - b1) * g.astype(m.dtype), updates, state.mu)
        nu = jax.tree.map(lambda g, v: b2 * v + (1.0 - b2) * jnp.square(g.astype(v.dtype)), updates, state.nu)
        updates = jax.tree.map(lambda m, v, g: (m / (jnp.sqrt(v) + eps)).astype(g.dtype), mu, nu, updates)
        return updates, BertAdamState(count=optax.safe_increment(state.count), mu=mu, nu=nu)

    return optax.GradientTransformation(init_fn, update_fn)


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
    """tf.clip_by_global_norm as google-research/bert applies it: g · max_norm / max(‖g‖, max_norm).

    One scalar factor, which XLA fuses into the moment updates. optax.clip_by_global_norm's
    where(‖g‖ < max, g, g / (‖g‖ / max)) made XLA:CPU materialise a divided copy of every gradient,
    an extra read and write of all the parameters' bytes each step."""

    def update_fn(updates: Any, state: Any, params: Any = None):
        del params
        norm = optax.global_norm(updates)
        factor = max_norm / jnp.maximum(norm, max_norm)
        return jax.tree.map(lambda g: (g * factor).astype(g.dtype), updates), state

    return optax.GradientTransformation(optax.init_empty_state, update_fn)


def scale_by_layerwise_trust_ratio() -> optax.GradientTransformation:
    """LAMB's trust ratio ||w|| / ||u|| per parameter *per layer*: leaves of the scanned layer stack
    (leading layer axis) get one ratio per layer, so scan and loop layouts train identically
    (optax.scale_by_trust_ratio would take one norm over all layers). Ratio 1 where either norm is 0."""

    def update_fn(updates: Any, state: Any, params: Any = None):
        if params is None:
            raise ValueError("LAMB's trust ratio needs the params: call update(grads, state, params).")

        def scale(path, u, p):
            axes = tuple(range(1, p.ndim)) if _is_scanned(path) and p.ndim > 0 else None
            keep = axes is not None
            p_norm = jnp.sqrt(jnp.sum(jnp.square(p.astype(jnp.float32)), axis=axes, keepdims=keep))
            u_norm = jnp.sqrt(jnp.sum(jnp.square(u.astype(jnp.float32)), axis=axes, keepdims=keep))
            ratio = jnp.where((p_norm > 0) & (u_norm > 0), p_norm / jnp.where(u_norm > 0, u_norm, 1.0), 1.0)
            return (u * ratio).astype(u.dtype)

        return jax.tree_util.tree_map_with_path(scale, updates, params), state

    return optax.GradientTransformation(optax.init_empty_state, update_fn)


def make_optimizer(cfg: OptimConfig, num_train_steps: int) -> optax.GradientTransformation:
    """clip_by_global_norm → moments → decoupled weight decay (masked) → [LAMB trust ratio] → −lr.

    adamw: google-research/bert's optimizer exactly (no bias correction, update = lr·(m/(√v+ε) + wd·w));
           with `bias_correction`, torch's AdamW (m̂/(√v̂+ε), m̂ = m/(1−β1^t), v̂ = v/(1−β2^t)).
    lamb:  bias-corrected Adam moments, weight decay and the layer-wise trust ratio both skipped for
           biases and LayerNorm (as the TF/NVIDIA LAMB for BERT excludes them from layer adaptation).
    """
    cfg.validate(num_train_steps)
    lr = schedule(cfg, num_train_steps)
    parts = []
    if cfg.max_grad_norm > 0:
        parts.append(clip_by_global_norm(cfg.max_grad_norm))
    if cfg.name == "adamw" and not cfg.bias_correction:
        parts.append(scale_by_bert_adam(cfg.b1, cfg.b2, cfg.eps))
        parts.append(optax.add_decayed_weights(cfg.weight_decay, mask=weight_decay_mask))
    else:
        parts.append(optax.scale_by_adam(b1=cfg.b1, b2=cfg.b2, eps=cfg.eps))
        parts.append(optax.add_decayed_weights(cfg.weight_decay, mask=weight_decay_mask))
        if cfg.name == "lamb":
            parts.append(optax.masked(scale_by_layerwise_trust_ratio(), weight_decay_mask))
    parts.append(optax.scale_by_learning_rate(lr))
    return optax.chain(*parts)
