"""Fine-tuning: `python -m bertjax.finetune --config=configs/finetune.py --workdir=DIR`, e.g.

    python -m bertjax.finetune --config=configs/finetune.py --workdir=/tmp/sst2 \\
      --config.task=sequence_classification --config.train.init_from=/ckpt/bert-base \\
      --config.data.train_file=train.tsv --config.data.eval_file=dev.tsv

Defaults are the paper's (Devlin et al. 2019, §4 and appendix A.3): batch 32, 3 epochs, warmup over the
first 10% of the steps, Adam with weight decay 0.01, dropout 0.1, a learning rate among 2e-5…5e-5
(3e-5 here; `--config.sweep.learning_rate=2e-5,3e-5,5e-5 --config.sweep.seeds=0,1,2` tries them all).
The model section's architecture is only used without init_from (a random initialisation, for
comparisons); with init_from the architecture, weights, vocab and casing are the checkpoint's, and
config.model only says how to compute (dtype, scan_layers, remat_policy, attention).

Argument: `configs/finetune.py:size=tiny` picks the architecture for random initialisation.
The schema (types, checks) is bertjax/finetuning/config.py (`FinetuneConfig`).
"""

import pathlib
import runpy

import ml_collections

from bertjax.config import schema as config_lib

_default = runpy.run_path(str(pathlib.Path(__file__).with_name("default.py")))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    args = config_lib.parse_arg(arg, size="base")
    pretraining = _default["make"](size=args.size, phase=1, init_from="", runlocal=False)
    c = ml_collections.ConfigDict()
    c.task = "sequence_classification"  # | token_classification (NER, CoNLL files) | question_answering (SQuAD)
    c.seed = 0  # seeds the new head, dropout and the data order
    c.model = pretraining.model  # how to compute; the architecture only matters without init_from
    c.mesh = pretraining.mesh  # (data, fsdp, tensor), as pre-training

    # --- data: labelled examples; labels map to ids in one sorted order, saved with the checkpoint.
    c.data = ml_collections.ConfigDict()
    c.data.train_file = ""  # path or glob: .tsv/.csv with a header (text or text_a[,text_b], label), .jsonl with
    #                         those keys; CoNLL files (token_classification); SQuAD JSON; or tfds:NAME:SPLIT[:DATA_DIR]
    c.data.eval_file = ""  # the held-out split, same format ("" = no eval)
    c.data.max_seq_length = 128  # tokens per row with [CLS]/[SEP]; longer inputs are truncated (counted in the log)
    c.data.vocab_file = ""  # "" = the vocab that comes with train.init_from (vocab.txt of its directory or run)
    c.data.do_lower_case = True  # with an explicit vocab_file only; otherwise init_from's casing
    c.data.regression = False  # sequence_classification with one float label (STS-B style): MSE, Pearson/Spearman
    c.data.doc_stride = 128  # question_answering: a long context is read in windows this many tokens apart
    c.data.max_query_length = 64  # question_answering: longer questions are truncated
    c.data.max_answer_length = 30  # question_answering: longest answer span, in tokens
    c.data.n_best_size = 20  # question_answering: start and end candidates considered per window
    c.data.version_2_with_negative = False  # SQuAD 2.0: predict "no answer" when [CLS] scores higher
    c.data.null_score_diff_threshold = 0.0  # SQuAD 2.0: no answer when null score − best span score exceeds this
    # Packing (classification tasks): each step's examples share rows instead of each padding its own, so no
    # compute goes to padding; the same examples per step, so the same loss, gradients and schedule.
    c.data.packing = True  # question_answering keeps its windows (one per row)
    c.data.max_instances_per_row = 0  # examples a packed row holds at most (0 = as many as fit)
    # Retrieval (config.task=retrieval; configs/retrieval.py sets them): contrastive pairs, one embedding a text.
    c.data.hard_negatives = -1  # a pair's hard negatives: -1 = as many as the first row gives
    c.data.pooling = "mean"  # mean | cls
    c.data.normalize = True  # unit-length embeddings
    c.data.similarity_scale = 20.0  # sentence-transformers' MultipleNegativesRankingLoss scale
    c.data.symmetric_loss = False  # also rank each positive's query among the batch's queries
    c.data.matryoshka_dims = ""  # e.g. "256,128": the loss on truncated embeddings too
    c.data.eval_dir = ""  # a BEIR directory (corpus.jsonl, queries.jsonl, qrels/) scored at every eval
    c.data.eval_split = "test"  # its qrels/<split>.tsv

    # --- train
    c.train = ml_collections.ConfigDict()
    c.train.init_from = ""  # bertjax workdir, Hugging Face directory or google-research/bert TF1 directory;
    #                         "" = random initialisation (to measure what pre-training brings)
    c.train.global_batch_size = 32  # examples per step over all processes (the paper: 16 or 32)
    c.train.micro_batches = 1  # gradient accumulation
    c.train.num_epochs = 3.0  # passes over the training set (the paper: 2, 3 or 4)
    c.train.num_train_steps = 0  # > 0 overrides num_epochs
    c.train.warmup_proportion = 0.1  # linear warmup over this share of the steps, then linear decay to 0
    c.train.log_every_steps = 50  # steps between log lines (loss, accuracy, seq/s, ETA) and metrics rows
    c.train.profile_steps = 0  # trace this many steps after warm-up into workdir/plugins/profile (0 = off)
    c.train.on_nonfinite = "skip"  # as pre-training: a NaN/Inf step is never applied (skip and go on | stop)
    c.train.max_consecutive_nonfinite = 10  # with skip: stop when this many steps in a row are not finite

    c.optim = pretraining.optim  # AdamW, weight decay 0.01, clipping 1.0, linear decay, as pre-training
    c.optim.learning_rate = 3e-5  # peak; the paper picks among 5e-5, 4e-5, 3e-5, 2e-5 on dev
    c.optim.warmup_steps = 0  # set by the job from train.warmup_proportion

    c.checkpoint = pretraining.checkpoint  # orbax, as pre-training
    c.checkpoint.every_steps = 1000  # and at the end; a resumed run continues from the latest exactly
    c.checkpoint.keep = 1  # fine-tuning runs are short: the latest checkpoint is enough to resume
    c.checkpoint.keep_every = 0  # no permanent snapshots
    c.eval = pretraining.eval  # held-out cadence
    c.eval.every_steps = 1000  # held-out scores every this many steps, and at the end
    c.eval.num_batches = 0  # 0 = the whole eval set (scores need every prediction)

    # --- sweep: one run per learning rate × seed in workdir/sweep/, best and spread in workdir/sweep.json.
    c.sweep = ml_collections.ConfigDict()
    c.sweep.learning_rate = ""  # e.g. "2e-5,3e-5,5e-5" ("" = optim.learning_rate only)
    c.sweep.seeds = ""  # e.g. "0,1,2" ("" = seed only)
    return c
