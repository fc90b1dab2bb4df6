"""The loop every training job runs — pre-training (jobs/main.py) and fine-tuning (finetune.py) alike.

`run_job` holds a workdir for the job (its lock, SIGTERM handling); `train_loop` runs the compiled step
from the restored state to `config.train.num_train_steps`: log lines with rate and ETA, metrics to
TensorBoard and JSONL, evals every `config.eval.every_steps`, checkpoints, a profile window, the
non-finite guard and stop requests — then the final eval and checkpoint. Every exit leaves through the
caller's clean-up path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import signal
import time
from typing import Any, Callable, Iterator, Optional

import jax

from bertjax.runtime import bucket_outage
from bertjax.training import batch_warmup
from bertjax.training import checkpoint as checkpoint_lib
from bertjax.runtime import lock as lock_lib
from bertjax.runtime import stopped_early
from bertjax.training import metrics as metrics_lib
from bertjax.runtime import ownership
from bertjax.training import trainer as trainer_lib
from bertjax.data.pretraining.pipeline import EXAMPLE_WEIGHT

log = logging.getLogger(__name__)
PROFILE_DIR = os.path.join("plugins", "profile")  # where TensorBoard's profile plugin looks under the logdir


class StoppedBeforeTraining(Exception):
    """A SIGTERM arrived before the first step: there is nothing to save."""


class StopRequest:
    """SIGTERM → save at the next step and exit 0; before training starts, stop at once (nothing to save).

    One process: our own handler sets a flag checked after every step. Several processes: JAX's
    preemption service (started by `jax.distributed.initialize`) takes the signal and agrees on one
    step for all of them, which `Checkpointer.reached_preemption` reports without a collective."""

    def __init__(self):
        self.requested = False
        self.training = False
        self._previous = None

    def training_started(self) -> None:
        if self.requested:  # the handler's exception was swallowed where it landed (a GC callback): stop here
            raise StoppedBeforeTraining()
        self.training = True

    def __enter__(self) -> "StopRequest":
        def handler(signum, frame):
            if not self.training:
                self.requested = True
                log.warning("received signal %d before training started: stopping", signum)
                if frame is not None and frame.f_code.co_name == "_xla_gc_callback":
                    return  # JAX's GC hook would print the exception and swallow it: training_started stops
                raise StoppedBeforeTraining()
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


class Profile:
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
            log.info(
                "profile: steps %d–%d traced into %s",
                self.first + 1,
                self.last,
                os.path.join(self.workdir, PROFILE_DIR),
            )

    def stop(self) -> None:
        if self.active:
            jax.profiler.stop_trace()
            self.active = False


class NonfiniteGuard:
    """`config.train.on_nonfinite`: counts the steps the train step skipped (loss or gradients not finite;
    their updates were never applied) and stops the job when the policy says so, before anything after
    them is saved. Each step's flag is read one step late, once the next step is dispatched, so the host
    never waits on the device only to check it; `flush` reads the last one (before a save or a log line)."""

    def __init__(self, train: Any, checkpoints: checkpoint_lib.Checkpointer, learning_rate: float):
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
        log.warning(
            "step %d: the loss or gradients are not finite; its update was not applied (%d such steps in "
            "a row, %d in all)",
            step,
            self.in_a_row,
            self.total,
        )
        if self.policy == "skip" and self.in_a_row < self.limit:
            return
        why = (
            "config.train.on_nonfinite=stop"
            if self.policy == "stop"
            else f"{self.in_a_row} steps in a row, config.train.max_consecutive_nonfinite={self.limit}"
        )
        newest = self.checkpoints.latest_step()
        kept = (
            f"the newest checkpoint, {self.checkpoints.directory}/{newest}, holds finite weights"
            if newest is not None
            else "no checkpoint was written yet"
        )
        raise FloatingPointError(
            f"the loss or gradients of step {step} are not finite ({why}); no such update was applied and {kept}: "
            f"lower config.optim.learning_rate (now {self.learning_rate}), raise config.optim.warmup_steps or "
            "clip with config.optim.max_grad_norm, then rerun the same command to resume."
        )


class NotLearningWatch:
    """`config.eval.not_learning_after`: the one warning of a pre-training run whose held-out evals say it
    is not learning (`metrics.not_learning`), as a sentence naming the settings that usually cause it."""

    def __init__(self, job: Any):
        self.job, self.warned = job, False

    def check(self, step: int, result: dict) -> Optional[str]:
        """The warning, the first time `result` (an eval with its baselines and mlm_targets) calls for one."""
        job = self.job
        why = (
            None
            if self.warned
            else metrics_lib.not_learning(result, step, job.train.num_train_steps, job.eval.not_learning_after)
        )
        if why is None:
            return None
        self.warned = True
        arch = job.model.architecture
        return (
            f"step {step}: this run is not learning: {why}; the usual causes are the learning rate for this "
            f"model size (config.optim.learning_rate={job.optim.learning_rate:g} for {arch.num_hidden_layers} "
            f"layer(s) of hidden size {arch.hidden_size}), the warmup (config.optim.warmup_steps="
            f"{job.optim.warmup_steps} of {job.train.num_train_steps} steps) and the batch size "
            f"(config.train.global_batch_size={job.train.global_batch_size}), so change those "
            f"(config.eval.not_learning_after=0 turns this check off)."
        )


def next_batch(batches: Iterator[Any], in_flight: Any) -> tuple[Any, float]:
    """The next batch and how long it held the device up. Steps are dispatched asynchronously, so the batch is
    fetched while the step `in_flight` (an array it produces) still runs: that time costs nothing and is not
    counted. Only if the step had finished by the time the batch came does the fetch count, all of it (an upper
    bound: the step finished somewhere within it). Counting every fetch read 14% "input-bound" for the ModernBERT
    demo on 2 cores, where the step was still running after 348 of 351 fetches."""
    started = time.perf_counter()
    batch = next(batches)
    seconds = time.perf_counter() - started
    return batch, seconds if in_flight.is_ready() else 0.0


def run_job(workdir: str, body: Callable[[StopRequest, lock_lib.WorkdirLock], dict]) -> dict:
    """body(stop, lock) with the workdir locked and SIGTERM handled; a SIGTERM before the first step
    (data preparation, compilation, restore) ends it cleanly, with nothing trained."""
    try:
        return _locked(workdir, body)
    except Exception as e:  # noqa: BLE001  (whichever client or thread raised it)
        stopped = bucket_outage.stopped_by(e, workdir)  # before the checkpoints were read: their step is unknown
        if stopped is None:
            raise
        raise stopped from None


def _locked(workdir: str, body: Callable[[StopRequest, lock_lib.WorkdirLock], dict]) -> dict:
    ownership.claim_workdir(workdir, primary=jax.process_index() == 0)  # another tool's files: refused, untouched
    checkpoint_lib.check_resumable_by_processes(os.path.join(workdir, checkpoint_lib.CHECKPOINTS))
    with StopRequest() as stop, lock_lib.WorkdirLock(workdir, enabled=jax.process_index() == 0) as lock:
        try:
            return body(stop, lock)
        except StoppedBeforeTraining as e:
            stopped_early.mark(e)  # cli.run_job ends the process at once, keeping what the signal unwound
            log.info(
                "stopped on request before training started: no step had been taken, so nothing was lost; "
                "rerun the same command to go on"
            )
            return {}


@dataclasses.dataclass
class LoopResult:
    state: Any
    step: int
    last_eval: dict
    stopped: bool  # on request (SIGTERM or preemption), after saving


def train_loop(
    trainer: trainer_lib.Trainer,
    state: Any,
    train_data: Any,
    evaluate: Callable[[int, Any], dict],
    checkpoints: checkpoint_lib.Checkpointer,
    writer: metrics_lib.MetricWriter,
    lock: lock_lib.WorkdirLock,
    stop: StopRequest,
    workdir: str,
) -> LoopResult:
    """Steps from `state` to `config.train.num_train_steps` on batches of `train_data` (an iterator of
    host batches that checkpoints save the position of). `evaluate(step, params)` runs the held-out
    evaluation, writes and logs it, and returns its metrics ({} when there is none)."""
    job = trainer.config
    start_step = int(state.step)
    # Rows the compiled step runs: global_batch_size, or fewer when examples are packed several to a row.
    num_steps, global_batch, seq_len = (
        job.train.num_train_steps,
        trainer.batch_abstract[EXAMPLE_WEIGHT].shape[0],
        trainer.task.tokens_per_row or trainer.task.seq_len,
    )
    peak = metrics_lib.peak_flops_per_device(jax.devices()[0].device_kind, job.model.dtype)
    meter = metrics_lib.Throughput(num_steps)
    profile = Profile(workdir, start_step, job.train.profile_steps)
    last_eval: dict[str, float] = {}
    step = start_step
    guard = NonfiniteGuard(job.train, checkpoints, job.optim.learning_rate)
    # Metrics summed since the last log line, carried over a stop: a resumed run logs the rows an uninterrupted one does.
    carried = (checkpoints.restored_carry or {}) if start_step else {}
    running, guard.since_log = metrics_lib.from_carry(carried.get("running")), int(carried.get("skipped", 0))
    carry = lambda: {"running": metrics_lib.to_carry(running), "skipped": guard.since_log}  # noqa: E731
    stop.training_started()  # from here a SIGTERM saves at the next step
    try:
        while step < num_steps:
            batch, held_up = next_batch(train_data, state.step)
            meter.input_wait(held_up)
            state, step_metrics = trainer.train_step(state, trainer.global_batch(batch))
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
                mix = getattr(train_data, "mix_metrics", dict)()  # a data mixture: each source's share and epochs
                values.update(mix)
                timing = meter.update(step)
                rows = global_batch
                if isinstance(train_data, batch_warmup.WarmupBatches):  # the batch is still growing
                    rows = values["batch_rows"] = train_data.rows_at(step - 1)
                if timing:
                    values.update(
                        timing,
                        **metrics_lib.throughput(
                            timing["step_time_s"],
                            rows,
                            seq_len,
                            trainer.task.flops_per_row,
                            peak,
                            jax.device_count(),
                            values["instances_per_row"],
                            values["real_tokens_per_row"],
                        ),
                    )
                try:
                    writer.write(step, values, kind="train")
                except OSError as e:
                    if e.errno == errno.ENOSPC:  # an asynchronous save that filled the disk first says what resumes
                        checkpoints.wait()
                    raise
                lock.refresh()
                log.info("train %s", metrics_lib.format_log_line(dict(values, step=step, num_train_steps=num_steps)))
                if mix:
                    log.info("mix   %s", metrics_lib.format_mix(mix))
                running = None
            if step % job.eval.every_steps == 0 and step < num_steps:
                with meter.paused():
                    last_eval = evaluate(step, state.params) or last_eval
            stopping = stop.reached(step, checkpoints)
            if stopping or checkpoints.due(step):
                guard.flush()  # nothing after a step that stops the job is saved
                failed = getattr(train_data, "stream_error", lambda: None)()
                if failed is not None:  # a failed fetch may sit in the pipeline's buffers: never save its position
                    raise failed
            with meter.paused():
                checkpoints.save(step, state, train_data, carry=carry)
            if stopping:
                checkpoints.save(step, state, train_data, force=True, carry=carry)
                log.info("stopped at step %d on request; rerun the same command to resume", step)
                return LoopResult(state, step, last_eval, stopped=True)
    finally:
        profile.stop()

    # ===== end =====
    guard.flush()
    last_eval = evaluate(step, state.params) or last_eval
    checkpoints.save(step, state, train_data, force=True)
    return LoopResult(state, step, last_eval, stopped=False)


# --- The skeleton every training job runs ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Parts:
    """What a job's hooks are handed once the trainer is built."""

    trainer: trainer_lib.Trainer
    checkpoints: checkpoint_lib.Checkpointer
    writer: metrics_lib.MetricWriter


