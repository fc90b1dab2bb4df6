"""The GLUE suite end to end on this machine: `python -m bertjax.glue` with all-MiniLM-L6-v2 over four tasks in
GLUE's own file layouts, built from text that is on the machine (the real GLUE data must be downloaded).

    python benchmarks/glue_offline.py [--train=2000] [--dev=500] [--test=500] [--learning_rates=5e-5,3e-5]
        [--small_task_seeds=0,1] [--keep=DIR]

The tasks (labels are facts of the data, nobody here wrote them):
- CoLA layout (headerless, Matthews correlation): a docstring sentence of builtin:pydocs as written (1), or with
  a run of 3–4 of its words shuffled (0); each sentence appears once, in one form; modules are split between
  train, dev and test.
- SST-2 layout (accuracy): a Debian package's short description → whether the package is a library or
  language package (sections libs, libdevel, python, perl, ...: 1) or an application (0), balanced.
- QNLI layout (accuracy): a package name as the question, a description as the sentence: `entailment` when it
  is that package's description, `not_entailment` when it is another package's.
- MRPC layout (F1 and accuracy): two descriptions, 1 when both packages come from one Debian source package
  (libfoo1 and libfoo-dev), 0 for two packages drawn at random.
The run: `python -m bertjax.glue --config=configs/glue.py --config.init_from=MiniLM --config.data_dir=OUT/glue
--config.tasks=cola,sst2,qnli,mrpc` with the paper's batch 32, 3 epochs and max_seq_length 128, a learning-rate
grid and restarts cut to fit a 2-core machine. Prints one JSON object: the task sizes, the seconds, and glue.json's
per-task scores and GLUE score (partial: four tasks).
"""

import argparse
import collections
import json
import pathlib
import random
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from finetune_job import _packages_text, minilm_dir  # noqa: E402  (the apt-list reader and the checkpoint)

