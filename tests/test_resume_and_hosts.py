"""The job as users run it, in subprocesses: exact resume after SIGTERM and after `kill -9`, two
processes (jax.distributed, gloo CPU collectives on 127.0.0.1) against one, and records written the
way google-research/bert's create_pretraining_data.py writes them."""

import collections
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import train_setup
from bertjax.runtime import files
from bertjax.training import checkpoint as checkpoint_lib
from gcs_emulator import gcs_bucket  # noqa: F401  (the fixture)
from bertjax.jobs import main as train

STEPS = 20


def job_config(pydocs_data: str, **overrides):
    c = train_setup.small_config(
        pydocs_data,
        **{"train.num_train_steps": STEPS, "checkpoint.every_steps": 2, "checkpoint.keep": 3, "eval.num_batches": 1},
    )
    c.train.log_every_steps = 3  # saves between log lines: a resumed run must log the uninterrupted run's rows
    c.mesh.shape = (4, 2, 1)
    c.eval.every_steps = 1000
    for key, value in overrides.items():
        section, name = key.split(".")
        c[section][name] = value
    return c


def start(config_file: str, workdir, devices: int = 8, args: tuple = (), cache=None) -> subprocess.Popen:
    """The job as a subprocess; `cache`: its own $BERTJAX_CACHE_DIR (another host's disk)."""
    env = dict(
        os.environ,
        XLA_FLAGS=train_setup.job_xla_flags(devices),
        JAX_PLATFORMS="cpu",
        **({"BERTJAX_CACHE_DIR": str(cache)} if cache else {}),
    )
    env.pop("TF_ENABLE_ONEDNN_OPTS", None)  # as a user's shell has it: the command quiets TensorFlow itself
    return subprocess.Popen(
        [sys.executable, "-m", "bertjax.main", f"--config={config_file}", f"--workdir={workdir}", *args],
        env=env,
        cwd=train_setup.ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:  # a hung job is killed, not left to the rest of the suite
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"still running after {timeout:.0f} s: {out[-3000:]}") from None
    assert proc.returncode == 0, out[-3000:]
    return out


def train_rows(workdir) -> list[dict]:
    path = os.path.join(workdir, "metrics.jsonl")  # a local path or a gs:// URL
    if not files.exists(path):
        return []
    return [r for r in map(json.loads, files.read_text(path).splitlines()) if r["kind"] == "train"]


