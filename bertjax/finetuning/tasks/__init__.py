"""Fine-tuning tasks, and the one registry the rest of the code asks about them.

A task kind is one module of this folder holding a `TaskKind` (base.py: the contract) as `KIND`: how its
examples are read, turned into rows and batched, its loss and accuracy sums, predictions, scores, and what
`python -m bertjax.predict` reads and writes. The job, the GLUE suite, predict and the fine-tuning heads ask
`get(config.task)` and never compare task names (tests/test_contracts.py checks it). The model side of a task
is its `head()`: a models/head.py `Head` (what the output layer reads, its outputs, transformers' class), which
each family builds (models/<name>/heads.py `finetuning_model`) and exports (hf.py `save_finetuned`) without knowing
the task.

Adding a task: its module here, and one line in TASKS. The registry and the task modules import no JAX
(losses import it when a step is traced), so the config schema can validate a task name and its settings.
"""

from __future__ import annotations

import importlib

from bertjax.finetuning.tasks.base import TaskKind

# config.task → the module that holds its KIND.
TASKS = {
    "sequence_classification": "bertjax.finetuning.tasks.sequence_classification",
    "token_classification": "bertjax.finetuning.tasks.token_classification",
    "question_answering": "bertjax.finetuning.tasks.question_answering",
    "retrieval": "bertjax.finetuning.tasks.retrieval",
}
NAMES = tuple(TASKS)


def get(name: str) -> TaskKind:
    if name not in TASKS:
        raise ValueError(f"config.task={name!r} is not one of {list(NAMES)}.")
    kind = importlib.import_module(TASKS[name]).KIND
    assert kind.name == name, (kind.name, name)
    return kind
