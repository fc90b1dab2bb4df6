"""The GLUE suite: `python -m bertjax.glue --config=configs/glue.py --workdir=DIR --config.init_from=PATH
--config.data_dir=GLUE_DIR [--config.tasks=cola,sst2,mrpc,stsb,qqp,mnli,qnli,rte,wnli]`.

Defaults are the BERT paper's (Devlin et al. 2019, §4.1): batch 32, 3 epochs, the learning rate chosen per
task on dev among 5e-5, 4e-5, 3e-5, 2e-5; several restarts on the small tasks, the best run on dev kept (and
the spread over seeds reported). Every fine-tuning setting keeps configs/finetune.py's name and applies to
every task (`--config.train.num_epochs`, `--config.train.global_batch_size`, `--config.data.max_seq_length`,
`--config.sweep.learning_rate`, `--config.sweep.seeds`); `--config.per_task` changes one task's.

DIR/glue.json and DIR/glue.md hold the scores, DIR/submission/ the GLUE server's files, DIR/TASK/RUN/ each
run's fine-tuning workdir. The same command after a kill skips finished runs and resumes the unfinished one.
Argument: `configs/glue.py:size=tiny` picks the architecture of a random initialisation (init_from empty).
"""

import pathlib
import runpy

import ml_collections

_finetune = runpy.run_path(str(pathlib.Path(__file__).with_name("finetune.py")))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = _finetune["get_config"](arg)
    c.init_from = ""  # bertjax workdir, Hugging Face directory or google-research/bert TF1 directory
    c.data_dir = ""  # download_glue_data.py's folders (CoLA/, ..., MNLI/, diagnostic/), or tfds[:TFDS_DATA_DIR]
    c.tasks = "cola,sst2,mrpc,stsb,qqp,mnli,qnli,rte,wnli"  # any of them, any order (AX comes with mnli)
    c.sweep.learning_rate = "5e-5,4e-5,3e-5,2e-5"  # the paper's grid; the best on dev is kept per task
    c.sweep.seeds = "0"  # every task's seeds (the paper: one run, restarts for the small tasks)
    c.small_tasks = "cola,mrpc,stsb,rte,wnli"  # the small tasks, where BERT's dev scores vary by points per seed
    c.small_task_seeds = "0,1,2,3,4"  # their restarts ("" = config.sweep.seeds)
    c.from_mnli = ""  # e.g. "rte,mrpc,stsb": these start from the best MNLI run (RoBERTa's, ModernBERT's practice)
    c.per_task = ""  # one task's settings, e.g. "rte.train.num_epochs=4; mnli.sweep.seeds=0,1"
    c.submission = True  # predict the test sets (and AX with MNLI's run) into DIR/submission/; needs test files
    c.skip_ragged_rows = False  # skip (and count) rows with a wrong number of fields instead of stopping
    # Chosen by the suite for each task, from the data: not settings here.
    del c.task, c.train.init_from, c.data.train_file, c.data.eval_file, c.data.regression
    for qa_only in (
        "doc_stride",
        "max_query_length",
        "max_answer_length",
        "n_best_size",
        "version_2_with_negative",
        "null_score_diff_threshold",
    ):
        del c.data[qa_only]
    c.eval.every_steps = 100_000  # dev scores at the end of each run (what the choice reads)
    return c
