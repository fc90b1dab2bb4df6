"""Every bertjax pre-training setting, grouped by section; the other config files start from this one.

The settings, their defaults and what each does are written once, in bertjax/config/schema.py (one frozen
dataclass per section, a comment on every field); this file is those defaults as a ConfigDict, with the
model of the chosen size and the phase's and runlocal's changes.

Argument (after the colon): comma-separated `key=value`, a bare name meaning `name=true`, e.g.
`configs/default.py:size=base,phase=2,runlocal`. Unknown names and ill-typed values are errors.
  size      model size: tiny, mini, small, medium, base, large (default base); the size files
            (configs/large.py, …) fix it and take the other arguments
  phase     1 (seq 128, 90% of the steps) or 2 (seq 512, 80 predictions, the last 10%), as in the paper
  init_from weights to start from: phase 2 needs phase 1's workdir, e.g.
            `configs/large.py:phase=2,init_from=/ckpt/large-phase1`
  runlocal  shrink batch and steps so the job runs on a laptop CPU in a minute (runlocal=false: off)
"""

import dataclasses

import ml_collections

from bertjax import models
from bertjax.config import schema as config_lib

SIZE_ARGS = dict(phase=1, init_from="", runlocal=False)  # what configs/<size>.py take


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return make(**vars(config_lib.parse_arg(arg, size="base", **SIZE_ARGS)))


def for_size(size: str, arg: str | None) -> ml_collections.ConfigDict:
    """configs/<size>.py: this file with the size fixed."""
    return make(size=size, **vars(config_lib.parse_arg(arg, **SIZE_ARGS)))


def make(size: str, phase: int, init_from: str, runlocal: bool) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict(config_lib.JobConfig().to_dict())  # every setting at its default (schema.py)
    arch = models.get(c.model.family).config.config_for_size(size)
    c.model.size = size
    # None (the platform's choice: a loop on GPUs, nn.scan elsewhere), or true/false from a flag or a file.
    c.model.scan_layers = ml_collections.FieldReference(None, field_type=bool)
    # None (the platform's choice: recomputed on CPUs), or true/false: the activation recomputed in the backward.
    c.model.recompute_activation = ml_collections.FieldReference(None, field_type=bool)
    # A rate, or rates by step ('0:0.3;9000:0.15'): a number or a string from a flag or a file.
    c.data.masked_lm_prob = ml_collections.FieldReference(0.15, field_type=object)
    for field in dataclasses.fields(arch):  # the size's architecture; the vocab is the data's (0: unset)
        if field.name != "vocab_size":
            c.model[field.name] = getattr(arch, field.name)
    c.train.init_from = init_from
    c.train.phase = phase
    if phase == 2:
        c.data.max_seq_length = 512
        c.data.max_predictions_per_seq = 80
        c.train.num_train_steps = 100_000
        c.optim.warmup_steps = 1_000  # the optimizer state starts afresh
    if runlocal:
        c.train.global_batch_size = 8
        c.train.num_train_steps = 20
        c.train.log_every_steps = 5
        c.optim.warmup_steps = 5
        c.checkpoint.every_steps = 10
        c.eval.every_steps = 10
        c.eval.num_batches = 2
    return c