def run_training(
    job: Any,
    workdir: str,
    fingerprint: dict,
    train_data: Any,
    stop: StopRequest,
    lock: lock_lib.WorkdirLock,
    *,
    make_trainer: Callable[[], trainer_lib.Trainer],
    fresh_state: Callable[[Parts], Any],
    evaluate: Callable[[Parts, int, Any], dict],
    finished: Optional[Callable[[checkpoint_lib.Checkpointer], Optional[dict]]] = None,
    started: Optional[Callable[[Parts], None]] = None,
    feed: Optional[Callable[[Any, int], Any]] = None,
    compile_only: bool = False,
) -> tuple[Optional[Parts], LoopResult | dict]:
    """The pre-training and fine-tuning jobs' shared middle, under one exit path that waits for pending
    checkpoint writes and closes the metric writer: the checkpointer (a foreign workdir refused before
    compiling) → `finished` (a result when there is nothing left to do) → the trainer (`compile_only`: stop
    here) → the metric writer and `started` → this run's newest checkpoint, else `fresh_state` → `feed` (the
    batches from the restored step) → `train_loop`, with `evaluate(parts, step, params)` as its held-out pass.
    Returns (parts, the loop's result), or (None, a result) when it ended before training. A bucket that stops
    answering (or a record set in it that changes) ends it in one sentence naming the committed step the same
    command resumes from."""
    checkpoints = checkpoint_lib.Checkpointer(workdir, job.checkpoint, fingerprint)
    try:
        with contextlib.ExitStack() as cleanup:
            cleanup.callback(checkpoints.close)
            checkpoints.check_compatible_with_newest()  # refuse a foreign workdir before compiling
            done = finished(checkpoints) if finished is not None and not compile_only else None
            if done is not None:
                return None, done
            trainer = make_trainer()
            log.info("mesh: %s over %d devices", dict(trainer.mesh.shape), trainer.mesh.size)
            if compile_only:
                return None, {}
            writer = metrics_lib.MetricWriter(workdir, is_primary=jax.process_index() == 0)  # after the pipelines
            cleanup.callback(writer.close)
            parts = Parts(trainer, checkpoints, writer)
            if started is not None:
                started(parts)
            abstract, damaged_ok = trainer.abstract_state, job.checkpoint.start_over_if_damaged
            state = checkpoints.restore_latest(abstract, train_data, damaged_ok)
            if state is not None:
                log.info("restore: resumed from %s/%d", checkpoints.directory, int(state.step))
            else:
                state = fresh_state(parts)
            data = feed(train_data, int(state.step)) if feed is not None else train_data
            result = train_loop(
                trainer,
                state,
                data,
                lambda step, params: evaluate(parts, step, params),
                checkpoints,
                writer,
                lock,
                stop,
                workdir,
            )
    except Exception as e:  # noqa: BLE001  (whichever client or thread raised it: the clean-up's own included)
        stopped = bucket_outage.stopped_by(e, workdir)
        if stopped is None:
            raise
        raise stopped.resuming_from(checkpoints.settled_step()) from None
    return parts, result
