"""A record set in a bucket streams through each process's bounded window (data/stream_window.py): the same
batches as the local set, only the process's share fetched, its saved position restored exactly, fewer files
than processes split by byte ranges with every record read once, and a shard deleted mid-run named in one
sentence. Against fake-gcs-server on localhost; several processes are several pipelines with their own caches."""

import glob
import itertools
import os

import numpy as np
import pytest
import tensorflow as tf

from bertjax.data import stream_window

from bertjax.runtime import bucket_outage, files
from bertjax.data.pretraining import pipeline as pipeline_lib
from gcs_emulator import gcs_bucket  # noqa: F401  (the fixture)

import train_setup  # noqa: E402
from train_setup import PRED, SEQ  # noqa: E402  # train_setup.small_config's records


@pytest.fixture(scope="module")
def bucket_set(pydocs_data, gcs_bucket, tmp_path_factory):  # noqa: F811
    """Six small shards of pydocs records (30 each, so that a test runs several epochs; no metadata.json, as
    google-research/bert writes them), on disk and uploaded once."""
    local = str(tmp_path_factory.mktemp("small_set"))
    source = sorted(glob.glob(os.path.join(pydocs_data, "train", "*.tfrecord")))[0]
    records = [r.numpy() for r in tf.data.TFRecordDataset(source).take(180)]
    for i in range(6):
        with tf.io.TFRecordWriter(os.path.join(local, f"part-{i}.tfrecord")) as w:
            for r in records[i * 30 : (i + 1) * 30]:
                w.write(r)
    remote = f"{gcs_bucket}/streaming/train"
    files.upload_tree(local, remote)
    return f"{local}/*.tfrecord", f"{remote}/*.tfrecord"


def make(patterns, cache, monkeypatch, **kw):
    monkeypatch.setenv("BERTJAX_CACHE_DIR", str(cache))
    config = dict(
        files=patterns,
        batch_size=8,
        max_seq_length=SEQ,
        max_predictions_per_seq=PRED,
        seed=3,
        shuffle_buffer=64,
        cycle_length=2,
        threads=1,
    )
    config.update(kw)
    return pipeline_lib.InputPipeline(pipeline_lib.PipelineConfig(**config))


def take(p, n):
    return [next(p) for _ in range(n)]


def same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def window_bytes(cache) -> int:
    """Bytes in the stream's window now (its own thread evicts while this runs: a CI run once met a file listed and
    gone, which train_setup.folder_bytes counts as 0)."""
    return train_setup.folder_bytes(f"{cache}/stream")


@pytest.mark.parametrize("process", [0, 1])
def test_a_bucket_set_streams_the_local_sets_batches_holding_only_its_window(
    bucket_set, tmp_path, monkeypatch, process
):
    local, remote = bucket_set
    shards = sorted(glob.glob(local))
    largest = max(map(os.path.getsize, shards))
    kw = dict(process_index=process, process_count=2)
    expected = take(make(local, tmp_path / "a", monkeypatch, **kw), 40)  # 3.5 epochs of this process's 3 shards
    streamed = make(remote, tmp_path / "b", monkeypatch, stream_window_bytes=largest, **kw)
    got, peak = [], 0
    for _ in range(40):
        got.append(next(streamed))
        peak = max(peak, window_bytes(tmp_path / "b"))
    same(got, expected)
    window = streamed.streams[0].window
    mine = [f for f in shards if os.path.basename(f) in {os.path.basename(u) for u in streamed.files}]
    assert len(mine) == 3 and peak <= 3 * largest  # a window of one shard; the reader's own two may exceed it
    stats = window.stats()
    assert stats["fetched_bytes"] >= sum(map(os.path.getsize, mine))  # its own shards, refetched each epoch
    assert stats["fetched_pieces"] >= 9 and stats["peak_bytes"] <= 3 * largest
    window.close()
    assert not os.path.exists(window.folder)


def test_a_saved_position_resumes_the_same_batches_fetching_its_open_pieces_first(bucket_set, tmp_path, monkeypatch):
    _, remote = bucket_set
    kw = dict(process_index=0, process_count=2, dynamic_masking=False)
    whole = take(make(remote, tmp_path / "a", monkeypatch, **kw), 30)
    first = make(remote, tmp_path / "b", monkeypatch, **kw)
    take(first, 13)
    first.save_state(str(tmp_path / "state" / "p0"))
    first.streams[0].window.close()  # another host, or the same after kill -9: an empty window
    again = make(remote, tmp_path / "c", monkeypatch, **kw)
    again.restore_state(str(tmp_path / "state" / "p0"))
    same(take(again, 17), whole[13:])


