"""The GLUE suite (`python -m bertjax.glue` runs `run_suite`): every task fine-tuned as the BERT paper did,
the best run chosen on dev, scores as the GLUE paper reports them, and the files the GLUE server takes.

plan (task × learning rate × seed) → runs (`finetuning.run`, each its own resumable workdir under
DIR/TASK/) → per task the best run on dev → MNLI-mm and other extra dev sets, test predictions
(DIR/submission/) → DIR/glue.json and DIR/glue.md.

A finished run leaves DIR/TASK/RUN/glue_run.json (its dev scores and the settings it ran with), so the
same command after a kill skips finished runs, resumes the unfinished one from its checkpoint, and goes on.
Settings that differ from a finished run's are refused (one sentence naming the field), never mixed.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import os
import time
from typing import Any, Optional

import jax
import numpy as np

from bertjax.runtime import files
from bertjax.jobs import finetune as finetuning
from bertjax.runtime import ownership
from bertjax.jobs import predict as prediction
from bertjax.finetuning import scores as scores_lib
from bertjax.finetuning.config import FinetuneConfig, SweepConfig
from bertjax.finetuning import glue_data
from bertjax.finetuning.glue_data import AX, GlueTask, TaskData
from bertjax.finetuning.readers import LabelMap
from bertjax.finetuning.tasks import sequence_classification

log = logging.getLogger(__name__)
RUN_FILE = "glue_run.json"
SUITE_KEYS = (
    "init_from",
    "data_dir",
    "tasks",
    "small_tasks",
    "small_task_seeds",
    "from_mnli",
    "per_task",
    "submission",
    "skip_ragged_rows",
)
# The BERT paper's Table 1 average: these nine numbers, WNLI left out.
SCORE_ENTRIES = (
    ("mnli", "mnli_m", "accuracy", "MNLI-m"),
    ("mnli", "mnli_mm", "accuracy", "MNLI-mm"),
    ("qqp", "dev", "f1", "QQP"),
    ("qnli", "dev", "accuracy", "QNLI"),
    ("sst2", "dev", "accuracy", "SST-2"),
    ("cola", "dev", "matthews_corrcoef", "CoLA"),
    ("stsb", "dev", "spearman", "STS-B"),
    ("mrpc", "dev", "f1", "MRPC"),
    ("rte", "dev", "accuracy", "RTE"),
)
SCORE_DEFINITION = (
    "the BERT paper's Table 1 average: MNLI-m and MNLI-mm accuracy, QQP F1, QNLI, SST-2 and RTE "
    "accuracy, CoLA Matthews correlation, STS-B Spearman, MRPC F1 (WNLI excluded), in percent, on dev"
)


# --- Settings -------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Settings:
    init_from: str
    data_dir: str
    tasks: tuple[GlueTask, ...]  # in run order: MNLI before the tasks that start from it
    small_tasks: tuple[str, ...]
    small_task_seeds: tuple[int, ...]
    from_mnli: tuple[str, ...]
    per_task: dict[str, dict[str, dict[str, Any]]]  # task → section → field → value
    submission: bool
    skip_ragged_rows: bool


def _names(field: str, text: str) -> tuple[str, ...]:
    names = tuple(n.strip().lower() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in glue_data.TASKS]
    if bad:
        raise ValueError(
            f"config.{field}={text!r}: {', '.join(map(repr, bad))} is not a GLUE task; choose among "
            f"{','.join(glue_data.TASKS)}."
        )
    return names


def _per_task(text: str) -> dict[str, dict[str, dict[str, Any]]]:
    """`"rte.train.num_epochs=4; mnli.sweep.seeds=0"` → {"rte": {"train": {"num_epochs": 4}}, ...}."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for item in filter(None, (s.strip() for s in text.split(";"))):
        key, eq, raw = (s.strip() for s in item.partition("="))
        parts = key.split(".")
        if not eq or len(parts) != 3:
            raise ValueError(
                f"config.per_task: {item!r} is not TASK.SECTION.FIELD=VALUE; e.g. "
                "rte.train.num_epochs=4; mrpc.sweep.seeds=0,1,2,3,4."
            )
        task, section, name = parts
        _names("per_task", task)
        if section not in ("train", "optim", "data", "sweep", "eval"):
            raise ValueError(
                f"config.per_task: {item!r}: section {section!r} is not one a task may change; use "
                "train, optim, data, sweep or eval."
            )
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        if section == "sweep":
            value = raw  # comma lists stay strings
        out.setdefault(task, {}).setdefault(section, {})[name] = value
    return out


