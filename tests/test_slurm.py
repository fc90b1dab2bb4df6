"""launch/slurm.sbatch run for real on this machine: its body as SLURM runs it, with stand-ins for srun
(two local tasks with the variables srun sets), scancel and scontrol. Both processes train in step, a
SIGTERM to the batch script (what --signal=B:TERM does before the time limit) stops both at one step with a
checkpoint, the job is requeued, and the requeued job resumes and finishes."""

import os
import re
import signal
import socket
import subprocess
import sys
import time

import train_setup

STEPS = 200
SRUN = """#!/usr/bin/env python3
# srun as far as launch/slurm.sbatch needs it: SLURM_NTASKS tasks on this host, one log file each.
import os, subprocess, sys
args = sys.argv[1:]
while args[0].startswith("--"):  # srun's own options, before the command
    args.pop(0)
state = os.environ["FAKE_SLURM_DIR"]
tasks = []
for i in range(int(os.environ["SLURM_NTASKS"])):
    env = dict(os.environ, SLURM_PROCID=str(i), SLURM_LOCALID=str(i), SLURM_STEP_NODELIST="localhost",
               SLURM_STEP_NUM_NODES="1")
    tasks.append(subprocess.Popen(args, env=env, stdout=open(f"{state}/task-{i}.log", "a"), stderr=subprocess.STDOUT))
open(f"{state}/pids", "w").write(" ".join(str(t.pid) for t in tasks))
codes = [t.wait() for t in tasks]
sys.exit(next((c for c in codes if c), 0))
"""
SCANCEL = '#!/bin/bash\n[ "$1" = "--signal=TERM" ] && kill -TERM $(cat "$FAKE_SLURM_DIR/pids")\n'
SCONTROL = '#!/bin/bash\necho "$@" >> "$FAKE_SLURM_DIR/scontrol"\n'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def losses(log: str) -> dict[int, str]:
    return {int(step): loss for step, loss in re.findall(r"train step (\d+)/\d+ \| loss (\S+)", log)}


def test_two_processes_train_in_step_stop_together_on_sigterm_and_the_requeued_job_resumes(pydocs_data, tmp_path):
    c = train_setup.small_config(
        pydocs_data, **{"train.num_train_steps": STEPS, "checkpoint.every_steps": 1000, "eval.every_steps": 1000}
    )
    c.mesh.shape = (-1, 1, 1)
    config_file = train_setup.write_config(c, tmp_path / "config.py")
    bin_dir, state, workdir = tmp_path / "bin", tmp_path / "slurm", tmp_path / "work"
    bin_dir.mkdir()
    state.mkdir()
    for name, text in (("srun", SRUN), ("scancel", SCANCEL), ("scontrol", SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = dict(
        os.environ,
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        FAKE_SLURM_DIR=str(state),
        WORKDIR=str(workdir),
        PYTHON=sys.executable,
        SLURM_JOB_ID="4242",
        SLURM_NTASKS="2",
        SLURM_JOB_NODELIST="localhost",
        JAX_COORDINATOR_PORT=str(free_port()),
        JAX_PLATFORMS="cpu",
        BERTJAX_NO_TCMALLOC="1",
        XLA_FLAGS=train_setup.job_xla_flags(1),
    )
    command = ["bash", str(train_setup.ROOT / "launch" / "slurm.sbatch"), f"--config={config_file}"]

    batch = subprocess.Popen(
        command, env=env, cwd=train_setup.ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.time() + 300
    while len(losses((state / "task-0.log").read_text() if (state / "task-0.log").exists() else "")) < 3:
        assert batch.poll() is None and time.time() < deadline, batch.stdout.read()[-3000:]
        time.sleep(0.05)
    batch.send_signal(signal.SIGTERM)
    out, _ = batch.communicate(timeout=300)
    logs = [(state / f"task-{i}.log").read_text() for i in range(2)]
    assert batch.returncode == 0, out + logs[0][-3000:]
    assert "every process saves a checkpoint at one step" in out
    assert (state / "scontrol").read_text().split() == ["requeue", "4242"]
    assert "2 process(es), 2 device(s)" in logs[0]
    stopped = [int(re.search(r"stopped at step (\d+)", log).group(1)) for log in logs]
    assert stopped[0] == stopped[1] < STEPS, stopped
    assert losses(logs[0]) == losses(logs[1]) and len(losses(logs[0])) == stopped[0]  # in step, all the way

    # The requeued job ends 3 steps after the stop (the flag passed through the script as a user's would be), not
    # at STEPS: the ~190 steps between, on two processes, were a third of this test's CPU and showed nothing more.
    end = stopped[0] + 3
    requeued = subprocess.run(
        [*command, f"--config.train.num_train_steps={end}"],
        env=dict(env, SLURM_RESTART_COUNT="1"),
        cwd=train_setup.ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    logs = [(state / f"task-{i}.log").read_text() for i in range(2)]
    assert requeued.returncode == 0, requeued.stdout + logs[0][-3000:]
    assert "(restart 1)" in requeued.stdout
    assert re.search(rf"resumed from {workdir}/checkpoints/{stopped[0]}\b", logs[0]), logs[0][-3000:]
    assert losses(logs[0]) == losses(logs[1]) and max(losses(logs[0])) == end
    assert str(end) in os.listdir(workdir / "checkpoints")
