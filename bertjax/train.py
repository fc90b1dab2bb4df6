"""`train_and_evaluate(config, workdir)`: the pre-training job, in phases under banners.

setup → data → trainer (mesh, sharded state, compiled step: `trainer.setup`) → restore → loop
(train step / log / eval / checkpoint / profile), then a final eval, checkpoint and export. Every exit
— the end, a stop request, non-finite steps past `config.train.on_nonfinite`'s limit, an error — leaves
through one clean-up path that waits for pending checkpoint writes and closes the metric writer.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
from typing import Any, Optional

import jax
from etils import epath

from bertjax import checkpoint as checkpoint_lib
from bertjax import lock as lock_lib
from bertjax import metrics as metrics_lib
from bertjax import pretrained
from bertjax import trainer as trainer_lib
from bertjax.config import JobConfig, TrainConfig
from bertjax.data import pipeline as pipeline_lib

log = logging.getLogger(__name__)
PROFILE_DIR = os.path.join("plugins", "profile")  # where TensorBoard's profile plugin looks under the logdir


class _StoppedBeforeTraining(Exception):
    """A SIGTERM arrived before the first step: there is nothing to save."""


class _StopRequest:
    """SIGTERM → save at the next step and exit 0; before training starts, stop at once (nothing to save).

    One process: our own handler sets a flag checked after every step. Several processes: JAX's
    preemption service (started by `jax.distributed.initialize`) takes the signal and agrees on one
    step for all of them, which `Checkpointer.reached_preemption` reports without a collective."""

    def __init__(self):
        self.requested = False
        self.training = False
        self._previous = None

    def training_started(self) -> None:
        self.training = True

    def __enter__(self) -> "_StopRequest":
        def handler(signum, frame):
            if not self.training:
                log.warning("received signal %d before training started: stopping", signum)
                raise _StoppedBeforeTraining()
            log.warning("received signal %d: saving a checkpoint after this step, then exiting", signum)
            self.requested = True

        if jax.process_count() == 1:
            try:
                self._previous = signal.signal(signal.SIGTERM, handler)
            except ValueError:  # not the main thread: no signal handling
                self._previous = None
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)

    def reached(self, step: int, checkpoints: checkpoint_lib.Checkpointer) -> bool:
        return self.requested or checkpoints.reached_preemption(step)


class _Profile:
    """`config.train.profile_steps`: a jax.profiler trace of that many steps, starting after the first
    (warm-up) step, into workdir/plugins/profile (TensorBoard's profile plugin, or Perfetto)."""

    def __init__(self, workdir: str, start_step: int, num_steps: int):
        self.workdir, self.first, self.last = workdir, start_step + 1, start_step + 1 + num_steps
        self.enabled, self.active = num_steps > 0, False

    def after_step(self, step: int, state: Any) -> None:
        if not self.enabled or step not in (self.first, self.last):
            return
        jax.block_until_ready(state)
        if step == self.first and not self.active:
            jax.profiler.start_trace(self.workdir)
            self.active = True
        elif self.active:
            self.stop()
            log.info("profile: steps %d–%d traced into %s", self.first + 1, self.last,
                     os.path.join(self.workdir, PROFILE_DIR))

    def stop(self) -> None:
        if self.active:
            jax.profiler.stop_trace()
            self.active = False


class _NonfiniteGuard:
    """`config.train.on_nonfinite`: counts the steps the train step skipped (loss or gradients not finite;
    their updates were never applied) and stops the job when the policy says so, before anything after
    them is saved. Each step's flag is read one step late, once the next step is dispatched, so the host
    never waits on the device only to check it; `flush` reads the last one (before a save or a log line)."""

    def __init__(self, train: TrainConfig, checkpoints: checkpoint_lib.Checkpointer, learning_rate: float):
        self.policy, self.limit = train.on_nonfinite, train.max_consecutive_nonfinite
        self.checkpoints, self.learning_rate = checkpoints, learning_rate
        self.in_a_row = self.total = self.since_log = 0
        self._pending: Optional[tuple[int, Any]] = None

    def after_step(self, step: int, flag: Any) -> None:
        previous, self._pending = self._pending, (step, flag)
        if previous is not None:
            self._check(*previous)

    def flush(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._check(*pending)

    def take_log_count(self) -> int:
        """Steps skipped since the last log line (for its `skipped_steps`)."""
        count, self.since_log = self.since_log, 0
        return count

    def _check(self, step: int, flag: Any) -> None:
        if not float(flag):
            self.in_a_row = 0
            return
        self.in_a_row += 1
        self.total += 1
        self.since_log += 1
        log.warning("step %d: the loss or gradients are not finite; its update was not applied (%d such steps in "
                    "a row, %d in all)", step, self.in_a_row, self.total)
        if self.policy == "skip" and self.in_a_row < self.limit:
            return
        why = ("config.train.on_nonfinite=stop" if self.policy == "stop" else
               f"{self.in_a_row} steps in a row, config.train.max_consecutive_nonfinite={self.limit}")
        newest = self.checkpoints.latest_step()
        kept = (f"the newest checkpoint, {self.checkpoints.directory}/{newest}, holds finite weights"
                if newest is not None else "no checkpoint was written yet")
        raise FloatingPointError(
            f"the loss or gradients of step {step} are not finite ({why}); no such update was applied and {kept}: "
            f"lower config.optim.learning_rate (now {self.learning_rate}), raise config.optim.warmup_steps or "
            "clip with config.optim.max_grad_norm, then rerun the same command to resume.")


def _pipeline(job: JobConfig, files: str, training: bool, batch_size: int) -> pipeline_lib.InputPipeline:
    d = job.data
    vocab = None
    if training and d.dynamic_masking:  # the masker needs [MASK], the specials and word-piece boundaries
        from bertjax.data import instances, tokenization

        vocab = instances.Vocab.from_tokenizer(tokenization.load(d.vocab_file, d.do_lower_case))
    return pipeline_lib.InputPipeline(pipeline_lib.PipelineConfig(
        files=files, batch_size=batch_size, max_seq_length=d.max_seq_length,
        max_predictions_per_seq=d.record_predictions, max_instances_per_row=d.record_instances, seed=job.seed,
        shuffle_buffer=d.shuffle_buffer,
        training=training, process_index=jax.process_index(), process_count=jax.process_count(),
        vocab_size=job.model.vocab_size, max_batches=None if training else (job.eval.num_batches or None),
        dynamic_masking=vocab is not None, vocab=vocab, skip_damaged_records=d.skip_damaged_records))


def evaluate(trainer: trainer_lib.Trainer, params: Any, pipeline: pipeline_lib.InputPipeline,
             num_batches: int) -> dict[str, float]:
    """One pass over (at most num_batches of) the held-out pipeline: normalised metrics."""
    pipeline.reset()
    total = None
    for _, local in zip(range(num_batches), pipeline):
        total = metrics_lib.merge(total, trainer.eval_step(params, trainer.global_batch(local)))
    return metrics_lib.normalize(total)


# --- The job -----------------------------------------------------------------------------------------

def train_and_evaluate(config: Any, workdir: str, compile_only: bool = False) -> dict:
    """Runs (or resumes) the configured pre-training job in workdir; returns the last eval metrics.

    `config` is a ConfigDict (converted strictly into a `JobConfig` here) or a `JobConfig`. A SIGTERM
    before the first step (data preparation, compilation, restore) ends it cleanly: nothing was trained."""
    with _StopRequest() as stop, lock_lib.WorkdirLock(workdir, enabled=jax.process_index() == 0) as lock:
        try:
            return _train_and_evaluate(config, workdir, compile_only, stop, lock)
        except _StoppedBeforeTraining:
            log.info("stopped on request before training started: no step had been taken, so nothing was lost; "
                     "rerun the same command to go on")
            return {}


def _train_and_evaluate(config: Any, workdir: str, compile_only: bool, stop: "_StopRequest",
                        lock: lock_lib.WorkdirLock) -> dict:
    # ===== setup =====
    from bertjax.data import stage as stage_lib  # corpus → vocab → records, when the config asks for it

    job = config if isinstance(config, JobConfig) else JobConfig.from_configdict(config)
    job = stage_lib.prepare_data(job, workdir)
    job.data.check_records()
    primary = jax.process_index() == 0
    if primary:  # epath: local or gs://, as orbax
        epath.Path(workdir).mkdir(parents=True, exist_ok=True)
        (epath.Path(workdir) / "config.json").write_text(json.dumps(job.to_dict(), indent=2, sort_keys=True))
    architecture = job.model.architecture
    log.info("setup: %d process(es), %d device(s) (%s), model %s: %s", jax.process_count(), jax.device_count(),
             jax.default_backend(), job.model.size, architecture)
    fingerprint = checkpoint_lib.model_fingerprint(architecture, job.model.scan_layers)

    # ===== data =====
    # The schema check runs here, before compilation: a mismatched record set is one clear error.
    local_batch = trainer_lib.process_batch_size(job.train)
    train_data = _pipeline(job, job.data.train_files, True, local_batch)
    eval_data = _pipeline(job, job.data.eval_files, False, local_batch) if job.data.eval_files else None
    baselines: dict[str, float] = {}
    if eval_data is not None:
        baselines = metrics_lib.baselines(b for _, b in zip(range(eval_data.num_batches), eval_data))
        log.info("data: eval baselines %s", {k: round(v, 4) for k, v in baselines.items()})

    with contextlib.ExitStack() as cleanup:  # the one exit path
        checkpoints = checkpoint_lib.Checkpointer(workdir, job.checkpoint, fingerprint)
        cleanup.callback(checkpoints.close)
        checkpoints.check_compatible_with_newest()  # refuse a foreign workdir before compiling

        # ===== trainer: mesh, sharded state, compiled step =====
        trainer = trainer_lib.setup(job)
        log.info("mesh: %s over %d devices", dict(trainer.mesh.shape), trainer.mesh.size)
        if compile_only:
            return {}
        writer = metrics_lib.MetricWriter(workdir, is_primary=primary)  # after the pipelines: TF stays off GPUs
        cleanup.callback(writer.close)
        if job.data.skip_damaged_records:  # what this process skipped, beside the training metrics
            writer.write(0, {f"{name}_{key}": value for name, data in (("train", train_data), ("eval", eval_data))
                             if data is not None for key, value in (("damaged_files", len(data.damaged)),
                                                                    ("skipped_records", data.skipped_records))},
                         kind="data")

        # ===== restore =====
        state = checkpoints.restore_latest(trainer.abstract_state, train_data, job.checkpoint.start_over_if_damaged)
        if state is not None:
            log.info("restore: resumed from %s/%d", checkpoints.directory, int(state.step))
        elif job.train.init_from:
            state = trainer.state_from_params(pretrained.init_params(job.train.init_from, trainer.model))
            log.info("restore: weights from %s; fresh optimizer state", job.train.init_from)
        else:
            state = trainer.init_state()
        start_step = int(state.step)

        # ===== loop =====
        num_steps, global_batch, seq_len = (job.train.num_train_steps, job.train.global_batch_size,
                                            job.data.max_seq_length)
        flops = metrics_lib.flops_per_sequence(architecture, seq_len, job.data.max_predictions_per_seq)
        peak = metrics_lib.peak_flops_per_device(jax.devices()[0].device_kind, job.model.dtype)
        meter = metrics_lib.Throughput(num_steps)
        profile = _Profile(workdir, start_step, job.train.profile_steps)
        cleanup.callback(profile.stop)
        last_eval: dict[str, float] = {}

        def run_eval(step: int) -> dict:
            if eval_data is None:
                return {}
            with meter.paused():
                result = evaluate(trainer, state.params, eval_data, eval_data.num_batches)
            result.update(baselines)
            writer.write(step, result, kind="eval")
            log.info("eval  %s | baselines: mlm_acc %.2f%%, nsp_acc %.2f%%", metrics_lib.format_log_line(
                dict(result, step=step)), 100 * baselines.get("mlm_accuracy_baseline", float("nan")),
                100 * baselines.get("nsp_accuracy_baseline", float("nan")))
            return result

        running = None
        step = start_step
        guard = _NonfiniteGuard(job.train, checkpoints, job.optim.learning_rate)
        stop.training_started()  # from here a SIGTERM saves at the next step
        while step < num_steps:
            state, step_metrics = trainer.train_step(state, trainer.global_batch(next(train_data)))
            nonfinite = step_metrics.pop("nonfinite")[0]
            running = metrics_lib.merge(running, step_metrics)
            step += 1
            guard.after_step(step, nonfinite)
            if step == start_step + 1:  # the clock starts after the first step: warm-up
                jax.block_until_ready(state.step)
                meter.update(step)
            profile.after_step(step, state)
            if step % job.train.log_every_steps == 0 or step == num_steps:
                guard.flush()
                values = metrics_lib.normalize(running)
                values["skipped_steps"] = guard.take_log_count()
                timing = meter.update(step)
                if timing:
                    values.update(timing, **metrics_lib.throughput(
                        timing["step_time_s"], global_batch, seq_len, flops, peak, jax.device_count(),
                        values["instances_per_row"], values["real_tokens_per_row"]))
                writer.write(step, values, kind="train")
                lock.refresh()
                log.info("train %s", metrics_lib.format_log_line(dict(values, step=step, num_train_steps=num_steps)))
                running = None
            if step % job.eval.every_steps == 0 and step < num_steps:
                last_eval = run_eval(step)
            stopping = stop.reached(step, checkpoints)
            if stopping or checkpoints.due(step):
                guard.flush()  # nothing after a step that stops the job is saved
            with meter.paused():
                checkpoints.save(step, state, train_data)
            if stopping:
                checkpoints.save(step, state, train_data, force=True)
                log.info("stopped at step %d on request; rerun the same command to resume", step)
                return last_eval

        # ===== end =====
        guard.flush()
        last_eval = run_eval(step) or last_eval
        checkpoints.save(step, state, train_data, force=True)
    if job.checkpoint.export_hf and primary:
        from bertjax import export as export_lib

        export_lib.export(workdir, os.path.join(workdir, "hf"))
    if job.eval.show_predictions and eval_data is not None and primary and job.data.vocab_file:
        from bertjax import predict

        eval_data.reset()
        predict.show_predictions(trainer.model, jax.device_get(state.params), next(eval_data), job.data.vocab_file,
                                 job.data.do_lower_case, job.eval.show_predictions)
    log.info("done: %d steps in %s", step, workdir)
    return last_eval
