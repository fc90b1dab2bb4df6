"""Every bertjax setting, commented, grouped by section. Other config files start from this one.

Argument (after the colon): comma-separated `key=value`, a bare name meaning `name=true`, e.g.
`configs/default.py:size=base,phase=2,runlocal`. Unknown names and ill-typed values are errors.
  size      model size: tiny, mini, small, medium, base, large (default base); the size files
            (configs/large.py, …) fix it and take the other arguments
  phase     1 (seq 128, 90% of the steps) or 2 (seq 512, 80 predictions, the last 10%), as in the paper
  init_from weights to start from: phase 2 needs phase 1's workdir, e.g.
            `configs/large.py:phase=2,init_from=/ckpt/large-phase1`
  runlocal  shrink batch and steps so the job runs on a laptop CPU in a minute (runlocal=false: off)

The schema (types, checks) is bertjax/config/schema.py; its defaults equal this file's for size=base.
"""

import ml_collections

from bertjax.config import schema as config_lib
from bertjax.models.bert import config as architecture

SIZE_ARGS = dict(phase=1, init_from="", runlocal=False)  # what configs/<size>.py take


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return make(**vars(config_lib.parse_arg(arg, size="base", **SIZE_ARGS)))


def for_size(size: str, arg: str | None) -> ml_collections.ConfigDict:
    """configs/<size>.py: this file with the size fixed."""
    return make(size=size, **vars(config_lib.parse_arg(arg, **SIZE_ARGS)))


