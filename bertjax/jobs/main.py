"""`train_and_evaluate(config, workdir)`: the pre-training job, in phases under banners.

setup → data → trainer (mesh, sharded state, compiled step: `trainer.setup`) → restore → loop
(`loop.train_loop`: train step / log / eval / checkpoint / profile, then a final eval and checkpoint)
→ export. Every exit
— the end, a stop request, non-finite steps past `config.train.on_nonfinite`'s limit, an error — leaves
through one clean-up path that waits for pending checkpoint writes and closes the metric writer.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import jax

from bertjax.data import remote_cache

from bertjax.runtime import files
from bertjax.training import batch_warmup
from bertjax.training import checkpoint as checkpoint_lib
from bertjax.runtime import lock as lock_lib
from bertjax.training import loop as loop_lib
from bertjax.training import memory_check
from bertjax.training import metrics as metrics_lib
from bertjax.interop import pretrained
from bertjax.training import trainer as trainer_lib
from bertjax.config.schema import JobConfig
from bertjax.data.pretraining import pipeline as pipeline_lib

log = logging.getLogger(__name__)
PER_SOURCE = ("mlm_accuracy", "mlm_loss", "mlm_accuracy_stderr", "mlm_loss_stderr", "mlm_targets")  # a mixture's evals


def _mixture_sources(job: JobConfig, workdir: str) -> tuple[list[tuple[str, str, str]], str]:
    """A mixture's (name, train records, held-out records) and shared eval set (stage.mixture_sources); ([], "")
    without a mixture. Sets in a bucket stay there: each process streams its share (data/stream_window.py)."""
    from bertjax.jobs import stage as stage_lib

    if not job.data.mixture.strip():
        return [], ""
    return stage_lib.mixture_sources(job, workdir)


def _local_data(d: Any) -> dict:
    """config.data's vocab in a bucket replaced by its local copy (data/remote_cache.py); record sets in a bucket
    are streamed, never copied."""
    return {"vocab_file": remote_cache.copy_of(d.vocab_file) if d.vocab_file else ""}


def _pipeline(
    job: JobConfig,
    record_files: str,
    training: bool,
    batch_size: int,
    sources: tuple[tuple[str, str], ...] = (),
    warmup: batch_warmup.BatchWarmup | None = None,
    max_batches: int | None = None,
) -> pipeline_lib.InputPipeline:
    """A training pipeline (of one record set or a mixture's `sources`), or an eval one."""
    d = job.data
    vocab = None
    if training and d.dynamic_masking:  # the masker needs [MASK], the specials and word-piece boundaries
        from bertjax.data.pretraining import instances
        from bertjax.data.vocab import tokenization

        vocab = instances.Vocab.from_tokenizer(tokenization.load(d.vocab_file, d.do_lower_case))
    return pipeline_lib.InputPipeline(
        pipeline_lib.PipelineConfig(
            files=record_files,
            batch_size=batch_size,
            max_seq_length=d.max_seq_length,
            max_predictions_per_seq=d.record_predictions,
            max_instances_per_row=d.record_instances,
            seed=job.seed,
            shuffle_buffer=d.shuffle_buffer,
            training=training,
            process_index=jax.process_index(),
            process_count=jax.process_count(),
            vocab_size=job.model.vocab_size,
            max_batches=None if training else max_batches,
            dynamic_masking=vocab is not None,
            vocab=vocab,
            masked_lm_prob=d.masked_lm_prob if vocab else None,
            skip_damaged_records=d.skip_damaged_records,
            verify_checksums=d.verify_checksums,
            threads=d.pipeline_threads or None,
            stream_window_bytes=d.stream_window_bytes,
            sources=sources,
            mixture=d.mixture_spec() if sources else None,
            mixture_block=d.mixture_block,
            batch_starts=warmup.batch_starts() if warmup is not None else (0,),
            batches_per_step=job.train.micro_batches if warmup is not None else 1,
        )
    )


def _eval_pipelines(
    job: JobConfig, sources: list[tuple[str, str, str]], shared: str, batch_size: int
) -> dict[str | None, pipeline_lib.InputPipeline]:
    """The held-out pipelines: one (key None) for config.data.eval_files, or one per source of a mixture that has
    held-out records, config.eval.num_batches split over them."""
    if not sources or shared:
        files = shared or job.data.eval_files
        return (
            {None: _pipeline(job, files, False, batch_size, max_batches=job.eval.num_batches or None)} if files else {}
        )
    held = [(name, files) for name, _, files in sources if files]
    share = max(1, job.eval.num_batches // len(held)) if job.eval.num_batches and held else None
    return {name: _pipeline(job, files, False, batch_size, max_batches=share) for name, files in held}


def _check_branch_schedule(job: JobConfig, step: int) -> None:
    """A branch must not start inside its own decay (the learning rate would drop at once) nor after its end."""
    t = job.train
    if step >= t.num_train_steps:
        raise ValueError(
            f"config.train.branch_from={t.branch_from} starts at step {step}, at or after "
            f"config.train.num_train_steps={t.num_train_steps}; set num_train_steps beyond it "
            f"(a decay of N steps: {step} + N)."
        )
    decay_start = t.num_train_steps - job.optim.decay_steps
    if job.optim.schedule == "wsd" and decay_start < step:
        raise ValueError(
            f"config.train.branch_from={t.branch_from} starts at step {step}, inside the decay "
            f"(steps {decay_start}–{t.num_train_steps}); set config.train.num_train_steps="
            f"{step + job.optim.decay_steps} to decay over the {job.optim.decay_steps} steps after it."
        )


def evaluate(
    trainer: trainer_lib.Trainer, params: Any, pipelines: dict[str | None, pipeline_lib.InputPipeline]
) -> dict[str, float]:
    """One pass over each held-out pipeline (its num_batches): normalised metrics with standard errors, over all
    of them, and per source (`mlm_accuracy_<name>`, `mlm_loss_<name>`, …) for a mixture's."""
    totals = {}
    for name, pipeline in pipelines.items():
        pipeline.reset()
        total = None
        for _, local in zip(range(pipeline.num_batches), pipeline):
            total = metrics_lib.merge(total, trainer.eval_step(params, trainer.global_batch(local)))
        totals[name] = total
    overall = None
    for total in totals.values():
        overall = metrics_lib.merge(overall, total)
    result = metrics_lib.eval_result(overall)
    for name, total in totals.items():
        if name is not None:
            result.update({f"{k}_{name}": v for k, v in metrics_lib.eval_result(total).items() if k in PER_SOURCE})
    return result


def _final_eval(workdir: str, step: int) -> dict | None:
    """metrics.jsonl's eval row for `step` (the run's final eval), or None when it never got written."""
    path = os.path.join(workdir, "metrics.jsonl")
    text = files.read_text(path) if files.exists(path) else ""
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    found = [r for r in rows if r.get("kind") == "eval" and r.get("step") == step]
    return {k: v for k, v in found[-1].items() if k not in ("step", "kind")} if found else None


def _finished(job: JobConfig, workdir: str, latest: int | None, has_eval: bool) -> bool:
    """Whether the newest checkpoint is the last step and the final eval was written: then a rerun of the same
    command has nothing to do (it used to compile, evaluate and export again). Process 0 decides, for all."""
    done = (
        latest is not None
        and latest >= job.train.num_train_steps
        and (not has_eval or _final_eval(workdir, latest) is not None)
        and _restores(workdir, latest)
    )
    if jax.process_count() > 1:  # only process 0 may see metrics.jsonl (hosts without a shared disk)
        from jax.experimental import multihost_utils

        done = bool(multihost_utils.broadcast_one_to_all(jax.numpy.int32(done)))
    return done


def _restores(workdir: str, step: int) -> bool:
    """Whether the step's params read back whole (checksums included); a damaged final step is left to the
    restore, which moves it aside and trains again from the step before."""
    try:
        checkpoint_lib.load_params(workdir, step)
    except Exception as e:  # noqa: BLE001  (whatever orbax raises for a damaged step; the restore names it)
        log.info("restore: the final step %d does not read back (%s); restoring as usual", step, type(e).__name__)
        return False
    return True


def _report_done(job: JobConfig, workdir: str, step: int) -> dict:
    """The finished run's final eval; its HF export written if it is missing (the one thing a rerun still does)."""
    hf_dir = os.path.join(workdir, "hf")
    if job.checkpoint.export_hf and jax.process_index() == 0 and not files.exists(os.path.join(hf_dir, "config.json")):
        from bertjax.jobs import export as exporting

        exporting.export(workdir, hf_dir)
    log.info(
        "done: %s already holds the final step %d (num_train_steps %d) and its eval; nothing to do. To train "
        "on, raise --config.train.num_train_steps; to start over, use a new --workdir.",
        workdir,
        step,
        job.train.num_train_steps,
    )
    return (_final_eval(workdir, step) or {}) if jax.process_index() == 0 else {}


# --- The job -----------------------------------------------------------------------------------------


def train_and_evaluate(config: Any, workdir: str, compile_only: bool = False) -> dict:
    """Runs (or resumes) the configured pre-training job in workdir; returns the last eval metrics.

    `config` is a ConfigDict (converted strictly into a `JobConfig` here) or a `JobConfig`. A SIGTERM
    before the first step (data preparation, compilation, restore) ends it cleanly: nothing was trained."""
    job = config if isinstance(config, JobConfig) else JobConfig.from_configdict(config)  # mistakes: nothing written
    job = pretrained.adopt_init_from(job)  # init_from's architecture and vocab, before any data work
    for warning in job.never_reached():
        log.warning("config: %s", warning)
    if not compile_only:  # absurd sizes: refused before anything is allocated (--compile_only: by XLA's own count)
        memory_check.check_training(
            job.model.architecture,
            job.model.dtype,
            job.train.global_batch_size,
            job.data.max_seq_length,
            job.train.micro_batches,
        )
    return loop_lib.run_job(workdir, lambda stop, lock: _train_and_evaluate(job, workdir, compile_only, stop, lock))


def _train_and_evaluate(
    job: JobConfig, workdir: str, compile_only: bool, stop: loop_lib.StopRequest, lock: lock_lib.WorkdirLock
) -> dict:
    # ===== setup =====
    from bertjax.jobs import stage as stage_lib  # corpus → vocab → records, when the config asks for it
    from bertjax.jobs import vocab_check

    if not compile_only:  # the batch, the processes and the mesh agree, before minutes of data work
        trainer_lib.check_layout(job)
    job = stage_lib.prepare_data(job, workdir)
    given = {k: getattr(job.data, k) for k in ("train_files", "eval_files", "vocab_file")}
    job = job.replace(data=_local_data(job.data))  # a vocab in a bucket: read from its local copy
    job.data.check_records()
    sources, shared_eval = _mixture_sources(job, workdir)
    # the vocab, the model and the records agree, before compiling
    job = vocab_check.check_job_vocab(job, [(f"source {n!r} of config.data.mixture", t) for n, t, _ in sources])
    primary = jax.process_index() == 0
    if primary:  # the paths as given (gs://...), not the host's copies
        files.makedirs(workdir)
        saved = job.replace(data=given).to_dict()
        files.write_whole(os.path.join(workdir, "config.json"), json.dumps(saved, indent=2, sort_keys=True))
    architecture = job.model.architecture
    log.info(
        "setup: %d process(es), %d device(s) (%s), model %s: %s",
        jax.process_count(),
        jax.device_count(),
        jax.default_backend(),
        job.model.size,
        architecture,
    )
    fingerprint = checkpoint_lib.model_fingerprint(architecture, job.model.layer_scan(jax.default_backend()))

    # ===== data =====
    # The schema check runs here, before compilation: a mismatched record set is one clear error.
    local_batch = trainer_lib.process_batch_size(job.train)
    warmup = batch_warmup.BatchWarmup(job.train, job.data.max_seq_length) if job.train.batch_warmup_tokens else None
    # With batch warmup the pipeline reads one micro-batch at a time and a step takes as many as it needs.
    train_data = _pipeline(
        job,
        job.data.train_files,
        True,
        local_batch // job.train.micro_batches if warmup else local_batch,
        sources=tuple((name, train) for name, train, _ in sources),
        warmup=warmup,
    )
    if train_data.plan is not None:
        log.info("data: mixture %s", train_data.plan.describe())
    evals = _eval_pipelines(job, sources, shared_eval, local_batch)
    eval_data = next(iter(evals.values()), None)  # the one held-out set, or a mixture's first source's
    baselines: dict[str, float] = {}
    if evals:
        baselines = metrics_lib.baselines(b for e in evals.values() for _, b in zip(range(e.num_batches), e))
        log.info("data: eval baselines %s", {k: round(v, 4) for k, v in baselines.items()})

    def finished(checkpoints: checkpoint_lib.Checkpointer) -> dict | None:
        latest = checkpoints.latest_step()
        return _report_done(job, workdir, latest) if _finished(job, workdir, latest, bool(evals)) else None

    def data_row(parts: loop_lib.Parts) -> None:
        if job.data.skip_damaged_records:  # what this process skipped, beside the training metrics
            parts.writer.write(
                0,
                {
                    f"{name}_{key}": value
                    for name, data in [("train", train_data)] + [("eval", e) for e in evals.values()]
                    for key, value in (("damaged_files", len(data.damaged)), ("skipped_records", data.skipped_records))
                },
                kind="data",
            )

    def fresh_state(parts: loop_lib.Parts) -> Any:
        trainer = parts.trainer
        if job.train.branch_from:
            state = checkpoint_lib.restore_branch(
                job.train.branch_from, job.checkpoint, fingerprint, trainer.abstract_state, train_data
            )
            _check_branch_schedule(job, int(state.step))
            log.info(
                "restore: branched from %s at step %d (params, optimizer state, data position)",
                job.train.branch_from,
                int(state.step),
            )
            return state
        if job.train.init_from:
            log.info("restore: weights from %s; fresh optimizer state", job.train.init_from)
            return trainer.state_from_params(pretrained.init_params(job.train.init_from, trainer.model))
        return trainer.init_state()

    def feed(data: Any, step: int) -> Any:
        if warmup is None:
            return data
        log.info(
            "batch warmup: %d → %d rows over the first %s tokens (%d steps)",
            job.train.batch_warmup_start,
            job.train.global_batch_size,
            f"{job.train.batch_warmup_tokens:,}",
            warmup.steps(),
        )
        return batch_warmup.WarmupBatches(data, warmup, step)

    watch = loop_lib.NotLearningWatch(job)

    def run_eval(parts: loop_lib.Parts, step: int, params: Any) -> dict:
        if not evals:
            return {}
        result = evaluate(parts.trainer, params, evals)
        result.update(baselines)
        warning = watch.check(step, result)  # once per run; kept in the eval's own metrics.jsonl row
        if warning:
            result["not_learning"] = 1.0
        parts.writer.write(step, result, kind="eval", notes={"warning": warning} if warning else None)
        shown = [("mlm_acc", "mlm_accuracy_baseline")] + (
            [("nsp_acc", "nsp_accuracy_baseline")] if job.data.next_sentence_prediction else []
        )  # MLM-only: none
        log.info(
            "eval  %s | baselines: %s",
            metrics_lib.format_log_line(dict(result, step=step)),
            ", ".join(f"{name} {100 * baselines.get(key, float('nan')):.2f}%" for name, key in shown),
        )
        for name in (n for n in evals if n is not None):  # a mixture's sources, each with its standard errors
            log.info(
                "eval  %s: mlm_acc %.2f%% ± %.2f | mlm_loss %.4f ± %.4f",
                name,
                100 * result[f"mlm_accuracy_{name}"],
                100 * result[f"mlm_accuracy_stderr_{name}"],
                result[f"mlm_loss_{name}"],
                result[f"mlm_loss_stderr_{name}"],
            )
        if warning:
            log.warning("%s", warning)
        return result

    # ===== trainer (mesh, sharded state, compiled step) → restore → loop: loop.run_training =====
    parts, result = loop_lib.run_training(
        job,
        workdir,
        fingerprint,
        train_data,
        stop,
        lock,
        make_trainer=lambda: trainer_lib.setup(job),
        fresh_state=fresh_state,
        evaluate=run_eval,
        finished=finished,
        started=data_row,
        feed=feed,
        compile_only=compile_only,
    )
    if parts is None or result.stopped:
        return result if parts is None else result.last_eval
    state, step, last_eval = result.state, result.step, result.last_eval
    if job.checkpoint.export_hf and primary:
        from bertjax.jobs import export as exporting

        exporting.export(workdir, os.path.join(workdir, "hf"))
    if job.eval.show_predictions and eval_data is not None and job.data.vocab_file:
        from jax.experimental import multihost_utils

        from bertjax.jobs import predict as prediction

        # Params that span processes are gathered by all of them (a collective), then shown by process 0 alone.
        params = multihost_utils.process_allgather(state.params, tiled=True)
    if job.eval.show_predictions and eval_data is not None and job.data.vocab_file and primary:
        eval_data.reset()
        prediction.show_predictions(
            parts.trainer.model,
            params,
            next(eval_data),
            job.data.vocab_file,
            job.data.do_lower_case,
            job.eval.show_predictions,
        )
    log.info("done: %d steps in %s", step, workdir)
    return last_eval
