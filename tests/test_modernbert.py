"""ModernBERT (bertjax/models/): equal to transformers' ModernBertForMaskedLM (eager attention, fp32, 1e-4)
in both directions, the architecture's traps each tested on its own, packed rows, bad inputs and the fine-tuning
heads (the compute paths: test_modernbert_compute.py)."""

from __future__ import annotations

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import train_setup

import bertjax
from bertjax.finetuning import tasks
from bertjax.models import attention as attention_lib
from bertjax.models.modernbert import model as modernbert, config as modernbert_config, hf as modernbert_hf
from bertjax.models.modernbert import heads as modernbert_heads

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB = 97
SPECIAL = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)


def hf_model(layers: int = 3, window: int = 4, every: int = 3, biases: bool = False, seed: int = 0, **extra):
    """A random transformers ModernBertForMaskedLM; norms and the decoder bias moved off their init values so a
    mix-up between them shows."""
    config = transformers.ModernBertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=layers,
        num_attention_heads=4,
        local_attention=window,
        global_attn_every_n_layers=every,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
        global_rope_theta=1000.0,
        local_rope_theta=50.0,
        norm_bias=biases,
        attention_bias=biases,
        mlp_bias=biases,
        classifier_bias=biases,
        attn_implementation="eager",
        **extra,
    )
    torch.manual_seed(seed)
    model = transformers.ModernBertForMaskedLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


def inputs(seq: int, rows: int = 2, pad: int = 5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, VOCAB, (rows, seq))
    mask = np.ones_like(ids)
    mask[-1, seq - pad :] = 0
    return ids, mask


def hf_logits(model, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()


def our_logits(model, params, ids: np.ndarray, mask: np.ndarray, **kw) -> np.ndarray:
    return np.asarray(
        model.apply(
            {"params": params}, input_ids=jnp.asarray(ids), input_mask=jnp.asarray(mask), deterministic=True, **kw
        ).mlm_logits
    )


@pytest.mark.parametrize(
    "layers, window, every, seq, biases",
    [
        (3, 4, 3, 16, False),  # a multiple of global_attn_every_n_layers, the window a quarter of the sequence
        (4, 6, 3, 20, False),  # not a multiple: the last layer is global again
        (5, 8, 2, 24, True),  # every other layer global, every bias on
    ],
)
def test_both_directions_equal_transformers(tmp_path, layers, window, every, seq, biases):
    ref = hf_model(layers, window, every, biases)
    ref.save_pretrained(tmp_path / "hf")
    model, params = bertjax.from_pretrained(str(tmp_path / "hf"))
    assert isinstance(model, modernbert.ModernBertForMaskedLM)
    assert model.config.layer_types == tuple(ref.config.layer_types)
    ids, mask = inputs(seq)
    theirs = hf_logits(ref, ids, mask)
    np.testing.assert_allclose(our_logits(model, params, ids, mask)[mask > 0], theirs[mask > 0], atol=1e-4)
    # bertjax → transformers: a directory AutoModelForMaskedLM loads with no missing or unexpected keys.
    bertjax.save_pretrained(str(tmp_path / "out"), model, params)
    back, info = transformers.AutoModelForMaskedLM.from_pretrained(
        str(tmp_path / "out"), output_loading_info=True, attn_implementation="eager"
    )
    assert type(back).__name__ == "ModernBertForMaskedLM" and not any(info.values()), info
    np.testing.assert_allclose(hf_logits(back.eval(), ids, mask)[mask > 0], theirs[mask > 0], atol=1e-4)


def test_random_bertjax_weights_equal_transformers_after_export(tmp_path):
    config = modernbert_config.ModernBertConfig(
        **SPECIAL,
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=40,
        num_hidden_layers=4,
        num_attention_heads=2,
        local_attention=6,
        max_position_embeddings=64,
    )
    model = modernbert.ModernBertForMaskedLM(config)
    params = modernbert.init_params(model, jax.random.PRNGKey(3))
    params["decoder_bias"] = jax.random.normal(jax.random.PRNGKey(4), (VOCAB,)) * 0.1
    bertjax.save_pretrained(str(tmp_path), model, params)
    ref = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path), attn_implementation="sdpa").eval()
    ids, mask = inputs(18, pad=7)
    np.testing.assert_allclose(
        our_logits(model, params, ids, mask)[mask > 0], hf_logits(ref, ids, mask)[mask > 0], atol=1e-4
    )


