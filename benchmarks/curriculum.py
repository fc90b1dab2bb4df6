"""A curriculum you can see: the same ModernBERT trained on seven languages of real text with (a) a fixed mixture and
(b) mmBERT's curriculum — the sampling temperature annealed and two languages held back until the decay — for the
same steps, each language's held-out MLM accuracy over time, as a table (JSON) and a plot.

    python benchmarks/curriculum.py [--steps=2000] [--plot=docs/curriculum.png] [--workdir=DIR]

The text is Debian's translated manual pages (/usr/share/man/LANG, rendered by groff): whatever this machine
has of them (`apt-get install manpages-de manpages-fr …` brings more). Nobody here wrote them.
- Main languages de, fr, nl, pt, sv; held back: it, pl.
- Both runs: configs/modernbert_demo.py (ModernBERT of the demo's size, wsd with the last fifth decaying, 30%
  masking, held-out records at 15%), one vocab and one record set per language made by (a)'s data stage from a
  sample that follows (a)'s weights; (b) trains on (a)'s records (`config.data.mixture` of record sets, its
  held-out sets as `name=glob` eval files).
- (a) every language `auto` at T = 2 (sizes^(1/2)) throughout.
- (b) T = 1/0.7 → 1/0.5 → 1/0.3 (mmBERT's inverse temperatures 0.7, 0.5, 0.3: ∝ size^0.7, ^0.5, ^0.3) at 0, 40%
  and 80% of the steps; it and pl weighted 0 until the decay (80%), then `auto`.
Prints one JSON object: each run's final accuracy per language, the held-back languages' gain, the seconds.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAIN, HELD_BACK = ("de", "fr", "nl", "pt", "sv"), ("it", "pl")


def man_text(lang: str, out: str) -> tuple[str, int]:
    """The language's manual pages as BERT raw text (a paragraph a line, a blank line between pages); their count."""
    pages = sorted(glob.glob(f"/usr/share/man/{lang}/man*/*.gz"))
    written = 0
    with open(out, "w", encoding="utf-8") as f:
        for page in pages:
            with gzip.open(page, "rb") as g:
                source = g.read()
            if source.startswith(b".so "):  # a link to another page
                continue
            rendered = subprocess.run(
                "preconv -e UTF-8 | groff -man -Tutf8 -P-cbou -rHY=0 -rLL=400n",
                input=source,
                shell=True,
                capture_output=True,
            ).stdout.decode("utf-8", "replace")
            paragraphs = [
                " ".join(line.split())
                # the body's indented lines: the page header and footer and section headings (column 0) left out
                for block in re.split(r"\n\s*\n", "\n".join(x for x in rendered.splitlines() if x[:1] in ("", " ")))
                for line in [" ".join(block.split("\n"))]
                if len(line.split()) >= 4  # headings and option names alone are not prose
            ]
            if len(paragraphs) >= 2:
                f.write("\n".join(paragraphs) + "\n\n")
                written += 1
    return out, written


def run(workdir: str, flags: list[str], log_path: str) -> float:
    start = time.perf_counter()
    with open(log_path, "w") as log:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "bertjax.main",
                "--config=configs/modernbert_demo.py",
                f"--workdir={workdir}",
                *flags,
            ],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            check=True,
        )
    return time.perf_counter() - start


def rows(workdir: str, kind: str) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["kind"] == kind]


