"""Checkpoints under `workdir/checkpoints`: orbax CheckpointManager with one item per concern.

Items of a step directory:
  params     the model parameters (sharded arrays; restore onto any mesh)
  opt_state  the optimizer state (absent is fine for weights-only `init_from`)
  train      step and the base RNG key
  config     JSON: the model architecture and layout, checked before anything is restored
  pipeline   every process's tf.data iterator position (one file per process)

Saves are asynchronous for arrays; the pipeline position is written synchronously at save time so it
matches the step. Orbax writes into a temporary directory and renames it when every item and process is
done, so a step directory that exists is complete: a job killed mid-save resumes from the previous one.

A save that finds no room (checked before writing on local disks; a write that runs out all the same is
caught too) stops the job with `DiskFull`, one sentence with the bytes; the partial write is removed and
the newest committed step stays as it was.

A step damaged afterwards (a truncated file, a deleted item, an emptied directory) does not stop a run:
`restore_latest` resumes from the newest step that restores completely and moves each newer one aside to
`checkpoints/damaged-STEP` (never deleted, never used). A checkpoint of another model or pipeline config
is the user's mistake, not damage: that stays an error.
"""

from __future__ import annotations

import errno
import glob
import logging
import os
import shutil
from typing import Any, Callable, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp

from bertjax import models as models_lib
from bertjax.config.schema import CheckpointConfig
from bertjax.data.pretraining import pipeline as pipeline_lib
from bertjax.runtime import bucket_outage, files
from bertjax.runtime.files import is_remote
from bertjax.training.checkpoint_items import (  # IncompatibleCheckpoint: raised here too; callers catch it here
    IncompatibleCheckpoint,
    NoReadOnlyNotice,
    PipelineHandler,
    PipelineRestore,
    PipelineSave,
    check_resumable_by_processes,  # noqa: F401  (loop.py calls it here, before any work)
    checksums,
)

log = logging.getLogger(__name__)
COMMIT_SUCCESS = "commit_success.txt"  # orbax's mark of a finished save where it cannot rename (object stores)
CHECKPOINTS = "checkpoints"
DAMAGED_PREFIX = "damaged-"


class DiskFull(OSError):
    """No room for a checkpoint; the newest committed step is intact."""

    errno = errno.ENOSPC


def _out_of_space(error: Optional[BaseException]) -> bool:
    """Whether ENOSPC is behind an error (tensorstore reports it as a ValueError with the OS's words)."""
    while error is not None:
        if getattr(error, "errno", None) == errno.ENOSPC or "No space left on device" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


ROOM_MARGIN = 1.05  # a checkpoint on disk is the state's bytes plus a little metadata


class DamagedCheckpoint(ValueError):
    """A step whose arrays read but do not match the checksums saved with them."""


def model_fingerprint(architecture: Any, scan_layers: bool) -> dict:
    """What a checkpoint's params depend on: the family, the architecture and the layer layout (not the dtype,
    remat or attention implementation, which compute the same function of the same params). Checkpoints
    written before ModernBERT have no "family": they are BERT's."""
    return {
        "family": architecture.model_type,
        "model": architecture.to_dict(),
        "scan_layers": bool(scan_layers) and architecture.scans_layers,
    }


def _handlers() -> dict:
    return {
        "params": ocp.PyTreeCheckpointHandler(),
        "opt_state": ocp.PyTreeCheckpointHandler(),
        "train": ocp.PyTreeCheckpointHandler(),
        "config": ocp.JsonCheckpointHandler(),
        "pipeline": PipelineHandler(),
        "loop": ocp.JsonCheckpointHandler(),  # the loop's unlogged metrics (train_loop's `carry`)
    }


def _restore_args(abstract: Any) -> Any:
    """Restore each array with the sharding of its abstract value (which may be a different mesh)."""
    return ocp.checkpoint_utils.construct_restore_args(abstract)


def _manager(directory: str, options: ocp.CheckpointManagerOptions) -> ocp.CheckpointManager:
    quiet = NoReadOnlyNotice()
    absl_logger = logging.getLogger("absl")  # orbax logs through absl.logging
    absl_logger.addFilter(quiet)
    try:
        return ocp.CheckpointManager(directory, options=options, item_handlers=_handlers())
    finally:
        absl_logger.removeFilter(quiet)


