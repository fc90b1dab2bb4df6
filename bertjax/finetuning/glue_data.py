"""The GLUE tasks as users have them: the per-task folders `download_glue_data.py` writes (each with its own
column layout), or TFDS's `glue/*` — read into `tasks.TextExample`s with GLUE's own label strings.

Layouts (google-research/bert's run_classifier.py processors; tfds' glue.py):
- CoLA: train/dev headerless, four columns (source, label, original label, sentence); test `index sentence`.
- SST-2: `sentence label`; test `index sentence`.
- MRPC: `Quality #1 ID #2 ID #1 String #2 String` (train/dev), `index #1 ID ...` (test).
- STS-B: ten columns, `sentence1 sentence2` then a float `score` in [0, 5]; test without `score`.
- QQP: `id qid1 qid2 question1 question2 is_duplicate`; test `id question1 question2`.
- MNLI: `sentence1 sentence2` at columns 8, 9 and `gold_label` last; dev_matched/dev_mismatched,
  test_matched/test_mismatched. QNLI: `index question sentence label`. RTE, WNLI: `index sentence1 sentence2 label`.
- AX: `diagnostic/diagnostic.tsv` (`index sentence1 sentence2`), predicted with the MNLI model.

Files are tab-separated without quoting (csv.QUOTE_NONE, as every GLUE reader). Columns are found by header
name, so a file of another layout is refused by name; a row with another number of fields is refused with its
file and line (or skipped and counted with `skip_ragged_rows`, for a corrupted download).

    task = TASKS["mrpc"]
    data = read_task(task, "/data/glue", with_test=True)   # data.train, data.dev["dev"], data.test["MRPC"]
"""

from __future__ import annotations

import csv
import dataclasses
import io
import logging
import math
import os
from typing import Optional

from bertjax.runtime import files
from bertjax.finetuning.readers import Source, TextExample, read_text

log = logging.getLogger(__name__)

TFDS = "tfds"  # config.data_dir value that reads TFDS's glue/* (tfds or tfds:DATA_DIR)


@dataclasses.dataclass(frozen=True)
class GlueTask:
    name: str  # the --config.tasks name
    folder: str  # the official folder under data_dir
    labels: Optional[tuple[str, ...]]  # GLUE's label strings, sorted; None = regression (STS-B)
    metrics: tuple[str, ...]  # what the GLUE paper reports, in its order
    text: tuple[str, Optional[str]]  # header names of the text columns
    label_column: str
    index_column: str = "index"  # of the test file: the submission's index
    dev: tuple[tuple[str, str], ...] = (("dev", "dev"),)  # (name in reports, file stem)
    test: tuple[tuple[str, str], ...] = ()  # (submission file stem, file stem)
    tfds_name: str = ""
    tfds_label_by_index: bool = False  # TFDS names the classes (acceptable, ...) where GLUE writes 0/1
    tfds_dev: tuple[str, ...] = ("validation",)
    tfds_test: tuple[str, ...] = ("test",)

    @property
    def regression(self) -> bool:
        return self.labels is None

    @property
    def headerless(self) -> bool:
        return self.name == "cola"  # CoLA's train and dev files only


