"""Object-store paths (gs://) against a real GCS API server on localhost (tests/gcs_emulator.py): bertjax's one
file layer (data/files.py) reads, lists, moves and removes there, and orbax keeps a checkpoint there, through
the clients' standard settings alone. The rest of issue 48 (a whole run in a bucket) builds on these."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest

from bertjax.data import files
from bertjax.runtime import lock as lock_lib
from bertjax.runtime import ownership
from gcs_emulator import gcs_bucket  # noqa: F401  (the fixture)


def test_the_file_layer_reads_writes_lists_moves_and_removes_in_a_bucket(gcs_bucket):  # noqa: F811
    root = f"{gcs_bucket}/layer"
    assert files.listdir(root) == []  # nothing there yet: no directory, no error
    files.makedirs(f"{root}/staging")
    with files.open_file(f"{root}/staging/metadata.json", "w") as f:
        f.write('{"shards": 2}')
    with files.open_file(f"{root}/staging/part-0", "wb") as f:
        f.write(b"\x00\x01record")
    assert sorted(files.listdir(f"{root}/staging")) == ["metadata.json", "part-0"]
    assert files.read_json(f"{root}/staging/metadata.json") == {"shards": 2}
    files.rename(f"{root}/staging/part-0", f"{root}/part-0")  # a commit moves what a stage wrote
    with files.open_file(f"{root}/part-0", "rb") as f:
        assert f.read() == b"\x00\x01record"
    assert sorted(files.listdir(root)) == ["part-0", "staging"]
    files.remove(f"{root}/part-0")
    files.rmtree(f"{root}/staging")
    files.rmtree(f"{root}/staging")  # nothing there: nothing to do
    assert files.listdir(root) == []
    with pytest.raises(FileNotFoundError):
        files.read_json(f"{root}/missing.json")


def test_orbax_keeps_and_restores_a_checkpoint_in_a_bucket(gcs_bucket):  # noqa: F811
    """What the Checkpointer builds on (a CheckpointManager over tensorstore, ocdbt on) saves, lists and restores a
    pytree in the bucket bitwise, with no bertjax option: the emulator's settings are the clients' own."""
    import orbax.checkpoint as ocp

    tree = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "step": np.array(7, np.int32)}
    manager = ocp.CheckpointManager(
        f"{gcs_bucket}/run/checkpoints", options=ocp.CheckpointManagerOptions(max_to_keep=2)
    )
    try:
        manager.save(7, args=ocp.args.StandardSave(tree))
        manager.wait_until_finished()
        assert manager.all_steps() == [7]
        restored = manager.restore(7, args=ocp.args.StandardRestore(tree))
    finally:
        manager.close()
    assert restored["w"].tobytes() == tree["w"].tobytes() and int(restored["step"]) == 7
    assert "7" in files.listdir(f"{gcs_bucket}/run/checkpoints")


# --- One job per workdir, and only bertjax's workdirs, in a bucket -----------------------------------------


def test_the_workdir_lock_is_a_conditional_create_that_one_writer_wins(gcs_bucket):  # noqa: F811
    """Two hosts racing for a lock object: exactly one create succeeds, every time."""
    import concurrent.futures

    for trial in range(5):
        path = f"{gcs_bucket}/race/{trial}/job.lock"

        def take(who: int) -> bool:
            try:
                files.create_new(path, json.dumps({"who": who}))
                return True
            except FileExistsError:
                return False

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            won = list(pool.map(take, range(4)))
        assert sum(won) == 1, won
        assert files.read_json(path)["who"] == won.index(True)


def test_a_second_job_on_a_bucket_workdir_is_refused_and_a_stale_lock_taken_over(gcs_bucket, caplog):  # noqa: F811
    workdir = f"{gcs_bucket}/locked"
    with lock_lib.WorkdirLock(workdir):
        with pytest.raises(ValueError, match=r"in use by another job \(pid \d+ on ") as error:
            lock_lib.WorkdirLock(workdir).acquire()
        assert "\n" not in str(error.value)
    assert not files.exists(f"{workdir}/{lock_lib.LOCK_FILE}")  # released at the end
    path = f"{workdir}/{lock_lib.LOCK_FILE}"
    for minutes_ago, refused in ((1, True), (lock_lib.STALE_AFTER_S / 60 + 1, False)):
        files.write_whole(
            path, json.dumps({"host": "tpu-vm-7", "pid": 4242, "refreshed": time.time() - 60 * minutes_ago})
        )
        held = lock_lib.WorkdirLock(workdir)
        if refused:  # a live job on another host
            with pytest.raises(ValueError, match="in use by another job .pid 4242 on tpu-vm-7"):
                held.acquire()
        else:  # a preempted host's lock, not refreshed for longer than STALE_AFTER_S
            with caplog.at_level("WARNING", logger="bertjax"), held:
                assert files.read_json(path)["pid"] == os.getpid()
            assert any("has not refreshed it for" in r.getMessage() for r in caplog.records)
            assert not files.exists(path)


def test_a_bucket_directory_bertjax_did_not_write_is_refused_and_its_own_is_reused(gcs_bucket):  # noqa: F811
    foreign = f"{gcs_bucket}/someone-elses"
    files.write_whole(f"{foreign}/checkpoints/checkpoint_100.pt", b"torch")
    with pytest.raises(FileExistsError, match=r"holds checkpoints/, which bertjax did not write"):
        ownership.claim_workdir(foreign)
    assert files.listdir(foreign) == ["checkpoints"]  # nothing written there
    ours = f"{gcs_bucket}/ours"
    ownership.claim_workdir(ours)
    assert ownership.read_marker(ours)["kind"] == "workdir"
    files.write_whole(f"{ours}/metrics.jsonl", "{}\n")
    ownership.claim_workdir(ours)  # a marked workdir: a resume
    with pytest.raises(FileExistsError, match=r"--output_dir=.*/someone-elses already holds checkpoints"):
        ownership.check_export_dir(foreign)


def test_a_missing_bucket_is_one_sentence_before_anything_is_written(gcs_bucket, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)  # where a relative "gs:/..." tree would appear if a local call took the path
    with pytest.raises(FileNotFoundError) as error:
        ownership.claim_workdir("gs://no-such-bucket-here/run")
    assert str(error.value) == (
        "--workdir=gs://no-such-bucket-here/run: the bucket gs://no-such-bucket-here does not exist (or this "
        "project cannot see it); create it (gcloud storage buckets create gs://no-such-bucket-here) or correct "
        "the name."
    )
    with pytest.raises(FileNotFoundError, match=r"^--output_dir=gs://no-such-bucket-here/hf: the bucket"):
        ownership.check_export_dir("gs://no-such-bucket-here/hf")
    assert list(tmp_path.iterdir()) == []