def plot(fixed: str, curriculum: str, steps: int, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    langs = MAIN + HELD_BACK
    fig, (acc, mix) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    colors = dict(zip(langs, plt.get_cmap("tab10").colors))
    for workdir, style, label in ((fixed, "--", "fixed"), (curriculum, "-", "curriculum")):
        evals = rows(workdir, "eval")
        for lang in langs:
            acc.plot(
                [r["step"] for r in evals],
                [100 * r[f"mlm_accuracy_{lang}"] for r in evals],
                style,
                color=colors[lang],
                label=f"{lang} ({label})" if style == "-" or lang in HELD_BACK else None,
            )
    for ax in (acc, mix):
        ax.axvline(0.8 * steps, color="grey", lw=0.8)
    acc.set(xlabel="step", ylabel="held-out MLM accuracy at 15% (%)", title="solid: curriculum, dashed: fixed mixture")
    acc.legend(fontsize=7, ncol=2)
    train = rows(curriculum, "train")
    bottom = [0.0] * len(train)
    for lang in langs:
        share = [100 * r[f"mix_{lang}"] for r in train]
        mix.fill_between([r["step"] for r in train], bottom, [b + s for b, s in zip(bottom, share)], color=colors[lang])
        bottom = [b + s for b, s in zip(bottom, share)]
    mix.set(xlabel="step", ylabel="share of the rows drawn (%)", title="the curriculum's mixture (decay: grey line)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--plot", default=os.path.join(ROOT, "docs", "curriculum.png"))
    parser.add_argument("--workdir", default="")
    args = parser.parse_args()
    base = args.workdir or tempfile.mkdtemp(prefix="bertjax-curriculum-")
    corpora = {lang: man_text(lang, os.path.join(base, f"{lang}.txt")) for lang in MAIN + HELD_BACK}
    missing = [lang for lang, (_, n) in corpora.items() if n < 10]
    if missing:
        sys.exit(
            f"fewer than 10 manual pages in {missing}: apt-get install " + " ".join(f"manpages-{m}" for m in missing)
        )
    fixed, curriculum = os.path.join(base, "fixed"), os.path.join(base, "curriculum")
    decay, middle = int(0.8 * args.steps), int(0.4 * args.steps)
    common = [
        "--config.data.corpus=",
        "--config.data.corpus_vocab_size=8192",
        "--config.data.dupe_factor=3",
        f"--config.train.num_train_steps={args.steps}",
        f"--config.optim.decay_steps={args.steps - decay}",
        f"--config.optim.warmup_steps={args.steps * 3 // 20}",  # the demo's 300 of 2,000
        f"--config.eval.every_steps={args.steps // 10}",
        f"--config.train.log_every_steps={args.steps // 40}",
        "--config.checkpoint.export_hf=false",
    ]
    everything = ",".join(f"{lang}={path}:auto" for lang, (path, _) in corpora.items())
    fixed_s = run(
        fixed, common + [f"--config.data.mixture={everything}", "--config.data.mixture_temperature=2"], fixed + ".log"
    )
    data = os.path.join(fixed, "data")
    records = ",".join(f"{lang}={data}/{lang}/train/*.tfrecord:auto" for lang in corpora)
    heldout = ",".join(f"{lang}={data}/{lang}/heldout/*.tfrecord" for lang in corpora)
    schedule = f"0:T={1 / 0.7:.4f},it=0,pl=0;{middle}:T=2;{decay}:T={1 / 0.3:.4f},it=auto,pl=auto"
    curriculum_s = run(
        curriculum,
        common
        + [
            f"--config.data.mixture={records}",
            f"--config.data.eval_files={heldout}",
            f"--config.data.vocab_file={data}/vocab/vocab.txt",
            f"--config.data.mixture_schedule={schedule}",
        ],
        curriculum + ".log",
    )
    final = {name: rows(w, "eval")[-1] for name, w in (("fixed", fixed), ("curriculum", curriculum))}
    table = {
        name: {lang: round(100 * r[f"mlm_accuracy_{lang}"], 2) for lang in corpora}
        | {"all": round(100 * r["mlm_accuracy"], 2)}
        for name, r in final.items()
    }
    stderr = {lang: round(100 * final["curriculum"][f"mlm_accuracy_stderr_{lang}"], 2) for lang in corpora}
    if args.plot:
        plot(fixed, curriculum, args.steps, args.plot)
    print(
        json.dumps(
            {
                "steps": args.steps,
                "pages": {lang: n for lang, (_, n) in corpora.items()},
                "schedule": schedule,
                "mlm_accuracy": table,
                "curriculum_stderr": stderr,
                "held_back_gain": {
                    lang: round(table["curriculum"][lang] - table["fixed"][lang], 2) for lang in HELD_BACK
                },
                "main_gain": {lang: round(table["curriculum"][lang] - table["fixed"][lang], 2) for lang in MAIN},
                "seconds": {"fixed": round(fixed_s), "curriculum": round(curriculum_s)},
                # the share of the training loop's time spent waiting for batches (train rows after the first)
                "input_wait_fraction": {
                    name: round(float(np.mean([r["input_wait_fraction"] for r in rows(w, "train")[1:]])), 4)
                    for name, w in (("fixed", fixed), ("curriculum", curriculum))
                },
                "plot": args.plot,
                "workdir": base,
            }
        )
    )


if __name__ == "__main__":
    main()
