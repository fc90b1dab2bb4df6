"""Faults a long run meets. Damaged checkpoints never stop a run: the job resumes from the newest step
that restores completely, moves the damaged ones aside (never deletes or uses them), and ends with the
params of a run that was never damaged; only when no step restores does it stop, changing nothing, unless
told to start over. A SIGTERM before training exits 0. A second job in a busy workdir is refused; a dead
job's lock is taken over. A step whose loss or gradients are not finite is never applied: skipped and
counted, or the job stops with the last checkpoint intact. A damaged record file (truncated, a flipped byte,
not a record file) is named with the byte where the damage is, or, when told to, read up to that byte with
the loss counted. A full disk stops the job with one sentence, and the newest committed step resumes."""

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

import train_setup
from bertjax.training import checkpoint as checkpoint_lib
from bertjax.runtime import lock as lock_lib
from bertjax.jobs import main as train
from bertjax.training import trainer as trainer_lib
from bertjax.config.schema import JobConfig
from bertjax.data.pretraining import pipeline as pipeline_lib
from bertjax.data.pretraining import records as records_lib
from bertjax.data.pretraining import record_sets

STEPS = 8


def config(pydocs_data: str, steps: int = STEPS, **overrides):
    return train_setup.small_config(
        pydocs_data, **{"train.num_train_steps": steps, "checkpoint.every_steps": 2, "checkpoint.keep": 10, **overrides}
    )


def final_params(workdir) -> list[np.ndarray]:
    return jax.tree.leaves(checkpoint_lib.load_params(str(workdir))[1])


def step_dirs(workdir) -> list[str]:
    return sorted(os.listdir(os.path.join(workdir, checkpoint_lib.CHECKPOINTS)))


@pytest.fixture(scope="module")
def runs(pydocs_data, tmp_path_factory):
    """(an uninterrupted STEPS-step run's final params, the same run as if stopped after step 6: saves at
    2, 4 and 6)."""
    tmp = tmp_path_factory.mktemp("faults")
    train.train_and_evaluate(config(pydocs_data), str(tmp / "uninterrupted"))
    shutil.copytree(tmp / "uninterrupted", tmp / "stopped")
    shutil.rmtree(tmp / "stopped" / checkpoint_lib.CHECKPOINTS / str(STEPS))
    return final_params(tmp / "uninterrupted"), tmp / "stopped"


def _truncate_largest_opt_state_file(step_dir: str) -> None:
    files = [f for f in glob.glob(os.path.join(step_dir, "opt_state", "**"), recursive=True) if os.path.isfile(f)]
    with open(max(files, key=os.path.getsize), "r+b") as f:
        f.truncate(5000)


