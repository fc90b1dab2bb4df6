"""benchmarks/faults.py's bucket trials: the job with its workdir in a bucket (fake-gcs-server on localhost,
tests/gcs_emulator.py), reached through a proxy that misbehaves (tests/gcs_faults.py).

  bucket                     a random share of the requests answered 503 or 429, every connection dropped for a
                             random 1-4 s at a random step, and in half the trials a SIGTERM at a random step. The
                             same command is rerun until the run is finished (at most twice more)
  bucket_outage              once a step is committed, every connection dropped for --bucket_outage_s (longer than
                             the clients retry): the run must stop in one sentence naming the committed step and the
                             same command, with no traceback; rerun once the bucket answers, it must resume from
                             that step and finish
  bucket_damaged_final_step  a finished run's final step loses one params object in the bucket; the rerun must move
                             the step aside, resume from the step before, train and save it again, rc 0, in one rerun

Each must end with the reference run's params, bit for bit (the caller compares).
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import sys
import time
from collections.abc import Iterator
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))  # the emulator and the proxy the tests use

import gcs_emulator  # noqa: E402
import gcs_faults  # noqa: E402

BUCKET = gcs_emulator.BUCKET


@contextlib.contextmanager
def emulator(directory: str) -> Iterator[str]:
    """The emulator for every trial; this process's clients pointed at it (the caller reads the runs' params)."""
    with gcs_emulator.running(os.path.join(directory, "gcs-server.log")) as url:
        saved = dict(os.environ)
        os.environ.update(gcs_emulator.client_settings(url))
        gcs_emulator._forget_epath_backend()  # noqa: SLF001  (etils chose its gs:// backend before: choose again)
        try:
            yield url
        finally:
            os.environ.clear()
            os.environ.update(saved)


@contextlib.contextmanager
def _clients_through(url: str) -> Iterator[None]:
    """Jobs started inside reach the bucket through `url` (they inherit os.environ)."""
    saved = dict(os.environ)
    os.environ.update(gcs_emulator.client_settings(url))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def bucket_trial(rng: random.Random, start_job: Callable, steps: int, emulator_url: str, index: int) -> dict:
    """One trial; `start_job(workdir)` starts the job (faults.Job). Returns the row, `workdir` included."""
    workdir = f"gs://{BUCKET}/trial-{index}"
    fail_every = rng.choice((8, 12, 16, 24))
    outage_at, outage_s = rng.randint(2, steps - 2), round(rng.uniform(1.0, 4.0), 1)
    sigterm_at = rng.randint(2, steps - 2) if rng.random() < 0.5 else None
    with gcs_faults.FaultyProxy(emulator_url) as proxy, _clients_through(proxy.url):
        proxy.fail_every(fail_every)
        job = start_job(workdir)
        for step, act in sorted(
            [(outage_at, lambda: proxy.outage(outage_s))]
            + ([(sigterm_at, lambda: job.process.send_signal(signal.SIGTERM))] if sigterm_at else []),
            key=lambda a: a[0],
        ):
            if job.wait_for_step(step):
                act()
        exits = [job.finish()]
        said = [job.lines[-1].strip() if job.lines else ""]
        while (exits[-1] != 0 or sigterm_at) and len(exits) < 3 and not _finished(job):
            job = start_job(workdir)  # the same command: it resumes
            exits.append(job.finish())
            said.append(job.lines[-1].strip() if job.lines else "")
    return {
        "fault": "bucket",
        "fail_every": fail_every,
        "outage_at_step": outage_at,
        "outage_s": outage_s,
        "sigterm_at_step": sigterm_at,
        "requests_failed": proxy.failed,
        "requests_failed_by": proxy.failed_by,
        "connections_dropped": proxy.dropped,
        "exits": exits,
        "said": said,
        "survived": exits[-1] == 0 and all("Traceback" not in s for s in said),
        "steps_lost": 0,  # a resumed run redoes what its last checkpoint did not hold; compared bitwise after
        "items_lost": 0,
        "workdir": workdir,
    }


def _finished(job) -> bool:
    return any("done:" in line for line in job.lines)


# --- An outage longer than the clients retry; a damaged final step ------------------------------------------


ITEMS = ("params", "opt_state", "train", "config", "pipeline")


def _committed(workdir: str) -> list[int]:
    """Steps with orbax's commit mark in the bucket."""
    from bertjax.runtime import files

    directory = f"{workdir}/checkpoints"
    steps = sorted(int(s) for s in files.listdir(directory) if s.isdigit())
    return [s for s in steps if files.exists(f"{directory}/{s}/commit_success.txt")]


