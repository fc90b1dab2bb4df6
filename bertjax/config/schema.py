"""The config's schema: each section of a config as a frozen dataclass, converted once.

`JobConfig.from_configdict(c)` is the boundary between a ConfigDict (config files, `--config.a.b=v`
overrides) and library code: a misspelled or unknown key, a missing key or a value of the wrong type is
one ValueError naming `config.section.key`. Field names are the config file's, so `--config.train.phase`
is `JobConfig.train.phase`. Library code reads these dataclasses and never the ConfigDict.

Every setting is written once, here: its type, its default and (in a comment on its field) what it does.
configs/default.py is `JobConfig()` (BERT-base, phase 1) as a ConfigDict, so `JobConfig()` is the default job.
`parse_arg` gives config files typed, strict arguments (`configs/large.py:phase=2`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

from bertjax import models as models_lib
from bertjax.config.convert import ConfigError, RateOrSchedule, Rules, Sections, bad_value, convert, parse_arg  # noqa: F401  (parse_arg, convert: the configs' and callers' import)
from bertjax.models import options
from bertjax.data.pretraining import instances as instances_lib
from bertjax.data.pretraining import mixture as mixture_lib
from bertjax.data.pretraining import packing as packing_lib

SPECIAL_TOKENS = 5  # [PAD] [UNK] [CLS] [SEP] [MASK]: a trained vocab holds them beside what it learns

OPTIMIZERS = ("adamw", "lamb")
SCHEDULES = ("linear", "cosine", "wsd", "constant")  # config.optim.schedule
DECAY_SHAPES = ("linear", "1-sqrt")  # config.optim.decay_shape: how wsd's decay phase falls to 0
MESH_AXES = ("data", "fsdp", "tensor")  # the device mesh's axes, in order (sharding.py builds the mesh)
NONFINITE_POLICIES = ("skip", "stop")  # what the job does after a step whose loss or gradients are not finite

_BASE = models_lib.get(models_lib.DEFAULT_FAMILY).config.config_for_size("base")  # the sizes' defaults


# --- Sections ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """`config.model`: bert_config.json's fields plus how the model is computed."""

    size: str = "base"  # the name the fields below came from; informative only
    vocab_size: int = 0  # 0 = the records' size (metadata.json) or vocab_file's; else must equal both
    hidden_size: int = _BASE.hidden_size  # width of embeddings and every layer
    num_hidden_layers: int = _BASE.num_hidden_layers  # transformer layers
    num_attention_heads: int = _BASE.num_attention_heads  # must divide hidden_size
    intermediate_size: int = _BASE.intermediate_size  # feed-forward width, 4 × hidden in BERT
    hidden_act: str = _BASE.hidden_act  # gelu = exact erf GELU, as BERT
    hidden_dropout_prob: float = _BASE.hidden_dropout_prob  # dropout on embeddings and sub-layer outputs
    attention_probs_dropout_prob: float = _BASE.attention_probs_dropout_prob  # dropout on attention weights
    max_position_embeddings: int = _BASE.max_position_embeddings  # longest sequence the model can take
    type_vocab_size: int = _BASE.type_vocab_size  # segment ids: 2 for sentence A/B
    initializer_range: float = _BASE.initializer_range  # std of the truncated-normal init
    layer_norm_eps: float = _BASE.layer_norm_eps  # LayerNorm epsilon, 1e-12 as in BERT
    dtype: str = "float32"  # compute dtype: float32 or bfloat16 (params, softmax and loss stay float32)
    # nn.scan over layers (the params stacked on a "layers" axis, a leaf per kind) or a Python loop (a leaf per
    # layer; BERT's, ModernBERT loops). None: the loop on GPUs, where XLA copied a scan loop's stacked weights and
    # gradients and the loop took 0.75x the step (H200, docs/benchmarks.md), nn.scan on TPUs and CPUs.
    scan_layers: Optional[bool] = None
    # Scanned layers per loop iteration; 0: all of them, no loop left (each layer its own code, the params still
    # stacked). Every platform unrolls: XLA:CPU's loop zero-filled and copied the stacked buffers (a fifth of a
    # BERT-Base step), and libtpu needed 21.5 GiB a v5e chip for BERT-Base 128 x 4,096 on 16 with a loop of one
    # layer, 10.0 unrolled (docs/tpu_fit.md). A loop compiles faster (seconds, not minutes, for BERT-Large).
    scan_unroll: int = 0
    remat_policy: str = "none"  # none | full | dots | dots_no_batch: what a layer keeps for backprop
    # The feed-forward activation's backward recomputes it from the matmul's output, so the forward writes only its
    # output (layers.DenseActivation). The same numbers. None: the platform's choice, on for CPUs (steps 1.04-1.3x
    # faster with jax.nn.gelu's erfc), off on GPUs (0.97-0.98x on an H200) and TPUs.
    recompute_activation: Optional[bool] = None
    # Fused kernels (splash, cudnn) have no attention dropout: they need attention_probs_dropout_prob=0, and
    # auto keeps xla while it is > 0. The params are the same whichever computes them.
    attention: str = "auto"  # xla (any backend) | splash (Pallas TPU kernel) | cudnn (GPU) | auto (the best one)
    # ModernBERT's sliding-window layers on xla or cudnn: queries in blocks of this many, each against the keys its
    # window reaches (block + local_attention of them), not every key under a band mask. 0: one attention over the
    # row; -1: the measured choice (blocks of the window on xla once a row holds 6 windows; attention.block_size).
    window_block: int = -1
    # The encoder family: bert, or modernbert (configs/modernbert.py sets the fields below, transformers' names;
    # BERT ignores them).
    family: str = models_lib.DEFAULT_FAMILY  # bert | modernbert
    local_attention: int = 128  # ModernBERT: the sliding window, local_attention // 2 tokens each side
    global_attn_every_n_layers: int = 3  # layers 0, n, 2n, ... attend globally, the others in the window
    global_rope_theta: float = 160_000.0  # RoPE base of the global layers
    local_rope_theta: float = 10_000.0  # RoPE base of the sliding-window layers
    classifier_pooling: str = "cls"  # fine-tuning's sequence pooling: cls (first token) or mean
    pad_token_id: int = -1  # -1: the vocab's [PAD], [CLS], [SEP] (the job reads them from the vocab)
    cls_token_id: int = -1  # see pad_token_id
    sep_token_id: int = -1  # see pad_token_id

    def layer_scan(self, platform: str) -> bool:
        """Whether the layers run under nn.scan on `platform` (cpu, gpu, tpu): scan_layers, or its default."""
        return self.scan_layers if self.scan_layers is not None else platform != "gpu"

    def activation_recompute(self, platform: str) -> bool:
        """Whether the activation is recomputed in the backward on `platform`: recompute_activation, or its default."""
        return self.recompute_activation if self.recompute_activation is not None else platform == "cpu"

    @property
    def architecture(self) -> Any:
        """The model (models/<family>/config.py's dataclass); an unset vocab_size (before the job resolves it,
        or without data) is the family's default."""
        return models_lib.get(self.family).config.from_model_config(self)

    def validate(self) -> None:
        if self.family not in models_lib.FAMILIES:
            raise bad_value("config.model.family", self.family, f"is not one of {list(models_lib.FAMILIES)}.")
        if self.dtype not in options.DTYPE_NAMES:
            raise bad_value("config.model.dtype", self.dtype, f"is not one of {list(options.DTYPE_NAMES)}.")
        if self.attention not in options.ATTENTION_IMPLEMENTATIONS:
            raise bad_value(
                "config.model.attention", self.attention, f"is not one of {list(options.ATTENTION_IMPLEMENTATIONS)}."
            )
        if self.remat_policy not in options.REMAT_POLICY_NAMES:
            raise bad_value(
                "config.model.remat_policy", self.remat_policy, f"is not one of {list(options.REMAT_POLICY_NAMES)}."
            )
        if self.scan_unroll < 0:
            raise bad_value(
                "config.model.scan_unroll", self.scan_unroll, "must be 0 (every layer unrolled) or a count."
            )
        if self.window_block < -1:
            raise bad_value(
                "config.model.window_block", self.window_block, "must be -1 (auto), 0 (off) or a positive block size."
            )
        self.architecture  # noqa: B018  (BertConfig validates the architecture and names the field)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """`config.data`: the records to train on, or the corpus the job makes them from."""

    train_files: str = ""  # glob or comma list of training record shards
    eval_files: str = ""  # glob or comma list of held-out record shards ("" = no eval)
    vocab_file: str = ""  # vocab.txt / .model the records were made with (for export and the demo)
    do_lower_case: bool = True  # casing the records were made with (written into the export)
    # WordPiece accent stripping of the vocab the job trains (None: with do_lower_case, BERT's rule, which merges
    # й into и and が into か; false keeps every script's letters); a given vocab_file's own tokenizer_config.json
    # decides for it
    strip_accents: Optional[bool] = None
    max_seq_length: int = 128  # must equal the records' max_seq_length
    max_predictions_per_seq: int = 20  # must equal the records' max_predictions_per_seq
    next_sentence_prediction: bool = True  # False for MLM-only records (prepare --no_nsp)
    shuffle_buffer: int = 10_000  # records held for shuffling, per process
    dynamic_masking: bool = False  # re-mask every epoch instead of using the stored masks
    # Corpus stage: with a corpus set, the job makes its own vocab and records in workdir/data first
    # (train_files / eval_files / vocab_file are then filled in), reusing them when it resumes.
    # builtin:pydocs, raw-text / .parquet / .jsonl[.gz|.zst] files (glob), hf:DIR[:SPLIT], tfds:NAME[:SPLIT] ("" = off)
    corpus: str = ""
    tfds_data_dir: str = ""  # TFDS data_dir for tfds: corpora ("" = TFDS's default)
    # the Parquet column / JSON key / TFDS feature holding each document's text; meta.text: inside a struct
    text_field: str = "text"
    tfds_text_feature: str = "text"  # deprecated alias of text_field (used, with a warning, if text_field is "text")
    skip_bad_json_lines: bool = False  # JSON lines that do not parse: skipped and counted instead of stopping the job
    heldout_every: int = 20  # every N-th document goes to the held-out records, never to training
    corpus_vocab_size: int = 8192  # WordPiece vocab trained on the train documents (if vocab_file is "")
    dupe_factor: int = 10  # passes over the train documents, each with different masks
    heldout_dupe_factor: int = 1  # passes over the held-out documents (more = a steadier eval)
    # share of tokens masked; or rates from steps on, '0:0.3;9000:0.15;9900:0.05' (with dynamic_masking)
    masked_lm_prob: RateOrSchedule = 0.15
    eval_masked_lm_prob: float = 0.0  # the held-out records' share, when the corpus stage makes them (0 = the same)
    short_seq_prob: float = 0.1  # probability of a shorter target length
    do_whole_word_mask: bool = False  # mask whole words
    num_shards: int = 8  # train record shards
    num_workers: int = 0  # prepare worker processes (0 = one per core)
    # Packing: several instances per row (records made with `prepare --packing`; the corpus stage packs its own).
    packing: bool = False  # rows of up to max_instances_per_row instances: no compute spent on padding
    max_instances_per_row: int = 3  # must equal the packed records' (NVIDIA's MLPerf BERT packs up to 3)
    # a packed row's prediction slots (0 = max_predictions_per_seq + max_instances_per_row)
    max_predictions_per_row: int = 0
    # A damaged record file (truncated, a bad CRC, not a record file) stops the job, naming it and the byte.
    # instead check every file at start (~200 MB/s), read each up to its first damage, count the loss
    skip_damaged_records: bool = False
    verify_checksums: bool = False  # read every shard at start and compare its CRC32C with metadata.json's
    # tf.data threads reading and parsing records, per process (0: tf.data autotunes them). A number: that many,
    # no autotuning thread, whose deletion can hold the job's end up to a minute on a loaded host (docs/pretraining.md)
    pipeline_threads: int = 0
    # Sets in a bucket stream: bytes of shards one process holds at once, per set (0: (2 × 8 + 2) × its largest shard)
    stream_window_bytes: int = 0
    # A data mixture (instead of corpus / train_files): named sources, each a corpus spec (anything corpus takes)
    # or a record-set glob, with a weight or `auto`: 'web=web/*.parquet:0.6,code=code/*.tfrecord:0.4' ("" = off)
    mixture: str = ""
    # weights from a step on; an entry names what changes, T= the temperature: '0:web=0.6,code=0.4;9000:web=0.3,code=0.7'
    mixture_schedule: str = ""
    mixture_temperature: float = 1.0  # `auto` weights ∝ size^(1/T), sizes the sources' token counts (larger T: flatter)
    mixture_interpolation: str = "step"  # step: each entry's weights until the next | linear: a ramp between entries
    mixture_normalize: bool = False  # weights not summing to 1 are divided by their sum (logged) instead of refused
    mixture_block: int = 8  # rows drawn from one source together (must divide each process's micro-batch; 1 = each row)

    @property
    def predictions_per_row(self) -> int:
        """Prediction slots a packed row holds (`packing.predictions_per_row`)."""
        return packing_lib.predictions_per_row(
            self.max_predictions_per_row, self.max_predictions_per_seq, self.max_instances_per_row
        )

    @property
    def record_predictions(self) -> int:
        """Prediction slots per record: per instance, or per row when packed."""
        return self.predictions_per_row if self.packing else self.max_predictions_per_seq

    @property
    def record_instances(self) -> int:
        """Instance slots per record: 0 for unpacked records (one instance, google-research/bert's schema)."""
        return self.max_instances_per_row if self.packing else 0

    def packing_config(self) -> Optional[packing_lib.PackingConfig]:
        """How prepare packs rows, or None when config.data.packing is off."""
        if not self.packing:
            return None
        return packing_lib.PackingConfig(self.max_seq_length, self.max_instances_per_row, self.predictions_per_row)

    @property
    def masking_rates(self) -> mixture_lib.RateSchedule:
        """masked_lm_prob as rates by step (one rate from step 0 when it is a number)."""
        return mixture_lib.RateSchedule.parse(self.masked_lm_prob)

    def mixture_spec(self) -> Optional[mixture_lib.Mixture]:
        """The mixture settings parsed (None without a mixture)."""
        if not self.mixture.strip():
            return None
        return mixture_lib.Mixture.parse(
            self.mixture,
            self.mixture_schedule,
            self.mixture_temperature,
            self.mixture_interpolation,
            self.mixture_normalize,
        )

    def instance_config(self, dupe_factor: Optional[int] = None, heldout: bool = False) -> instances_lib.InstanceConfig:
        """How instances are paired and masked, for `prepare` and for dynamic masking (at the first scheduled
        rate); `heldout`: at eval_masked_lm_prob when it is set (ModernBERT trains at 30% and evaluates at 15%)."""
        rate = self.eval_masked_lm_prob if heldout and self.eval_masked_lm_prob else self.masking_rates.at(0)
        return instances_lib.InstanceConfig(
            max_seq_length=self.max_seq_length,
            max_predictions_per_seq=self.max_predictions_per_seq,
            masked_lm_prob=rate,
            short_seq_prob=self.short_seq_prob,
            dupe_factor=self.dupe_factor if dupe_factor is None else dupe_factor,
            do_whole_word_mask=self.do_whole_word_mask,
            next_sentence_prediction=self.next_sentence_prediction,
        )

    def validate(self) -> None:
        for name in (
            "max_seq_length",
            "max_predictions_per_seq",
            "shuffle_buffer",
            "heldout_every",
            "corpus_vocab_size",
            "dupe_factor",
            "heldout_dupe_factor",
            "num_shards",
            "max_instances_per_row",
        ):
            if getattr(self, name) < 1:
                raise bad_value(f"config.data.{name}", getattr(self, name), "must be ≥ 1.")
        if self.max_predictions_per_row < 0:
            raise bad_value(
                "config.data.max_predictions_per_row",
                self.max_predictions_per_row,
                "must be ≥ 0 (0 = max_predictions_per_seq + max_instances_per_row).",
            )
        if self.num_workers < 0:
            raise bad_value("config.data.num_workers", self.num_workers, "must be ≥ 0 (0 = one per core).")
        for name in ("pipeline_threads", "stream_window_bytes"):
            if getattr(self, name) < 0:
                raise bad_value(f"config.data.{name}", getattr(self, name), "must be ≥ 0 (0 = chosen for you).")
        self._validate_schedules()
        try:  # what prepare checks of its flags, named as this config's fields
            self.instance_config().validate(prefix="config.data.")
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if self.corpus_vocab_size <= SPECIAL_TOKENS:
            raise bad_value(
                "config.data.corpus_vocab_size",
                self.corpus_vocab_size,
                f"leaves no room beside the {SPECIAL_TOKENS} special tokens; ask for more (BERT's vocab has "
                "30,522, the demo's 4,096).",
            )
        if not 0.0 <= self.eval_masked_lm_prob < 1.0:
            raise bad_value(
                "config.data.eval_masked_lm_prob",
                self.eval_masked_lm_prob,
                "must be in [0, 1) (0 = config.data.masked_lm_prob).",
            )

    def _validate_schedules(self) -> None:
        try:
            rates = self.masking_rates
            self.mixture_spec()
        except mixture_lib.MixtureError as e:
            raise ConfigError(str(e)) from None
        if self.mixture_schedule.strip() and not self.mixture.strip():
            raise ConfigError(
                "config.data.mixture_schedule is set but config.data.mixture is empty; name the sources in the mixture."
            )
        for value in rates.values:
            if not 0.0 < value < 1.0:
                raise bad_value(
                    "config.data.masked_lm_prob", self.masked_lm_prob, "must be in (0, 1) (BERT 0.15, ModernBERT 0.3)."
                )
        if not rates.constant and not self.dynamic_masking:
            raise ConfigError(
                f"config.data.masked_lm_prob={self.masked_lm_prob!r} changes the rate by step, but the records' masks "
                "are fixed when they are made: set config.data.dynamic_masking=true to re-mask every batch at its rate."
            )
        if self.mixture.strip() and (self.corpus or self.train_files):
            given = "config.data.corpus" if self.corpus else "config.data.train_files"
            raise ConfigError(
                f"config.data.mixture and {given} both say what to train on; put every source in the mixture "
                f"(name=spec:weight) and leave {given} empty."
            )

    def check_records(self) -> None:
        """What training on records needs (after the corpus stage has filled in its outputs)."""
        if self.mixture.strip():
            return
        if not self.train_files:
            raise ConfigError(
                "config.data.train_files is empty; point it at record shards made by "
                "`python -m bertjax.prepare` (a glob or comma list), or set config.data.corpus."
            )
        if self.dynamic_masking and not self.vocab_file:
            raise ConfigError(
                "config.data.dynamic_masking=True re-masks with the records' vocabulary: set "
                "config.data.vocab_file to the vocab the records were made with."
            )


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """`config.train`: batch, steps, phase and where the weights start from."""

    global_batch_size: int = 256  # sequences per optimizer step, over all processes
    micro_batches: int = 1  # gradient accumulation: split each step's batch into this many parts
    num_train_steps: int = 900_000  # optimizer steps in this phase (phase 2: 100_000)
    log_every_steps: int = 100  # steps between metric lines in the log, TensorBoard and metrics.jsonl
    init_from: str = ""  # weights only: an HF directory or a bertjax workdir
    branch_from: str = ""  # WORKDIR or WORKDIR/STEP: go on from that run's whole state (a decay branch, say)
    batch_warmup_tokens: int = 0  # grow the global batch over this many tokens (rows × seq length); 0 = off
    batch_warmup_start: int = 0  # ... from this many rows, a whole number of micro-batches
    phase: int = 1  # 2 refuses to start without init_from (phase 1's weights)
    profile_steps: int = 0  # trace this many steps after warm-up into workdir/plugins/profile (0 = off)
    # A step whose loss or gradients are NaN/Inf is never applied (params and optimizer state stay as they were).
    on_nonfinite: str = "skip"  # skip: go on with the next batch (counted in the log and metrics) | stop at once
    max_consecutive_nonfinite: int = 10  # with skip: stop when this many steps in a row are not finite

    def validate(self) -> None:
        if self.on_nonfinite not in NONFINITE_POLICIES:
            raise bad_value(
                "config.train.on_nonfinite", self.on_nonfinite, f"is not one of {list(NONFINITE_POLICIES)}."
            )
        if self.max_consecutive_nonfinite < 1:
            raise bad_value("config.train.max_consecutive_nonfinite", self.max_consecutive_nonfinite, "must be ≥ 1.")
        for name in ("global_batch_size", "micro_batches", "num_train_steps", "log_every_steps"):
            if getattr(self, name) < 1:
                raise bad_value(f"config.train.{name}", getattr(self, name), "must be ≥ 1.")
        if self.global_batch_size % self.micro_batches:
            raise ConfigError(
                f"config.train.global_batch_size={self.global_batch_size} must divide by "
                f"config.train.micro_batches={self.micro_batches}."
            )
        if self.phase not in (1, 2):
            raise bad_value("config.train.phase", self.phase, "must be 1 or 2.")
        if self.phase == 2 and not self.init_from:
            raise ConfigError(
                "config.train.phase=2 continues phase 1: set config.train.init_from to phase 1's "
                "workdir (e.g. configs/large.py:phase=2,init_from=/ckpt/large-phase1)."
            )
        if self.profile_steps < 0:
            raise bad_value("config.train.profile_steps", self.profile_steps, "must be ≥ 0 (0 = no profile).")
        if self.batch_warmup_tokens < 0:
            raise bad_value("config.train.batch_warmup_tokens", self.batch_warmup_tokens, "must be ≥ 0 (0 = off).")
        if self.batch_warmup_tokens:
            rows = self.global_batch_size // self.micro_batches
            if self.micro_batches < 2:
                raise ConfigError(
                    f"config.train.batch_warmup_tokens={self.batch_warmup_tokens} grows the batch by "
                    "micro-batches, but config.train.micro_batches=1; set micro_batches to global_batch_size "
                    "/ batch_warmup_start or more (the smallest batch is one micro-batch)."
                )
            if not 0 < self.batch_warmup_start < self.global_batch_size or self.batch_warmup_start % rows:
                raise ConfigError(
                    f"config.train.batch_warmup_start={self.batch_warmup_start} must be a whole number of "
                    f"micro-batches of {rows} rows (global_batch_size {self.global_batch_size} / "
                    f"micro_batches {self.micro_batches}) below global_batch_size, e.g. {rows}."
                )
        if self.branch_from and self.init_from:
            raise ConfigError(
                f"config.train.branch_from={self.branch_from} and config.train.init_from={self.init_from} "
                "both say where the run starts; branch_from takes the whole state (params, optimizer, "
                "step, data position), init_from the weights only: keep one."
            )


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """`config.optim`: BERT's AdamW or LAMB and the learning-rate schedule."""

    name: str = "adamw"  # adamw (BERT's) or lamb
    learning_rate: float = 1e-4  # peak learning rate, reached at the end of warmup
    warmup_steps: int = 10_000  # linear warmup from 0
    # After warmup: linear | cosine to 0 at num_train_steps; wsd (warmup-stable-decay): the peak until the last
    # decay_steps, then decay_shape to 0 at num_train_steps; or constant.
    schedule: str = "linear"  # after warmup: linear | cosine to 0 at num_train_steps | wsd | constant
    decay_shape: str = "linear"  # wsd: linear | 1-sqrt over the decay phase
    decay_steps: int = 0  # wsd: the decay phase's length, at the end of the run (the peak until then)
    weight_decay: float = 0.01  # decoupled; never on LayerNorm parameters or biases
    b1: float = 0.9  # Adam β1
    b2: float = 0.999  # Adam β2
    eps: float = 1e-6  # Adam ε, as in BERT
    # adamw: divide the moments by (1 − β^t) as torch's and optax's AdamW do (sentence-transformers' and the HF
    # Trainer's); off = google-research/bert's optimizer, whose first ~1/(1 − β2) steps are 3–6× larger. lamb
    # always corrects.
    bias_correction: bool = False
    max_grad_norm: float = 1.0  # global-norm clipping (0 = off)

    def validate(self, num_train_steps: Optional[int] = None) -> None:
        """Raises one clear ValueError naming the first bad field."""

        def bad(field: str, why: str) -> ValueError:
            return bad_value(f"config.optim.{field}", getattr(self, field), why)

        if self.name not in OPTIMIZERS:
            raise bad("name", f"is not one of {list(OPTIMIZERS)}.")
        if self.schedule not in SCHEDULES:
            raise bad("schedule", f"is not one of {list(SCHEDULES)}.")
        if self.decay_shape not in DECAY_SHAPES:
            raise bad("decay_shape", f"is not one of {list(DECAY_SHAPES)}.")
        if self.decay_steps < 0:
            raise bad("decay_steps", "must be >= 0.")
        if self.schedule == "wsd" and self.decay_steps == 0:
            raise bad(
                "decay_steps",
                "leaves schedule=wsd no decay phase; set --config.optim.decay_steps=N, the "
                "steps at the end of the run over which the learning rate falls to 0.",
            )
        if self.schedule != "wsd" and (self.decay_steps or self.decay_shape != "linear"):
            field = "decay_steps" if self.decay_steps else "decay_shape"
            raise bad(
                field,
                f"is wsd's setting, but config.optim.schedule={self.schedule!r}; set "
                "--config.optim.schedule=wsd, or leave it at its default.",
            )
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise bad("learning_rate", "must be a positive number (the peak learning rate).")
        if self.warmup_steps < 0:
            raise bad("warmup_steps", "must be >= 0.")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise bad("weight_decay", "must be >= 0.")
        for field in ("b1", "b2"):
            if not 0.0 <= getattr(self, field) < 1.0:
                raise bad(field, "must be in [0, 1).")
        if not (math.isfinite(self.eps) and self.eps > 0):
            raise bad("eps", "must be > 0 (it keeps m / (sqrt(v) + eps) finite for zero gradients).")
        if not (math.isfinite(self.max_grad_norm) and self.max_grad_norm >= 0):
            raise bad("max_grad_norm", "must be >= 0 (0 turns clipping off).")
        if num_train_steps is not None:
            if int(num_train_steps) < 1:
                raise ConfigError(f"config.train.num_train_steps={num_train_steps} must be a positive integer.")
            if self.warmup_steps > num_train_steps:
                raise bad(
                    "warmup_steps",
                    f"exceeds config.train.num_train_steps={num_train_steps}; warmup must end "
                    "within the run: pass --config.optim.warmup_steps="
                    f"{max(1, num_train_steps // 10)} (a tenth of it) or fewer.",
                )
            if self.warmup_steps + self.decay_steps > num_train_steps:
                raise bad(
                    "decay_steps",
                    f"and config.optim.warmup_steps={self.warmup_steps} add up to more than "
                    f"config.train.num_train_steps={num_train_steps}; shorten one of them.",
                )


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """`config.mesh`: device axes (data, fsdp, tensor) and the logical-axis rules that map onto them."""

    shape: tuple[int, ...] = (-1, 1, 1)  # (data, fsdp, tensor)
    # logical axis name → mesh axis (or None = replicated)
    logical_axis_rules: Rules = (
        ("batch", ("data", "fsdp")),
        ("embed", "fsdp"),
        ("vocab", "tensor"),
        ("heads", "tensor"),
        ("mlp", "tensor"),
        ("kv", None),
        ("length", None),
        ("layers", None),
    )

    def validate(self) -> None:
        if len(self.shape) != len(MESH_AXES):
            raise bad_value(
                "config.mesh.shape", self.shape, f"must have {len(MESH_AXES)} entries, one per axis {MESH_AXES}."
            )
        for name, axes in self.logical_axis_rules:
            for axis in (axes,) if isinstance(axes, str) else tuple(axes or ()):
                if axis not in MESH_AXES:
                    raise ConfigError(
                        f"config.mesh.logical_axis_rules maps {name!r} to {axis!r}, which is not "
                        f"a mesh axis; use one of {MESH_AXES} or None."
                    )


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """`config.checkpoint`: how often to save, what to keep, and the Hugging Face export at the end."""

    every_steps: int = 10_000  # steps between saves (and always at the end)
    keep: int = 3  # most recent checkpoints kept
    keep_every: int = 100_000  # also keep every checkpoint whose step is a multiple of this (0 = none)
    export_hf: bool = False  # at the end, also write workdir/hf: a Hugging Face BertForPreTraining directory
    # A step that does not restore is moved aside to checkpoints/damaged-STEP and the one before it resumes.
    start_over_if_damaged: bool = False  # when no step restores: move all aside and start over (else stop)

    def validate(self) -> None:
        for name in ("every_steps", "keep"):
            if getattr(self, name) < 1:
                raise bad_value(f"config.checkpoint.{name}", getattr(self, name), "must be ≥ 1.")
        if self.keep_every < 0:
            raise bad_value("config.checkpoint.keep_every", self.keep_every, "must be ≥ 0 (0 = none).")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """`config.eval`: held-out evaluation cadence and size, and the predictions printed at the end."""

    every_steps: int = 10_000  # steps between held-out evaluations (and always at the end)
    num_batches: int = 100  # batches per evaluation (0 = the whole eval set once)
    show_predictions: int = 0  # at the end, print top-5 guesses for the masks of this many held-out sequences
    not_learning_after: float = 0.25  # from this share of the run on, warn once if held-out MLM is flat (0 = never)

    def validate(self) -> None:
        if self.every_steps < 1:
            raise bad_value("config.eval.every_steps", self.every_steps, "must be ≥ 1.")
        if not 0 <= self.not_learning_after <= 1:
            raise bad_value(
                "config.eval.not_learning_after",
                self.not_learning_after,
                "must be a share of the run from 0 (never warn) to 1.",
            )
        if self.num_batches < 0:
            raise bad_value("config.eval.num_batches", self.num_batches, "must be ≥ 0 (0 = the whole eval set).")
        if self.show_predictions < 0:
            raise bad_value("config.eval.show_predictions", self.show_predictions, "must be ≥ 0.")


