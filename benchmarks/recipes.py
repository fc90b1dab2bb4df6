"""Time to quality on this CPU: 2018's pre-training recipe against today's, for the same wall-clock time.

    python benchmarks/recipes.py [--seeds=0,1,2] [--ablations=all] [--workdir=DIR] [--quick]

- bert2018: `configs/demo.py` as `make demo` runs it (BERT, MLM + NSP at 15%, post-norm, dropout 0.1, linear
  decay, 2,000 steps of 32 × 64 tokens).
- modern: `configs/modernbert_demo.py` (a ModernBERT of about the same parameter count, MLM only at 30% with
  dynamic masking, packed rows, no dropout, warmup-stable-decay with a 1-sqrt decay over the last fifth, batch
  warmup from 8 to 32 rows over the first tenth of the tokens).

Both train on `builtin:pydocs` with the same WordPiece vocab (the first bert2018 run trains it; every other run
is given it) and the same held-out documents (every 10th module), evaluated 20 times a run (--evals) on those
documents masked at 15%, each in the row form its recipe trains on. The modern run's steps are set so that it
takes as long as bert2018's (its full-batch step is timed first, in a short run that also prepares its records).
Seconds are the training steps' own (`step_time_s` of metrics.jsonl: compilation, evals and checkpoints
excluded). Each pre-trained model is then fine-tuned, with the same seed, on the demo's labelled task
(`configs/demo_finetune.py`: which stdlib package a docstring passage comes from; dev passages from held-out
modules).

Prints each run's held-out curve (seconds, accuracy), a table, and as its last line one JSON object:
`bert2018` and `modern` (means over seeds of `heldout_mlm_accuracy`, `seconds`, `finetune_dev_accuracy`, and
`runs`, one per seed with its curve), `time_ratio` (the modern run's seconds to reach its seed's bert2018 final
held-out accuracy ÷ that bert2018 run's seconds, the mean over seeds; null if a seed never reaches it) and
`time_ratio_per_seed`; with --ablations, `ablations`: the modern recipe with one ingredient taken back to 2018's.
Runs go one after another: keep the machine otherwise idle (`loadavg_1m` is recorded before each).
"""

import argparse
import json
import logging
import os
import pathlib
import platform
import runpy
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The modern recipe with one ingredient as 2018 had it. "records": the ablation needs records of its own.
ABLATIONS = {
    "mask_15": dict(args=["--config.data.masked_lm_prob=0.15"]),
    "dropout_0.1": dict(
        args=["--config.model.hidden_dropout_prob=0.1", "--config.model.attention_probs_dropout_prob=0.1"]
    ),
    "linear_decay": dict(
        args=["--config.optim.schedule=linear", "--config.optim.decay_steps=0", "--config.optim.decay_shape=linear"]
    ),
    # The recipe on the demo's BERT (post-norm, learned positions, GELU feed-forward of 512), no NSP head.
    "bert_architecture": dict(
        args=[
            "--config.model.family=bert",
            "--config.model.num_hidden_layers=2",
            "--config.model.intermediate_size=512",
        ]
    ),
    "no_batch_warmup": dict(args=["--config.train.batch_warmup_tokens=0", "--config.train.micro_batches=1"]),
    "static_masking": dict(args=["--config.data.dynamic_masking=false"]),
    "no_packing": dict(args=["--config.data.packing=false"], records=True),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="0,1,2", help="comma list: each recipe pre-trains and fine-tunes once per seed")
    p.add_argument("--ablations", default="", help=f"comma list of {sorted(ABLATIONS)}, or all (first seed only)")
    p.add_argument("--workdir", default="/tmp/bertjax_recipes", help="where the runs go (emptied first)")
    p.add_argument(
        "--quick", action="store_true", help="a tenth of the steps and a few fine-tuning steps (a smoke test)"
    )
    p.add_argument("--calibration_steps", type=int, default=60, help="steps of the modern recipe's timing run")
    p.add_argument("--evals", type=int, default=20, help="held-out evaluations per run (the curve's points)")
    p.add_argument("--dupe_factor", type=int, default=0, help="config.data.dupe_factor for both (0: the configs' 10)")
    args = p.parse_args(argv)
    bad = set(args.ablations.split(",")) - set(ABLATIONS) - {"", "all"}
    if bad:
        p.error(f"--ablations: {sorted(bad)} are not among {sorted(ABLATIONS)}")
    return args


# --- Reading a run --------------------------------------------------------------------------------------


def read_metrics(workdir: str) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def training_seconds(rows: list[dict]) -> dict[int, float]:
    """Step → seconds of training up to it, from the train rows' step_time_s (the time between log points
    without evals and saves; the first step, which compiles, counts at the first interval's rate)."""
    seconds, total, previous = {}, 0.0, 0
    for row in rows:
        if row["kind"] == "train" and row.get("step_time_s") is not None:
            total += row["step_time_s"] * (row["step"] - previous)
            previous = row["step"]
            seconds[row["step"]] = total
    return seconds