def test_both_config_spellings_read_the_same(tmp_path):
    legacy = {
        "model_type": "modernbert",
        **SPECIAL,
        "num_hidden_layers": 4,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_attention_heads": 4,
        "vocab_size": VOCAB,
        "global_rope_theta": 1000.0,
        "local_rope_theta": 50.0,
        "global_attn_every_n_layers": 2,
        "local_attention": 6,
    }
    current = {k: v for k, v in legacy.items() if "theta" not in k and k != "global_attn_every_n_layers"}
    current.update(
        layer_types=["full_attention", "sliding_attention"] * 2,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 50.0},
        },
    )
    a, b = (modernbert_config.from_hf_dict(d) for d in (legacy, current))
    assert a == b and a.layer_types[:2] == ("full_attention", "sliding_attention") and a.global_rope_theta == 1000.0
    # What we write, transformers reads back to the same layers and bases; and our reader reads it again.
    written = modernbert_config.to_hf_dict(a)
    theirs = transformers.ModernBertConfig(**{k: v for k, v in written.items() if k != "model_type"})
    assert theirs.layer_types == list(a.layer_types) and theirs.sliding_window == 3
    assert theirs.rope_parameters["sliding_attention"]["rope_theta"] == 50.0
    assert modernbert_config.from_hf_dict(written) == a
    with pytest.raises(ValueError, match="rope_type='yarn' is not supported"):
        modernbert_config.from_hf_dict(dict(current, rope_parameters={"full_attention": {"rope_type": "yarn"}}))
    # The legacy spelling with a layer count that is no multiple of global_attn_every_n_layers: the layers and
    # bases transformers derives from it, ours too.
    odd = dict(legacy, num_hidden_layers=5, global_attn_every_n_layers=3)
    theirs = transformers.ModernBertConfig(**{k: v for k, v in odd.items() if k != "model_type"})
    ours = modernbert_config.from_hf_dict(odd)
    assert (
        ours.layer_types
        == tuple(theirs.layer_types)
        == ("full_attention", "sliding_attention", "sliding_attention", "full_attention", "sliding_attention")
    )
    assert (ours.global_rope_theta, ours.local_rope_theta) == (
        theirs.rope_parameters["full_attention"]["rope_theta"],
        theirs.rope_parameters["sliding_attention"]["rope_theta"],
    )


# --- The traps -----------------------------------------------------------------------------------------


def _one_layer(kind: str, window: int = 4, **overrides) -> modernbert_config.ModernBertConfig:
    return modernbert_config.ModernBertConfig(
        **SPECIAL,
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=2,
        num_attention_heads=2,
        local_attention=window,
        layer_types=(kind, kind),
        max_position_embeddings=64,
        **overrides,
    )


def test_the_window_is_half_of_local_attention_on_each_side():
    config = _one_layer("sliding_attention", window=8, initializer_range=0.5)
    model = modernbert.ModernBertForMaskedLM(config)
    params = modernbert.init_params(model, jax.random.PRNGKey(0))
    ids, mask = inputs(32, rows=1, pad=0)
    base = our_logits(model, params, ids, mask)
    # Two sliding layers see 2 × 4 = 8 tokens to each side: position 10 hears positions 2 and 18, not 1 or 19.
    for far, heard in ((18, True), (2, True), (19, False), (1, False)):
        changed = ids.copy()
        changed[0, far] = (changed[0, far] + 1) % VOCAB
        moved = np.abs(our_logits(model, params, changed, mask)[0, 10] - base[0, 10]).max()
        assert (moved > 0) == heard, (far, moved)
    bias = np.asarray(attention_lib.xla_bias(jnp.ones((1, 12), jnp.int32), True, config.sliding_window))[0, 0]
    assert [(j, bias[5, j] == 0) for j in (0, 1, 9, 10)] == [(0, False), (1, True), (9, True), (10, False)]


def test_layer_zero_has_no_attention_norm_and_norms_have_no_bias():
    config = _one_layer("full_attention")
    params = modernbert.init_params(modernbert.ModernBertForMaskedLM(config), jax.random.PRNGKey(0))
    layers = params["model"]
    assert "attn_norm" not in layers["layers_0"] and "attn_norm" in layers["layers_1"]
    norms = [layers["embeddings_norm"], layers["final_norm"], layers["layers_1"]["attn_norm"], params["head_norm"]]
    assert all(set(n) == {"scale"} for n in norms)
    assert "bias" not in layers["layers_0"]["Wqkv"] and "bias" not in params["head_dense"]
    assert params["decoder_bias"].shape == (VOCAB,) and "decoder" not in params  # the decoder is the embedding


def test_global_and_local_layers_rotate_with_their_own_bases():
    ref = hf_model(layers=3, window=4)
    with torch.no_grad():  # sharp attention, so positions matter at this size
        for layer in ref.model.layers:
            layer.attn.Wqkv.weight.mul_(30.0)
    tensors = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
    config = modernbert_config.from_hf_dict(ref.config.to_dict())
    params = modernbert_hf.from_state_dict(config, tensors)
    ids, mask = inputs(16)
    good = our_logits(modernbert.ModernBertForMaskedLM(config), params, ids, mask)
    import dataclasses

    swapped = dataclasses.replace(
        config, global_rope_theta=config.local_rope_theta, local_rope_theta=config.global_rope_theta
    )
    bad = our_logits(modernbert.ModernBertForMaskedLM(swapped), params, ids, mask)
    assert np.abs(good - bad).max() > 1e-2  # each base matters, and which layers use which
    np.testing.assert_allclose(good[mask > 0], hf_logits(ref, ids, mask)[mask > 0], atol=1e-4)


