"""Batch-size warmup (config.train.batch_warmup_tokens): the batch grows by micro-batches of one compiled step,
a step of n of k micro-batches is exactly a step of an n-micro-batch batch, the job logs the rows it ran and
resumes exactly mid-warmup, and settings that cannot work are one sentence."""

import shutil

import jax
import numpy as np
import pytest

import train_setup
from bertjax.training import batch_warmup
from bertjax.training import checkpoint as checkpoint_lib
from bertjax.jobs import main as train
from bertjax.training import trainer as trainer_lib
from bertjax.config.schema import JobConfig
from test_train import batches


def warmup_config(pydocs_data, steps: int = 8, **train_fields):
    c = train_setup.small_config(pydocs_data, **{"train.num_train_steps": steps, "checkpoint.every_steps": 1})
    # micro-batches of 8 rows, one a device on the 8-device mesh; the batch from 8 rows to 32 over 80 rows' tokens
    c.train.update(
        dict(
            dict(global_batch_size=32, micro_batches=4, batch_warmup_start=8, batch_warmup_tokens=80 * train_setup.SEQ),
            **train_fields,
        )
    )
    c.eval.every_steps = 1000
    return c


def test_the_batch_grows_by_micro_batches_with_the_tokens_seen(pydocs_data):
    job = JobConfig.from_configdict(warmup_config(pydocs_data))
    ramp = batch_warmup.BatchWarmup(job.train, train_setup.SEQ)
    # 8 rows a step until 32 rows (a third of the way from 1 to 4 micro-batches over 80 rows' tokens) have gone by
    assert [ramp.rows_at(s) for s in range(10)] == [8, 8, 8, 8, 16, 16, 24, 32, 32, 32] and ramp.steps() == 7


def test_a_step_of_two_of_four_micro_batches_is_a_step_of_a_two_micro_batch_batch(pydocs_data):
    rows = batches(pydocs_data, 1, batch_size=16)[0]  # 2 micro-batches of 8 rows
    small = JobConfig.from_configdict(train_setup.small_config(pydocs_data)).replace(
        train={"global_batch_size": 16, "micro_batches": 2}, mesh={"shape": (1, 1, 1)}
    )
    grown = JobConfig.from_configdict(warmup_config(pydocs_data)).replace(mesh={"shape": (1, 1, 1)})
    states = []
    for job, batch in ((small, rows), (grown, batch_warmup.spread(rows, 2, 4))):
        trainer = trainer_lib.setup(job, jax.devices()[:1])
        state, metrics = trainer.train_step(trainer.init_state(), trainer.global_batch(batch))
        states.append((jax.tree.leaves(jax.device_get(state.params)), float(metrics["loss"][0])))
    (a, loss_a), (b, loss_b) = states
    assert loss_a == loss_b  # dropout on: the same keys per micro-batch, the empty ones not run
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_the_job_logs_its_rows_and_resumes_exactly_mid_warmup(pydocs_data, tmp_path, caplog):
    with caplog.at_level("INFO", logger="bertjax"):
        train.train_and_evaluate(warmup_config(pydocs_data), str(tmp_path / "whole"))
    assert "batch warmup: 8 → 32 rows over the first 2,560 tokens (7 steps)" in caplog.text
    rows = [
        r
        for r in map(__import__("json").loads, (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines())
        if r["kind"] == "train"
    ]
    assert [r["batch_rows"] for r in rows] == [8, 8, 8, 8, 16, 16, 24, 32]
    shutil.copytree(tmp_path / "whole", tmp_path / "cut")
    for step in range(4, 9):  # as if stopped after step 3's save
        shutil.rmtree(tmp_path / "cut" / "checkpoints" / str(step))
    train.train_and_evaluate(warmup_config(pydocs_data), str(tmp_path / "cut"))
    for x, y in zip(
        *(jax.tree.leaves(checkpoint_lib.load_params(str(tmp_path / name))[1]) for name in ("whole", "cut"))
    ):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize(
    "fields,pattern",
    [
        (dict(micro_batches=1), r"grows the batch by micro-batches, but config\.train\.micro_batches=1"),
        (dict(batch_warmup_start=12), r"batch_warmup_start=12 must be a whole number of micro-batches of 8 rows"),
        (dict(batch_warmup_start=32), r"batch_warmup_start=32 must be .* below global_batch_size"),
    ],
)
def test_settings_that_cannot_warm_up_are_one_sentence(pydocs_data, fields, pattern):
    with pytest.raises(ValueError, match=pattern):
        JobConfig.from_configdict(warmup_config(pydocs_data, **fields))
