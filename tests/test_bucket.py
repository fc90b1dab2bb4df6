"""Object-store paths (gs://) against a real GCS API server on localhost (tests/gcs_emulator.py): bertjax's one
file layer (data/files.py) reads, lists, moves and removes there, and orbax keeps a checkpoint there, through
the clients' standard settings alone. The rest of issue 48 (a whole run in a bucket) builds on these."""

from __future__ import annotations

import numpy as np
import pytest

from bertjax.data import files
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