def _flip_bytes_in_largest_params_file(step_dir: str) -> None:
    """Silent corruption: the files still read (tensorstore keeps no checksum of array data)."""
    files = [f for f in glob.glob(os.path.join(step_dir, "params", "**"), recursive=True) if os.path.isfile(f)]
    path = max(files, key=os.path.getsize)
    data = bytearray(open(path, "rb").read())
    for at in range(len(data) // 3, len(data) // 3 + 64, 4):
        data[at] ^= 0x10
    open(path, "wb").write(bytes(data))


DAMAGES = {
    "opt_state array file truncated to 5,000 bytes": (6, _truncate_largest_opt_state_file),
    "params item deleted": (6, lambda d: shutil.rmtree(os.path.join(d, "params"))),
    "an empty step directory": (8, lambda d: os.makedirs(d)),
    "pipeline index truncated to 0 bytes": (
        6,
        lambda d: open(os.path.join(d, "pipeline", "process_0.index"), "w").close(),
    ),
    "bytes flipped in a params array file": (6, _flip_bytes_in_largest_params_file),
}


def test_weights_only_loads_check_the_checksums_too(runs, tmp_path):
    """export, init_from and predict read params alone (load_params): flipped bytes are named, not used."""
    _, stopped = runs
    workdir = tmp_path / "work"
    shutil.copytree(stopped, workdir)
    _flip_bytes_in_largest_params_file(os.path.join(workdir, checkpoint_lib.CHECKPOINTS, "6"))
    with pytest.raises(checkpoint_lib.DamagedCheckpoint, match=r"checkpoints/6 is damaged: 1 parameter array"):
        checkpoint_lib.load_params(str(workdir))
    assert checkpoint_lib.load_params(str(workdir), step=4)[0]["model"]  # the step before is fine


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_newest_step_is_moved_aside_and_the_one_before_resumes_exactly(
    runs, pydocs_data, tmp_path, damage, caplog
):
    expected, stopped = runs
    workdir = tmp_path / "work"
    shutil.copytree(stopped, workdir)
    step, harm = DAMAGES[damage]
    harm(os.path.join(workdir, checkpoint_lib.CHECKPOINTS, str(step)))
    with caplog.at_level("INFO", logger="bertjax"):
        train.train_and_evaluate(config(pydocs_data), str(workdir))
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(f"checkpoints/{step} does not restore (" in w for w in warnings), warnings
    if damage == "bytes flipped in a params array file":  # read fine; caught by the checksums saved with them
        assert any("DamagedCheckpoint: 1 array(s) differ from the checksums saved with them" in w for w in warnings)
    assert any(f"moved the damaged step {step} aside" in w for w in warnings), warnings
    resumed = 4 if step == 6 else 6
    assert any(
        f"resumed from {workdir / checkpoint_lib.CHECKPOINTS}/{resumed}" in r.getMessage() for r in caplog.records
    )
    assert f"damaged-{step}" in step_dirs(workdir)  # kept for the user, under a name orbax ignores
    for a, b in zip(expected, final_params(workdir)):
        np.testing.assert_array_equal(a, b)


def test_the_command_past_a_truncated_array_file_logs_its_warning_and_no_traceback(runs, pydocs_data, tmp_path):
    """`python -m bertjax.main` on a workdir whose newest step has a truncated array: the restore's other reads
    are drained before its event loop closes; they used to end in ~80 tracebacks after the one warning ("Event
    loop is closed", "Exception ignored in: <coroutine object _read_array_index_and_device_put>"), 4 of 4 runs."""
    workdir = tmp_path / "work"
    shutil.copytree(runs[1], workdir)
    _truncate_largest_opt_state_file(os.path.join(workdir, checkpoint_lib.CHECKPOINTS, "6"))
    config_file = train_setup.write_config(config(pydocs_data), tmp_path / "config.py")
    done = subprocess.run(
        [sys.executable, "-m", "bertjax.main", f"--config={config_file}", f"--workdir={workdir}"],
        cwd=train_setup.ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "checkpoints/6 does not restore (" in done.stderr and "resumed from" in done.stderr, done.stderr[-3000:]
    for noise in ("Traceback", "Exception ignored", "Event loop is closed"):
        assert noise not in done.stderr, done.stderr[:3000]


def test_when_no_step_restores_the_job_stops_and_changes_nothing_unless_told_to_start_over(runs, pydocs_data, tmp_path):
    expected, _ = runs
    workdir = tmp_path / "work"
    shutil.copytree(runs[1], workdir)  # keep only step 2, and damage it
    for step in (4, 6):
        shutil.rmtree(workdir / checkpoint_lib.CHECKPOINTS / str(step))
    shutil.rmtree(workdir / checkpoint_lib.CHECKPOINTS / "2" / "params")
    before = step_dirs(workdir)
    with pytest.raises(ValueError) as error:
        train.train_and_evaluate(config(pydocs_data), str(workdir))
    message = str(error.value)
    assert "no checkpoint in" in message and "step 2: KeyError" in message and "nothing was changed" in message
    assert "--config.checkpoint.start_over_if_damaged=true" in message and "\n" not in message
    assert step_dirs(workdir) == before
    # Told to: the damaged step is moved aside and the run starts from scratch, like one never damaged.
    train.train_and_evaluate(config(pydocs_data, **{"checkpoint.start_over_if_damaged": True}), str(workdir))
    assert "damaged-2" in step_dirs(workdir)
    for a, b in zip(expected, final_params(workdir)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "change, refusal",
    [
        ({"model.intermediate_size": 96}, "different model config"),
        ({"optim.max_grad_norm": 0.0}, "optimizer state of another layout than config.optim makes"),
    ],
)
def test_a_checkpoint_of_another_model_or_optimizer_is_refused_not_moved_aside(
    runs, pydocs_data, tmp_path, change, refusal
):
    _, stopped = runs
    workdir = tmp_path / "work"
    shutil.copytree(stopped, workdir)
    with pytest.raises(ValueError, match=refusal):
        train.train_and_evaluate(config(pydocs_data, **change), str(workdir))
    assert not [d for d in step_dirs(workdir) if d.startswith(checkpoint_lib.DAMAGED_PREFIX)]


def test_sigterm_before_training_starts_exits_0_saying_nothing_was_lost(tmp_path):
    """The job as a user runs it, sent SIGTERM as its data stage begins (no race: the stage sends it)."""
    c = train_setup.small_config()
    c.data.update(corpus="builtin:pydocs", corpus_vocab_size=train_setup.VOCAB, dupe_factor=2, num_workers=1)
    config_file = train_setup.write_config(c, tmp_path / "config.py")
    program = (
        "import os, signal, sys\n"
        "from bertjax.jobs import stage\n"
        "prepare = stage.prepare_data\n"
        "def signalled(*args, **kwargs):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return prepare(*args, **kwargs)\n"
        "stage.prepare_data = signalled\n"
        f"sys.argv = ['bertjax.main', '--config={config_file}', '--workdir={tmp_path / 'work'}']\n"
        "from bertjax import cli, main\n"
        "main.define_flags()\n"
        "cli.run(main.main)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        cwd=train_setup.ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        timeout=300,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "stopped on request before training started" in out and "nothing was lost" in out
    assert "train step" not in out and "Traceback" not in out
    assert not (tmp_path / "work" / "data" / "train").exists()  # stopped before the stage wrote records


def test_sigterm_while_fine_tuning_compiles_exits_0_and_the_rerun_trains(tmp_path, minilm_dir):
    """`python -m bertjax.finetune` sent SIGTERM while it compiles (a preemptible VM's signal): it used to log
    that nothing was lost and then die in the interpreter's shutdown (rc 139, 3 of 3 tries on the 2-core AMD
    EPYC, 2-4 s after its setup line); the same command then trains."""
    rows = "".join(
        f"the film was {w}\t{'pos' if w in ('good', 'great') else 'neg'}\n"
        for w in ["good", "bad", "great", "awful"] * 16
    )
    (tmp_path / "train.tsv").write_text("text\tlabel\n" + rows)
    command = [
        sys.executable,
        "-m",
        "bertjax.finetune",
        "--config=configs/finetune.py",
        f"--workdir={tmp_path / 'w'}",
        f"--config.train.init_from={minilm_dir}",
        f"--config.data.train_file={tmp_path / 'train.tsv'}",
        "--config.train.num_train_steps=3",
        "--config.data.max_seq_length=16",
        "--config.train.global_batch_size=8",
    ]
    job = subprocess.Popen(
        command, cwd=train_setup.ROOT, stderr=subprocess.PIPE, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu")
    )
    lines = []
    for line in job.stderr:
        lines.append(line)
        if "attention: auto chose" in line:  # the model is built: the train step compiles next
            time.sleep(2)
            job.send_signal(signal.SIGTERM)
            break
    lines += job.stderr.readlines()
    out = "".join(lines)
    assert job.wait(timeout=300) == 0, out[-3000:]
    assert "Fatal Python error" not in out and "Traceback" not in out, out[-3000:]
    assert "received signal 15" in out, out[-3000:]
    done = subprocess.run(
        command,
        cwd=train_setup.ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )
    assert done.returncode == 0 and "3 steps in" in done.stderr, done.stderr[-3000:]


def test_a_second_job_in_a_busy_workdir_is_refused_and_a_dead_jobs_lock_is_taken_over(pydocs_data, tmp_path, caplog):
    workdir = tmp_path / "work"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from bertjax.runtime import lock; "
            f"lock.WorkdirLock({str(workdir)!r}).acquire(); print('held', flush=True); "
            "time.sleep(600)",
        ],
        cwd=train_setup.ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ValueError) as error:
            train.train_and_evaluate(config(pydocs_data, steps=2), str(workdir))
        assert f"is in use by another job (pid {holder.pid} on " in str(error.value) and "\n" not in str(error.value)
        assert not (workdir / checkpoint_lib.CHECKPOINTS).exists()  # refused before touching anything
    finally:
        holder.kill()  # like kill -9: the lock file stays behind
        holder.wait()
    assert (workdir / lock_lib.LOCK_FILE).exists()
    with caplog.at_level("WARNING", logger="bertjax"):
        train.train_and_evaluate(config(pydocs_data, steps=2), str(workdir))
    assert any(f"pid {holder.pid} no longer runs on this host" in r.getMessage() for r in caplog.records)
    assert step_dirs(workdir) == ["2"] and not (workdir / lock_lib.LOCK_FILE).exists()  # released at the end


def test_a_lock_from_another_host_is_respected_until_it_goes_stale(tmp_path):
    path = tmp_path / lock_lib.LOCK_FILE
    for minutes_ago, refused in ((1, True), (lock_lib.STALE_AFTER_S / 60 + 1, False)):
        path.write_text(json.dumps({"host": "another-host", "pid": 4242, "refreshed": time.time() - 60 * minutes_ago}))
        workdir_lock = lock_lib.WorkdirLock(str(tmp_path))
        if refused:
            with pytest.raises(ValueError, match="in use by another job .pid 4242 on another-host"):
                workdir_lock.acquire()
        else:
            with workdir_lock:
                assert json.loads(path.read_text())["pid"] == os.getpid()
            assert not path.exists()


# --- Non-finite steps --------------------------------------------------------------------------------


def _poison(batch: dict, value: float) -> dict:
    """A batch whose MLM loss (and so every gradient) is `value`: NaN or Inf."""
    return dict(batch, masked_lm_weights=batch["masked_lm_weights"] * np.float32(value))


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_a_nonfinite_step_changes_nothing_but_the_step_count(pydocs_data, value):
    job = JobConfig.from_configdict(config(pydocs_data)).replace(mesh={"shape": (1, 1, 1)})
    trainer = trainer_lib.setup(job, jax.devices()[:1])
    pipe = pipeline_lib.InputPipeline(
        pipeline_lib.PipelineConfig(
            files=job.data.train_files,
            batch_size=16,
            max_seq_length=job.data.max_seq_length,
            max_predictions_per_seq=job.data.max_predictions_per_seq,
            shuffle_buffer=100,
        )
    )
    state = trainer.init_state()
    for _ in range(2):  # real steps first: the Adam moments are not zero
        state, _ = trainer.train_step(state, trainer.global_batch(next(pipe)))
    before = jax.device_get(state)  # a copy: the step donates its input state
    state, metrics = trainer.train_step(state, trainer.global_batch(_poison(next(pipe), value)))
    after = jax.device_get(state)
    assert int(after.step) == int(before.step) + 1
    for a, b in zip(
        jax.tree.leaves((before.params, before.opt_state)), jax.tree.leaves((after.params, after.opt_state))
    ):
        np.testing.assert_array_equal(a, b)
    assert float(metrics["nonfinite"][0]) == 1.0
    assert float(metrics["loss"][1]) == 0.0 and float(metrics["mlm_accuracy"][1]) == 0.0  # out of the logged means
    state, metrics = trainer.train_step(state, trainer.global_batch(next(pipe)))  # the next finite step trains
    assert float(metrics["nonfinite"][0]) == 0.0 and np.isfinite(float(metrics["loss"][0]))
    assert not all(
        np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(jax.device_get(state.params)), jax.tree.leaves(after.params))
    )


