"""A record set in a bucket read by N hosts (data/stream_window.py): disk, bytes, time to step 1, rate, input wait.

    python benchmarks/streaming.py [--set_gb=1] [--shards=64] [--hosts=4,8] [--size_factor=4]
                                   [--parts=disk,step1,rate,wait] [--out=benchmarks/results/streaming.json]

Against fake-gcs-server on localhost (tests/gcs_emulator.py), with a generated set of --set_gb in --shards
shards (seq 128, 20 predictions, vocab 30,522; one shard's random records written under every name) and, for
the size test, one --size_factor times as large. Each host is its own process with its own cache and temp
directory and its own proxy in front of the emulator (tests/gcs_faults.py), which counts the bytes it answers:
what a host fetched is the proxy's count, not the client's word. Prints one JSON object:

- `disk`, per N in --hosts: each host reads one epoch of its share through its window; the peak bytes under its
  cache directory (polled every 20 ms) against set/N + window, and the bytes its proxy served against set/N + two
  shards;
- `step1`: the job (a tiny BERT, 2 processes as 2 hosts) from start to its first step on the set and on the
  --size_factor× set: their ratio, target ≤ 1.2;
- `rate`: records/s one host's training pipeline (its share of 4) reads from the bucket against the same pipeline
  on local copies of the same shards, after a warm-up: target ≥ 0.95;
- `wait`: the job's `input_wait_fraction` (metrics.jsonl, the rows after the first) with every request to the
  bucket answered 50 ms late: target < 0.02.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))  # the emulator, the proxy and the tiny config the tests use
sys.path.insert(0, ROOT)

import gcs_emulator  # noqa: E402
import gcs_faults  # noqa: E402

SEQ, PRED, VOCAB = 128, 20, 30522
BUCKET = f"gs://{gcs_emulator.BUCKET}"


def progress(text: str) -> None:
    print(f"streaming: {text}", file=sys.stderr, flush=True)


def write_shard(path: str, target_bytes: int) -> int:
    """Random records of the schema until the file holds about target_bytes; returns its size."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)

    def ints(values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))

    with tf.io.TFRecordWriter(path) as w:
        while not os.path.exists(path) or os.path.getsize(path) < target_bytes:
            for _ in range(500):
                feature = {
                    "input_ids": ints(rng.integers(0, VOCAB, SEQ)),
                    "input_mask": ints([1] * SEQ),
                    "segment_ids": ints([0] * 64 + [1] * 64),
                    "masked_lm_positions": ints(sorted(rng.choice(SEQ, PRED, replace=False))),
                    "masked_lm_ids": ints(rng.integers(0, VOCAB, PRED)),
                    "masked_lm_weights": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0] * PRED)),
                    "next_sentence_labels": ints([int(rng.integers(0, 2))]),
                }
                w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
            w.flush()
    return os.path.getsize(path)


def upload_set(shard: str, prefix: str, count: int) -> None:
    from bertjax.runtime import files

    fs = files.filesystem(prefix)
    names = [f"{prefix}/part-{i:05d}.tfrecord" for i in range(count)]
    for start in range(0, count, 16):  # gcsfs puts a batch concurrently
        fs.put([shard] * len(names[start : start + 16]), names[start : start + 16])


# --- One host: a process of its own (--_host) -------------------------------------------------------------
def host_main(args) -> None:
    """Reads one epoch of this host's share through its window, polling its cache; JSON on stdout."""
    import train_setup
    from bertjax.data.pretraining import pipeline

    cache, peak, stop = os.environ["BERTJAX_CACHE_DIR"], [0], threading.Event()

    def poll() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], train_setup.folder_bytes(cache))
            time.sleep(0.02)

    threading.Thread(target=poll, daemon=True).start()
    p = pipeline.PipelineConfig(
        files=args._pattern,
        batch_size=256,
        max_seq_length=SEQ,
        max_predictions_per_seq=PRED,
        process_index=args._host,
        process_count=args._hosts,
        num_epochs=1,
        shuffle_buffer=1000,
        threads=1,
    )
    reader = pipeline.InputPipeline(p)
    records = sum(len(b["input_ids"]) for b in reader)
    stats = reader.streams[0].window.stats()
    stop.set()
    reader.streams[0].window.close()
    print(json.dumps(dict(stats, records=records, peak_disk_bytes=peak[0])))


