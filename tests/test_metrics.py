"""bertjax.training.metrics: weighted metrics and loss vs numpy, padding, merging, baselines, FLOPs, writers, log line."""

import functools
import json
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.training import metrics
from bertjax.models.bert import model as model_lib

# As an eval computes them (the train step leaves mlm_constant_prediction out).
pretraining_metrics = jax.jit(functools.partial(metrics.pretraining_metrics, constant_prediction=True))


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _batch(rng, b=4, p=3, v=7, padded_slots=True):
    batch = dict(
        mlm_logits=rng.normal(size=(b, p, v)).astype(np.float32),
        masked_lm_ids=rng.integers(0, v, (b, p)),
        masked_lm_weights=np.ones((b, p), np.float32),
        nsp_logits=rng.normal(size=(b, 2)).astype(np.float32),
        next_sentence_labels=rng.integers(0, 2, (b, 1)),
    )
    if padded_slots:
        batch["masked_lm_weights"][:, -1] = 0.0  # fewer predictions than slots
    return batch


def _numpy_reference(batch, example_weight=None):
    ew = np.ones(len(batch["masked_lm_ids"])) if example_weight is None else np.asarray(example_weight, float)
    lp = _log_softmax(batch["mlm_logits"].astype(np.float64))
    ids = batch["masked_lm_ids"]
    ce = -np.take_along_axis(lp, ids[..., None], -1)[..., 0]
    w = batch["masked_lm_weights"] * ew[:, None]
    correct = (lp.argmax(-1) == ids).astype(float)
    nlp = _log_softmax(batch["nsp_logits"].astype(np.float64))
    labels = batch["next_sentence_labels"].reshape(-1)
    nce = -nlp[np.arange(len(labels)), labels]
    ncorrect = (nlp.argmax(-1) == labels).astype(float)
    predicted = set(lp.argmax(-1)[w > 0].tolist())
    return dict(
        mlm_loss=(ce * w).sum() / w.sum(),
        mlm_accuracy=(correct * w).sum() / w.sum(),
        mlm_constant_prediction=predicted.pop() if len(predicted) == 1 else -1,
        nsp_loss=(nce * ew).sum() / ew.sum(),
        nsp_accuracy=(ncorrect * ew).sum() / ew.sum(),
        loss=(ce * w).sum() / (w.sum() + 1e-5) + (nce * ew).sum() / ew.sum(),
        mlm_count=w.sum(),
        mlm_loss_squares=(ce * ce * w).sum() / w.sum(),
    )


def test_metrics_and_loss_match_numpy():
    batch = _batch(np.random.default_rng(0))
    ref = _numpy_reference(batch)
    got = metrics.normalize(pretraining_metrics(**batch))
    assert set(got) == {
        "mlm_loss",
        "mlm_accuracy",
        "mlm_constant_prediction",
        "mlm_loss_squares",
        "nsp_loss",
        "nsp_accuracy",
    }
    assert "mlm_constant_prediction" not in metrics.pretraining_metrics(**batch)  # the train step's
    for key in got:
        assert got[key] == pytest.approx(ref[key], rel=1e-5), key
    assert 0 < got["mlm_accuracy"] < 1  # the data makes accuracy non-trivial
    value = jax.jit(metrics.loss)(**batch)
    assert value.dtype == jnp.float32 and value.shape == ()
    assert float(value) == pytest.approx(ref["loss"], rel=1e-5)
    value2, m2 = metrics.loss_and_metrics(**batch)
    assert float(value2) == pytest.approx(float(value), rel=1e-6)
    assert float(m2["mlm_loss"][1]) == ref["mlm_count"]


def test_bfloat16_logits_give_float32_loss():
    batch = _batch(np.random.default_rng(1))
    batch["mlm_logits"] = jnp.asarray(batch["mlm_logits"], jnp.bfloat16)
    batch["nsp_logits"] = jnp.asarray(batch["nsp_logits"], jnp.bfloat16)
    value, m = metrics.loss_and_metrics(**batch)
    assert value.dtype == jnp.float32 and m["mlm_loss"][0].dtype == jnp.float32


