"""Data mixtures in the input pipeline (bertjax.data.pretraining.mixture, pipeline.py): shares against the
schedule, the source of a row independent of the process count, exact resume across a schedule boundary, the
past that may not change, epochs of a source that runs out, the masking-rate schedule, each bad input's sentence.
Sources are shard sets written from known rows; row ids (next_sentence_labels) say which source a row came from."""

import logging

import numpy as np
import pytest

from bertjax.config.schema import ConfigError, JobConfig
from bertjax.data.pretraining import mixture, records
from bertjax.data.pretraining.pipeline import InputPipeline, PipelineMismatch
from test_pipeline import PRED, SEQ, VOCAB, config, make_rows, take

SIZES = {"web": [60, 40], "code": [30], "wiki": [20, 20, 20]}  # records per shard
ID_BASE = {"web": 0, "code": 10_000, "wiki": 20_000}  # row ids tell the source


def write_source(directory, name: str) -> str:
    counts = SIZES[name]
    rows = make_rows(ID_BASE[name] + np.arange(sum(counts)), seed=len(name))
    start = 0
    for k, n in enumerate(counts):
        with records.RecordWriter(str(directory / f"shard-{k:03d}.tfrecord")) as w:
            w.write_block({f: rows[f][start : start + n] for f in records.FEATURES})
        start += n
    listing = [{"file": f"shard-{k:03d}.tfrecord", "records": n, "instances": n} for k, n in enumerate(counts)]
    tokens = {"web": 8000, "code": 1000, "wiki": 125}[name]
    records.write_metadata(
        str(directory), records.RecordSchema(SEQ, PRED), files=listing, counts={"tokens": tokens}, masked_lm_prob=0.15
    )
    return str(directory / "shard-*.tfrecord")


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("sources")
    out = {}
    for name in SIZES:
        (root / name).mkdir()
        out[name] = write_source(root / name, name)
    return out


def mixed(sources, text="web=a:0.5,code=b:0.3,wiki=c:0.2", schedule="", **kw) -> InputPipeline:
    spec = mixture.Mixture.parse(
        text, schedule, kw.pop("temperature", 1.0), kw.pop("interpolation", "step"), kw.pop("normalize", False)
    )
    kw.setdefault("mixture_block", 1)  # every row drawn on its own: these batches are 8 rows
    return InputPipeline(config("", sources=tuple(sources.items()), mixture=spec, **kw))


def source_of(batch) -> np.ndarray:
    return batch["next_sentence_labels"] // 10_000  # 0 web, 1 code, 2 wiki


def test_shares_follow_the_schedule_within_a_point_over_1000_steps(sources):
    pipe = mixed(sources, schedule="1000:web=0.2,code=0.2,wiki=0.6")
    drawn = []
    for _ in range(2000):
        batch = next(pipe)
        np.testing.assert_array_equal(source_of(batch), pipe.last_sources)  # the tag is the row's real source
        drawn.append(pipe.last_sources)
    for window, want in ((drawn[:1000], [0.5, 0.3, 0.2]), (drawn[1000:], [0.2, 0.2, 0.6])):
        shares = np.bincount(np.concatenate(window), minlength=3) / (len(window) * 8)
        assert np.abs(shares - want).max() <= 0.01, (shares, want)
    # Every batch is a stratified draw: each source within one row of its weight × rows.
    for step, got in enumerate(drawn):
        want = np.asarray([0.5, 0.3, 0.2] if step < 1000 else [0.2, 0.2, 0.6]) * 8
        assert np.all(np.abs(np.bincount(got, minlength=3) - want) < 1 + 1e-9)
    metrics = pipe.mix_metrics()  # all 2000 steps since no call before
    assert metrics["mix_web"] == pytest.approx(0.35, abs=0.005) and metrics["mix_wiki"] == pytest.approx(0.4, abs=0.005)
    assert pipe.mix_metrics()["mix_web"] == 0  # the interval starts again
    # A source that ran out repeated as an epoch does: wiki's 60 records were drawn ~6,400 / 60 times.
    assert metrics["epochs_wiki"] == pytest.approx(np.concatenate(drawn).tolist().count(2) / 60)
    assert metrics["epochs_wiki"] > 100