def curve(rows: list[dict]) -> list[tuple[float, float]]:
    """(training seconds, held-out MLM accuracy) at each eval."""
    seconds = training_seconds(rows)
    return [
        (round(seconds[r["step"]], 2), r["mlm_accuracy"]) for r in rows if r["kind"] == "eval" and r["step"] in seconds
    ]


def seconds_to_reach(points: list[tuple[float, float]], target: float):
    """The first eval's seconds whose accuracy is at least target, or None."""
    return next((s for s, accuracy in points if accuracy >= target), None)


def accuracy_at(points: list[tuple[float, float]], seconds: float):
    """The accuracy of the last eval within `seconds`, or None."""
    within = [accuracy for s, accuracy in points if s <= seconds]
    return within[-1] if within else None


def steps_for(seconds: float, step_s: float, train: dict, seq: int, warmup_fraction: float) -> int:
    """Steps of the modern recipe that take `seconds` at `step_s` a full-batch step, its batch warmup counted
    (a step of n of the k micro-batches costs n/k of a full one)."""
    from bertjax.training import batch_warmup

    steps = max(int(seconds / step_s), 1)
    for _ in range(20):  # the warmup's length depends on the steps: a fixed point, a few iterations
        tokens = int(warmup_fraction * steps * train["global_batch_size"] * seq) if train["micro_batches"] > 1 else 0
        warm = batch_warmup.BatchWarmup(argparse.Namespace(**dict(train, batch_warmup_tokens=tokens)), seq)
        saved = sum(1 - warm.micro_batches_at(s) / train["micro_batches"] for s in range(warm.steps())) if tokens else 0
        steps = max(int(seconds / step_s + saved), 1)
    return steps


# --- Running --------------------------------------------------------------------------------------------


def pretrain(config: str, workdir: str, args: list[str], log_path: str) -> dict:
    """One pre-training job as a user runs it; returns its curve and figures."""
    os.makedirs(workdir, exist_ok=True)
    load = os.getloadavg()[0]
    start = time.time()
    with open(log_path, "w") as log:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "bertjax.main",
                f"--config={config}",
                f"--workdir={workdir}",
                "--config.checkpoint.export_hf=false",
                "--config.eval.show_predictions=0",
                "--config.eval.not_learning_after=0",
            ]
            + args,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    if done.returncode:
        with open(log_path) as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"{config} in {workdir} failed (exit {done.returncode}); its log is {log_path}:\n{tail}")
    rows = read_metrics(workdir)
    points = curve(rows)
    train_rows = [r for r in rows if r["kind"] == "train"]
    return dict(
        heldout_mlm_accuracy=points[-1][1],
        seconds=points[-1][0],
        steps=train_rows[-1]["step"],
        curve=points,
        process_seconds=round(time.time() - start, 1),
        loadavg_1m=round(load, 2),
    )


def share_data(source: str, workdir: str) -> None:
    """workdir reuses source's prepared records (the corpus stage reuses workdir/data when it is there)."""
    os.makedirs(workdir, exist_ok=True)
    os.symlink(os.path.join(source, "data"), os.path.join(workdir, "data"))


def finetune(pretrained: str, workdir: str, seed: int, quick: bool) -> float:
    """The demo's fine-tuning stage from `pretrained` (a pre-training workdir): its dev accuracy."""
    from bertjax.jobs import demo_finetune as demo_lib, finetune as finetuning

    config = runpy.run_path(str(ROOT / "configs" / "demo_finetune.py"))["get_config"]("quick" if quick else None)
    train_file, dev_file, _ = demo_lib.build(config, pretrained, workdir)
    c = demo_lib.run_config(config, "pretrained", pretrained, train_file, dev_file, seed)
    return finetuning.finetune(c, os.path.join(workdir, "pretrained"))["accuracy"]


def mlm_accuracy(workdir: str, records: str, seq: int, predictions: int) -> float:
    """A pre-training workdir's MLM accuracy on unpacked held-out records (another recipe's rows): its newest
    checkpoint through `bertjax.from_pretrained`, every masked position of one pass, as the job's eval counts."""
    import jax
    import numpy as np

    import bertjax
    from bertjax.data.pretraining import pipeline as pipeline_lib

    model, params = bertjax.from_pretrained(workdir)
    logits = jax.jit(
        lambda p, b: (
            model.apply(
                {"params": p},
                input_ids=b["input_ids"],
                input_mask=b["input_mask"],
                segment_ids=b["segment_ids"],
                deterministic=True,
                masked_lm_positions=b["masked_lm_positions"],
            ).mlm_logits
        )
    )
    pipeline = pipeline_lib.InputPipeline(
        pipeline_lib.PipelineConfig(
            files=records, batch_size=64, max_seq_length=seq, max_predictions_per_seq=predictions, training=False
        )
    )
    correct = total = 0.0
    for batch in pipeline:
        weights = batch["masked_lm_weights"]
        guesses = np.asarray(logits(params, batch)).argmax(-1)
        correct += float(((guesses == batch["masked_lm_ids"]) * weights).sum())
        total += float(weights.sum())
    return correct / total


