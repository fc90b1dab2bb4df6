"""The fine-tuning config's schema (configs/finetune.py, `python -m bertjax.finetune`, the GLUE suite): the
task, its data, training from pre-trained weights and sweeps, with pre-training's sections (config/schema.py) for
the model's computation, the optimizer, the mesh, checkpoints and evals. No JAX is imported here. It lives with
fine-tuning, a floor above config/, because it names the tasks of finetuning/tasks/ and asks each to check its
data."""

from __future__ import annotations

import dataclasses

from bertjax.config.convert import bad_value
from bertjax.config.schema import (
    CheckpointConfig,
    EvalConfig,
    NONFINITE_POLICIES,
    MeshConfig,
    ModelConfig,
    OptimConfig,
)
from bertjax.config.convert import Sections
from bertjax.finetuning import tasks as tasks_lib

FINETUNE_TASKS = tasks_lib.NAMES  # finetuning/tasks/: the registry


@dataclasses.dataclass(frozen=True)
class FinetuneDataConfig:
    """`config.data` of fine-tuning: labelled files (or tfds:NAME:SPLIT) and how they become rows."""

    train_file: str = ""
    eval_file: str = ""
    max_seq_length: int = 128
    vocab_file: str = ""  # default: the vocab that comes with train.init_from
    do_lower_case: bool = True  # with an explicit vocab_file only; init_from's casing otherwise
    regression: bool = False  # sequence_classification with one float label (STS-B), MSE
    doc_stride: int = 128  # question_answering: tokens between the starts of a long context's windows
    max_query_length: int = 64
    max_answer_length: int = 30
    n_best_size: int = 20
    version_2_with_negative: bool = False  # SQuAD 2.0: questions may have no answer
    null_score_diff_threshold: float = 0.0
    packing: bool = True  # classification: several examples a row (finetuning/example_packing.py); QA keeps its windows
    max_instances_per_row: int = 0  # packed: at most this many examples a row (0 = as many as fit)
    # retrieval (contrastive): JSON Lines pairs; queries cut to max_query_length, documents to max_seq_length
    hard_negatives: int = -1  # hard negatives a pair uses: -1 = as many as the first row gives (every row the same)
    pooling: str = "mean"  # mean | cls: how a text's token states become its embedding (exported as such)
    normalize: bool = True  # unit-length embeddings (a Normalize module in the sentence-transformers export)
    similarity_scale: float = 20.0  # the scores' scale in the loss (sentence-transformers' MNRL: 20, temperature 0.05)
    symmetric_loss: bool = False  # also rank each positive's query among the batch's queries (MNSRL)
    matryoshka_dims: str = ""  # e.g. "256,128": the loss also on embeddings cut to these sizes (MatryoshkaLoss)
    eval_dir: str = ""  # retrieval: a BEIR directory scored at every eval (ndcg_at_10, recall_at_100, mrr_at_10)
    eval_split: str = "test"  # its qrels/<split>.tsv

    def validate(self, task: str) -> None:
        if not self.train_file:
            raise bad_value(
                "config.data.train_file",
                self.train_file,
                "is empty; name the labelled training file "
                "(TSV/CSV/JSONL, CoNLL or SQuAD JSON; a glob, or tfds:NAME:SPLIT).",
            )
        if self.max_seq_length < 8:
            raise bad_value("config.data.max_seq_length", self.max_seq_length, "must be ≥ 8.")
        if self.max_instances_per_row < 0:
            raise bad_value(
                "config.data.max_instances_per_row", self.max_instances_per_row, "must be ≥ 0 (0 = no limit)."
            )
        if self.eval_dir and not tasks_lib.get(task).embeds:
            raise bad_value("config.data.eval_dir", self.eval_dir, f"is a BEIR set for task retrieval, not {task}.")
        tasks_lib.get(task).validate(self)  # what this task refuses of config.data


