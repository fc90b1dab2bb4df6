"""Prints a model's size, memory and cost, then runs one real forward pass.

    python -m bertjax.summary --config=configs/large.py [--batch_size=2]

Use it before launching a job: it builds the model exactly as training will (same config section),
initialises its parameters, and checks that a batch of the configured shape goes through.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from ml_collections import config_flags

from bertjax import metrics as metrics_lib
from bertjax import model as model_lib
from bertjax.config import JobConfig

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Defined only when run as a program, so that importing this module defines no flags."""
    config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/tiny.py.", lock_config=True)
    flags.DEFINE_integer("batch_size", 2, "Sequences in the forward pass.")
    flags.mark_flag_as_required("config")


def module_param_counts(params: dict) -> list[tuple[str, int]]:
    """Parameter count per module, encoder layers folded into one row."""
    params = model_lib.unstack_layers(params)
    encoder = params["bert"]["encoder"]
    rows = [("bert/embeddings", model_lib.param_count(params["bert"]["embeddings"])),
            (f"bert/encoder ({len(encoder)} layers × {model_lib.param_count(encoder['layer_0']):,})",
             model_lib.param_count(encoder)),
            ("bert/pooler", model_lib.param_count(params["bert"]["pooler"]))]
    heads = {k: v for k, v in params.items() if k != "bert"}
    rows.append(("heads (mlm transform + bias, nsp; decoder tied)", model_lib.param_count(heads)))
    return rows


def main(argv):
    del argv
    config = JobConfig.from_configdict(FLAGS.config)
    batch_size = FLAGS.batch_size
    model = model_lib.from_config(config.model)
    seq_len, predictions = config.data.max_seq_length, config.data.max_predictions_per_seq
    params = jax.jit(lambda rng: model_lib.init_params(model, rng))(jax.random.PRNGKey(config.seed))
    total = model_lib.param_count(params)
    print(f"model {config.model.size}: {model.config}")
    for name, count in module_param_counts(params):
        print(f"  {name:<58} {count:>13,}")
    print(f"  {'total':<58} {total:>13,}")
    print(f"  fp32 params {total * 4 / 2**20:,.1f} MiB; with AdamW state {total * 12 / 2**20:,.1f} MiB")
    cfg = model.config
    flops = metrics_lib.flops_per_sequence(cfg, seq_len, predictions)  # the count the job's MFU uses
    print(f"  {flops / 1e9:,.1f} model GFLOPs per training sequence of {seq_len} tokens "
          f"({predictions} masked predictions)")

    rng = np.random.default_rng(config.seed)
    batch = dict(
        input_ids=jnp.asarray(rng.integers(0, cfg.vocab_size, (batch_size, seq_len)), jnp.int32),
        segment_ids=jnp.asarray(np.repeat([[0] * (seq_len // 2) + [1] * (seq_len - seq_len // 2)], batch_size, 0)),
        input_mask=jnp.ones((batch_size, seq_len), jnp.int32),
        masked_lm_positions=jnp.asarray(rng.integers(0, seq_len, (batch_size, predictions)), jnp.int32))
    forward = jax.jit(lambda p, b: model.apply({"params": p}, **b))
    start = time.perf_counter()
    out = jax.block_until_ready(forward(params, batch))
    compiled = time.perf_counter() - start
    start = time.perf_counter()
    out = jax.block_until_ready(forward(params, batch))
    print(f"forward pass on {jax.devices()[0].platform}, batch {batch_size}×{seq_len}: "
          f"compile+run {compiled:.2f}s, run {time.perf_counter() - start:.3f}s")
    for field in ("mlm_logits", "nsp_logits", "sequence_output", "pooled_output"):
        value = getattr(out, field)
        print(f"  {field:<16} {str(value.shape):<18} mean {float(jnp.mean(value)):+.4f} std {float(jnp.std(value)):.4f}")
    probs = jax.nn.softmax(out.nsp_logits)
    print("  untrained NSP P(is next) =", ", ".join(f"{p:.3f}" for p in np.asarray(probs[:, 0])))


if __name__ == "__main__":
    define_flags()
    app.run(main)
