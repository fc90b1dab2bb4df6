"""Run bertjax on a Cloud TPU VM or pod slice: create, setup, run, logs, stop, delete — over gcloud.

    python launch/tpu_vm.py create --name=bert --zone=us-west4-a --accelerator_type=v5litepod-16 [--spot|--queued]
    python launch/tpu_vm.py setup  --name=bert --zone=us-west4-a            # this checkout, on every worker
    python launch/tpu_vm.py run    --name=bert --zone=us-west4-a --workdir=gs://BUCKET/runs/large \\
        [--restart_on_preemption] -- --config=configs/large.py --config.train.global_batch_size=4096
    python launch/tpu_vm.py logs   --name=bert --zone=us-west4-a [--worker=all]
    python launch/tpu_vm.py stop   --name=bert --zone=us-west4-a            # SIGTERM: checkpoint, exit 0
    python launch/tpu_vm.py delete --name=bert --zone=us-west4-a

Standard library only: it composes `gcloud compute tpus tpu-vm …` and `gcloud compute tpus queued-resources
…` commands and runs them; `--dry_run` prints each one instead, a line each, exactly as it would run.
`run` starts the same `python -m bertjax.main …` on every worker at once (`--worker=all`), in the
background, each worker logging to ~/bertjax.log; the job finds its peers itself (jax.distributed on TPU
VMs). With `--restart_on_preemption` it then watches the VM: when a spot or queued VM is preempted it
deletes and re-creates it, re-runs setup and the same command, which resumes from the last checkpoint in
the gs:// workdir. It says what it does at each step.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REMOTE_DIR = "bertjax"  # the checkout's copy in each worker's home directory
LOG = "bertjax.log"
# Per TPU generation: accelerator-type sizes Cloud TPU offers, chips per host, the runtime (software) version
# for JAX, and how many TensorCores the size counts per chip (v4 and v5p name TensorCores, v5e and v6e chips).
GENERATIONS = {
    "v4": dict(sizes=(8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096), chips_per_host=4, cores_per_chip=2,
               runtime="tpu-ubuntu2204-base"),
    "v5litepod": dict(sizes=(1, 4, 8, 16, 32, 64, 128, 256), chips_per_host=4, cores_per_chip=1,
                      runtime="v2-alpha-tpuv5-lite", single_host_max=8),
    "v5p": dict(sizes=tuple(8 * 2 ** i for i in range(11)), chips_per_host=4, cores_per_chip=2,
                runtime="v2-alpha-tpuv5"),
    "v6e": dict(sizes=(1, 4, 8, 16, 32, 64, 128, 256), chips_per_host=4, cores_per_chip=1,
                runtime="v2-alpha-tpuv6e", single_host_max=8),
}
PREEMPTED_STATES = {"PREEMPTED", "TERMINATED", "SUSPENDED", "FAILED"}


class UserError(Exception):
    """Bad input: one sentence, exit 2."""


def hosts(accelerator_type: str) -> int:
    """Workers (hosts) of an accelerator type such as v5litepod-16; UserError for an unknown one."""
    match = re.fullmatch(r"(v4|v5litepod|v5p|v6e)-(\d+)", accelerator_type or "")
    generation = GENERATIONS.get(match[1]) if match else None
    if not generation or int(match[2]) not in generation["sizes"]:
        known = "; ".join(f"{g}-{{{','.join(map(str, v['sizes'][:6]))}…}}" for g, v in GENERATIONS.items())
        raise UserError(f"--accelerator_type={accelerator_type!r} is not a Cloud TPU type this script knows; use one "
                        f"of {known} (e.g. v4-8, v5litepod-16, v5p-8, v6e-8).")
    chips = int(match[2]) // generation["cores_per_chip"]
    if chips <= generation.get("single_host_max", generation["chips_per_host"]):
        return 1
    return chips // generation["chips_per_host"]


def runtime_version(accelerator_type: str) -> str:
    return GENERATIONS[accelerator_type.split("-")[0]]["runtime"]


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    job_args: list[str] = []
    if "--" in argv:  # everything after -- goes to python -m bertjax.main
        cut = argv.index("--")
        argv, job_args = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser(prog="launch/tpu_vm.py", description=__doc__.split("\n")[0])
    p.add_argument("verb", choices=("create", "setup", "run", "logs", "stop", "delete"))
    p.add_argument("--name", required=True, help="the TPU VM's name (and the queued resource's, with --queued)")
    p.add_argument("--zone", default=os.environ.get("CLOUDSDK_COMPUTE_ZONE", ""),
                   help="e.g. us-west4-a (default: $CLOUDSDK_COMPUTE_ZONE)")
    p.add_argument("--project", default="", help="Google Cloud project (default: gcloud's)")
    p.add_argument("--accelerator_type", default="", help="e.g. v4-8, v5litepod-16, v5p-8, v6e-8")
    p.add_argument("--runtime_version", default="", help="TPU software version (default: the one for JAX on "
                   "the accelerator's generation)")
    p.add_argument("--spot", action="store_true", help="a spot VM: cheaper, preemptible at any time")
    p.add_argument("--queued", action="store_true", help="create through a queued resource (waits for capacity)")
    p.add_argument("--source", default=ROOT, help="setup: a bertjax checkout (default: this one) or a .whl")
    p.add_argument("--workdir", default="", help="run: the job's --workdir (gs://… on multi-host slices)")
    p.add_argument("--worker", default="0", help="logs: a worker index or all")
    p.add_argument("--restart_on_preemption", action="store_true",
                   help="run: watch the VM; when preempted, re-create it, set it up and resume the run")
    p.add_argument("--poll_s", type=int, default=60, help="run --restart_on_preemption: seconds between checks")
    p.add_argument("--dry_run", action="store_true", help="print each gcloud command instead of running it")
    args = p.parse_args(argv)
    if not args.zone:
        raise UserError("--zone is missing; pass --zone=ZONE (e.g. us-west4-a) or set CLOUDSDK_COMPUTE_ZONE.")
    if args.verb in ("create", "run") and args.accelerator_type:
        hosts(args.accelerator_type)  # validates it
    if args.verb == "create" and not args.accelerator_type:
        raise UserError("create needs --accelerator_type (e.g. v5litepod-16).")
    if args.verb == "run":
        if not job_args:
            raise UserError("run needs the job's flags after --, e.g. -- --config=configs/large.py.")
        if not args.workdir:
            raise UserError("run needs --workdir (a gs:// path on a multi-host slice).")
        if args.restart_on_preemption and not args.accelerator_type:
            raise UserError("run --restart_on_preemption re-creates the VM: pass --accelerator_type too.")
        if args.accelerator_type and hosts(args.accelerator_type) > 1 and not args.workdir.startswith("gs://"):
            raise UserError(f"--workdir={args.workdir!r} is not on GCS, but {args.accelerator_type} has "
                            f"{hosts(args.accelerator_type)} hosts that must share it; use a gs://BUCKET/… path.")
    return args, job_args


class Gcloud:
    """Builds gcloud commands and runs them (or, dry, prints them)."""

    def __init__(self, args: argparse.Namespace):
        self.args = args

    def _common(self) -> list[str]:
        return [f"--zone={self.args.zone}"] + ([f"--project={self.args.project}"] if self.args.project else [])

    def __call__(self, command: list[str], check: bool = True, capture: bool = False) -> str:
        if self.args.dry_run:
            print(shlex.join(command), flush=True)
            return ""
        result = subprocess.run(command, check=False, text=True, capture_output=capture)
        if check and result.returncode:
            raise SystemExit(f"tpu_vm: `{shlex.join(command[:5])} …` failed with exit code {result.returncode}.")
        return result.stdout or ""

    def tpu_vm(self, verb: str, *rest: str) -> list[str]:
        return ["gcloud", "compute", "tpus", "tpu-vm", verb, *rest, *self._common()]

    def queued(self, verb: str, *rest: str) -> list[str]:
        return ["gcloud", "compute", "tpus", "queued-resources", verb, *rest, *self._common()]

    def ssh(self, script: str, worker: str = "all") -> list[str]:
        return self.tpu_vm("ssh", self.args.name, f"--worker={worker}", f"--command={script}")


def create(gcloud: Gcloud, args: argparse.Namespace) -> None:
    version = args.runtime_version or runtime_version(args.accelerator_type)
    print(f"tpu_vm: creating {args.name} ({args.accelerator_type}, {hosts(args.accelerator_type)} host(s), "
          f"runtime {version}{', spot' if args.spot else ''}{', queued' if args.queued else ''})", file=sys.stderr)
    spot = ["--spot"] if args.spot else []
    if args.queued:
        gcloud(gcloud.queued("create", args.name, f"--node-id={args.name}", f"--accelerator-type={args.accelerator_type}",
                             f"--runtime-version={version}", *spot))
    else:
        gcloud(gcloud.tpu_vm("create", args.name, f"--accelerator-type={args.accelerator_type}",
                             f"--version={version}", *spot))


def setup(gcloud: Gcloud, args: argparse.Namespace) -> None:
    """The checkout (or a wheel) onto every worker, installed with the tpu extra; tcmalloc."""
    print(f"tpu_vm: setting up bertjax from {args.source} on every worker of {args.name}", file=sys.stderr)
    tcmalloc = "(sudo apt-get -qq update && sudo apt-get -qq install -y libtcmalloc-minimal4 || true)"
    if args.source.endswith(".whl"):
        wheel = os.path.basename(args.source)
        gcloud(gcloud.tpu_vm("scp", args.source, f"{args.name}:{wheel}", "--worker=all"))
        install = f"pip install -q {shlex.quote(wheel + '[tpu,gcs]')}"
    else:
        archive = os.path.join(tempfile.gettempdir(), f"{REMOTE_DIR}.tar.gz")
        files = ["git", "-C", args.source, "ls-files", "-z"]  # tracked files only: no .venv, no workdirs
        gcloud(["sh", "-c", f"{shlex.join(files)} | xargs -0 tar -czf {shlex.quote(archive)} -C "
                            f"{shlex.quote(args.source)}"])
        gcloud(gcloud.tpu_vm("scp", archive, f"{args.name}:{REMOTE_DIR}.tar.gz", "--worker=all"))
        install = (f"rm -rf {REMOTE_DIR} && mkdir {REMOTE_DIR} && tar -xzf {REMOTE_DIR}.tar.gz -C {REMOTE_DIR} && "
                   f"pip install -q -e '{REMOTE_DIR}[tpu,gcs]'")
    gcloud(gcloud.ssh(f"set -e; {tcmalloc}; {install}"))


def job_command(args: argparse.Namespace, job_args: list[str]) -> str:
    """The remote shell line every worker runs: the job in the background, its output in ~/bertjax.log."""
    job = shlex.join(["python3", "-m", "bertjax.main", f"--workdir={args.workdir}", *job_args])
    cd = f"cd {REMOTE_DIR} 2>/dev/null || true"
    return f"{cd}; nohup {job} > ~/{LOG} 2>&1 < /dev/null &"


def state(gcloud: Gcloud, args: argparse.Namespace) -> str:
    if args.queued:
        return gcloud(gcloud.queued("describe", args.name, "--format=value(state.state)"), check=False,
                      capture=True).strip()
    return gcloud(gcloud.tpu_vm("describe", args.name, "--format=value(state)"), check=False, capture=True).strip()


def delete(gcloud: Gcloud, args: argparse.Namespace) -> None:
    print(f"tpu_vm: deleting {args.name}", file=sys.stderr)
    if args.queued:
        gcloud(gcloud.queued("delete", args.name, "--force", "--quiet"))
    else:
        gcloud(gcloud.tpu_vm("delete", args.name, "--quiet"))


def run(gcloud: Gcloud, args: argparse.Namespace, job_args: list[str]) -> None:
    print(f"tpu_vm: starting the job on every worker of {args.name}; follow it with "
          f"`python launch/tpu_vm.py logs --name={args.name} --zone={args.zone}`", file=sys.stderr)
    gcloud(gcloud.ssh(job_command(args, job_args)))
    if not args.restart_on_preemption or args.dry_run:
        return
    while True:
        time.sleep(args.poll_s)
        now = state(gcloud, args)
        if now not in PREEMPTED_STATES:
            done = gcloud(gcloud.ssh("pgrep -f bertjax.main > /dev/null && echo running || echo done", worker="0"),
                          check=False, capture=True)
            if "done" in done:
                print(f"tpu_vm: the job on {args.name} has ended; its log: ~/{LOG} on each worker", file=sys.stderr)
                return
            continue
        print(f"tpu_vm: {args.name} is {now}: re-creating it, setting it up and resuming the run from the last "
              f"checkpoint in {args.workdir}", file=sys.stderr)
        delete(gcloud, args)
        create(gcloud, args)
        setup(gcloud, args)
        gcloud(gcloud.ssh(job_command(args, job_args)))


def main(argv: list[str]) -> int:
    try:
        args, job_args = parse_args(argv)
    except UserError as e:
        print(f"tpu_vm: {e}", file=sys.stderr)
        return 2
    gcloud = Gcloud(args)
    if args.verb == "create":
        create(gcloud, args)
    elif args.verb == "setup":
        setup(gcloud, args)
    elif args.verb == "run":
        run(gcloud, args, job_args)
    elif args.verb == "logs":
        gcloud(gcloud.ssh(f"tail -n 100 ~/{LOG}", worker=args.worker))
    elif args.verb == "stop":  # the job, not the VM: SIGTERM makes it checkpoint and exit 0 on every worker
        gcloud(gcloud.ssh("pkill -TERM -f bertjax.main || true"))
    elif args.verb == "delete":
        delete(gcloud, args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