def _poison_training_batches(monkeypatch, steps: set[int]) -> None:
    """The training pipeline hands out NaN batches at these (1-based) steps."""
    original = pipeline_lib.InputPipeline.__next__
    served = [0]

    def poisoning_next(self):
        batch = original(self)
        if self.config.training:
            served[0] += 1
            if served[0] in steps:
                batch = _poison(batch, np.nan)
        return batch

    monkeypatch.setattr(pipeline_lib.InputPipeline, "__next__", poisoning_next)


def _rows(workdir) -> dict[int, dict]:
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r for r in map(json.loads, lines) if r["kind"] == "train"}


def test_skip_counts_nonfinite_steps_and_stops_after_too_many_in_a_row(pydocs_data, tmp_path, monkeypatch, caplog):
    _poison_training_batches(monkeypatch, {3, 5, 6})
    workdir = tmp_path / "skip"
    with caplog.at_level("WARNING", logger="bertjax"):
        train.train_and_evaluate(config(pydocs_data), str(workdir))  # skip, up to 10 in a row: the run ends
    rows = _rows(workdir)
    assert [s for s, r in sorted(rows.items()) if r["skipped_steps"]] == [3, 5, 6]
    assert rows[3]["loss"] is None and all(np.isfinite(rows[s]["loss"]) for s in (1, 2, 4, 7, 8))
    assert (
        sum("its update was not applied (2 such steps in a row, 3 in all)" in r.getMessage() for r in caplog.records)
        == 1
    )
    assert step_dirs(workdir)[-1] == str(STEPS) and all(np.isfinite(p).all() for p in final_params(workdir))

    _poison_training_batches(monkeypatch, {3, 5, 6})
    workdir = tmp_path / "limit"
    with pytest.raises(FloatingPointError) as error:
        train.train_and_evaluate(config(pydocs_data, **{"train.max_consecutive_nonfinite": 2}), str(workdir))
    message = str(error.value)
    assert (
        message.startswith(
            "the loss or gradients of step 6 are not finite (2 steps in a row, "
            "config.train.max_consecutive_nonfinite=2)"
        )
        and "\n" not in message
    )
    assert f"{workdir / checkpoint_lib.CHECKPOINTS}/4, holds finite weights" in message
    assert step_dirs(workdir) == ["2", "4"]  # nothing after the stopping step was saved