def test_an_eval_result_has_the_standard_errors_of_its_mlm_figures():
    batch = _batch(np.random.default_rng(5), b=16, p=5)
    ref = _numpy_reference(batch)
    got = metrics.eval_result(pretraining_metrics(**batch))
    n, p = ref["mlm_count"], ref["mlm_accuracy"]
    assert got["mlm_targets"] == n and "mlm_loss_squares" not in got
    assert got["mlm_accuracy_stderr"] == pytest.approx(np.sqrt(p * (1 - p) / n))
    variance = ref["mlm_loss_squares"] - ref["mlm_loss"] ** 2
    assert got["mlm_loss_stderr"] == pytest.approx(np.sqrt(variance / n), rel=1e-4)


def test_mlm_only_has_no_nsp_terms():
    batch = _batch(np.random.default_rng(2))
    batch.pop("nsp_logits"), batch.pop("next_sentence_labels")
    got = pretraining_metrics(**batch)
    assert set(got) == {"mlm_loss", "mlm_accuracy", "mlm_constant_prediction", "mlm_loss_squares"}
    ref = _numpy_reference(_batch(np.random.default_rng(2)))
    assert float(metrics.loss(**batch)) == pytest.approx(ref["loss"] - ref["nsp_loss"], rel=1e-5)


def test_example_weight_zero_rows_are_ignored():
    rng = np.random.default_rng(3)
    real = _batch(rng, b=3)
    padding = _batch(rng, b=2)
    padding["mlm_logits"] *= 100.0  # garbage that would move every metric if it counted
    padded = {k: np.concatenate([real[k], padding[k]]) for k in real}
    ew = np.array([1, 1, 1, 0, 0], np.float32)
    got = metrics.normalize(pretraining_metrics(**padded, example_weight=ew))
    want = metrics.normalize(pretraining_metrics(**real))
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-6), key
    loss = jax.jit(metrics.loss)
    assert float(loss(**padded, example_weight=ew)) == pytest.approx(float(loss(**real)), rel=1e-6)
    with_padding = metrics.normalize(pretraining_metrics(**padded))
    assert with_padding["mlm_loss"] != pytest.approx(want["mlm_loss"], rel=1e-3)


def test_merging_batches_equals_the_concatenation():
    rng = np.random.default_rng(4)
    batches = [_batch(rng, b=b) for b in (2, 5, 3)]
    for b in batches:  # uneven numbers of real predictions per batch
        b["masked_lm_weights"][0, :] = 0.0
    merged = None
    for b in batches:
        merged = metrics.merge(merged, pretraining_metrics(**b))
    whole = pretraining_metrics(**{k: np.concatenate([b[k] for b in batches]) for k in batches[0]})
    for key in whole:  # (sum, count); mlm_constant_prediction's sum is a vector
        for part in (0, 1):
            np.testing.assert_allclose(np.asarray(merged[key][part]), np.asarray(whole[key][part]), rtol=1e-5)
    got, want = metrics.normalize(merged), metrics.normalize(whole)
    assert got == pytest.approx(want, rel=1e-6)
    # a mean of per-batch means would be wrong here
    per_batch = np.mean([metrics.normalize(pretraining_metrics(**b))["mlm_accuracy"] for b in batches])
    assert per_batch != pytest.approx(want["mlm_accuracy"], rel=1e-6)
    with pytest.raises(ValueError, match="different keys"):
        metrics.merge(merged, {"mlm_loss": (1.0, 1.0)})


def test_normalize_zero_count_is_nan():
    assert math.isnan(metrics.normalize({"x": (jnp.float32(0), jnp.float32(0))})["x"])


