"""The contracts and their registries: every model family keeps the family contract (models.CONTRACT), every
fine-tuning task the task contract (finetuning/tasks/base.py), every corpus source `Source`'s; code outside
models/ names no family, code outside finetuning/tasks/ no task; every package says what its folder is for.
Each rule is shown to catch a planted breach."""

from __future__ import annotations

import ast

import pytest

import train_setup
from test_house import PACKAGE, ROOT, import_graph

FAMILIES = ("bert", "modernbert")
TASKS = ("sequence_classification", "token_classification", "question_answering", "retrieval")


def named_outside(names: tuple[str, ...], allowed: tuple[str, ...]) -> dict[str, list[int]]:
    """String constants equal to one of `names` in bertjax's modules outside the `allowed` folders (a
    comparison, a default, a table): where a registry's name is used instead of the registry."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        rel = str(path.relative_to(PACKAGE))
        if rel.startswith(allowed):
            continue
        lines = literal_lines(path.read_text(), names)
        if lines:
            found[rel] = lines
    return found


def literal_lines(source: str, names: tuple[str, ...]) -> list[int]:
    return sorted(
        node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Constant) and node.value in names
    )


def test_no_family_is_named_or_imported_outside_models():
    """Code outside models/ asks the registry (models.get / of / of_fingerprint) and the family contract; it
    neither imports a family's modules nor writes a family's name."""
    import bertjax.models as models

    assert models.FAMILIES == FAMILIES
    graph = import_graph()
    imports = {
        module: sorted(t for t in targets if t.startswith(tuple(f"bertjax.models.{f}" for f in FAMILIES)))
        for module, targets in graph.items()
        if not module.startswith("bertjax.models")
    }
    assert {m: t for m, t in imports.items() if t} == {}
    assert named_outside(FAMILIES, ("models/", "configs/")) == {}
    assert literal_lines('if arch.model_type == "bert":\n    pass\n', FAMILIES) == [1]  # planted


def test_task_names_are_compared_nowhere_outside_the_task_registry():
    """The job, predict, the GLUE suite, the heads and the schema ask finetuning.tasks.get(config.task); a family
    (models/) names no task at all: a task hands it a `Head` (models/head.py), so a new task edits no family."""
    from bertjax.finetuning import tasks

    assert tasks.NAMES == TASKS
    # bertjax/retrieval.py is the command `python -m bertjax.retrieval`, named as the task: its command="retrieval"
    # labels its error lines, it compares no task name.
    assert named_outside(TASKS, ("finetuning/tasks/", "configs/", "retrieval.py")) == {}
    assert literal_lines('if job.task != "question_answering":\n    pass\n', TASKS) == [1]  # planted


def contract_breaches(module_names: dict[str, object], contract: dict[str, tuple[str, ...]]) -> list[str]:
    return [
        f"{part}.{name}" for part, names in contract.items() for name in names if not hasattr(module_names[part], name)
    ]


def test_every_family_keeps_the_family_contract():
    import types

    import bertjax.models as models

    for name in models.FAMILIES:
        family = models.get(name)
        modules = {"config": family.config, "model": family.model, "heads": family.heads, "hf": family.hf}
        assert contract_breaches(modules, models.CONTRACT) == [], name
        assert family.heads.HEADS and "SequenceClassification" in family.heads.HEADS, name
    broken = dict(modules, model=types.SimpleNamespace(from_config=None))  # planted: a family missing the rest
    assert "model.stack_layers" in contract_breaches(broken, models.CONTRACT)


def test_every_task_keeps_the_task_contract():
    from bertjax.finetuning import tasks
    from bertjax.finetuning.tasks.base import TaskKind

    for name in tasks.NAMES:
        assert isinstance(tasks.get(name), TaskKind) and tasks.get(name).name == name
    with pytest.raises(TypeError, match="abstract"):  # planted: a task kind without its scores

        class NoScores(TaskKind):
            def primary_metric(self, regression):
                return "f1"

        NoScores()
    with pytest.raises(ValueError, match="config.task='ner' is not one of"):
        tasks.get("ner")


def test_every_corpus_source_keeps_the_source_contract():
    """data/corpus/base.Source (list_units, _read_unit; the rest is shared): each source module's classes
    implement it, so open_source can hand any of them to prepare, the tokenizer and the main job."""
    import inspect

    from bertjax.data.corpus import base, sources, table

    found = {
        cls.__name__
        for module in (sources, table)
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, base.Source) and cls is not base.Source
    }
    assert {"TextSource", "TfdsSource", "PyDocsSource", "TableSource"} <= found
    assert all(not inspect.isabstract(getattr(sources, n, None) or getattr(table, n)) for n in found)

    class NoReader(base.Source):  # planted: a source that cannot read its units
        def list_units(self):
            return []

    assert inspect.isabstract(NoReader)


def test_every_package_says_what_its_folder_is_for():
    """DESIGN notes live in the packages' docstrings."""
    bare = [
        str(p.relative_to(ROOT))
        for p in PACKAGE.rglob("__init__.py")
        if "configs" not in p.parts and not ast.get_docstring(ast.parse(p.read_text()))
    ]
    assert bare == []


def test_a_new_tasks_head_is_built_by_every_family_without_an_edit():
    """A task hands the family a Head (models/head.py); no family names the task. A head no task has used yet
    (pooled, 4 outputs, no dropout, its own parameter name) is built by both families as they are."""
    import jax
    import jax.numpy as jnp

    import bertjax.models as models
    from bertjax.models.head import Head

    head = Head("pooled", 4, "SequenceClassification", name="classifier", dropout=False)
    tiny = dict(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    architectures = {
        "bert": models.get("bert").config.BertConfig(**tiny, max_position_embeddings=16),
        "modernbert": train_setup.tiny_modernbert(**tiny, local_attention=4, max_position_embeddings=16),
    }
    ids = jnp.full((2, 8), 7, jnp.int32)
    inputs = dict(input_ids=ids, input_mask=jnp.ones_like(ids), segment_ids=jnp.zeros_like(ids))
    for name, architecture in architectures.items():
        module = models.get(name).heads.finetuning_model(architecture, head)
        params = module.init(jax.random.PRNGKey(0), **inputs)["params"]
        logits = module.apply({"params": params}, **inputs)
        assert logits.shape == (2, 4) and "classifier" in params, name
        tokens = models.get(name).heads.finetuning_model(architecture, Head("tokens", 3, "TokenClassification"))
        assert tokens.apply(
            {"params": tokens.init(jax.random.PRNGKey(0), **inputs)["params"]},
            **inputs,
        ).shape == (2, 8, 3), name
    with pytest.raises(ValueError, match="Head.reads='sentence' is not one of"):
        Head("sentence", 2, "SequenceClassification")