def test_an_absurd_learning_rate_stops_the_job_and_its_last_checkpoint_resumes_exactly(runs, pydocs_data, tmp_path):
    expected, stopped = runs
    workdir = tmp_path / "work"
    shutil.copytree(stopped, workdir)  # steps 2, 4, 6 of the uninterrupted run
    absurd = config(pydocs_data, **{"train.on_nonfinite": "stop"})
    absurd.optim.update(learning_rate=1e30, warmup_steps=0)
    with pytest.raises(FloatingPointError) as error:  # step 7's update is huge but finite; step 8 overflows
        train.train_and_evaluate(absurd, str(workdir))
    message = str(error.value)
    assert "step 8 are not finite (config.train.on_nonfinite=stop)" in message
    assert "lower config.optim.learning_rate (now 1e+30)" in message and "\n" not in message
    assert step_dirs(workdir) == ["2", "4", "6"]
    train.train_and_evaluate(config(pydocs_data), str(workdir))  # the same command with a sane rate resumes at 6
    for a, b in zip(expected, final_params(workdir)):
        np.testing.assert_array_equal(a, b)


# --- Damaged records ---------------------------------------------------------------------------------


def _damaged_copy(pydocs_data: str, tmp_path, damage: str) -> tuple[str, str, int]:
    """The train records copied, one shard damaged: (directory, damaged file, records left readable)."""
    directory = tmp_path / "train"
    shutil.copytree(os.path.join(pydocs_data, "train"), directory)
    shard = sorted(glob.glob(str(directory / "*.tfrecord")))[0]
    data = bytearray(open(shard, "rb").read())
    offsets = [0]  # where each record's frame starts
    while offsets[-1] < len(data):
        offsets.append(
            offsets[-1] + record_sets.FRAME_BYTES + int.from_bytes(data[offsets[-1] : offsets[-1] + 8], "little")
        )
    if damage == "truncated":
        data = data[: offsets[-2] + 30]  # the last record cut short
        good = len(offsets) - 2
    elif damage == "flipped byte":
        data[offsets[3] + 12 + 7] ^= 0xFF  # a byte of record 3's data: its CRC fails
        good = 3
    else:  # a file the glob matches that holds no records
        shard, data, good = str(directory / "notes.tfrecord"), bytearray(b"shard list, written by hand\n"), 0
    open(shard, "wb").write(bytes(data))
    return str(directory), shard, good


