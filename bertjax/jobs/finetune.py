"""The fine-tuning job, the second stage (`python -m bertjax.finetune` runs it from its flags).

Fine-tunes a pre-trained BERT (`config.train.init_from`: a bertjax workdir, a Hugging Face directory or
a google-research/bert TF1 checkpoint; empty = random initialisation) on a labelled task — one of
a task of finetuning/tasks/ — on the same machinery as pre-training: `trainer.setup` (mesh, sharded state, compiled
step), `loop.train_loop` (log lines with ETA, TensorBoard + metrics.jsonl, evals, orbax checkpoints with
exact resume, SIGTERM, the non-finite guard). Held-out scores are computed on the host from every
prediction (scores.py) and written as `"kind": "eval"` rows.

setup (config, weights and tokenizer of init_from) → data (examples → labels → rows) → trainer →
restore (a checkpoint of this run, or init_from's body with a fresh head) → loop → predictions.
`config.sweep` runs the job once per learning rate × seed and reports the best and the spread.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from typing import Any, Optional

import jax
import numpy as np

from bertjax.runtime import files
from bertjax.training import checkpoint as checkpoint_lib
from bertjax.finetuning import heads
from bertjax.training import loop as loop_lib
from bertjax.training import memory_check
from bertjax.training import metrics as metrics_lib
from bertjax import models as models_lib
from bertjax.runtime import ownership
from bertjax.interop import pretrained
from bertjax.finetuning import scores
from bertjax.training import trainer as trainer_lib
from bertjax.finetuning.config import FinetuneConfig
from bertjax.finetuning import arrays as arrays_lib
from bertjax.finetuning import example_packing
from bertjax.finetuning import beir
from bertjax.finetuning import pair_packing
from bertjax.data.pretraining import pipeline as pipeline_lib
from bertjax.finetuning import readers
from bertjax.finetuning import retrieval_task
from bertjax.finetuning import tasks as tasks_lib
from bertjax.data.vocab import tokenization

log = logging.getLogger(__name__)
LABELS_FILE = "labels.json"  # the label order of a fine-tuned workdir: export and predict read it
PREDICTIONS_FILE = "eval_predictions.jsonl"


def primary_metric(job: FinetuneConfig) -> str:
    """The score a sweep ranks runs by: GLUE's for the task."""
    return tasks_lib.get(job.task).primary_metric(job.data.regression)


# --- Where the weights and the tokenizer come from ------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Source:
    architecture: Any  # models/<family>/config.py's dataclass
    params: Optional[dict]  # host arrays, loop layout; None = random initialisation
    vocab_file: str
    do_lower_case: bool


def resolve_source(job: FinetuneConfig) -> Source:
    """The architecture, weights and tokenizer: init_from's, with config.data.vocab_file overriding the
    tokenizer; without init_from, config.model's architecture and config.data.vocab_file."""
    path, data = job.train.init_from, job.data
    if path:
        architecture, params = pretrained.load(path, job.seed, encoder_only=True)  # the task head is new
        vocab, lower = pretrained.vocab_of(path)
    else:
        architecture, params, vocab, lower = job.model.architecture, None, None, data.do_lower_case
    if data.vocab_file:
        vocab, lower = data.vocab_file, data.do_lower_case
    if not vocab:
        raise FileNotFoundError(
            f"no vocab comes with config.train.init_from={path!r}; set "
            "--config.data.vocab_file (and --config.data.do_lower_case) to the vocab it was "
            "trained with."
        )
    architecture = models_lib.of(architecture).config.with_finetuning_choices(architecture, job.model)
    if not path and not job.model.vocab_size:  # unset: a random model as large as the vocab
        architecture = dataclasses.replace(architecture, vocab_size=tokenization.load(vocab, lower).vocab_size)
    return Source(architecture, params, vocab, lower)


def load_tokenizer(source: Source) -> tokenization.Tokenizer:
    tokenizer = tokenization.load(source.vocab_file, source.do_lower_case)
    if tokenizer.vocab_size != source.architecture.vocab_size:
        raise ValueError(
            f"the vocab {source.vocab_file} has {tokenizer.vocab_size} tokens but the model's "
            f"vocab_size is {source.architecture.vocab_size}; use the vocab the model was trained with "
            "(--config.data.vocab_file)."
        )
    return tokenizer