def test_baselines_hand_computed():
    batches = [
        dict(
            masked_lm_ids=np.array([[5, 5, 2], [3, 5, 0]]),
            masked_lm_weights=np.array([[1, 1, 1], [1, 1, 0]]),
            next_sentence_labels=np.array([[0], [1]]),
        ),
        dict(
            masked_lm_ids=np.array([[2, 2, 2], [9, 9, 9]]),
            masked_lm_weights=np.array([[1, 1, 0], [1, 1, 1]]),
            next_sentence_labels=np.array([[0], [0]]),
            example_weight=np.array([1, 0]),
        ),  # row 2 is padding
    ]
    # counted targets: 5,5,2 | 3,5 | 2,2  → 5 occurs 3 times out of 7; NSP labels counted: 0,1,0 → 2/3
    got = metrics.baselines(batches)
    assert got["mlm_accuracy_baseline"] == pytest.approx(3 / 7)
    assert got["nsp_accuracy_baseline"] == pytest.approx(2 / 3)
    mlm_only = [{k: v for k, v in b.items() if k != "next_sentence_labels"} for b in batches]
    assert set(metrics.baselines(mlm_only)) == {"mlm_accuracy_baseline"}


def test_flops_per_sequence_hand_count():
    cfg = model_lib.BertConfig(
        vocab_size=10, hidden_size=4, num_hidden_layers=2, num_attention_heads=2, intermediate_size=8
    )
    # per layer, L=3, H=4, I=8: QKV+out 4·2·3·4·4 = 384; scores+context 2·2·3·3·4 = 144; FFN 2·2·3·4·8 = 384
    per_layer = 384 + 144 + 384
    # pooler 2·4·4 = 32, NSP 2·4·2 = 16, MLM transform on P=2: 2·2·4·4 = 64, vocab 2·2·4·10 = 160
    forward = 2 * per_layer + 32 + 16 + 64 + 160
    assert forward == 2096
    assert metrics.flops_per_sequence(cfg, 3, 2, training=False) == forward
    assert metrics.flops_per_sequence(cfg, 3, 2) == 3 * forward
    # without the gather the head runs on all 3 positions
    assert metrics.flops_per_sequence(cfg, 3, None, training=False) == forward + 2 * 4 * 4 + 2 * 4 * 10


def test_flops_close_to_6nd_for_base():
    cfg = model_lib.config_for_size("base")
    # the standard estimate: 6 × non-embedding params × tokens + attention; ours must be the same order
    n_dense = 12 * (4 * 768 * 768 + 2 * 768 * 3072)
    estimate = 6 * n_dense * 128 + 12 * 12 * 768 * 128**2
    got = metrics.flops_per_sequence(cfg, 128, 20)
    assert estimate < got < 1.1 * estimate  # plus the MLM head on 20 positions


def test_throughput_and_peak_table():
    t = metrics.throughput(
        step_time_s=0.5, global_batch_size=32, seq_len=128, flops_per_seq=1e9, peak_flops=1e12, num_devices=2
    )
    assert t == pytest.approx({"seq_per_s": 64.0, "tokens_per_s": 8192.0, "mfu": 0.032})
    assert "mfu" not in metrics.throughput(0.5, 32, 128, flops_per_seq=1e9, peak_flops=None)
    assert metrics.peak_flops_per_device("TPU v4") == 275e12
    assert metrics.peak_flops_per_device("TPU v5 lite") == 197e12
    assert metrics.peak_flops_per_device("TPU v5p") == 459e12
    assert metrics.peak_flops_per_device("NVIDIA H100 80GB HBM3", "bfloat16") == 989e12
    assert metrics.peak_flops_per_device("NVIDIA H100 80GB HBM3", "float32") == 494.5e12
    assert metrics.peak_flops_per_device("cpu") is None