def _pipeline(files: str, **overrides) -> pipeline_lib.InputPipeline:
    return pipeline_lib.InputPipeline(
        pipeline_lib.PipelineConfig(
            files=files,
            batch_size=16,
            max_seq_length=train_setup.SEQ,
            max_predictions_per_seq=train_setup.PRED,
            shuffle_buffer=100,
            **overrides,
        )
    )


@pytest.mark.parametrize("damage", ["truncated", "flipped byte", "not a record file"])
def test_a_damaged_record_file_is_named_with_the_byte_or_read_up_to_its_damage(pydocs_data, tmp_path, damage):
    directory, shard, good = _damaged_copy(pydocs_data, tmp_path, damage)
    files = os.path.join(directory, "*.tfrecord")
    with pytest.raises(ValueError) as error:
        pipe = _pipeline(files)  # a file that is no record file is refused here, the others when read
        for _ in range(10_000):
            next(pipe)
    message = str(error.value)
    assert shard in message and "\n" not in message and "config.data.skip_damaged_records=true" in message
    expected_problem = {
        "truncated": "a truncated record at byte",
        "flipped byte": "a record whose data fails its CRC",
        "not a record file": "no TFRecord header (it is not a record file)",
    }[damage]
    assert expected_problem in message

    # Told to skip: every file is read up to its first damage, and the loss is counted.
    listed = record_sets.listed_counts([shard], records_lib.read_metadata([shard]))
    intact = sum(record_sets.scan_file(f).records for f in glob.glob(files) if f != shard)
    for training in (False, True):
        pipe = _pipeline(files, skip_damaged_records=True, training=training, num_epochs=1)
        assert [d.path for d in pipe.damaged] == [shard] and pipe.damaged[0].records == good
        assert pipe.skipped_records == (listed[shard] - good if shard in listed else 0)
        rows = sum(int(b[pipeline_lib.EXAMPLE_WEIGHT].sum()) for b in pipe)
        assert rows == (intact + good if not training else (intact + good) // 16 * 16)  # training drops the remainder


def test_a_glob_that_also_matches_metadata_json_means_the_shards_and_metadata_json_named_says_so(pydocs_data):
    files = _pipeline(os.path.join(pydocs_data, "train", "*")).files
    assert files and all(f.endswith(".tfrecord") for f in files)
    with pytest.raises(
        ValueError,
        match=r"metadata.json has no TFRecord header .* \(it describes the record set: "
        "name the shards, or their directory\)",
    ):
        _pipeline(os.path.join(pydocs_data, "train", "metadata.json"))


def test_the_job_stops_on_a_damaged_record_file_or_skips_what_it_is_told_to(pydocs_data, tmp_path, caplog):
    directory, shard, good = _damaged_copy(pydocs_data, tmp_path, "flipped byte")
    job = config(pydocs_data, steps=4, **{"data.train_files": os.path.join(directory, "*.tfrecord")})
    with pytest.raises(ValueError, match=f"record file {shard} has a record whose data fails its CRC check at byte"):
        train.train_and_evaluate(job, str(tmp_path / "strict"))
    job.data.skip_damaged_records = True
    with caplog.at_level("WARNING", logger="bertjax"):
        train.train_and_evaluate(job, str(tmp_path / "skipping"))
    assert any(
        "skipping the rest of a damaged file" in r.getMessage() and shard in r.getMessage() for r in caplog.records
    )
    rows = [json.loads(line) for line in (tmp_path / "skipping" / "metrics.jsonl").read_text().splitlines()]
    data_row = next(r for r in rows if r["kind"] == "data")
    assert data_row["train_damaged_files"] == 1 and data_row["eval_damaged_files"] == 0
    listed = record_sets.listed_counts([shard], records_lib.read_metadata([shard]))[shard]
    assert data_row["train_skipped_records"] == listed - good > 0
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2, 3, 4]


