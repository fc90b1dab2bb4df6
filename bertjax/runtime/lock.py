"""One job per workdir: WORKDIR/job.lock, a lease that a crashed job does not hold forever.

Two jobs in one workdir would interleave checkpoints and metrics. Process 0 creates the lock atomically
(O_EXCL on a disk; on an object store, gs://, a conditional create that only one writer can win) with its
host, pid and the time, and refreshes the time while it trains. A second job that finds
the lock refuses with one sentence, unless the lock is stale:
  - its pid no longer runs on this same host (the job crashed, or was killed with -9), or
  - it has not been refreshed for STALE_AFTER_S (a job on another host that died: a preempted TPU VM).
A stale lock is taken over with a warning. The job removes its lock on every exit it controls.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from typing import Optional

from bertjax.runtime import files

log = logging.getLogger(__name__)
LOCK_FILE = "job.lock"
STALE_AFTER_S = 15 * 60
REFRESH_EVERY_S = 60


class WorkdirLock:
    """`with WorkdirLock(workdir, enabled=process 0):` holds workdir/job.lock for the job's lifetime."""

    def __init__(self, workdir: str, enabled: bool = True):
        self.path = os.path.join(workdir, LOCK_FILE)
        self.enabled = enabled
        self._held_since: Optional[float] = None
        self._refreshed = 0.0

    def __enter__(self) -> "WorkdirLock":
        if self.enabled:
            self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def _record(self) -> dict:
        return {"host": socket.gethostname(), "pid": os.getpid(), "started": self._held_since, "refreshed": time.time()}

    def acquire(self) -> None:
        files.makedirs(os.path.dirname(self.path))
        self._held_since = time.time()
        for _ in range(3):  # a takeover races at most with another taker: try again
            try:
                files.create_new(self.path, json.dumps(self._record()))
            except FileExistsError:
                holder = self._read()
                stale = _stale(holder)
                if stale is None:
                    age = time.time() - float(holder.get("refreshed", 0))
                    raise ValueError(
                        f"{os.path.dirname(self.path)} is in use by another job (pid {holder.get('pid')} on "
                        f"{holder.get('host')}, alive {age:.0f} s ago); wait for it to end, stop it, or use another "
                        f"--workdir. A job that died releases {self.path} by itself: at once on the same host, after "
                        f"{STALE_AFTER_S // 60} minutes from another; delete it only if you are sure no job uses it."
                    )
                log.warning("lock: taking over %s from a job that is gone (%s)", self.path, stale)
                try:
                    files.remove(self.path)
                except FileNotFoundError:
                    pass
                continue
            self._refreshed = time.time()
            return
        raise ValueError(f"could not take {self.path}: other jobs keep taking it; run one job per workdir.")

    def refresh(self) -> None:
        """Marks the job alive (at most every REFRESH_EVERY_S): a lock left behind goes stale otherwise."""
        if self._held_since is None or time.time() - self._refreshed < REFRESH_EVERY_S:
            return
        files.write_whole(self.path, json.dumps(self._record()))
        self._refreshed = time.time()

    def release(self) -> None:
        if self._held_since is None:
            return
        holder = self._read()
        if (holder.get("pid"), holder.get("host")) == (os.getpid(), socket.gethostname()):  # not a taker's lock
            try:
                files.remove(self.path)
            except FileNotFoundError:
                pass
        self._held_since = None

    def _read(self) -> dict:
        try:
            holder = files.read_json(self.path)
            return holder if isinstance(holder, dict) else {}
        except (OSError, ValueError):
            return {}  # unreadable (a job killed while writing it): treated as stale below


def _stale(holder: dict) -> Optional[str]:
    """Why a lock's holder is gone, or None while it may still run."""
    if not holder.get("pid"):
        return "the lock file is empty or unreadable"
    if holder.get("host") == socket.gethostname():
        try:
            os.kill(int(holder["pid"]), 0)
        except ProcessLookupError:
            return f"pid {holder['pid']} no longer runs on this host"
        except PermissionError:
            return None  # it runs, as another user
        return None
    age = time.time() - float(holder.get("refreshed", 0))
    if age > STALE_AFTER_S:
        return f"pid {holder['pid']} on {holder.get('host')} has not refreshed it for {age / 60:.0f} minutes"
    return None
