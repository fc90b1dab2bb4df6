"""`python -m bertjax.glue`: the GLUE suite on small files in each task's exact official layout (and TFDS's
glue/* built locally) — reading, metrics against scikit-learn/scipy, the choice of the best run, the GLUE score,
the submission files, resume after a kill, and every bad input as one sentence."""

from __future__ import annotations

import json
import logging
import pathlib
import runpy
import shutil

import jax
import numpy as np
import pytest

import glue_fixtures
from bertjax.training import checkpoint as checkpoint_lib
from bertjax.jobs import finetune as finetuning, glue as glue_suite
from bertjax.finetuning import glue_data
from test_finetune import pretrained_dir  # noqa: F401  (a fixture: a tiny BERT as a Hugging Face directory)

ROOT = pathlib.Path(__file__).resolve().parent.parent
POSITIVE = {"cola": "1", "sst2": "1", "mrpc": "1", "qqp": "1", "wnli": "1", "qnli": "entailment", "rte": "entailment"}


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory) -> pathlib.Path:
    return glue_fixtures.write_glue(tmp_path_factory.mktemp("glue") / "glue")


def suite_config(init_from: str, data_dir: pathlib.Path, **overrides):
    c = runpy.run_path(str(ROOT / "configs" / "glue.py"))["get_config"]("size=tiny")
    c.init_from, c.data_dir = init_from, str(data_dir)
    c.model.scan_layers = False
    c.train.update(global_batch_size=8, num_epochs=2.0, log_every_steps=50)
    c.data.max_seq_length = 24
    c.optim.learning_rate = 1e-3
    c.sweep.update(learning_rate="1e-3", seeds="0")
    c.checkpoint.update(every_steps=4, keep=2)  # a run killed after step 4 resumes from there
    for key, value in overrides.items():
        target = c
        *path, name = key.split(".")
        for part in path:
            target = target[part]
        target[name] = value
    return c


# --- Reading -----------------------------------------------------------------------------------------------


def test_every_official_layout_is_read_by_its_columns(glue_dir):
    for name, task in glue_data.TASKS.items():
        data = glue_data.read_task(task, str(glue_dir), with_test=True)
        assert len(data.train.examples) == 32 and all(len(s.examples) == 12 for s in data.dev.values())
        assert [n for n, _ in task.dev] == list(data.dev)
        for example in data.train.examples + [e for s in data.dev.values() for e in s.examples]:
            text = example.text_b if task.text[1] else example.text_a
            assert (example.text_b is None) == (task.text[1] is None), (name, example)
            if name == "stsb":  # the score grows with the count of "good" in sentence2
                assert example.label == (text.split().count("good") - 1) * 1.25, example
            elif name == "mnli":
                want = "entailment" if "good" in text else "contradiction" if "bad" in text else "neutral"
                assert example.label == want and "(" not in example.text_a, example  # not the parse columns
            else:  # the label came from the label column, the text from the text column
                assert (example.label == POSITIVE[name]) == ("good" in text.split()), (name, example)
        for stem, split in data.test.items():
            assert split.ids == [str(i) for i in range(len(split.examples))] and all(
                e.label is None for e in split.examples
            )
    mnli = glue_data.read_task(glue_data.TASKS["mnli"], str(glue_dir), with_test=True)
    assert list(mnli.test) == ["MNLI-m", "MNLI-mm"] and len(mnli.test["MNLI-mm"].examples) == 8
    ax = glue_data.read_task(glue_data.AX, str(glue_dir), with_test=True)
    assert len(ax.test["AX"].examples) == 5 and ax.test["AX"].examples[0].text_b
    mrpc = glue_data.read_task(glue_data.TASKS["mrpc"], str(glue_dir), with_test=False)  # header behind a BOM
    assert not mrpc.test and mrpc.train.examples[0].source.line == 2


def test_tfds_glue_reads_what_the_official_files_hold(glue_dir, tmp_path):
    pytest.importorskip("tensorflow_datasets")
    configs = ("cola", "mrpc", "stsb", "mnli", "ax")
    glue_fixtures.build_tfds(tmp_path / "tfds", glue_dir, configs)
    rows = lambda split: [(e.text_a, e.text_b, e.label) for e in split.examples]  # noqa: E731
    for task in [glue_data.TASKS[c] for c in configs[:-1]] + [glue_data.AX]:
        official = glue_data.read_task(task, str(glue_dir), with_test=True)
        tfds = glue_data.read_task(task, f"tfds:{tmp_path / 'tfds'}", with_test=True)
        assert rows(tfds.train) == rows(official.train), task.name  # CoLA's 0/1 from TFDS's class names too
        assert {k: rows(v) for k, v in tfds.dev.items()} == {k: rows(v) for k, v in official.dev.items()}
        assert {k: (rows(v), v.ids) for k, v in tfds.test.items()} == {
            k: (rows(v), v.ids) for k, v in official.test.items()
        }
    with pytest.raises(FileNotFoundError, match=r"glue/rte is not prepared in data_dir .*tfds build glue/rte"):
        glue_data.read_task(glue_data.TASKS["rte"], f"tfds:{tmp_path / 'tfds'}", with_test=True)


