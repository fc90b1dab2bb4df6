"""Every command on every kind of workdir: extract_features and from_pretrained read a pre-training and a
fine-tuned run alike, predict explains why a pre-training run will not do, export refuses to write into the
run it reads or to ship a vocab of another size, and a job that fails with checkpoints open ends in its
sentence alone."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from absl import flags

import bertjax
from bertjax.training import checkpoint as checkpoint_lib
from bertjax.jobs import export as exporting, finetune as finetuning, predict as prediction, main as train
from bertjax import extract_features
from bertjax.runtime import ownership, tcmalloc
from bertjax.models.bert import model as model_lib
from bertjax.data.vocab import tokenization

import train_setup
from test_finetune import config as finetune_config
from test_finetune import pretrained_dir, sentiment  # noqa: F401  (a fixture)

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pre_trained(pydocs_data, tmp_path_factory) -> pathlib.Path:
    """A pre-training workdir of one step, exported to workdir/hf at its end as the job does."""
    workdir = tmp_path_factory.mktemp("workdirs") / "pretrain"
    c = train_setup.small_config(pydocs_data, **{"train.num_train_steps": 1, "checkpoint.export_hf": True})
    c.eval.num_batches, c.optim.warmup_steps = 1, 0
    train.train_and_evaluate(c, str(workdir))
    return workdir


@pytest.fixture(scope="module")
def fine_tuned(pretrained_dir, tmp_path_factory) -> pathlib.Path:  # noqa: F811
    """A sequence_classification workdir of one step (bertjax.finetune)."""
    root = tmp_path_factory.mktemp("workdirs")
    train_file = sentiment(root / "train.tsv", 16, seed=0)
    workdir = root / "finetuned"
    finetuning.finetune(
        finetune_config(pretrained_dir, **{"data.train_file": train_file, "train.num_train_steps": 1}), str(workdir)
    )
    return workdir


def run_extract(capsys, *args: str) -> tuple[int, str]:
    fv = flags.FlagValues()
    extract_features.define_flags(fv)
    fv(["extract_features", *args])
    try:
        extract_features.main([], fv)
        code = 0
    except SystemExit as e:  # cli.run_job's one way out of a user's mistake
        code = e.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("kind", ["pre_trained", "fine_tuned"])
def test_extract_features_reads_the_encoder_of_either_kind_of_workdir(kind, request, tmp_path, capsys):
    workdir = request.getfixturevalue(kind)
    (tmp_path / "in.txt").write_text("the film was good\n")
    out = tmp_path / "out.jsonl"
    code, err = run_extract(
        capsys,
        f"--init_from={workdir}",
        f"--input_file={tmp_path / 'in.txt'}",
        f"--output_file={out}",
        "--layers=-1",
        "--max_seq_length=16",
    )
    assert code == 0, err
    row = json.loads(out.read_text())
    tokens = [f["token"] for f in row["features"]]
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
    # The values are the workdir's own encoder's last layer (a fine-tuned run's body, not a fresh one).
    fingerprint, params = checkpoint_lib.load_params(str(workdir))
    encoder = model_lib.BertModel(model_lib.BertConfig(**fingerprint["model"]))
    data = json.loads((workdir / "config.json").read_text())["data"]
    tokenizer = tokenization.load(data["vocab_file"], data.get("do_lower_case", True))
    ids = np.array([tokenizer.convert_tokens_to_ids(tokens)], np.int32)
    sequence, _ = encoder.apply({"params": params["bert"]}, ids, np.zeros_like(ids), np.ones_like(ids))
    values = np.array([[f["layers"][0]["values"] for f in row["features"]]])
    np.testing.assert_allclose(values, sequence, atol=2e-6, rtol=0)


def test_from_pretrained_takes_a_fine_tuned_workdirs_encoder(fine_tuned):
    model, params = bertjax.from_pretrained(str(fine_tuned))
    _, saved = checkpoint_lib.load_params(str(fine_tuned))
    for ours, theirs in zip(jax.tree.leaves(params["bert"]), jax.tree.leaves(saved["bert"])):
        np.testing.assert_array_equal(ours, theirs)
    out = model.apply({"params": params}, **model_lib.dummy_inputs(1, 8))  # pre-training heads, fresh
    assert out.mlm_logits.shape == (1, 8, model.config.vocab_size)


def test_predict_on_a_pre_training_workdir_says_why_and_what_to_pass(pre_trained, tmp_path):
    (tmp_path / "in.txt").write_text("the film was good\n")
    with pytest.raises(
        ValueError,
        match=r"is a pre-training run, not a fine-tuned one: it has no task head .*"
        r"bertjax.finetune --config.train.init_from=.*extract_features",
    ) as e:
        prediction.predict_file(str(pre_trained), str(tmp_path / "in.txt"), str(tmp_path / "out.jsonl"))
    assert "\n" not in str(e.value) and not (tmp_path / "out.jsonl").exists()


def test_export_refuses_the_workdir_and_anything_inside_it_but_hf(pre_trained, tmp_path):
    assert (pre_trained / "hf" / "model.safetensors").is_file()  # the job's own export at its end
    config = (pre_trained / "config.json").read_bytes()
    (tmp_path / "link").symlink_to(pre_trained)
    for output_dir, says in (
        (pre_trained, "is the run's --workdir"),
        (tmp_path / "link", "is the run's --workdir"),
        (pre_trained / "checkpoints", "is inside the run's --workdir"),
    ):
        with pytest.raises(ValueError, match=says):
            exporting.export(str(pre_trained), str(output_dir))
    assert (pre_trained / "config.json").read_bytes() == config
    assert not (pre_trained / "model.safetensors").exists()
    exporting.export(str(pre_trained), str(pre_trained / "hf"))  # re-exporting where the job exports is fine
    # Object stores: compared as normalised strings.
    for out in ("gs://b/run", "gs://b/run/", "gs://b/run/x/..", "gs://b/run/checkpoints/x"):
        with pytest.raises(ValueError, match="run's --workdir=gs://b/run/"):
            exporting.check_output_dir("gs://b/run/", out)
    for out in ("gs://b/run/hf", "gs://b/run-hf", "gs://b/other"):
        exporting.check_output_dir("gs://b/run/", out)


def test_export_command_refuses_the_workdir_in_one_line(pre_trained):
    env = dict(os.environ, **{tcmalloc.DISABLE: "1"})
    done = subprocess.run(
        [sys.executable, "-m", "bertjax.export", f"--workdir={pre_trained}", f"--output_dir={pre_trained}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.startswith("export: error: --output_dir=") and done.stderr.count("\n") == 1, done.stderr


def test_export_refuses_a_vocab_of_another_size(pre_trained, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(pre_trained, run, ignore=shutil.ignore_patterns("hf"))
    saved = json.loads((run / "config.json").read_text())
    words = pathlib.Path(saved["data"]["vocab_file"]).read_text().splitlines()
    short = tmp_path / "vocab.txt"
    short.write_text("\n".join(words[:-1]) + "\n")  # one token short: transformers would shift ids
    saved["data"]["vocab_file"] = str(short)
    (run / "config.json").write_text(json.dumps(saved))
    size = train_setup.VOCAB
    with pytest.raises(
        ValueError,
        match=rf"the vocab {short} has {size - 1} tokens but the model in {run} has "
        rf"vocab_size={size}.*put back the vocab",
    ):
        exporting.export(str(run), str(tmp_path / "hf"))
    assert not (tmp_path / "hf").exists()


# Orbax removes old *-tmp directories in a thread it starts with the CheckpointManager; slowed here so that
# it is still running when the job fails (on a fast disk it usually is, on a slow one always).
SLOW_TMP_CLEANUP = """
import asyncio, runpy, sys
from orbax.checkpoint._src.path import async_path
iterdir = async_path.iterdir
async def slow_iterdir(path):
    await asyncio.sleep(2)
    return await iterdir(path)
