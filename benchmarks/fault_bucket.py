"""benchmarks/faults.py's bucket trials: the job with its workdir in a bucket (fake-gcs-server on localhost,
tests/gcs_emulator.py), reached through a proxy that misbehaves (tests/gcs_faults.py): a random share of the
requests answered 503 or 429, every connection dropped for a random 1-4 s at a random step, and in half the
trials a SIGTERM at a random step. The same command is rerun until the run is finished (at most twice more);
it must end with the reference run's params, bit for bit (the caller compares)."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
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
