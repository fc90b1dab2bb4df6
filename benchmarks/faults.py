"""Fault injection: a run hit by kill -9, a damaged checkpoint, a full disk or a SIGTERM, then rerun with the
same command, must end exactly where a run that was never hit ends.

    python benchmarks/faults.py --trials=N [--seed=S] [--steps=30] [--workdir=DIR]

The job itself (`python -m bertjax.main`, a one-layer model on records made once from builtin:pydocs,
a checkpoint every 5 steps, an eval every 10) runs once uninterrupted for reference. Each trial then
starts it afresh, injects one fault, and reruns the same command until it finishes. Faults, in turn:

  kill        SIGKILL at a random moment: after a random step's log line and a random 0–0.3 s more, so it
              lands in steps, in asynchronous saves and in evals
  damage      SIGTERM once two checkpoints are committed (the job saves and exits 0), then one random
              damage to the newest step: an array file truncated, an item deleted, the step emptied, the
              pipeline position truncated, bytes flipped in the params
  disk_full   the workdir on a tmpfs with room for 1.5–3.5 checkpoints, so a save finds no room; the
              workdir is then moved to a larger disk (without root: free space simulated the same way)
  sigterm     SIGTERM at a random moment (the job saves at the next step and exits 0)
  moved       SIGTERM at a random moment, then the workdir copied elsewhere (as `cp -a` to a larger disk)
              and the records moved to another directory with the same names; the rerun is the same
              command there, with the new record paths

Then prepare's own faults (--prepare_trials, in turn; benchmarks/fault_prepare.py), each followed by training
on what is there (refused, or complete; never silently partial) and the same prepare command again (it must
write the reference's records, byte for byte):

  prepare_kill       `python -m bertjax.prepare --num_workers=2` killed with SIGKILL at a random moment
                     of its run; its workers must not outlive it
  prepare_disk_full  prepare writing onto a tmpfs with room for 20-80% of the records (without root: a
                     disk that fills after as many bytes, simulated in the writer)

Then the stop-during-compile fault of fine-tuning and the GLUE suite (--compile_stop_trials, in turn), on a
small labelled task from the reference run's weights:

  finetune_compile   `python -m bertjax.finetune` sent SIGTERM at a random moment of its compile (after its
                     model is built, before its first step: a preemptible VM's signal); it must exit 0, never
                     crash (a segfault in the interpreter's shutdown used to end it, rc 139), and the same
                     command must then train to the end
  glue_compile       the same for `python -m bertjax.glue` on one task (SST-2's layout)

Then --bucket_trials (benchmarks/fault_bucket.py): the job with its workdir in a bucket on localhost, behind a
proxy answering a share of requests 503/429, dropping connections for 1-4 s, and SIGTERM in half the trials. And
the bucket's two hard cases, one trial each by default:

  bucket_outage              (--bucket_outage_trials) once a step is committed, the bucket drops every connection
                             for --bucket_outage_s (default 120, longer than its clients retry; the jobs' retry
                             budget is --bucket_retry_s, default theirs, 15 minutes): the run must stop in one
                             sentence naming the committed step and "the same command", with no traceback; rerun
                             once the bucket answers, it must resume from that step and finish
  bucket_damaged_final_step  (--bucket_damage_trials) a finished run's final step loses one params object in the
                             bucket: one rerun must move the step aside, retrain and save it, rc 0

Prints one JSON line:
  trials             trials run
  survived           trials whose rerun finished every step
  bitwise_identical  trials whose final params equal the uninterrupted run's, bit for bit
  steps_lost         over all trials: committed steps that a rerun did not resume from (the newest one that
                     was not damaged on purpose is where it must resume; must be 0)
  items_lost         over all trials: items of committed steps (params, opt_state, train, config, pipeline)
                     that were gone afterwards, neither in checkpoints/ nor moved aside to damaged-STEP, not
                     counting what a damage deleted on purpose (must be 0)
  by_fault           the same counts per fault, and each trial's details; bucket: the same for those trials
  bucket_outage      the same counts, plus one_sentence (failing runs whose stderr ended in one sentence naming the
                     step and the same command) and tracebacks (in all of the trials' stderr: must be 0), and each
                     trial's details (named_step, resumed_from, stopped_after_s, said)
  bucket_damaged_final_step  the same counts, plus tracebacks, and each trial's details (moved_aside, resumed_from)
  compile_stops      trials, clean_exits (rc 0), crashes (killed by a signal or rc 139: must be 0),
                     reruns_finished, and each trial's details
  prepare            prepare_trials, refused, complete, partial (training on a partial set: must be 0),
                     workers_left (workers alive 3 s after their parent was killed: must be 0),
                     rerun_identical, and each trial's details
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # its sibling below, however it is loaded
from fault_compile_stops import compile_stop_trial  # noqa: E402  (benchmarks/, beside this file)
from fault_prepare import PREPARE_FAULTS, mount_tmpfs, prepare_reference, prepare_trial  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAULTS = ("kill", "damage", "disk_full", "sigterm", "moved")
COMPILE_FAULTS = ("finetune_compile", "glue_compile")
ITEMS = ("params", "opt_state", "train", "config", "pipeline")
EVERY = 5  # checkpoint every EVERY steps


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--faults", default=",".join(FAULTS), help=f"the job's faults the trials cycle through, of {FAULTS}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--prepare_trials", type=int, default=4)
    p.add_argument("--compile_stop_trials", type=int, default=4)
    p.add_argument("--compile_faults", default=",".join(COMPILE_FAULTS), help=f"of {COMPILE_FAULTS}")
    p.add_argument("--bucket_trials", type=int, default=2, help="the workdir in a misbehaving bucket")
    p.add_argument("--bucket_outage_trials", type=int, default=1, help="the bucket down for --bucket_outage_s")
    p.add_argument("--bucket_outage_s", type=float, default=120.0, help="how long the bucket is down")
    p.add_argument("--bucket_retry_s", type=float, default=0.0, help="the jobs' retry budget (0: their default)")
    p.add_argument("--bucket_damage_trials", type=int, default=1, help="a damaged final step in the bucket")
    p.add_argument("--workdir", default="", help="keep every run here (default: a temporary directory)")
    return p.parse_args()


# --- The job -------------------------------------------------------------------------------------------


def make_data(directory: str) -> str:
    sys.path.insert(0, ROOT)
    from bertjax.config.schema import JobConfig
    from bertjax.jobs import stage

    c = _config("")
    c.data.update(corpus="builtin:pydocs", corpus_vocab_size=1000, dupe_factor=2, num_shards=4, num_workers=1)
    stage.prepare_data(JobConfig.from_configdict(c), directory)
    return os.path.join(directory, "data")


def _config(data: str, steps: int = 30):
    import runpy

    c = runpy.run_path(os.path.join(ROOT, "configs", "default.py"))["get_config"]("size=tiny")
    c.model.update(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        scan_layers=False,
    )
    c.data.update(max_seq_length=32, max_predictions_per_seq=5, shuffle_buffer=100)
    c.train.update(global_batch_size=16, num_train_steps=steps, log_every_steps=1)
    c.optim.update(learning_rate=1e-3, warmup_steps=2)
    c.checkpoint.update(every_steps=EVERY, keep=100, keep_every=0)  # keep all: a vanished item is a lost one
    c.eval.update(every_steps=10, num_batches=2)
    if data:
        c.data.update(
            train_files=os.path.join(data, "train", "*.tfrecord"),
            eval_files=os.path.join(data, "heldout", "*.tfrecord"),
            vocab_file=os.path.join(data, "vocab", "vocab.txt"),
        )
    return c


def write_config(data: str, steps: int, path: str) -> str:
    with open(path + ".json", "w") as f:
        f.write(_config(data, steps).to_json())
    with open(path, "w") as f:
        f.write(
            "import json\nimport ml_collections\n\n\ndef get_config():\n"
            f"    return ml_collections.ConfigDict(json.load(open({path + '.json'!r})))\n"
        )
    return path


class Job:
    """`python -m bertjax.main` in a subprocess, its log read line by line as it comes."""

    def __init__(self, config_file: str, workdir: str, prelude: str = ""):
        program = (
            prelude + "import sys\nfrom bertjax import cli, main\n"
            f"sys.argv = ['bertjax.main', '--config={config_file}', '--workdir={workdir}']\n"
            "main.define_flags()\ncli.run(main.main)\n"
        )
        env = dict(os.environ, JAX_PLATFORMS="cpu", BERTJAX_NO_TCMALLOC="1", TF_CPP_MIN_LOG_LEVEL="2")
        self.process = subprocess.Popen(
            [sys.executable, "-c", program],
            cwd=ROOT,
            env=env,
            text=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self.lines: list[str] = []
        self.steps_logged = 0
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stderr:
            with self._changed:
                self.lines.append(line)
                found = re.search(r"train step (\d+)/", line)
                if found:
                    self.steps_logged = int(found.group(1))
                self._changed.notify_all()

    def wait_for_step(self, step: int, timeout: float = 300) -> bool:
        """Until the log shows `step` (False when the job ended first)."""
        with self._changed:
            return (
                self._changed.wait_for(lambda: self.steps_logged >= step or self.process.poll() is not None, timeout)
                and self.steps_logged >= step
            )

    def finish(self, timeout: float = 600) -> int:
        code = self.process.wait(timeout)
        time.sleep(0.1)  # the reader thread takes the last lines
        return code

    def resumed_from(self) -> int:
        for line in self.lines:
            found = re.search(r"restore: resumed from .*/(\d+)\s*$", line)
            if found:
                return int(found.group(1))
        return 0


# --- What is on disk -----------------------------------------------------------------------------------


def checkpoints(workdir: str) -> str:
    return os.path.join(workdir, "checkpoints")


def committed(workdir: str) -> list[int]:
    """Committed steps: orbax renames a step's directory into place only when all of it is written."""
    d = checkpoints(workdir)
    return sorted(int(s) for s in os.listdir(d) if s.isdigit()) if os.path.isdir(d) else []