def test_metrics_equal_scikit_learn_and_scipy():
    from scipy import stats
    from sklearn import metrics

    rng = np.random.default_rng(0)
    gold, predicted = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
    predicted[:120] = gold[:120]
    as_text = lambda ids: [str(i) for i in ids]  # noqa: E731
    mrpc = glue_suite.glue_metrics(glue_data.TASKS["mrpc"], as_text(gold), as_text(predicted))
    assert mrpc["f1"] == pytest.approx(100 * metrics.f1_score(gold, predicted))
    assert mrpc["accuracy"] == pytest.approx(100 * metrics.accuracy_score(gold, predicted))
    cola = glue_suite.glue_metrics(glue_data.TASKS["cola"], as_text(gold), as_text(predicted))
    assert cola == {"matthews_corrcoef": pytest.approx(100 * metrics.matthews_corrcoef(gold, predicted))}
    labels = np.array(glue_data.TASKS["mnli"].labels)
    three = rng.integers(0, 3, 90)
    mnli = glue_suite.glue_metrics(
        glue_data.TASKS["mnli"], list(labels[three]), list(labels[(three + (three > 1)) % 3])
    )
    assert mnli["accuracy"] == pytest.approx(100 * metrics.accuracy_score(three, (three + (three > 1)) % 3))
    x = rng.uniform(0, 5, 50)
    y = x + rng.normal(0, 1, 50)
    stsb = glue_suite.glue_metrics(glue_data.TASKS["stsb"], list(x), list(y))
    assert stsb["pearson"] == pytest.approx(100 * stats.pearsonr(x, y)[0])
    assert stsb["spearman"] == pytest.approx(100 * stats.spearmanr(x, y)[0])
    assert glue_suite.glue_metrics(glue_data.TASKS["qqp"], ["0", "0"], ["0", "0"])["f1"] == 0.0  # sklearn's 0


# --- The suite ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def suite(pretrained_dir, glue_dir, tmp_path_factory):  # noqa: F811
    """SST-2, STS-B, MNLI, and RTE from the MNLI run with two restarts: five runs."""
    workdir = tmp_path_factory.mktemp("suite") / "glue"
    config = suite_config(
        pretrained_dir,
        glue_dir,
        tasks="sst2,stsb,rte,mnli",
        from_mnli="rte",
        small_task_seeds="0,1",
        per_task="stsb.sweep.seeds=0",
    )
    report = glue_suite.run_suite(config, str(workdir))
    return workdir, config, report


def test_the_suite_chooses_the_best_run_on_dev_and_reports_the_papers_metrics(suite, glue_dir):
    workdir, _, report = suite
    assert json.loads((workdir / "glue.json").read_text()) == json.loads(json.dumps(report))
    tasks = report["tasks"]
    assert list(tasks) == ["mnli", "sst2", "stsb", "rte"]  # MNLI first: RTE starts from its best run
    assert [(r["learning_rate"], r["seed"]) for r in tasks["rte"]["runs"]] == [(1e-3, 0), (1e-3, 1)]  # restarts
    assert len(tasks["stsb"]["runs"]) == 1 and len(tasks["mnli"]["runs"]) == 1  # per_task: stsb without them
    for name, task in tasks.items():
        best = max(task["runs"], key=lambda r: r["score"])
        assert (task["learning_rate"], task["seed"], task["dev"]) == (best["learning_rate"], best["seed"], best["dev"])
        assert set(task["dev"]) == {n for n, _ in glue_data.TASKS[name].dev}
    assert set(tasks["mnli"]["dev"]) == {"mnli_m", "mnli_mm"} and set(tasks["stsb"]["dev"]["dev"]) == {
        "pearson",
        "spearman",
    }
    spread = tasks["rte"]["spread_over_seeds"]["accuracy"]
    runs = [r["dev"]["dev"]["accuracy"] for r in tasks["rte"]["runs"]]
    assert spread["n"] == 2 and spread["mean"] == pytest.approx(np.mean(runs))
    assert tasks["rte"]["init_from"] == tasks["mnli"]["run"] and tasks["sst2"]["init_from"] != tasks["mnli"]["run"]
    # The dev scores are those of the chosen run's own predictions file, scored again here.
    run = pathlib.Path(tasks["sst2"]["run"])
    predictions = [json.loads(line) for line in (run / finetuning.PREDICTIONS_FILE).read_text().splitlines()]
    assert tasks["sst2"]["dev"]["dev"]["accuracy"] == pytest.approx(
        100 * np.mean([p["prediction"] == p["label"] for p in predictions])
    )
    entries = report["score_entries"]
    assert set(entries) == {"MNLI-m", "MNLI-mm", "SST-2", "STS-B", "RTE"} and not report["score_complete"]
    assert entries["STS-B"] == tasks["stsb"]["dev"]["dev"]["spearman"]
    assert report["score"] == pytest.approx(np.mean(list(entries.values())))
    table = (workdir / "glue.md").read_text()
    assert "| MNLI-mm | accuracy |" in table and "| STS-B | Spearman |" in table and "MNLI run |" in table
    assert f"**{report['score']:.1f}**" in table


