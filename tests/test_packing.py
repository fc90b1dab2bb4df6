"""Sequence packing (bertjax.data.pretraining.packing) and the model on packed rows: the same instances packed and
unpacked give the same per-instance MLM and NSP losses and the same gradients, with xla and with splash
(Pallas interpret mode), for BERT and for ModernBERT."""

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertjax.training import metrics as metrics_lib
from bertjax.models.bert import model as model_lib
from bertjax.data.pretraining import instances as instances_lib
from bertjax.data.pretraining import packing
from bertjax.models.modernbert import model as modernbert

import train_setup

SEQ, PRED, VOCAB, N = 64, 10, 300, 14


def instances(seed: int = 0) -> dict[str, np.ndarray]:
    """N unpacked instances of 8–60 tokens ([CLS] first), up to PRED masked positions each, NSP labels."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(8, 61, N)
    input_mask = (np.arange(SEQ)[None] < lengths[:, None]).astype(np.int64)
    input_ids = rng.integers(5, VOCAB, (N, SEQ)) * input_mask
    input_ids[:, 0] = 2  # [CLS]
    segment_ids = ((np.arange(SEQ)[None] >= lengths[:, None] // 2) * input_mask).astype(np.int64)
    positions = np.zeros((N, PRED), np.int64)
    weights = np.zeros((N, PRED), np.float32)
    for i, n in enumerate(lengths):
        p = np.sort(rng.choice(np.arange(1, n), min(PRED, max(1, n // 6)), replace=False))
        positions[i, : len(p)], weights[i, : len(p)] = p, 1.0
    return dict(
        input_ids=input_ids,
        input_mask=input_mask,
        segment_ids=segment_ids,
        masked_lm_positions=positions,
        masked_lm_ids=rng.integers(5, VOCAB, (N, PRED)) * (weights > 0),
        masked_lm_weights=weights,
        next_sentence_labels=rng.integers(0, 2, (N, 1)),
    )


CFG = packing.PackingConfig(SEQ, max_instances_per_row=3, max_predictions_per_row=2 * PRED)


def test_every_instance_lands_once_within_the_row_limits():
    arrays = instances()
    lengths = arrays["input_mask"].sum(1)
    rows = packing.assign_rows(lengths, (arrays["masked_lm_weights"] > 0).sum(1), CFG)
    assert sorted(i for row in rows for i in row) == list(range(N))
    for row in rows:
        assert 1 <= len(row) <= 3 and lengths[row].sum() <= SEQ
    packed = packing.pack(arrays, CFG)
    assert len(packed["input_ids"]) == len(rows) < N
    assert (packed["input_mask"] > 0).sum() == lengths.sum()  # every real token, no more
    padding = {"unpacked": 1 - lengths.sum() / (N * SEQ), "packed": 1 - lengths.sum() / (len(rows) * SEQ)}
    assert padding["packed"] < padding["unpacked"] / 2, padding
    for r, row in enumerate(rows):  # each instance's tokens, positions, [CLS] and masks where they belong
        for j, i in enumerate(row):
            at = np.flatnonzero(packed["input_mask"][r] == j + 1)
            np.testing.assert_array_equal(packed["input_ids"][r, at], arrays["input_ids"][i, : lengths[i]])
            np.testing.assert_array_equal(packed["position_ids"][r, at], np.arange(lengths[i]))
            assert packed["next_sentence_positions"][r, j] == at[0] and packed["next_sentence_weights"][r, j] == 1
            assert packed["next_sentence_labels"][r, j] == arrays["next_sentence_labels"][i, 0]
            mine = np.isin(packed["masked_lm_positions"][r], at) & (packed["masked_lm_weights"][r] > 0)
            np.testing.assert_array_equal(
                packed["masked_lm_ids"][r, mine], arrays["masked_lm_ids"][i][arrays["masked_lm_weights"][i] > 0]
            )


def test_an_instance_that_cannot_fit_is_refused():
    with pytest.raises(ValueError, match="cannot be packed"):
        packing.assign_rows(np.array([70]), np.array([3]), CFG)


def test_dynamic_masking_masks_each_packed_instance_as_if_alone():
    packed = packing.pack(instances(), CFG)
    mask = packed["input_mask"]
    original = instances_lib.unmask(
        *(packed[k] for k in ("input_ids", "masked_lm_positions", "masked_lm_ids", "masked_lm_weights"))
    )
    vocab = instances_lib.Vocab(VOCAB, pad_id=0, cls_id=2, sep_id=3, mask_id=4, is_continuation=np.zeros(VOCAB, bool))
    cfg = instances_lib.InstanceConfig(SEQ, PRED, masked_lm_prob=0.15)
    m = packing.mask_rows(original, mask, cfg, vocab, np.random.default_rng(0), CFG.max_predictions_per_row)
    positions, weights = m["masked_lm_positions"], m["masked_lm_weights"]
    np.testing.assert_array_equal(
        instances_lib.unmask(m["input_ids"], positions, m["masked_lm_ids"], weights), original
    )
    assert np.all(np.diff(weights, axis=1) <= 0)  # used slots first
    for r in range(len(mask)):
        chosen = set(positions[r, weights[r] > 0].tolist())
        assert set(np.flatnonzero(m["input_ids"][r] != original[r]).tolist()) <= chosen  # only masked tokens change
        for j in range(1, mask[r].max() + 1):
            at = np.flatnonzero(mask[r] == j)
            mine = chosen & set(at.tolist())
            assert len(mine) == min(PRED, max(1, int(np.rint(len(at) * 0.15)))), (r, j)  # its own 15%
            assert at[0] not in mine  # never its [CLS]
    fresh = packing.mask_rows(original, mask, cfg, vocab, np.random.default_rng(1), CFG.max_predictions_per_row)
    assert not np.array_equal(fresh["masked_lm_positions"], positions)
    with pytest.raises(ValueError, match="needs .* prediction slots .* max_predictions_per_row=5; re-run prepare"):
        packing.mask_rows(original, mask, cfg, vocab, np.random.default_rng(0), 5)


def test_dynamic_masking_fills_every_slot_of_a_batch_of_one_instance_rows():
    # Rows of one long instance each (seq 64 rows of 64-token instances): the instance's own cap is fewer slots
    # than the row holds, and the batch must still have the records' width (the pipeline's fixed shape).
    rng = np.random.default_rng(0)
    original = rng.integers(5, VOCAB, size=(4, SEQ)).astype(np.int32)
    mask = np.ones((4, SEQ), np.int32)
    vocab = instances_lib.Vocab(VOCAB, pad_id=0, cls_id=2, sep_id=3, mask_id=4, is_continuation=np.zeros(VOCAB, bool))
    cfg = instances_lib.InstanceConfig(SEQ, PRED, masked_lm_prob=0.15)
    m = packing.mask_rows(original, mask, cfg, vocab, rng, PRED + 3)
    assert {m[k].shape for k in ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")} == {(4, PRED + 3)}
    assert np.all(m["masked_lm_weights"][:, PRED:] == 0)
    np.testing.assert_array_equal(
        instances_lib.unmask(m["input_ids"], m["masked_lm_positions"], m["masked_lm_ids"], m["masked_lm_weights"]),
        original,
    )


def per_instance_losses(implementation: str, packed: bool, arrays: dict):
    """Loss, gradients, and each instance's summed MLM cross-entropy and its NSP cross-entropy."""
    arch = model_lib.config_for_size(
        "tiny", vocab_size=VOCAB, max_position_embeddings=SEQ, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    model = model_lib.BertForPreTraining(arch, attention=implementation, packed=packed)
    params = model_lib.init_params(model_lib.BertForPreTraining(arch), jax.random.PRNGKey(0))
    b = {k: jnp.asarray(v) for k, v in arrays.items()}
    extra = dict(position_ids=b["position_ids"], cls_positions=b["next_sentence_positions"]) if packed else {}

    def loss(params):
        out = model.apply(
            {"params": params},
            b["input_ids"],
            b["segment_ids"],
            b["input_mask"],
            masked_lm_positions=b["masked_lm_positions"],
            **extra,
        )
        sums = metrics_lib.pretraining_metrics(
            out.mlm_logits,
            b["masked_lm_ids"],
            b["masked_lm_weights"],
            out.nsp_logits,
            b["next_sentence_labels"],
            next_sentence_weights=b.get("next_sentence_weights"),
        )
        mlm_ce = optax.softmax_cross_entropy_with_integer_labels(out.mlm_logits, b["masked_lm_ids"])
        nsp_ce = optax.softmax_cross_entropy_with_integer_labels(
            out.nsp_logits, b["next_sentence_labels"].reshape(out.nsp_logits.shape[:-1])
        )
        return metrics_lib.pretraining_loss(sums), (mlm_ce * b["masked_lm_weights"], nsp_ce)

    (value, (mlm_ce, nsp_ce)), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    mlm_ce, nsp_ce = np.asarray(mlm_ce), np.asarray(nsp_ce)
    if not packed:
        return float(value), grads, mlm_ce.sum(1), nsp_ce
    mlm, nsp = unpacked_sums(arrays, mlm_ce, nsp_ce)
    return float(value), grads, mlm, nsp


def unpacked_sums(
    arrays: dict, mlm_ce: np.ndarray, nsp_ce: Optional[np.ndarray] = None
) -> tuple[np.ndarray, np.ndarray]:
    """Packed rows' per-slot MLM cross-entropy (and per-instance NSP) back to each original instance."""
    mlm, nsp = np.zeros(N), np.zeros(N)
    for r, members in enumerate(packing.assign_rows(arrays["_lengths"], arrays["_predictions"], CFG)):
        owner = arrays["input_mask"][r][arrays["masked_lm_positions"][r]]  # instance number of each slot
        for j, i in enumerate(members):
            mlm[i] = mlm_ce[r][(owner == j + 1) & (arrays["masked_lm_weights"][r] > 0)].sum()
            if nsp_ce is not None:
                nsp[i] = nsp_ce[r, j]
    return mlm, nsp


@pytest.mark.parametrize("implementation", ["xla", "splash"])
def test_packed_and_unpacked_give_the_same_losses_and_gradients(implementation):
    arrays = instances()
    packed = packing.pack(arrays, CFG)
    packed.update(_lengths=arrays["input_mask"].sum(1), _predictions=(arrays["masked_lm_weights"] > 0).sum(1))
    loss_u, grads_u, mlm_u, nsp_u = per_instance_losses("xla", False, arrays)
    loss_p, grads_p, mlm_p, nsp_p = per_instance_losses(implementation, True, {k: v for k, v in packed.items()})
    np.testing.assert_allclose(mlm_p, mlm_u, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(nsp_p, nsp_u, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(loss_p, loss_u, rtol=1e-6)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(grads_u), jax.tree.leaves(grads_p)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5, err_msg=jax.tree_util.keystr(path))


def modernbert_per_instance_losses(implementation: str, packed: bool, arrays: dict):
    """ModernBERT (MLM only, a window of 8 tokens a side): loss and gradients as the trainer computes them
    (its `pretraining_inputs` hands a packed row's positions to rotary), and each instance's summed MLM
    cross-entropy."""
    config = train_setup.tiny_modernbert(
        vocab_size=VOCAB, num_attention_heads=2, local_attention=16, max_position_embeddings=SEQ
    )
    model = modernbert.ModernBertForMaskedLM(config, attention=implementation, packed=packed)
    params = modernbert.init_params(modernbert.ModernBertForMaskedLM(config), jax.random.PRNGKey(0))
    b = {k: jnp.asarray(v) for k, v in arrays.items() if not k.startswith("_")}

    def loss(params):
        out = model.apply(
            {"params": params},
            input_ids=b["input_ids"],
            input_mask=b["input_mask"],
            masked_lm_positions=b["masked_lm_positions"],
            **modernbert.pretraining_inputs(b),
        )
        sums = metrics_lib.pretraining_metrics(out.mlm_logits, b["masked_lm_ids"], b["masked_lm_weights"])
        mlm_ce = optax.softmax_cross_entropy_with_integer_labels(out.mlm_logits, b["masked_lm_ids"])
        return metrics_lib.pretraining_loss(sums), mlm_ce * b["masked_lm_weights"]

    (value, mlm_ce), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    mlm_ce = np.asarray(mlm_ce)
    if not packed:
        return float(value), grads, mlm_ce.sum(1)
    return float(value), grads, unpacked_sums(arrays, mlm_ce)[0]


@pytest.mark.parametrize("implementation", ["xla", "splash"])
def test_modernbert_packed_and_unpacked_give_the_same_losses_and_gradients(implementation):
    """Attention, global and windowed, stays inside each instance. (The positions restart in each instance,
    as transformers' unpadded rows do; rotary scores depend only on the distance between two tokens, so at
    seq 64 the logits would agree without the restart too: it keeps the angles of a long row's later
    instances as small, and as exact in bf16, as when they stand alone.)"""
    arrays = instances()
    packed = packing.pack(arrays, CFG)
    assert packed["input_mask"].max() == 2 and len(packed["input_mask"]) < N  # rows hold two instances
    packed.update(_lengths=arrays["input_mask"].sum(1), _predictions=(arrays["masked_lm_weights"] > 0).sum(1))
    loss_u, grads_u, mlm_u = modernbert_per_instance_losses("xla", False, arrays)
    loss_p, grads_p, mlm_p = modernbert_per_instance_losses(implementation, True, packed)
    assert (mlm_u > 0).sum() == N
    np.testing.assert_allclose(mlm_p, mlm_u, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(loss_p, loss_u, rtol=1e-6)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(grads_u), jax.tree.leaves(grads_p)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5, err_msg=jax.tree_util.keystr(path))


# --- The job on packed records --------------------------------------------------------------------------


def test_the_job_packs_its_corpus_and_trains_per_instance(tmp_path, capsys):
    import json

    import train_setup
    from bertjax.jobs import main as train

    words = "the a model packs rows of short documents into one sequence so no compute is spent on pads".split()
    rng = np.random.default_rng(0)
    corpus = tmp_path / "short.txt"  # documents of two short sentences: instances of ~8–20 tokens
    corpus.write_text(
        "\n\n".join(
            "\n".join(" ".join(rng.choice(words, rng.integers(3, 9))) + "." for _ in range(2)) for _ in range(400)
        )
        + "\n"
    )
    c = train_setup.small_config()
    c.data.update(corpus=str(corpus), corpus_vocab_size=200, dupe_factor=2, num_shards=2, num_workers=1, packing=True)
    c.model.vocab_size = 0  # the trained vocab's
    c.train.num_train_steps = 4  # saves at steps 2 and 4
    c.eval.update(every_steps=1000, num_batches=2, show_predictions=1)
    result = train.train_and_evaluate(c, str(tmp_path / "work"))
    metadata = json.loads((tmp_path / "work" / "data" / "train" / "metadata.json").read_text())
    assert metadata["schema"]["max_instances_per_row"] == 3 and metadata["instances_per_row"] > 1.3
    rows = [json.loads(line) for line in (tmp_path / "work" / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert all(r["instances_per_row"] > 1.0 for r in train_rows)  # NSP counted per instance, not per row
    assert all(0 <= r["padding_fraction"] < 0.5 and r["real_tokens_per_s"] > 0 for r in train_rows[1:])
    assert train_rows[1]["seq_per_s"] > train_rows[1]["tokens_per_s"] / train_setup.SEQ  # instances, not rows
    assert 0 < result["mlm_accuracy_baseline"] < 1 and np.isfinite(result["nsp_loss"])
    assert "Top-5 predictions" in capsys.readouterr().out

    # Packed records resume exactly: the run as if stopped after step 2 ends with the uninterrupted params.
    import shutil

    from bertjax.training import checkpoint as checkpoint_lib

    uninterrupted = jax.tree.leaves(checkpoint_lib.load_params(str(tmp_path / "work"))[1])
    shutil.rmtree(tmp_path / "work" / checkpoint_lib.CHECKPOINTS / "4")
    train.train_and_evaluate(c, str(tmp_path / "work"))
    for a, b in zip(uninterrupted, jax.tree.leaves(checkpoint_lib.load_params(str(tmp_path / "work"))[1])):
        np.testing.assert_array_equal(a, b)

    # Dynamic masking re-masks the packed rows: the same tokens, fresh masks inside each instance.
    from bertjax.data.pretraining import pipeline as pipeline_lib
    from bertjax.data.vocab import tokenization

    data = tmp_path / "work" / "data"
    vocab = instances_lib.Vocab.from_tokenizer(tokenization.load(str(data / "vocab" / "vocab.txt"), True))
    common = dict(
        files=str(data / "train" / "*.tfrecord"),
        batch_size=8,
        max_seq_length=train_setup.SEQ,
        max_predictions_per_seq=metadata["schema"]["max_predictions_per_seq"],
        max_instances_per_row=3,
        shuffle_buffer=1,
    )
    stored = next(pipeline_lib.InputPipeline(pipeline_lib.PipelineConfig(**common)))
    remasked = next(
        pipeline_lib.InputPipeline(pipeline_lib.PipelineConfig(**common, dynamic_masking=True, vocab=vocab))
    )
    keys = ("input_ids", "masked_lm_positions", "masked_lm_ids", "masked_lm_weights")
    np.testing.assert_array_equal(
        instances_lib.unmask(*(remasked[k] for k in keys)), instances_lib.unmask(*(stored[k] for k in keys))
    )
    assert not np.array_equal(remasked["masked_lm_positions"], stored["masked_lm_positions"])
    inside = np.take_along_axis(remasked["input_mask"], remasked["masked_lm_positions"], axis=1)
    assert np.all(inside[remasked["masked_lm_weights"] > 0] > 0)


def test_packing_must_agree_with_the_records(pydocs_data, tmp_path):
    import train_setup
    from bertjax.jobs import main as train

    c = train_setup.small_config(pydocs_data, **{"data.packing": True})
    with pytest.raises(ValueError, match=r"the records are unpacked but config.data.packing=True; set it to False"):
        train.train_and_evaluate(c, str(tmp_path))