def wait_for_step(proc: subprocess.Popen, workdir, step: int, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not any(r["step"] >= step for r in train_rows(workdir)):
        assert proc.poll() is None, f"the job ended before step {step}: {proc.stdout.read()[-3000:]}"
        assert time.time() < deadline, f"no step {step} within {timeout}s"
        time.sleep(0.02)


def final_params(workdir) -> list[np.ndarray]:
    import jax

    steps = [int(s) for s in files.listdir(os.path.join(workdir, checkpoint_lib.CHECKPOINTS)) if s.isdigit()]
    assert max(steps) == STEPS
    _, params = checkpoint_lib.load_params(str(workdir))
    return jax.tree.leaves(params)


@pytest.fixture(scope="module")
def uninterrupted(pydocs_data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("uninterrupted")
    config_file = train_setup.write_config(job_config(pydocs_data), tmp / "config.py")
    finish(start(config_file, tmp / "work"))
    return config_file, final_params(tmp / "work"), {r["step"]: r["loss"] for r in train_rows(tmp / "work")}


@pytest.mark.parametrize("how", ["sigterm", "kill-9"])
def test_resumed_run_ends_with_bitwise_identical_params(uninterrupted, tmp_path, how):
    config_file, expected, _ = uninterrupted
    workdir = tmp_path / "work"
    proc = start(config_file, workdir)
    wait_for_step(proc, workdir, 5)
    if how == "sigterm":  # save at the next step, exit 0
        proc.send_signal(signal.SIGTERM)
        out = finish(proc)
        assert "stopped at step" in out
    else:  # no warning at all: whatever step was running is lost
        proc.kill()
        proc.wait()
    stopped_at = max(r["step"] for r in train_rows(workdir))
    assert stopped_at < STEPS, "the job finished before the signal: nothing was resumed"
    out = finish(start(config_file, workdir))
    assert "resumed from" in out
    assert "oneDNN" not in out and "absl::InitializeLog" not in out, out[:2000]  # bertjax's own lines only
    for a, b in zip(expected, final_params(workdir)):
        np.testing.assert_array_equal(a, b)


def test_a_run_in_a_bucket_stops_on_sigterm_and_resumes_bitwise(uninterrupted, pydocs_data, gcs_bucket, tmp_path):  # noqa: F811
    """The same job with its workdir, records and vocab in a bucket (fake-gcs-server on localhost): stopped by
    SIGTERM, resumed by the same command, it ends with the local uninterrupted run's params bit for bit, and
    nothing lands on the local disk but the vocab's cached copy (the records stream through a window removed at the end)."""
    _, expected, losses = uninterrupted
    data = f"{gcs_bucket}/data-{tmp_path.name}"
    files.upload_tree(pydocs_data, data)
    c = job_config(pydocs_data)
    for key in ("train_files", "eval_files", "vocab_file"):
        c.data[key] = c.data[key].replace(pydocs_data, data)
    config_file = train_setup.write_config(c, tmp_path / "config.py")
    workdir = f"{gcs_bucket}/run-{tmp_path.name}"
    os.environ["BERTJAX_CACHE_DIR"] = str(tmp_path / "cache")  # the subprocesses' copies, under tmp_path
    try:
        proc = start(config_file, workdir)
        wait_for_step(proc, workdir, 5)
        proc.send_signal(signal.SIGTERM)
        assert "stopped at step" in finish(proc)
        assert max(r["step"] for r in train_rows(workdir)) < STEPS
        out = finish(start(config_file, workdir))
    finally:
        del os.environ["BERTJAX_CACHE_DIR"]
    assert f"resumed from {workdir}/checkpoints/" in out
    for a, b in zip(expected, final_params(workdir)):
        np.testing.assert_array_equal(a, b)
    resumed = {r["step"]: r["loss"] for r in train_rows(workdir)}  # the later line of a step logged twice wins
    # Every row's loss, before the stop and after the resume, as the local run's: the first row after the resume
    # averages the steps before the stop too (the checkpoint carries their sums), as an uninterrupted run's does.
    assert resumed == losses and len(losses) == STEPS // 3 + 1
    saved = files.read_json(f"{workdir}/config.json")["data"]
    assert saved["train_files"].startswith(data) and saved["vocab_file"] == f"{data}/vocab/vocab.txt"
    assert {"config.json", "metrics.jsonl", "checkpoints"} <= set(files.listdir(workdir))
    assert sum(n.startswith("events.out.tfevents.") for n in files.listdir(workdir)) == 2  # one a run
    assert not os.path.exists(os.path.join(train_setup.ROOT, "gs:"))  # no local "gs:/..." tree
    assert sorted(os.listdir(tmp_path / "cache" / "remote"))  # the vocab's copy
    assert not os.listdir(tmp_path / "cache" / "stream")  # the windows' folders, gone


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_train_like_one_with_the_same_global_batch(pydocs_data, tmp_path):
    # One train file, no shuffling, no dropout: two processes split its records by example (p, p+2, …), so
    # their global batch holds the same examples as the single process's, in another order.
    c = job_config(pydocs_data, **{"train.num_train_steps": 4, "data.shuffle_buffer": 1, "checkpoint.export_hf": True})
    c.train.log_every_steps = 1
    c.eval.show_predictions = 2  # process 0 shows them from params that span both processes
    c.data.train_files = os.path.join(pydocs_data, "train", "records-00000-of-00004.tfrecord")
    c.model.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    c.mesh.shape = (-1, 1, 1)
    config_file = train_setup.write_config(c, tmp_path / "config.py")
    finish(start(config_file, tmp_path / "one", devices=4))
    address = f"127.0.0.1:{free_port()}"
    procs = [
        start(
            config_file,
            tmp_path / "two",
            devices=2,
            args=(f"--coordinator_address={address}", "--num_processes=2", f"--process_id={i}"),
        )
        for i in range(2)
    ]
    # The finished job exits 0 on every process with its export written: process 0's export once waited, in
    # orbax's constructor, for processes already gone to JAX's shutdown barrier (both aborted after 5 minutes).
    outputs = [finish(p, timeout=150) for p in procs]
    assert "2 process(es), 4 device(s)" in outputs[0]
    assert "export: wrote" in outputs[0] and os.path.isfile(tmp_path / "two" / "hf" / "config.json")
    assert "predictions" in outputs[0].lower(), outputs[0][-2000:]
    # Resumed by another number of processes: refused before any work, in one sentence.
    proc = start(config_file, tmp_path / "two", devices=4, args=("--config.train.num_train_steps=6",))
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "process(es), " not in out, out[-2000:]  # before the setup line
    assert re.search(r"holds input positions for 2 process\(es\) but this run has 1; resume with 2", out), out[-2000:]
    one, two = train_rows(tmp_path / "one"), train_rows(tmp_path / "two")
    assert [r["step"] for r in two] == [1, 2, 3, 4]
    for key in ("loss", "mlm_accuracy", "nsp_accuracy", "grad_norm"):
        np.testing.assert_allclose([r[key] for r in two], [r[key] for r in one], rtol=1e-5, err_msg=key)


@pytest.fixture(scope="module")
def bucket_records(pydocs_data, gcs_bucket):  # noqa: F811
    """The pydocs train (4 shards) and held-out records, uploaded once."""
    remote = f"{gcs_bucket}/records-hosts"
    files.upload_tree(pydocs_data, remote)
    return remote


def test_four_hosts_stream_their_shares_from_a_bucket_and_all_exit_with_the_export(
    pydocs_data, bucket_records, tmp_path
):
    """Four processes with their own caches (four hosts' disks) train from a record set in a bucket: each fetches
    only its shard into a window of its own, then the finished job exits 0 on every process with its export."""
    c = job_config(
        pydocs_data, **{"train.num_train_steps": 6, "checkpoint.every_steps": 3, "checkpoint.export_hf": True}
    )
    c.data.train_files = f"{bucket_records}/train/*.tfrecord"
    c.data.eval_files = f"{bucket_records}/heldout/*.tfrecord"
    c.mesh.shape = (-1, 1, 1)
    config_file = train_setup.write_config(c, tmp_path / "config.py")
    address = f"127.0.0.1:{free_port()}"
    procs = [
        start(
            config_file,
            tmp_path / "work",
            devices=1,
            args=(f"--coordinator_address={address}", "--num_processes=4", f"--process_id={i}"),
            cache=tmp_path / f"host{i}",
        )
        for i in range(4)
    ]
    outputs = [finish(p, timeout=240) for p in procs]
    assert "export: wrote" in outputs[0] and os.path.isfile(tmp_path / "work" / "hf" / "config.json")
    shards = {os.path.basename(f): files.size(f) for f in files.glob(c.data.train_files)}
    assert len(shards) == 4
    for i, out in enumerate(outputs):
        # stream: training set gs://…/train: N MB fetched in K piece(s), at most P MB on disk (window W MB), …
        line = re.search(
            r"stream: training set \S+: ([\d,.]+) MB fetched in (\d+) piece\(s\), at most ([\d,.]+) MB", out
        )
        assert line, out[-3000:]
        fetched, pieces, peak = float(line[1].replace(",", "")), int(line[2]), float(line[3].replace(",", ""))
        assert pieces >= 1 and fetched * 1e6 <= 1.01 * pieces * max(shards.values())
        assert fetched * 1e6 < sum(shards.values()) / 2  # its share (one shard of four), never the set
        assert peak * 1e6 <= 1.01 * max(shards.values())
        assert not os.listdir(tmp_path / f"host{i}" / "stream"), "the window's folder is removed at the end"


def test_sigterm_stops_every_process_at_one_step_and_both_resume_from_a_bucket(
    pydocs_data,
    bucket_records,
    gcs_bucket,
    tmp_path,  # noqa: F811
):
    """Several processes sharing a workdir in a bucket: JAX's preemption service turns a SIGTERM into one agreed
    step at which every process saves its own input position and exits 0, with no collective in the loop to
    find out; process 0 commits the step; both resume from it, streaming their records from the bucket."""
    c = job_config(pydocs_data, **{"train.num_train_steps": 400, "checkpoint.every_steps": 1000})
    c.data.train_files = f"{bucket_records}/train/*.tfrecord"
    c.mesh.shape = (-1, 1, 1)
    config_file = train_setup.write_config(c, tmp_path / "config.py")
    workdir = f"{gcs_bucket}/two-{tmp_path.name}"

    def both(*extra: str) -> list[subprocess.Popen]:
        address = f"127.0.0.1:{free_port()}"
        return [
            start(
                config_file,
                workdir,
                devices=2,
                args=(f"--coordinator_address={address}", "--num_processes=2", f"--process_id={i}", *extra),
            )
            for i in range(2)
        ]

    procs = both()
    wait_for_step(procs[0], workdir, 3)
    procs[1].send_signal(signal.SIGTERM)  # one host is told; both must stop
    outputs = [finish(p) for p in procs]
    stopped = [int(re.search(r"stopped at step (\d+)", out).group(1)) for out in outputs]
    assert stopped[0] == stopped[1] < 400, stopped
    checkpoints = f"{workdir}/{checkpoint_lib.CHECKPOINTS}"
    assert [int(s) for s in files.listdir(checkpoints) if s.isdigit()] == [stopped[0]]
    positions = files.listdir(f"{checkpoints}/{stopped[0]}/pipeline")
    assert {"process_0.pipeline.json", "process_1.pipeline.json", "processes.json"} <= set(positions)
    outputs = [finish(p) for p in both(f"--config.train.num_train_steps={stopped[0] + 2}")]
    assert f"resumed from {checkpoints}/{stopped[0]}" in outputs[0]
    assert sorted(int(s) for s in files.listdir(checkpoints) if s.isdigit())[-1] == stopped[0] + 2
    assert [r["step"] for r in train_rows(workdir)][-1] == stopped[0] + 2


def write_like_google_research_bert(records: list[dict], path: str) -> None:
    """create_pretraining_data.py's write_instance_to_example_files, feature by feature."""

    def int_feature(values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))

    with tf.io.TFRecordWriter(path) as writer:
        for r in records:
            features = collections.OrderedDict()
            for name in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids"):
                features[name] = int_feature(r[name])
            features["masked_lm_weights"] = tf.train.Feature(
                float_list=tf.train.FloatList(value=r["masked_lm_weights"])
            )
            features["next_sentence_labels"] = int_feature(r["next_sentence_labels"])
            writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())