def items(workdir: str) -> set[tuple[int, str]]:
    return {
        (step, item)
        for step in committed(workdir)
        for item in ITEMS
        if os.path.exists(os.path.join(checkpoints(workdir), str(step), item))
    }


def still_there(workdir: str, step: int, item: str) -> bool:
    d = checkpoints(workdir)
    homes = [str(step)] + [s for s in os.listdir(d) if re.fullmatch(rf"damaged-{step}(\.\d+)?", s)]
    return any(os.path.exists(os.path.join(d, home, item)) for home in homes)


def final_params(workdir: str) -> list:
    import jax

    from bertjax.training import checkpoint as checkpoint_lib

    return jax.tree.leaves(checkpoint_lib.load_params(workdir)[1])


def identical(a: list, b: list) -> bool:
    import numpy as np

    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def _files(directory: str) -> list[str]:
    return sorted(os.path.join(root, f) for root, _, names in os.walk(directory) for f in names)


def damage(step_dir: str, rng: random.Random) -> tuple[str, set[str]]:
    """One random damage to a committed step: (what was done, the items it deleted on purpose)."""

    def truncate(path: str, size: int) -> None:
        with open(path, "r+b") as f:
            f.truncate(size)

    kind = rng.choice(["truncate opt_state", "delete params", "empty step", "truncate pipeline", "flip params"])
    if kind == "truncate opt_state":
        truncate(max(_files(os.path.join(step_dir, "opt_state")), key=os.path.getsize), 5000)
        return kind, set()
    if kind == "delete params":
        shutil.rmtree(os.path.join(step_dir, "params"))
        return kind, {"params"}
    if kind == "empty step":
        shutil.rmtree(step_dir)
        os.makedirs(step_dir)
        return kind, set(ITEMS)
    if kind == "truncate pipeline":
        truncate(os.path.join(step_dir, "pipeline", "process_0.index"), 0)
        return kind, set()
    path = max(_files(os.path.join(step_dir, "params")), key=os.path.getsize)
    data = bytearray(open(path, "rb").read())
    for at in rng.sample(range(len(data)), 16):
        data[at] ^= 0xFF
    open(path, "wb").write(bytes(data))
    return kind, set()


