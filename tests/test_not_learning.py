"""A pre-training run that is not learning says so once, in its log and in metrics.jsonl (issue 32). The
decision itself (`metrics.not_learning`) and the constant-prediction metric are tested in test_metrics.py."""

import json
import logging

import train_setup
from bertjax.jobs import main as train


def test_a_run_that_cannot_learn_warns_once_in_the_log_and_in_metrics_jsonl(pydocs_data, tmp_path, caplog):
    # lr 1e-9: after 4 steps the model is its random init, below its unigram baseline on held-out MLM
    config = train_setup.small_config(
        pydocs_data,
        **{
            "train.num_train_steps": 4,
            "eval.every_steps": 2,
            "optim.learning_rate": 1e-9,
            "checkpoint.every_steps": 100,
        },
    )
    with caplog.at_level(logging.WARNING):
        train.train_and_evaluate(config, str(tmp_path))
    warnings = [r.getMessage() for r in caplog.records if "not learning" in r.getMessage()]
    assert len(warnings) == 1, warnings  # evals at steps 2 and 4: the first past a quarter of the run warns
    assert warnings[0].startswith("step 2: this run is not learning: held-out MLM accuracy ")
    for setting in (
        "config.optim.learning_rate=1e-09",
        "config.optim.warmup_steps=2 of 4 steps",
        "config.train.global_batch_size=16",
        "config.eval.not_learning_after=0",
    ):
        assert setting in warnings[0], (setting, warnings[0])
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [2, 4]
    assert evals[0]["warning"] == warnings[0] and evals[0]["not_learning"] == 1.0
    assert "warning" not in evals[1] and "not_learning" not in evals[1]
    assert evals[0]["mlm_targets"] > 0 and evals[0]["mlm_accuracy"] < evals[0]["mlm_accuracy_baseline"]


def test_the_same_run_with_the_check_off_does_not_warn(pydocs_data, tmp_path, caplog):
    config = train_setup.small_config(
        pydocs_data,
        **{
            "train.num_train_steps": 2,
            "eval.every_steps": 1,
            "optim.learning_rate": 1e-9,
            "checkpoint.every_steps": 100,
            "eval.not_learning_after": 0.0,
        },
    )
    with caplog.at_level(logging.WARNING):
        train.train_and_evaluate(config, str(tmp_path))
    assert not [r for r in caplog.records if "not learning" in r.getMessage()]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [1, 2] and not any("warning" in r for r in rows)