def make(size: str, phase: int, init_from: str, runlocal: bool) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0  # seeds parameter init, dropout and data order

    # --- model: bert_config.json fields plus implementation choices that keep fp32 numerics identical.
    arch = architecture.config_for_size(size)
    c.model = ml_collections.ConfigDict()
    c.model.size = size  # the name the fields below came from; informative only
    c.model.vocab_size = 0  # 0 = the records' size (metadata.json) or vocab_file's; else must equal both
    c.model.hidden_size = arch.hidden_size  # width of embeddings and every layer
    c.model.num_hidden_layers = arch.num_hidden_layers  # transformer layers
    c.model.num_attention_heads = arch.num_attention_heads  # must divide hidden_size
    c.model.intermediate_size = arch.intermediate_size  # feed-forward width, 4 × hidden in BERT
    c.model.hidden_act = arch.hidden_act  # gelu = exact erf GELU, as BERT
    c.model.hidden_dropout_prob = arch.hidden_dropout_prob  # dropout on embeddings and sub-layer outputs
    c.model.attention_probs_dropout_prob = arch.attention_probs_dropout_prob  # dropout on attention weights
    c.model.max_position_embeddings = arch.max_position_embeddings  # longest sequence the model can take
    c.model.type_vocab_size = arch.type_vocab_size  # segment ids: 2 for sentence A/B
    c.model.initializer_range = arch.initializer_range  # std of the truncated-normal init
    c.model.layer_norm_eps = arch.layer_norm_eps  # LayerNorm epsilon, 1e-12 as in BERT
    c.model.dtype = "float32"  # compute dtype: float32 or bfloat16 (params, softmax and loss stay float32)
    c.model.scan_layers = True  # nn.scan over layers: compile one layer, not num_hidden_layers of them (BERT's)
    c.model.remat_policy = "none"  # none | full | dots | dots_no_batch: what a layer keeps for backprop
    # Fused kernels (splash, cudnn) have no attention dropout: they need attention_probs_dropout_prob=0, and
    # auto keeps xla while it is > 0. The params are the same whichever computes them.
    c.model.attention = "auto"  # xla (any backend) | splash (Pallas TPU kernel) | cudnn (GPU) | auto (the best one)
    # The encoder family: bert, or modernbert (configs/modernbert.py sets the fields below, transformers' names;
    # BERT ignores them).
    c.model.family = "bert"  # bert | modernbert
    c.model.local_attention = 128  # ModernBERT: the sliding window, local_attention // 2 tokens each side
    c.model.global_attn_every_n_layers = 3  # layers 0, n, 2n, ... attend globally, the others in the window
    c.model.global_rope_theta = 160_000.0  # RoPE base of the global layers
    c.model.local_rope_theta = 10_000.0  # RoPE base of the sliding-window layers
    c.model.classifier_pooling = "cls"  # fine-tuning's sequence pooling: cls (first token) or mean
    c.model.pad_token_id = -1  # -1: the vocab's [PAD], [CLS], [SEP] (the job reads them from the vocab)
    c.model.cls_token_id = -1  # see pad_token_id
    c.model.sep_token_id = -1  # see pad_token_id

    # --- data: pre-masked TFRecords made by `python -m bertjax.prepare` (or google-research/bert).
    c.data = ml_collections.ConfigDict()
    c.data.train_files = ""  # glob or comma list of training record shards
    c.data.eval_files = ""  # glob or comma list of held-out record shards ("" = no eval)
    c.data.vocab_file = ""  # vocab.txt / .model the records were made with (for export and the demo)
    c.data.do_lower_case = True  # casing the records were made with (written into the export)
    c.data.max_seq_length = 128  # must equal the records' max_seq_length
    c.data.max_predictions_per_seq = 20  # must equal the records' max_predictions_per_seq
    c.data.next_sentence_prediction = True  # False for MLM-only records (prepare --no_nsp)
    c.data.shuffle_buffer = 10_000  # records held for shuffling, per process
    c.data.dynamic_masking = False  # re-mask every epoch instead of using the stored masks
    # A damaged record file (truncated, a bad CRC, not a record file) stops the job, naming it and the byte.
    c.data.skip_damaged_records = False  # instead check every file at start (~200 MB/s), read each up to its first damage, count the loss
    c.data.verify_checksums = False  # read every shard at start and compare its CRC32C with metadata.json's
    # Packing: several instances per row (records made with `prepare --packing`; the corpus stage packs its own).
    c.data.packing = False  # rows of up to max_instances_per_row instances: no compute spent on padding
    c.data.max_instances_per_row = 3  # must equal the packed records' (NVIDIA's MLPerf BERT packs up to 3)
    c.data.max_predictions_per_row = 0  # a packed row's prediction slots (0 = max_predictions_per_seq + max_instances_per_row)
    # Corpus stage: with a corpus set, the job makes its own vocab and records in workdir/data first
    # (train_files / eval_files / vocab_file are then filled in), reusing them when it resumes.
    c.data.corpus = ""  # builtin:pydocs, raw-text / .parquet / .jsonl[.gz|.zst] files (glob), hf:DIR[:SPLIT], tfds:NAME[:SPLIT] ("" = off)
    c.data.tfds_data_dir = ""  # TFDS data_dir for tfds: corpora ("" = TFDS's default)
    c.data.text_field = "text"  # the Parquet column / JSON key / TFDS feature holding each document's text; meta.text: inside a struct
    c.data.tfds_text_feature = "text"  # deprecated alias of text_field (used, with a warning, if text_field is "text")
    c.data.skip_bad_json_lines = False  # JSON lines that do not parse: skipped and counted instead of stopping the job
    c.data.heldout_every = 20  # every N-th document goes to the held-out records, never to training
    c.data.corpus_vocab_size = 8192  # WordPiece vocab trained on the train documents (if vocab_file is "")
    c.data.dupe_factor = 10  # passes over the train documents, each with different masks
    c.data.heldout_dupe_factor = 1  # passes over the held-out documents (more = a steadier eval)
    c.data.masked_lm_prob = 0.15  # share of tokens masked
    c.data.eval_masked_lm_prob = 0.0  # the held-out records' share, when the corpus stage makes them (0 = the same)
    c.data.short_seq_prob = 0.1  # probability of a shorter target length
    c.data.do_whole_word_mask = False  # mask whole words
    c.data.num_shards = 8  # train record shards
    c.data.num_workers = 0  # prepare worker processes (0 = one per core)

    # --- train
    c.train = ml_collections.ConfigDict()
    c.train.global_batch_size = 256  # sequences per optimizer step, over all processes
    c.train.micro_batches = 1  # gradient accumulation: split each step's batch into this many parts
    c.train.num_train_steps = 900_000  # optimizer steps in this phase (phase 2: 100_000)
    c.train.log_every_steps = 100  # steps between metric lines in the log, TensorBoard and metrics.jsonl
    c.train.init_from = init_from  # weights only: an HF directory or a bertjax workdir
    c.train.batch_warmup_tokens = 0  # grow the global batch over this many tokens (rows × seq length); 0 = off
    c.train.batch_warmup_start = 0  # ... from this many rows, a whole number of micro-batches
    c.train.branch_from = ""  # WORKDIR or WORKDIR/STEP: go on from that run's whole state (a decay branch, say)
    c.train.phase = phase  # 2 refuses to start without init_from (phase 1's weights)
    c.train.profile_steps = 0  # trace this many steps after warm-up into workdir/plugins/profile (0 = off)
    # A step whose loss or gradients are NaN/Inf is never applied (params and optimizer state stay as they were).
    c.train.on_nonfinite = "skip"  # skip: go on with the next batch (counted in the log and metrics) | stop at once
    c.train.max_consecutive_nonfinite = 10  # with skip: stop when this many steps in a row are not finite

    # --- optim
    c.optim = ml_collections.ConfigDict()
    c.optim.name = "adamw"  # adamw (BERT's) or lamb
    c.optim.learning_rate = 1e-4  # peak learning rate, reached at the end of warmup
    c.optim.warmup_steps = 10_000  # linear warmup from 0
    c.optim.schedule = "linear"  # after warmup: linear | cosine to 0 at num_train_steps | wsd | constant
    c.optim.decay_shape = "linear"  # wsd: linear | 1-sqrt over the decay phase
    c.optim.decay_steps = 0  # wsd: the decay phase's length, at the end of the run (the peak until then)
    c.optim.weight_decay = 0.01  # decoupled; never on LayerNorm parameters or biases
    c.optim.b1 = 0.9  # Adam β1
    c.optim.b2 = 0.999  # Adam β2
    c.optim.eps = 1e-6  # Adam ε, as in BERT
    c.optim.max_grad_norm = 1.0  # global-norm clipping (0 = off)

    # --- mesh: device axes; one of them -1 takes the remaining devices.
    c.mesh = ml_collections.ConfigDict()
    c.mesh.shape = (-1, 1, 1)  # (data, fsdp, tensor)
    c.mesh.logical_axis_rules = (  # logical axis name → mesh axis (or None = replicated)
        ("batch", ("data", "fsdp")),
        ("embed", "fsdp"),
        ("vocab", "tensor"),
        ("heads", "tensor"),
        ("mlp", "tensor"),
        ("kv", None),
        ("length", None),
        ("layers", None),
    )

    # --- checkpoint
    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.every_steps = 10_000  # steps between saves (and always at the end)
    c.checkpoint.keep = 3  # most recent checkpoints kept
    c.checkpoint.keep_every = 100_000  # also keep every checkpoint whose step is a multiple of this (0 = none)
    c.checkpoint.export_hf = False  # at the end, also write workdir/hf: a Hugging Face BertForPreTraining directory
    # A step that does not restore is moved aside to checkpoints/damaged-STEP and the one before it resumes.
    c.checkpoint.start_over_if_damaged = False  # when no step restores: move all aside and start over (else stop)

    # --- eval
    c.eval = ml_collections.ConfigDict()
    c.eval.every_steps = 10_000  # steps between held-out evaluations (and always at the end)
    c.eval.num_batches = 100  # batches per evaluation (0 = the whole eval set once)
    c.eval.show_predictions = 0  # at the end, print top-5 guesses for the masks of this many held-out sequences
    c.eval.not_learning_after = 0.25  # from this share of the run on, warn once if held-out MLM is flat (0 = never)

    if c.train.phase == 2:
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