def disk_and_fetch(url: str, pattern: str, set_bytes: int, shard_bytes: int, hosts: int, tmp: str) -> dict:
    procs, proxies = [], []
    for i in range(hosts):
        proxy = gcs_faults.FaultyProxy(url).__enter__()
        proxy.bytes_out, forward = 0, proxy._forward  # noqa: SLF001  (the proxy's one way to the emulator)

        def counting(*a, proxy=proxy, forward=forward):
            status, reason, headers, data = forward(*a)
            with proxy._lock:  # noqa: SLF001
                proxy.bytes_out += len(data)
            return status, reason, headers, data

        proxy._forward = counting  # noqa: SLF001
        proxies.append(proxy)
        home = os.path.join(tmp, f"n{hosts}-host{i}")
        os.makedirs(os.path.join(home, "tmp"), exist_ok=True)
        env = dict(os.environ, **gcs_emulator.client_settings(proxy.url), BERTJAX_CACHE_DIR=os.path.join(home, "cache"))
        env["TMPDIR"] = os.path.join(home, "tmp")
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, f"--_host={i}", f"--_hosts={hosts}", f"--_pattern={pattern}"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        )
    rows = []
    for i, (proc, proxy) in enumerate(zip(procs, proxies)):
        out, _ = proc.communicate(timeout=1800)
        assert proc.returncode == 0, f"host {i} failed"
        row = json.loads(out.strip().splitlines()[-1])
        row["proxy_bytes"] = proxy.bytes_out
        proxy.__exit__(None, None, None)
        rows.append(row)
    share, window = set_bytes / hosts, rows[0]["budget_bytes"]
    return {
        "hosts": hosts,
        "window_bytes": window,
        "share_bytes": round(share),
        "peak_disk_bytes_per_host": [r["peak_disk_bytes"] for r in rows],
        "peak_disk_target": round(share + window),
        "peak_disk_met": all(r["peak_disk_bytes"] <= share + window for r in rows),
        "fetched_bytes_per_host": [r["proxy_bytes"] for r in rows],
        "fetched_target": round(share + 2 * shard_bytes),
        "fetched_met": all(r["proxy_bytes"] <= share + 2 * shard_bytes for r in rows),
        "records_per_host": [r["records"] for r in rows],
    }


def job_config(tmp: str, train_files: str, steps: int, name: str) -> str:
    import train_setup

    c = train_setup.small_config(**{"train.num_train_steps": steps, "checkpoint.every_steps": 10_000})
    c.model.update(vocab_size=VOCAB, max_position_embeddings=SEQ)
    c.data.update(train_files=train_files, eval_files="", max_seq_length=SEQ, max_predictions_per_seq=PRED)
    c.mesh.shape = (-1, 1, 1)
    return train_setup.write_config(c, pathlib.Path(tmp) / f"{name}.py")


def run_job(config: str, workdir: str, env: dict, processes: int) -> tuple[float, list[subprocess.Popen]]:
    """Starts the job on `processes` processes; the seconds from start to process 0's `train step 1/` line."""
    import socket

    import train_setup

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.perf_counter()
    procs = []
    for i in range(processes):
        extra = [f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={processes}", f"--process_id={i}"]
        host_env = dict(env, JAX_PLATFORMS="cpu", XLA_FLAGS=train_setup.job_xla_flags(1))
        host_env["BERTJAX_CACHE_DIR"] = os.path.join(workdir + "-caches", str(i))
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "bertjax.main", f"--config={config}", f"--workdir={workdir}"]
                + (extra if processes > 1 else []),
                env=host_env,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    first = None
    for line in procs[0].stdout:
        if first is None and "train step 1/" in line:
            first = time.perf_counter() - start
    for p in procs:
        p.wait(timeout=1800)
    assert first is not None and all(p.returncode == 0 for p in procs), "the job failed"
    return first, procs


def step1(url: str, tmp: str, patterns: dict[str, str]) -> dict:
    env = dict(os.environ, **gcs_emulator.client_settings(url))
    out = {}
    for name, pattern in patterns.items():
        config = job_config(tmp, pattern, 3, f"step1-{name}")
        out[f"time_to_step1_s_{name}"] = round(run_job(config, os.path.join(tmp, f"step1-{name}"), env, 2)[0], 2)
    small, large = out["time_to_step1_s_1x"], out[next(k for k in out if not k.endswith("_1x"))]
    out["ratio"] = round(large / small, 3)
    out["met"] = out["ratio"] <= 1.2
    return out