def summarise(runs: list[dict]) -> dict:
    out = {}
    for key in ("heldout_mlm_accuracy", "seconds", "finetune_dev_accuracy"):
        values = [r[key] for r in runs]
        out[key] = statistics.mean(values)
        out[f"{key}_min"], out[f"{key}_max"] = min(values), max(values)
    return dict(out, runs=runs)


def print_run(name: str, seed: int, run: dict) -> None:
    points = ", ".join(f"{s:.0f}s {a:.1%}" for s, a in run["curve"])
    reach = ""
    if "seconds_to_bert2018" in run:
        reach = (
            f"; reached bert2018's {run['bert2018_target']:.2%} after {run['seconds_to_bert2018']:.0f} s"
            if run["seconds_to_bert2018"] is not None
            else f"; never reached bert2018's {run['bert2018_target']:.2%}"
        )
        if run.get("heldout_mlm_accuracy_at_bert2018_seconds") is not None:
            reach += f" ({run['heldout_mlm_accuracy_at_bert2018_seconds']:.2%} within bert2018's seconds)"
    print(
        f"{name} seed {seed}: held-out MLM accuracy {run['heldout_mlm_accuracy']:.2%} after {run['seconds']:.0f} s of "
        f"training ({run['steps']} steps){reach}; fine-tuned dev accuracy {run['finetune_dev_accuracy']:.2%}\n"
        f"  curve: {points}",
        flush=True,
    )