# --- Data -----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Split:
    """One data split as examples and as rows (`arrays`), with what maps rows back to examples."""

    examples: list
    arrays: dict[str, np.ndarray]
    features: Any = None  # token_classification: each example's word → first-piece index; QA: QAFeatures


def read_examples(job: FinetuneConfig, pattern: str, training: bool) -> list:
    """The examples of a file, glob or tfds:NAME:SPLIT for the task."""
    return tasks_lib.get(job.task).read_examples(pattern, job.data, training)


def label_map(job: FinetuneConfig, train_examples: list) -> Optional[readers.LabelMap]:
    return tasks_lib.get(job.task).label_map(train_examples, job.data)


def make_split(
    job: FinetuneConfig,
    examples: list,
    tokenizer: tokenization.Tokenizer,
    labels: Optional[readers.LabelMap],
    training: bool,
    name: str,
) -> Split:
    d = job.data
    kind = tasks_lib.get(job.task)
    arrays, features, truncated = kind.rows(examples, tokenizer, d, labels, training)
    # Every split carries every key of the task's batch (targets an eval file lacks are zeros, unscored).
    rows = len(next(iter(arrays.values())))
    if not kind.embeds:  # an embedder's rows are its pairs, whole as they come
        for key, (shape, dtype) in heads.batch_shapes(job.task, d.regression, rows, d.max_seq_length).items():
            if key != pipeline_lib.EXAMPLE_WEIGHT:
                arrays[key] = np.asarray(arrays[key], dtype) if key in arrays else np.zeros(shape, dtype)
    log.info(
        "data: %s: %d examples → %d rows of %d tokens%s",
        name,
        len(examples),
        rows,
        d.max_seq_length,
        f" ({truncated} truncated to fit)" if truncated else "",
    )
    return Split(examples, arrays, features)


# --- Held-out scores ------------------------------------------------------------------------------------


def _logits(job: FinetuneConfig, trainer: trainer_lib.Trainer, params: Any, batches: Any) -> np.ndarray:
    """The model's logits for every example of a split, in input order, one padded row each (packed batches
    are unpacked)."""
    batches.reset()
    out = [trainer.predict_step(params, trainer.global_batch(local))["logits"] for local in batches]
    if isinstance(batches, example_packing.PackedBatches):
        return batches.unpack(out, per_token=tasks_lib.get(job.task).per_token)
    return np.concatenate(out)[: batches.rows]