def test_blocks_of_rows_come_from_one_source_and_keep_the_shares(sources):
    pipe = mixed(sources, batch_size=64, mixture_block=8)
    drawn = []
    for batch in take(pipe, 1000):
        blocks = source_of(batch).reshape(8, 8)
        assert (blocks == blocks[:, :1]).all()  # each block of 8 rows is one source's
        drawn.append(blocks[:, 0])
    shares = np.bincount(np.concatenate(drawn), minlength=3) / 8000
    assert np.abs(shares - [0.5, 0.3, 0.2]).max() <= 0.01, shares
    with pytest.raises(ValueError, match=r"mixture_block=16 rows must divide the batch each process reads \(8 rows\)"):
        mixed(sources, mixture_block=16)


def test_a_linear_ramp_moves_the_weights_step_by_step(sources):
    pipe = mixed(sources, "web=a:1,code=b:0,wiki=c:0", "100:web=0,code=1", interpolation="linear")
    assert pipe.plan.weights_at(50) == pytest.approx([0.5, 0.5, 0.0])
    drawn = [np.bincount(take(pipe, 1)[0]["next_sentence_labels"] // 10_000, minlength=3) for _ in range(120)]
    code = np.array([d[1] for d in drawn])
    assert code[0] == 0 and code[-1] == 8 and np.all(np.diff(code[:100]) >= -1)  # rising, one row's jitter
    assert abs(code[:100].sum() / 800 - 0.5) < 0.02


def test_a_rows_source_does_not_depend_on_the_number_of_processes(sources):
    one = mixed(sources, batch_size=8)
    two = [mixed(sources, batch_size=4, process_index=p, process_count=2) for p in range(2)]
    for _ in range(30):
        next(one)
        for p in two:
            next(p)
        np.testing.assert_array_equal(one.last_sources, np.concatenate([p.last_sources for p in two]))
    assert one.mix_metrics() == two[0].mix_metrics() == two[1].mix_metrics()  # every process counts every draw


def test_auto_weights_follow_size_and_temperature(sources):
    by_size = mixed(sources, "web=a:auto,code=b:auto,wiki=c:auto").plan.weights_at(0)
    np.testing.assert_allclose(by_size, np.array([8000, 1000, 125]) / 9125)  # tokens from metadata.json
    flat = mixed(sources, "web=a:auto,code=b:auto,wiki=c:auto", temperature=3.0).plan.weights_at(0)
    want = np.array([8000, 1000, 125]) ** (1 / 3)
    np.testing.assert_allclose(flat, want / want.sum())
    # T in the schedule (annealing), wiki held back until step 10, fixed weights beside auto ones.
    pipe = mixed(sources, "web=a:auto,code=b:0.5,wiki=c:0", "0:T=1;10:T=3,wiki=auto")
    np.testing.assert_allclose(pipe.plan.weights_at(9), [0.5, 0.5, 0])
    later = np.array([8000, 125]) ** (1 / 3)
    np.testing.assert_allclose(
        pipe.plan.weights_at(10), [0.5 * later[0] / later.sum(), 0.5, 0.5 * later[1] / later.sum()]
    )


@pytest.mark.parametrize("stop", [9, 10, 11])  # before, at and after the boundary at step 10
def test_resume_across_a_schedule_boundary_is_exact(sources, tmp_path, stop):
    kw = dict(
        schedule="10:web=0.1,code=0.1,wiki=0.8",
        dynamic_masking=True,
        vocab=VOCAB,
        masked_lm_prob="0:0.3;10:0.1",
        batches_per_step=2,  # two micro-batches a step, as batch warmup reads them
    )
    straight = take(mixed(sources, **kw), 30)
    first = mixed(sources, **kw)
    take(first, 2 * stop)
    first.save_state(str(tmp_path / "state"))
    resumed = mixed(sources, **kw)
    resumed.restore_state(str(tmp_path / "state"))
    for want, got in zip(straight[2 * stop :], take(resumed, 30 - 2 * stop)):
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])
    assert resumed.mixing.drawn.sum() == 30 * 8  # the draws before the stop were restored, not counted again