@dataclasses.dataclass(frozen=True)
class JobConfig(Sections):
    """The whole pre-training config: one field per section of configs/default.py."""

    seed: int = 0  # seeds parameter init, dropout and data order
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    train: TrainConfig = TrainConfig()
    optim: OptimConfig = OptimConfig()
    mesh: MeshConfig = MeshConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    eval: EvalConfig = EvalConfig()

    def never_reached(self) -> list[str]:
        """Warnings, one sentence each: schedule entries at or past num_train_steps, which the run never reaches
        (a schedule written for a longer run, or a step count with a zero too few)."""
        end, out = self.train.num_train_steps, []
        mix = self.data.mixture_spec()
        scheduled = [
            ("config.data.mixture_schedule", [e.step for e in mix.entries] if mix else []),
            ("config.data.masked_lm_prob", list(self.data.masking_rates.steps)),
        ]
        for setting, steps in scheduled:
            late = [step for step in steps if step >= end]
            if late:
                out.append(
                    f"{setting} changes at step{'s' if len(late) > 1 else ''} {', '.join(map(str, late))}, which the "
                    f"run never reaches: it ends at config.train.num_train_steps={end}."
                )
        return out

    def validate(self) -> None:
        for section in (self.model, self.data, self.train, self.mesh, self.checkpoint, self.eval):
            section.validate()
        self.optim.validate(self.train.num_train_steps)
        if self.data.max_seq_length > self.model.max_position_embeddings:
            raise ConfigError(
                f"config.data.max_seq_length={self.data.max_seq_length} exceeds "
                f"config.model.max_position_embeddings={self.model.max_position_embeddings}; lower the "
                "first (and the records' max_seq_length with it) or raise the second."
            )
        if self.data.next_sentence_prediction and not self.model.architecture.has_nsp_head:
            raise ConfigError(
                f"config.data.next_sentence_prediction=True, but config.model.family="
                f"{self.model.family!r} has no NSP head: set it to False (MLM only, as "
                "configs/modernbert.py does)."
            )
