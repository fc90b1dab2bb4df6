"""from_pretrained / save_pretrained on a real checkpoint, and the errors users meet with bad directories."""

import json
import logging

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

import bertjax
from bertjax.interop import pretrained
from bertjax.models.bert import model as model_lib

import reference

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "BERT is pre-trained on masked language modelling and next sentence prediction.",
    "Ångström wrote about the solar spectrum in 1868; his units are still in use.",
    "Short one.",
]


def test_real_checkpoint_matches_transformers(minilm_dir, caplog):
    """sentence-transformers/all-MiniLM-L6-v2: a 6-layer BertModel trained by someone else."""
    tokenizer = transformers.BertTokenizer.from_pretrained(minilm_dir)
    enc = tokenizer(SENTENCES, padding=True, return_tensors="np")
    assert enc["attention_mask"].min() == 0, "the sentences should need padding"
    with caplog.at_level(logging.WARNING, logger="bertjax.models.bert.hf"):
        model, params = bertjax.from_pretrained(str(minilm_dir))
    # It has no pre-training heads: they are initialised and that is said once.
    fresh = [r.getMessage() for r in caplog.records if "initialised fresh" in r.getMessage()]
    assert len(fresh) == 1 and "cls.predictions" in fresh[0] and "cls.seq_relationship" in fresh[0], fresh
    assert (model.config.num_hidden_layers, model.config.hidden_size) == (6, 384)

    out = model.apply({"params": params}, enc["input_ids"], enc["token_type_ids"], enc["attention_mask"])
    reference_model = transformers.BertModel.from_pretrained(minilm_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        expected = reference_model(**{k: torch.tensor(v) for k, v in enc.items()})
    np.testing.assert_allclose(out.sequence_output, expected.last_hidden_state.numpy(), atol=1e-4, rtol=0)
    np.testing.assert_allclose(out.pooled_output, expected.pooler_output.numpy(), atol=1e-4, rtol=0)


def test_an_encoder_for_fine_tuning_initialises_and_warns_of_no_heads(minilm_dir, saved, caplog):
    """Fine-tuning, features and retrieval take the encoder alone (encoder_only): a bare BertModel's missing
    pre-training heads are neither initialised nor warned of, and the encoder is the full load's. A missing
    pooler (part of the encoder) still is, with the reason that fits."""
    with caplog.at_level(logging.WARNING, logger="bertjax.models.bert.hf"):
        _, encoder = pretrained.load(str(minilm_dir), encoder_only=True)
    assert not [r for r in caplog.records if "initialised fresh" in r.getMessage()], caplog.text
    _, full = pretrained.load(str(minilm_dir))
    assert list(encoder) == ["bert"] and set(full) > {"bert"}  # the full load has its heads
    for a, b in zip(jax_leaves(encoder["bert"]), jax_leaves(full["bert"])):
        np.testing.assert_array_equal(a, b)

    tensors = load_file(str(saved / "model.safetensors"))
    save_file(
        {k: v for k, v in tensors.items() if not k.startswith(("cls.", "bert.pooler."))}, saved / "model.safetensors"
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bertjax.models.bert.hf"):
        _, encoder = pretrained.load(str(saved), encoder_only=True)
    fresh = [r.getMessage() for r in caplog.records if "initialised fresh" in r.getMessage()]
    assert len(fresh) == 1 and "bert.pooler.dense" in fresh[0] and "cls." not in fresh[0], fresh
    assert "classification head trains them" in fresh[0] and "pooler" in encoder["bert"]


def test_round_trip_with_vocab(minilm_dir, tmp_path):
    model, params = bertjax.from_pretrained(str(minilm_dir))
    bertjax.save_pretrained(str(tmp_path), model, params, vocab_file=str(minilm_dir / "vocab.txt"))
    again_model, again = bertjax.from_pretrained(str(tmp_path))
    assert again_model.config == model.config
    for a, b in zip(*(jax_leaves(p) for p in (params, again))):
        np.testing.assert_array_equal(a, b)
    tokenizer = transformers.BertTokenizer.from_pretrained(tmp_path)
    assert tokenizer.tokenize("Hello World") == ["hello", "world"]
    assert tokenizer.mask_token_id == 103


def jax_leaves(params):
    import jax

    return [np.asarray(x) for x in jax.tree.leaves(params)]


@pytest.fixture
def saved(tmp_path):
    config = model_lib.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
    )
    model = model_lib.BertForPreTraining(config)
    bertjax.save_pretrained(str(tmp_path), model, reference.random_params(model))
    return tmp_path


def test_directory_without_weights(saved):
    (saved / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"has no model\.safetensors"):
        bertjax.from_pretrained(str(saved))


def test_pickled_weights_are_refused(saved):
    (saved / "model.safetensors").rename(saved / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match=r"only pytorch_model\.bin.*will not read.*safe_serialization"):
        bertjax.from_pretrained(str(saved))


def test_missing_directory_and_config(saved):
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        bertjax.from_pretrained(str(saved / "nope"))
    (saved / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"has no config\.json"):
        bertjax.from_pretrained(str(saved))


def test_heads_not_dividing_hidden(saved):
    config = json.loads((saved / "config.json").read_text())
    config["num_attention_heads"] = 5
    (saved / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config\.json: hidden_size=32 is not divisible by num_attention_heads=5"):
        bertjax.from_pretrained(str(saved))


def test_shapes_disagreeing_with_config(saved):
    config = json.loads((saved / "config.json").read_text())
    config["intermediate_size"] = 48
    (saved / "config.json").write_text(json.dumps(config))
    # Found in the safetensors header, before any tensor is read or head initialised (hf_files.check_header).
    with pytest.raises(
        ValueError,
        match=r"config\.json says intermediate_size=48, hidden_size=32, but the weights' "
        r"intermediate\.dense\.weight is 64 × 32: the config\.json does not belong",
    ):
        bertjax.from_pretrained(str(saved))


def test_corrupt_safetensors(saved):
    data = (saved / "model.safetensors").read_bytes()
    (saved / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"model\.safetensors is not a readable safetensors file"):
        bertjax.from_pretrained(str(saved))


def test_sharded_checkpoint_and_legacy_names(saved, caplog):
    """Sharded safetensors with an index, old LayerNorm gamma/beta names and an extra classifier."""
    tensors = load_file(saved / "model.safetensors")
    _, expected = bertjax.from_pretrained(str(saved))
    renamed = {
        k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
        for k, v in tensors.items()
    }
    renamed["classifier.weight"] = np.zeros((3, 32), np.float32)
    names = sorted(renamed)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    (saved / "model.safetensors").unlink()
    for file, keys in halves.items():
        save_file({k: renamed[k] for k in keys}, saved / file, metadata={"format": "pt"})
    index = {"weight_map": {k: f for f, keys in halves.items() for k in keys}}
    (saved / "model.safetensors.index.json").write_text(json.dumps(index))
    with caplog.at_level(logging.WARNING, logger="bertjax.models.bert.hf"):
        _, params = bertjax.from_pretrained(str(saved))
    assert any("ignored 1 tensor" in r.getMessage() and "classifier.weight" in r.getMessage() for r in caplog.records)
    for a, b in zip(jax_leaves(expected), jax_leaves(params)):
        np.testing.assert_array_equal(a, b)

    (saved / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"names shard\(s\) \['model-00002-of-00002\.safetensors'\]"):
        bertjax.from_pretrained(str(saved))


def test_untied_decoder_is_refused(saved):
    tensors = load_file(saved / "model.safetensors")
    tensors["cls.predictions.decoder.weight"] = tensors["bert.embeddings.word_embeddings.weight"] + 1.0
    save_file(tensors, saved / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="decoder.weight differs from the word embeddings"):
        bertjax.from_pretrained(str(saved))


def test_missing_encoder_layer(saved):
    tensors = load_file(saved / "model.safetensors")
    tensors = {k: v for k, v in tensors.items() if ".layer.1." not in k}
    save_file(tensors, saved / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"config\.json says num_hidden_layers=2, but the weights hold 1 layers"):
        bertjax.from_pretrained(str(saved))