class Checkpointer:
    """Saves and resumes a training run in `workdir/checkpoints`."""

    def __init__(
        self, workdir: str, cfg: CheckpointConfig, fingerprint: dict, read_only: bool = False, async_save: bool = True
    ):
        self.directory = _absolute(os.path.join(workdir, CHECKPOINTS))
        self.fingerprint = fingerprint
        self.every_steps = cfg.every_steps
        options = ocp.CheckpointManagerOptions(
            max_to_keep=cfg.keep,
            keep_period=cfg.keep_every or None,
            create=not read_only,
            enable_async_checkpointing=async_save,
            read_only=read_only,
            save_interval_steps=0 if read_only else 1,
            cleanup_tmp_directories=not read_only,
            # The step's directories made in the save call, not in a thread: a bucket that fails that thread left
            # the save's other items waiting 300 s (orbax's coordination timeout) for its signal.
            async_options=ocp.AsyncOptions(create_directories_asynchronously=False),
        )
        self.manager = _manager(self.directory, options)
        self.keep = cfg.keep
        self._state_bytes = 0  # of the last save: what the next one needs on disk
        self._failed = False  # a save ran out of space: close() then only tidies up
        self.restored_carry: Optional[dict] = None  # the restored step's `carry` (save)
        # The newest step known to be committed (what a rerun resumes from, for the sentence of a job the bucket
        # stopped), and the step of a save in flight: committed once a wait for it returns.
        self.committed: Optional[int] = None if read_only else self.manager.latest_step()
        self._in_flight: Optional[int] = None
        self._closed = False
        self._async = async_save

    def latest_step(self) -> Optional[int]:
        return self.manager.latest_step()

    def check_compatible(self, step: int) -> dict:
        """Refuses a workdir whose checkpoints belong to a different model, before restoring anything;
        returns the step's config item (with the arrays' checksums, for steps saved since they exist)."""
        saved = self.manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))["config"]
        family, saved_family = models_lib.of_fingerprint(self.fingerprint).name, models_lib.of_fingerprint(saved).name
        if family != saved_family:
            raise IncompatibleCheckpoint(
                f"{self.directory}/{step} holds a {saved_family} model, but this run's config.model.family is "
                f"{family!r}; use a new --workdir, or the config the checkpoint was made with."
            )
        diff = (
            models_lib.get(family)
            .config.from_fingerprint(self.fingerprint["model"])
            .differences(saved.get("model", {}))
        )
        if diff:
            raise IncompatibleCheckpoint(
                f"{self.directory}/{step} was made with a different model config ({'; '.join(diff)}); use a new "
                "--workdir, or --config.train.init_from for weights from a compatible model."
            )
        if saved.get("scan_layers") != self.fingerprint["scan_layers"]:
            raise IncompatibleCheckpoint(
                f"{self.directory}/{step} was saved with scan_layers={saved.get('scan_layers')}; resume with "
                f"--config.model.scan_layers={saved.get('scan_layers')} (export and init_from convert between "
                "layouts, resume does not)."
            )
        for key in sorted(
            self.fingerprint.keys() - {"family", "model", "scan_layers"}
        ):  # a fine-tuned run's task, labels
            if saved.get(key) != self.fingerprint[key]:
                raise IncompatibleCheckpoint(
                    f"{self.directory}/{step} was saved with {key}={saved.get(key)!r}, but this run has "
                    f"{key}={self.fingerprint[key]!r}; use a new --workdir (or the data and config it was made with)."
                )
        return saved

    def due(self, step: int) -> bool:
        """Whether `save` saves at this step (not orbax's should_save: that also saves any first step)."""
        return step % self.every_steps == 0

    def save(
        self,
        step: int,
        state: Any,
        pipeline: Any = None,
        force: bool = False,
        carry: Optional[Callable[[], dict]] = None,
    ) -> bool:
        """Saves if the step is due (or force); returns whether a save started. `carry()`: what the loop carries
        over to its next log line (metrics summed since the last), for a resume to log the same line."""
        if not force and not self.due(step):
            return False
        if step in self.manager.all_steps():
            return False
        self._state_bytes = sum(x.nbytes for x in jax.tree.leaves((state.params, state.opt_state)))
        self.wait()  # the previous save's failure first: it decides what this one finds on disk
        self._check_room(step)
        items = dict(
            params=ocp.args.PyTreeSave(state.params),
            opt_state=ocp.args.PyTreeSave(state.opt_state),
            train=ocp.args.PyTreeSave({"step": state.step, "rng": state.rng}),
            config=ocp.args.JsonSave(dict(self.fingerprint, checksums=checksums((state.params, state.opt_state)))),
        )
        if pipeline is not None:
            items["pipeline"] = PipelineSave(pipeline)
        if carry is not None:
            items["loop"] = ocp.args.JsonSave(carry())
        try:
            started = self.manager.save(step, args=ocp.args.Composite(**items), force=True)
        except Exception as e:  # noqa: BLE001
            if _out_of_space(e):
                raise self._disk_full(f"writing step {step}") from None
            raise
        if started and self._async:
            self._in_flight = step
        elif started:
            self.committed = step
        return started

    def wait(self) -> None:
        """Waits for a pending asynchronous save; one that ran out of space is `DiskFull`."""
        try:
            self.manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001
            self._in_flight = None  # not committed: the sentence names the step before it
            if _out_of_space(e):
                raise self._disk_full("writing a checkpoint") from None
            raise
        if self._in_flight is not None:
            self.committed, self._in_flight = self._in_flight, None

    def settled_step(self) -> Optional[int]:
        """The newest committed step once the save in flight (if any) has ended; a save that failed is not one."""
        if not self._closed:
            try:
                self.wait()
            except Exception as e:  # noqa: BLE001  (the failure the caller is reporting, or one it caused)
                log.debug("checkpoint: the save in flight failed: %s", e)
        return self.committed

    def _committed(self) -> list[int]:
        """Steps whose save finished: a step directory on a disk (orbax writes a temporary one and renames it);
        in an object store, which cannot rename, a step directory holding orbax's commit_success.txt."""
        steps = sorted(int(d) for d in files.listdir(self.directory) if d.isdigit())
        if is_remote(self.directory):
            steps = [s for s in steps if files.exists(os.path.join(self.directory, str(s), COMMIT_SUCCESS))]
        return steps

    def _needed_bytes(self) -> int:
        """What one more checkpoint takes: the newest one's size on disk, at least the state's bytes."""
        committed = self._committed()
        on_disk = (
            sum(
                os.path.getsize(os.path.join(root, f))
                for root, _, files in os.walk(os.path.join(self.directory, str(committed[-1])))
                for f in files
            )
            if committed
            else 0
        )
        return int(max(on_disk, self._state_bytes) * ROOM_MARGIN)

    def _check_room(self, step: int) -> None:
        """Refuses a save the file system has no room for, before writing anything (local disks only:
        object stores have no free-space figure)."""
        if is_remote(self.directory):
            return
        needed, free = self._needed_bytes(), shutil.disk_usage(self.directory).free
        if free < needed:
            raise self._disk_full(f"saving step {step}", free)

    def _disk_full(self, what: str, free: Optional[int] = None) -> DiskFull:
        """The one sentence, after removing what a failed write left behind (orbax's *-tmp directories)."""
        self._failed = True
        self._remove_partial_saves()
        if free is None:  # after a failed write: what is free once its partial files are gone
            free = shutil.disk_usage(self.directory).free if not is_remote(self.directory) else 0
        committed = self._committed()
        kept = (
            f"the newest committed checkpoint, step {committed[-1]}, is intact and resumes"
            if committed
            else "no checkpoint had been committed yet"
        )
        mib = 2**20
        return DiskFull(
            f"no space left on device for {what} in {self.directory}: a checkpoint needs about "
            f"{self._needed_bytes() / mib:,.1f} MiB and {free / mib:,.1f} MiB are free; free some space "
            f"(config.checkpoint.keep={self.keep} steps are kept) or move the workdir to a larger disk, "
            f"then rerun: {kept}."
        )

    def _remove_partial_saves(self) -> None:
        if jax.process_index() == 0:
            for partial in glob.glob(os.path.join(self.directory, "*.orbax-checkpoint-tmp*")):
                shutil.rmtree(partial, ignore_errors=True)

    def restore(self, step: int, abstract_state: Any, pipeline: Any = None) -> Any:
        """The state saved at step, placed with abstract_state's shardings; the pipeline repositioned.
        Arrays that do not match their saved checksums are `DamagedCheckpoint`."""
        saved = self.check_compatible(step)
        abstract_train = {"step": abstract_state.step, "rng": abstract_state.rng}
        items = {
            name: ocp.args.PyTreeRestore(item=value, restore_args=_restore_args(value))
            for name, value in (
                ("params", abstract_state.params),
                ("opt_state", abstract_state.opt_state),
                ("train", abstract_train),
            )
        }
        if pipeline is not None:
            items["pipeline"] = PipelineRestore(pipeline)
        if files.exists(os.path.join(self.directory, str(step), "loop")):  # saved since the loop's carry existed
            items["loop"] = ocp.args.JsonRestore()
        try:
            out = self.manager.restore(step, args=ocp.args.Composite(**items))
            self.restored_carry = out["loop"] if "loop" in items else None
        except ValueError as e:
            # The params' layout is the fingerprint's business (checked above), so a tree that reads but
            # differs is the optimizer's: another config.optim, not a damaged file.
            if "tree structures do not match" not in str(e):
                raise
            raise IncompatibleCheckpoint(
                f"{self.directory}/{step} holds optimizer state of another layout than config.optim makes (the "
                "optimizer, or clipping on or off, changed); resume with the optim settings it was saved with, "
                f"or start a new workdir with --config.train.init_from={os.path.dirname(self.directory)} "
                "(weights only)."
            ) from None
        if "checksums" in saved:  # steps saved before checksums existed restore unchecked
            restored = (out["params"], out["opt_state"])
            bad = [
                jax.tree_util.keystr(path)
                for (path, _), now, then in zip(
                    jax.tree_util.tree_leaves_with_path(restored), checksums(restored), saved["checksums"]
                )
                if now != then
            ]
            if bad or len(saved["checksums"]) != len(jax.tree.leaves(restored)):
                raise DamagedCheckpoint(
                    f"{len(bad)} array(s) differ from the checksums saved with them, first "
                    f"{bad[0] if bad else 'the count'}"
                )
        return abstract_state.replace(
            step=out["train"]["step"], params=out["params"], opt_state=out["opt_state"], rng=out["train"]["rng"]
        )

    def check_compatible_with_newest(self) -> None:
        """check_compatible on the newest step whose config item reads (damaged ones are restore's
        business): a foreign workdir is refused before anything is compiled."""
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                self.check_compatible(step)
                return
            except IncompatibleCheckpoint:
                raise
            except Exception:  # noqa: BLE001  (unreadable: restore_latest names it)
                continue

    def restore_latest(self, abstract_state: Any, pipeline: Any = None, start_over_if_damaged: bool = False) -> Any:
        """The newest step that restores completely (as `restore`), or None when there is no checkpoint.

        Each newer step that does not restore is named in a warning with the reason and, once an older
        one has restored, moved aside to checkpoints/damaged-STEP. When no step restores the job stops
        with one error listing them, unless start_over_if_damaged: then all are moved aside and None
        is returned (a fresh start that cannot overwrite them)."""
        damaged: list[tuple[int, str]] = []
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                state = self.restore(step, abstract_state, pipeline)
            except (IncompatibleCheckpoint, pipeline_lib.PipelineMismatch):
                raise
            except Exception as e:  # noqa: BLE001  (orbax, tensorstore and TF each raise their own types)
                if bucket_outage.transient(e):  # the bucket did not answer: the step may be whole, never moved aside
                    raise
                first_line = (str(e).strip() or "no message").splitlines()[0].split(". See full TensorStore")[0]
                reason = f"{type(e).__name__}: {first_line[:200]}"
                log.warning(
                    "checkpoint: %s/%d does not restore (%s); trying the step before it", self.directory, step, reason
                )
                damaged.append((step, reason))
                continue
            self._move_aside([s for s, _ in damaged])
            self.committed = step
            return state
        if damaged and not start_over_if_damaged:
            tried = "; ".join(f"step {s}: {r}" for s, r in damaged)
            raise ValueError(
                f"no checkpoint in {self.directory} restores ({tried}); nothing was changed. Restore "
                "the files, or rerun with --config.checkpoint.start_over_if_damaged=true to move them "
                "aside and train from scratch."
            )
        if damaged:
            log.warning(
                "checkpoint: no step restores; moving all %d aside and starting over "
                "(config.checkpoint.start_over_if_damaged)",
                len(damaged),
            )
            self._move_aside([s for s, _ in damaged])
            if pipeline is not None:
                pipeline.reset()  # a failed restore may have moved it
        return None

    def _move_aside(self, steps: list[int]) -> None:
        """Renames damaged step directories to damaged-STEP (process 0; the others wait for it)."""
        if not steps:
            return
        if jax.process_index() == 0:
            for step in steps:
                source = os.path.join(self.directory, str(step))
                target = os.path.join(self.directory, f"{DAMAGED_PREFIX}{step}")
                n = 1
                while files.exists(target):
                    n += 1
                    target = os.path.join(self.directory, f"{DAMAGED_PREFIX}{step}.{n}")
                files.rename(source, target)
                log.warning(
                    "checkpoint: moved the damaged step %d aside to %s (delete it when you no longer need it)",
                    step,
                    target,
                )
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("bertjax: damaged checkpoints moved aside")
        files.forget_listings()  # in a bucket, orbax's client would still list the moved steps (and skip their saves)
        self.manager.reload()

    def reached_preemption(self, step: int) -> bool:
        """Whether every process has reached JAX's preemption sync point (multi-process runs: the
        coordination service turns a SIGTERM on any host into one agreed step); False in one process."""
        return self.manager.reached_preemption(step)

    def close(self) -> None:
        """Waits for a pending save (its failure for lack of space is `DiskFull`), then closes."""
        try:
            self.wait()
        except Exception as e:  # noqa: BLE001
            if not self._failed or not isinstance(e, DiskFull):
                raise
            log.debug("checkpoint: after the failed save: %s", e)  # already reported: the job is on its way out
        finally:
            self._closed = True
            self._wait_for_tmp_cleanup()
            self.manager.close()
            if self._failed:  # a failed save's writer threads may have written on after the first removal
                self._remove_partial_saves()

    def _wait_for_tmp_cleanup(self) -> None:
        """Orbax removes the *-tmp directories of killed saves in a thread the manager starts at creation;
        only a save waits for it, close() does not (orbax 0.12). A job that fails before its first save
        (a bad mesh, a foreign workdir) would exit under that thread, which then logs a 40-line
        "cannot schedule new futures after interpreter shutdown" traceback after the job's one sentence."""
        pending = getattr(self.manager, "_cleanup_tmp_directory_future", None)  # private: absent is fine
        if pending is None:
            return
        try:
            pending.result()
        except Exception as e:  # noqa: BLE001  (leftovers are only untidy: the next run's manager retries)
            log.warning(
                "checkpoint: could not remove unfinished saves' temporary directories in %s: %s", self.directory, e
            )
        self.manager._cleanup_tmp_directory_future = None  # noqa: SLF001  (as orbax's own wait leaves it)


