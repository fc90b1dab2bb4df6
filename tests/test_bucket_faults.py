"""A run whose bucket misbehaves: 503 and 429 answers on a share of the requests, and an outage of a few seconds
mid-run (tests/gcs_faults.py, a proxy in front of the emulator). The clients' retries carry the run through,
or it stops with one sentence and the same command resumes it; either way it ends with the params of the run
that saw no fault, bit for bit. An endpoint that refuses connections is named as such at once. (An outage longer
than the clients retry, which ends the run in one sentence naming the committed step: tests/test_faults_benchmark.py,
the fault benchmark's bucket_outage trial.)"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import jax
import numpy as np

import train_setup
from bertjax.runtime import files
from bertjax.training import checkpoint as checkpoint_lib
from gcs_emulator import client_settings, gcs_bucket  # noqa: F401  (the fixture)
from gcs_faults import FaultyProxy

STEPS = 6


def run(config_file: str, workdir: str, url: str) -> subprocess.Popen:
    env = dict(os.environ, **client_settings(url), JAX_PLATFORMS="cpu")
    return subprocess.Popen(
        [sys.executable, "-m", "bertjax.main", f"--config={config_file}", f"--workdir={workdir}"],
        env=env,
        cwd=train_setup.ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def steps_logged(workdir: str) -> int:
    path = f"{workdir}/metrics.jsonl"
    text = files.read_text(path) if files.exists(path) else ""
    return max((json.loads(line)["step"] for line in text.splitlines() if '"train"' in line), default=0)


def params(workdir: str) -> list[np.ndarray]:
    _, tree = checkpoint_lib.load_params(workdir)
    return jax.tree.leaves(tree)


def test_a_run_rides_out_503s_429s_and_an_outage_of_its_bucket(pydocs_data, gcs_bucket, tmp_path):  # noqa: F811
    c = train_setup.small_config(pydocs_data, **{"train.num_train_steps": STEPS, "checkpoint.every_steps": 3})
    config_file = train_setup.write_config(c, tmp_path / "config.py")
    emulator = os.environ["STORAGE_EMULATOR_HOST"]
    clean = f"{gcs_bucket}/clean-{tmp_path.name}"
    done = run(config_file, clean, emulator)
    out, _ = done.communicate(timeout=600)
    assert done.returncode == 0, out[-3000:]

    faulty = f"{gcs_bucket}/faulty-{tmp_path.name}"
    with FaultyProxy(emulator) as proxy:
        proxy.fail_every(16)  # one request in 16: 503, 429, 503, ... (each costs the client a backoff of 1-2 s)
        job = run(config_file, faulty, proxy.url)
        deadline = time.monotonic() + 300
        while steps_logged(faulty) < 2:
            assert job.poll() is None, job.stdout.read()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # Mid-run, around the step-3 checkpoint's save, and until a request met it (a CI run once made none in 2 s).
        proxy.outage(2.0, until_dropped=1)
        out, _ = job.communicate(timeout=600)
        reruns = 0
        while job.returncode != 0 and reruns < 2:  # stopped with one sentence: the same command resumes
            assert len(out.strip().splitlines()[-1]) < 600 and "Traceback" not in out, out[-3000:]
            reruns += 1
            job = run(config_file, faulty, proxy.url)
            out, _ = job.communicate(timeout=600)
        assert job.returncode == 0, out[-3000:]
        assert proxy.failed > 5 and proxy.dropped > 0, (proxy.failed, proxy.dropped)
    print(f"faults: {proxy.failed} answered 503/429 {proxy.failed_by}, {proxy.dropped} dropped, {reruns} rerun(s)")
    assert len(proxy.failed_by) >= 2, proxy.failed_by  # both clients met failures: gcsfs and orbax's tensorstore
    for a, b in zip(params(clean), params(faulty)):
        np.testing.assert_array_equal(a, b)

    # A save cut in the middle: a later step's objects without orbax's commit_success.txt (step 3's arrays,
    # which differ from step 6's) are never restored; the newest committed step is.
    checkpoints = f"{faulty}/{checkpoint_lib.CHECKPOINTS}"
    files.filesystem(checkpoints).copy(f"{checkpoints}/3", f"{checkpoints}/9", recursive=True)
    files.remove(f"{checkpoints}/9/{checkpoint_lib.COMMIT_SUCCESS}")
    for a, b in zip(params(clean), params(faulty)):
        np.testing.assert_array_equal(a, b)


def test_credentials_the_bucket_refuses_are_one_sentence_before_any_work(gcs_bucket, tmp_path):  # noqa: F811
    config_file = train_setup.write_config(train_setup.small_config(), tmp_path / "config.py")
    with FaultyProxy(os.environ["STORAGE_EMULATOR_HOST"]) as proxy:
        proxy.forbid()
        job = run(config_file, f"{gcs_bucket}/forbidden", proxy.url)
        out, _ = job.communicate(timeout=300)
    last = out.strip().splitlines()[-1]
    assert job.returncode != 0 and "Traceback" not in out, out[-3000:]
    assert last.startswith(f"bertjax: --workdir={gcs_bucket}/forbidden: {gcs_bucket} cannot be read with this "), last
    assert "gcloud auth application-default login" in last


def test_a_storage_endpoint_that_refuses_connections_is_named_at_once_not_credentials(tmp_path):
    config_file = train_setup.write_config(train_setup.small_config(), tmp_path / "config.py")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    started = time.monotonic()
    job = run(config_file, "gs://bertjax-test/down", url)
    out, _ = job.communicate(timeout=300)
    last = out.strip().splitlines()[-1]
    assert job.returncode == 1 and "Traceback" not in out, out[-3000:]
    assert last.startswith(
        f"bertjax: --workdir=gs://bertjax-test/down: the storage endpoint {url} cannot be reached "
        "(ConnectionRefusedError"
    ), last
    assert f"STORAGE_EMULATOR_HOST={url}" in last and "credentials" not in last, last
    assert time.monotonic() - started < 30  # one attempt, not the clients' retries (67 s once)
