"""ModernBERT (Warner et al. 2024): pre-normalised, bias-free, rotary positions, GeGLU, a 128-token sliding
window in two layers of three; MLM only (no NSP head, no segment embeddings), packed rows, no dropout.

    python -m bertjax.main --config=configs/modernbert.py:size=tiny --workdir=DIR --config.data.corpus=builtin:pydocs

    python -m bertjax.main --config=configs/modernbert.py:size=base,phase=2,init_from=RUN1 --workdir=RUN2 ...

Argument (after the colon): comma-separated `key=value`:
  size      tiny (4 × 128, window 64: runs on a CPU), base (22 × 768, intermediate 1152, 12 heads) or
            large (28 × 1024, intermediate 2624, 16 heads); the vocab size is the tokenizer's
  phase     1: seq 1,024 (tiny: 128), both RoPE bases 10,000, the peak learning rate held after warmup;
            2: context extension from phase 1's weights, seq 8,192 (tiny: 512), the global layers' RoPE base
            160,000, a batch of as many tokens as phase 1's, its own warmup, then warmup-stable-decay with a
            1-sqrt decay over the last sixth of the steps (the paper's 50B of 300B tokens)
  init_from weights to start from (a bertjax ModernBERT workdir or a transformers ModernBERT directory);
            phase 2 needs phase 1's
  runlocal  shrink batch and steps so the job runs on a laptop CPU in a minute

The paper's recipe for base and large: 30% masking, AdamW (the paper's StableAdamW is AdamW with per-parameter
clipping) at its peak rates, weight decay 1e-5, β2 0.98. Every other setting is configs/default.py's and can be
overridden the same way (`--config.model.attention=splash`, `--config.optim.decay_steps=...`).
"""

import pathlib
import runpy

from bertjax.config import schema as config_lib

_default = runpy.run_path(str(pathlib.Path(__file__).with_name("default.py")))

# size: (layers, hidden, intermediate, heads, local_attention, seq, global batch, peak lr)
SIZES = {
    "tiny": (4, 128, 192, 2, 64, 128, 32, 1e-3),
    "base": (22, 768, 1152, 12, 128, 1024, 4608, 8e-4),
    "large": (28, 1024, 2624, 16, 128, 1024, 4928, 5e-4),
}
# Phase 2 (context extension), size: (seq, peak lr, steps). The batch holds phase 1's tokens; base and large
# train 300B tokens: 63,578 steps of 576 × 8,192 and 59,447 of 616 × 8,192.
PHASE2 = {"tiny": (512, 5e-4, 2_000), "base": (8192, 3e-4, 63_578), "large": (8192, 5e-5, 59_447)}
ROPE_THETA = {1: 10_000.0, 2: 160_000.0}  # the global layers'; the local ones keep 10,000


def get_config(arg: str | None = None):
    args = config_lib.parse_arg(arg, size="base", phase=1, init_from="", runlocal=False)
    if args.size not in SIZES:
        raise ValueError(f"config argument size={args.size!r} is not one of {list(SIZES)} (configs/modernbert.py).")
    if args.phase not in ROPE_THETA:
        raise ValueError(f"config argument phase={args.phase!r} is not 1 or 2 (configs/modernbert.py).")
    layers, hidden, intermediate, heads, window, seq, batch, lr = SIZES[args.size]
    c = _default["make"](size="base", phase=1, init_from=args.init_from, runlocal=args.runlocal)
    c.train.phase = args.phase  # 2 refuses to start without init_from
    c.model.size = f"modernbert-{args.size}"
    c.model.update(
        family="modernbert",
        num_hidden_layers=layers,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_attention_heads=heads,
        local_attention=window,
        hidden_act="gelu",
        layer_norm_eps=1e-5,
        max_position_embeddings=8192,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        global_rope_theta=ROPE_THETA[args.phase],
        local_rope_theta=10_000.0,
        global_attn_every_n_layers=3,
        scan_layers=False,
    )  # the layers alternate kinds: a loop, not nn.scan
    c.data.update(
        next_sentence_prediction=False,
        masked_lm_prob=0.3,
        eval_masked_lm_prob=0.15,
        max_seq_length=seq,
        max_predictions_per_seq=int(seq * 0.3) + 1,
        packing=True,
        short_seq_prob=0.0,
    )
    c.optim.update(learning_rate=lr, weight_decay=1e-5, b2=0.98, schedule="constant")
    steps, warmup = (360_000 if args.size != "tiny" else 10_000), 3000  # base: ~1.7T tokens at seq 1,024
    if args.phase == 2:
        long_seq, lr, steps = PHASE2[args.size]
        batch, warmup = batch * seq // long_seq, 300
        c.data.update(max_seq_length=long_seq, max_predictions_per_seq=int(long_seq * 0.3) + 1)
        c.optim.update(learning_rate=lr, schedule="wsd", decay_shape="1-sqrt")
        c.optim.decay_steps = steps // 6
    if not args.runlocal:
        c.optim.warmup_steps = warmup
        c.train.global_batch_size = batch
        c.train.num_train_steps = steps
    elif args.phase == 2:
        c.optim.decay_steps = 5  # of runlocal's 20 steps
    return c