def _items(workdir: str) -> set[tuple[int, str]]:
    from bertjax.runtime import files

    return {(s, i) for s in _committed(workdir) for i in ITEMS if files.exists(f"{workdir}/checkpoints/{s}/{i}")}


def _still_there(workdir: str, step: int, item: str) -> bool:
    """The item in its step, or in the step moved aside (damaged-STEP[.N])."""
    from bertjax.runtime import files

    homes = [str(step)] + [
        n for n in files.listdir(f"{workdir}/checkpoints") if re.fullmatch(rf"damaged-{step}(\.\d+)?", n)
    ]
    return any(files.exists(f"{workdir}/checkpoints/{home}/{item}") for home in homes)


def _stderr(job) -> dict:
    """What the user read at the end of a job: its last line, and how many tracebacks the log holds."""
    last = job.lines[-1].strip() if job.lines else ""
    return {"said": last, "tracebacks": sum("Traceback (most recent call last)" in line for line in job.lines)}


def outage_trial(start_job: Callable, steps: int, every: int, emulator_url: str, index: int, seconds: float) -> dict:
    """bucket_outage: `seconds` without answers once step `every` is committed, then the same command."""
    from bertjax.runtime import files

    workdir = f"gs://{BUCKET}/outage-{index}"
    with gcs_faults.FaultyProxy(emulator_url) as proxy, _clients_through(proxy.url):
        job = start_job(workdir)
        deadline = time.monotonic() + 600
        while not files.exists(f"{workdir}/checkpoints/{every}/commit_success.txt") and job.process.poll() is None:
            if time.monotonic() > deadline:
                raise SystemExit(f"faults: {workdir}: step {every} was never committed")
            time.sleep(0.02)
        proxy.outage(seconds)
        started = time.monotonic()
        first_exit = job.finish()
        stopped_after_s = round(time.monotonic() - started, 1)
        first = _stderr(job)
        named = re.search(r"resumes from step (\d+)", first["said"])
        proxy.wait_for_outage_end()
        before = _items(workdir)
        expected = max(_committed(workdir), default=0)
        rerun = start_job(workdir)
        rerun_exit = rerun.finish()
        dropped = proxy.dropped
    resumed = rerun.resumed_from()
    return {
        "fault": "bucket_outage",
        "outage_s": seconds,
        "connections_dropped": dropped,
        "first_exit": first_exit,
        "stopped_after_s": stopped_after_s,
        "said": first["said"],
        "tracebacks": first["tracebacks"] + _stderr(rerun)["tracebacks"],
        "one_sentence": first_exit != 0
        and first["said"].startswith("bertjax: ")
        and "same command" in first["said"]
        and first["tracebacks"] == 0,
        "named_step": int(named.group(1)) if named else 0,
        "rerun_exit": rerun_exit,
        "resumed_from": resumed,
        "survived": rerun_exit == 0 and steps in _committed(workdir),
        "steps_lost": max(expected - resumed, 0),
        "items_lost": sum(not _still_there(workdir, s, i) for s, i in before),
        "workdir": workdir,
    }


def damaged_final_trial(start_job: Callable, steps: int, index: int) -> dict:
    """bucket_damaged_final_step: one params object of the finished run's final step deleted, then the same command."""
    from bertjax.runtime import files

    workdir = f"gs://{BUCKET}/damaged-final-{index}"
    first_exit = start_job(workdir).finish()
    before = _items(workdir)
    params = f"{workdir}/checkpoints/{steps}/params"
    victim = next(f for f in files.glob(f"{params}/**") if "/d/" in f and files.isfile(f))  # array data (ocdbt)
    files.remove(victim)
    expected = max([s for s in _committed(workdir) if s != steps], default=0)
    rerun = start_job(workdir)
    rerun_exit = rerun.finish()
    names = files.listdir(f"{workdir}/checkpoints")
    resumed = rerun.resumed_from()
    return {
        "fault": "bucket_damaged_final_step",
        "first_exit": first_exit,
        "deleted": victim.split(f"/checkpoints/{steps}/", 1)[-1],
        "rerun_exit": rerun_exit,
        **_stderr(rerun),
        "moved_aside": f"damaged-{steps}" in names,
        "resumed_from": resumed,
        "survived": rerun_exit == 0 and steps in _committed(workdir) and f"damaged-{steps}" in names,
        "steps_lost": max(expected - resumed, 0),
        "items_lost": sum(not _still_there(workdir, s, i) for s, i in before),
        "workdir": workdir,
    }