def rate(pattern: str, tmp: str, batches: int) -> dict:
    """One host's (process 0 of 4) training pipeline: from the bucket, then from local copies; medians of 3."""
    import statistics

    from bertjax.runtime import files
    from bertjax.data.pretraining import pipeline

    local = os.path.join(tmp, "local-copies")
    os.makedirs(local, exist_ok=True)
    for url in files.glob(pattern)[0::4]:  # this host's shards, copied once
        files.download(url, os.path.join(local, os.path.basename(url)))

    def measure(files_pattern: str, cache: str) -> float:
        os.environ["BERTJAX_CACHE_DIR"] = cache
        p = pipeline.InputPipeline(
            pipeline.PipelineConfig(
                files=files_pattern,
                batch_size=256,
                max_seq_length=SEQ,
                max_predictions_per_seq=PRED,
                process_index=0,
                process_count=1 if files_pattern == f"{local}/*.tfrecord" else 4,
                shuffle_buffer=1000,
                threads=1,
            )
        )
        for _ in range(10):  # warm-up: the window's first shards, tf.data's buffers
            next(p)
        start = time.perf_counter()
        for _ in range(batches):
            next(p)
        seconds = time.perf_counter() - start
        if p.streams[0].window is not None:
            p.streams[0].window.close()
        return batches * 256 / seconds

    runs = {"bucket": [], "local": []}
    for trial in range(3):  # in turns, so that a busy moment of the machine falls on both
        runs["bucket"].append(measure(pattern, os.path.join(tmp, f"rate-cache-{trial}")))
        runs["local"].append(measure(f"{local}/*.tfrecord", os.path.join(tmp, f"rate-local-{trial}")))
    bucket, local_rate = statistics.median(runs["bucket"]), statistics.median(runs["local"])
    return {
        "records_per_s_bucket": round(bucket),
        "records_per_s_local": round(local_rate),
        "ratio": round(bucket / local_rate, 3),
        "met": bucket / local_rate >= 0.95,
        "runs": {k: [round(v) for v in vs] for k, vs in runs.items()},
    }


def wait(url: str, pattern: str, tmp: str, steps: int) -> dict:
    with gcs_faults.FaultyProxy(url) as proxy:
        proxy.delay(0.05)
        env = dict(os.environ, **gcs_emulator.client_settings(proxy.url))
        config = job_config(tmp, pattern, steps, "wait")
        workdir = os.path.join(tmp, "wait")
        run_job(config, workdir, env, 1)
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    waits = [r["input_wait_fraction"] for r in rows if r["kind"] == "train" and "input_wait_fraction" in r][1:]
    mean = sum(waits) / max(len(waits), 1)
    return {"input_wait_fraction": round(mean, 4), "rows": len(waits), "delay_ms": 50, "met": mean < 0.02}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set_gb", type=float, default=1.0)
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--hosts", default="4,8")
    parser.add_argument("--size_factor", type=int, default=4)
    parser.add_argument("--parts", default="disk,step1,rate,wait")
    parser.add_argument("--rate_batches", type=int, default=200)
    parser.add_argument("--wait_steps", type=int, default=60)
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "streaming.json"))
    parser.add_argument("--_host", type=int, default=-1, help=argparse.SUPPRESS)
    parser.add_argument("--_hosts", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--_pattern", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._host >= 0:
        return host_main(args)
    parts = set(args.parts.split(","))
    result: dict = {
        "date": datetime.date.today().isoformat(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "processor": platform.processor()},
    }
    with tempfile.TemporaryDirectory(prefix="bertjax-streaming-") as tmp:
        shard_target = int(args.set_gb * 1e9 / args.shards)
        progress(f"writing a shard of ~{shard_target / 1e6:.1f} MB")
        shard_bytes = write_shard(os.path.join(tmp, "shard.tfrecord"), shard_target)
        set_bytes = shard_bytes * args.shards
        with gcs_emulator.running(os.path.join(tmp, "gcs-server.log")) as url:
            os.environ.update(gcs_emulator.client_settings(url))
            gcs_emulator._forget_epath_backend()  # noqa: SLF001
            started = time.perf_counter()
            upload_set(os.path.join(tmp, "shard.tfrecord"), f"{BUCKET}/set1x", args.shards)
            progress(
                f"uploaded {set_bytes / 1e9:.2f} GB in {args.shards} shards ({time.perf_counter() - started:.0f} s)"
            )
            pattern = f"{BUCKET}/set1x/*.tfrecord"
            result["set"] = {"bytes": set_bytes, "shards": args.shards, "shard_bytes": shard_bytes}
            if "disk" in parts:
                result["disk"] = []
                for hosts in map(int, args.hosts.split(",")):
                    progress(f"disk and fetched bytes, {hosts} hosts")
                    t = time.perf_counter()
                    row = disk_and_fetch(url, pattern, set_bytes, shard_bytes, hosts, tmp)
                    result["disk"].append(dict(row, wall_s=round(time.perf_counter() - t, 1)))
            if "rate" in parts:
                progress("records/s from the bucket and from local copies")
                result["rate"] = rate(pattern, tmp, args.rate_batches)
            if "wait" in parts:
                progress("the job's input wait with every request 50 ms late")
                result["wait"] = wait(url, pattern, tmp, args.wait_steps)
            if "step1" in parts:
                big = f"set{args.size_factor}x"
                upload_set(os.path.join(tmp, "shard.tfrecord"), f"{BUCKET}/{big}", args.shards * args.size_factor)
                progress(f"time to step 1: {set_bytes / 1e9:.2f} GB and {args.size_factor}× that")
                result["step1"] = step1(url, tmp, {"1x": pattern, f"{args.size_factor}x": f"{BUCKET}/{big}/*.tfrecord"})
                result["step1"]["set_bytes"] = {"1x": set_bytes, f"{args.size_factor}x": set_bytes * args.size_factor}
    text = json.dumps(result)
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
