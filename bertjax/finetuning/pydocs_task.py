"""A labelled task built offline from `builtin:pydocs`: which standard-library package a docstring passage
comes from (`asyncio`, `email`, `tkinter`, ...).

The label is a fact of the data — the top-level package of the module the passage was read from — and
needs nothing but the machine's own Python. Passages are runs of consecutive docstring sentences of one
module (up to `max_words` words, so that they fit a short row). Splits are by module, with the pre-training
job's own held-out choice (stage.split_corpus: every `heldout_every`-th document of the corpus): dev
passages come from modules that pre-training held out and never trained on, train passages from the other
modules. Packages are kept when they have at least `min_modules` modules and at least one held-out module,
so every dev label is trained on and every label is scored; top-level modules (`os.py`, `json` is a
package) have no package and are left out.

    task = build_task(module_documents(), heldout_every=20)
    write_task(task, "workdir/demo/finetune/task")   # train.tsv, dev.tsv (`text\tlabel`), task.json
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
from typing import Optional

from bertjax.data.corpus import sources as corpus_lib

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Passage:
    text: str
    label: str  # the top-level package of `module`
    module: str  # the module's path under the stdlib directory, e.g. "email/parser.py"


@dataclasses.dataclass
class Task:
    train: list[Passage]
    dev: list[Passage]
    labels: list[str]  # sorted
    stats: dict


def module_documents(root: Optional[str] = None) -> list[tuple[str, corpus_lib.Document]]:
    """(module, document) for every document of builtin:pydocs, in the order the pre-training job reads them
    (units sorted, documents with too few sentences dropped), so that indices match its held-out choice."""
    source = corpus_lib.PyDocsSource(root=root) if root else corpus_lib.open_source("builtin:pydocs")
    return [(unit, doc) for unit in source.list_units() for doc in source.read([unit])]


def is_heldout(index: int, num_documents: int, heldout_every: int) -> bool:
    """The pre-training data stage's rule (stage.split_corpus): every `heldout_every`-th document."""
    every = max(2, min(heldout_every, num_documents))
    return index % every == every - 1


def package_of(module: str) -> Optional[str]:
    """ "email/mime/text.py" → "email"; a top-level module ("os.py") has no package."""
    return module.split("/", 1)[0] if "/" in module else None


def passages(document: corpus_lib.Document, max_words: int) -> list[str]:
    """Consecutive sentences joined while they fit in `max_words` words; a longer sentence stands alone."""
    out, current, words = [], [], 0
    for sentence in document:
        n = len(sentence.split())
        if current and words + n > max_words:
            out.append(" ".join(current))
            current, words = [], 0
        current.append(sentence)
        words += n
    if current:
        out.append(" ".join(current))
    return [" ".join(p.replace("\t", " ").split()) for p in out]  # TSV-safe: no tabs, no newlines


def build_task(
    documents: list[tuple[str, corpus_lib.Document]], heldout_every: int, min_modules: int = 8, max_words: int = 40
) -> Task:
    """Train passages from the modules pre-training trained on, dev passages from the ones it held out."""
    heldout = {module for i, (module, _) in enumerate(documents) if is_heldout(i, len(documents), heldout_every)}
    modules = collections.defaultdict(lambda: {"train": 0, "dev": 0})
    for module, _ in documents:
        if package_of(module):
            modules[package_of(module)]["dev" if module in heldout else "train"] += 1
    labels = sorted(p for p, n in modules.items() if n["train"] + n["dev"] >= min_modules and n["dev"] >= 1)
    if len(labels) < 2:
        raise ValueError(
            f"builtin:pydocs has {len(labels)} package(s) with {min_modules} modules and a held-out one; "
            "lower min_modules or heldout_every."
        )
    train, dev = [], []
    for module, document in documents:
        label = package_of(module)
        if label in labels:
            split = dev if module in heldout else train
            split.extend(Passage(text, label, module) for text in passages(document, max_words))
    dev_texts = {p.text for p in dev}
    duplicates = sum(p.text in dev_texts for p in train)  # e.g. boilerplate shared by two modules
    train = [p for p in train if p.text not in dev_texts]
    train_counts = collections.Counter(p.label for p in train)
    dev_counts = collections.Counter(p.label for p in dev)
    # The majority-class baseline, taken on dev: the best any constant answer can score there.
    best_constant = max(labels, key=lambda label: (dev_counts[label], label))
    stats = {
        "labels": {
            label: {
                "train_modules": modules[label]["train"],
                "dev_modules": modules[label]["dev"],
                "train": train_counts[label],
                "dev": dev_counts[label],
            }
            for label in labels
        },
        "train_examples": len(train),
        "dev_examples": len(dev),
        "train_duplicates_of_dev_dropped": duplicates,
        "best_constant_label": best_constant,
        "best_constant_accuracy": dev_counts[best_constant] / max(1, len(dev)),
        "heldout_every": heldout_every,
        "min_modules": min_modules,
        "max_words": max_words,
        "train_modules": sorted({p.module for p in train}),
        "dev_modules": sorted({p.module for p in dev}),
    }
    return Task(train, dev, labels, stats)


def check_heldout(task: Task, documents: list[tuple[str, corpus_lib.Document]], heldout_txt: str) -> None:
    """Fails unless every dev module's document is in the pre-training run's held-out file and no train module's
    is (the job writes each document as its sentences, one a line, then a blank line)."""
    with open(heldout_txt, encoding="utf-8") as f:
        heldout = {block.strip("\n") for block in f.read().split("\n\n")}
    text = {module: "\n".join(doc) for module, doc in documents}
    missing = [m for m in task.stats["dev_modules"] if text[m] not in heldout]
    leaked = [m for m in task.stats["train_modules"] if text[m] in heldout]
    if missing or leaked:
        raise ValueError(
            f"{heldout_txt} disagrees with heldout_every={task.stats['heldout_every']}: dev modules "
            f"not held out {missing[:3]}, train modules held out {leaked[:3]}; pass the pre-training "
            "run's config.data.heldout_every (its config.json records it)."
        )


def write_task(task: Task, out_dir: str) -> tuple[str, str]:
    """train.tsv and dev.tsv (`text\\tlabel`, as bertjax.finetune reads them) and task.json (counts, modules)."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for name, examples in (("train", task.train), ("dev", task.dev)):
        path = os.path.join(out_dir, f"{name}.tsv")
        with open(path, "w", encoding="utf-8") as f:
            f.write("text\tlabel\n")
            f.writelines(f"{p.text}\t{p.label}\n" for p in examples)
        paths.append(path)
    with open(os.path.join(out_dir, "task.json"), "w") as f:
        json.dump(dict(task.stats, label_names=task.labels), f, indent=2)
    return paths[0], paths[1]


def summary(task: Task) -> str:
    """One line: passages per label (train/dev) and the majority-class baseline on dev."""
    s = task.stats
    per_label = ", ".join(f"{label} {c['train']}/{c['dev']}" for label, c in s["labels"].items())
    return (
        f"{len(task.labels)} packages, {s['train_examples']} train passages from {len(s['train_modules'])} "
        f"modules, {s['dev_examples']} dev passages from {len(s['dev_modules'])} held-out modules "
        f"(train/dev per label: {per_label}); majority-class baseline {s['best_constant_accuracy']:.2%} "
        f"(always '{s['best_constant_label']}', the commonest dev label)"
    )
