"""`make demo`'s fine-tuning stage: what pre-training brings, measured on a task built from the same offline text.

    python -m bertjax.demo_finetune --config=configs/demo_finetune.py --pretrained=workdir/demo \\
        --workdir=workdir/demo/finetune

The task (bertjax/finetuning/pydocs_task.py): which standard-library package (asyncio, email, idlelib, tkinter, ...)
a docstring passage comes from. Dev passages come from the modules the pre-training run held out (never
trained on), train passages from the others. The same fine-tuning runs twice with these settings — from
the pre-trained checkpoint, and from a random initialisation of the same architecture and vocab — and the
job prints both dev scores beside the majority-class baseline (the commonest dev label).

Measured on the slow 2-core box (12 packages; 287 dev passages from 31 held-out modules; the commonest dev
label is 19.9%): dev accuracy 55.1–59.2% fine-tuned from the 2,000-step demo checkpoint (4 runs: seeds 0, 1,
2 on one checkpoint, seed 0 on another; macro-F1 43–52%) against 22.0–39.7% from random initialisation
(the same seeds; macro-F1 12–20%): the pre-trained model's worst run beats random's best by 15 points, and
the means by 29. At lr 1e-3 random initialisation barely trained (4–17%; pre-trained 43–48%), so both
run at 3e-4. Each run took ~2 minutes while other jobs loaded the box (compilation and set-up ~45 s, the
300 steps at 100–170 passages/s); about half that is expected on an idle one.

Everything but the `demo` section is configs/finetune.py's (a FinetuneConfig, passed to
bertjax.jobs.finetune.finetune as it is); the settings below are sized for the demo's tiny model and a 2-core CPU.
Argument: `configs/demo_finetune.py:quick` runs a few steps (a smoke test, as in the tests).
"""

import pathlib
import runpy

import ml_collections

from bertjax.config import schema as config_lib

_finetune = runpy.run_path(str(pathlib.Path(__file__).with_name("finetune.py")))


def get_config(arg: str | None = None):
    args = config_lib.parse_arg(arg, quick=False)
    c = _finetune["get_config"]("size=tiny")
    c.task = "sequence_classification"  # one label per passage
    c.seed = 0  # seeds the new head, dropout and the data order; demo.seeds overrides it per run

    # --- data: the files are written by the driver; the architecture and vocab are the pre-training run's.
    c.data.max_seq_length = 64  # the pre-training length (the model has 64 positions); passages fit in it
    c.data.train_file = ""  # set by the driver: WORKDIR/task/train.tsv
    c.data.eval_file = ""  # set by the driver: WORKDIR/task/dev.tsv

    # --- train: a few hundred steps, the same for both initialisations.
    c.train.global_batch_size = 32  # passages per step
    c.train.num_train_steps = 300  # > 0: fixed (overrides num_epochs); ~2 epochs of the ~4,800 train passages
    c.train.warmup_proportion = 0.1  # linear warmup over the first 10% of the steps, then linear decay to 0
    c.train.log_every_steps = 100  # a log line (loss, accuracy, ETA) every this many steps
    c.optim.learning_rate = 3e-4  # peak; better than 1e-3 for both initialisations (random init barely trains at 1e-3)

    c.checkpoint.every_steps = 100_000  # only at the end: the demo never resumes a fine-tune
    c.eval.every_steps = 100_000  # held-out scores at the end only (each eval costs a pass over dev)

    # --- demo: the driver's own settings (not passed to bertjax.finetune).
    c.demo = ml_collections.ConfigDict()
    c.demo.min_modules = 8  # a package is a label when it has this many modules (and one held out)
    c.demo.max_words = 25  # a passage: consecutive sentences of one module, up to this many words
    c.demo.seeds = "0"  # comma list: each initialisation is fine-tuned once per seed (mean and spread printed)

    if args.quick:
        c.train.num_train_steps = 6
        c.train.log_every_steps = 3
    return c