def parse(config: Any) -> tuple[Settings, dict]:
    """(the suite's own settings, the fine-tuning config every task starts from as a plain dict)."""
    given = config.to_dict() if hasattr(config, "to_dict") else copy.deepcopy(dict(config))
    suite = {k: given.pop(k) for k in SUITE_KEYS if k in given}
    missing = [k for k in SUITE_KEYS if k not in suite]
    if missing:
        raise ValueError(f"config.{missing[0]} is missing; start the config from configs/glue.py.")
    if not suite["data_dir"]:
        raise ValueError(
            "config.data_dir is empty; point it at the GLUE data (download_glue_data.py's folders "
            "CoLA/, SST-2/, ..., MNLI/, diagnostic/) or pass tfds to read TFDS's glue/*."
        )
    tasks = glue_data.parse_tasks(suite["tasks"])
    from_mnli = _names("from_mnli", suite["from_mnli"])
    if from_mnli and "mnli" not in [t.name for t in tasks]:
        raise ValueError(
            f"config.from_mnli={suite['from_mnli']!r} starts tasks from the MNLI-tuned run, but "
            "config.tasks leaves out mnli; add mnli to config.tasks or set config.from_mnli=''."
        )
    if "mnli" in from_mnli:
        raise ValueError("config.from_mnli names mnli itself; MNLI starts from config.init_from.")
    # MNLI first when others start from it; otherwise the order given.
    tasks = tuple(sorted(tasks, key=lambda t: 0 if (t.name == "mnli" and from_mnli) else 1))
    seeds = SweepConfig(seeds=suite["small_task_seeds"]).seed_values
    base = dataclasses.asdict(FinetuneConfig())
    for section, value in given.items():  # unknown names are refused by FinetuneConfig's converter later
        if isinstance(value, dict) and isinstance(base.get(section), dict):
            base[section].update(value)
        else:
            base[section] = value
    settings = Settings(
        suite["init_from"],
        suite["data_dir"],
        tasks,
        _names("small_tasks", suite["small_tasks"]),
        seeds,
        from_mnli,
        _per_task(suite["per_task"]),
        bool(suite["submission"]),
        bool(suite["skip_ragged_rows"]),
    )
    for task in tasks:  # every task's settings checked now, not hours into the suite
        placeholder = TaskData(task, glue_data.Split([], []), {}, {}, {"train": "(checked before reading)"})
        try:
            task_template(settings, base, placeholder, settings.init_from)
        except ValueError as e:
            if task.name not in settings.per_task:
                raise
            raise ValueError(f"config.per_task sets {task.name}'s settings: {e}") from None
    return settings, base


def task_template(settings: Settings, base: dict, data: TaskData, init_from: str) -> FinetuneConfig:
    """The fine-tuning config of one task, before its learning rate and seed: base + config.per_task."""
    task = data.task
    d = copy.deepcopy(base)
    d["task"] = sequence_classification.KIND.name  # every GLUE task is one
    d["train"]["init_from"] = init_from
    d["data"].update(
        train_file=data.origin.get("train", ""),
        eval_file=data.origin.get(task.dev[0][0], ""),
        regression=task.regression,
    )
    if task.name in settings.small_tasks and settings.small_task_seeds:
        d["sweep"]["seeds"] = ",".join(map(str, settings.small_task_seeds))
    for section, fields in settings.per_task.get(task.name, {}).items():
        d[section].update(fields)
    return FinetuneConfig.from_configdict(d)


# --- Scores ---------------------------------------------------------------------------------------------


def glue_metrics(task: GlueTask, gold: list, predicted: list) -> dict[str, float]:
    """The task's GLUE metrics, in percent, from label strings (or scores for STS-B)."""
    if task.regression:
        result = scores_lib.regression_scores(np.asarray(gold, float), np.asarray(predicted, float))
        return {m: 100 * result[m] for m in task.metrics}
    ids = {label: i for i, label in enumerate(task.labels)}
    y, p = np.array([ids[g] for g in gold]), np.array([ids[x] for x in predicted])
    result = dict(
        scores_lib.classification_scores(y, p, len(task.labels)), f1=scores_lib.binary_f1(y, p, ids.get("1", 1))
    )  # MRPC's and QQP's positive class is "1"
    return {m: 100 * result[m] for m in task.metrics}


def task_score(task: GlueTask, dev: dict[str, dict[str, float]]) -> float:
    """What the best run is chosen by: the mean of the task's metrics on its first dev set (MNLI: matched)."""
    first = dev[task.dev[0][0]]
    return float(np.mean([first[m] for m in task.metrics]))