def main(argv=None) -> dict:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    ablations = sorted(ABLATIONS) if args.ablations == "all" else [a for a in args.ablations.split(",") if a]
    quick = ":quick" if args.quick else ""
    work = os.path.abspath(args.workdir)
    if os.path.exists(work):
        subprocess.run(["rm", "-rf", work], check=True)
    os.makedirs(work)
    modern_config = runpy.run_path(str(ROOT / "configs" / "modernbert_demo.py"))
    demo = runpy.run_path(str(ROOT / "configs" / "demo.py"))["get_config"](quick[1:] or None)
    seq, ft_quick = demo.data.max_seq_length, args.quick
    data_args = [f"--config.data.dupe_factor={args.dupe_factor}"] if args.dupe_factor else []

    def evals_every(steps: int) -> list[str]:
        every = max(steps // args.evals, 1)
        return [
            f"--config.eval.every_steps={every}",
            f"--config.train.log_every_steps={every}",
            f"--config.checkpoint.every_steps={steps}",
        ]

    runs = {"bert2018": [], "modern": []}
    ablation_runs = {}
    vocab = modern_steps = modern_args = None
    for seed in seeds:
        # 2018's recipe. The first run trains the vocab and prepares the records; the others reuse them.
        w = os.path.join(work, f"bert2018-seed{seed}")
        if vocab:
            share_data(os.path.join(work, f"bert2018-seed{seeds[0]}"), w)
        r = pretrain(
            f"configs/demo.py{quick}",
            w,
            [f"--config.seed={seed}"] + data_args + evals_every(demo.train.num_train_steps),
            w + ".log",
        )
        vocab = vocab or os.path.join(w, "data", "vocab", "vocab.txt")
        bert2018_records = os.path.join(w, "data", "heldout", "*.tfrecord")
        # The check of mlm_accuracy: it must give the job's own final eval on the job's own rows.
        r["heldout_mlm_accuracy_recounted"] = mlm_accuracy(w, bert2018_records, seq, demo.data.max_predictions_per_seq)
        r["finetune_dev_accuracy"] = finetune(w, os.path.join(w, "finetune"), seed, ft_quick)
        print_run("bert2018", seed, r)
        runs["bert2018"].append(dict(r, seed=seed))
        target, budget = r["heldout_mlm_accuracy"], r["seconds"]

        if modern_steps is None:  # time the modern step at its full batch; this run also prepares its records
            c = modern_config["get_config"](quick[1:] or None)
            w = os.path.join(work, "modern-timing")
            pretrain(
                "configs/modernbert_demo.py",
                w,
                data_args
                + [
                    f"--config.data.vocab_file={vocab}",
                    f"--config.train.num_train_steps={args.calibration_steps}",
                    "--config.train.batch_warmup_tokens=0",
                    f"--config.train.log_every_steps={args.calibration_steps // 2}",
                    f"--config.eval.every_steps={10**6}",
                    f"--config.optim.decay_steps={args.calibration_steps // 5}",
                    f"--config.optim.warmup_steps={args.calibration_steps // 5}",
                ],
                w + ".log",
            )
            step_s = [row for row in read_metrics(w) if row["kind"] == "train"][-1]["step_time_s"]
            modern_steps = steps_for(budget, step_s, dict(c.train), seq, modern_config["WARMUP_FRACTION"])
            warmup_steps = round(demo.optim.warmup_steps / demo.train.num_train_steps * modern_steps)
            modern_args = [
                f"--config.data.vocab_file={vocab}",
                f"--config.train.num_train_steps={modern_steps}",
                f"--config.optim.decay_steps={int(modern_config['DECAY_FRACTION'] * modern_steps)}",
                f"--config.optim.warmup_steps={warmup_steps}",
                "--config.train.batch_warmup_tokens="
                f"{int(modern_config['WARMUP_FRACTION'] * modern_steps * c.train.global_batch_size * seq)}",
            ] + evals_every(modern_steps)
            print(
                f"modern recipe: a full step takes {step_s * 1000:.0f} ms (bert2018's {budget / r['steps'] * 1000:.0f} ms); "
                f"{modern_steps} steps fill bert2018's {budget:.0f} s",
                flush=True,
            )

        for name in ["modern"] + (ablations if seed == seeds[0] else []):
            extra = ABLATIONS[name] if name != "modern" else dict(args=[])
            w = os.path.join(work, f"{name}-seed{seed}")
            if not extra.get("records"):
                share_data(os.path.join(work, "modern-timing"), w)
            r = pretrain(
                "configs/modernbert_demo.py",
                w,
                [f"--config.seed={seed}"] + data_args + modern_args + extra["args"],
                w + ".log",
            )
            r["finetune_dev_accuracy"] = finetune(w, os.path.join(w, "finetune"), seed, ft_quick)
            # The same model on bert2018's own held-out rows (sentence pairs, half of them random): the row forms
            # differ, so this says how much of the gap they make.
            r["heldout_mlm_accuracy_on_bert2018_rows"] = mlm_accuracy(
                w, bert2018_records, seq, demo.data.max_predictions_per_seq
            )
            r["bert2018_target"] = target
            r["seconds_to_bert2018"] = seconds_to_reach(r["curve"], target)
            # The timed budget is an estimate: the accuracy of its last eval within bert2018's seconds as well.
            r["heldout_mlm_accuracy_at_bert2018_seconds"] = accuracy_at(r["curve"], budget)
            r["time_ratio"] = None if r["seconds_to_bert2018"] is None else r["seconds_to_bert2018"] / budget
            print_run(name, seed, r)
            (runs["modern"] if name == "modern" else ablation_runs.setdefault(name, [])).append(dict(r, seed=seed))

    ratios = [r["time_ratio"] for r in runs["modern"]]
    result = {
        "bert2018": summarise(runs["bert2018"]),
        "modern": summarise(runs["modern"]),
        "time_ratio": None if None in ratios else statistics.mean(ratios),
        "time_ratio_per_seed": ratios,
        "seeds": seeds,
        "modern_steps": modern_steps,
        "bert2018_steps": demo.train.num_train_steps,
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
    }
    if ablation_runs:
        result["ablations"] = {
            name: dict(summarise(v), time_ratio=v[0]["time_ratio"]) for name, v in ablation_runs.items()
        }

    print(
        "\n| recipe | held-out MLM accuracy | training seconds | seconds to bert2018's accuracy | fine-tuned dev accuracy |"
    )
    print("|---|---|---|---|---|")
    for name, rs in [("bert2018", runs["bert2018"]), ("modern", runs["modern"])] + sorted(ablation_runs.items()):
        s = summarise(rs)
        reach = [r.get("seconds_to_bert2018") for r in rs] if name != "bert2018" else [r["seconds"] for r in rs]
        reach_text = "never" if None in reach else f"{statistics.mean(reach):.0f}"
        label = name if name in ("bert2018", "modern") else f"modern, {name}"
        print(
            f"| {label} | {s['heldout_mlm_accuracy']:.2%} ({s['heldout_mlm_accuracy_min']:.2%}–"
            f"{s['heldout_mlm_accuracy_max']:.2%}) | {s['seconds']:.0f} | {reach_text} | "
            f"{s['finetune_dev_accuracy']:.2%} ({s['finetune_dev_accuracy_min']:.2%}–{s['finetune_dev_accuracy_max']:.2%}) |"
        )
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
