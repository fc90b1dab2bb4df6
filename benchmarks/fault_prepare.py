"""benchmarks/faults.py's prepare trials: `python -m bertjax.prepare` killed with SIGKILL at a random moment, or
writing onto a disk that fills (a tmpfs, or a simulated one without root); then training on what is there
(refused, or complete: never silently partial) and the same prepare command again (the reference's bytes)."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREPARE_FAULTS = ("prepare_kill", "prepare_disk_full")


def mount_tmpfs(path: str, size: int) -> bool:
    """A small real disk at path (needs root; False without): the full-disk faults of the job and of prepare."""
    os.makedirs(path, exist_ok=True)
    return (
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], capture_output=True).returncode
        == 0
    )


def prepare_flags(data: str, out: str, workers: int) -> list[str]:
    return [
        f"--input_file={os.path.join(data, 'train.txt')}",
        f"--output_dir={out}",
        f"--vocab_file={os.path.join(data, 'vocab', 'vocab.txt')}",
        "--max_seq_length=32",
        "--max_predictions_per_seq=5",
        "--dupe_factor=6",
        "--num_shards=6",
        f"--num_workers={workers}",
    ]


def run_prepare(data: str, out: str, workers: int = 2, prelude: str = "") -> subprocess.Popen:
    """`python -m bertjax.prepare` in a subprocess, after `prelude` (a simulated full disk)."""
    program = (
        prelude + "import runpy, sys\n"
        f"sys.argv = ['bertjax.prepare'] + {prepare_flags(data, out, workers)!r}\n"
        "runpy.run_module('bertjax.prepare', run_name='__main__')\n"
    )
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.Popen(
        [sys.executable, "-c", program], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def record_files(directory: str) -> dict[str, bytes]:
    return (
        {
            f: open(os.path.join(directory, f), "rb").read()
            for f in sorted(os.listdir(directory))
            if f.endswith(".tfrecord")
        }
        if os.path.isdir(directory)
        else {}
    )


def prepare_reference(data: str, out: str) -> tuple[dict[str, bytes], float]:
    start = time.monotonic()
    process = run_prepare(data, out)
    if process.wait():
        raise SystemExit(f"faults: the reference prepare failed: {process.stderr.read()[-2000:]}")
    return record_files(out), time.monotonic() - start


def train_on(out: str) -> tuple[str, str]:
    """What training makes of the directory: ("refused", its sentence) or the files it would read."""
    sys.path.insert(0, ROOT)
    from bertjax.data.pretraining import pipeline as pipeline_lib

    try:
        files = pipeline_lib.InputPipeline(
            pipeline_lib.PipelineConfig(
                files=os.path.join(out, "*.tfrecord"), batch_size=4, max_seq_length=32, max_predictions_per_seq=5
            )
        ).files
    except (OSError, ValueError) as e:
        return "refused", str(e)
    return "files", ",".join(os.path.basename(f) for f in files)


SIMULATED_FULL_PREPARE = """import errno
from bertjax.data.pretraining import records
_open, _left = records.open_for_write, [{room}]
class _Full:
    def __init__(self, f): self.f = f
    def write(self, data):
        _left[0] -= len(data)
        if _left[0] < 0: raise OSError(errno.ENOSPC, "No space left on device")
        return self.f.write(data)
    def __getattr__(self, name): return getattr(self.f, name)
    def __enter__(self): return self
    def __exit__(self, *exc): self.f.close()
records.open_for_write = lambda path: _Full(_open(path))
"""


def children(pid: int) -> list[int]:
    found = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in found.split()]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def prepare_trial(
    fault: str, rng: random.Random, data: str, directory: str, reference: dict[str, bytes], reference_seconds: float
) -> dict:
    out: dict = {"fault": fault}
    records_dir = os.path.join(directory, "records")
    if fault == "prepare_kill":
        process = run_prepare(data, records_dir)
        at = rng.uniform(0.2, 1.0) * reference_seconds
        start, workers = time.monotonic(), set()
        # Mid-prepare means while its workers run: on a fast machine they can start after `at` has passed.
        while (time.monotonic() - start < at or not workers) and process.poll() is None:
            workers.update(children(process.pid))
            time.sleep(0.05)
        out["kill_after_s"] = round(time.monotonic() - start, 2)
        process.kill()
        process.wait()
        time.sleep(3)
        out["workers_seen"], out["workers_left"] = len(workers), sum(map(alive, workers))
    else:
        room = int(rng.uniform(0.2, 0.8) * sum(map(len, reference.values())))
        out["room_kib"] = room // 1024
        disk = os.path.join(directory, "disk")
        out["disk"] = "tmpfs" if mount_tmpfs(disk, room) else "simulated"
        records_dir = os.path.join(disk, "records")
        prelude = SIMULATED_FULL_PREPARE.format(room=room) if out["disk"] == "simulated" else ""
        process = run_prepare(data, records_dir, workers=2 if out["disk"] == "tmpfs" else 1, prelude=prelude)
        out["exit"] = process.wait()
        out["said"] = process.stderr.read().strip().splitlines()[-1:]
    kind, what = train_on(records_dir)
    complete = kind == "files" and record_files(records_dir) == reference
    out["outcome"] = "refused" if kind == "refused" else ("complete" if complete else "partial")
    out["training_said"] = what[:300]
    if fault == "prepare_disk_full":  # the user frees space: the same command on a larger disk
        moved = os.path.join(directory, "records")
        shutil.copytree(records_dir, moved, symlinks=True) if os.path.isdir(records_dir) else os.makedirs(moved)
        if out["disk"] == "tmpfs":
            subprocess.run(["umount", disk], check=True)
        records_dir = moved
    if out["outcome"] == "complete":  # the kill came after the commit: nothing to redo
        out["rerun_identical"] = True
        return out
    rerun = run_prepare(data, records_dir)
    out["rerun_exit"] = rerun.wait()
    out["rerun_identical"] = out["rerun_exit"] == 0 and record_files(records_dir) == reference
    return out
