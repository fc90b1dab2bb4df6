"""`make demo`'s last stage (`python -m bertjax.demo_finetune` runs `run`): fine-tune the checkpoint it just
pre-trained, and the same model from random initialisation, on a task built offline from the same text;
print both dev scores.

The task (bertjax/finetuning/pydocs_task.py) is written to WORKDIR/task as train.tsv / dev.tsv, its dev modules
checked against the pre-training run's own held-out file. Each run is bertjax.jobs.finetune.finetune with the
same settings; only config.train.init_from differs (the random run gets the pre-training run's
architecture and vocab from its config.json). Scores go to WORKDIR/{pretrained,random}[-seedN] and the
table to WORKDIR/scores.json.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import ml_collections

from bertjax.jobs import finetune as finetuning
from bertjax.runtime import ownership
from bertjax import models as models_lib
from bertjax.interop import pretrained as pretrained_lib
from bertjax.finetuning import pydocs_task

log = logging.getLogger(__name__)
INITS = ("pretrained", "random")


def pretraining_settings(pretrained: str) -> dict:
    """The pre-training run's config.json (its job writes it before training)."""
    path = os.path.join(pretrained, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path} does not exist: --pretrained must be a bertjax pre-training workdir (make demo's workdir/demo)."
        )
    with open(path) as f:
        settings = json.load(f)
    if settings.get("data", {}).get("corpus") != "builtin:pydocs":
        corpus = settings.get("data", {}).get("corpus")
        raise ValueError(
            f"{path}: the run pre-trained on config.data.corpus={corpus!r}; the demo task is built from "
            "builtin:pydocs and needs a run on it to know its held-out modules."
        )
    return settings


def build(config: Any, pretrained: str, workdir: str) -> tuple[str, str, pydocs_task.Task]:
    """Writes WORKDIR/task/{train,dev}.tsv from the modules the pre-training run trained on / held out."""
    heldout_every = pretraining_settings(pretrained)["data"]["heldout_every"]
    documents = pydocs_task.module_documents()
    task = pydocs_task.build_task(documents, heldout_every, config.demo.min_modules, config.demo.max_words)
    heldout_txt = os.path.join(pretrained, "data", "heldout.txt")
    if os.path.isfile(heldout_txt):
        pydocs_task.check_heldout(task, documents, heldout_txt)
    train_file, dev_file = pydocs_task.write_task(task, os.path.join(workdir, "task"))
    log.info("task: %s", pydocs_task.summary(task))
    return train_file, dev_file, task


def run_config(
    config: Any, init: str, pretrained: str, train_file: str, dev_file: str, seed: int
) -> ml_collections.ConfigDict:
    """The FinetuneConfig section of `config` for one run: init_from the checkpoint, or "" with its architecture."""
    c = ml_collections.ConfigDict({k: v for k, v in config.to_dict().items() if k != "demo"})
    c.seed = seed
    c.data.train_file, c.data.eval_file = train_file, dev_file
    if init == "pretrained":
        c.train.init_from = os.path.abspath(pretrained)
    else:
        settings = pretraining_settings(pretrained)
        c.train.init_from = ""
        architecture = pretrained_lib.architecture_of(pretrained)  # the same model, randomly initialised
        for name, value in models_lib.of(architecture).config.model_config_fields(architecture).items():
            c.model[name] = value
        c.data.vocab_file = settings["data"]["vocab_file"]
        c.data.do_lower_case = settings["data"]["do_lower_case"]
    return c


def _mean_spread(values: list[float]) -> str:
    mean = sum(values) / len(values)
    return f"{mean:.2%}" + (f" (min {min(values):.2%}, max {max(values):.2%})" if len(values) > 1 else "")


def run(config: Any, pretrained: str, workdir: str) -> dict:
    ownership.claim_workdir(workdir)
    train_file, dev_file, task = build(config, pretrained, workdir)
    seeds = [int(s) for s in str(config.demo.seeds).split(",") if s.strip()]
    runs = []
    for init in INITS:
        for seed in seeds:
            name = init if len(seeds) == 1 else f"{init}-seed{seed}"
            start = time.time()
            log.info("finetune: %s initialisation, seed %d, into %s", init, seed, os.path.join(workdir, name))
            result = finetuning.finetune(
                run_config(config, init, pretrained, train_file, dev_file, seed), os.path.join(workdir, name)
            )
            runs.append(
                {
                    "init": init,
                    "seed": seed,
                    "accuracy": result["accuracy"],
                    "macro_f1": result["macro_f1"],
                    "seconds": round(time.time() - start, 1),
                }
            )
    report = {
        "runs": runs,
        "task": {k: v for k, v in task.stats.items() if not k.endswith("_modules")},
        "best_constant_accuracy": task.stats["best_constant_accuracy"],
    }
    with open(os.path.join(workdir, "scores.json"), "w") as f:
        json.dump(report, f, indent=2)

    lines = [
        f"Fine-tuned on {len(task.labels)}-way 'which stdlib package is this docstring from?' "
        f"({task.stats['train_examples']:,} train passages; {task.stats['dev_examples']} dev passages from "
        f"{len(task.stats['dev_modules'])} modules pre-training held out), "
        f"{config.train.num_train_steps} steps each:",
        f"  {'initialisation':<16}{'dev accuracy':<38}dev macro-F1",
    ]
    for init in INITS:
        mine = [r for r in runs if r["init"] == init]
        lines.append(
            f"  {init:<16}{_mean_spread([r['accuracy'] for r in mine]):<38}"
            f"{_mean_spread([r['macro_f1'] for r in mine])}"
        )
    lines.append(
        f"  {'majority class':<16}{task.stats['best_constant_accuracy']:.2%} (always "
        f"'{task.stats['best_constant_label']}', the commonest dev label)"
    )
    print("\n".join(lines), flush=True)
    return report