def test_fewer_files_than_processes_split_by_byte_ranges_reads_every_record_once(bucket_set, tmp_path, monkeypatch):
    local, remote = bucket_set
    one = sorted(glob.glob(local))[0]
    url = f"{os.path.dirname(remote)}/{os.path.basename(one)}"
    records = [r.numpy() for r in tf.data.TFRecordDataset(one)]
    assert len(records) == 30
    got, fetched = [], 0
    for p in range(3):
        piece = stream_window.Piece(url, os.path.basename(one), *files.version(url), part=p, parts=3)
        w = stream_window.ShardWindow([piece], str(tmp_path / f"w{p}"), 1 << 30, "test")
        w.set_order(lambda start: iter([piece.name] * 1))
        w.local(0, piece.name)
        got += [r.numpy() for r in tf.data.TFRecordDataset(os.path.join(w.folder, piece.name))]
        fetched += w.stats()["fetched_bytes"]
        w.close()
    assert got == records  # in order, none twice, none lost
    assert fetched == os.path.getsize(one)
    # and a pipeline of three processes over that one file reads its own range
    p1 = make(url, tmp_path / "p1", monkeypatch, process_index=1, process_count=3, batch_size=4)
    assert p1.streams[0].parts == 3 and not p1.split_by_example
    batch = next(p1)
    assert batch["input_ids"].shape == (4, SEQ)


def test_a_shard_deleted_mid_run_stops_the_run_in_one_sentence(bucket_set, gcs_bucket, tmp_path, monkeypatch):  # noqa: F811
    local, _ = bucket_set
    remote = f"{gcs_bucket}/streaming/doomed"
    files.upload_tree(os.path.dirname(local), remote)
    p = make(
        f"{remote}/*.tfrecord", tmp_path / "a", monkeypatch, process_index=0, process_count=1, stream_window_bytes=1
    )
    next(p)
    for name in files.listdir(remote):
        if name.endswith(".tfrecord"):
            files.remove(f"{remote}/{name}")
    with pytest.raises(
        stream_window.StreamError, match=r"changed in the bucket while the run read it \(it was deleted\)"
    ):
        for _ in range(200):
            next(p)


def test_a_shard_replaced_mid_run_stops_the_run_naming_the_generations(bucket_set, gcs_bucket, tmp_path, monkeypatch):  # noqa: F811
    """Another object under a shard's name (another generation, here the same size): its pinned download finds
    the listed generation gone, and the sentence says the shard was replaced."""
    local, _ = bucket_set
    remote = f"{gcs_bucket}/streaming/replaced"
    files.upload_tree(os.path.dirname(local), remote)
    p = make(
        f"{remote}/*.tfrecord", tmp_path / "a", monkeypatch, process_index=0, process_count=1, stream_window_bytes=1
    )
    next(p)
    shards = sorted(n for n in files.listdir(remote) if n.endswith(".tfrecord"))
    for i, name in enumerate(shards):  # each shard's bytes under the next one's name: same sizes, new generations
        files.upload(os.path.join(os.path.dirname(local), shards[(i + 1) % len(shards)]), f"{remote}/{name}")
    with pytest.raises(
        stream_window.StreamError, match=r"changed in the bucket while the run read it \(it was replaced \(generation"
    ):
        for _ in range(200):
            next(p)


def test_503s_429s_and_an_outage_are_ridden_out_with_the_same_batches(bucket_set, tmp_path, monkeypatch):
    """Through a proxy that answers every 4th request 503 or 429, and drops every connection for 2 s mid-epoch:
    the clients' retries and the window's carry the epoch, and the batches are the local set's."""
    import gcsfs

    from gcs_emulator import client_settings
    from gcs_faults import FaultyProxy

    local, remote = bucket_set
    expected = take(make(local, tmp_path / "a", monkeypatch), 30)
    with FaultyProxy(os.environ["STORAGE_EMULATOR_HOST"]) as proxy:
        for key, value in client_settings(proxy.url).items():
            monkeypatch.setenv(key, value)
        gcsfs.GCSFileSystem.clear_instance_cache()  # gcsfs reads the endpoint when it makes its client
        try:
            streamed = make(remote, tmp_path / "b", monkeypatch, stream_window_bytes=1)  # every piece refetched
            got = take(streamed, 5)
            proxy.fail_every(4)
            proxy.outage(2.0, until_dropped=1)
            got += take(streamed, 25)
        finally:
            gcsfs.GCSFileSystem.clear_instance_cache()
    same(got, expected)
    assert proxy.dropped > 0 and proxy.failed > 0


