"""What bertjax adds to orbax for its checkpoints (training/checkpoint.py uses them): per-array checksums,
the input pipeline's position as a checkpoint item, orbax's read-only notice quieted, the reads a failed
restore abandons drained instead of printing ~80 tracebacks, and tensorstore's retries of a failing bucket
held to the retry budget (bucket_outage)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from etils import epath

from bertjax.runtime import bucket_outage, files


class IncompatibleCheckpoint(ValueError):
    """A checkpoint made by another model or process count: the config is wrong, the files are fine."""


def _words(x: jax.Array) -> jax.Array:
    """An array's bits as uint32 words."""
    if x.dtype.itemsize in (4, 8):
        return jax.lax.bitcast_convert_type(x, jnp.uint32)  # 8-byte values: a trailing axis of two words
    return jax.lax.bitcast_convert_type(x, {1: jnp.uint8, 2: jnp.uint16}[x.dtype.itemsize]).astype(jnp.uint32)


@jax.jit
def _checksums(tree: Any) -> list[jax.Array]:
    """One uint32 per array: the wrapping sum of its words. Tensorstore keeps no checksum of array data, so
    flipped bytes would restore silently; any single flipped bit changes this sum, on any sharding (the sum
    is order-free), and it costs one reduction over the state on the device at each save and restore."""
    return [jnp.sum(_words(x), dtype=jnp.uint32) for x in jax.tree.leaves(tree)]


def checksums(tree: Any) -> list[int]:
    return [int(v) for v in jax.device_get(_checksums(tree))]


# --- The input-pipeline position as an orbax item ------------------------------------------------


class PipelineHandler(ocp.CheckpointHandler):
    """Saves/restores `InputPipeline` positions: each process writes and reads its own file."""

    def save(self, directory: epath.Path, args: "PipelineSave") -> None:
        files.makedirs(str(directory))
        args.pipeline.save_state(str(directory / f"process_{jax.process_index()}"))
        if jax.process_index() == 0:
            files.write_whole(str(directory / "processes.json"), json.dumps({"process_count": jax.process_count()}))

    def restore(self, directory: epath.Path, args: "PipelineRestore") -> Any:
        check_process_count(str(directory))
        args.pipeline.restore_state(str(directory / f"process_{jax.process_index()}"))
        return args.pipeline


def check_process_count(directory: str) -> None:
    """Refuses positions saved by another number of processes: each process's position is its own files'
    (or byte ranges'), which another count divides otherwise, so records of the epoch would repeat or be skipped."""
    saved = files.read_json(os.path.join(directory, "processes.json"))["process_count"]
    if saved != jax.process_count():
        workdir = os.path.dirname(os.path.dirname(os.path.dirname(directory.rstrip("/"))))
        raise IncompatibleCheckpoint(
            f"{directory} holds input positions for {saved} process(es) but this run has {jax.process_count()}; "
            f"resume with {saved} (each process's share of the record set is fixed by the count), or start a new "
            f"workdir with --config.train.init_from={workdir} (weights only)."
        )


def check_resumable_by_processes(checkpoints: str) -> None:
    """Before any work: the newest step's input positions were saved by this many processes (check_process_count)."""
    steps = (
        sorted((int(s) for s in files.listdir(checkpoints) if s.isdigit()), reverse=True)
        if files.isdir(checkpoints)
        else []
    )
    for step in steps:
        pipeline = os.path.join(checkpoints, str(step), "pipeline")
        if files.exists(os.path.join(pipeline, "processes.json")):
            check_process_count(pipeline)
            return


@ocp.args.register_with_handler(PipelineHandler, for_save=True)
@dataclasses.dataclass
class PipelineSave(ocp.args.CheckpointArgs):
    pipeline: Any


@ocp.args.register_with_handler(PipelineHandler, for_restore=True)
@dataclasses.dataclass
class PipelineRestore(ocp.args.CheckpointArgs):
    pipeline: Any


class NoReadOnlyNotice(logging.Filter):
    """Drops orbax's warning that a manager opened read-only is read-only: bertjax opens one on purpose
    to read a run (export, predict, fine-tuning's init_from), and the warning reads like a fault."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Given directory is read only")


def _run_sync_draining(coro: Any) -> Any:
    """orbax's `_run_sync_via_new_loop`, except that the loop is closed only once every task on it has ended.

    A restore whose first array read fails (a truncated file) returns at that error while its other reads
    are still running; orbax then closed their event loop under them, and each ended in a traceback on stderr
    ("Event loop is closed", "Exception ignored in: <coroutine object _read_array_index_and_device_put>"):
    ~80 of them after the restore's one warning, which a user reads as a crash. Draining them takes as long
    as their reads."""
    loop = asyncio.new_event_loop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(coro)
    finally:
        pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
        if pending:  # their errors are retrieved here, not printed as never-retrieved
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        asyncio.set_event_loop(None)
        loop.close()


def _drain_abandoned_reads() -> None:
    from orbax.checkpoint._src import asyncio_utils  # private: where run_sync makes its loop (orbax 0.12)

    if callable(getattr(asyncio_utils, "_run_sync_via_new_loop", None)):
        asyncio_utils._run_sync_via_new_loop = _run_sync_draining  # noqa: SLF001


_drain_abandoned_reads()


def _bucket_retries_within_budget() -> None:
    """tensorstore retries a failing bucket 32 times by default (~15 minutes of backoff), whatever bertjax's budget
    says: an outage then held a save, and the job's one sentence, for that long. Its retries are a context
    resource orbax builds its contexts from (orbax 0.12: a module dict, private; absent is fine)."""
    from orbax.checkpoint._src.serialization import tensorstore_utils

    retries = {
        "max_retries": bucket_outage.tensorstore_retries(bucket_outage.retry_seconds()),
        "initial_delay": f"{bucket_outage.FIRST_DELAY_S:g}s",
        "max_delay": f"{bucket_outage.MAX_DELAY_S:g}s",
    }
    for name in ("_BASE_TS_CONTEXT", "_DEFAULT_OCDBT_TS_CONTEXT"):
        context = getattr(tensorstore_utils, name, None)
        if isinstance(context, dict):
            context["gcs_request_retries"] = retries


_bucket_retries_within_budget()
