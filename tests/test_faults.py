"""Faults a long run meets. Damaged checkpoints never stop a run: the job resumes from the newest step
that restores completely, moves the damaged ones aside (never deletes or uses them), and ends with the
params of a run that was never damaged; only when no step restores does it stop, changing nothing, unless
told to start over. A SIGTERM before training exits 0. A second job in a busy workdir is refused; a dead
job's lock is taken over."""

import glob
import json
import os
import shutil
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

import train_setup
from bertjax import checkpoint as checkpoint_lib
from bertjax import lock as lock_lib
from bertjax import train

STEPS = 8


def config(pydocs_data: str, steps: int = STEPS, **overrides):
    return train_setup.small_config(pydocs_data, **{"train.num_train_steps": steps, "checkpoint.every_steps": 2,
                                                    "checkpoint.keep": 10, **overrides})


def final_params(workdir) -> list[np.ndarray]:
    return jax.tree.leaves(checkpoint_lib.load_params(str(workdir))[1])


def step_dirs(workdir) -> list[str]:
    return sorted(os.listdir(os.path.join(workdir, checkpoint_lib.CHECKPOINTS)))


@pytest.fixture(scope="module")
def runs(pydocs_data, tmp_path_factory):
    """(an uninterrupted STEPS-step run's final params, the same run as if stopped after step 6: saves at
    2, 4 and 6)."""
    tmp = tmp_path_factory.mktemp("faults")
    train.train_and_evaluate(config(pydocs_data), str(tmp / "uninterrupted"))
    shutil.copytree(tmp / "uninterrupted", tmp / "stopped")
    shutil.rmtree(tmp / "stopped" / checkpoint_lib.CHECKPOINTS / str(STEPS))
    return final_params(tmp / "uninterrupted"), tmp / "stopped"


def _truncate_largest_opt_state_file(step_dir: str) -> None:
    files = [f for f in glob.glob(os.path.join(step_dir, "opt_state", "**"), recursive=True) if os.path.isfile(f)]
    with open(max(files, key=os.path.getsize), "r+b") as f:
        f.truncate(5000)


