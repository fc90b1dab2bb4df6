"""What a bucket workdir costs the step, and how fast records in a bucket reach the pipeline.

    python benchmarks/bucket.py [--steps=60] [--every=10] [--delay_ms=50]

On fake-gcs-server on localhost (tests/gcs_emulator.py), optionally behind a proxy that answers every request
--delay_ms late (tests/gcs_faults.py: a slow, distant bucket), the demo's model trains --steps steps with a
checkpoint every --every steps, three times on the same local records: workdir on the local disk, in the
bucket, and in the slow bucket. Orbax saves asynchronously, so the step after a save should cost what any
step costs; the JSON says, from each run's metrics.jsonl (step_time_s of every step, logged every step):
median step time of ordinary steps and of the steps right after a save, and the job's wall time. Then the
record set is uploaded and one pass of it streamed as a job streams it (data/stream_window.py: MB/s and
records/s, against the pipeline's appetite: records a second the step consumes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))  # the emulator and the proxy the tests use
sys.path.insert(0, ROOT)

import gcs_emulator  # noqa: E402
import gcs_faults  # noqa: E402


def job(workdir: str, data: str, steps: int, every: int, env: dict) -> tuple[float, list[dict]]:
    command = [
        sys.executable, "-m", "bertjax.main", "--config=configs/demo.py", f"--workdir={workdir}",
        "--config.data.corpus=", f"--config.data.train_files={data}/train/*.tfrecord",
        f"--config.data.vocab_file={data}/vocab/vocab.txt", "--config.data.eval_files=",
        f"--config.train.num_train_steps={steps}", f"--config.checkpoint.every_steps={every}",
        "--config.train.log_every_steps=1", "--config.optim.warmup_steps=5", "--config.eval.every_steps=100000",
        "--config.checkpoint.export_hf=false",
    ]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"the job in {workdir} failed:\n{done.stderr[-3000:]}")
    from bertjax.runtime import files

    rows = [json.loads(line) for line in files.read_text(f"{workdir}/metrics.jsonl").splitlines()]
    return wall, [r for r in rows if r["kind"] == "train"]


def step_times(rows: list[dict], every: int) -> dict:
    """Medians of the steps right after a save (a save is dispatched at the end of step k·every) and of the
    others, leaving out the first steps (compilation, warm-up)."""
    after = [r["step_time_s"] for r in rows if r["step"] > every and r["step"] % every == 1]
    other = [r["step_time_s"] for r in rows if r["step"] > 5 and r["step"] % every != 1]
    return {
        "step_s": round(statistics.median(other), 4),
        "step_after_save_s": round(statistics.median(after), 4),
        "after_save_ratio": round(statistics.median(after) / statistics.median(other), 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--delay_ms", type=float, default=50.0)
    args = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="bertjax-bucket-")
    base_env = dict(os.environ, JAX_PLATFORMS="cpu", BERTJAX_CACHE_DIR=os.path.join(tmp, "cache"))
    # The demo's records and vocab, made once by the job's own data stage (a 1-step run).
    made = subprocess.run(
        [sys.executable, "-m", "bertjax.main", "--config=configs/demo.py:quick", f"--workdir={tmp}/data_run",
         "--config.train.num_train_steps=1", "--config.optim.warmup_steps=0"],
        cwd=ROOT, env=base_env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    if made.returncode:
        raise SystemExit(made.stderr[-3000:])
    data = f"{tmp}/data_run/data"
    result: dict = {"steps": args.steps, "checkpoint_every": args.every, "delay_ms": args.delay_ms}
    with gcs_emulator.running(os.path.join(tmp, "server.log")) as url:
        os.environ.update(gcs_emulator.client_settings(url))  # this process reads the runs' metrics there
        env = dict(base_env, **gcs_emulator.client_settings(url))
        for name, workdir, run_env in (("local", f"{tmp}/local", base_env), ("bucket", "gs://bertjax-test/run", env)):
            wall, rows = job(workdir, data, args.steps, args.every, run_env)
            result[name] = dict(step_times(rows, args.every), wall_s=round(wall, 1))
        with gcs_faults.FaultyProxy(url) as proxy:
            proxy.delay(args.delay_ms / 1000)
            slow_env = dict(base_env, **gcs_emulator.client_settings(proxy.url))
            wall, rows = job("gs://bertjax-test/slow", data, args.steps, args.every, slow_env)
            result["slow_bucket"] = dict(step_times(rows, args.every), wall_s=round(wall, 1))

        # Records in the bucket, streamed as a job streams them (data/stream_window.py): one pass of the set.
        os.environ["BERTJAX_CACHE_DIR"] = os.path.join(tmp, "stream")
        from bertjax.runtime import files
        from bertjax.data.pretraining import pipeline

        files.upload_tree(f"{data}/train", "gs://bertjax-test/records")
        size = sum(size for size, _ in files.versions("gs://bertjax-test/records").values())
        records = json.load(open(f"{data}/train/metadata.json"))["counts"]["instances"]
        meta = json.load(open(f"{data}/train/metadata.json"))["schema"]
        stream = pipeline.InputPipeline(
            pipeline.PipelineConfig(
                files="gs://bertjax-test/records/*.tfrecord",
                batch_size=32,
                max_seq_length=meta["max_seq_length"],
                max_predictions_per_seq=meta["max_predictions_per_seq"],
                num_epochs=1,
                shuffle_buffer=1000,
            )
        )
        start = time.perf_counter()
        read = sum(len(batch["input_ids"]) for batch in stream)
        seconds = time.perf_counter() - start
        step_s = result["local"]["step_s"]
        result["record_stream"] = {
            "mb": round(size / 1e6, 1),
            "seconds": round(seconds, 2),
            "mb_per_s": round(size / 1e6 / seconds, 1),
            "records_per_s": round(read / seconds),
            "records": records,
            "window": stream.streams[0].window.stats(),
            "records_per_s_the_step_takes": round(32 / step_s),  # the demo's batch: 32 rows a step
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