_BINARY = ("0", "1")
_NLI = ("contradiction", "entailment", "neutral")
_ENTAIL = ("entailment", "not_entailment")
TASKS: dict[str, GlueTask] = {
    t.name: t
    for t in (
        GlueTask(
            "cola",
            "CoLA",
            _BINARY,
            ("matthews_corrcoef",),
            ("sentence", None),
            "label",
            test=(("CoLA", "test"),),
            tfds_name="cola",
            tfds_label_by_index=True,
        ),
        GlueTask(
            "sst2",
            "SST-2",
            _BINARY,
            ("accuracy",),
            ("sentence", None),
            "label",
            test=(("SST-2", "test"),),
            tfds_name="sst2",
            tfds_label_by_index=True,
        ),
        GlueTask(
            "mrpc",
            "MRPC",
            _BINARY,
            ("f1", "accuracy"),
            ("#1 String", "#2 String"),
            "Quality",
            test=(("MRPC", "test"),),
            tfds_name="mrpc",
            tfds_label_by_index=True,
        ),
        GlueTask(
            "stsb",
            "STS-B",
            None,
            ("pearson", "spearman"),
            ("sentence1", "sentence2"),
            "score",
            test=(("STS-B", "test"),),
            tfds_name="stsb",
        ),
        GlueTask(
            "qqp",
            "QQP",
            _BINARY,
            ("f1", "accuracy"),
            ("question1", "question2"),
            "is_duplicate",
            index_column="id",
            test=(("QQP", "test"),),
            tfds_name="qqp",
            tfds_label_by_index=True,
        ),
        GlueTask(
            "mnli",
            "MNLI",
            _NLI,
            ("accuracy",),
            ("sentence1", "sentence2"),
            "gold_label",
            dev=(("mnli_m", "dev_matched"), ("mnli_mm", "dev_mismatched")),
            test=(("MNLI-m", "test_matched"), ("MNLI-mm", "test_mismatched")),
            tfds_name="mnli",
            tfds_dev=("validation_matched", "validation_mismatched"),
            tfds_test=("test_matched", "test_mismatched"),
        ),
        GlueTask(
            "qnli",
            "QNLI",
            _ENTAIL,
            ("accuracy",),
            ("question", "sentence"),
            "label",
            test=(("QNLI", "test"),),
            tfds_name="qnli",
        ),
        GlueTask(
            "rte",
            "RTE",
            _ENTAIL,
            ("accuracy",),
            ("sentence1", "sentence2"),
            "label",
            test=(("RTE", "test"),),
            tfds_name="rte",
        ),
        GlueTask(
            "wnli",
            "WNLI",
            _BINARY,
            ("accuracy",),
            ("sentence1", "sentence2"),
            "label",
            test=(("WNLI", "test"),),
            tfds_name="wnli",
            tfds_label_by_index=True,
        ),
    )
}
# AX, the diagnostic set: MNLI's labels, predicted by the chosen MNLI run.
AX = GlueTask(
    "ax",
    "diagnostic",
    _NLI,
    (),
    ("sentence1", "sentence2"),
    "label",
    test=(("AX", "diagnostic"),),
    tfds_name="ax",
    tfds_test=("test",),
)
CLASSES = {
    "matthews_corrcoef": "Matthews corr.",
    "accuracy": "accuracy",
    "f1": "F1",
    "pearson": "Pearson",
    "spearman": "Spearman",
}


def parse_tasks(text: str) -> tuple[GlueTask, ...]:
    """`"cola,sst2"` → the tasks, in the given order; an unknown name is one sentence listing them."""
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in TASKS]
    if unknown or not names:
        raise ValueError(
            f"config.tasks={text!r}: {', '.join(map(repr, unknown)) or 'no task'} is not a GLUE task; "
            f"choose among {','.join(TASKS)} (AX is predicted with the MNLI model)."
        )
    if len(set(names)) != len(names):
        raise ValueError(f"config.tasks={text!r} names a task twice; list each once.")
    return tuple(TASKS[n] for n in names)


@dataclasses.dataclass
class Split:
    examples: list[TextExample]
    ids: list[str]  # test: the index column, what the submission file repeats
    skipped: int = 0  # ragged rows skipped (skip_ragged_rows)


@dataclasses.dataclass
class TaskData:
    task: GlueTask
    train: Split
    dev: dict[str, Split]  # by report name: {"dev": ...} or MNLI's {"mnli_m": ..., "mnli_mm": ...}
    test: dict[str, Split]  # by submission stem: {"RTE": ...}; empty without test files
    origin: dict[str, str]  # "train", a dev or test name → its file (or tfds:glue/NAME:SPLIT)


# --- The official files --------------------------------------------------------------------------------


def _split_file(task: GlueTask, data_dir: str, stem: str, kind: str) -> str:
    folder = os.path.join(data_dir, task.folder)
    if not files.isdir(folder):
        there = sorted(files.listdir(data_dir)) if files.isdir(data_dir) else None
        if there is None:
            raise FileNotFoundError(
                f"config.data_dir={data_dir} does not exist; point it at the folder "
                "download_glue_data.py wrote (CoLA/, SST-2/, ..., MNLI/, diagnostic/)."
            )
        raise FileNotFoundError(
            f"{task.name}: no folder {folder} (config.data_dir holds {there or 'nothing'}); "
            f"download the GLUE data into {data_dir}, or leave {task.name} out of config.tasks."
        )
    path = os.path.join(folder, stem + ".tsv")
    if not files.isfile(path):
        there = sorted(files.listdir(folder))
        without = (
            "; or pass --config.submission=false to run without the test sets (no submission files)"
            if kind == "test"
            else ""
        )
        raise FileNotFoundError(
            f"{task.name}: no {kind} file {path} ({folder} holds {there or 'nothing'}); GLUE's "
            f"layout names it {stem}.tsv{without}."
        )
    return path


