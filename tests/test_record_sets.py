"""A record set is complete and fresh, or training refuses it (issue 32).

prepare commits atomically (shards staged in a hidden folder, then moved beside metadata.json, which lists
each shard's size and CRC32C); a full disk, an error or a kill leaves nothing a record glob matches;
a directory that holds a set is refused without --overwrite; workers die with their parent. Training
checks the matched files against metadata.json before compiling, and the job checks the vocab file
against the model and the records.
"""

from __future__ import annotations

import dataclasses
import errno
import glob
import importlib.util
import io
import logging
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from bertjax.config.schema import JobConfig
from bertjax.data.pretraining import instances, records
from bertjax.data.pretraining import pipeline as pipeline_lib
from bertjax.data.pretraining import shards as shards_lib
from bertjax.jobs import prepare as prepare_job
from bertjax.jobs import vocab_check

SEQ, PRED = 64, 10
REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, vocab_file) -> pathlib.Path:
    words = [w for w in vocab_file.read_text(encoding="utf-8").splitlines() if w.isascii() and w.isalpha()][2000:6000]
    lines, k = [], 0
    for d in range(120):
        for s in range(8):
            lines.append(" ".join(words[(k + i) % len(words)] for i in range(9)) + ".")
            k += 7
        lines.append("")
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def config(out, corpus, vocab_file, num_shards=4) -> shards_lib.PrepareConfig:
    return shards_lib.PrepareConfig(
        input_file=str(corpus),
        output_dir=str(out),
        vocab_file=str(vocab_file),
        num_shards=num_shards,
        instance=instances.InstanceConfig(max_seq_length=SEQ, max_predictions_per_seq=PRED, dupe_factor=1),
    )


def prepare(out, corpus, vocab_file, num_shards=4, **kw) -> dict:
    return prepare_job.prepare(config(out, corpus, vocab_file, num_shards), progress_stream=io.StringIO(), **kw)


def pipeline(files) -> pipeline_lib.InputPipeline:
    return pipeline_lib.InputPipeline(
        pipeline_lib.PipelineConfig(
            files=str(files), batch_size=4, max_seq_length=SEQ, max_predictions_per_seq=PRED, shuffle_buffer=8
        )
    )


@pytest.fixture(scope="module")
def record_set(tmp_path_factory, corpus, vocab_file) -> pathlib.Path:
    out = tmp_path_factory.mktemp("set")
    prepare(out, corpus, vocab_file)
    return out


def copy_set(src: pathlib.Path, dst: pathlib.Path) -> pathlib.Path:
    dst.mkdir()
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    return dst


# --- prepare ------------------------------------------------------------------------------------------
def test_a_committed_set_is_its_shards_and_metadata_only(record_set):
    assert sorted(p.name for p in record_set.iterdir()) == ["metadata.json"] + [
        f"records-0000{k}-of-00004.tfrecord" for k in range(4)
    ]  # no staging folder, .tmp or .stats.json left
    assert len(pipeline(record_set / "*.tfrecord").files) == 4
    assert len(pipeline(record_set).files) == 4  # a directory stands for the shards its metadata.json lists


def test_a_directory_holding_a_set_is_refused_and_overwrite_replaces_the_whole_set(
    tmp_path, record_set, corpus, vocab_file
):
    out = copy_set(record_set, tmp_path / "out")
    with pytest.raises(
        FileExistsError,
        match=r"already holds a record set \(4 \.tfrecord file\(s\) and "
        r"metadata.json\); pass --overwrite",
    ):
        prepare(out, corpus, vocab_file, num_shards=2)
    assert len(list(out.glob("*.tfrecord"))) == 4  # refused before touching anything
    prepare(out, corpus, vocab_file, num_shards=2, overwrite=True)
    assert sorted(p.name for p in out.glob("*")) == [
        "metadata.json",
        "records-00000-of-00002.tfrecord",
        "records-00001-of-00002.tfrecord",
    ]  # no stale -of-00004 shard
    assert len(pipeline(out / "*.tfrecord").files) == 2