def test_submission_files_are_what_the_glue_server_takes(suite, glue_dir):
    workdir, _, _ = suite
    files = sorted(p.name for p in (workdir / "submission").iterdir())
    assert files == ["AX.tsv", "MNLI-m.tsv", "MNLI-mm.tsv", "RTE.tsv", "SST-2.tsv", "STS-B.tsv"]
    vocab = {
        "SST-2": {"0", "1"},
        "RTE": {"entailment", "not_entailment"},
        "MNLI-m": {"entailment", "neutral", "contradiction"},
        "MNLI-mm": {"entailment", "neutral", "contradiction"},
        "AX": {"entailment", "neutral", "contradiction"},
    }
    tests = {
        "SST-2": "SST-2/test.tsv",
        "RTE": "RTE/test.tsv",
        "MNLI-m": "MNLI/test_matched.tsv",
        "MNLI-mm": "MNLI/test_mismatched.tsv",
        "AX": "diagnostic/diagnostic.tsv",
        "STS-B": "STS-B/test.tsv",
    }
    for stem, source in tests.items():
        lines = (workdir / "submission" / f"{stem}.tsv").read_text().splitlines()
        test_rows = (glue_dir / source).read_text().splitlines()[1:]
        assert lines[0] == "index\tprediction" and len(lines) - 1 == len(test_rows), stem
        rows = [line.split("\t") for line in lines[1:]]
        assert [r[0] for r in rows] == [t.split("\t")[0] for t in test_rows]  # the test file's own index
        if stem == "STS-B":
            assert all(0.0 <= float(r[1]) <= 5.0 for r in rows)
        else:
            assert {r[1] for r in rows} <= vocab[stem], stem


def test_a_killed_suite_reruns_finished_runs_never_and_resumes_the_unfinished_one(suite, tmp_path, caplog):
    workdir, config, report = suite
    copy = tmp_path / "glue"
    shutil.copytree(workdir, copy)
    # As a kill during RTE's second run leaves it: no result, the checkpoint of step 4 and not the last.
    killed = copy / "rte" / "lr=0.001,seed=1"
    (killed / glue_suite.RUN_FILE).unlink()
    steps = sorted(int(p.name) for p in (killed / "checkpoints").iterdir() if p.name.isdigit())
    assert steps[0] == 4 and len(steps) > 1
    for step in steps[1:]:
        shutil.rmtree(killed / "checkpoints" / str(step))
    (copy / "glue.json").unlink()
    with caplog.at_level(logging.INFO):
        again = glue_suite.run_suite(config, str(copy))
    skipped = [r.getMessage() for r in caplog.records if "finished before: skipped" in r.getMessage()]
    assert len(skipped) == 4 and not any("rte lr=0.001,seed=1" in m for m in skipped), skipped
    assert any("restore: resumed from" in r.getMessage() and "/4" in r.getMessage() for r in caplog.records)
    assert again["tasks"]["rte"]["runs"] == report["tasks"]["rte"]["runs"]  # resumed exactly: the same scores
    # The copy is a moved suite: its runs are found where they are now, RTE starting from the copy's MNLI run.
    assert again["tasks"]["rte"]["init_from"] == str(copy / "mnli" / "lr=0.001,seed=0")
    a = checkpoint_lib.load_params(str(workdir / "rte" / "lr=0.001,seed=1"))[1]
    b = checkpoint_lib.load_params(str(killed))[1]
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)
    assert (copy / "submission" / "RTE.tsv").read_text() == (workdir / "submission" / "RTE.tsv").read_text()