# --- Trials --------------------------------------------------------------------------------------------


SIMULATED_FULL = """import shutil, os
_usage = shutil.disk_usage
def _full(path, _room={room}):
    used = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk({workdir!r}) for f in fs)
    return _usage(path)._replace(free=max(_room - used, 0))
shutil.disk_usage = _full
"""


def trial(
    fault: str, rng: random.Random, config_file: str, steps: int, directory: str, checkpoint_bytes: int, data: str
) -> dict:
    workdir = os.path.join(directory, "work")
    out: dict = {"fault": fault}
    deleted: set[tuple[int, str]] = set()
    damaged_step = None
    if fault == "disk_full":
        room = int(checkpoint_bytes * rng.uniform(1.5, 3.5))
        out["room_mib"] = round(room / 2**20, 2)
        disk = os.path.join(directory, "disk")
        out["disk"] = "tmpfs" if mount_tmpfs(disk, room) else "simulated"
        full_workdir = os.path.join(disk, "work")
        prelude = SIMULATED_FULL.format(room=room, workdir=full_workdir) if out["disk"] == "simulated" else ""
        job = Job(config_file, full_workdir, prelude)
        out["first_exit"] = job.finish()
        out["said"] = next((line.strip() for line in reversed(job.lines) if line.startswith("bertjax: ")), "")
        shutil.copytree(full_workdir, workdir)  # the user moves the workdir to a larger disk
        if out["disk"] == "tmpfs":
            subprocess.run(["umount", disk], check=True)
    else:
        job = Job(config_file, workdir)
        if fault == "damage":
            job.wait_for_step(2 * EVERY + 1)
            job.process.send_signal(signal.SIGTERM)
        else:
            job.wait_for_step(rng.randrange(1, steps - EVERY))  # the last steps left for it to land in
            time.sleep(rng.uniform(0, 0.3))
            job.process.send_signal(signal.SIGKILL if fault == "kill" else signal.SIGTERM)
        out["first_exit"] = job.finish()
        out["hit_after_step"] = job.steps_logged
        if fault == "damage" and committed(workdir):
            damaged_step = committed(workdir)[-1]
            out["damage"], gone = damage(os.path.join(checkpoints(workdir), str(damaged_step)), rng)
            deleted = {(damaged_step, item) for item in gone}
        if fault == "moved":  # the workdir copied to another disk, the records moved elsewhere
            moved = os.path.join(directory, "elsewhere", "work")
            shutil.copytree(workdir, moved, symlinks=True)
            shutil.rmtree(workdir)
            workdir, new_data = moved, os.path.join(directory, "moved_data")
            shutil.copytree(data, new_data)
            config_file = write_config(new_data, steps, os.path.join(directory, "config.py"))
    before = items(workdir) | deleted
    expected = max([s for s in committed(workdir) if s != damaged_step], default=0)
    rerun = Job(config_file, workdir)
    out["rerun_exit"] = rerun.finish()
    out["workdir"] = workdir
    out["resumed_from"] = rerun.resumed_from()
    out["survived"] = out["rerun_exit"] == 0 and steps in committed(workdir)
    out["steps_lost"] = max(expected - out["resumed_from"], 0)
    out["items_lost"] = sum(not still_there(workdir, s, i) for s, i in before - deleted)
    return out