def test_a_stale_missing_or_changed_shard_is_refused_naming_it(tmp_path, record_set):
    stale = copy_set(record_set, tmp_path / "stale")
    first = (record_set / "records-00000-of-00004.tfrecord").read_bytes()
    (stale / "records-00007-of-00008.tfrecord").write_bytes(first)
    with pytest.raises(
        ValueError,
        match=r"records-00007-of-00008.tfrecord is not in .*metadata.json: it is left from "
        "another run",
    ):
        pipeline(stale / "*.tfrecord")
    missing = copy_set(record_set, tmp_path / "missing")
    (missing / "records-00002-of-00004.tfrecord").unlink()
    with pytest.raises(ValueError, match=r"metadata.json lists records-00002-of-00004.tfrecord, which is missing"):
        pipeline(missing / "*.tfrecord")
    changed = copy_set(record_set, tmp_path / "changed")
    shard = changed / "records-00001-of-00004.tfrecord"
    shard.write_bytes((changed / "records-00000-of-00004.tfrecord").read_bytes())  # intact records, other size
    assert shard.stat().st_size != (record_set / shard.name).stat().st_size
    with pytest.raises(
        ValueError,
        match=r"records-00001-of-00004.tfrecord has [\d,]+ bytes but .* lists [\d,]+: it "
        "was changed or cut short since prepare wrote it",
    ):
        pipeline(changed / "*.tfrecord")
    shard.write_bytes((record_set / shard.name).read_bytes()[:-100])  # cut short: where, before compiling
    with pytest.raises(ValueError, match=r"records-00001-of-00004.tfrecord has a truncated record at byte"):
        pipeline(changed / "*.tfrecord")
    assert len(pipeline(changed / "records-00000-*.tfrecord").files) == 1  # a chosen subset of good shards trains


def test_verify_checksums_finds_a_flipped_byte_that_keeps_the_size(tmp_path, record_set):
    flipped = copy_set(record_set, tmp_path / "flipped")
    shard = flipped / "records-00003-of-00004.tfrecord"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    files = str(flipped / "*.tfrecord")
    pipeline(files)  # the size is the same: only a full read can tell
    with pytest.raises(ValueError, match=r"records-00003-of-00004.tfrecord fails its checksum \(crc32c \w+, .*lists"):
        pipeline_lib.InputPipeline(
            pipeline_lib.PipelineConfig(
                files=files, batch_size=4, max_seq_length=SEQ, max_predictions_per_seq=PRED, verify_checksums=True
            )
        )
    pipeline_lib.InputPipeline(
        pipeline_lib.PipelineConfig(
            files=str(record_set / "*.tfrecord"),
            batch_size=4,
            max_seq_length=SEQ,
            max_predictions_per_seq=PRED,
            verify_checksums=True,
        )
    )


def test_records_without_metadata_train_with_a_warning(tmp_path, record_set, caplog):
    bare = copy_set(record_set, tmp_path / "bare")
    (bare / "metadata.json").unlink()
    with caplog.at_level(logging.WARNING):
        assert len(pipeline(bare / "*.tfrecord").files) == 4
    assert "have no metadata.json listing them" in caplog.text and "cannot be detected" in caplog.text


def test_the_summary_warns_when_instances_keep_under_95_percent_of_the_tokens(tmp_path, corpus, vocab_file):
    words = corpus.read_text(encoding="utf-8").split()
    long = tmp_path / "long.txt"  # sentences of ~60 words for 64-token instances: most of each is truncated
    long.write_text(
        "\n\n".join("\n".join(" ".join(words[i : i + 60]) for i in range(d, d + 600, 60)) for d in range(0, 6000, 600))
        + "\n",
        encoding="utf-8",
    )
    metadata = prepare(tmp_path / "out", long, vocab_file, num_shards=1)
    assert metadata["tokens_kept_share"] < 0.6
    warning = prepare_job.summary(metadata).splitlines()[-1]
    assert warning.startswith(
        f"prepare: warning: the instances keep only {100 * metadata['tokens_kept_share']:.1f}% "
        f"of the corpus's {metadata['counts']['tokens']:,} tokens; sentences average"
    )
    assert "more than half of max_seq_length=64" in warning
    # One-line sentences: one pass loses only what pairs overshoot, and five passes cut in different places.
    one_pass = prepare(tmp_path / "one", corpus, vocab_file, num_shards=1)
    assert 0.85 < one_pass["tokens_kept_share"] < 0.95 and "dupe_factor=1" in prepare_job.summary(one_pass)
    cfg = dataclasses.replace(
        config(tmp_path / "five", corpus, vocab_file, 1),
        instance=instances.InstanceConfig(max_seq_length=SEQ, max_predictions_per_seq=PRED, dupe_factor=5),
    )
    five = prepare_job.prepare(cfg, progress_stream=io.StringIO())
    assert five["tokens_kept_share"] > 0.99 and "warning" not in prepare_job.summary(five)


class FullDisk(io.RawIOBase):
    """A file on a disk that fills after `room` bytes."""

    def __init__(self, room: int):
        self.room = room

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return len(data)


def test_a_full_disk_is_one_sentence_and_leaves_nothing_a_glob_matches(tmp_path, corpus, vocab_file, monkeypatch):
    out = tmp_path / "out"
    real_open = records.open_for_write
    monkeypatch.setattr(
        records,
        "open_for_write",
        lambda path: FullDisk(5_000) if path.endswith(".tfrecord.tmp") and "00002" in path else real_open(path),
    )
    with pytest.raises(
        OSError,
        match=r"no space left on the device writing \S+records-00002-of-00004.tfrecord "
        r"\([\d,]+ bytes free\): free space there or choose another --output_dir",
    ):
        prepare(out, corpus, vocab_file)
    assert os.listdir(out) == []  # shards 0 and 1 were complete, but never appear as a partial set


