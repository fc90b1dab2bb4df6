"""A workdir can move: a corpus-stage workdir copied elsewhere (the original deleted) resumes exactly; record
files moved to another directory with the same names resume exactly; a record file removed, added or changed
since the checkpoint is named in one sentence; a pipeline state saved with absolute paths (before names)
still restores."""

import json
import os
import shutil

import jax
import numpy as np
import pytest

import train_setup
from bertjax.training import checkpoint as checkpoint_lib
from bertjax.training import loop
from bertjax.jobs import main as train
from bertjax.data.pretraining import record_sets
from bertjax.data.pretraining.pipeline import InputPipeline, PipelineMismatch
from test_pipeline import config, take, write_shards

N = 4  # steps before the move; the job ends at 2N


def corpus_config():
    c = train_setup.small_config(**{"train.num_train_steps": 2 * N, "checkpoint.every_steps": 2})
    c.data.update(
        corpus="builtin:pydocs", corpus_vocab_size=train_setup.VOCAB, dupe_factor=1, num_shards=4, num_workers=1
    )
    c.mesh.shape = (4, 2, 1)
    return c


def train_rows(workdir) -> dict[int, float]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f) if r["kind"] == "train"}


def test_a_copied_corpus_workdir_resumes_exactly_where_it_stopped(tmp_path, monkeypatch):
    first, moved, straight = tmp_path / "first", tmp_path / "elsewhere" / "moved", tmp_path / "straight"
    with monkeypatch.context() as m:  # as a SIGTERM after step N: save, stop (the schedule still spans 2N)
        m.setattr(loop.StopRequest, "reached", lambda self, step, checkpoints: step == N)
        train.train_and_evaluate(corpus_config(), str(first))
    assert max(train_rows(first)) == N
    shutil.copytree(first / "data", straight / "data")  # the same prepared data, for the uninterrupted run
    train.train_and_evaluate(corpus_config(), str(straight))
    shutil.copytree(first, moved)
    shutil.rmtree(first)  # nothing may still point at the old place
    train.train_and_evaluate(corpus_config(), str(moved))
    want, got = train_rows(straight), train_rows(moved)
    assert sorted(got) == list(range(1, 2 * N + 1))  # steps 1..N from before the move, N+1..2N after it
    assert [got[s] for s in range(N + 1, 2 * N + 1)] == [want[s] for s in range(N + 1, 2 * N + 1)]
    for a, b in zip(
        jax.tree.leaves(checkpoint_lib.load_params(str(straight))[1]),
        jax.tree.leaves(checkpoint_lib.load_params(str(moved))[1]),
    ):
        np.testing.assert_array_equal(a, b)
    vocab = json.loads((moved / "config.json").read_text())["data"]["vocab_file"]
    assert vocab.startswith(str(moved)) and os.path.isfile(vocab)  # the stage's vocab, found at the new place


@pytest.fixture
def saved(tmp_path):
    """Four shards in records/, a pipeline 7 batches in with its state saved, and the batches that follow."""
    files, _ = write_shards(_mkdir(tmp_path / "records"), [50, 40, 60, 30])
    straight = take(InputPipeline(config(files)), 20)
    pipe = InputPipeline(config(files))
    take(pipe, 7)
    pipe.save_state(str(tmp_path / "state"))
    return tmp_path, straight[7:]


def _mkdir(path):
    path.mkdir(parents=True)
    return path


def test_records_moved_with_the_same_names_resume_exactly(saved):
    tmp, want = saved
    shutil.move(tmp / "records", tmp / "other" / "place")  # parents made by move
    pipe = InputPipeline(config(str(tmp / "other" / "place" / "shard-*.tfrecord")))
    pipe.restore_state(str(tmp / "state"))
    for w, g in zip(want, take(pipe, len(want))):
        for k in w:
            np.testing.assert_array_equal(g[k], w[k], err_msg=k)
    assert "/records/" not in (tmp / "state.pipeline.json").read_text()  # names, not paths


@pytest.mark.parametrize(
    "change, sentence",
    [
        ("remove", r"record file shard-003\.tfrecord was removed since the checkpoint \(4 file\(s\) then, 3 now\)"),
        ("add", r"record file shard-004\.tfrecord was added since the checkpoint \(4 file\(s\) then, 5 now\)"),
        ("rewrite", r"record file shard-001\.tfrecord changed since the checkpoint \([\d,]+ bytes then, [\d,]+ now\)"),
    ],
)
def test_a_changed_record_file_is_named(saved, change, sentence):
    tmp, _ = saved
    records = tmp / "records"
    if change == "remove":
        (records / "shard-003.tfrecord").unlink()
    elif change == "add":
        shutil.copy(records / "shard-000.tfrecord", records / "shard-004.tfrecord")
    else:  # same name, other rows
        shutil.copy(records / "shard-003.tfrecord", records / "shard-001.tfrecord")
    pipe = InputPipeline(config(str(records / "shard-*.tfrecord")))
    with pytest.raises(
        PipelineMismatch,
        match=r"state\.pipeline\.json: "
        + sentence
        + "; restore with the files it was saved with or start a new workdir\\.$",
    ):
        pipe.restore_state(str(tmp / "state"))


def test_a_state_saved_with_absolute_paths_still_restores_in_place(tmp_path):
    """What bertjax wrote before names: tf.data's own reader and the paths in the fingerprint."""
    files, _ = write_shards(_mkdir(tmp_path / "records"), [50, 40, 60, 30])
    want = take(InputPipeline(config(files)), 20)[7:]
    old = InputPipeline(config(files))
    old.streams[0].legacy = True
    old.dataset = old._build()
    old._iterator = iter(old.dataset)
    take(old, 7)
    old.save_state(str(tmp_path / "state"))
    assert json.loads((tmp_path / "state.pipeline.json").read_text())["files"][0] == old.files[0]
    pipe = InputPipeline(config(files))
    pipe.restore_state(str(tmp_path / "state"))
    for w, g in zip(want, take(pipe, len(want))):
        np.testing.assert_array_equal(g["input_ids"], w["input_ids"])
    shutil.move(tmp_path / "records", tmp_path / "moved")  # its iterator state holds the old paths
    with pytest.raises(
        PipelineMismatch,
        match=r"saved before record files were named relative to their "
        r"directory, so it resumes only with them at .*/records; restore with the files",
    ):
        InputPipeline(config(str(tmp_path / "moved" / "shard-*.tfrecord"))).restore_state(str(tmp_path / "state"))


def test_files_difference_compares_names_and_sizes():
    diff, common = record_sets.files_difference, record_sets.common_dir
    assert common(["/a/b/x", "/a/b/y"]) == "/a/b" and common(["/a/b/x", "/a/c/y"]) == "/a"
    assert common(["gs://bkt/d/x", "gs://bkt/d/e/y"]) == "gs://bkt/d" and common(["x", "y"]) == ""
    same = [["x", 10], ["y", 20]]
    assert diff(same, [["x", 10], ["y", 20]]) is None
    assert "y was removed" in diff(same, [["x", 10]])
    assert "z was added" in diff(same, same + [["z", 1]])
    assert "y changed since the checkpoint (20 bytes then, 21 now)" in diff(same, [["x", 10], ["y", 21]])
    assert "another order" in diff(same, same[::-1])
    assert diff(["/old/x", "/old/y"], ["/old/x", "/old/y"]) is None  # absolute paths, unchanged
    assert "resumes only with them at /old" in diff(["/old/x", "/old/y"], ["/new/x", "/new/y"])
    assert "y was removed" in diff(["/old/x", "/old/y"], ["/old/x"])  # by base name