DAMAGES = {
    "opt_state array file truncated to 5,000 bytes": (6, _truncate_largest_opt_state_file),
    "params item deleted": (6, lambda d: shutil.rmtree(os.path.join(d, "params"))),
    "an empty step directory": (8, lambda d: os.makedirs(d)),
    "pipeline index truncated to 0 bytes": (6, lambda d: open(os.path.join(d, "pipeline", "process_0.index"),
                                                               "w").close()),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_newest_step_is_moved_aside_and_the_one_before_resumes_exactly(runs, pydocs_data, tmp_path,
                                                                                damage, caplog):
    expected, stopped = runs
    workdir = tmp_path / "work"
    shutil.copytree(stopped, workdir)
    step, harm = DAMAGES[damage]
    harm(os.path.join(workdir, checkpoint_lib.CHECKPOINTS, str(step)))
    with caplog.at_level("INFO", logger="bertjax"):
        train.train_and_evaluate(config(pydocs_data), str(workdir))
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(f"checkpoints/{step} does not restore (" in w for w in warnings), warnings
    assert any(f"moved the damaged step {step} aside" in w for w in warnings), warnings
    resumed = 4 if step == 6 else 6
    assert any(f"resumed from {workdir / checkpoint_lib.CHECKPOINTS}/{resumed}" in r.getMessage()
               for r in caplog.records)
    assert f"damaged-{step}" in step_dirs(workdir)  # kept for the user, under a name orbax ignores
    for a, b in zip(expected, final_params(workdir)):
        np.testing.assert_array_equal(a, b)


def test_when_no_step_restores_the_job_stops_and_changes_nothing_unless_told_to_start_over(
        runs, pydocs_data, tmp_path):
    expected, _ = runs
    workdir = tmp_path / "work"
    shutil.copytree(runs[1], workdir)  # keep only step 2, and damage it
    for step in (4, 6):
        shutil.rmtree(workdir / checkpoint_lib.CHECKPOINTS / str(step))
    shutil.rmtree(workdir / checkpoint_lib.CHECKPOINTS / "2" / "params")
    before = step_dirs(workdir)
    with pytest.raises(ValueError) as error:
        train.train_and_evaluate(config(pydocs_data), str(workdir))
    message = str(error.value)
    assert "no checkpoint in" in message and "step 2: KeyError" in message and "nothing was changed" in message
    assert "--config.checkpoint.start_over_if_damaged=true" in message and "\n" not in message
    assert step_dirs(workdir) == before
    # Told to: the damaged step is moved aside and the run starts from scratch, like one never damaged.
    train.train_and_evaluate(config(pydocs_data, **{"checkpoint.start_over_if_damaged": True}), str(workdir))
    assert "damaged-2" in step_dirs(workdir)
    for a, b in zip(expected, final_params(workdir)):
        np.testing.assert_array_equal(a, b)


def test_a_checkpoint_of_another_model_is_still_refused_not_moved_aside(runs, pydocs_data, tmp_path):
    _, stopped = runs
    workdir = tmp_path / "work"
    shutil.copytree(stopped, workdir)
    with pytest.raises(ValueError, match="different model config"):
        train.train_and_evaluate(config(pydocs_data, **{"model.intermediate_size": 96}), str(workdir))
    assert not [d for d in step_dirs(workdir) if d.startswith(checkpoint_lib.DAMAGED_PREFIX)]


def test_sigterm_before_training_starts_exits_0_saying_nothing_was_lost(tmp_path):
    """The job as a user runs it, sent SIGTERM as its data stage begins (no race: the stage sends it)."""
    c = train_setup.small_config()
    c.data.update(corpus="builtin:pydocs", corpus_vocab_size=train_setup.VOCAB, dupe_factor=2, num_workers=1)
    config_file = train_setup.write_config(c, tmp_path / "config.py")
    program = (
        "import os, signal, sys\n"
        "from bertjax.data import stage\n"
        "prepare = stage.prepare_data\n"
        "def signalled(*args, **kwargs):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return prepare(*args, **kwargs)\n"
        "stage.prepare_data = signalled\n"
        f"sys.argv = ['bertjax.main', '--config={config_file}', '--workdir={tmp_path / 'work'}']\n"
        "from bertjax import main\n"
        "main.define_flags()\n"
        "main.app.run(main.main)\n")
    done = subprocess.run([sys.executable, "-c", program], cwd=train_setup.ROOT, capture_output=True, text=True,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "stopped on request before training started" in out and "nothing was lost" in out
    assert "train step" not in out and "Traceback" not in out
    assert not (tmp_path / "work" / "data" / "train").exists()  # stopped before the stage wrote records


def test_a_second_job_in_a_busy_workdir_is_refused_and_a_dead_jobs_lock_is_taken_over(pydocs_data, tmp_path,
                                                                                      caplog):
    workdir = tmp_path / "work"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from bertjax import lock; "
                               f"lock.WorkdirLock({str(workdir)!r}).acquire(); print('held', flush=True); "
                               "time.sleep(600)"], cwd=train_setup.ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ValueError) as error:
            train.train_and_evaluate(config(pydocs_data, steps=2), str(workdir))
        assert f"is in use by another job (pid {holder.pid} on " in str(error.value) and "\n" not in str(error.value)
        assert not (workdir / checkpoint_lib.CHECKPOINTS).exists()  # refused before touching anything
    finally:
        holder.kill()  # like kill -9: the lock file stays behind
        holder.wait()
    assert (workdir / lock_lib.LOCK_FILE).exists()
    with caplog.at_level("WARNING", logger="bertjax"):
        train.train_and_evaluate(config(pydocs_data, steps=2), str(workdir))
    assert any(f"pid {holder.pid} no longer runs on this host" in r.getMessage() for r in caplog.records)
    assert step_dirs(workdir) == ["2"] and not (workdir / lock_lib.LOCK_FILE).exists()  # released at the end


def test_a_lock_from_another_host_is_respected_until_it_goes_stale(tmp_path):
    path = tmp_path / lock_lib.LOCK_FILE
    for minutes_ago, refused in ((1, True), (lock_lib.STALE_AFTER_S / 60 + 1, False)):
        path.write_text(json.dumps({"host": "another-host", "pid": 4242, "refreshed": time.time() - 60 * minutes_ago}))
        workdir_lock = lock_lib.WorkdirLock(str(tmp_path))
        if refused:
            with pytest.raises(ValueError, match="in use by another job .pid 4242 on another-host"):
                workdir_lock.acquire()
        else:
            with workdir_lock:
                assert json.loads(path.read_text())["pid"] == os.getpid()
            assert not path.exists()