def test_the_past_may_not_change_and_the_future_may(sources, tmp_path, caplog):
    kw = dict(dynamic_masking=True, vocab=VOCAB, masked_lm_prob="0:0.3;200:0.1")
    first = mixed(sources, schedule="20:web=0.1,code=0.1,wiki=0.8", **kw)
    take(first, 30)
    first.save_state(str(tmp_path / "state"))
    with pytest.raises(PipelineMismatch, match=r"other weights at step 20 .* trained up to step 30; change only"):
        mixed(sources, schedule="25:web=0.1,code=0.1,wiki=0.8", **kw).restore_state(str(tmp_path / "state"))
    with pytest.raises(PipelineMismatch, match=r"masked_lm_prob masks 0.2 at step 0 .* masked 0.3"):
        mixed(
            sources, schedule="20:web=0.1,code=0.1,wiki=0.8", **dict(kw, masked_lm_prob="0:0.2;50:0.1")
        ).restore_state(str(tmp_path / "state"))
    with pytest.raises(PipelineMismatch, match="keeps its mixture's sources"):
        InputPipeline(config(sources["web"], **kw)).restore_state(str(tmp_path / "state"))

    # A change beyond the horizon (the batches the stopped pipeline may have drawn ahead) applies at its step, and
    # the resumed run equals one that had the new schedule from the start.
    later = dict(schedule="20:web=0.1,code=0.1,wiki=0.8;100:web=1,code=0,wiki=0", **kw)
    straight = take(mixed(sources, **later), 110)
    future = mixed(sources, **later)
    with caplog.at_level(logging.INFO):
        future.restore_state(str(tmp_path / "state"))
    assert "the schedule after step 30 differs from the saved one" in caplog.text
    for want, got in zip(straight[30:], take(future, 80)):
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])
    assert all((source_of(b) == 0).all() for b in straight[100:])
    # One inside it applies from the horizon on, said in the log: the batches drawn before the stop stay as drawn.
    caplog.clear()
    soon = mixed(sources, schedule="20:web=0.1,code=0.1,wiki=0.8;40:web=1,code=0,wiki=0", **kw)
    with caplog.at_level(logging.INFO):
        soon.restore_state(str(tmp_path / "state"))
    assert f"so it applies from step {30 + mixture.HORIZON}" in caplog.text
    switch = 30 + mixture.HORIZON
    assert soon.plan.weights_at(switch - 1) == pytest.approx([0.1, 0.1, 0.8]) and soon.plan.weights_at(switch)[0] == 1


def test_the_masking_rate_follows_its_schedule(sources):
    pipe = mixed(
        sources, dynamic_masking=True, vocab=VOCAB, masked_lm_prob="0:0.3;20:0.1", max_predictions_per_seq=PRED
    )
    rates = [b["masked_lm_weights"].sum() / b["input_mask"].sum() for b in take(pipe, 40)]
    assert np.mean(rates[:20]) > 2 * np.mean(rates[20:])