# --- Branching -----------------------------------------------------------------------------------------


def branch_source(branch_from: str) -> tuple[str, Optional[int]]:
    """`config.train.branch_from`: `WORKDIR` (its newest step) or `WORKDIR/STEP` → (workdir, step or None)."""
    path = branch_from.rstrip("/")
    head, tail = os.path.split(path)
    if tail.isdigit() and not is_workdir(path) and is_workdir(head):
        return head, int(tail)
    return path, None


def restore_branch(
    branch_from: str, cfg: CheckpointConfig, fingerprint: dict, abstract_state: Any, pipeline: Any = None
) -> Any:
    """Another run's whole state at a step — params, optimizer state, step, rng and the data position — for a
    run that goes on from there in its own workdir (a decay branch of a stable-phase run). As `restore`:
    another model or optimizer layout, or damaged arrays, are one sentence."""
    workdir, step = branch_source(branch_from)
    if not is_workdir(workdir):
        raise FileNotFoundError(
            f"config.train.branch_from={branch_from}: {workdir} is not a bertjax workdir (no "
            f"{CHECKPOINTS}/ in it); name a pre-training run's workdir, or WORKDIR/STEP."
        )
    source = Checkpointer(workdir, cfg, fingerprint, read_only=True)
    try:
        steps = sorted(source.manager.all_steps())
        if not steps:
            raise FileNotFoundError(f"config.train.branch_from={branch_from}: {source.directory} holds no checkpoint.")
        step = steps[-1] if step is None else step
        if step not in steps:
            raise ValueError(
                f"config.train.branch_from={branch_from}: {source.directory} has no step {step}, only "
                f"{steps}; branch from one of those (config.checkpoint.keep_every keeps more)."
            )
        return source.restore(step, abstract_state, pipeline)
    finally:
        source.close()