async_path.iterdir = slow_iterdir
runpy.run_module("bertjax.main", run_name="__main__", alter_sys=True)
"""


def test_a_job_that_fails_with_checkpoints_open_ends_in_its_sentence_alone(pydocs_data, tmp_path):
    c = train_setup.small_config(pydocs_data)
    c.mesh.shape = (3, 1, 1)  # the tests' 8 devices: refused after the Checkpointer is created
    config_file = train_setup.write_config(c, tmp_path / "config.py")
    env = dict(
        os.environ,
        **{tcmalloc.DISABLE: "1"},  # re-executing would drop the slowed cleanup
        XLA_FLAGS=train_setup.job_xla_flags(8),
    )
    done = subprocess.run(
        [sys.executable, "-c", SLOW_TMP_CLEANUP, f"--config={config_file}", f"--workdir={tmp_path / 'run'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    assert "config.mesh.shape=(3, 1, 1) needs 3 devices but 8 are available" in done.stderr.splitlines()[-1]
    assert "Traceback" not in done.stderr and "cannot schedule new futures" not in done.stderr, done.stderr[-3000:]


# --- What is not bertjax's is never written to (bertjax.runtime.ownership) ---------------------------------------


def snapshot(directory: pathlib.Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() if p.is_file() else b"<dir>" for p in sorted(directory.rglob("*"))
    }


def test_export_refuses_a_directory_of_another_models_files_and_writes_nothing(pre_trained, tmp_path):
    out = tmp_path / "modernbert-export"
    out.mkdir()
    (out / "config.json").write_text('{"model_type": "modernbert"}')
    (out / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')  # AutoTokenizer prefers it to a vocab.txt
    (out / "model.safetensors").write_bytes(b"weights")
    before = snapshot(out)
    with pytest.raises(
        FileExistsError,
        match=rf"--output_dir={out} already holds config.json, model.safetensors, "
        r"tokenizer.json, which bertjax did not write.*nothing was written",
    ):
        exporting.export(str(pre_trained), str(out))
    assert snapshot(out) == before
    for fresh in (tmp_path / "new", tmp_path / "empty"):  # a new or an empty directory is written
        if fresh.name == "empty":
            fresh.mkdir()
        exporting.export(str(pre_trained), str(fresh))
        assert (fresh / "model.safetensors").is_file()


def test_re_export_replaces_what_the_earlier_export_wrote_and_keeps_the_users_files(pre_trained, tmp_path):
    from tokenizers import Tokenizer, models
    from transformers import AutoTokenizer

    out = tmp_path / "hf"
    exporting.export(str(pre_trained), str(out))
    marker = json.loads((out / ownership.MARKER).read_text())
    assert {"config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"} <= set(marker["files"])
    # An earlier export of a byte-level BPE run left a tokenizer.json (its marker lists it); the user added a card.
    words = (out / "vocab.txt").read_text().splitlines()
    stale = {w: i for i, w in enumerate(reversed(words))}  # another vocab: every id another token
    Tokenizer(models.WordLevel(stale, unk_token="[UNK]")).save(str(out / "tokenizer.json"))
    assert AutoTokenizer.from_pretrained(str(out)).convert_ids_to_tokens([5, 6]) != words[5:7]  # what it would do
    marker["files"].append("tokenizer.json")
    (out / ownership.MARKER).write_text(json.dumps(marker))
    (out / "README.md").write_text("my model card")
    exporting.export(str(pre_trained), str(out))
    assert not (out / "tokenizer.json").exists() and (out / "README.md").read_text() == "my model card"
    assert AutoTokenizer.from_pretrained(str(out)).convert_ids_to_tokens([5, 6]) == words[5:7]
    assert "README.md" not in json.loads((out / ownership.MARKER).read_text())["files"]


def test_a_workdir_of_another_tools_files_is_refused_before_the_data_stage(tmp_path):
    trainer_output = tmp_path / "hf-trainer-run"
    (trainer_output / "checkpoint-500").mkdir(parents=True)
    (trainer_output / "checkpoint-500" / "optimizer.pt").write_bytes(b"state")
    for name, text in (
        ("config.json", '{"model_type": "bert"}'),
        ("metrics.jsonl", '{"loss": 1.0}\n'),
        ("trainer_state.json", "{}"),
    ):
        (trainer_output / name).write_text(text)
    before = snapshot(trainer_output)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("A sentence about parsers.\nAnother one about files.\n\n" * 50)
    c = train_setup.small_config(**{"data.corpus": str(corpus)})
    with pytest.raises(
        FileExistsError,
        match=rf"--workdir={trainer_output} holds checkpoint-500/, config.json, "
        r"metrics.jsonl, which bertjax did not write.*nothing was changed",
    ):
        train.train_and_evaluate(c, str(trainer_output))
    assert snapshot(trainer_output) == before  # no data/, no events file, no metrics appended


def test_a_workdir_is_claimed_when_new_empty_or_holding_other_names_and_earlier_runs_are_adopted(
    pre_trained, fine_tuned, tmp_path
):
    for name in ("new", "empty", "with_log"):
        d = tmp_path / name
        if name != "new":
            d.mkdir()
        if name == "with_log":
            (d / "train.log").write_text("the user's redirected log")
        ownership.claim_workdir(str(d))
        assert ownership.read_marker(str(d))["kind"] == "workdir"
    # Runs of an earlier bertjax carry no marker: their own files say whose they are.
    for run in (pre_trained, fine_tuned):
        old = tmp_path / "old" / run.name
        shutil.copytree(run, old)
        (old / ownership.MARKER).unlink()
        ownership.claim_workdir(str(old.parent))  # a directory of runs (a sweep, the demo)
        ownership.claim_workdir(str(old))
    # What the jobs write at the top of a workdir is what the check knows as theirs.
    for run in (pre_trained, fine_tuned):
        files = {p.name for p in run.iterdir() if p.is_file()} - {ownership.MARKER}
        unknown = {n for n in files if n not in ownership.WORKDIR_FILES and not n.startswith(ownership.EVENTS_PREFIX)}
        assert not unknown and files, (run, files)