def test_a_source_with_weight_at_some_step_needs_records(sources, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with records.RecordWriter(str(empty / "shard-000.tfrecord")):
        pass
    listing = [{"file": "shard-000.tfrecord", "records": 0, "instances": 0}]
    records.write_metadata(str(empty), records.RecordSchema(SEQ, PRED), files=listing, counts={"tokens": 0})
    given = dict(sources, code=str(empty / "shard-*.tfrecord"))
    with pytest.raises(ValueError, match=r"record files of source 'code' .* are empty"):
        mixed(given, "web=a:1,code=b:0,wiki=c:0", "50:web=0.5,code=0.5")
    mixed(given, "web=a:0.5,code=b:0,wiki=c:0.5")  # never drawn: its records are never needed


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("mixture", "web", r"entry 'web' is not NAME=SPEC:WEIGHT"),
        ("mixture", "web=a:0.5,web=b:0.5", "names the source 'web' twice"),
        ("mixture", "w-b=a:1", "source name 'w-b' must be a letter"),
        (
            "mixture",
            "web=a:0.5,code=b:0.4",
            r"sum to 0.9, not 1; make them sum to 1, or set config.data.mixture_normalize",
        ),
        ("mixture", "web=a:-1,code=b:2", "weight of 'web' is -1; weights must be ≥ 0"),
        ("mixture", "web=a:0.5,code=b", r"gives code no weight; add :WEIGHT"),
        ("mixture", "web=a:nan,code=b:1", r"weight of 'web' is 'nan', not a finite number; write a number"),
        ("mixture", "web=a:1,code=b:-inf", r"weight of 'code' is '-inf', not a finite number"),
        (
            "mixture_schedule",
            "100:web=0.5,news=0.5",
            r"names 'news' at step 100, which config.data.mixture does not define",
        ),
        ("mixture_schedule", "100:web=0.6,code=0.3", r"schedule at step 100 sum to 0.9, not 1"),
        ("mixture_schedule", "100:web=1;50:web=1", "step 50 after step 100"),
        ("mixture_schedule", "0:T=0", "the temperature 0 must be > 0"),
        ("mixture_temperature", -1.0, "the temperature -1 must be > 0"),
        ("mixture_interpolation", "cubic", "mixture_interpolation='cubic' is not one of"),
        ("masked_lm_prob", "0:0.3;x:0.1", r"'x' is not a step"),
        ("masked_lm_prob", "10:0.3", "its first entry must be at step 0"),
        ("masked_lm_prob", "0:0.3;10:1.5", "must be in \\(0, 1\\)"),
        ("corpus", "builtin:pydocs", "config.data.mixture and config.data.corpus both say what to train on"),
    ],
)
def test_each_bad_mixture_setting_is_one_sentence(field, value, message):
    data = {"mixture": "web=a:0.5,code=b:0.5", "dynamic_masking": True, field: value}
    with pytest.raises(ConfigError, match=message) as e:
        JobConfig().replace(data=data).data.validate()
    assert str(e.value).replace("e.g. ", "").count(". ") == 0 and str(e.value).endswith(".")  # one sentence


def test_a_source_without_a_weight_names_the_schedule_step_that_lacks_one():
    data = {"mixture": "web=a,code=b:0.5", "mixture_schedule": "0:web=0.5;100:web=1,code=0"}
    JobConfig().replace(data=data).data.validate()  # web's weight comes from the step-0 entry
    data = {"mixture": "web=a:0.5,code=b", "mixture_schedule": "100:web=1,code=0"}
    with pytest.raises(
        ConfigError, match=r"gives code no weight, and config.data.mixture_schedule has none for it at "
    ):
        JobConfig().replace(data=data).data.validate()


def test_a_schedule_of_rates_needs_dynamic_masking():
    with pytest.raises(ConfigError, match="set config.data.dynamic_masking=true"):
        JobConfig().replace(data={"masked_lm_prob": "0:0.3;9000:0.15"}).data.validate()


def test_normalised_weights_are_said_in_the_log(sources, caplog):
    with caplog.at_level(logging.INFO):
        pipe = mixed(sources, "web=a:3,code=b:1,wiki=c:0", normalize=True)
    assert pipe.plan.weights_at(0) == pytest.approx([0.75, 0.25, 0])
    assert "sum to 4; divided by it" in caplog.text
