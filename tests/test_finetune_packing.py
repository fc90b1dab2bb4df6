"""Packed fine-tuning rows (bertjax/finetuning/example_packing.py): a packed batch gives each example the loss and
the gradients of its padded row, each step holds the same examples as padded rows would (so the schedule and
exact resume are unchanged), evaluation comes back one row per example in input order, and a whole job trains
to the padded job's results."""

from __future__ import annotations

import json
import pathlib
import random
import runpy

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.finetuning import tasks
from bertjax.jobs import finetune as finetuning, predict as prediction
from bertjax.finetuning import heads
from bertjax.models.bert import model as model_lib
from bertjax.models.bert import heads as bert_heads
from bertjax.finetuning import arrays as arrays_lib
from bertjax.finetuning import example_packing
from bertjax.data.pretraining.pipeline import EXAMPLE_WEIGHT

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIG = model_lib.BertConfig(
    vocab_size=50,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=32,
)


def padded_examples(n: int, seq: int, task: str, seed: int = 0, regression: bool = False) -> dict[str, np.ndarray]:
    """n examples of 3..seq tokens, two segments, as fine-tuning's padded rows: [CLS] ... [SEP] ... [SEP]."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, seq + 1, n)
    lengths[: n // 4] = rng.integers(3, 8, n // 4)  # many short ones, as real short-text tasks have
    arrays = {
        "input_ids": np.zeros((n, seq), np.int32),
        "segment_ids": np.zeros((n, seq), np.int32),
        "input_mask": np.zeros((n, seq), np.int32),
    }
    for i, length in enumerate(lengths):
        arrays["input_ids"][i, :length] = np.concatenate([[2], rng.integers(5, 50, length - 2), [3]])
        arrays["segment_ids"][i, length // 2 : length] = 1
        arrays["input_mask"][i, :length] = 1
    if task == "sequence_classification":
        arrays["label"] = (
            rng.normal(size=n).astype(np.float32) if regression else rng.integers(0, 3, n).astype(np.int32)
        )
    else:
        arrays["label_ids"] = rng.integers(0, 3, (n, seq)).astype(np.int32)
        arrays["label_weights"] = ((rng.random((n, seq)) < 0.6) & (arrays["input_mask"] > 0)).astype(np.float32)
    return arrays


@pytest.mark.parametrize(
    "task,regression",
    [("sequence_classification", False), ("sequence_classification", True), ("token_classification", False)],
)
def test_a_packed_batch_gives_each_example_its_padded_loss_and_gradients(task, regression):
    """The test pre-training's packing has: per-example outputs, the batch loss and every gradient of packed
    rows equal those of the padded rows (dropout off), on examples that never see each other."""
    seq, n = 32, 12
    arrays = padded_examples(n, seq, task, regression=regression)
    labels = 1 if regression else 3
    padded_model = bert_heads.BertForFinetuning(CONFIG, tasks.get(task).head(labels))
    packed_model = bert_heads.BertForFinetuning(CONFIG, tasks.get(task).head(labels), packed=True)
    params = padded_model.init(
        jax.random.PRNGKey(0), arrays["input_ids"][:1], arrays["segment_ids"][:1], arrays["input_mask"][:1]
    )["params"]
    params = nn.meta.unbox(params)
    padded = dict(arrays, **{EXAMPLE_WEIGHT: np.ones(n, np.float32)})
    lengths = example_packing.example_lengths(arrays)
    groups = example_packing.assign(lengths, seq, 0)
    assert len(groups) < n / 2 and max(map(len, groups)) > 2  # several examples a row
    layout = example_packing.Layout(len(groups) + 1, max(map(len, groups)), seq)  # one empty row too
    packed = example_packing.pack(arrays, np.arange(n), groups, layout, lengths)

    expected, got = (
        jax.value_and_grad(_loss, argnums=1, has_aux=True)(model, params, batch, task, regression, seq)
        for model, batch in ((padded_model, padded), (packed_model, packed))
    )
    (expected_loss, expected_sums), expected_grads = expected
    (got_loss, got_sums), got_grads = got
    np.testing.assert_allclose(got_loss, expected_loss, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), got_grads, expected_grads)
    assert float(got_sums["instances_per_row"][0]) == float(expected_sums["instances_per_row"][0]) == n
    # per-example outputs, unpacked, equal the padded rows'
    out_padded = np.asarray(
        padded_model.apply({"params": params}, arrays["input_ids"], arrays["segment_ids"], arrays["input_mask"])
    )
    out_packed = np.asarray(
        packed_model.apply(
            {"params": params},
            packed["input_ids"],
            packed["segment_ids"],
            packed["input_mask"],
            position_ids=packed["position_ids"],
            cls_positions=packed["cls_positions"],
        )
    )
    for r, group in enumerate(groups):
        start = 0
        for slot, i in enumerate(group):
            if task == "sequence_classification":
                np.testing.assert_allclose(out_packed[r, slot], out_padded[i], rtol=1e-4, atol=1e-5)
            else:
                np.testing.assert_allclose(
                    out_packed[r, start : start + lengths[i]], out_padded[i, : lengths[i]], rtol=1e-4, atol=1e-5
                )
            start += lengths[i]


def _loss(model, params, batch, task, regression, seq):
    """The job's loss of one batch (heads.task: the weighted sums over the batch's denominators)."""
    t = heads.task(model, task, regression, seq)
    sums = t.forward_sums(params, {k: jnp.asarray(v) for k, v in batch.items()}, None)
    return t.loss(sums, t.loss_denominators(batch)), sums


def test_each_step_holds_the_padded_steps_examples_and_resumes_exactly(tmp_path):
    arrays = padded_examples(100, 32, "sequence_classification", seed=1)
    padded = arrays_lib.ArrayBatches(arrays, 16, True, seed=7)
    packed = example_packing.PackedBatches(arrays, 16, True, seed=7, num_batches=20)
    assert packed.layout.rows < 16 and packed.batches_per_epoch == padded.batches_per_epoch == 6
    for _ in range(14):  # over two epoch boundaries
        want, got = next(padded), next(packed)
        assert got["input_ids"].shape == (packed.layout.rows, 32)
        used = got["cls_weights"] > 0
        assert sorted(got["label"][used]) == sorted(want["label"])
        assert int((got["input_mask"] > 0).sum()) == int((want["input_mask"] > 0).sum())  # their tokens, no more
    packed.save_state(str(tmp_path / "state"))
    after = [next(packed) for _ in range(3)]
    resumed = example_packing.PackedBatches(arrays, 16, True, seed=7, layout=packed.layout)
    resumed.restore_state(str(tmp_path / "state"))
    for a, b in zip(after, (next(resumed) for _ in range(3))):
        assert all(np.array_equal(a[k], b[k]) for k in a)


def test_eval_batches_unpack_to_input_order_across_processes():
    """Two processes' packed eval batches, concatenated as predict_step returns the global batch, unpack to
    one row per example in input order, per slot and per token."""
    arrays = padded_examples(45, 24, "token_classification", seed=2)
    arrays["label"] = np.arange(45, dtype=np.int32)  # per slot: the example's own index
    per_process = [example_packing.PackedBatches(arrays, 8, False, process_index=p, process_count=2) for p in range(2)]
    layout = example_packing.Layout(
        max(b.layout.rows for b in per_process), max(b.layout.slots for b in per_process), 24
    )
    per_process = [
        example_packing.PackedBatches(arrays, 8, False, process_index=p, process_count=2, layout=layout)
        for p in range(2)
    ]
    slots, tokens = [], []
    for local in zip(*per_process):
        slots.append(np.concatenate([b["label"] for b in local]))
        tokens.append(np.concatenate([b["input_ids"] for b in local])[..., None])
    np.testing.assert_array_equal(per_process[0].unpack(slots, per_token=False), np.arange(45))
    np.testing.assert_array_equal(per_process[0].unpack(tokens, per_token=True)[..., 0], arrays["input_ids"])


# --- The job ---------------------------------------------------------------------------------------------


def sentiment(path: pathlib.Path, n: int, seed: int) -> str:
    rng = random.Random(seed)
    rows = ["text\tlabel"]
    for _ in range(n):
        label = rng.choice(["pos", "neg"])
        words = [rng.choice(["the", "a", "film", "plot", "was", "very", "actor"]) for _ in range(rng.randint(1, 12))]
        words.insert(rng.randrange(len(words) + 1), "good" if label == "pos" else "bad")
        rows.append(f"{' '.join(words)}\t{label}")
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def job_config(tmp_path: pathlib.Path, packing: bool):
    vocab = tmp_path / "vocab.txt"
    if not vocab.exists():
        vocab.write_text(
            "\n".join(
                [
                    "[PAD]",
                    "[UNK]",
                    "[CLS]",
                    "[SEP]",
                    "[MASK]",
                    "good",
                    "bad",
                    "the",
                    "a",
                    "film",
                    "plot",
                    "was",
                    "very",
                    "actor",
                ]
            )
            + "\n"
        )
    c = runpy.run_path(str(ROOT / "configs" / "finetune.py"))["get_config"]("size=tiny")
    c.model.update(scan_layers=False, vocab_size=14, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    c.train.update(global_batch_size=32, num_epochs=3.0, log_every_steps=3)  # 8 devices: rows a multiple of 8
    c.data.update(
        max_seq_length=24,
        vocab_file=str(vocab),
        packing=packing,
        train_file=sentiment(tmp_path / "train.tsv", 96, 0),
        eval_file=sentiment(tmp_path / "dev.tsv", 40, 1),
    )
    c.optim.learning_rate = 1e-3
    return c


def test_a_packed_job_trains_to_the_padded_jobs_results(tmp_path):
    """Random init without dropout: the same examples per step, so the same steps, the same loss curve and
    the same predictions as padded rows, up to float rounding."""
    results, rows = {}, {}
    for packing in (False, True):
        workdir = tmp_path / f"packing_{packing}"
        results[packing] = finetuning.finetune(job_config(tmp_path, packing), str(workdir))
        rows[packing] = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    train = {p: [r for r in rows[p] if r["kind"] == "train"] for p in rows}
    assert [r["step"] for r in train[True]] == [r["step"] for r in train[False]] and train[True][-1]["step"] == 9
    for a, b in zip(train[True], train[False]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-3, abs=1e-4)
        assert a["learning_rate"] == b["learning_rate"]
    assert results[True]["accuracy"] == results[False]["accuracy"]
    assert results[True]["cross_entropy"] == pytest.approx(results[False]["cross_entropy"], rel=1e-3)
    predictions = {p: (tmp_path / f"packing_{p}" / finetuning.PREDICTIONS_FILE).read_text().splitlines() for p in rows}
    assert [json.loads(x)["prediction"] for x in predictions[True]] == [
        json.loads(x)["prediction"] for x in predictions[False]
    ]
    assert train[True][-1]["padding_fraction"] < 0.5 * train[False][-1]["padding_fraction"]
    # python -m bertjax.predict packs as the run did: the padded run's labels and probabilities, in input order
    texts = [line.split("\t")[0] for line in (tmp_path / "dev.tsv").read_text().splitlines()[1:]]
    (tmp_path / "new.txt").write_text("\n".join(texts) + "\n")
    out = {}
    for p in rows:
        prediction.predict_file(str(tmp_path / f"packing_{p}"), str(tmp_path / "new.txt"), str(tmp_path / f"{p}.jsonl"))
        out[p] = [json.loads(line) for line in (tmp_path / f"{p}.jsonl").read_text().splitlines()]
    assert [o["text"] for o in out[True]] == texts
    assert [o["prediction"] for o in out[True]] == [o["prediction"] for o in out[False]]
    np.testing.assert_allclose([o["probability"] for o in out[True]], [o["probability"] for o in out[False]], rtol=1e-3)
