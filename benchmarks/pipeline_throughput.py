"""Input pipeline speed: sequences/s from local record shards to numpy batches, on one core.

    python benchmarks/pipeline_throughput.py [--shards=8] [--records=25000] [--batch=256] [--batches=3000]

Writes synthetic shards (seq 128, 20 predictions, token ids drawn from a 30,522-token vocab with ~20%
continuation pieces) with `records.RecordWriter` into a temp dir, pins the process to one CPU, runs
TensorFlow with one thread, and measures static and dynamic masking after a warm-up. Also reports the
size of an iterator checkpoint with a 10k shuffle buffer, and the same shards read as a three-source mixture
(`mixture`: weights 0.5/0.3/0.2 that change at step 1,000, blocks of --block rows; `vs_one_set`: its sequences/s
over the static pipeline's, measured in turns; `shares_by_1000_steps`: the realised shares of each 1,000-step window
against the schedule, for this batch and for 8-row batches of one block), and `threads`: tf.data's autotuned
threads (the default) against --cores fixed ones (`config.data.pipeline_threads`), in turns; pass the host's
cores (`--cores=N`) to choose between them there. Prints one JSON object.

--bucket: the same shards also in a bucket (fake-gcs-server on localhost, tests/gcs_emulator.py), read as a job
reads records there: streamed through each process's window (data/stream_window.py), by the same pipeline;
`bucket` holds the static pipeline's sequences/s from the bucket and its ratio to the local files'.
"""

import argparse
import glob
import json
import os
import tempfile
import time

import numpy as np

SEQ, PRED, VOCAB = 128, 20, 30522


