"""A model's size, memory and cost before a job is launched, and one real forward pass (`python -m
bertjax.summary` prints `print_report` for a config).

It builds the model exactly as training will (same config section), initialises its parameters, and
checks that a batch of the configured shape goes through.
"""

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.training import metrics as metrics_lib
from bertjax import models as models_lib
from bertjax.models import layers
from bertjax.config.schema import JobConfig


def print_report(config: Any, batch_size: int = 2) -> None:
    """Prints the model's size per module, memory and FLOPs per sequence, then runs one forward pass of
    `batch_size` random sequences of the configured shape. `config`: a job ConfigDict or JobConfig."""
    config = config if isinstance(config, JobConfig) else JobConfig.from_configdict(config)
    family = models_lib.get(config.model.family)
    model = family.model.from_config(config.model)
    seq_len, predictions = config.data.max_seq_length, config.data.max_predictions_per_seq
    params = jax.jit(lambda rng: family.model.init_params(model, rng))(jax.random.PRNGKey(config.seed))
    total = layers.param_count(params)
    print(f"model {config.model.size}: {model.config}")
    for name, count in family.model.module_param_counts(params):
        print(f"  {name:<58} {count:>13,}")
    print(f"  {'total':<58} {total:>13,}")
    print(f"  fp32 params {total * 4 / 2**20:,.1f} MiB; with AdamW state {total * 12 / 2**20:,.1f} MiB")
    cfg = model.config
    flops = metrics_lib.flops_per_sequence(cfg, seq_len, predictions)  # the count the job's MFU uses
    print(
        f"  {flops / 1e9:,.1f} model GFLOPs per training sequence of {seq_len} tokens "
        f"({predictions} masked predictions)"
    )

    rng = np.random.default_rng(config.seed)
    batch = dict(
        input_ids=jnp.asarray(rng.integers(0, cfg.vocab_size, (batch_size, seq_len)), jnp.int32),
        segment_ids=jnp.asarray(np.repeat([[0] * (seq_len // 2) + [1] * (seq_len - seq_len // 2)], batch_size, 0)),
        input_mask=jnp.ones((batch_size, seq_len), jnp.int32),
        masked_lm_positions=jnp.asarray(rng.integers(0, seq_len, (batch_size, predictions)), jnp.int32),
    )
    start = time.perf_counter()  # compiled once: the run below and XLA's FLOPs count are the same program
    forward = jax.jit(lambda p, b: model.apply({"params": p}, **b)).lower(params, batch).compile()
    out = jax.block_until_ready(forward(params, batch))
    compiled = time.perf_counter() - start
    start = time.perf_counter()
    out = jax.block_until_ready(forward(params, batch))
    print(
        f"forward pass on {jax.devices()[0].platform}, batch {batch_size}×{seq_len}: "
        f"compile+run {compiled:.2f}s, run {time.perf_counter() - start:.3f}s"
    )
    # The formula against the compiled program: XLA also counts elementwise work (softmax, norms, activations),
    # and an xla kernel computes the scores a sliding window masks, which splash skips.
    counted = forward.cost_analysis()
    counted = (counted[0] if isinstance(counted, (list, tuple)) else counted or {}).get("flops")
    formula = batch_size * metrics_lib.flops_per_sequence(cfg, seq_len, predictions, training=False)
    if counted:
        print(
            f"  forward GFLOPs of this batch: {formula / 1e9:,.2f} by the formula, {counted / 1e9:,.2f} by XLA's "
            f"count of the compiled program (formula/XLA {formula / counted:.3f})"
        )
    for field in ("mlm_logits", "nsp_logits", "sequence_output", "pooled_output"):
        value = getattr(out, field, None)
        if value is not None:
            print(
                f"  {field:<16} {str(value.shape):<18} mean {float(jnp.mean(value)):+.4f} "
                f"std {float(jnp.std(value)):.4f}"
            )
    if getattr(out, "nsp_logits", None) is not None:
        probs = jax.nn.softmax(out.nsp_logits)
        print("  untrained NSP P(is next) =", ", ".join(f"{p:.3f}" for p in np.asarray(probs[:, 0])))