# --- Packed rows ------------------------------------------------------------------------------------------


def test_packed_rows_give_each_instance_its_unpacked_logits():
    config = modernbert_config.ModernBertConfig(
        **SPECIAL,
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        local_attention=4,
        max_position_embeddings=64,
    )
    model = modernbert.ModernBertForMaskedLM(config)
    params = modernbert.init_params(model, jax.random.PRNGKey(1))
    rng = np.random.default_rng(2)
    a, b = rng.integers(3, VOCAB, 9), rng.integers(3, VOCAB, 6)
    row = np.concatenate([a, b, [0, 0, 0]])[None]
    instance = np.array([[1] * 9 + [2] * 6 + [0] * 3])
    positions = np.array([list(range(9)) + list(range(6)) + [0] * 3])
    packed = our_logits(model, params, row, instance, position_ids=jnp.asarray(positions))[0]
    alone_a = our_logits(model, params, a[None], np.ones((1, 9), int))[0]
    alone_b = our_logits(model, params, b[None], np.ones((1, 6), int))[0]
    np.testing.assert_allclose(packed[:9], alone_a, atol=1e-5)
    np.testing.assert_allclose(packed[9:15], alone_b, atol=1e-5)


# --- Bad inputs -------------------------------------------------------------------------------------------


def test_bad_configs_and_directories_are_one_sentence(tmp_path):
    with pytest.raises(ValueError, match=r"local_attention=5 is not even; it is the whole sliding window"):
        modernbert_config.ModernBertConfig(local_attention=5)
    with pytest.raises(ValueError, match=r"hidden_size=100 is not divisible by num_attention_heads=12"):
        modernbert_config.ModernBertConfig(hidden_size=100)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "roberta", "hidden_size": 8}))
    with pytest.raises(ValueError) as e:
        bertjax.from_pretrained(str(tmp_path))
    assert "model_type='roberta' is not BERT or ModernBERT" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"pad_token_id=50283 is outside the vocab \(vocab_size=97\); set the special"):
        modernbert_config.ModernBertConfig(vocab_size=VOCAB)
    ref = hf_model()
    ref.save_pretrained(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(
        json.dumps(dict(config, num_hidden_layers=4, layer_types=config["layer_types"] + ["full_attention"]))
    )
    with pytest.raises(
        ValueError,
        match=r"config\.json says num_hidden_layers=4, but the weights hold 3 layers: the "
        r"config\.json does not belong to these weights",
    ):
        bertjax.from_pretrained(str(tmp_path / "hf"))


def test_a_bare_modernbert_model_directory_loads_with_a_fresh_head(tmp_path, caplog):
    ref = hf_model()
    bare = ref.model
    bare.save_pretrained(tmp_path)
    model, params = bertjax.from_pretrained(str(tmp_path))
    ids, mask = inputs(16)
    with torch.no_grad():
        theirs = bare(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
    ours = model.apply({"params": params}, input_ids=jnp.asarray(ids), input_mask=jnp.asarray(mask)).sequence_output
    np.testing.assert_allclose(np.asarray(ours)[mask > 0], theirs[mask > 0], atol=1e-4)
    assert any("initialised fresh" in r.getMessage() and "head.dense" in r.getMessage() for r in caplog.records)


# --- Fine-tuning heads --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "task, pooling, hf_class",
    [
        ("sequence_classification", "cls", "ModernBertForSequenceClassification"),
        ("sequence_classification", "mean", "ModernBertForSequenceClassification"),
        ("token_classification", "cls", "ModernBertForTokenClassification"),
    ],
)
def test_finetuning_heads_export_to_their_transformers_class(tmp_path, task, pooling, hf_class):
    config = train_setup.tiny_modernbert(**SPECIAL, vocab_size=VOCAB, classifier_pooling=pooling)
    model = modernbert_heads.ModernBertForFinetuning(config, tasks.get(task).head(3))
    ids, mask = inputs(16, pad=6)
    params = nn.meta.unbox(model.init(jax.random.PRNGKey(5), jnp.asarray(ids), jnp.asarray(mask))["params"])
    params = jax.tree.map(
        lambda x: x + 0.05 * jax.random.normal(jax.random.PRNGKey(6), x.shape), jax.device_get(params)
    )  # biases and norms off their init values
    labels = ["neg", "neu", "pos"]
    modernbert_hf.save_finetuned(str(tmp_path), config, params, tasks.get(task).head(3), labels)
    ref, info = getattr(transformers, hf_class).from_pretrained(
        str(tmp_path), output_loading_info=True, attn_implementation="eager"
    )
    assert not any(info.values()), info
    assert ref.config.id2label == dict(enumerate(labels)) and ref.config.classifier_pooling == pooling
    ours = np.asarray(model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask)))
    with torch.no_grad():
        theirs = ref.eval()(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    if task == "token_classification":
        ours, theirs = ours[mask > 0], theirs[mask > 0]
    np.testing.assert_allclose(ours, theirs, atol=1e-4)