# --- A full disk -------------------------------------------------------------------------------------


def test_a_save_with_no_room_is_refused_before_writing_and_the_run_resumes_exactly(
    runs, pydocs_data, tmp_path, monkeypatch
):
    expected, _ = runs
    workdir = tmp_path / "work"
    real = shutil.disk_usage

    def usage(path):  # the disk fills up once step 4 is written
        full = (workdir / checkpoint_lib.CHECKPOINTS / "4").is_dir()
        return real(path)._replace(free=100_000) if full else real(path)

    monkeypatch.setattr(checkpoint_lib.shutil, "disk_usage", usage)
    with pytest.raises(checkpoint_lib.DiskFull) as error:
        train.train_and_evaluate(config(pydocs_data), str(workdir))
    message = str(error.value)
    assert (
        message.startswith(
            f"no space left on device for saving step 6 in {workdir / checkpoint_lib.CHECKPOINTS}: "
            "a checkpoint needs about "
        )
        and "MiB and 0.1 MiB are free" in message
    )
    assert "the newest committed checkpoint, step 4, is intact and resumes." in message and "\n" not in message
    assert step_dirs(workdir) == ["2", "4"]  # nothing half-written
    monkeypatch.undo()
    train.train_and_evaluate(config(pydocs_data), str(workdir))
    for a, b in zip(expected, final_params(workdir)):
        np.testing.assert_array_equal(a, b)


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MiB tmpfs: room for one checkpoint of the test model (~1.4 MiB), not two."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()}); the test above covers the refusal")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_write_that_runs_out_of_space_is_one_sentence_and_the_run_resumes_exactly(
    runs, pydocs_data, tmp_path, small_disk, monkeypatch
):
    expected, _ = runs
    monkeypatch.setattr(checkpoint_lib.Checkpointer, "_check_room", lambda self, step: None)  # write into a full disk
    with pytest.raises(checkpoint_lib.DiskFull) as error:
        train.train_and_evaluate(config(pydocs_data), str(small_disk / "work"))
    message = str(error.value)
    assert message.startswith(f"no space left on device for writing a checkpoint in {small_disk}/work/checkpoints")
    assert "the newest committed checkpoint, step 2, is intact and resumes." in message and "\n" not in message
    assert step_dirs(small_disk / "work") == ["2"]  # the failed write's partial files are gone
    monkeypatch.undo()
    shutil.copytree(small_disk / "work", tmp_path / "moved")  # the user moves the workdir to a larger disk
    train.train_and_evaluate(config(pydocs_data), str(tmp_path / "moved"))
    for a, b in zip(expected, final_params(tmp_path / "moved")):
        np.testing.assert_array_equal(a, b)
