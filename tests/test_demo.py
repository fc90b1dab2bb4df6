"""`make demo`'s job and the export CLI, run as a user runs them: `python -m bertjax.main` in a subprocess
on configs/demo.py (shortened), then `python -m bertjax.export` on its workdir."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

import train_setup


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=train_setup.job_xla_flags(1),
    )
    proc = subprocess.run(
        [sys.executable, "-m", *args], cwd=train_setup.ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    if check:
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return proc


DEMO_FLAGS = (
    "--config=configs/demo.py:quick",
    "--config.train.num_train_steps=30",
    "--config.train.log_every_steps=10",
    "--config.eval.every_steps=20",
    "--config.checkpoint.every_steps=20",
    "--config.data.dupe_factor=1",
)
# What a run's metrics.jsonl holds that comes from the data and the computation, not from the clock.
COMPUTED = (
    "loss",
    "mlm_loss",
    "nsp_loss",
    "mlm_accuracy",
    "nsp_accuracy",
    "grad_norm",
    "learning_rate",
    "real_tokens_per_row",
    "padding_fraction",
    "mlm_accuracy_baseline",
    "nsp_accuracy_baseline",
)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("demo") / "work"
    proc = run("bertjax.main", f"--workdir={workdir}", *DEMO_FLAGS)
    return workdir, proc


def _computed(workdir) -> list[dict]:
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [{k: r[k] for k in ("step", "kind", *COMPUTED) if k in r} for r in rows]


def test_the_same_command_gives_the_same_vocab_records_losses_and_weights(demo, tmp_path):
    """Same command, same bits: the demo's quick job again, in another process and another workdir: the
    corpus stage's WordPiece vocab, every record shard, every logged loss and the exported weights are
    bitwise equal."""
    first, _ = demo
    second = tmp_path / "again"
    again = run("bertjax.main", f"--workdir={second}", *DEMO_FLAGS)
    # The same step, so the second process loads it from the compilation cache the first one filled (the suite's
    # JAX_COMPILATION_CACHE_DIR, which a user's setting of it replaces as this does: runtime/compile_cache.py).
    assert "compile: train step loaded from the compilation cache in" in again.stderr, again.stderr[-3000:]
    vocab = ("data", "vocab", "vocab.txt")
    assert first.joinpath(*vocab).read_bytes() == second.joinpath(*vocab).read_bytes()
    shards = sorted(p.relative_to(first) for p in (first / "data").rglob("*.tfrecord"))
    assert len(shards) == 5 and shards == sorted(p.relative_to(second) for p in (second / "data").rglob("*.tfrecord"))
    for shard in shards:
        assert (first / shard).read_bytes() == (second / shard).read_bytes(), shard
    rows = _computed(first)
    assert len(rows) == 5 and all("loss" in r for r in rows if r["kind"] == "train")
    assert rows == _computed(second)  # floats from JSON: equal means bitwise equal
    a, b = load_file(first / "hf" / "model.safetensors"), load_file(second / "hf" / "model.safetensors")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_demo_job_prepares_trains_evaluates_exports_and_predicts(demo):
    workdir, proc = demo
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == [10, 20, 30]
    evals = [r for r in rows if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [20, 30]
    for r in evals:  # the baselines the demo's targets are measured against sit beside the accuracies
        assert 0 < r["mlm_accuracy_baseline"] < 0.5 and 0.5 <= r["nsp_accuracy_baseline"] < 1
        assert 0 <= r["mlm_accuracy"] <= 1 and 0 <= r["nsp_accuracy"] <= 1
    stage = json.loads((workdir / "data" / "stage.json").read_text())
    assert stage["vocab_size"] == 4096 and stage["heldout_documents"] > 0 and stage["train_documents"] > 400
    assert "Top-5 predictions" in proc.stdout and proc.stdout.count("truth") >= 4
    assert sorted(os.listdir(workdir / "hf")) == [
        ".bertjax.json",
        "config.json",
        "model.safetensors",
        "tokenizer_config.json",
        "vocab.txt",
    ]
    import transformers

    model = transformers.BertForPreTraining.from_pretrained(str(workdir / "hf"))
    assert model.config.vocab_size == 4096 and model.config.max_position_embeddings == 64
    assert transformers.BertTokenizer.from_pretrained(str(workdir / "hf")).mask_token == "[MASK]"


def test_export_cli_writes_the_checkpoint_and_names_a_bad_workdir(demo, tmp_path):
    workdir, _ = demo
    proc = run("bertjax.export", f"--workdir={workdir}", f"--output_dir={tmp_path / 'at20'}", "--step=20")
    assert "exported" in proc.stdout
    at20, final = load_file(tmp_path / "at20" / "model.safetensors"), load_file(workdir / "hf" / "model.safetensors")
    assert at20.keys() == final.keys()
    assert any(not np.array_equal(at20[k], final[k]) for k in final)  # step 20, not the final step 30
    run("bertjax.export", f"--workdir={workdir}", f"--output_dir={tmp_path / 'at30'}", "--step=30")
    latest = load_file(tmp_path / "at30" / "model.safetensors")
    assert all(np.array_equal(latest[k], final[k]) for k in final)
    bad = run("bertjax.export", f"--workdir={tmp_path / 'nothing'}", f"--output_dir={tmp_path / 'x'}", check=False)
    assert bad.returncode != 0 and "has no checkpoint" in bad.stderr and "Traceback" not in bad.stderr


def test_demo_finetune_builds_the_task_from_held_out_modules_and_fine_tunes_both_initialisations(demo, tmp_path):
    """make demo's last stage (configs/demo_finetune.py:quick, a few steps each) on the job's workdir; the margin
    of pre-trained over random is a measured figure (README), not asserted here."""
    import csv
    import io

    from bertjax.finetuning import pydocs_task

    pretrained, _ = demo
    out = tmp_path / "finetune"
    proc = run(
        "bertjax.demo_finetune",
        "--config=configs/demo_finetune.py:quick",
        f"--pretrained={pretrained}",
        f"--workdir={out}",
    )
    task = json.loads((out / "task" / "task.json").read_text())
    splits = {}
    for name in ("train", "dev"):
        text = (out / "task" / f"{name}.tsv").read_text(encoding="utf-8")
        rows = list(csv.reader(io.StringIO(text, newline=""), delimiter="\t", quoting=csv.QUOTE_NONE))
        assert rows[0] == ["text", "label"] and all(len(r) == 2 and r[0] and r[1] for r in rows[1:])
        splits[name] = [r[1] for r in rows[1:]]
    labels = task["label_names"]
    assert len(labels) >= 5 and sorted(set(splits["train"])) == sorted(set(splits["dev"])) == labels
    for label in labels:  # the log's and task.json's counts are the files'
        assert task["labels"][label]["train"] == splits["train"].count(label) > 0
        assert task["labels"][label]["dev"] == splits["dev"].count(label) > 0
    assert task["train_examples"] == len(splits["train"]) and task["dev_examples"] == len(splits["dev"])
    # Dev passages come only from modules the pre-training job held out (its own heldout.txt), train from others.
    assert task["dev_modules"] and not set(task["dev_modules"]) & set(task["train_modules"])
    heldout = (pretrained / "data" / "heldout.txt").read_text(encoding="utf-8").split("\n\n")
    documents = dict(pydocs_task.module_documents())
    assert all("\n".join(documents[m]) in heldout for m in task["dev_modules"])
    assert not any("\n".join(documents[m]) in heldout for m in task["train_modules"])
    assert {pydocs_task.package_of(m) for m in task["dev_modules"] + task["train_modules"]} == set(labels)
    # Both initialisations fine-tune with the same settings and the same architecture, and score dev.
    configs = {init: json.loads((out / init / "config.json").read_text()) for init in ("pretrained", "random")}
    assert configs["pretrained"]["train"]["init_from"] == str(pretrained)
    assert configs["random"]["train"]["init_from"] == ""
    assert configs["pretrained"]["model"] == configs["random"]["model"]
    assert configs["pretrained"]["optim"] == configs["random"]["optim"]
    for init in ("pretrained", "random"):
        rows = [json.loads(line) for line in (out / init / "metrics.jsonl").read_text().splitlines()]
        evals = [r for r in rows if r["kind"] == "eval"]
        assert [r["step"] for r in evals] == [6] and 0 <= evals[0]["accuracy"] <= 1 and "macro_f1" in evals[0]
    scores = json.loads((out / "scores.json").read_text())
    assert [r["init"] for r in scores["runs"]] == ["pretrained", "random"]
    assert "majority-class baseline" in proc.stderr and "pretrained" in proc.stdout and "random" in proc.stdout


def test_demo_finetune_names_a_workdir_that_is_not_a_pydocs_pre_training_run(tmp_path):
    from bertjax.jobs import demo_finetune as demo

    with pytest.raises(FileNotFoundError, match="config.json does not exist"):
        demo.pretraining_settings(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"data": {"corpus": "my/*.txt"}}))
    with pytest.raises(ValueError, match="builtin:pydocs"):
        demo.pretraining_settings(str(tmp_path))


def test_pydocs_passages_fit_max_words_and_are_tsv_safe():
    from bertjax.finetuning import pydocs_task

    doc = ["One two three.", "Four\tfive six seven.", "A sentence of many words " + "word " * 30 + "end.", "Last."]
    out = pydocs_task.passages(doc, max_words=8)
    assert out[0] == "One two three. Four five six seven." and out[-1] == "Last." and len(out) == 3
    assert all("\t" not in p and "\n" not in p for p in out)
    assert pydocs_task.package_of("email/mime/text.py") == "email" and pydocs_task.package_of("os.py") is None