def test_throughput_tracker_excludes_first_step_and_pauses():
    now = [100.0]
    tracker = metrics.Throughput(num_train_steps=1000, clock=lambda: now[0])
    now[0] = 130.0  # compile + first step: never measured
    assert tracker.update(1) == {}
    now[0] = 140.0
    with tracker.paused():  # eval / checkpoint time
        now[0] = 190.0
    now[0] = 200.0
    out = tracker.update(101)  # 100 steps in 70 s − 50 s paused = 20 s
    assert out["step_time_s"] == pytest.approx(0.2)
    assert out["steps_per_s"] == pytest.approx(5.0)
    assert out["eta_s"] == pytest.approx(899 * 0.7)  # the pause recurs: 70 s of wall time per 100 steps
    assert out["input_wait_fraction"] == 0  # no batch was waited for
    now[0] = 210.0
    tracker.input_wait(2.5)  # 2.5 s of the 10 s waiting for batches
    out = tracker.update(151)
    assert out["input_wait_fraction"] == pytest.approx(0.25)
    assert "input-bound: 25% of the time waiting for batches" in metrics.format_log_line(out)
    assert "input-bound" not in metrics.format_log_line(dict(out, input_wait_fraction=0.01))
    assert out["step_time_s"] == pytest.approx(0.2)
    assert out["eta_s"] == pytest.approx(849 * 80 / 150)  # the mean since the clock started, not the last 50


def test_a_batch_fetched_while_the_step_still_runs_held_nothing_up():
    """loop.next_batch: steps are dispatched asynchronously, so a fetch that ends while the step in flight still
    runs cost nothing (the ModernBERT demo read 14% "input-bound" when every fetch counted); one that ends after
    the step finished counts whole."""
    from bertjax.training import loop

    class Step:
        def __init__(self, ready):
            self.ready = ready

        def is_ready(self):
            return self.ready

    def slow_batches():
        while True:
            time.sleep(0.05)
            yield {"input_ids": np.zeros((2, 4))}

    batches = slow_batches()
    batch, held_up = loop.next_batch(batches, Step(ready=False))
    assert held_up == 0.0 and batch["input_ids"].shape == (2, 4)
    _, held_up = loop.next_batch(batches, Step(ready=True))
    assert held_up >= 0.05
    _, held_up = loop.next_batch(batches, jnp.zeros(3))  # a finished jax array: the device was idle
    assert held_up >= 0.05


def test_log_line():
    line = metrics.format_log_line(
        dict(
            step=100,
            num_train_steps=1000,
            loss=2.5,
            mlm_accuracy=0.12345,
            nsp_accuracy=0.5,
            learning_rate=1e-4,
            grad_norm=1.25,
            seq_per_s=123.4,
            tokens_per_s=15795.2,
            mfu=0.456,
            eta_s=3661,
        )
    )
    for part in (
        "step 100/1000",
        "loss 2.5000",
        "mlm_acc 12.35%",
        "nsp_acc 50.00%",
        "lr 1.000e-04",
        "grad_norm 1.250",
        "123.4 seq/s",
        "15,795 tok/s",
        "MFU 45.6%",
        "ETA 1:01:01",
    ):
        assert part in line, (part, line)
    short = metrics.format_log_line(dict(step=7, loss=1.0))
    assert short == "step 7 | loss 1.0000"
    assert metrics.format_eta(90061) == "25:01:01"


def _read_events(workdir):
    import tensorflow as tf

    values = {}
    for path in tf.io.gfile.glob(f"{workdir}/events.out.tfevents.*"):
        for record in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for v in event.summary.value:
                values[(v.tag, event.step)] = float(tf.make_ndarray(v.tensor))
    return values