def test_an_unfinished_prepare_is_refused_and_a_rerun_clears_it(tmp_path, record_set, corpus, vocab_file):
    out = copy_set(record_set, tmp_path / "out")
    (out / records.STAGING_NAME).mkdir()  # what a kill between the shards' move and metadata.json leaves
    with pytest.raises(ValueError, match=r"holds an unfinished record set .* re-run `python -m bertjax.prepare`"):
        pipeline(out / "*.tfrecord")
    killed = copy_set(record_set, tmp_path / "killed")
    (killed / "metadata.json").unlink()
    for shard in killed.glob("*.tfrecord"):
        shard.unlink()
    (killed / records.STAGING_NAME).mkdir()
    (killed / records.STAGING_NAME / "records-00000-of-00004.tfrecord.tmp").write_bytes(b"partial")
    prepare(killed, corpus, vocab_file)  # leftovers of a killed run need no --overwrite
    assert not (killed / records.STAGING_NAME).exists() and len(pipeline(killed / "*").files) == 4


def _faults_benchmark():
    """benchmarks/fault_prepare.py (faults.py's prepare trials), for its process helpers (children, alive)."""
    spec = importlib.util.spec_from_file_location("fault_prepare", REPO / "benchmarks" / "fault_prepare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_kill_9_of_prepare_leaves_no_worker_and_no_partial_set(tmp_path, corpus, vocab_file):
    faults = _faults_benchmark()
    big = tmp_path / "big.txt"
    big.write_text(corpus.read_text(encoding="utf-8") * 60, encoding="utf-8")  # ~30 s of work
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bertjax.prepare",
            f"--input_file={big}",
            f"--output_dir={out}",
            f"--vocab_file={vocab_file}",
            "--num_shards=8",
            "--num_workers=2",
            "--dupe_factor=10",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    workers: list[int] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (workers and (out / records.STAGING_NAME).exists()):
        workers = [
            c for c in faults.children(proc.pid) if "multiprocessing" in pathlib.Path(f"/proc/{c}/cmdline").read_text()
        ]
        time.sleep(0.1)
    time.sleep(0.5)
    assert workers and proc.poll() is None, "prepare finished (or never spawned a worker) before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(map(faults.alive, workers)):
        time.sleep(0.1)
    assert not any(map(faults.alive, workers)), "a worker outlived its killed parent"
    assert not glob.glob(str(out / "*"))  # only the hidden staging folder: nothing a glob of its shards matches
    with pytest.raises(FileNotFoundError, match="matches no files"):
        pipeline(out / "*")


# --- The job's vocabulary ---------------------------------------------------------------------------
def job(record_set, vocab_file, vocab_size=0) -> JobConfig:
    return JobConfig().replace(
        model={"vocab_size": vocab_size},
        data={
            "train_files": str(record_set / "*.tfrecord"),
            "vocab_file": str(vocab_file),
            "max_seq_length": SEQ,
            "max_predictions_per_seq": PRED,
        },
    )


def test_vocab_size_comes_from_the_records_when_unset(record_set, vocab_file):
    assert vocab_check.check_job_vocab(job(record_set, "")).model.vocab_size == 30522
    assert vocab_check.check_job_vocab(job(record_set, vocab_file)).model.vocab_size == 30522


def test_a_vocab_that_lost_a_line_or_is_another_is_refused_before_compiling(tmp_path, record_set, vocab_file):
    lines = vocab_file.read_text(encoding="utf-8").splitlines()
    short = tmp_path / "short.txt"
    short.write_text("\n".join(lines[:-1]) + "\n", encoding="utf-8")  # 30,521 lines for a 30,522-row model
    with pytest.raises(ValueError, match=r"short.txt has 30,521 tokens but config.model.vocab_size=30,522"):
        vocab_check.check_job_vocab(job(record_set, short))
    other = tmp_path / "other.txt"
    other.write_text("\n".join(lines[:-1] + ["zzzz"]) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"other.txt is not the vocabulary the records were made with"):
        vocab_check.check_job_vocab(job(record_set, other))


def test_the_job_refuses_a_mismatched_vocab_before_compiling(tmp_path, record_set, vocab_file):
    from bertjax.jobs import main as train

    short = tmp_path / "short.txt"
    short.write_text("\n".join(vocab_file.read_text(encoding="utf-8").splitlines()[:-1]) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="has 30,521 tokens"):
        train.train_and_evaluate(
            job(record_set, short).replace(
                model={"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}
            ),
            str(tmp_path / "w"),
        )
    assert not (tmp_path / "w" / "checkpoints").exists()