def write_shards(directory: str, shards: int, per_shard: int) -> str:
    from bertjax.data.pretraining import records

    rng = np.random.default_rng(0)
    for k in range(shards):
        lengths = rng.integers(SEQ // 2, SEQ + 1, per_shard)
        pos = np.arange(SEQ)[None, :]
        mask = (pos < lengths[:, None]).astype(np.int64)
        ids = np.where(mask > 0, rng.integers(1000, VOCAB, (per_shard, SEQ)), 0)
        ids[:, 0], ids[np.arange(per_shard), lengths - 1] = 101, 102
        positions = np.sort(rng.choice(np.arange(1, SEQ // 2 - 1), (per_shard, PRED)), axis=1)
        labels = np.take_along_axis(ids, positions, axis=1)
        np.put_along_axis(ids, positions, 103, axis=1)
        arrays = dict(
            input_ids=ids,
            input_mask=mask,
            segment_ids=(pos > lengths[:, None] // 2) * mask,
            masked_lm_positions=positions,
            masked_lm_ids=labels,
            masked_lm_weights=np.ones((per_shard, PRED), np.float32),
            next_sentence_labels=rng.integers(0, 2, (per_shard, 1)),
        )
        with records.RecordWriter(os.path.join(directory, f"records-{k:05d}-of-{shards:05d}.tfrecord")) as w:
            w.write_block(arrays)
    return os.path.join(directory, "records-*.tfrecord")


def vocab():
    from bertjax.data.pretraining import instances

    cont = np.random.default_rng(1).random(VOCAB) < 0.2
    cont[:1000] = False
    return instances.Vocab(size=VOCAB, pad_id=0, cls_id=101, sep_id=102, mask_id=103, is_continuation=cont)


def mixture_sources(files: str) -> tuple[tuple[str, str], ...]:
    """The same shards as three sources of a mixture, as even as they go (8 shards: 3, 3 and 2)."""
    parts = np.array_split(np.array(sorted(glob.glob(files))), 3)
    return tuple((name, ",".join(part)) for name, part in zip(("web", "code", "wiki"), parts))


MIXTURE = ("web=a:0.5,code=b:0.3,wiki=c:0.2", "1000:web=0.2,code=0.2,wiki=0.6")  # weights, and new ones from step 1000


def measure(
    files: str,
    batch: int,
    batches: int,
    warmup: int,
    dynamic: bool,
    mixed: bool = False,
    block: int = 8,
    threads: int | None = 1,
) -> dict:
    from bertjax.data.pretraining import instances, mixture, pipeline

    cfg = pipeline.PipelineConfig(
        files="" if mixed else files,
        sources=mixture_sources(files) if mixed else (),
        mixture=mixture.Mixture.parse(*MIXTURE) if mixed else None,
        mixture_block=block,
        batch_size=batch,
        max_seq_length=SEQ,
        max_predictions_per_seq=PRED,
        seed=0,
        shuffle_buffer=10_000,
        dynamic_masking=dynamic,
        threads=threads,
        vocab=vocab() if dynamic else None,
        masking=instances.InstanceConfig(SEQ, PRED, do_whole_word_mask=True) if dynamic else None,
    )
    p = pipeline.InputPipeline(cfg)
    for _ in range(warmup):
        next(p)
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(batches):
        next(p)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {
        "sequences_per_s": round(batch * batches / wall),
        "cpu_s_per_wall_s": round(cpu / wall, 2),
        "batches": batches,
        "seconds": round(wall, 2),
    }


def mixture_row(files: str, args) -> dict:
    """The same records as a three-source mixture whose weights change mid-run, against the one set: measured in
    turns (3 each, medians), since their difference is smaller than a single run's noise."""
    one, mixed = [], []
    for _ in range(3):
        one.append(measure(files, args.batch, args.batches, args.warmup, dynamic=False)["sequences_per_s"])
        mixed.append(measure(files, args.batch, args.batches, args.warmup, False, True, args.block)["sequences_per_s"])
    return {
        "sources": 3,
        "mixture_block": args.block,
        "sequences_per_s": int(np.median(mixed)),
        "one_set_sequences_per_s": int(np.median(one)),
        "vs_one_set": round(float(np.median(mixed) / np.median(one)), 3),
        "runs": {"mixture": mixed, "one_set": one},
        # the "within ±1 point over any 1,000 steps": a large batch, and one block a batch (the demo's size)
        "shares_by_1000_steps": [share_errors(files, args.batch, args.block), share_errors(files, 8, 8)],
    }


def threads_row(files: str, args) -> dict:
    """tf.data's autotuned threads (config.data.pipeline_threads=0, the default) against as many fixed threads as
    --cores (no autotuning thread), static masks, in turns (3 each, medians): run it with the host's cores to choose."""
    tuned, fixed = [], []
    for _ in range(3):
        tuned.append(measure(files, args.batch, args.batches, args.warmup, False, threads=None)["sequences_per_s"])
        fixed.append(
            measure(files, args.batch, args.batches, args.warmup, False, threads=args.cores)["sequences_per_s"]
        )
    return {
        "cores": args.cores,
        "autotuned_sequences_per_s": int(np.median(tuned)),
        "fixed_sequences_per_s": int(np.median(fixed)),
        "fixed_vs_autotuned": round(float(np.median(fixed) / np.median(tuned)), 3),
        "runs": {"autotuned": tuned, "fixed": fixed},
    }


def share_errors(files: str, batch: int, block: int) -> dict:
    """Realised shares of the mixture over its two 1,000-step windows (the weights change at step 1,000), from the
    pipeline's own counts, against the schedule: the largest difference in points."""
    from bertjax.data.pretraining import mixture, pipeline

    cfg = pipeline.PipelineConfig(
        files="",
        sources=mixture_sources(files),
        mixture=mixture.Mixture.parse(*MIXTURE),
        mixture_block=block,
        batch_size=batch,
        max_seq_length=SEQ,
        max_predictions_per_seq=PRED,
        shuffle_buffer=1000,
        threads=1,
    )
    p = pipeline.InputPipeline(cfg)
    shares = []
    for _ in range(2):
        for _ in range(1000):
            next(p)
        metrics = p.mix_metrics()
        shares.append([metrics[f"mix_{name}"] for name, _ in cfg.sources])
    want = [p.plan.weights_at(0), p.plan.weights_at(1000)]
    error = float(np.max(np.abs(np.array(shares) - np.array(want))))
    return {
        "batch": batch,
        "block": block,
        "shares": np.round(shares, 4).tolist(),
        "max_error_points": round(100 * error, 3),
    }


def checkpoint_size(files: str, directory: str) -> int:
    from bertjax.data.pretraining import pipeline

    p = pipeline.InputPipeline(pipeline.PipelineConfig(files=files, batch_size=256, shuffle_buffer=10_000, seed=0))
    next(p)
    p.save_state(os.path.join(directory, "ckpt", "state"))
    return sum(os.path.getsize(os.path.join(directory, "ckpt", f)) for f in os.listdir(os.path.join(directory, "ckpt")))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--records", type=int, default=25_000, help="records per shard")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--batches", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--cores", type=int, default=1, help="CPUs the process may use")
    parser.add_argument("--bucket", action="store_true", help="also the shards in a bucket on localhost")
    parser.add_argument("--block", type=int, default=8, help="the mixture's rows drawn together (mixture_block)")
    args = parser.parse_args()
    if args.shards < 3:
        parser.error(f"--shards={args.shards}: the mixture row reads the shards as three sources; pass 3 or more.")

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: args.cores])
    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(args.cores)
    tf.config.threading.set_intra_op_parallelism_threads(args.cores)
    with tempfile.TemporaryDirectory() as directory:
        start = time.perf_counter()
        files = write_shards(directory, args.shards, args.records)
        write_s = time.perf_counter() - start
        shard_mb = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory)) / 2**20
        result = {
            "seq": SEQ,
            "predictions": PRED,
            "batch": args.batch,
            "cores": args.cores,
            "records": args.shards * args.records,
            "shards_mb": round(shard_mb, 1),
            "write_s": round(write_s, 1),
            "static": measure(files, args.batch, args.batches, args.warmup, dynamic=False),
            "dynamic_whole_word": measure(files, args.batch, args.batches, args.warmup, dynamic=True),
            "mixture": mixture_row(files, args),
            "threads": threads_row(files, args),
            "checkpoint_bytes_10k_buffer": checkpoint_size(files, directory),
        }
        if args.bucket:
            result["bucket"] = from_a_bucket(directory, args)
            result["bucket"]["vs_local"] = round(
                result["bucket"]["static"]["sequences_per_s"] / result["static"]["sequences_per_s"], 3
            )
    print(json.dumps(result))


def from_a_bucket(directory: str, args) -> dict:
    """The shards uploaded to an emulated bucket, then the same pipeline streaming them (data/stream_window.py)."""
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
    import gcs_emulator

    with gcs_emulator.running(os.path.join(directory, "..", "gcs-server.log")) as url:
        os.environ.update(gcs_emulator.client_settings(url), BERTJAX_CACHE_DIR=os.path.join(directory, "cache"))
        from bertjax.runtime import files as file_layer

        for name in sorted(os.listdir(directory)):
            if os.path.isfile(os.path.join(directory, name)):
                file_layer.upload(os.path.join(directory, name), f"gs://{gcs_emulator.BUCKET}/records/{name}")
        streamed = measure(
            f"gs://{gcs_emulator.BUCKET}/records/*.tfrecord", args.batch, args.batches, args.warmup, False
        )
    return {"static": streamed}


if __name__ == "__main__":
    main()
