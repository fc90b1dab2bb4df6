"""Object-store paths (gs://) against a real GCS API server on localhost (tests/gcs_emulator.py): bertjax's one
file layer (runtime/files.py) reads, lists, moves and removes there, and orbax keeps a checkpoint there, through
the clients' standard settings alone. The rest of issue 48 (a whole run in a bucket) builds on these."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest

from bertjax.runtime import files
from bertjax.runtime import lock as lock_lib
from bertjax.runtime import ownership
from gcs_emulator import gcs_bucket  # noqa: F401  (the fixture)
from test_finetune import pretrained_dir  # noqa: F401  (a fixture: a tiny BERT as a Hugging Face directory)


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


# --- The journey: corpus → vocab → records → training → export → fine-tuning, all in a bucket ---------------


def test_the_whole_journey_lives_in_a_bucket(gcs_bucket, tmp_path, monkeypatch):  # noqa: F811
    """The main job with its corpus stage, a run that starts from its HF export (phase 2's init_from), a decay
    branch from its step 2 (branch_from), extract_features from it, an export elsewhere in the bucket that
    transformers loads, fine-tuning from that export and predict: every file in the bucket, none on the local disk but
    the cached copies of what is read."""
    import transformers

    import train_setup
    from bertjax.jobs import export as exporting
    from bertjax.jobs import extract_features as extracting
    from bertjax.jobs import finetune as finetuning
    from bertjax.jobs import main as train
    from bertjax.jobs import predict as predicting
    from test_finetune import config as finetune_config
    from test_finetune import sentiment

    monkeypatch.chdir(tmp_path)  # a local "gs:/..." tree would appear here
    monkeypatch.setenv("BERTJAX_CACHE_DIR", str(tmp_path / "cache"))
    run = f"{gcs_bucket}/journey/phase1"
    c = train_setup.small_config(**{"train.num_train_steps": 4, "checkpoint.every_steps": 2})
    c.data.update(corpus="builtin:pydocs", corpus_vocab_size=train_setup.VOCAB, dupe_factor=1, num_workers=1)
    c.data.update(train_files="", eval_files="", vocab_file="")
    c.checkpoint.export_hf = True
    train.train_and_evaluate(c, run)
    assert {"stage.json", "train", "heldout", "vocab"} <= set(files.listdir(f"{run}/data"))
    assert files.listdir(f"{run}/data/train") and files.isfile(f"{run}/data/vocab/vocab.txt")
    assert files.exists(f"{run}/checkpoints/4/commit_success.txt") and files.isfile(f"{run}/hf/model.safetensors")
    rows = [json.loads(line) for line in files.read_text(f"{run}/metrics.jsonl").splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"][-1] == 4
    assert files.read_json(f"{run}/config.json")["data"]["vocab_file"] == f"{run}/data/vocab/vocab.txt"

    phase2 = f"{gcs_bucket}/journey/phase2"  # weights only, from the bucket run's own HF export (once refused)
    c2 = train_setup.small_config(**{"train.num_train_steps": 2, "train.init_from": f"{run}/hf"})
    c2.data.update(corpus="", train_files=f"{run}/data/train/*.tfrecord", vocab_file=f"{run}/data/vocab/vocab.txt")
    c2.data.update(eval_files="")
    train.train_and_evaluate(c2, phase2)
    assert files.exists(f"{phase2}/checkpoints/2/commit_success.txt")

    branch = f"{gcs_bucket}/journey/branch"  # the whole state of the bucket run's step 2, in another workdir
    c3 = train_setup.small_config(**{"train.num_train_steps": 4, "train.branch_from": f"{run}/2"})
    c3.data.update(corpus="", train_files=c2.data.train_files, vocab_file=c2.data.vocab_file, eval_files="")
    train.train_and_evaluate(c3, branch)
    assert [r["step"] for r in map(json.loads, files.read_text(f"{branch}/metrics.jsonl").splitlines())][0] == 3

    lines = f"{gcs_bucket}/journey/lines.txt"
    files.write_whole(lines, "the quick brown fox\nan encoder's vectors ||| for a pair\n")
    extracting.run(run, lines, f"{gcs_bucket}/journey/features.jsonl", layers="-1", max_seq_length=16)
    features = [json.loads(x) for x in files.read_text(f"{gcs_bucket}/journey/features.jsonl").splitlines()]
    assert [f["linex_index"] for f in features] == [0, 1] and features[0]["features"][0]["token"] == "[CLS]"

    hf = f"{gcs_bucket}/journey/hf"
    exporting.export(run, hf)
    local_hf = tmp_path / "hf"
    local_hf.mkdir()
    for name in files.listdir(hf):
        files.download(f"{hf}/{name}", str(local_hf / name))
    model = transformers.BertForPreTraining.from_pretrained(local_hf)
    assert model.config.vocab_size == train_setup.VOCAB
    assert transformers.AutoTokenizer.from_pretrained(local_hf).vocab_size == train_setup.VOCAB

    train_tsv = f"{gcs_bucket}/journey/train.tsv"  # the task's data in the bucket too
    files.upload(sentiment(tmp_path / "train.tsv", 32, seed=0), train_tsv)
    tuned = f"{gcs_bucket}/journey/finetuned"
    finetuning.finetune(
        finetune_config(hf, **{"data.train_file": train_tsv, "data.eval_file": train_tsv, "train.num_epochs": 1.0}),
        tuned,
    )
    assert files.exists(f"{tuned}/labels.json") and any(
        files.exists(f"{tuned}/checkpoints/{s}/commit_success.txt") for s in files.listdir(f"{tuned}/checkpoints")
    )
    exporting.export(tuned, f"{gcs_bucket}/journey/finetuned-hf")
    assert "model.safetensors" in files.listdir(f"{gcs_bucket}/journey/finetuned-hf")
    predicted = f"{gcs_bucket}/journey/predictions.jsonl"
    assert predicting.predict_file(tuned, train_tsv, predicted) == 32
    assert len(files.read_text(predicted).splitlines()) == 32
    texts = f"{gcs_bucket}/journey/inputs.txt"  # plain text lines in the bucket too (once: "No such file")
    files.write_whole(texts, "a first line\n\nand a second one\n")
    assert predicting.predict_file(tuned, texts, f"{gcs_bucket}/journey/from_text.jsonl") == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "hf", "train.tsv"]


def test_corpora_in_a_bucket_read_as_their_local_copies(gcs_bucket, tmp_path):  # noqa: F811
    """Raw text, Parquet and JSON Lines corpora at gs:// give the documents their local files give."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bertjax.data.corpus import sources

    texts = [f"Document {i} says one thing.\nThen it says another thing {i}." for i in range(40)]
    (tmp_path / "a.txt").write_text("\n\n".join(texts[:20]) + "\n")
    (tmp_path / "b.txt").write_text("\n\n".join(texts[20:]) + "\n")
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    pq.write_table(pa.table({"text": texts}), tmp_path / "d.parquet", row_group_size=8)
    remote = f"{gcs_bucket}/corpora-{tmp_path.name}"
    files.upload_tree(str(tmp_path), remote)
    for pattern in ("*.txt", "c.jsonl", "d.parquet"):
        local = list(sources.open_source(str(tmp_path / pattern)).documents())
        there = list(sources.open_source(f"{remote}/{pattern}").documents())
        assert there == local and len(local) == 40, pattern


def test_tokenizer_and_prepare_write_into_a_bucket_what_they_write_locally(gcs_bucket, tmp_path, monkeypatch):  # noqa: F811
    """`tokenizer --output_dir=gs://…` and `prepare --output_dir=gs://…` (local workers and Beam; the vocab in the
    bucket too) give the bytes they give on a local disk; a set a killed prepare left unfinished is refused there as it is locally."""
    import dataclasses
    import io

    from bertjax.data import remote_cache
    from bertjax.data.pretraining import instances, record_sets, records
    from bertjax.data.pretraining import shards as shards_lib
    from bertjax.jobs import prepare as prepare_job
    from bertjax.jobs import tokenizer as tokenizer_job

    monkeypatch.setenv("BERTJAX_CACHE_DIR", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(
        "\n\n".join(f"Sentence one of document {i}.\nAnd a second sentence, number {i}." for i in range(60)) + "\n"
    )
    root = f"{gcs_bucket}/made-{tmp_path.name}"
    outputs = {}
    for where in (str(tmp_path / "local"), root):
        tokenizer_job.train_tokenizer(str(corpus), 200, f"{where}/vocab")
        cfg = shards_lib.PrepareConfig(
            input_file=str(corpus),
            output_dir=f"{where}/records",
            vocab_file=f"{where}/vocab/vocab.txt",
            num_shards=2,
            instance=instances.InstanceConfig(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=2),
        )
        prepare_job.prepare(cfg, progress_stream=io.StringIO())
        outputs[where] = {
            name: files.read_text(f"{where}/{name}") if name.endswith((".txt", ".json")) else None
            for name in ("vocab/vocab.txt", "records/metadata.json")
        }
        outputs[where]["shards"] = [
            open(remote_cache.copy_of(p), "rb").read() for p in sorted(files.glob(f"{where}/records/*.tfrecord"))
        ]
    local, remote = outputs.values()
    assert local["vocab/vocab.txt"] == remote["vocab/vocab.txt"]
    assert len(local["shards"]) == 2 and local["shards"] == remote["shards"]
    beam = dataclasses.replace(cfg, output_dir=f"{root}/beam")  # the Beam runner writes there too, the same bytes
    prepare_job.prepare(beam, runner="beam", beam_args=("--runner=FnApiRunner",), progress_stream=io.StringIO())
    shards = sorted(files.glob(f"{root}/beam/*.tfrecord"))
    assert [open(remote_cache.copy_of(p), "rb").read() for p in shards] == remote["shards"]
    meta = json.loads(remote["records/metadata.json"])
    assert meta["vocab_file"] == f"{root}/vocab/vocab.txt"
    assert not (tmp_path / "gs:").exists()
    # The set is read where it is (streamed, data/stream_window.py): expanded, checked against metadata.json.
    in_bucket = record_sets.expand_record_files(f"{root}/records/*.tfrecord")
    assert in_bucket == files.glob(f"{root}/records/*.tfrecord") and len(in_bucket) == 2
    assert record_sets.check_record_set(in_bucket) == []  # metadata.json lists them: checked
    files.write_whole(f"{root}/records/{records.STAGING_NAME}/x", b"")  # what a killed prepare leaves
    with pytest.raises(ValueError, match=r"holds an unfinished record set"):
        record_sets.check_record_set(record_sets.expand_record_files(f"{root}/records/*.tfrecord"))


def test_other_object_stores_are_refused_in_one_sentence(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as error:
        ownership.claim_workdir("s3://bucket/run")
    assert str(error.value) == (
        "--workdir=s3://bucket/run: bertjax reads and writes gs:// object stores and local or mounted disks, not "
        "s3:// (untested here); copy the files to a bucket or a disk, or mount it."
    )
    with pytest.raises(ValueError, match=r"^s3://bucket/vocab.txt: bertjax reads and writes gs://"):
        files.read_text("s3://bucket/vocab.txt")
    # gs: with one slash, or any local directory named gs:, is a bucket URL missing a slash: refused before work
    for path in ("gs:/bucket/run", str(tmp_path / "gs:" / "bucket" / "run")):
        with pytest.raises(ValueError, match=r"a directory named gs: is a bucket URL missing a slash"):
            ownership.claim_workdir(path)
        with pytest.raises(ValueError, match=r"^--output_dir=.*a directory named gs:"):
            ownership.check_export_dir(path)
    assert list(tmp_path.iterdir()) == [] and not os.path.exists("gs:")


def test_the_glue_suite_reads_its_data_and_keeps_its_runs_in_a_bucket(gcs_bucket, tmp_path, pretrained_dir):  # noqa: F811
    """`python -m bertjax.glue` with config.data_dir and --workdir in a bucket: the task's runs, the report and
    the submission file land there."""
    import glue_fixtures
    from bertjax.jobs import glue as glue_suite
    from test_glue import suite_config

    data_dir = f"{gcs_bucket}/glue-data-{tmp_path.name}"
    files.upload_tree(str(glue_fixtures.write_glue(tmp_path / "glue")), data_dir)
    workdir = f"{gcs_bucket}/glue-{tmp_path.name}"
    report = glue_suite.run_suite(suite_config(pretrained_dir, data_dir, tasks="sst2"), workdir)
    assert "sst2" in json.dumps(report)
    assert {"glue.json", "glue.md", "submission"} <= set(files.listdir(workdir))
    assert "SST-2.tsv" in files.listdir(f"{workdir}/submission")
    assert files.read_json(f"{workdir}/glue.json") == json.loads(json.dumps(report))


def test_background_writes_keep_the_newest_contents_and_hand_errors_back(gcs_bucket):  # noqa: F811
    """Metrics in a bucket are uploaded off the training thread: every path ends with its last contents, and
    an upload that fails is raised in the caller's thread."""
    writes = files.BackgroundWrites()
    root = f"{gcs_bucket}/background"
    for i in range(50):
        writes.put(f"{root}/metrics.jsonl", "".join(f"{j}\n" for j in range(i + 1)))
        writes.put(f"{root}/events", bytes(range(i % 7)))
    writes.wait()
    assert files.read_text(f"{root}/metrics.jsonl").splitlines()[-1] == "49"
    with files.open_file(f"{root}/events", "rb") as f:
        assert f.read() == bytes(range(49 % 7))
    writes.put("gs://no-such-bucket-here/metrics.jsonl", "x")
    with pytest.raises(FileNotFoundError):
        writes.wait()
    writes.close()


def test_a_damaged_final_step_in_a_bucket_is_moved_aside_and_retrained_in_one_rerun(
    gcs_bucket, pydocs_data, tmp_path, monkeypatch
):  # noqa: F811
    """One params object of the final step deleted: the rerun moves the step aside, resumes from the step before,
    trains it again and saves it (in a bucket the retrained step was once not saved, and the rerun ended rc 1)."""
    import train_setup
    from bertjax.jobs import main as train

    monkeypatch.setenv("BERTJAX_CACHE_DIR", str(tmp_path / "cache"))
    run = f"{gcs_bucket}/damaged-final-{tmp_path.name}"
    c = train_setup.small_config(pydocs_data, **{"train.num_train_steps": 4, "checkpoint.every_steps": 2})
    train.train_and_evaluate(c, run)
    params = f"{run}/checkpoints/4/params"
    victim = next(f for f in files.glob(f"{params}/**") if "/d/" in f and files.isfile(f))  # array data (ocdbt)
    files.remove(victim)
    train.train_and_evaluate(c, run)
    names = files.listdir(f"{run}/checkpoints")
    assert "damaged-4" in names and files.exists(f"{run}/checkpoints/4/commit_success.txt"), names
    rows = [json.loads(line) for line in files.read_text(f"{run}/metrics.jsonl").splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"][-2:] == [3, 4]  # steps 3 and 4 trained again