def make_batches(job: FinetuneConfig, train: Split, evaluation: Optional[Split], steps: int) -> tuple[Any, Any]:
    """(train, eval) batches: packed (config.data.packing, classification tasks) or one example a row."""
    local_batch = trainer_lib.process_batch_size(job.train)
    where = dict(process_index=jax.process_index(), process_count=jax.process_count())
    if tasks_lib.get(job.task).embeds and uses_packing(job):  # every text of a batch's pairs shares rows
        return _packed_pairs(job, train, evaluation, steps, local_batch, where)
    if not uses_packing(job):
        return (
            arrays_lib.ArrayBatches(train.arrays, local_batch, True, job.seed, **where),
            arrays_lib.ArrayBatches(evaluation.arrays, local_batch, False, 0, **where) if evaluation else None,
        )
    # Every process's rows × process count must split over the micro-batches and the devices.
    multiple = job.train.micro_batches * max(1, jax.device_count() // jax.process_count())
    packed = dict(where, max_slots=job.data.max_instances_per_row, row_multiple=multiple)
    train_batches = example_packing.PackedBatches(
        train.arrays, local_batch, True, job.seed, num_batches=steps, **packed
    )
    eval_batches = (
        example_packing.PackedBatches(evaluation.arrays, local_batch, False, 0, **packed) if evaluation else None
    )
    _log_packing(job, train_batches, "examples")
    return train_batches, eval_batches


def _log_packing(job: FinetuneConfig, batches: Any, what: str) -> None:
    padded, now = batches.padding()
    log.info(
        "data: packing %d %s a step into %d rows of %d tokens (up to %d a row): padding %.0f%% of the "
        "tokens instead of %.0f%%",
        job.train.global_batch_size,
        what,
        batches.layout.rows * jax.process_count(),
        job.data.max_seq_length,
        batches.layout.slots,
        100 * now,
        100 * padded,
    )


def _packed_pairs(
    job: FinetuneConfig, train: Split, evaluation: Optional[Split], steps: int, local_batch: int, where: dict
) -> tuple[Any, Any]:
    devices = max(1, jax.device_count() // jax.process_count())  # a chunk's rows split over the process's devices
    packed = dict(where, row_multiple=devices, max_slots=job.data.max_instances_per_row)
    train_batches = pair_packing.PackedPairs(
        train.arrays, local_batch, True, job.seed, chunks=job.train.micro_batches, num_batches=steps, **packed
    )
    eval_batches = pair_packing.PackedPairs(evaluation.arrays, local_batch, False, 0, **packed) if evaluation else None
    _log_packing(job, train_batches, "pairs' texts")
    return train_batches, eval_batches


def uses_packing(job: FinetuneConfig) -> bool:
    return job.data.packing and tasks_lib.get(job.task).packs


def predictions_of(
    job: FinetuneConfig, split: Split, logits: np.ndarray, labels: Optional[readers.LabelMap]
) -> list[dict]:
    """One prediction per example, from the logits of every row: a label (with its probability), a score,
    a tag per word with the entities they make, or an answer cut from the original context."""
    return tasks_lib.get(job.task).predictions(split, logits, labels, job.data)


def scores_of(
    job: FinetuneConfig, split: Split, logits: np.ndarray, labels: Optional[readers.LabelMap]
) -> tuple[dict[str, float], list[dict]]:
    """(held-out scores, predictions_of with the truth beside each) from the logits of every row."""
    predictions = predictions_of(job, split, logits, labels)
    result, gold = tasks_lib.get(job.task).scores(split, logits, labels, job.data, predictions)
    return dict(result), [dict(p, label=g) for p, g in zip(predictions, gold)]


# --- One run --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Examples:
    """A task's examples read by the caller (the GLUE suite) instead of from config.data's files."""

    train: list
    eval: Optional[list]
    labels: Optional[readers.LabelMap]  # the task's label order; None = regression (or from train's labels)


@dataclasses.dataclass(frozen=True)
class Outcome:
    scores: dict  # the final held-out scores ({} without an eval set)
    finished: bool  # False: stopped on request (SIGTERM, preemption) before the last step; rerun to resume


def finetune(config: Any, workdir: str) -> dict:
    """Runs (or resumes) the configured fine-tuning in workdir — or, with config.sweep, one run per
    learning rate × seed under workdir/sweep/ — and returns the final held-out scores (for a sweep: the
    best run's, with the spread)."""
    job = config if isinstance(config, FinetuneConfig) else FinetuneConfig.from_configdict(config)
    rates, seeds = job.sweep.learning_rates, job.sweep.seed_values
    if rates or seeds:
        ownership.claim_workdir(workdir, primary=jax.process_index() == 0)  # sweep.json beside the runs' workdirs
        return _sweep(job, workdir, rates or (job.optim.learning_rate,), seeds or (job.seed,))
    return run(job, workdir).scores


def run(job: FinetuneConfig, workdir: str, given: Optional[Examples] = None) -> Outcome:
    """One fine-tuning run (or its resumption) in workdir, on config.data's files or the `given` examples."""
    outcome = loop_lib.run_job(workdir, lambda stop, lock: _finetune(job, workdir, stop, lock, given))
    return outcome if isinstance(outcome, Outcome) else Outcome({}, finished=False)  # stopped before training


def _finetune(
    job: FinetuneConfig, workdir: str, stop: loop_lib.StopRequest, lock: Any, given: Optional[Examples] = None
) -> Outcome:
    # ===== setup: weights and tokenizer =====
    source = resolve_source(job)
    memory_check.check_training(
        source.architecture,
        job.model.dtype,
        job.train.global_batch_size,
        job.data.max_seq_length,
        source=job.train.init_from or "config.model",
    )
    tokenizer = load_tokenizer(source)
    primary = jax.process_index() == 0

    # ===== data =====
    if given is None:
        train_examples = read_examples(job, job.data.train_file, training=True)
        eval_examples = read_examples(job, job.data.eval_file, training=False) if job.data.eval_file else None
        labels = label_map(job, train_examples)
    else:
        train_examples, eval_examples = given.train, given.eval
        labels = given.labels if given.labels is not None else label_map(job, train_examples)
    train = make_split(job, train_examples, tokenizer, labels, True, "train")
    evaluation = make_split(job, eval_examples, tokenizer, labels, False, "eval") if eval_examples else None
    beir_set = beir.read(job.data.eval_dir, job.data.eval_split) if job.data.eval_dir else None  # mistakes: now
    rows = len(next(iter(train.arrays.values())))
    steps = job.train.num_train_steps or max(1, math.ceil(job.train.num_epochs * rows / job.train.global_batch_size))
    job = job.replace(
        train={"num_train_steps": steps},
        optim={"warmup_steps": int(job.train.warmup_proportion * steps)},
        model=models_lib.of(source.architecture).config.model_config_fields(source.architecture),
        data={"vocab_file": source.vocab_file, "do_lower_case": source.do_lower_case},
    )
    log.info(
        "setup: %s, %d training rows, batch %d: %d steps (%.1f epochs), warmup %d, lr %g; model %s",
        job.task,
        rows,
        job.train.global_batch_size,
        steps,
        steps * job.train.global_batch_size / rows,
        job.optim.warmup_steps,
        job.optim.learning_rate,
        source.architecture,
    )
    if primary:
        files.makedirs(workdir)
        files.write_whole(
            os.path.join(workdir, "config.json"),
            json.dumps(dict(job.to_dict(), kind="finetune"), indent=2, sort_keys=True),
        )
        files.write_whole(os.path.join(workdir, LABELS_FILE), json.dumps(list(labels.labels) if labels else None))
    num_labels = 1 if job.data.regression else (2 if labels is None else len(labels.labels))
    fingerprint = dict(
        checkpoint_lib.model_fingerprint(source.architecture, job.model.layer_scan(jax.default_backend())),
        task=job.task,
        labels=list(labels.labels) if labels else None,
        regression=job.data.regression,
    )
    if job.data.packing and not tasks_lib.get(job.task).packs:
        log.info("data: %s keeps one window a row (config.data.packing is for classification)", job.task)
    train_batches, eval_batches = make_batches(job, train, evaluation, steps)
    packed = uses_packing(job)

    def make_trainer() -> trainer_lib.Trainer:
        def make_task(platform: str) -> trainer_lib.Task:
            if tasks_lib.get(job.task).embeds:
                model = retrieval_task.model(job.model, source.architecture, platform, packed=packed)
                rows, slots = (
                    (train_batches.layout.rows * jax.process_count(), train_batches.layout.slots) if packed else (0, 0)
                )
                per_pair = retrieval_task.documents_per_pair(train.arrays)
                return retrieval_task.task(
                    model, job.data, per_pair, packed_rows=rows, slots=slots, pairs=job.train.global_batch_size
                )
            model = heads.from_config(job.model, source.architecture, job.task, num_labels, platform, packed=packed)
            rows, slots = (
                (train_batches.layout.rows * jax.process_count(), train_batches.layout.slots) if packed else (0, 0)
            )  # padded: one example a row
            return heads.task(
                model, job.task, job.data.regression, job.data.max_seq_length, packed_rows=rows, slots=slots
            )

        return trainer_lib.setup(job, task=make_task)

    def fresh_state(parts: loop_lib.Parts) -> Any:
        trainer = parts.trainer
        if source.params is None:
            log.info("restore: random initialisation (config.train.init_from is empty)")
            return trainer.init_state()
        # The new head's initial values, on the host (the body's are init_from's, host arrays too).
        fresh = trainer.model.fresh_head(jax.random.PRNGKey(job.seed))
        params = heads.with_pretrained_body(fresh, source.params)
        params = {k: v for k, v in params.items() if k in trainer.abstract_state.params}  # an embedder: no MLM head
        if job.model.layer_scan(jax.default_backend()):
            params = models_lib.of(source.architecture).model.stack_layers(
                params, source.architecture.num_hidden_layers
            )
        log.info("restore: pre-trained body from %s, new %s head", job.train.init_from, job.task)
        return trainer.state_from_params(params)

    def run_eval(parts: loop_lib.Parts, step: int, params: Any) -> dict:
        if tasks_lib.get(job.task).embeds and (evaluation is not None or beir_set is not None):
            result = {}
            if evaluation is not None:
                result = retrieval_task.evaluate(parts.trainer, params, eval_batches, evaluation.examples)
            if beir_set is not None:  # the BEIR set's scores by their own names; the eval file's then as pairs_*
                result = {f"pairs_{k}": v for k, v in result.items()}
                result.update(retrieval_task.evaluate_beir(job, source, tokenizer, params, beir_set))
            parts.writer.write(step, result, kind="eval")
            log.info("eval  %s", metrics_lib.format_log_line(dict(result, step=step), extra=list(result)))
            return result
        if evaluation is None:
            return {}
        logits = _logits(job, parts.trainer, params, eval_batches)
        result, predictions = scores_of(job, evaluation, logits, labels)
        parts.writer.write(step, result, kind="eval")
        shown = [k for k in result if not k.startswith(("HasAns_", "NoAns_", "f1_"))]  # those: metrics.jsonl
        log.info("eval  %s", metrics_lib.format_log_line(dict(result, step=step), extra=shown))
        if primary:
            text = "".join(json.dumps(p) + "\n" for p in predictions)
            files.write_whole(os.path.join(workdir, PREDICTIONS_FILE), text)
        return result

    # ===== trainer → restore (this run's checkpoint, or init_from's body with a fresh head) → loop =====
    _, result = loop_lib.run_training(
        job,
        workdir,
        fingerprint,
        train_batches,
        stop,
        lock,
        make_trainer=make_trainer,
        fresh_state=fresh_state,
        evaluate=run_eval,
    )
    log.info("%s: %d steps in %s", "stopped" if result.stopped else "done", result.step, workdir)
    return Outcome(result.last_eval, finished=not result.stopped)


# --- A fine-tuned run, for predict ---------------------------------------------------------------------


def load_run(workdir: str, step: Optional[int] = None) -> tuple[FinetuneConfig, Optional[readers.LabelMap], Any]:
    """(config, labels, host params) of a fine-tuned workdir's latest checkpoint (or `step`)."""
    path = os.path.join(workdir, "config.json")
    if not files.isfile(path):
        raise FileNotFoundError(f"{path} not found; --workdir must be a bertjax.finetune run's workdir.")
    saved = files.read_json(path)
    if saved.pop("kind", None) != "finetune":
        raise ValueError(
            f"{workdir} is a pre-training run, not a fine-tuned one; fine-tune it first "
            "(python -m bertjax.finetune --config.train.init_from=" + workdir + ")."
        )
    job = FinetuneConfig.from_saved(saved)
    fingerprint, params = checkpoint_lib.load_params(workdir, step)
    labels = readers.LabelMap(fingerprint["labels"]) if fingerprint.get("labels") else None
    return job, labels, params


# --- Sweeps ---------------------------------------------------------------------------------------------


def _sweep(job: FinetuneConfig, workdir: str, rates: tuple[float, ...], seeds: tuple[int, ...]) -> dict:
    """One run per learning rate × seed; writes workdir/sweep.json with every run, each rate's spread
    over seeds, and the best rate (by its mean, as the paper picks on dev)."""
    metric = primary_metric(job)
    runs = []
    for rate in rates:
        for seed in seeds:
            name = f"lr={rate:g},seed={seed}"
            log.info("sweep: run %d of %d: %s", len(runs) + 1, len(rates) * len(seeds), name)
            one = dataclasses.replace(job.replace(optim={"learning_rate": rate}), seed=seed)
            outcome = run(one, os.path.join(workdir, "sweep", name))
            if not outcome.finished:  # a stop request ends the sweep; the same command resumes it
                log.info("sweep: stopped in run %s; rerun the same command to go on", name)
                return {}
            runs.append({"learning_rate": rate, "seed": seed, **outcome.scores})
    by_rate = {
        f"{rate:g}": scores.summary([r[metric] for r in runs if r["learning_rate"] == rate and metric in r])
        for rate in rates
    }
    best = max(by_rate, key=lambda rate: by_rate[rate]["mean"])
    report = {
        "metric": metric,
        "runs": runs,
        "by_learning_rate": by_rate,
        "best_learning_rate": float(best),
        "best": by_rate[best],
    }
    if jax.process_index() == 0:
        files.makedirs(workdir)
        files.write_whole(os.path.join(workdir, "sweep.json"), json.dumps(report, indent=2))
    for rate, s in by_rate.items():
        log.info(
            "sweep: lr %s: %s %.4f ± %.4f (min %.4f, max %.4f, %d seeds)",
            rate,
            metric,
            s["mean"],
            s["std"],
            s["min"],
            s["max"],
            s["n"],
        )
    log.info(
        "sweep: best lr %s (%s mean %.4f); every run in %s",
        best,
        metric,
        by_rate[best]["mean"],
        os.path.join(workdir, "sweep.json"),
    )
    return report