# --- Weights only ------------------------------------------------------------------------------------


def is_workdir(path: str) -> bool:
    return files.isdir(os.path.join(path, CHECKPOINTS))


def _absolute(path: str) -> str:
    """orbax takes absolute paths: a local one made so, a URL (gs://) as it is."""
    return path if is_remote(path) else os.path.abspath(path)


def _reader(workdir: str) -> tuple[str, ocp.CheckpointManager]:
    """A read-only manager of this process alone: orbax's constructor and restores otherwise wait at barriers for
    every process, and a reader runs on one (the export on process 0 once hung the finished multi-host job until
    JAX's shutdown barrier aborted every process)."""
    directory = os.path.join(workdir, CHECKPOINTS)
    me = jax.process_index()
    alone = ocp.options.MultiprocessingOptions(
        primary_host=me, active_processes={me}, barrier_sync_key_prefix=f"reader-{me}-{os.getpid()}"
    )
    return directory, _manager(
        _absolute(directory),
        ocp.CheckpointManagerOptions(
            read_only=True, create=False, save_interval_steps=0, multiprocessing_options=alone
        ),
    )


def read_fingerprint(workdir: str) -> dict:
    """The newest checkpoint's config item (family, model, ...) without its arrays."""
    directory, manager = _reader(workdir)
    try:
        step = manager.latest_step()
        if step is None:
            raise FileNotFoundError(f"{directory} has no checkpoint; train first.")
        return manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))["config"]
    finally:
        manager.close()


