"""launch/tpu_vm.py as users call it, with --dry_run: the gcloud commands it would run, checked against
gcloud's documented syntax, and its refusals of bad input."""

import os
import shlex
import subprocess
import sys

import pytest

import train_setup

SCRIPT = str(train_setup.ROOT / "launch" / "tpu_vm.py")
# Flags each command takes, from the gcloud reference (cloud.google.com/sdk/gcloud/reference/compute/tpus/…).
DOCUMENTED = {
    ("tpu-vm", "create"): {"--zone", "--project", "--version", "--accelerator-type", "--spot", "--preemptible"},
    ("tpu-vm", "ssh"): {"--zone", "--project", "--worker", "--command"},
    ("tpu-vm", "scp"): {"--zone", "--project", "--worker", "--recurse"},
    ("tpu-vm", "delete"): {"--zone", "--project", "--quiet"},
    ("tpu-vm", "describe"): {"--zone", "--project", "--format"},
    ("queued-resources", "create"): {
        "--zone",
        "--project",
        "--node-id",
        "--accelerator-type",
        "--runtime-version",
        "--spot",
    },
    ("queued-resources", "delete"): {"--zone", "--project", "--force", "--quiet"},
}


def launch(*args, env=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in (env or os.environ).items() if k != "CLOUDSDK_COMPUTE_ZONE"}
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, env=env, timeout=60)


def gcloud_lines(out: str) -> list[list[str]]:
    commands = [shlex.split(line) for line in out.splitlines() if line.strip()]
    return [c for c in commands if c[0] == "gcloud"]


def check_documented(command: list[str]) -> None:
    assert command[:3] == ["gcloud", "compute", "tpus"], command
    flags = {a.split("=")[0] for a in command if a.startswith("--")}
    allowed = DOCUMENTED[(command[3], command[4])]
    assert flags <= allowed, f"{shlex.join(command)}: undocumented {flags - allowed}"
    assert "--zone=us-west4-a" in command


@pytest.mark.parametrize(
    "accelerator, extra, group",
    [
        ("v5litepod-16", ["--spot"], "tpu-vm"),
        ("v4-32", ["--queued", "--spot"], "queued-resources"),
    ],
)
def test_create_composes_documented_gcloud_commands(accelerator, extra, group):
    done = launch(
        "create", "--name=bert", "--zone=us-west4-a", f"--accelerator_type={accelerator}", *extra, "--dry_run"
    )
    assert done.returncode == 0, done.stderr
    (command,) = gcloud_lines(done.stdout)
    check_documented(command)
    assert command[3:6] == [group, "create", "bert"] and f"--accelerator-type={accelerator}" in command
    runtime = {"v5litepod-16": "--version=v2-alpha-tpuv5-lite", "v4-32": "--runtime-version=tpu-ubuntu2204-base"}
    assert runtime[accelerator] in command and "--spot" in command
    if group == "queued-resources":
        assert "--node-id=bert" in command
    assert "4 host(s)" in done.stderr  # both are 4-host slices


@pytest.mark.parametrize("accelerator", ["v5litepod-16", "v4-32"])
def test_run_starts_the_same_job_on_every_worker_with_quoting_that_survives(accelerator):
    job = [
        "--config=configs/large.py",
        "--config.mesh.shape=(-1,2,1)",
        "--config.data.corpus=my corpus/*.txt",
        "--config.data.vocab_file=it's.txt",
    ]
    done = launch(
        "run",
        "--name=bert",
        "--zone=us-west4-a",
        f"--accelerator_type={accelerator}",
        "--workdir=gs://bucket/runs/large",
        "--dry_run",
        "--",
        *job,
    )
    assert done.returncode == 0, done.stderr
    (command,) = gcloud_lines(done.stdout)  # one ssh for all workers: the same command on each
    check_documented(command)
    assert command[4:6] == ["ssh", "bert"] and "--worker=all" in command
    remote = next(a for a in command if a.startswith("--command="))[len("--command=") :]
    # What each worker's shell sees: the job's arguments exactly as given, and its output in a log.
    words = shlex.split(remote)
    start = words.index("python3")
    assert words[start : start + 4 + len(job)] == [
        "python3",
        "-m",
        "bertjax.main",
        "--workdir=gs://bucket/runs/large",
        *job,
    ]
    assert "nohup" in words and "~/bertjax.log" in remote


def test_setup_copies_the_checkout_to_every_worker_and_installs_the_tpu_extra():
    done = launch("setup", "--name=bert", "--zone=us-west4-a", "--dry_run")
    assert done.returncode == 0, done.stderr
    scp, ssh = gcloud_lines(done.stdout)
    for command in (scp, ssh):
        check_documented(command)
        assert "--worker=all" in command
    assert scp[4] == "scp" and "bert:bertjax.tar.gz" in scp
    install = next(a for a in ssh if a.startswith("--command="))
    assert "pip install -q -e 'bertjax[tpu,gcs]'" in install and "libtcmalloc-minimal4" in install


def test_stop_logs_and_delete():
    out = {verb: launch(verb, "--name=bert", "--zone=us-west4-a", "--dry_run") for verb in ("stop", "logs", "delete")}
    assert all(d.returncode == 0 for d in out.values())
    (stop,), (logs,), (delete,) = (gcloud_lines(out[v].stdout) for v in ("stop", "logs", "delete"))
    for command in (stop, logs, delete):
        check_documented(command)
    assert "--command=pkill -TERM -f bertjax.main || true" in stop and "--worker=all" in stop
    assert "--worker=0" in logs and delete[4:6] == ["delete", "bert"]


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ["create", "--name=b", "--zone=us-west4-a", "--accelerator_type=v5e-16"],
            "--accelerator_type='v5e-16' is not a Cloud TPU type this script knows",
        ),
        (
            [
                "run",
                "--name=b",
                "--zone=us-west4-a",
                "--accelerator_type=v4-32",
                "--workdir=/tmp/run",
                "--",
                "--config=configs/large.py",
            ],
            "--workdir='/tmp/run' is not on GCS, but v4-32 has 4 hosts",
        ),
        (["create", "--name=b", "--accelerator_type=v4-8"], "--zone is missing"),
        (["run", "--name=b", "--zone=us-west4-a", "--workdir=gs://b/r"], "run needs the job's flags after --"),
    ],
)
def test_bad_input_is_one_sentence_and_a_non_zero_exit(args, expected):
    done = launch(*args, "--dry_run")
    assert done.returncode == 2 and not done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], done.stderr
