"""`bertjax.finetune`: the three tasks on the shared trainer, from a Hugging Face directory, with eval rows,
exact resume, sweeps, export to transformers' task classes, and its bad inputs."""

from __future__ import annotations

import json
import pathlib
import random
import runpy

import jax
import numpy as np
import pytest

import bertjax
from bertjax.finetuning import tasks
from bertjax.training import checkpoint as checkpoint_lib
from bertjax.jobs import export as exporting, finetune as finetuning, predict as prediction
from bertjax.models.bert import model as model_lib
from bertjax.models.bert import heads as bert_heads

ROOT = pathlib.Path(__file__).resolve().parent.parent
WORDS = [
    "good",
    "bad",
    "film",
    "plot",
    "the",
    "a",
    "was",
    "very",
    "not",
    "actor",
    "paris",
    "london",
    "john",
    "mary",
    "lives",
    "in",
    "works",
    "at",
    "acme",
    "globex",
    "where",
    "does",
    "who",
    "?",
    ".",
    ",",
]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB = SPECIALS + WORDS + ["##s", "##ing", "##ed"]


@pytest.fixture(scope="module")
def pretrained_dir(tmp_path_factory) -> str:
    """A tiny BERT with random weights, as a Hugging Face directory with its vocab."""
    path = tmp_path_factory.mktemp("tiny_bert")
    (path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    config = model_lib.BertConfig(
        vocab_size=len(VOCAB),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    model = model_lib.BertForPreTraining(config)
    bertjax.save_pretrained(
        str(path), model, model_lib.init_params(model, jax.random.PRNGKey(0)), vocab_file=str(path / "vocab.txt")
    )
    return str(path)


def config(init_from: str, task: str = "sequence_classification", **overrides):
    c = runpy.run_path(str(ROOT / "configs" / "finetune.py"))["get_config"]("size=tiny")
    c.task = task
    c.model.scan_layers = False
    c.train.update(init_from=init_from, global_batch_size=8, num_epochs=2.0, log_every_steps=5)
    c.data.update(max_seq_length=24)
    c.optim.learning_rate = 1e-3
    c.checkpoint.every_steps = 1000
    for key, value in overrides.items():
        section, name = key.split(".")
        c[section][name] = value
    return c


def sentiment(path: pathlib.Path, n: int, seed: int, pairs: bool = False) -> str:
    """A task a tiny model learns in a few dozen steps: the label is whether "good" or "bad" occurs."""
    rng = random.Random(seed)
    rows = ["text_a\ttext_b\tlabel" if pairs else "text\tlabel"]
    for _ in range(n):
        label = rng.choice(["pos", "neg"])
        words = [rng.choice(["the", "a", "film", "plot", "was", "very", "actor"]) for _ in range(5)]
        words.insert(rng.randrange(6), "good" if label == "pos" else "bad")
        text = " ".join(words)
        rows.append(f"{text}\tthe plot\t{label}" if pairs else f"{text}\t{label}")
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def assert_export_matches(workdir: pathlib.Path, hf_class: str) -> None:
    """`bertjax.export` of a fine-tuned run: the transformers class of its task loads it with no missing or
    unexpected keys and computes bertjax's logits (to 1e-4)."""
    import torch
    import transformers

    out = workdir / "hf"
    exporting.export(str(workdir), str(out))
    hf_model, info = getattr(transformers, hf_class).from_pretrained(str(out), output_loading_info=True)
    assert not any(info.values()), info
    fingerprint, params = checkpoint_lib.load_params(str(workdir))
    labels = fingerprint["labels"]
    if labels:
        assert hf_model.config.id2label == dict(enumerate(labels))
    model = bert_heads.BertForFinetuning(
        model_lib.BertConfig(**fingerprint["model"]),
        tasks.get(fingerprint["task"]).head(1 if fingerprint["regression"] else len(labels or [0, 0])),
    )
    rng = np.random.default_rng(0)
    ids = rng.integers(5, len(VOCAB), (2, 16))
    types, mask = np.zeros_like(ids), np.ones_like(ids)
    types[:, 8:], mask[1, 12:] = 1, 0
    ours = np.asarray(model.apply({"params": params}, ids, types, mask))
    with torch.no_grad():
        theirs = hf_model.eval()(
            input_ids=torch.tensor(ids), token_type_ids=torch.tensor(types), attention_mask=torch.tensor(mask)
        )
    theirs = (
        np.stack([theirs.start_logits.numpy(), theirs.end_logits.numpy()], -1)
        if hf_class.endswith("Answering")
        else theirs.logits.numpy()
    )
    np.testing.assert_allclose(
        ours[mask > 0] if ours.ndim == 3 else ours, theirs[mask > 0] if ours.ndim == 3 else theirs, atol=1e-4
    )


def eval_rows(workdir: pathlib.Path) -> list[dict]:
    return [r for r in map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "eval"]


def test_sequence_classification_learns_and_exports(pretrained_dir, tmp_path):
    train = sentiment(tmp_path / "train.tsv", 160, seed=0)
    dev = sentiment(tmp_path / "dev.tsv", 40, seed=1)
    workdir = tmp_path / "run"
    # 4 epochs: at 2 this random tiny model stays at chance for 2 seeds in 4, padded or packed alike.
    result = finetuning.finetune(
        config(pretrained_dir, **{"data.train_file": train, "data.eval_file": dev, "train.num_epochs": 4.0}),
        str(workdir),
    )
    assert result["accuracy"] >= 0.9, result  # chance is ~0.5
    assert {"macro_f1", "matthews_corrcoef"} <= result.keys()
    rows = eval_rows(workdir)
    assert rows[-1]["step"] == 80 and rows[-1]["accuracy"] == pytest.approx(result["accuracy"])
    assert json.loads((workdir / finetuning.LABELS_FILE).read_text()) == ["neg", "pos"]
    predictions = [json.loads(line) for line in (workdir / finetuning.PREDICTIONS_FILE).read_text().splitlines()]
    assert len(predictions) == 40 and {p["prediction"] for p in predictions} <= {"neg", "pos"}

    # The body came from init_from (the word embeddings still correlate with the pre-trained ones; a fresh
    # initialisation would not); the head is new and the pre-training heads are gone.
    _, params = checkpoint_lib.load_params(str(workdir))
    _, pre = bertjax.interop.pretrained.load(pretrained_dir)
    emb, pre_emb = (np.ravel(p["bert"]["embeddings"]["word_embeddings"]["embedding"]) for p in (params, pre))
    assert np.corrcoef(emb, pre_emb)[0, 1] > 0.5 and "classifier" in params and "nsp" not in params
    assert_export_matches(workdir, "BertForSequenceClassification")

    # predict: the same labels for the same texts, from a plain text file, and a TSV without labels.
    texts = [line.split("\t")[0] for line in pathlib.Path(dev).read_text().splitlines()[1:]]
    (tmp_path / "new.txt").write_text("\n".join(texts) + "\n")
    assert prediction.predict_file(str(workdir), str(tmp_path / "new.txt"), str(tmp_path / "out.jsonl")) == 40
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [o["text"] for o in out] == texts
    assert [o["prediction"] for o in out] == [p["prediction"] for p in predictions]
    assert all(0.5 <= o["probability"] <= 1 for o in out)
    with pytest.raises(ValueError, match="pre-training run, not a fine-tuned one"):
        prediction.predict_file(pretrained_dir, str(tmp_path / "new.txt"), str(tmp_path / "x.jsonl"))


def test_resume_continues_exactly(pretrained_dir, tmp_path):
    train = sentiment(tmp_path / "train.tsv", 48, seed=0)
    overrides = {"data.train_file": train, "train.num_train_steps": 6, "checkpoint.every_steps": 3}
    straight = tmp_path / "straight"
    finetuning.finetune(config(pretrained_dir, **overrides), str(straight))
    resumed = tmp_path / "resumed"
    finetuning.finetune(config(pretrained_dir, **overrides), str(resumed))
    # Back to step 3, as a job killed after its step-3 save finds it; then the same command again.
    checkpoint_lib.shutil.rmtree(resumed / "checkpoints" / "6")
    finetuning.finetune(config(pretrained_dir, **overrides), str(resumed))
    a, b = (checkpoint_lib.load_params(str(w))[1] for w in (straight, resumed))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)


def test_regression_pairs_and_sweep(pretrained_dir, tmp_path):
    rng = random.Random(0)
    rows = ["text_a,text_b,label"] + [
        f"the film,{' '.join(['good'] * k)},{k / 4:.2f}" for k in (rng.randrange(1, 5) for _ in range(64))
    ]
    (tmp_path / "sts.csv").write_text("\n".join(rows) + "\n")
    workdir = tmp_path / "sweep"
    c = config(
        pretrained_dir,
        **{
            "data.train_file": str(tmp_path / "sts.csv"),
            "data.eval_file": str(tmp_path / "sts.csv"),
            "data.regression": True,
            "train.num_epochs": 3.0,
            "model.scan_layers": True,
        },
    )  # the pre-trained body stacked for nn.scan
    c.sweep.update(learning_rate="1e-3,3e-4", seeds="0,1")
    report = finetuning.finetune(c, str(workdir))
    assert report["metric"] == "pearson" and len(report["runs"]) == 4
    assert set(report["by_learning_rate"]) == {"0.001", "0.0003"}
    assert all(report["by_learning_rate"][k]["n"] == 2 for k in report["by_learning_rate"])
    assert json.loads((workdir / "sweep.json").read_text())["best_learning_rate"] in (1e-3, 3e-4)
    assert_export_matches(workdir / "sweep" / "lr=0.001,seed=0", "BertForSequenceClassification")
    assert max(r["pearson"] for r in report["runs"]) > 0.5, report  # it learns the count of "good"


def test_token_classification_and_question_answering(pretrained_dir, tmp_path):
    rng = random.Random(0)
    sentences = []
    for _ in range(40):
        name, place = rng.choice(["john", "mary"]), rng.choice(["paris", "london"])
        sentences.append(f"{name} B-PER\nlives O\nin O\n{place} B-LOC\n. O\n")
    (tmp_path / "train.conll").write_text("-DOCSTART- O\n\n" + "\n".join(sentences))
    ner = tmp_path / "ner"
    result = finetuning.finetune(
        config(
            pretrained_dir,
            "token_classification",
            **{
                "data.train_file": str(tmp_path / "train.conll"),
                "data.eval_file": str(tmp_path / "train.conll"),
                "train.num_epochs": 6.0,
            },
        ),
        str(ner),
    )
    assert {"precision", "recall", "f1"} <= result.keys() and result["f1"] > 0.5, result
    assert_export_matches(ner, "BertForTokenClassification")
    (tmp_path / "new.txt").write_text("mary lives in london .\n")
    prediction.predict_file(str(ner), str(tmp_path / "new.txt"), str(tmp_path / "ner.jsonl"))
    (tagged,) = [json.loads(line) for line in (tmp_path / "ner.jsonl").read_text().splitlines()]
    assert tagged["words"] == ["mary", "lives", "in", "london", "."] and len(tagged["prediction"]) == 5
    assert all(e["text"] == " ".join(tagged["words"][e["start"] : e["end"]]) for e in tagged["entities"])

    contexts = []
    for i in range(24):
        name, company = rng.choice(["john", "mary"]), rng.choice(["acme", "globex"])
        context = f"{name} works at {company}."
        contexts.append(
            {
                "context": context,
                "qas": [
                    {
                        "id": f"q{i}",
                        "question": f"where does {name} work?",
                        "answers": [{"text": company, "answer_start": context.index(company)}],
                    }
                ],
            }
        )
    (tmp_path / "squad.json").write_text(json.dumps({"data": [{"title": "t", "paragraphs": contexts}]}))
    qa = tmp_path / "qa"
    result = finetuning.finetune(
        config(
            pretrained_dir,
            "question_answering",
            **{
                "data.train_file": str(tmp_path / "squad.json"),
                "data.eval_file": str(tmp_path / "squad.json"),
                "data.doc_stride": 8,
                "data.max_query_length": 8,
                "train.num_epochs": 8.0,
            },
        ),
        str(qa),
    )
    assert {"exact_match", "f1"} <= result.keys() and result["f1"] > 50, result
    answers = [json.loads(line) for line in (qa / finetuning.PREDICTIONS_FILE).read_text().splitlines()]
    assert {a["prediction"] for a in answers} & {"acme", "globex"}  # spans cut from the original context
    assert_export_matches(qa, "BertForQuestionAnswering")
    prediction.predict_file(str(qa), str(tmp_path / "squad.json"), str(tmp_path / "answers.jsonl"))
    predicted = [json.loads(line)["prediction"] for line in (tmp_path / "answers.jsonl").read_text().splitlines()]
    assert predicted == [a["prediction"] for a in answers]


def test_bad_inputs_are_one_sentence(pretrained_dir, tmp_path):
    train = sentiment(tmp_path / "train.tsv", 16, seed=0)
    (tmp_path / "dev.tsv").write_text("text\tlabel\nthe film\tneutral\n")
    with pytest.raises(ValueError, match=r"dev\.tsv.*2.*neutral"):
        finetuning.finetune(
            config(pretrained_dir, **{"data.train_file": train, "data.eval_file": str(tmp_path / "dev.tsv")}),
            str(tmp_path / "a"),
        )
    other = tmp_path / "vocab.txt"
    other.write_text("\n".join(VOCAB[:-1]) + "\n")
    with pytest.raises(ValueError, match=r"vocab.txt has 33 tokens but the model's vocab_size is 34"):
        finetuning.finetune(
            config(pretrained_dir, **{"data.train_file": train, "data.vocab_file": str(other)}), str(tmp_path / "b")
        )
    # A workdir fine-tuned on other labels is refused, not taken for damage.
    finetuning.finetune(
        config(pretrained_dir, **{"data.train_file": train, "train.num_train_steps": 1}), str(tmp_path / "d")
    )
    (tmp_path / "three.tsv").write_text(pathlib.Path(train).read_text() + "the film\tneutral\n")
    with pytest.raises(
        checkpoint_lib.IncompatibleCheckpoint,
        match=r"labels=\['neg', 'pos'\], but this run has "
        r"labels=\['neg', 'neutral', 'pos'\]; use a new --workdir",
    ):
        finetuning.finetune(
            config(pretrained_dir, **{"data.train_file": str(tmp_path / "three.tsv"), "train.num_train_steps": 1}),
            str(tmp_path / "d"),
        )
    with pytest.raises(ValueError, match="config.task='ner' is not one of"):
        finetuning.finetune(config(pretrained_dir, "ner", **{"data.train_file": train}), str(tmp_path / "c"))


def test_the_command_line(pretrained_dir, tmp_path):
    """`python -m bertjax.finetune` as users type it; a bad file is one sentence and exit status 1."""
    import subprocess
    import sys

    train = sentiment(tmp_path / "train.tsv", 32, seed=0)
    command = [
        sys.executable,
        "-m",
        "bertjax.finetune",
        "--config=configs/finetune.py:size=tiny",
        f"--workdir={tmp_path / 'run'}",
        f"--config.train.init_from={pretrained_dir}",
        f"--config.data.train_file={train}",
        f"--config.data.eval_file={train}",
        "--config.train.num_train_steps=2",
        "--config.data.max_seq_length=16",
        "--config.model.scan_layers=false",
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert eval_rows(tmp_path / "run")[-1]["step"] == 2
    assert "ETA" in done.stderr  # the log line, with its rate and ETA
    assert "eval  step 2 | accuracy " in done.stderr  # and the held-out scores
    missing = f"--config.data.train_file={tmp_path / 'missing.tsv'}"
    command[command.index(f"--config.data.train_file={train}")] = missing
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "missing.tsv" in done.stderr.splitlines()[-1], done.stderr[-2000:]