def test_the_choice_is_the_best_run_over_every_learning_rate_and_seed():
    runs = [
        {
            "learning_rate": lr,
            "seed": seed,
            "run": f"{lr}/{seed}",
            "score": score,
            "dev": {"dev": {"f1": score + 1, "accuracy": score - 1}},
        }
        for lr, seed, score in [(5e-5, 0, 80.0), (5e-5, 1, 70.0), (3e-5, 0, 78.0), (3e-5, 1, 79.0)]
    ]
    choice = glue_suite._choose(glue_data.TASKS["mrpc"], runs)
    # The paper keeps the best run on dev, even where its learning rate's mean over seeds is lower.
    assert (choice["learning_rate"], choice["seed"], choice["score"]) == (5e-5, 0, 80.0)
    assert choice["by_learning_rate"]["5e-05"]["mean"] == 75.0 and choice["by_learning_rate"]["3e-05"]["mean"] == 78.5
    assert choice["spread_over_seeds"]["f1"] == {
        "mean": 76.0,
        "std": pytest.approx(np.std([81, 71], ddof=1)),
        "min": 71.0,
        "max": 81.0,
        "n": 2,
    }


def test_a_stopped_run_stops_the_suite_and_changed_settings_are_refused(suite, tmp_path, monkeypatch):
    workdir, config, _ = suite
    copy = tmp_path / "glue"
    shutil.copytree(workdir, copy)
    (copy / "glue.json").unlink()
    shutil.rmtree(copy / "stsb")
    started = []
    monkeypatch.setattr(
        finetuning,
        "run",
        lambda job, run_dir, given=None: started.append(run_dir) or finetuning.Outcome({}, finished=False),
    )  # SIGTERM in the first run it starts
    assert glue_suite.run_suite(config, str(copy)) == {}
    assert started == [str(copy / "stsb" / "lr=0.001,seed=0")] and not (copy / "glue.json").exists()
    monkeypatch.undo()
    changed = suite_config(
        config.init_from,
        config.data_dir,
        tasks=config.tasks,
        from_mnli="rte",
        small_task_seeds="0,1",
        per_task=config.per_task,
        **{"train.num_epochs": 3.0},
    )
    with pytest.raises(
        ValueError,
        match=r"mnli/lr=0.001,seed=0 is a finished run of other settings \(config.train"
        r".num_epochs was 2.0 there and is 3.0 now\).*new --workdir",
    ):
        glue_suite.run_suite(changed, str(workdir))


# --- Bad input is one sentence -----------------------------------------------------------------------------