@dataclasses.dataclass(frozen=True)
class FinetuneTrainConfig:
    """`config.train` of fine-tuning: epochs over the labelled data, from pre-trained weights."""

    init_from: str = ""  # bertjax workdir, Hugging Face or TF1 directory; empty = random initialisation
    global_batch_size: int = 32
    micro_batches: int = 1
    num_epochs: float = 3.0
    num_train_steps: int = 0  # 0 = num_epochs over the training set
    warmup_proportion: float = 0.1  # of the steps, as google-research/bert's run_classifier.py
    log_every_steps: int = 50
    profile_steps: int = 0
    on_nonfinite: str = "skip"
    max_consecutive_nonfinite: int = 10

    def validate(self) -> None:
        if self.num_epochs <= 0 and self.num_train_steps <= 0:
            raise bad_value(
                "config.train.num_epochs", self.num_epochs, "must be > 0 (or set config.train.num_train_steps)."
            )
        if not 0 <= self.warmup_proportion < 1:
            raise bad_value("config.train.warmup_proportion", self.warmup_proportion, "must be in [0, 1).")
        if self.global_batch_size < 1 or self.micro_batches < 1 or self.global_batch_size % self.micro_batches:
            raise bad_value(
                "config.train.global_batch_size",
                self.global_batch_size,
                f"must be ≥ 1 and divide by config.train.micro_batches={self.micro_batches}.",
            )
        if self.on_nonfinite not in NONFINITE_POLICIES:
            raise bad_value(
                "config.train.on_nonfinite", self.on_nonfinite, f"is not one of {list(NONFINITE_POLICIES)}."
            )


def _floats(path: str, text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in str(text).split(",") if v.strip())
    except ValueError:
        raise bad_value(path, text, "must be comma-separated numbers, e.g. 2e-5,3e-5,5e-5.") from None


@dataclasses.dataclass(frozen=True)
class SweepConfig:
    """`config.sweep`: one fine-tuning run per learning rate × seed (BERT's scores vary with the seed on
    small data), each in workdir/sweep/lr=…,seed=…; the job reports the best and the spread."""

    learning_rate: str = ""  # e.g. "2e-5,3e-5,5e-5"; empty = config.optim.learning_rate only
    seeds: str = ""  # e.g. "0,1,2"; empty = config.seed only

    @property
    def learning_rates(self) -> tuple[float, ...]:
        return _floats("config.sweep.learning_rate", self.learning_rate)

    @property
    def seed_values(self) -> tuple[int, ...]:
        values = _floats("config.sweep.seeds", self.seeds)
        if any(v != int(v) for v in values):
            raise bad_value("config.sweep.seeds", self.seeds, "must be comma-separated integers, e.g. 0,1,2.")
        return tuple(int(v) for v in values)

    def validate(self) -> None:
        self.learning_rates, self.seed_values  # noqa: B018  (parse errors name the field)


@dataclasses.dataclass(frozen=True)
class FinetuneConfig(Sections):
    """The whole fine-tuning config (configs/finetune.py). `model` says how to compute; the architecture
    comes from `train.init_from` (or `model`'s fields for a random initialisation)."""

    task: str = FINETUNE_TASKS[0]  # finetuning/tasks/
    seed: int = 0
    model: ModelConfig = ModelConfig()
    data: FinetuneDataConfig = FinetuneDataConfig()
    train: FinetuneTrainConfig = FinetuneTrainConfig()
    optim: OptimConfig = OptimConfig(learning_rate=3e-5, warmup_steps=0)
    mesh: MeshConfig = MeshConfig()
    checkpoint: CheckpointConfig = CheckpointConfig(every_steps=1000, keep=1, keep_every=0)
    eval: EvalConfig = EvalConfig(every_steps=1000, num_batches=0)
    sweep: SweepConfig = SweepConfig()

    def validate(self) -> None:
        if self.task not in FINETUNE_TASKS:
            raise bad_value("config.task", self.task, f"is not one of {list(FINETUNE_TASKS)}.")
        for section in (self.model, self.train, self.mesh, self.checkpoint, self.eval, self.sweep):
            section.validate()
        self.data.validate(self.task)
        self.optim.validate(self.train.num_train_steps or None)
