"""Packed vs unpacked pre-training on the same instances: padding, real tokens per second, held-out accuracy.

    python benchmarks/packing.py [--settings=128,512] [--steps=40] [--batch=16]

For each setting — phase 1 (seq 128, 20 predictions) and phase 2 (seq 512, 80) — the script splits
`builtin:pydocs` (short documents: much padding) into train and held-out documents, trains a WordPiece
vocab, and prepares records twice with the same seed: unpacked, and packed (`prepare --packing`: the
same instances and masks, up to 3 a row). It then trains the same small BERT (L2/H128/A2, fp32, dropout
as BERT's) with the job itself (`train.train_and_evaluate`) on each, for the same number of real
(non-pad) tokens: `--steps` unpacked steps of `--batch` rows, and as many packed steps as carry the same
real tokens. It prints one JSON object per setting:

  {"setting": "seq128", "unpacked": {...}, "packed": {...}, "real_tokens_per_s_ratio": packed / unpacked}

with, for each: `padding_fraction`, `instances_per_row`, `real_tokens_per_s` (median over the log
intervals after the first), `steps`, `real_tokens` trained on, and the held-out `mlm_accuracy` /
`nsp_accuracy` at the end (per masked token and per instance, on the held-out records of its format).
"""

import argparse
import dataclasses
import json
import os
import runpy
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = {"128": (128, 20), "512": (512, 80)}
VOCAB = 4096


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--settings", default="128,512")
    p.add_argument("--steps", type=int, default=40, help="unpacked train steps per setting")
    p.add_argument("--batch", type=int, default=16, help="rows per step")
    p.add_argument("--log_every", type=int, default=5)
    p.add_argument("--workdir", default="", help="keep records and runs here (default: a temporary directory)")
    return p.parse_args()


def config(seq: int, predictions: int, args, packing: bool, data: str, steps: int):
    c = runpy.run_path(os.path.join(ROOT, "configs", "demo.py"))["get_config"]()
    c.model.update(max_position_embeddings=seq, vocab_size=VOCAB)  # the vocab prepare() trains
    c.data.update(
        corpus="",
        max_seq_length=seq,
        max_predictions_per_seq=predictions,
        packing=packing,
        train_files=os.path.join(data, "train", "*.tfrecord"),
        eval_files=os.path.join(data, "heldout", "*.tfrecord"),
        vocab_file=os.path.join(os.path.dirname(data), "vocab", "vocab.txt"),
    )
    c.train.update(global_batch_size=args.batch, num_train_steps=steps, log_every_steps=args.log_every)
    c.optim.update(warmup_steps=max(1, steps // 10))
    c.checkpoint.update(every_steps=10**9, export_hf=False)
    c.eval.update(every_steps=10**9, num_batches=0, show_predictions=0)
    return c


def prepare(root: str, seq: int, predictions: int) -> dict[str, dict]:
    """Vocab, then train and held-out records, unpacked and packed, from the same documents and seed."""
    from bertjax.config.schema import JobConfig
    from bertjax.data.pretraining import shards
    from bertjax.jobs import prepare as prepare_job
    from bertjax.jobs import stage
    from bertjax.data.vocab import training as vocab_training

    os.makedirs(root, exist_ok=True)
    train_txt, heldout_txt, _ = stage.split_corpus("builtin:pydocs", root, heldout_every=20)
    vocab = os.path.join(root, "vocab", "vocab.txt")
    if not os.path.exists(vocab):
        vocab_training.train_wordpiece(stage.read_sentences(train_txt), VOCAB, os.path.dirname(vocab))
    data = JobConfig().data
    metadata = {}
    for packing in (False, True):
        d = dataclasses.replace(
            data, max_seq_length=seq, max_predictions_per_seq=predictions, packing=packing, dupe_factor=1
        )
        out = os.path.join(root, "packed" if packing else "unpacked")
        for name, text in (("train", train_txt), ("heldout", heldout_txt)):
            cfg = shards.PrepareConfig(
                input_file=text,
                output_dir=os.path.join(out, name),
                vocab_file=vocab,
                random_seed=1 + (name == "heldout"),
                num_shards=2,
                instance=d.instance_config(),
                packing=d.packing_config(),
            )
            result = prepare_job.prepare(cfg, num_workers=os.cpu_count() or 1, progress_stream=open(os.devnull, "w"))
            if name == "train":
                metadata["packed" if packing else "unpacked"] = dict(result, path=out)
    return metadata


def run(c, workdir: str) -> dict:
    from bertjax.jobs import main as train

    shutil.rmtree(workdir, ignore_errors=True)  # a fresh run, never a resumed one
    final = train.train_and_evaluate(c, workdir)
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    timed = [r for r in rows if r["kind"] == "train" and r.get("real_tokens_per_s")][1:]
    return dict(
        real_tokens_per_s=statistics.median(r["real_tokens_per_s"] for r in timed),
        seq_per_s=statistics.median(r["seq_per_s"] for r in timed),
        padding_fraction=statistics.mean(r["padding_fraction"] for r in timed),
        instances_per_row=statistics.mean(r["instances_per_row"] for r in timed),
        mlm_accuracy=final["mlm_accuracy"],
        nsp_accuracy=final.get("nsp_accuracy"),
        mlm_accuracy_baseline=final["mlm_accuracy_baseline"],
    )


def main():
    args = parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import jax

    root = args.workdir or tempfile.mkdtemp(prefix="bertjax-packing-")
    for name in args.settings.split(","):
        seq, predictions = SETTINGS[name]
        start = time.perf_counter()
        metadata = prepare(os.path.join(root, f"seq{seq}"), seq, predictions)
        real_per_row = {k: m["counts"]["real_tokens"] / m["counts"]["rows"] for k, m in metadata.items()}
        steps = {
            "unpacked": args.steps,
            "packed": max(1, round(args.steps * real_per_row["unpacked"] / real_per_row["packed"])),
        }
        row = {"setting": f"seq{seq}", "max_predictions_per_seq": predictions, "batch_rows": args.batch}
        for kind in ("unpacked", "packed"):
            c = config(seq, predictions, args, kind == "packed", metadata[kind]["path"], steps[kind])
            result = run(c, os.path.join(root, f"seq{seq}", f"run-{kind}"))
            row[kind] = dict(
                result,
                steps=steps[kind],
                real_tokens=round(steps[kind] * args.batch * real_per_row[kind]),
                records_padding_fraction=metadata[kind]["padding_fraction"],
            )
        row["real_tokens_per_s_ratio"] = row["packed"]["real_tokens_per_s"] / row["unpacked"]["real_tokens_per_s"]
        row.update(
            jax=jax.__version__,
            backend=jax.default_backend(),
            cpu_count=os.cpu_count(),
            elapsed_s=round(time.perf_counter() - start, 1),
        )
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    sys.exit(main())