def test_metric_writer_jsonl_and_tensorboard(tmp_path):
    workdir = str(tmp_path / "run")
    with metrics.MetricWriter(workdir, is_primary=True) as writer:
        writer.write(10, {"loss": np.float32(2.5), "mlm_accuracy": jnp.float32(0.25)})
        writer.write(20, {"mlm_accuracy": 0.5, "mlm_accuracy_baseline": 0.1, "nsp_loss": float("nan")}, kind="eval")
        # flushed after each write: readable while the writer is still open
        lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
        assert len(lines) == 2
    records = [json.loads(line) for line in lines]
    assert records[0] == {"step": 10, "kind": "train", "loss": 2.5, "mlm_accuracy": 0.25}
    assert records[1] == {
        "step": 20,
        "kind": "eval",
        "mlm_accuracy": 0.5,
        "mlm_accuracy_baseline": 0.1,
        "nsp_loss": None,
    }
    events = _read_events(workdir)
    assert events[("train/loss", 10)] == pytest.approx(2.5)
    assert events[("eval/mlm_accuracy_baseline", 20)] == pytest.approx(0.1)
    # a resumed run appends
    with metrics.MetricWriter(workdir, is_primary=True, tensorboard=False) as writer:
        writer.write(30, {"loss": 1.0})
    assert [json.loads(x)["step"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()] == [
        10,
        20,
        30,
    ]


def test_metric_writer_is_a_noop_off_process_zero(tmp_path):
    writer = metrics.MetricWriter(str(tmp_path / "other"), is_primary=False)
    writer.write(1, {"loss": 1.0})
    writer.close()
    assert not (tmp_path / "other").exists()


def test_metric_writer_rejects_non_numbers(tmp_path):
    with metrics.MetricWriter(str(tmp_path), is_primary=True, tensorboard=False) as writer:
        with pytest.raises(TypeError, match="'note'"):
            writer.write(1, {"note": "hello"})


def test_accuracy_argmax_is_jnp_argmax_with_ties_and_nan():
    rng = np.random.default_rng(0)
    logits = rng.integers(0, 4, (64, 50)).astype(np.float32)  # many ties: the first maximum wins
    logits[0] = np.nan
    np.testing.assert_array_equal(metrics._argmax(jnp.asarray(logits))[1:], np.argmax(logits[1:], axis=-1))
    assert metrics._argmax(jnp.asarray(logits))[0] == 50  # NaN logits: no class is right


@pytest.mark.parametrize("rewrite", [False, True])
def test_metrics_file_continues_across_runs_appended_or_rewritten_whole(tmp_path, rewrite):
    """metrics.jsonl: a resumed run continues it, appending locally; on an object store (gs://, no appends)
    each flush rewrites the whole object, starting from what an earlier run left."""
    path = str(tmp_path / "metrics.jsonl")
    for run in range(2):
        f = metrics._AppendOnlyFile(path, rewrite=rewrite)
        f.write(f"run {run} a\n")
        f.flush()
        assert (tmp_path / "metrics.jsonl").read_text().endswith(f"run {run} a\n")  # flushed, visible
        f.write(f"run {run} b\n")
        f.flush()
        f.close()
    assert (tmp_path / "metrics.jsonl").read_text() == "run 0 a\nrun 0 b\nrun 1 a\nrun 1 b\n"
    local = metrics._AppendOnlyFile(path)  # by default a local path appends
    assert local._local is not None
    local.close()


# --- A run that is not learning ---------------------------------------------------------------------------


def _collapsed(rng, token, b=3, p=4, v=40):
    """A batch whose every MLM prediction is `token` (its logit far above the rest)."""
    batch = _batch(rng, b=b, p=p, v=v)
    batch["mlm_logits"][..., token] += 100.0
    return batch


def test_constant_prediction_is_exact_across_batches_and_ignores_padding():
    rng = np.random.default_rng(7)
    a, b = _collapsed(rng, 37), _collapsed(rng, 37)
    b["mlm_logits"][0, -1, 5] += 1000.0  # a padded slot (weight 0) predicting something else does not count
    merged = metrics.merge(pretraining_metrics(**a), pretraining_metrics(**b))
    assert metrics.normalize(merged)["mlm_constant_prediction"] == 37
    b["mlm_logits"][0, 0, 5] += 1000.0  # one real prediction of another id among 18
    assert (
        metrics.normalize(metrics.merge(pretraining_metrics(**a), pretraining_metrics(**b)))["mlm_constant_prediction"]
        == -1
    )
    # each batch constant, but not on one token: not a constant prediction (a per-batch mode would say it is)
    c = _collapsed(rng, 36)
    assert metrics.normalize(pretraining_metrics(**c))["mlm_constant_prediction"] == 36
    assert (
        metrics.normalize(metrics.merge(pretraining_metrics(**a), pretraining_metrics(**c)))["mlm_constant_prediction"]
        == -1
    )
    assert metrics.normalize(pretraining_metrics(**_batch(rng, v=40)))["mlm_constant_prediction"] == -1


# baseline 0.1 over 900 targets: standard error sqrt(0.1 * 0.9 / 900) = 0.01
FLAT = dict(
    mlm_accuracy=0.105,
    mlm_accuracy_baseline=0.1,
    mlm_targets=900.0,
    mlm_constant_prediction=-1.0,
    nsp_accuracy=0.6,
    nsp_accuracy_baseline=0.55,
)


def test_not_learning_within_a_standard_error_of_the_baseline_after_the_share():
    assert metrics.not_learning(FLAT, step=24, num_train_steps=100, after=0.25) is None  # too early to judge
    assert metrics.not_learning(FLAT, step=100, num_train_steps=100, after=0.0) is None  # check off
    why = metrics.not_learning(FLAT, step=25, num_train_steps=100, after=0.25)
    assert why == (
        "held-out MLM accuracy 10.50% has not left its unigram baseline 10.00% (standard error 1.00% "
        "over 900 masked targets)"
    )
    assert metrics.not_learning(dict(FLAT, mlm_accuracy=0.05), 50, 100, 0.25).startswith("held-out MLM accuracy 5.00%")
    # two standard errors above: learning
    assert metrics.not_learning(dict(FLAT, mlm_accuracy=0.12), 50, 100, 0.25) is None
    # the same gap over 100 targets (standard error 3%) is within the noise
    assert metrics.not_learning(dict(FLAT, mlm_accuracy=0.12, mlm_targets=100.0), 50, 100, 0.25) is not None
    assert metrics.not_learning(dict(FLAT, nsp_accuracy=0.5), 50, 100, 0.25).endswith(
        "and NSP accuracy 50.00% is not above its majority class 55.00%"
    )


def test_not_learning_when_every_prediction_is_one_token_whatever_the_accuracy():
    collapsed = dict(FLAT, mlm_accuracy=0.3, mlm_constant_prediction=1012.0)
    assert metrics.not_learning(collapsed, 50, 100, 0.25) == "every held-out MLM prediction is the same token (id 1012)"
    assert metrics.not_learning(dict(FLAT, mlm_accuracy=0.3), 50, 100, 0.25) is None
    assert metrics.not_learning({"accuracy": 0.5}, 50, 100, 0.25) is None  # fine-tuning's evals: nothing to judge


def test_metric_writer_keeps_notes_in_jsonl_only(tmp_path):
    with metrics.MetricWriter(str(tmp_path), is_primary=True, tensorboard=False) as writer:
        writer.write(5, {"not_learning": 1.0}, kind="eval", notes={"warning": "step 5: this run is not learning"})
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {
        "step": 5,
        "kind": "eval",
        "not_learning": 1.0,
        "warning": "step 5: this run is not learning",
    }


def test_event_file_records_are_what_tensorflow_serializes():
    """bertjax/training/event_file.py writes TensorBoard events without TensorFlow: each Event is byte-identical to the
    one TensorFlow builds for tf.summary.scalar's float32 tensor and scalars-plugin metadata."""
    import tensorflow as tf
    from tensorflow.core.framework import summary_pb2

    from bertjax.training import event_file

    values = {"train/loss": 2.5, "train/learning_rate": 3e-5, "eval/accuracy": float("nan")}
    expected = tf.compat.v1.Event(wall_time=1700000000.25, step=1234)
    for tag, value in values.items():
        v = expected.summary.value.add(tag=tag)
        v.tensor.CopyFrom(tf.make_tensor_proto(value, tf.float32))
        v.metadata.plugin_data.plugin_name = "scalars"
        v.metadata.data_class = summary_pb2.DATA_CLASS_SCALAR
    ours = event_file.event(
        1234, b"".join(event_file.scalar_value(t, v) for t, v in values.items()), wall_time=1700000000.25
    )
    assert ours == expected.SerializeToString()
    header = tf.compat.v1.Event(wall_time=5.0, file_version="brain.Event:2")
    assert event_file.event(0, wall_time=5.0, file_version=b"brain.Event:2") == header.SerializeToString()
