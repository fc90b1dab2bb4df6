"""Warmup-stable-decay as a workflow: a decay branch (`config.train.branch_from=W/STEP`) goes on from a stable
run's whole state in its own workdir and ends where one run that decayed at that step ends; it resumes
from its own checkpoints exactly; a branch that cannot be taken is one sentence."""

import shutil

import jax
import numpy as np
import pytest

import train_setup
from bertjax.training import checkpoint as checkpoint_lib
from bertjax.jobs import main as train

WARMUP, PEAK = 2, 1e-3


def config(pydocs_data: str, steps: int, **optim):
    c = train_setup.small_config(
        pydocs_data,
        **{
            "train.num_train_steps": steps,
            "checkpoint.every_steps": 1,
            "optim.warmup_steps": WARMUP,
            "optim.learning_rate": PEAK,
        },
    )
    c.eval.every_steps = 1000
    c.optim.update(optim)
    return c


def params_of(workdir) -> list[np.ndarray]:
    return [np.asarray(a) for a in jax.tree.leaves(checkpoint_lib.load_params(str(workdir))[1])]


@pytest.fixture(scope="module")
def stable(pydocs_data, tmp_path_factory):
    """A stable phase: warmup, then the peak held (schedule=constant), a checkpoint every step."""
    workdir = tmp_path_factory.mktemp("stable")
    train.train_and_evaluate(config(pydocs_data, 6, schedule="constant"), str(workdir))
    return workdir


def test_a_branch_ends_where_one_run_that_decayed_there_ends(stable, pydocs_data, tmp_path, caplog):
    decay = dict(schedule="wsd", decay_shape="1-sqrt", decay_steps=3)
    with caplog.at_level("INFO", logger="bertjax"):
        train.train_and_evaluate(
            dict_config(config(pydocs_data, 7, **decay), branch_from=f"{stable}/4"), str(tmp_path / "branch")
        )
    assert f"branched from {stable}/4 at step 4" in caplog.text
    # One run with the decay over steps 4..7 from the start: the same learning rates at every step, the same data.
    # Its steps 0..3 are another program than the stable run's (another schedule's formula, the same values): equal
    # where the compiler builds both alike (XLA:CPU's default emitters: bit for bit), float32 rounding apart where
    # it fuses them differently (the suite's faster-compiling emitters: up to 1e-7). A branch that lost any of the state
    # (moments, step, rng, data position) ends 1e-2 away (its moments reset: 0.011).
    train.train_and_evaluate(config(pydocs_data, 7, **decay), str(tmp_path / "straight"))
    for a, b in zip(params_of(tmp_path / "straight"), params_of(tmp_path / "branch")):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    # The stable run itself is untouched: the branch wrote only into its own workdir.
    assert sorted(int(s.name) for s in (stable / "checkpoints").iterdir() if s.name.isdigit())[-1] == 6

    # Stopped after step 5's save, the branch resumes from its own checkpoint, not the stable run's, and ends
    # bitwise where it ended whole.
    shutil.copytree(tmp_path / "branch", tmp_path / "cut")
    for step in (6, 7):
        shutil.rmtree(tmp_path / "cut" / "checkpoints" / str(step))
    caplog.clear()
    with caplog.at_level("INFO", logger="bertjax"):
        train.train_and_evaluate(
            dict_config(config(pydocs_data, 7, **decay), branch_from=f"{stable}/4"), str(tmp_path / "cut")
        )
    assert "resumed from" in caplog.text and "branched from" not in caplog.text
    for a, b in zip(params_of(tmp_path / "branch"), params_of(tmp_path / "cut")):
        np.testing.assert_array_equal(a, b)


def dict_config(c, **train):
    c.train.update(train)
    return c


@pytest.mark.parametrize(
    "branch_from,steps,pattern",
    [
        ("{stable}/5", 6, r"starts at step 5, inside the decay \(steps 3–6\); set config\.train\.num_train_steps=8"),
        ("{stable}/9", 12, r"has no step 9, only \[1, 2, 3, 4, 5, 6\]"),
        ("{stable}/6", 6, r"starts at step 6, at or after config\.train\.num_train_steps=6"),
        ("{tmp}/nothing", 6, r"is not a bertjax workdir \(no checkpoints/ in it\)"),
    ],
)
def test_a_branch_that_cannot_be_taken_is_one_sentence(stable, pydocs_data, tmp_path, branch_from, steps, pattern):
    c = dict_config(
        config(pydocs_data, steps, schedule="wsd", decay_steps=3),
        branch_from=branch_from.format(stable=stable, tmp=tmp_path),
    )
    with pytest.raises((ValueError, FileNotFoundError), match=pattern):
        train.train_and_evaluate(c, str(tmp_path / "branch"))


def test_branch_from_and_init_from_together_are_refused(stable, pydocs_data, tmp_path):
    c = dict_config(config(pydocs_data, 6), branch_from=str(stable), init_from=str(stable))
    with pytest.raises(ValueError, match="both say where the run starts"):
        train.train_and_evaluate(c, str(tmp_path / "branch"))