def _rows(path: str, skip_ragged: bool, width: Optional[int] = None) -> tuple[list[tuple[int, list[str]]], int]:
    """(line number, fields) of every non-blank row; rows of another width than the first are refused (or
    skipped and counted)."""
    reader = csv.reader(io.StringIO(read_text(path), newline=""), delimiter="\t", quoting=csv.QUOTE_NONE)
    rows, skipped, line = [], 0, 1
    for fields in reader:
        number, line = line, reader.line_num + 1
        if not fields or fields == [""]:
            continue
        width = width or len(fields)
        if len(fields) != width:
            if skip_ragged:
                skipped += 1
                continue
            raise ValueError(
                f"{path}:{number}: {len(fields)} tab-separated fields where the file has {width}; fix "
                "this row (a stray tab or a cut line), or set --config.skip_ragged_rows=true to skip such "
                "rows (they are counted)."
            )
        rows.append((number, fields))
    if not rows:
        raise ValueError(f"{path} is empty; download the task's files again.")
    return rows, skipped


def _label(task: GlueTask, raw: str, source: Source) -> str | float:
    raw = raw.strip()
    if task.regression:
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and 0.0 <= value <= 5.0):
            raise ValueError(
                f"{source}: {task.folder} score {raw!r} is not a number in [0, 5]; STS-B's last column "
                "is the similarity score."
            )
        return value
    if raw not in task.labels:
        raise ValueError(
            f"{source}: {task.folder} label {raw!r} is not one of its {len(task.labels)} labels "
            f"{list(task.labels)}; fix the row or download the task's files again."
        )
    return raw


def _read_file(task: GlueTask, path: str, labelled: bool, skip_ragged: bool) -> Split:
    if labelled and task.headerless:
        rows, skipped = _rows(path, skip_ragged, width=4)
        first = rows[0][1]
        if first[1].strip() not in task.labels:
            raise ValueError(
                f"{path}:{rows[0][0]}: CoLA's train/dev files have no header and four columns (source, "
                f"label, original label, sentence); this row starts {first[:2]}, not that layout."
            )
        return Split(
            [TextExample(f[3], None, _label(task, f[1], Source(path, n)), Source(path, n)) for n, f in rows],
            [],
            skipped,
        )
    rows, skipped = _rows(path, skip_ragged)
    (_, header), body = rows[0], rows[1:]
    header = [h.strip() for h in header]
    wanted = [c for c in task.text if c] + [task.label_column if labelled else task.index_column]
    missing = [c for c in wanted if c not in header]
    if missing:
        raise ValueError(
            f"{path}: no column {', '.join(map(repr, missing))} in its header {header}; "
            f"{task.folder}'s {'train/dev' if labelled else 'test'} layout has {wanted} "
            "(download_glue_data.py's files)."
        )
    if not labelled and task.label_column in header:
        raise ValueError(
            f"{path}: a test file with a {task.label_column!r} column; GLUE's test files are "
            "unlabelled — the dev file may have been copied over it, download the task's files again."
        )
    if not body:
        raise ValueError(f"{path} has a header but no rows; download the task's files again.")
    a, b = (header.index(c) if c else None for c in task.text)
    label = header.index(task.label_column) if labelled else None
    index = header.index(task.index_column) if not labelled else None
    examples = [
        TextExample(
            f[a],
            f[b] if b is not None else None,
            _label(task, f[label], Source(path, n)) if labelled else None,
            Source(path, n),
        )
        for n, f in body
    ]
    return Split(examples, [body_row[index].strip() for _, body_row in body] if index is not None else [], skipped)


def _read_official(task: GlueTask, data_dir: str, with_test: bool, skip_ragged: bool) -> TaskData:
    origin = {}

    def read(key: str, stem: str, kind: str, labelled: bool) -> Split:
        path = _split_file(task, data_dir, stem, kind)
        origin[key] = path
        split = _read_file(task, path, labelled, skip_ragged)
        if split.skipped:
            log.warning("glue: %s: %d ragged rows skipped (config.skip_ragged_rows)", path, split.skipped)
        return split

    train = read("train", "train", "train", True) if task is not AX else Split([], [])
    dev = {name: read(name, stem, "dev", True) for name, stem in task.dev} if task is not AX else {}
    test = {name: read(name, stem, "test", False) for name, stem in task.test} if with_test else {}
    return TaskData(task, train, dev, test, origin)