def load_params(workdir: str, step: Optional[int] = None) -> tuple[dict, dict]:
    """(fingerprint, params as host numpy arrays in the loop layout) from a bertjax workdir.

    Reads the params item only, so a checkpoint without optimizer state (or from any mesh) is fine; arrays
    that differ from the checksums saved with them are `DamagedCheckpoint`.
    """
    directory, manager = _reader(workdir)
    try:
        step = manager.latest_step() if step is None else step
        if step is None or step not in manager.all_steps():
            raise FileNotFoundError(
                f"{directory} has no checkpoint{'' if step is None else f' for step {step}'}"
                f" (it has {list(manager.all_steps()) or 'none'}); train first or pick a "
                "saved step."
            )
        fingerprint = manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))["config"]
        metadata = manager.item_metadata(step)["params"]
        meta_tree = getattr(metadata, "tree", metadata)
        restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), meta_tree)
        params = manager.restore(
            step, args=ocp.args.Composite(params=ocp.args.PyTreeRestore(restore_args=restore_args))
        )["params"]
        others = [s for s in manager.all_steps() if s != step]
    finally:
        manager.close()
    saved = fingerprint.get("checksums")
    if saved is not None:  # the params' sums lead the list: they flatten before the optimizer state's
        leaves = jax.tree_util.tree_leaves_with_path(params)
        bad = [
            jax.tree_util.keystr(path) for (path, _), now, then in zip(leaves, checksums(params), saved) if now != then
        ]
        if bad:
            raise DamagedCheckpoint(
                f"{directory}/{step} is damaged: {len(bad)} parameter array(s) differ from the checksums saved with "
                f"them, first {bad[0]}; use another step with --step (saved: {others or 'none'})."
            )
    log.info("checkpoint: loaded params of step %d from %s", step, directory)
    return fingerprint, models_lib.of_fingerprint(fingerprint).model.unstack_layers(params)


def place(params: Any, shardings: Any) -> Any:
    """Host arrays → global arrays with the given shardings (every process holds the whole value)."""
    return jax.tree.map(lambda x, s: jax.make_array_from_callback(x.shape, s, lambda idx: x[idx]), params, shardings)