LIBRARY_SECTIONS = {
    "libs",
    "libdevel",
    "python",
    "perl",
    "ruby",
    "javascript",
    "golang",
    "rust",
    "java",
    "haskell",
    "ocaml",
    "php",
    "lisp",
    "devel",
    "oldlibs",
    "introspection",
    "r",
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--train", type=int, default=2000)
    p.add_argument("--dev", type=int, default=500)
    p.add_argument("--test", type=int, default=500)
    p.add_argument("--learning_rates", default="5e-5,3e-5")
    p.add_argument("--small_task_seeds", default="0,1", help="restarts of CoLA and MRPC (the small tasks)")
    p.add_argument("--tasks", default="cola,sst2,qnli,mrpc")
    p.add_argument("--keep", default="", help="a directory to keep the GLUE folders and the suite's workdir in")
    return p.parse_args(argv)


def packages() -> list[dict]:
    """Stanzas of the apt package lists: Package, Source, Section, Description."""
    out = []
    for path in sorted(pathlib.Path("/var/lib/apt/lists").glob("*_Packages*")):
        for stanza in _packages_text(str(path)).split("\n\n"):
            fields = dict(
                line.split(":", 1) for line in stanza.splitlines() if line[:1] not in (" ", "\t", "") and ":" in line
            )
            fields = {k: v.strip() for k, v in fields.items()}
            if fields.get("Description") and fields.get("Section") and fields.get("Package"):
                fields["Source"] = fields.get("Source", fields["Package"]).split()[0]
                fields["Description"] = fields["Description"].replace("\t", " ")
                out.append(fields)
    if not out:
        raise SystemExit("no apt package list in /var/lib/apt/lists: run apt-get update first.")
    return out


def split3(rows: list, sizes: tuple[int, int, int], what: str) -> tuple[list, list, list]:
    if len(rows) < sum(sizes):
        raise SystemExit(f"{what}: {len(rows)} rows, fewer than train + dev + test = {sum(sizes)}; ask for fewer.")
    a, b, c = sizes
    return rows[:a], rows[a : a + b], rows[a + b : a + b + c]


def write(folder: pathlib.Path, name: str, header: str | None, rows: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("".join(f"{r}\n" for r in ([header] if header else []) + rows), encoding="utf-8")


def build_cola(out: pathlib.Path, sizes, rng: random.Random) -> None:
    from bertjax.data.corpus import sources as corpus

    source = corpus.open_source("builtin:pydocs")
    by_module = [
        [s for s in doc if 6 <= len(s.split()) <= 30 and "\t" not in s]
        for unit in source.list_units()
        for doc in source.read([unit])
    ]
    rng.shuffle(by_module)
    splits, at = [], 0
    for size in sizes:  # whole modules to each split, until it has its size
        rows = []
        while len(rows) < size and at < len(by_module):
            rows += by_module[at]
            at += 1
        splits.append(rows[:size])
    for name, rows in zip(("train", "dev", "test"), splits):
        lines = []
        for i, text in enumerate(rows):
            words, good = text.split(), rng.random() < 0.5
            if not good:
                start, span = rng.randrange(len(words) - 3), rng.choice((3, 4))
                part = words[start : start + span]
                while part == words[start : start + span]:
                    rng.shuffle(part)
                words[start : start + span] = part
            text = " ".join(words)
            lines.append(f"{i}\t{text}" if name == "test" else f"pydocs\t{int(good)}\t{'' if good else '*'}\t{text}")
        write(out / "CoLA", f"{name}.tsv", "index\tsentence" if name == "test" else None, lines)


def build_package_tasks(out: pathlib.Path, sizes, rng: random.Random) -> None:
    stanzas = packages()
    counts = collections.Counter(s["Description"] for s in stanzas)
    unique = [s for s in stanzas if counts[s["Description"]] == 1]  # one description, one package
    rng.shuffle(unique)
    # SST-2 layout: library/language package or application, balanced.
    libs = [s for s in unique if s["Section"].split("/")[-1] in LIBRARY_SECTIONS]
    apps = [s for s in unique if s["Section"].split("/")[-1] not in LIBRARY_SECTIONS]
    half = sum(sizes) // 2 + 1
    rows = [(s["Description"], 1) for s in libs[:half]] + [(s["Description"], 0) for s in apps[:half]]
    rng.shuffle(rows)
    for name, part in zip(("train", "dev", "test"), split3(rows, sizes, "SST-2 layout")):
        write(
            out / "SST-2",
            f"{name}.tsv",
            "index\tsentence" if name == "test" else "sentence\tlabel",
            [f"{i}\t{d}" if name == "test" else f"{d}\t{y}" for i, (d, y) in enumerate(part)],
        )
    # QNLI layout: is this description the named package's?
    rows = []
    for s in unique[: sum(sizes)]:
        own = rng.random() < 0.5
        other = s if own else rng.choice(unique)
        rows.append((s["Package"], other["Description"], "entailment" if own else "not_entailment"))
    for name, part in zip(("train", "dev", "test"), split3(rows, sizes, "QNLI layout")):
        write(
            out / "QNLI",
            f"{name}.tsv",
            "index\tquestion\tsentence" + ("" if name == "test" else "\tlabel"),
            [f"{i}\t{q}\t{d}" + ("" if name == "test" else f"\t{y}") for i, (q, d, y) in enumerate(part)],
        )
    # MRPC layout: two descriptions from one source package, or two at random.
    by_source = collections.defaultdict(list)
    for s in unique:
        by_source[s["Source"]].append(s)
    siblings = [group for group in by_source.values() if len(group) >= 2]
    rows = []
    for _ in range(sum(sizes)):
        if rng.random() < 0.5:
            a, b = rng.sample(rng.choice(siblings), 2)
            rows.append((1, a, b))
        else:
            a, b = rng.sample(unique, 2)
            rows.append((int(a["Source"] == b["Source"]), a, b))
    for name, part in zip(("train", "dev", "test"), split3(rows, sizes, "MRPC layout")):
        write(
            out / "MRPC",
            f"{name}.tsv",
            ("index" if name == "test" else "Quality") + "\t#1 ID\t#2 ID\t#1 String\t#2 String",
            [
                f"{i if name == 'test' else y}\t{a['Package']}\t{b['Package']}\t{a['Description']}\t{b['Description']}"
                for i, (y, a, b) in enumerate(part)
            ],
        )


def main(argv=None):
    args = parse_args(argv)
    out = pathlib.Path(args.keep or tempfile.mkdtemp(prefix="glue_offline_"))
    sizes = (args.train, args.dev, args.test)
    rng = random.Random(0)
    build_cola(out / "glue", sizes, rng)
    build_package_tasks(out / "glue", sizes, rng)
    workdir = out / "suite"
    command = [
        sys.executable,
        "-m",
        "bertjax.glue",
        "--config=configs/glue.py",
        f"--workdir={workdir}",
        f"--config.init_from={minilm_dir()}",
        f"--config.data_dir={out / 'glue'}",
        f"--config.tasks={args.tasks}",
        f"--config.sweep.learning_rate={args.learning_rates}",
        f"--config.small_task_seeds={args.small_task_seeds}",
        "--config.submission=true",
    ]
    start = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.monotonic() - start
    (out / "suite.log").write_text(done.stderr)
    if done.returncode:
        raise SystemExit(f"bertjax.glue failed (log in {out / 'suite.log'}):\n{done.stderr[-3000:]}")
    report = json.loads((workdir / "glue.json").read_text())
    print(
        json.dumps(
            {
                "checkpoint": "all-MiniLM-L6-v2",
                "examples": dict(zip(("train", "dev", "test"), sizes)),
                "tasks": args.tasks,
                "learning_rates": args.learning_rates,
                "small_task_seeds": args.small_task_seeds,
                "runs": sum(len(t["runs"]) for t in report["tasks"].values()),
                "seconds": round(seconds, 1),
                "scores": {
                    name: {
                        "dev": t["dev"],
                        "learning_rate": t["learning_rate"],
                        "seed": t["seed"],
                        "spread_over_seeds": {k: round(v["std"], 2) for k, v in t["spread_over_seeds"].items()},
                    }
                    for name, t in report["tasks"].items()
                },
                "glue_score_partial": round(report["score"], 2),
                "table": (workdir / "glue.md").read_text(),
                "submission_files": sorted(p.name for p in (workdir / "submission").iterdir()),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