def _copy(glue_dir: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    shutil.copytree(glue_dir, tmp_path / "glue")
    return tmp_path / "glue"


def _one_sentence(error: pytest.ExceptionInfo, *parts: str) -> None:
    text = str(error.value)
    assert "\n" not in text and all(p in text for p in parts), text


def test_a_missing_folder_or_split_names_what_is_there(glue_dir, tmp_path):
    root = _copy(glue_dir, tmp_path)
    shutil.rmtree(root / "RTE")
    with pytest.raises(FileNotFoundError) as e:
        glue_data.read_task(glue_data.TASKS["rte"], str(root), with_test=True)
    _one_sentence(e, f"rte: no folder {root / 'RTE'}", "'CoLA'", "'MNLI'", "leave rte out of config.tasks")
    (root / "MNLI" / "dev_mismatched.tsv").unlink()
    with pytest.raises(FileNotFoundError) as e:
        glue_data.read_task(glue_data.TASKS["mnli"], str(root), with_test=False)
    _one_sentence(e, "no dev file", "dev_mismatched.tsv", "'dev_matched.tsv'", "'train.tsv'")
    (root / "SST-2" / "test.tsv").unlink()
    with pytest.raises(FileNotFoundError) as e:
        glue_data.read_task(glue_data.TASKS["sst2"], str(root), with_test=True)
    _one_sentence(e, "no test file", "SST-2/test.tsv", "pass --config.submission=false to run without the test sets")
    glue_data.read_task(glue_data.TASKS["sst2"], str(root), with_test=False)  # config.submission=false needs none


def test_files_of_another_layout_bad_labels_and_ragged_rows(glue_dir, tmp_path):
    root = _copy(glue_dir, tmp_path)
    qnli = root / "QNLI" / "train.tsv"
    qnli.write_text(qnli.read_text().replace("index\tquestion\tsentence\tlabel", "index\tsentence1\tsentence2\tlabel"))
    with pytest.raises(ValueError) as e:
        glue_data.read_task(glue_data.TASKS["qnli"], str(root), with_test=False)
    _one_sentence(e, str(qnli), "no column 'question', 'sentence'", "QNLI's train/dev layout")
    mnli = root / "MNLI" / "dev_matched.tsv"
    lines = mnli.read_text().splitlines()
    lines[3] = lines[3].rsplit("\t", 1)[0] + "\thesitant"
    mnli.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError) as e:
        glue_data.read_task(glue_data.TASKS["mnli"], str(root), with_test=False)
    _one_sentence(e, f"{mnli}:4", "label 'hesitant' is not one of its 3 labels", "'neutral'")
    rte = root / "RTE" / "train.tsv"
    lines = rte.read_text().splitlines()
    lines[5] = lines[5].replace("\t", " ", 1)
    rte.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError) as e:
        glue_data.read_task(glue_data.TASKS["rte"], str(root), with_test=False)
    _one_sentence(e, f"{rte}:6: 3 tab-separated fields where the file has 4", "skip_ragged_rows=true")
    data = glue_data.read_task(glue_data.TASKS["rte"], str(root), with_test=False, skip_ragged_rows=True)
    assert len(data.train.examples) == 31 and data.train.skipped == 1
    cola = root / "CoLA" / "train.tsv"
    cola.write_text("sentence\tlabel\tx\ty\n" + cola.read_text())
    with pytest.raises(ValueError) as e:
        glue_data.read_task(glue_data.TASKS["cola"], str(root), with_test=False)
    _one_sentence(e, f"{cola}:1", "no header and four columns", "not that layout")
    shutil.copy(root / "SST-2" / "dev.tsv", root / "SST-2" / "test.tsv")
    with pytest.raises(ValueError) as e:
        glue_data.read_task(glue_data.TASKS["sst2"], str(root), with_test=True)
    _one_sentence(e, "SST-2/test.tsv", "no column 'index'")
    test = root / "RTE" / "test.tsv"
    test.write_text(test.read_text().replace("index\tsentence1\tsentence2", "index\tsentence1\tsentence2\tlabel"))
    with pytest.raises(ValueError) as e:
        glue_data.read_task(glue_data.TASKS["rte"], str(root), with_test=True, skip_ragged_rows=True)
    _one_sentence(e, f"{test}: a test file with a 'label' column", "GLUE's test files are unlabelled")
    stsb = root / "STS-B" / "train.tsv"
    stsb.write_text(stsb.read_text().replace("\t5.000\n", "\t7.5\n", 1))
    with pytest.raises(ValueError) as e:
        glue_data.read_task(glue_data.TASKS["stsb"], str(root), with_test=False)
    _one_sentence(e, "score '7.5' is not a number in [0, 5]")


def test_suite_settings_that_cannot_run_are_one_sentence(glue_dir, pretrained_dir):  # noqa: F811
    def refused(data_dir=glue_dir, **overrides) -> str:
        with pytest.raises(ValueError) as e:
            glue_suite.parse(suite_config(pretrained_dir, data_dir, **overrides))
        assert "\n" not in str(e.value)
        return str(e.value)

    assert "'sst' is not a GLUE task; choose among cola,sst2,mrpc,stsb,qqp,mnli,qnli,rte,wnli" in refused(
        tasks="sst,rte"
    )
    assert "leaves out mnli; add mnli to config.tasks" in refused(tasks="rte", from_mnli="rte")
    assert "is not TASK.SECTION.FIELD=VALUE" in refused(per_task="rte.num_epochs=4")
    assert "config.data_dir is empty" in refused(data_dir="")
    assert (
        "config.per_task sets rte's settings: config.train.num_epoch is not a setting; did you mean "
        "config.train.num_epochs?" in refused(per_task="rte.train.num_epoch=4")
    )
    assert "config.per_task sets rte's settings: config.train.num_epochs='four' must be a number" in refused(
        per_task="rte.train.num_epochs=four"
    )
    settings, _ = glue_suite.parse(
        suite_config(
            pretrained_dir,
            glue_dir,
            tasks="rte,mnli",
            from_mnli="rte",
            per_task="rte.train.num_epochs=4; rte.sweep.seeds=3,4",
        )
    )
    assert [t.name for t in settings.tasks] == ["mnli", "rte"]
    assert settings.per_task == {"rte": {"train": {"num_epochs": 4}, "sweep": {"seeds": "3,4"}}}