# --- Stops while fine-tuning compiles --------------------------------------------------------------------


def chosen(given: str, known: tuple[str, ...], flag: str) -> list[str]:
    names = [name.strip() for name in given.split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise SystemExit(f"faults: {flag}={given!r} names {unknown or 'nothing'}; choose among {', '.join(known)}.")
    return names


def main() -> None:
    args = parse_args()
    if args.steps < 3 * EVERY:
        raise SystemExit(
            f"faults: --steps must be at least {3 * EVERY} (a damage needs two committed checkpoints "
            "before the newest)."
        )
    base = args.workdir or tempfile.mkdtemp(prefix="bertjax-faults-")
    os.makedirs(base, exist_ok=True)
    # Every run compiles the same steps: JAX's persistent cache compiles them once (the jobs inherit this); a
    # cache the caller already names (the test suite's) is used as it is.
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(base, "jax_cache"))
    os.environ.update(JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    data = make_data(os.path.join(base, "data_run"))
    config_file = write_config(data, args.steps, os.path.join(base, "config.py"))
    reference = os.path.join(base, "reference")
    if Job(config_file, reference).finish():
        raise SystemExit(f"faults: the uninterrupted reference run failed; see {reference}")
    expected = final_params(reference)
    checkpoint_bytes = sum(os.path.getsize(f) for f in _files(os.path.join(checkpoints(reference), str(EVERY))))
    rng = random.Random(args.seed)
    results = []
    faults = chosen(args.faults, FAULTS, "--faults")
    compile_faults = chosen(args.compile_faults, COMPILE_FAULTS, "--compile_faults")
    for i in range(args.trials):
        fault = faults[i % len(faults)]
        directory = os.path.join(base, f"trial-{i}-{fault}")
        os.makedirs(directory)
        result = trial(fault, rng, config_file, args.steps, directory, checkpoint_bytes, data)
        result["bitwise_identical"] = result["survived"] and identical(expected, final_params(result.pop("workdir")))
        results.append(result)
        print(f"faults: trial {i + 1}/{args.trials}: {json.dumps(result)}", file=sys.stderr, flush=True)
    prepare_results = []
    if args.prepare_trials:
        reference_records, reference_seconds = prepare_reference(data, os.path.join(base, "prepare_reference"))
        for i in range(args.prepare_trials):
            fault = PREPARE_FAULTS[i % len(PREPARE_FAULTS)]
            directory = os.path.join(base, f"prepare-{i}-{fault}")
            os.makedirs(directory)
            result = prepare_trial(fault, rng, data, directory, reference_records, reference_seconds)
            prepare_results.append(result)
            print(
                f"faults: prepare trial {i + 1}/{args.prepare_trials}: {json.dumps(result)}",
                file=sys.stderr,
                flush=True,
            )
    compile_results = []
    for i in range(args.compile_stop_trials):
        fault = compile_faults[i % len(compile_faults)]
        directory = os.path.join(base, f"compile-{i}-{fault}")
        os.makedirs(directory)
        compile_results.append(compile_stop_trial(fault, rng, reference, directory))
        print(
            f"faults: compile-stop trial {i + 1}/{args.compile_stop_trials}: {json.dumps(compile_results[-1])}",
            file=sys.stderr,
            flush=True,
        )
    bucket_results, outage_results, damage_results = [], [], []
    if args.bucket_trials or args.bucket_outage_trials or args.bucket_damage_trials:
        import fault_bucket  # the emulator and its proxy, from tests/

        if args.bucket_retry_s:  # the jobs inherit it
            os.environ["BERTJAX_BUCKET_RETRY_SECONDS"] = f"{args.bucket_retry_s:g}"
        job = lambda workdir: Job(config_file, workdir)  # noqa: E731

        def record(fault: str, i: int, rows: list, row: dict) -> None:
            row["bitwise_identical"] = row["survived"] and identical(expected, final_params(row.pop("workdir")))
            rows.append(row)
            print(f"faults: {fault} trial {i + 1}: {json.dumps(row)}", file=sys.stderr, flush=True)

        with fault_bucket.emulator(base) as url:
            for i in range(args.bucket_trials):
                record("bucket", i, bucket_results, fault_bucket.bucket_trial(rng, job, args.steps, url, i))
            for i in range(args.bucket_outage_trials):
                row = fault_bucket.outage_trial(job, args.steps, EVERY, url, i, args.bucket_outage_s)
                record("bucket_outage", i, outage_results, row)
            for i in range(args.bucket_damage_trials):
                row = fault_bucket.damaged_final_trial(job, args.steps, i)
                record("bucket_damaged_final_step", i, damage_results, row)
    if not args.workdir:
        shutil.rmtree(base, ignore_errors=True)

    def totals(rows: list[dict]) -> dict:
        return {
            "trials": len(rows),
            "survived": sum(r["survived"] for r in rows),
            "bitwise_identical": sum(r["bitwise_identical"] for r in rows),
            "steps_lost": sum(r["steps_lost"] for r in rows),
            "items_lost": sum(r["items_lost"] for r in rows),
        }

    by_fault = {
        f: dict(totals([r for r in results if r["fault"] == f]), runs=[r for r in results if r["fault"] == f])
        for f in FAULTS
        if any(r["fault"] == f for r in results)
    }
    prepare = {
        "prepare_trials": len(prepare_results),
        **{key: sum(r["outcome"] == key for r in prepare_results) for key in ("refused", "complete", "partial")},
        "workers_left": sum(r.get("workers_left", 0) for r in prepare_results),
        "rerun_identical": sum(r["rerun_identical"] for r in prepare_results),
        "runs": prepare_results,
    }
    compile_stops = {
        "trials": len(compile_results),
        "clean_exits": sum(r["first_exit"] == 0 for r in compile_results),
        "crashes": sum(r["crash"] for r in compile_results),
        "reruns_finished": sum(r["rerun_finished"] for r in compile_results),
        "runs": compile_results,
    }
    bucket = dict(totals(bucket_results), runs=bucket_results)
    bucket_outage = dict(
        totals(outage_results),
        one_sentence=sum(r["one_sentence"] for r in outage_results),
        tracebacks=sum(r["tracebacks"] for r in outage_results),
        runs=outage_results,
    )
    damaged_final = dict(
        totals(damage_results), tracebacks=sum(r["tracebacks"] for r in damage_results), runs=damage_results
    )
    print(
        json.dumps(
            dict(
                totals(results),
                by_fault=by_fault,
                prepare=prepare,
                compile_stops=compile_stops,
                bucket=bucket,
                bucket_outage=bucket_outage,
                bucket_damaged_final_step=damaged_final,
            )
        )
    )


if __name__ == "__main__":
    main()
