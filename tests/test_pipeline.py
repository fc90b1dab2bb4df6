"""Tests of bertjax.data.pretraining.pipeline: values, determinism, per-process splits, resume, schema checks,
dynamic masking, eval coverage. Shards are written with records.RecordWriter from known arrays; each
row's id is stored in next_sentence_labels so rows can be traced through shuffling and splitting."""

import numpy as np
import pytest

from bertjax.data.pretraining import instances, records
from bertjax.data.pretraining.pipeline import EXAMPLE_WEIGHT, InputPipeline, PipelineConfig

SEQ, PRED = 32, 5
VOCAB = instances.Vocab(
    size=100, pad_id=0, cls_id=1, sep_id=2, mask_id=3, is_continuation=np.arange(100) >= 80
)  # ids 80..99 are "##" pieces
MASKING = instances.InstanceConfig(SEQ, PRED, masked_lm_prob=0.15, do_whole_word_mask=True)


def make_rows(ids: np.ndarray, seed: int = 0) -> dict[str, np.ndarray]:
    """Statically masked rows; next_sentence_labels holds the row id."""
    rng = np.random.default_rng(seed)
    n = len(ids)
    lengths = rng.integers(SEQ // 2, SEQ + 1, n)
    pos = np.arange(SEQ)[None, :]
    mask = (pos < lengths[:, None]).astype(np.int32)
    tokens = np.where(mask > 0, rng.integers(4, 100, (n, SEQ)), 0).astype(np.int32)
    tokens[:, 0], tokens[np.arange(n), lengths - 1] = 1, 2
    tokens[:, 1] = rng.integers(4, 80, n)  # a word start after [CLS]
    rows = dict(input_ids=tokens, input_mask=mask, segment_ids=(pos > lengths[:, None] // 2) * mask)
    rows.update(instances.mask_tokens(tokens, mask, MASKING, VOCAB, rng))
    rows["next_sentence_labels"] = np.asarray(ids)[:, None]
    rows["original"] = tokens
    return rows


def write_shards(directory, counts: list[int], metadata: dict | None = None) -> tuple[str, dict]:
    """Shards of counts[k] rows each; returns the glob and all rows by feature (row i has id i)."""
    rows = make_rows(np.arange(sum(counts)))
    start = 0
    for k, n in enumerate(counts):
        with records.RecordWriter(str(directory / f"shard-{k:03d}.tfrecord")) as w:
            if n:
                w.write_block({f: rows[f][start : start + n] for f in records.FEATURES})
        start += n
    if metadata is not None:
        records.write_metadata(str(directory), records.RecordSchema(SEQ, PRED), **metadata)
    return str(directory / "shard-*.tfrecord"), rows


def config(files: str, **kw) -> PipelineConfig:
    kw = {
        "batch_size": 8,
        "max_seq_length": SEQ,
        "max_predictions_per_seq": PRED,
        "seed": 0,
        "shuffle_buffer": 64,
        **kw,
    }
    return PipelineConfig(files=files, **kw)


def take(pipe: InputPipeline, n: int) -> list[dict]:
    return [next(pipe) for _ in range(n)]


def ids_of(batches: list[dict]) -> np.ndarray:
    return np.concatenate([b["next_sentence_labels"][b[EXAMPLE_WEIGHT] > 0] for b in batches])


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("shards"), [50, 40, 60, 30])  # 180 rows, 4 files


def masking_stats(arrays: dict[str, np.ndarray], vocab: instances.Vocab) -> dict:
    """Shares of [MASK] / random / kept among predictions, and predictions per token."""
    w = arrays["masked_lm_weights"] > 0
    r, c = np.nonzero(w)
    at = arrays["input_ids"][r, arrays["masked_lm_positions"][r, c]]
    label = arrays["masked_lm_ids"][r, c]
    total = max(len(at), 1)
    return {
        "predictions": int(len(at)),
        "mask_share": float(np.mean(at == vocab.mask_id)) if len(at) else 0.0,
        "kept_share": float(np.mean((at == label) & (at != vocab.mask_id))) if len(at) else 0.0,
        "random_share": float(np.sum((at != label) & (at != vocab.mask_id)) / total),
        "predictions_per_token": float(len(at) / max(arrays["input_mask"].sum(), 1)),
    }


# --- Values, shapes, determinism -----------------------------------------------------------------
def test_values_equal_what_was_written(shards):
    files, rows = shards
    batches = take(InputPipeline(config(files)), 20)
    b = batches[0]
    assert {k: (v.shape, v.dtype.name) for k, v in b.items()} == {
        "input_ids": ((8, SEQ), "int32"),
        "input_mask": ((8, SEQ), "int32"),
        "segment_ids": ((8, SEQ), "int32"),
        "masked_lm_positions": ((8, PRED), "int32"),
        "masked_lm_ids": ((8, PRED), "int32"),
        "masked_lm_weights": ((8, PRED), "float32"),
        "next_sentence_labels": ((8,), "int32"),
        EXAMPLE_WEIGHT: ((8,), "float32"),
    }
    for batch in batches:
        ids = batch["next_sentence_labels"]
        for name in records.FEATURES:
            if name != "next_sentence_labels":
                np.testing.assert_array_equal(batch[name], rows[name][ids], err_msg=name)
        np.testing.assert_array_equal(batch[EXAMPLE_WEIGHT], 1.0)


def test_training_shuffles_and_repeats(shards):
    files, _ = shards
    ids = ids_of(list(InputPipeline(config(files, num_epochs=3, batch_size=10))))
    assert len(ids) == 540 and np.all(np.bincount(ids) == 3)  # every row once per epoch
    assert not np.array_equal(ids[:180], np.arange(180))  # shuffled, not file order
    assert not np.array_equal(ids[:100], ids[180:280])  # reshuffled each epoch


def test_deterministic_per_seed(shards):
    files, _ = shards
    a, b = (ids_of(take(InputPipeline(config(files, seed=7)), 30)) for _ in range(2))
    c = ids_of(take(InputPipeline(config(files, seed=8)), 30))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("threads", [1, 3, 8])
def test_fixed_threads_read_the_same_batches_without_autotuning(shards, threads):
    """config.data.pipeline_threads: a fixed pool, more threads than the 4 files included (tf.data refuses more
    parallel reads than the interleave's cycle), the autotuned run's batches, training and eval, and no autotuning."""
    files, _ = shards
    for training in (True, False):
        tuned = InputPipeline(config(files, seed=7, training=training))
        fixed = InputPipeline(config(files, seed=7, training=training, threads=threads))
        assert fixed.dataset.options().autotune.enabled is False
        assert tuned.dataset.options().autotune.enabled is not False
        for a, b in zip(take(tuned, 12), take(fixed, 12)):
            for name in a:
                np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_fixed_threads_bound_each_stage_and_one_is_sequential(shards):
    """A stage never runs more calls than it can use (the interleave: files in its cycle; a mixture's parse:
    mixing.PARSE_CALLS, which bounds mixture.HORIZON), one thread is sequential, and 0 threads is refused."""
    import tensorflow as tf

    files, _ = shards
    assert config(files).parallel_calls(4) == tf.data.AUTOTUNE
    assert config(files, threads=1).parallel_calls() is None
    assert config(files, threads=16).parallel_calls(8) == 8 and config(files, threads=3).parallel_calls(8) == 3
    with pytest.raises(ValueError, match="threads=0 must be ≥ 1, or None"):
        InputPipeline(config(files, threads=0))


def test_the_jobs_pipeline_threads_reach_its_pipelines(shards):
    """config.data.pipeline_threads is what a job's training and eval pipelines get: 0 leaves tf.data autotuning."""
    import train_setup

    from bertjax.config.schema import JobConfig
    from bertjax.jobs import main as job_main

    files, _ = shards
    for threads in (0, 2):
        job = JobConfig.from_configdict(train_setup.small_config(**{"data.pipeline_threads": threads}))
        for training in (True, False):
            pipe = job_main._pipeline(job, files, training, 8)
            assert pipe.config.threads == (threads or None)
            assert (pipe.dataset.options().autotune.enabled is not False) == (threads == 0)


def test_num_epochs_ends_and_restarts(shards):
    files, _ = shards
    pipe = InputPipeline(config(files, num_epochs=2, batch_size=10))
    first = ids_of(list(pipe))
    assert len(first) == 360 and np.all(np.bincount(first) == 2)
    assert len(ids_of(list(pipe))) == 360  # iterating a finished pipeline starts a new pass


# --- Splitting across processes ------------------------------------------------------------------
@pytest.mark.parametrize(
    "counts,processes,by_example", [([50, 40, 60, 30], 3, False), ([70, 41], 3, True), ([9], 4, True)]
)
def test_split_covers_dataset_once(tmp_path, counts, processes, by_example):
    files, _ = write_shards(tmp_path, counts)
    train, evals = [], []
    for i in range(processes):
        pipe = InputPipeline(config(files, batch_size=1, num_epochs=1, process_index=i, process_count=processes))
        assert pipe.split_by_example == by_example
        train.append(ids_of(list(pipe)))
        ev = InputPipeline(config(files, batch_size=4, training=False, process_index=i, process_count=processes))
        batches = list(ev)
        assert len(batches) == ev.num_batches and ev.num_examples == len(ids_of(batches))
        evals.append((ev.num_batches, ids_of(batches)))
    total = sum(counts)
    for got in (np.concatenate(train), np.concatenate([ids for _, ids in evals])):
        assert len(got) == total and set(got) == set(range(total))  # every row once, no duplicates
    assert len({n for n, _ in evals}) == 1  # every process runs the same number of eval steps


def test_fewer_examples_than_processes(tmp_path):
    files, _ = write_shards(tmp_path, [2])
    with pytest.raises(ValueError, match="fewer records than process_count=3"):
        InputPipeline(config(files, process_index=2, process_count=3))
    assert len(take(InputPipeline(config(files, process_index=1, process_count=3)), 3)) == 3  # repeats its one row
    ev = InputPipeline(config(files, training=False, process_index=2, process_count=3))  # eval: padding only
    batches = list(ev)
    assert ev.num_examples == 0 and len(batches) == 1 and batches[0][EXAMPLE_WEIGHT].sum() == 0


def test_empty_file_for_a_process_is_an_error(tmp_path):
    files, _ = write_shards(tmp_path, [5, 0])
    with pytest.raises(ValueError, match="are empty"):
        InputPipeline(config(files, process_index=1, process_count=2))


# --- Eval ----------------------------------------------------------------------------------------
def test_eval_covers_every_example_once_with_padded_last_batch(shards):
    files, rows = shards
    pipe = InputPipeline(config(files, batch_size=16, training=False))
    batches = list(pipe)
    assert len(batches) == pipe.num_batches == 12 and pipe.num_examples == 180  # 11 full + 4 real rows
    np.testing.assert_array_equal(np.sort(ids_of(batches)), np.arange(180))
    last = batches[-1]
    assert last["input_ids"].shape == (16, SEQ)
    np.testing.assert_array_equal(last[EXAMPLE_WEIGHT], [1] * 4 + [0] * 12)
    assert not last["masked_lm_weights"][4:].any() and not last["input_mask"][4:].any()
    real = np.concatenate([b["masked_lm_weights"][b[EXAMPLE_WEIGHT] > 0] for b in batches])
    assert real.sum() == rows["masked_lm_weights"].sum()
    np.testing.assert_array_equal(ids_of(list(pipe)), ids_of(batches))  # a second pass: same rows, same order


def test_eval_passes_restart_without_a_new_iterator_and_max_batches_caps_them(shards):
    files, _ = shards
    pipe = InputPipeline(config(files, batch_size=16, training=False, max_batches=5))
    first = list(pipe)
    assert len(first) == pipe.num_batches == 5
    iterator = pipe._iterator
    pipe.reset()
    next(pipe), next(pipe)
    pipe.reset()  # mid-pass: back to the first batch of a pass
    again = list(pipe)
    assert pipe._iterator is iterator  # no iterator was deleted or made
    np.testing.assert_array_equal(ids_of(again), ids_of(first))
    with pytest.raises(ValueError, match="max_batches=0 must be ≥ 1"):
        InputPipeline(config(files, training=False, max_batches=0))


# --- Resume --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dynamic", [False, True])
def test_resume_sees_the_batches_of_an_uninterrupted_run(shards, tmp_path, dynamic):
    files, _ = shards
    cfg = config(files, dynamic_masking=dynamic, vocab=VOCAB if dynamic else None, masking=MASKING)
    straight = take(InputPipeline(cfg), 40)
    first = InputPipeline(cfg)
    take(first, 25)  # into the second epoch: file order, shuffle buffer and batch index all restored
    first.save_state(str(tmp_path / "state"))
    resumed = InputPipeline(cfg)
    take(resumed, 3)  # a position that must be overwritten
    resumed.restore_state(str(tmp_path / "state"))
    for want, got in zip(straight[25:], take(resumed, 15)):
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_restore_with_another_config_is_an_error(shards, tmp_path):
    files, _ = shards
    pipe = InputPipeline(config(files))
    next(pipe)
    pipe.save_state(str(tmp_path / "state"))
    with pytest.raises(ValueError, match="differs in seed"):
        InputPipeline(config(files, seed=1)).restore_state(str(tmp_path / "state"))
    with pytest.raises(FileNotFoundError, match="save_state"):
        pipe.restore_state(str(tmp_path / "nothing"))


# --- Schema checks -------------------------------------------------------------------------------
def test_schema_mismatch_is_one_clear_error(tmp_path):
    files, _ = write_shards(tmp_path, [10], metadata={"vocab_size": 100})
    with pytest.raises(ValueError, match=r"metadata.json: records have max_seq_length=32 but .*=64"):
        InputPipeline(config(files, max_seq_length=64))
    with pytest.raises(ValueError, match=r"max_predictions_per_seq=5 but .*=7"):
        InputPipeline(config(files, max_predictions_per_seq=7))
    with pytest.raises(ValueError, match="vocabulary of 100 tokens but config.model.vocab_size=30522"):
        InputPipeline(config(files, vocab_size=30522))
    with pytest.raises(ValueError, match="vocabulary of 100 tokens"):
        big = instances.Vocab(200, 0, 1, 2, 3, np.zeros(200, bool))
        InputPipeline(config(files, dynamic_masking=True, vocab=big, masking=MASKING))
    InputPipeline(config(files, vocab_size=100))


def test_schema_inferred_from_first_record_without_metadata(tmp_path):
    files, rows = write_shards(tmp_path, [10])  # like google-research/bert's records: no metadata.json
    with pytest.raises(ValueError, match=r"shard-000.tfrecord: records have max_seq_length=32 but .*=128"):
        InputPipeline(config(files, max_seq_length=128))
    batch = next(InputPipeline(config(files, vocab_size=30522)))  # nothing to check the vocab against
    np.testing.assert_array_equal(batch["input_ids"], rows["input_ids"][batch["next_sentence_labels"]])


def test_bad_config_and_missing_files(tmp_path, shards):
    files, _ = shards
    with pytest.raises(FileNotFoundError, match="matches no file"):
        InputPipeline(config(str(tmp_path / "none-*.tfrecord")))
    with pytest.raises(ValueError, match="needs vocab"):
        InputPipeline(config(files, dynamic_masking=True))
    with pytest.raises(ValueError, match="process_index=3"):
        InputPipeline(config(files, process_index=3, process_count=2))


def test_corrupt_shard_is_a_clear_error(tmp_path):
    files, _ = write_shards(tmp_path, [20])
    path = tmp_path / "shard-000.tfrecord"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    says = (
        r"record file .*shard-000.tfrecord has a damaged record header at byte [\d,]+ after 10 good records .*prepare"
    )
    with pytest.raises(ValueError, match=says):
        InputPipeline(config(files, training=False))  # eval counts its records up front
    with pytest.raises(ValueError, match=says):
        take(InputPipeline(config(files, batch_size=4)), 5)


# --- Dynamic masking -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def big_shards(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("big"), [600, 600])


def dynamic(files: str, **kw) -> InputPipeline:
    return InputPipeline(config(files, dynamic_masking=True, vocab=VOCAB, masking=MASKING, batch_size=50, **kw))


def test_dynamic_masking_restores_originals_and_remasks(big_shards):
    files, rows = big_shards
    batches = take(dynamic(files), 48)  # two epochs
    stored_same = 0
    for b in batches:
        ids = b["next_sentence_labels"]
        restored = instances.unmask(
            b["input_ids"], b["masked_lm_positions"], b["masked_lm_ids"], b["masked_lm_weights"]
        )
        np.testing.assert_array_equal(restored, rows["original"][ids])
        np.testing.assert_array_equal(b["input_mask"], rows["input_mask"][ids])
        stored_same += np.all(b["masked_lm_positions"] == rows["masked_lm_positions"][ids], axis=1).sum()
    assert stored_same < 0.05 * 50 * 48  # not the masks stored in the records


def test_dynamic_masking_differs_each_epoch(tmp_path):
    files, _ = write_shards(tmp_path, [200])
    batches = take(dynamic(files, shuffle_buffer=1), 8)  # no shuffling: epoch two repeats epoch one's batches
    for one, two in zip(batches[:4], batches[4:]):
        np.testing.assert_array_equal(one["next_sentence_labels"], two["next_sentence_labels"])
        same = np.all(one["masked_lm_positions"] == two["masked_lm_positions"], axis=1)
        assert same.mean() < 0.1  # only the batch index differs, and it changes the masks


def test_dynamic_masking_deterministic_per_seed(big_shards):
    files, _ = big_shards
    a, b, c = take(dynamic(files, seed=3), 5), take(dynamic(files, seed=3), 5), take(dynamic(files, seed=4), 5)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x["input_ids"], y["input_ids"])
        np.testing.assert_array_equal(x["masked_lm_positions"], y["masked_lm_positions"])
    assert not all(np.array_equal(x["input_ids"], z["input_ids"]) for x, z in zip(a, c))


def test_dynamic_masking_statistics_and_whole_words(big_shards):
    files, rows = big_shards
    batches = take(dynamic(files), 24)
    arrays = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    stats = masking_stats(arrays, VOCAB)
    assert stats["predictions"] > 3000
    assert abs(stats["mask_share"] - 0.8) < 0.03 and abs(stats["kept_share"] - 0.1) < 0.03
    assert abs(stats["random_share"] - 0.1) < 0.03
    assert 0.12 < stats["predictions_per_token"] < 0.17  # 15%, rounded per row and capped at PRED
    # Whole words: a selected "##" piece always has its preceding piece selected too.
    original = rows["original"][arrays["next_sentence_labels"]]
    selected = np.zeros_like(original, bool)
    r, c = np.nonzero(arrays["masked_lm_weights"] > 0)
    selected[r, arrays["masked_lm_positions"][r, c]] = True
    continuation = VOCAB.is_continuation[original] & (original > 3)
    inner = selected[:, 1:] & continuation[:, 1:] & (arrays["input_mask"][:, 1:] > 0)
    assert inner.any() and np.all(selected[:, :-1][inner])


# --- Masking rates other than 15% (ModernBERT trains at 30%) -------------------------------------------


@pytest.mark.parametrize("rate", [0.3, 0.5])
def test_masking_at_higher_rates_counts_and_splits_as_at_15(rate):
    rng = np.random.default_rng(1)
    rows = make_rows(np.arange(3000))  # lengths 16..32; the masker below re-masks their original tokens
    cfg = instances.InstanceConfig(SEQ, SEQ, masked_lm_prob=rate)  # slots for every token: nothing capped
    assert cfg.cap_warning() is None
    arrays = dict(rows, **instances.mask_tokens(rows["original"], rows["input_mask"], cfg, VOCAB, rng))
    length = rows["input_mask"].sum(1)
    assert np.array_equal((arrays["masked_lm_weights"] > 0).sum(1), np.maximum(1, np.rint(length * rate)))
    stats = masking_stats(arrays, VOCAB)
    assert abs(stats["mask_share"] - 0.8) < 0.02 and abs(stats["kept_share"] - 0.1) < 0.02
    assert abs(stats["random_share"] - 0.1) < 0.02
    assert abs(stats["predictions_per_token"] - rate) < 0.01


def test_dynamic_masking_takes_the_configs_rate_and_names_a_cap(tmp_path, caplog):
    files, _ = write_shards(tmp_path, [100], metadata={"vocab_size": 100, "masked_lm_prob": 0.15})  # 5 slots a row
    with caplog.at_level("INFO", logger="bertjax"):
        pipe = InputPipeline(config(files, dynamic_masking=True, vocab=VOCAB, masked_lm_prob=0.1, batch_size=50))
    assert "dynamic masking masks 0.1 of each sequence (the records were masked at 0.15)" in caplog.text
    batch = next(pipe)
    length = batch["input_mask"].sum(1)
    assert np.array_equal((batch["masked_lm_weights"] > 0).sum(1), np.maximum(1, np.rint(length * 0.1)))
    with caplog.at_level("WARNING", logger="bertjax"):
        InputPipeline(config(files, dynamic_masking=True, vocab=VOCAB, masked_lm_prob=0.3, batch_size=50))
    assert (
        "max_predictions_per_seq=5 masks fewer than masked_lm_prob=0.3 of every sequence of 19 tokens or more "
        "(a full 32-token one would get 10); set it to 10"
    ) in caplog.text
