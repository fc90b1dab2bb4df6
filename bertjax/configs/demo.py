"""The `make demo` job: pre-train a small BERT from nothing but the machine's own Python docstrings.

    python -m bertjax.main --config=configs/demo.py --workdir=workdir/demo

The job trains a WordPiece vocab on `builtin:pydocs`, prepares train and held-out records (held-out
documents are never trained on), trains, evaluates against the held-out baselines, saves a checkpoint,
exports a Hugging Face directory to workdir/demo/hf and prints top-5 guesses for held-out masks. It trains
2,000 steps, which leaves `make demo` room for its fine-tuning stage (configs/demo_finetune.py) in 10
minutes: on a slow 2-core CPU (AMD EPYC, AVX2; ~200–260 seq/s when nothing else runs) that is 4–5.5
minutes of training plus about a minute of data, compilation, evals and export (estimated from seq/s;
measured while other jobs loaded that machine: 8.8 minutes at 130–160 seq/s, 12.5 at ~100 seq/s — the
log's ETA says which case you are in); about 1.5 minutes on a fast one (~865 seq/s). The settings were
tuned on 4,000-step runs (the demo's length before it had a fine-tuning stage), with 26 modules held out
(heldout_every=20). A naive BERT-tiny (vocab 30k, seq 128, lr 1e-4, 10k warmup) stays at the baseline for
its first thousand steps there; what makes this one learn visibly in minutes:
  - a small vocab trained on the corpus (4k pieces): a cheaper softmax and less sparse targets;
  - short sequences (64 tokens) and a small batch (32): many optimizer steps per minute, which is what
    gets a fresh BERT off the unigram plateau (batch 128 at the same tokens/s sat there for 550 steps);
  - a high peak learning rate (1e-3; small models tolerate it) after a short warmup. BERT's dropout
    (0.1) stays: on a corpus this small it keeps held-out NSP accuracy from sliding back as the model
    memorises training pairs (without it: 63% at step 2000, 60% at 3000; with it: 61%, 65%).
Tried on the slow machine and left out (2,000-step runs, held-out MLM / NSP at the end): lr 2e-3 never
leaves the baseline (lr 1e-3: 15.3% / 62.3%); dropout 0 gains a point of MLM (16.3%) and no NSP, and loses
NSP later on; batch 16 for twice the steps, 4 heads, or seq 128 learn no faster per sequence; a
feed-forward width of 256 runs ~20% more sequences/s (~310 against ~260) but ends at 15.4% / 58.5%. NSP is
what takes the steps: it leaves its baseline only after ~1,000 steps, and this schedule cut to 3,000 steps
ended at MLM 17.0% (3.0× its baseline) but held-out NSP 61.2% (+6.3; training NSP 69.7%; another
3,000-step run reached 65.2%, +10.2: the ~1,000 held-out pairs vary by a point or two); at 2,000 steps MLM
15.9% and NSP 60.0% (+5). With 52 modules held out (heldout_every=10, which the fine-tuning stage needs
for a dev set of ~290 passages) two 2,000-step demo runs ended at held-out MLM 14.8% and 15.7% (2.9× and
3.0× their baselines) and NSP 55.2% (+1.8) and 58.9% (+7.0; training NSP 66–69%): NSP has only begun to
leave its baseline when the demo stops, and the fine-tuning stage is where the pre-trained body shows (dev
accuracy 55–59% against 22–40% from random initialisation). Faster steps were not found: 1 layer runs
1.65× faster but leaves NSP at its baseline; vocab 1k or 2k, fewer predictions per sequence, XLA CPU flags
(YNNPACK off, oneDNN, XNNPACK, fast-math) and bf16 compute all ran within the ±25% run-to-run noise of the
slow machine.

Point it at your own text with `--config.data.corpus='my/*.txt'` (BERT's raw-text format: one sentence
per line, a blank line between documents) or a TFDS dataset with `--config.data.corpus=tfds:NAME:SPLIT`.
Argument: `configs/demo.py:quick` trains a tenth as long (a smoke test).
"""

import pathlib
import runpy

from bertjax.config import schema as config_lib

_default = runpy.run_path(str(pathlib.Path(__file__).with_name("default.py")))


def get_config(arg: str | None = None):
    args = config_lib.parse_arg(arg, quick=False)
    c = _default["for_size"]("tiny", None)
    c.model.size = "demo"
    c.model.update(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512, max_position_embeddings=64
    )

    c.data.corpus = "builtin:pydocs"
    c.data.corpus_vocab_size = 4096
    c.data.max_seq_length = 64
    c.data.max_predictions_per_seq = 10
    c.data.dupe_factor = 10  # ~75k train sequences: each seen about twice, with fresh NSP pairings
    c.data.heldout_every = 10  # 52 of the 526 modules: also the dev modules of the fine-tuning stage
    c.data.heldout_dupe_factor = 3  # ~2,400 held-out sequences: accuracies steady to about a point
    c.data.num_shards = 4

    c.train.global_batch_size = 32
    c.train.num_train_steps = 2000  # leaves the 10-minute demo time for the fine-tuning stage
    c.train.log_every_steps = 200

    c.optim.learning_rate = 1e-3
    c.optim.warmup_steps = 300

    c.checkpoint.every_steps = 1000
    c.checkpoint.keep = 2
    c.checkpoint.keep_every = 0
    c.checkpoint.export_hf = True

    c.eval.every_steps = 1000
    c.eval.num_batches = 0  # the whole held-out set
    c.eval.show_predictions = 4

    if args.quick:
        c.train.num_train_steps //= 10
        c.optim.warmup_steps //= 10
        c.checkpoint.every_steps //= 10
        c.eval.every_steps //= 10
    return c