def _predictions(job: FinetuneConfig, labels: Optional[LabelMap], params: Any, examples: list, name: str) -> list:
    split, logits = prediction.run_on_examples(job, labels, params, examples, name, job.train.global_batch_size)
    return [p["prediction"] for p in finetuning.predictions_of(job, split, logits, labels)]


# --- Runs -----------------------------------------------------------------------------------------------


def _settings_of(job: FinetuneConfig, workdir: str) -> dict:
    """What a finished run must share with a rerun's for its result to stand (a start inside the suite's
    workdir, the MNLI run, named relative to it: a moved suite still resumes)."""
    d = job.to_dict()
    train = {k: v for k, v in d["train"].items() if k not in ("log_every_steps", "profile_steps")}
    inside = os.path.abspath(train["init_from"] or os.sep).startswith(os.path.abspath(workdir) + os.sep)
    if inside:
        train["init_from"] = os.path.join("WORKDIR", os.path.relpath(train["init_from"], workdir))
    return {
        "seed": d["seed"],
        "train": train,
        "optim": {k: v for k, v in d["optim"].items() if k != "warmup_steps"},
        "data": {k: v for k, v in d["data"].items() if k not in ("train_file", "eval_file")},
    }


def _first_difference(old: Any, new: Any, path: str = "config") -> Optional[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            found = _first_difference(old.get(key), new.get(key), f"{path}.{key}")
            if found:
                return found
        return None
    return None if old == new else f"{path} was {old!r} there and is {new!r} now"


def _finished(run_dir: str, job: FinetuneConfig, workdir: str) -> Optional[dict]:
    path = os.path.join(run_dir, RUN_FILE)
    if not files.isfile(path):
        return None
    done = files.read_json(path)
    difference = _first_difference(done["settings"], _settings_of(job, workdir))
    if difference:
        raise ValueError(
            f"{run_dir} is a finished run of other settings ({difference}); rerun with the settings "
            "it ran with, or give the new settings a new --workdir."
        )
    return dict(done, run=run_dir)  # where it is now, should the suite's workdir have moved


@dataclasses.dataclass
class Plan:
    task: GlueTask
    learning_rate: float
    seed: int
    work: float  # training examples × epochs: what the ETA is measured in

    @property
    def name(self) -> str:
        return f"lr={self.learning_rate:g},seed={self.seed}"


class Progress:
    """The suite's log line before each run: which task and run, and an ETA over all of them."""

    def __init__(self, plans: list[Plan]):
        self.total, self.left = len(plans), sum(p.work for p in plans)
        self.index, self.spent, self.measured = 0, 0.0, 0.0

    def start(self, plan: Plan, skipped: bool) -> None:
        self.index += 1
        eta = f", ETA {_clock(self.left * self.spent / self.measured)} for the suite" if self.measured else ""
        log.info(
            "glue: run %d of %d: %s %s%s%s",
            self.index,
            self.total,
            plan.task.name,
            plan.name,
            " (finished before: skipped)" if skipped else f" ({plan.work:,.0f} example passes)",
            eta,
        )

    def done(self, plan: Plan, seconds: Optional[float]) -> None:
        self.left -= plan.work
        if seconds is not None:
            self.spent, self.measured = self.spent + seconds, self.measured + plan.work


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def _run_one(plan: Plan, template: FinetuneConfig, data: TaskData, run_dir: str, workdir: str) -> Optional[dict]:
    """A run's result (dev scores on every dev set), training it or resuming it as needed; None if stopped."""
    task = plan.task
    job = dataclasses.replace(
        template.replace(optim={"learning_rate": plan.learning_rate}, sweep={"learning_rate": "", "seeds": ""}),
        seed=plan.seed,
    )
    done = _finished(run_dir, job, workdir)
    if done is not None:
        return done
    labels = None if task.regression else LabelMap(task.labels)
    first_dev, *other_devs = (name for name, _ in task.dev)
    outcome = finetuning.run(
        job, run_dir, finetuning.Examples(data.train.examples, data.dev[first_dev].examples, labels)
    )
    if not outcome.finished:
        return None
    predicted = files.read_text(os.path.join(run_dir, finetuning.PREDICTIONS_FILE))  # the run's final dev predictions
    first = [json.loads(line)["prediction"] for line in predicted.splitlines()]
    dev = {first_dev: glue_metrics(task, [e.label for e in data.dev[first_dev].examples], first)}
    if other_devs:  # MNLI's mismatched dev set, with the run's final weights
        run_job, run_labels, params = finetuning.load_run(run_dir)
        for name in other_devs:
            examples = data.dev[name].examples
            dev[name] = glue_metrics(
                task,
                [e.label for e in examples],
                _predictions(run_job, run_labels, params, examples, f"{task.name} {name}"),
            )
    result = {
        "learning_rate": plan.learning_rate,
        "seed": plan.seed,
        "run": run_dir,
        "dev": dev,
        "score": task_score(task, dev),
        "settings": _settings_of(job, workdir),
    }
    if jax.process_index() == 0:
        files.write_whole(os.path.join(run_dir, RUN_FILE), json.dumps(result, indent=2))
    return result


def _choose(task: GlueTask, runs: list[dict]) -> dict:
    """The paper's choice: the best run on dev over every learning rate and seed; the spread over seeds kept."""
    best = max(runs, key=lambda r: r["score"])
    same_rate = [r for r in runs if r["learning_rate"] == best["learning_rate"]]
    spread = {
        f"{name}/{m}" if len(task.dev) > 1 else m: scores_lib.summary([r["dev"][name][m] for r in same_rate])
        for name, _ in task.dev
        for m in task.metrics
    }
    by_rate = {
        f"{rate:g}": scores_lib.summary([r["score"] for r in runs if r["learning_rate"] == rate])
        for rate in sorted({r["learning_rate"] for r in runs}, reverse=True)
    }
    return {
        "learning_rate": best["learning_rate"],
        "seed": best["seed"],
        "run": best["run"],
        "dev": best["dev"],
        "score": best["score"],
        "spread_over_seeds": spread,
        "by_learning_rate": by_rate,
        "runs": [{k: r[k] for k in ("learning_rate", "seed", "score", "dev")} for r in runs],
    }


# --- The suite ------------------------------------------------------------------------------------------


def run_suite(config: Any, workdir: str) -> dict:
    """Runs (or resumes) the whole suite in workdir; returns glue.json's content ({} when stopped)."""
    started = time.time()
    ownership.claim_workdir(workdir, primary=jax.process_index() == 0)
    settings, base = parse(config)
    need_test = settings.submission
    data = {
        t.name: glue_data.read_task(t, settings.data_dir, need_test, settings.skip_ragged_rows) for t in settings.tasks
    }  # every file is checked before the first run
    ax = glue_data.read_task(AX, settings.data_dir, True) if need_test and "mnli" in data else None
    for name, d in data.items():
        log.info(
            "glue: %s: %d train, %s dev, %s test examples",
            name,
            len(d.train.examples),
            "/".join(str(len(s.examples)) for s in d.dev.values()),
            "/".join(str(len(s.examples)) for s in d.test.values()) or "no",
        )
    templates, plans = {}, []
    for task in settings.tasks:  # learning rates and seeds only; init_from of from_mnli tasks comes later
        templates[task.name] = t = task_template(settings, base, data[task.name], settings.init_from)
        rates, seeds = t.sweep.learning_rates or (t.optim.learning_rate,), t.sweep.seed_values or (t.seed,)
        epochs = (
            t.train.num_epochs
            if not t.train.num_train_steps
            else t.train.num_train_steps * t.train.global_batch_size / max(1, len(data[task.name].train.examples))
        )
        plans += [Plan(task, r, s, len(data[task.name].train.examples) * epochs) for r in rates for s in seeds]
    progress = Progress(plans)
    log.info(
        "glue: %d runs over %d tasks (%s); results in %s",
        len(plans),
        len(settings.tasks),
        ", ".join(f"{t.name} {sum(p.task is t for p in plans)}" for t in settings.tasks),
        workdir,
    )

    chosen: dict[str, dict] = {}
    for task in settings.tasks:
        template = templates[task.name]
        if task.name in settings.from_mnli:
            template = template.replace(train={"init_from": chosen["mnli"]["run"]})
            log.info("glue: %s starts from the MNLI-tuned run %s (config.from_mnli)", task.name, chosen["mnli"]["run"])
        runs = []
        for plan in (p for p in plans if p.task is task):
            run_dir = os.path.join(workdir, task.name, plan.name)
            skipped = files.isfile(os.path.join(run_dir, RUN_FILE))
            progress.start(plan, skipped)
            began = time.time()
            result = _run_one(plan, template, data[task.name], run_dir, workdir)
            if result is None:
                log.info("glue: stopped in %s %s; rerun the same command to go on from there", task.name, plan.name)
                return {}
            progress.done(plan, None if skipped else time.time() - began)
            runs.append(result)
        chosen[task.name] = dict(
            _choose(task, runs),
            init_from=template.train.init_from,
            examples={
                "train": len(data[task.name].train.examples),
                **{n: len(s.examples) for n, s in data[task.name].dev.items()},
            },
        )
        log.info(
            "glue: %s: best on dev lr %g seed %d: %s",
            task.name,
            chosen[task.name]["learning_rate"],
            chosen[task.name]["seed"],
            _format_dev(task, chosen[task.name]["dev"]),
        )
    if need_test:
        write_submission(settings, data, ax, chosen, os.path.join(workdir, "submission"))
    report = make_report(
        settings, chosen, time.time() - started, os.path.join(workdir, "submission") if need_test else None
    )
    table = markdown(settings, report)
    if jax.process_index() == 0:
        files.makedirs(workdir)
        files.write_whole(os.path.join(workdir, "glue.json"), json.dumps(report, indent=2))
        files.write_whole(os.path.join(workdir, "glue.md"), table + "\n")
    log.info("glue: results (dev, percent; the best run of each task)\n%s", table)
    return report


def _format_dev(task: GlueTask, dev: dict) -> str:
    return ", ".join(
        f"{name + ' ' if len(dev) > 1 else ''}{glue_data.CLASSES[m]} {v:.2f}"
        for name, values in dev.items()
        for m, v in values.items()
    )


def write_submission(
    settings: Settings, data: dict[str, TaskData], ax: Optional[TaskData], chosen: dict, directory: str
) -> None:
    """The GLUE server's files from each task's chosen run; AX from MNLI's."""
    written = []
    todo = [(data[name].task, data[name], choice) for name, choice in chosen.items()]
    if ax is not None:
        todo.append((AX, ax, chosen["mnli"]))
    for task, task_data, choice in todo:
        job, labels, params = finetuning.load_run(choice["run"])
        for stem, split in task_data.test.items():
            predicted = _predictions(job, labels, params, split.examples, f"{task.name} test")
            if task.regression:  # STS-B: a similarity in [0, 5]
                predicted = [f"{min(5.0, max(0.0, float(p))):.3f}" for p in predicted]
            if jax.process_index() == 0:
                files.makedirs(directory)
                glue_data.write_submission(os.path.join(directory, f"{stem}.tsv"), split.ids, predicted)
            written.append(f"{stem}.tsv")
    wanted = [stem for t in (*glue_data.TASKS.values(), AX) for stem, _ in t.test]
    missing = [s for s in wanted if f"{s}.tsv" not in written]
    log.info(
        "glue: submission files in %s: %s%s",
        directory,
        ", ".join(written),
        f"; the GLUE server also wants {', '.join(m + '.tsv' for m in missing)} (run those tasks too)"
        if missing
        else " (all the GLUE server asks for: zip them and upload)",
    )


def make_report(settings: Settings, chosen: dict, seconds: float, submission: Optional[str]) -> dict:
    entries = {
        label: chosen[task]["dev"][split][metric] for task, split, metric, label in SCORE_ENTRIES if task in chosen
    }
    complete = len(entries) == len(SCORE_ENTRIES)
    return {
        "init_from": settings.init_from,
        "data_dir": settings.data_dir,
        "tasks": chosen,
        "score": float(np.mean(list(entries.values()))) if entries else math.nan,
        "score_entries": entries,
        "score_complete": complete,
        "score_definition": SCORE_DEFINITION + ("" if complete else "; partial: only the tasks run"),
        "submission": submission,
        "time_s": round(seconds, 1),
    }


def markdown(settings: Settings, report: dict) -> str:
    rows = [
        "| task | metric | dev (best run) | mean ± std over seeds (n) | learning rate | seed | started from |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, choice in report["tasks"].items():
        task = glue_data.TASKS[name]
        start = "MNLI run" if name in settings.from_mnli else "init_from"
        for split, values in choice["dev"].items():
            for metric, value in values.items():
                key = f"{split}/{metric}" if len(task.dev) > 1 else metric
                s = choice["spread_over_seeds"][key]
                label = f"{task.folder}-{split.split('_')[-1]}" if len(task.dev) > 1 else task.folder
                rows.append(
                    f"| {label} | {glue_data.CLASSES[metric]} | {value:.1f} | {s['mean']:.1f} ± {s['std']:.1f} "
                    f"({s['n']}) | {choice['learning_rate']:g} | {choice['seed']} | {start} |"
                )
    score = report["score"]
    rows.append(
        f"| **GLUE score** | {'average' if report['score_complete'] else 'average of the tasks run'} | "
        f"**{score:.1f}** | | | | |"
        if not math.isnan(score)
        else "| **GLUE score** | (WNLI only) | – | | | | |"
    )
    return "\n".join(rows)