def test_a_failing_fetch_is_retried_and_counted_and_a_lasting_one_is_one_sentence(bucket_set, tmp_path, monkeypatch):
    """Past the client's own retries (a long outage): the window retries with backoff, counts it, and after
    the retry budget ($BERTJAX_BUCKET_RETRY_SECONDS) stops the run in one sentence that says the rerun resumes."""
    local, remote = bucket_set
    expected = take(make(local, tmp_path / "a", monkeypatch), 3)
    real, failures = files.download, iter([True, True])

    def flaky(url, target, *version):
        if next(failures, False):
            raise ConnectionError("Cannot connect to host 127.0.0.1")
        return real(url, target, *version)

    monkeypatch.setattr(stream_window.files, "download", flaky)
    streamed = make(remote, tmp_path / "b", monkeypatch)
    same(take(streamed, 3), expected)
    assert streamed.streams[0].window.stats()["retries"] == 2
    monkeypatch.setenv(bucket_outage.RETRY_SECONDS_ENV, "0")
    failures = itertools.repeat(True)  # flaky now fails every time
    with pytest.raises(
        stream_window.StreamError,
        match=r"failed for 0 seconds .*so the run stopped: rerun the same command when the bucket",
    ):
        take(make(remote, tmp_path / "c", monkeypatch), 1)


def test_a_job_whose_shard_is_deleted_stops_naming_it_and_the_step_and_the_rerun_resumes(
    bucket_set,
    pydocs_data,
    gcs_bucket,
    tmp_path,  # noqa: F811
):
    """The job (one process, 30 small shards in a bucket, a window of one byte: each shard fetched again each epoch):
    a shard deleted mid-run stops it with one sentence naming the shard and the step the rerun resumes from;
    put back, the same command resumes and finishes."""
    import json
    import re

    from test_resume_and_hosts import finish, start, wait_for_step

    local, _ = bucket_set
    records = [r.numpy() for r in tf.data.TFRecordDataset(sorted(glob.glob(local)))]
    os.makedirs(tmp_path / "set")
    for i in range(30):  # more shards than tf.data's interleave holds open (~2 × 8): read ones leave the window
        with tf.io.TFRecordWriter(str(tmp_path / "set" / f"part-{i:02d}.tfrecord")) as w:
            for r in records[i * 6 : (i + 1) * 6]:
                w.write(r)
    remote = f"{gcs_bucket}/streaming/job-{tmp_path.name}"
    files.upload_tree(str(tmp_path / "set"), remote)
    c = train_setup.small_config(pydocs_data, **{"train.num_train_steps": 40, "checkpoint.every_steps": 4})
    c.data.update(train_files=f"{remote}/*.tfrecord", stream_window_bytes=1)
    config_file = train_setup.write_config(c, tmp_path / "config.py")
    workdir = tmp_path / "work"
    proc = start(config_file, workdir, devices=1, cache=tmp_path / "cache")
    wait_for_step(proc, workdir, 9)
    doomed = f"{remote}/part-03.tfrecord"
    kept = files.read_range(doomed, 0, files.size(doomed))
    files.remove(doomed)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0, out[-2000:]
    said = [line for line in out.splitlines() if line.startswith("bertjax: ")]
    found = re.match(
        rf"bertjax: record file {doomed} changed in the bucket while the run read it \(it was deleted\), so the run "
        r"stopped: .* rerun the same command, which resumes from step (\d+), the newest checkpoint\.",
        said[-1] if said else "",
    )
    assert found, out[-3000:]
    assert "Traceback" not in out
    files.write_whole(doomed, kept)
    out = finish(start(config_file, workdir, devices=1, cache=tmp_path / "cache"))
    assert f"resumed from {workdir}/checkpoints/{found[1]}" in out
    rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
    assert max(r["step"] for r in rows if r["kind"] == "train") == 40


def test_a_mixtures_sources_in_a_bucket_stream_each_through_its_window(bucket_set, tmp_path, monkeypatch):
    """Two sources of a data mixture (shards 0-2 and 3-5) in the bucket: the local mixture's batches and row
    sources, each source in a window of its own."""
    from bertjax.data.pretraining import mixture

    local, remote = bucket_set

    def sources(pattern):
        here = os.path.dirname(pattern)
        return (("a", f"{here}/part-[0-2].tfrecord"), ("b", f"{here}/part-[3-5].tfrecord"))

    def mixed(pattern, cache):
        return make(
            "", cache, monkeypatch, sources=sources(pattern), mixture=mixture.Mixture.parse("a=x:0.7,b=y:0.3", "")
        )

    expected_p, streamed = mixed(local, tmp_path / "a"), mixed(remote, tmp_path / "b")
    for _ in range(12):
        same([next(streamed)], [next(expected_p)])
        np.testing.assert_array_equal(streamed.last_sources, expected_p.last_sources)
    windows = [s.window for s in streamed.streams]
    assert len({w.folder for w in windows}) == 2 and all(w.stats()["fetched_pieces"] >= 1 for w in windows)