def test_records_written_by_google_research_bert_train_unchanged(pydocs_data, tmp_path):
    ours = os.path.join(pydocs_data, "train", "records-00000-of-00004.tfrecord")
    schema = {
        name: tf.io.VarLenFeature(tf.float32 if name == "masked_lm_weights" else tf.int64)
        for name in (
            "input_ids",
            "input_mask",
            "segment_ids",
            "masked_lm_positions",
            "masked_lm_ids",
            "masked_lm_weights",
            "next_sentence_labels",
        )
    }
    records = [
        {k: tf.sparse.to_dense(v).numpy().tolist() for k, v in tf.io.parse_single_example(raw, schema).items()}
        for raw in tf.data.TFRecordDataset(ours).take(200)
    ]
    (tmp_path / "theirs").mkdir()
    write_like_google_research_bert(records, str(tmp_path / "theirs" / "part-0.tfrecord"))
    assert not (tmp_path / "theirs" / "metadata.json").exists()  # the schema comes from the first record
    losses = {}
    for name in ("ours", "theirs"):
        c = train_setup.small_config(pydocs_data, **{"train.num_train_steps": 3, "optim.warmup_steps": 0})
        c.data.train_files = ours if name == "ours" else str(tmp_path / "theirs" / "*.tfrecord")
        c.data.update(shuffle_buffer=1, eval_files="")
        train.train_and_evaluate(c, str(tmp_path / name))
        losses[name] = [r["loss"] for r in train_rows(tmp_path / name)]
    assert len(losses["theirs"]) == 3 and np.all(np.isfinite(losses["theirs"]))
    assert losses["theirs"] == losses["ours"]