# --- TFDS -------------------------------------------------------------------------------------------------


def _read_tfds(task: GlueTask, data_dir: Optional[str], with_test: bool) -> TaskData:
    import tensorflow_datasets as tfds  # deferred: heavy, and only this reader needs it

    name = f"glue/{task.tfds_name}"
    where = f"data_dir {data_dir!r}" if data_dir else "the default TFDS data_dir"
    try:
        builder = tfds.builder(name, data_dir=data_dir)
        prepared = builder.is_prepared()
    except tfds.core.registered.DatasetNotFoundError:
        prepared = False
    if not prepared:
        raise FileNotFoundError(
            f"{task.name}: TFDS dataset {name} is not prepared in {where}; run `tfds build "
            f"glue/{task.tfds_name}{' --data_dir=' + data_dir if data_dir else ''}` first, or "
            "point config.data_dir at the official GLUE folders."
        )
    features = builder.info.features
    classes = getattr(features["label"], "names", None)
    a, b = "sentence", None
    if task.text[1] is not None:  # the pair's feature names, in tfds' order
        a, b = next(
            (x, y)
            for x, y in (
                ("sentence1", "sentence2"),
                ("question1", "question2"),
                ("premise", "hypothesis"),
                ("question", "sentence"),
            )
            if x in features
        )

    def read(split: str, labelled: bool) -> Split:
        if split not in builder.info.splits:
            raise ValueError(
                f"{task.name}: TFDS dataset {name} has no split {split!r} (it has "
                f"{sorted(builder.info.splits)}); prepare it again with `tfds build {name}`."
            )
        examples, ids = [], []
        for row in tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False)):
            source = Source(f"tfds:{name}:{split}", 0, f"idx {int(row['idx'])}")
            value = row["label"].item()
            if labelled and not classes:
                label = _label(task, str(value), source)
            elif labelled:
                if value < 0:
                    raise ValueError(f"{source}: no label in a labelled split; prepare {name} again.")
                label = str(value) if task.tfds_label_by_index else classes[value]
                label = _label(task, label, source)
            else:
                label = None
            texts = [row[k].decode("utf-8") if k else None for k in (a, b)]
            examples.append(TextExample(texts[0], texts[1], label, source))
            ids.append(str(int(row["idx"])))
        order = sorted(range(len(ids)), key=lambda i: int(ids[i]))  # tfds' shards interleave; GLUE's order is idx
        return Split([examples[i] for i in order], [ids[i] for i in order] if not labelled else [])

    train = read("train", True) if task is not AX else Split([], [])
    dev = {n: read(s, True) for (n, _), s in zip(task.dev, task.tfds_dev)} if task is not AX else {}
    test = {n: read(s, False) for (n, _), s in zip(task.test, task.tfds_test)} if with_test else {}
    origin = {
        key: f"tfds:{name}:{split}"
        for key, split in (
            ("train", "train"),
            *zip((n for n, _ in task.dev), task.tfds_dev),
            *zip((n for n, _ in task.test), task.tfds_test),
        )
    }
    return TaskData(task, train, dev, test, origin)


def read_task(task: GlueTask, data_dir: str, with_test: bool, skip_ragged_rows: bool = False) -> TaskData:
    """A task's train, dev and (with_test) test splits from the official folders under data_dir, or from
    TFDS when data_dir is `tfds` or `tfds:TFDS_DATA_DIR`."""
    if data_dir == TFDS or data_dir.startswith(TFDS + ":"):
        return _read_tfds(task, data_dir.partition(":")[2] or None, with_test)
    return _read_official(task, data_dir, with_test, skip_ragged_rows)


def write_submission(path: str, ids: list[str], predictions: list) -> None:
    """GLUE's submission file: `index<TAB>prediction`, one row per test example, in the test file's order."""
    with files.open_file(path, "w") as f:
        f.write("index\tprediction\n")
        f.writelines(f"{i}\t{p}\n" for i, p in zip(ids, predictions))
