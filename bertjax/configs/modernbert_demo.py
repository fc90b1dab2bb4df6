"""The demo job with today's recipe: a ModernBERT of the demo's size, trained the way ModernBERT is.

    python -m bertjax.main --config=configs/modernbert_demo.py --workdir=workdir/modern_demo

configs/demo.py is 2018's recipe at a size a 2-core CPU trains in minutes; this file keeps its corpus
(`builtin:pydocs`, 4k WordPiece pieces, the same held-out documents), its sequence length, batch and peak
learning rate, and changes what the modern recipe changes:
  - the ModernBERT family (pre-normalised, bias-free, rotary positions, GeGLU, a sliding window in two
    layers of three), 3 layers × 128 so that it has about the demo BERT's parameters (963,584 against 967,170);
  - MLM only, 30% of the tokens masked in training, re-masked every batch (dynamic masking), held-out
    records masked at 15% as the demo's are; no next-sentence pairs, packed rows, no dropout;
  - warmup-stable-decay: the peak rate held, then a 1-sqrt decay over the last fifth of the steps;
  - batch-size warmup: 8 rows a step at first, growing to 32 over the first tenth of the tokens.
`benchmarks/recipes.py` trains both for the same wall-clock time and compares their held-out MLM accuracy
and fine-tuned scores (docs/pretraining.md#the-modern-recipe-against-2018s).

Argument: `configs/modernbert_demo.py:quick` trains a tenth as long (a smoke test).
"""

import pathlib
import runpy

from bertjax.config import schema as config_lib

_here = pathlib.Path(__file__).parent
_demo = runpy.run_path(str(_here / "demo.py"))
_modernbert = runpy.run_path(str(_here / "modernbert.py"))

DECAY_FRACTION = 0.2  # of num_train_steps; benchmarks/recipes.py keeps it when it changes the steps
WARMUP_FRACTION = 0.1  # of the run's tokens, for the batch-size warmup


def get_config(arg: str | None = None):
    args = config_lib.parse_arg(arg, quick=False)
    demo = _demo["get_config"]("quick" if args.quick else None)
    c = _modernbert["get_config"]("size=tiny")
    c.model.size = "modernbert-demo"
    c.model.update(
        num_hidden_layers=3,
        hidden_size=128,
        intermediate_size=192,
        num_attention_heads=2,
        local_attention=32,
        max_position_embeddings=demo.data.max_seq_length,
    )
    # The demo's corpus, split, vocab size and shards; the modern recipe's masking and packing.
    seq = demo.data.max_seq_length
    c.data.update(
        {
            k: demo.data[k]
            for k in (
                "corpus",
                "corpus_vocab_size",
                "max_seq_length",
                "dupe_factor",
                "heldout_every",
                "heldout_dupe_factor",
                "num_shards",
            )
        }
    )
    c.data.update(
        masked_lm_prob=0.3, eval_masked_lm_prob=0.15, max_predictions_per_seq=int(seq * 0.3) + 1, dynamic_masking=True
    )
    c.train.update(
        global_batch_size=demo.train.global_batch_size,
        num_train_steps=demo.train.num_train_steps,
        log_every_steps=demo.train.log_every_steps,
        micro_batches=4,
        batch_warmup_start=8,
    )
    c.train.batch_warmup_tokens = int(WARMUP_FRACTION * c.train.num_train_steps * c.train.global_batch_size * seq)
    c.optim.update(
        learning_rate=demo.optim.learning_rate,
        warmup_steps=demo.optim.warmup_steps,
        schedule="wsd",
        decay_shape="1-sqrt",
        decay_steps=int(DECAY_FRACTION * c.train.num_train_steps),
    )
    c.checkpoint = demo.checkpoint
    c.eval = demo.eval
    return c
