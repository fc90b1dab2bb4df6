"""ModernBERT (bertjax/models/): equal to transformers' ModernBertForMaskedLM (eager attention, fp32, 1e-4)
in both directions, the architecture's traps each tested on its own, packed rows, and bad inputs."""

from __future__ import annotations

import functools
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax.models import attention as attention_lib, layers
from bertjax.runtime import xla_flags as xla_flags_lib
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


# --- Kernels ----------------------------------------------------------------------------------------------


def _loss_and_grads(
    attention: str, packed: bool, seq: int = 100, window: int = 16, window_block: int = 0, recompute: bool = False
):
    """A masked-LM loss and its gradients, and the real tokens' outputs, by one attention kernel."""
    config = modernbert_config.ModernBertConfig(
        **SPECIAL,
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=2,
        local_attention=window,
        max_position_embeddings=512,
    )
    model = modernbert.ModernBertForMaskedLM(
        config, attention=attention, packed=packed, window_block=window_block, recompute_activation=recompute
    )
    params = modernbert.init_params(modernbert.ModernBertForMaskedLM(config), jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    ids = rng.integers(3, VOCAB, (2, seq))
    mask = np.ones_like(ids)
    mask[1, seq * 7 // 10 :] = 0
    positions = np.broadcast_to(np.arange(seq), ids.shape).copy()
    if packed:  # row 0: three instances
        a, b = seq * 4 // 10, seq * 3 // 4
        mask[0, a:b], mask[0, b:] = 2, 3
        positions[0, a:b], positions[0, b:] = np.arange(b - a), np.arange(seq - b)
    targets = rng.integers(3, VOCAB, ids.shape)

    def loss(p):
        out = model.apply(
            {"params": p}, input_ids=jnp.asarray(ids), input_mask=jnp.asarray(mask), position_ids=jnp.asarray(positions)
        )
        logp = jax.nn.log_softmax(out.mlm_logits)
        picked = jnp.take_along_axis(logp, jnp.asarray(targets)[..., None], -1)[..., 0]
        return -jnp.sum(picked * (mask > 0)), jnp.where(jnp.asarray(mask > 0)[..., None], out.sequence_output, 0.0)

    return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)


@pytest.mark.parametrize(
    "packed, seq, window",
    [(False, 100, 16), (True, 100, 16), (True, 384, 8), (False, 384, 320)],
    ids=["padded", "packed", "3-blocks-narrow-window", "3-blocks-window-wider-than-a-block"],
)
def test_splash_with_its_local_mask_equals_xla(packed, seq, window):
    """Pallas's splash kernel (interpreted here) with LocalMask for the sliding layers, outputs and gradients.
    At seq 384 the kernel runs 3 × 3 blocks of 128: a window of 4 tokens a side skips the 2 blocks outside it,
    one of 160 a side (wider than a block) masks inside all 9; both equal xla, so no even window is refused."""
    if seq == 384:
        assert attention_lib.splash_blocks_computed(seq, window // 2) == ((7, 9) if window == 8 else (9, 9))
    (loss_a, out_a), grads_a = _loss_and_grads("xla", packed, seq, window)
    (loss_b, out_b), grads_b = _loss_and_grads("splash", packed, seq, window)
    np.testing.assert_allclose(float(loss_b), float(loss_a), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(out_b), np.asarray(out_a), atol=1e-5)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(grads_a), jax.tree.leaves(grads_b)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5, err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize(
    "packed, seq, window, block",
    [(False, 100, 16, 8), (True, 100, 16, 8), (True, 100, 16, 12), (False, 96, 8, 32), (True, 64, 160, 16)],
    ids=[
        "padded",
        "packed",
        "block-not-a-multiple-of-the-window",
        "blocks-wider-than-the-window",
        "window-wider-than-the-row",
    ],
)
def test_the_window_in_blocks_equals_the_whole_sequence_under_a_band(packed, seq, window, block):
    """attention.windowed (sliding layers in blocks of queries, each against the keys its window reaches) gives
    the outputs and gradients of one attention over the whole sequence with the band in its bias: padded and
    packed rows, a row that is no whole number of blocks, blocks that are no multiple of the window."""
    (loss_a, out_a), grads_a = _loss_and_grads("xla", packed, seq, window)
    (loss_b, out_b), grads_b = _loss_and_grads("xla", packed, seq, window, window_block=block)
    np.testing.assert_allclose(float(loss_b), float(loss_a), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(out_b), np.asarray(out_a), atol=1e-5)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(grads_a), jax.tree.leaves(grads_b)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5, err_msg=jax.tree_util.keystr(path))


def test_recomputed_geglu_gives_the_same_loss_and_gradients():
    """config.model.recompute_activation: GeGLU's backward recomputes it from Wi's output, the same numbers."""
    (loss_a, out_a), grads_a = _loss_and_grads("xla", True)
    (loss_b, out_b), grads_b = _loss_and_grads("xla", True, recompute=True)
    np.testing.assert_allclose(float(loss_b), float(loss_a), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(out_b), np.asarray(out_a), atol=1e-6)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(grads_a), jax.tree.leaves(grads_b)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-6, err_msg=jax.tree_util.keystr(path))


def _vocab_dots(jaxpr, vocab: int) -> list[tuple]:
    """The operand dtypes of every dot_general in `jaxpr` (and the jaxprs inside it) with a `vocab`-long axis."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general" and any(vocab in v.aval.shape for v in eqn.invars):
            found.append(tuple(str(v.aval.dtype) for v in eqn.invars))
        for param in eqn.params.values():
            for inner in param if isinstance(param, (list, tuple)) else [param]:
                if hasattr(inner, "jaxpr"):
                    found += _vocab_dots(inner.jaxpr if hasattr(inner.jaxpr, "eqns") else inner.jaxpr.jaxpr, vocab)
                elif hasattr(inner, "eqns"):
                    found += _vocab_dots(inner, vocab)
    return found


def test_the_tied_decoders_backward_multiplies_in_the_compute_dtype():
    """layers.vocab_logits: float32 logits, and gradients whose matmuls take bfloat16 operands under bf16 compute
    (autodiff's took float32 ones: TF32 on a GPU), within bf16's tolerance of float32's; in float32, autodiff's."""
    vocab = 101
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 6, 16))
    table = jax.random.normal(jax.random.PRNGKey(1), (vocab, 16)) * 0.2
    w = jax.random.normal(jax.random.PRNGKey(2), (2, 6, vocab))

    def loss(fn, x, table):
        return jnp.sum(jax.nn.log_softmax(fn(x, table)) * w)

    def autodiff(x, table):
        return jnp.einsum("...e,ve->...v", x, table.astype(x.dtype), preferred_element_type=jnp.float32)

    grads = jax.grad(functools.partial(loss, layers.vocab_logits), argnums=(0, 1))(x, table)
    expect = jax.grad(functools.partial(loss, autodiff), argnums=(0, 1))(x, table)
    for a, b in zip(grads, expect):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    x16 = x.astype(jnp.bfloat16)
    assert layers.vocab_logits(x16, table).dtype == jnp.float32
    d_x, d_table = jax.grad(functools.partial(loss, layers.vocab_logits), argnums=(0, 1))(x16, table)
    assert d_x.dtype == jnp.bfloat16 and d_table.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(d_x, np.float32), np.asarray(expect[0]), atol=0.05)
    np.testing.assert_allclose(np.asarray(d_table), np.asarray(expect[1]), atol=0.05)
    jaxpr = jax.make_jaxpr(jax.grad(functools.partial(loss, layers.vocab_logits), argnums=(0, 1)))(x16, table).jaxpr
    assert _vocab_dots(jaxpr, vocab) == [("bfloat16", "bfloat16")] * 3, _vocab_dots(jaxpr, vocab)
    jaxpr = jax.make_jaxpr(jax.grad(functools.partial(loss, autodiff), argnums=(0, 1)))(x16, table).jaxpr
    assert any("float32" in dtypes for dtypes in _vocab_dots(jaxpr, vocab))  # what XLA turned into f32 matmuls


def test_auto_blocks_the_window_on_xla_once_a_row_holds_six_windows():
    auto = attention_lib.AUTO_BLOCK
    assert attention_lib.block_size(auto, "xla", 1024, 64) == 64  # ModernBERT-base's phase 1
    assert attention_lib.block_size(auto, "xla", 384, 64) == 64
    assert attention_lib.block_size(auto, "xla", 383, 64) == 0
    assert attention_lib.block_size(auto, "cudnn", 1024, 64) == 0  # not measured on a GPU yet
    assert attention_lib.block_size(128, "cudnn", 1024, 64) == 128 and attention_lib.block_size(0, "xla", 1024, 64) == 0
    assert attention_lib.block_size(64, "splash", 1024, 64) == 0  # splash skips the blocks itself


def test_window_blocks_hold_each_block_its_windows_keys():
    """The keys of block i are positions i·block − window … (i+1)·block + window − 1, zeros outside the row, and
    the mask lets a query see exactly the real keys of its instance at most `window` away."""
    length, block, window = 10, 4, 2
    x = jnp.arange(1, length + 1)[None]
    keys = np.asarray(attention_lib.window_blocks(x, block, window, keys=True))[0]
    for i, row in enumerate(keys):
        expect = [p + 1 if 0 <= p < length else 0 for p in range(i * block - window, (i + 1) * block + window)]
        assert row.tolist() == expect
    mask = jnp.asarray([[1, 1, 1, 2, 2, 2, 2, 0, 0, 0]])
    allowed = np.asarray(attention_lib.window_allowed(mask, block, window))
    full = np.asarray(attention_lib.allowed_keys(mask, True, window))[0, 0]
    for i in range(3):
        for a in range(block):
            q = i * block + a
            if q >= length or mask[0, q] == 0:
                continue
            seen = {i * block - window + c for c in np.flatnonzero(allowed[i, 0, a])}
            assert seen == set(np.flatnonzero(full[q])), q


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
    config = modernbert_config.ModernBertConfig(
        **SPECIAL,
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        local_attention=6,
        max_position_embeddings=64,
        classifier_pooling=pooling,
    )
    model = modernbert_heads.ModernBertForFinetuning(config, task, num_labels=3)
    ids, mask = inputs(16, pad=6)
    params = nn.meta.unbox(model.init(jax.random.PRNGKey(5), jnp.asarray(ids), jnp.asarray(mask))["params"])
    params = jax.tree.map(
        lambda x: x + 0.05 * jax.random.normal(jax.random.PRNGKey(6), x.shape), jax.device_get(params)
    )  # biases and norms off their init values
    labels = ["neg", "neu", "pos"]
    modernbert_hf.save_finetuned(str(tmp_path), config, params, task, labels)
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


def test_the_flops_formula_counts_what_xla_compiles():
    """Forward FLOPs of the xla kernel's program (which computes every score, masked or not) against the
    formula without window savings; a window saves exactly the keys it leaves out, and computed in blocks
    the program drops about the scores and context of the keys outside each block's reach."""
    config = modernbert_config.ModernBertConfig(
        **SPECIAL,
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        local_attention=16,
        max_position_embeddings=256,
    )
    params = modernbert.init_params(modernbert.ModernBertForMaskedLM(config), jax.random.PRNGKey(0))
    ids = jnp.ones((1, 256), jnp.int32)

    def counted_flops(window_block):
        model = modernbert.ModernBertForMaskedLM(config, window_block=window_block)
        logits = jax.jit(lambda p: model.apply({"params": p}, input_ids=ids, input_mask=ids).mlm_logits)
        return logits.lower(params).compile().cost_analysis()["flops"]

    counted = counted_flops(0)
    formula = modernbert.flops_per_sequence(config, 256, training=False, window_saves=False)
    # XLA counts elementwise work too (softmax and masking of every score, norms, rotary, GELU): ~10% here.
    assert 0.85 < formula / counted <= 1.0, (formula, counted)
    saved = formula - modernbert.flops_per_sequence(config, 256, training=False)
    assert saved == 2 * 2 * 2 * 256 * (256 - 17) * 64  # two sliding layers, 17 keys of 256 each
    blocks_save = 2 * 2 * 2 * 256 * (256 - 24) * 64  # blocks of 8 queries reach 24 keys, not 256
    assert 1.0 < (counted - counted_flops(8)) / blocks_save < 1.3, (counted, counted_flops(8))  # + softmax, mask


def test_splash_skips_the_blocks_outside_the_window():
    """ModernBERT-base's window (64 each side) at seq 2,048: splash computes 46 of 256 blocks of 128 (the
    diagonal and its neighbours) in a sliding layer, every block in a global one."""
    assert attention_lib.splash_block(2048) == 512 and attention_lib.splash_block(2048, 64) == 128
    assert attention_lib.splash_blocks_computed(2048, 64) == (16 + 2 * 15, 256)
    assert attention_lib.splash_blocks_computed(2048) == (16, 16)
    computed, total = attention_lib.splash_blocks_computed(8192, 64)
    assert computed / total < 0.05  # at ModernBERT's longest rows a sliding layer costs under 5% of a global one


def test_the_backward_fuses_nothing_across_layers():
    """Pre-norm's residual gradient is a chain of elementwise adds through every layer; XLA:CPU fused it into
    each layer's weight-gradient transpose, recomputing it per layer (ModernBERT-base's CPU step 2.3× slower
    than transformers', growing with depth). `_gradient_barrier` computes it once per layer: without it the
    largest fusion of a 12-layer model's gradient takes 227 operands, with it 19."""
    import re

    config = modernbert_config.ModernBertConfig(
        **SPECIAL,
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=12,
        num_attention_heads=4,
        local_attention=8,
        max_position_embeddings=64,
    )
    model = modernbert.ModernBertModel(config)
    ids = jnp.ones((2, 16), jnp.int32)
    params = model.init(jax.random.PRNGKey(0), ids, ids)
    hlo = jax.jit(jax.grad(lambda p: jnp.sum(model.apply(p, ids, ids)[0] ** 2))).lower(params).compile().as_text()
    widest = max(m.group(1).count("%") for m in re.finditer(r"= \S+ fusion\((.*?)\), kind=", hlo))
    assert widest < 40, widest


def test_with_cudnns_layer_norm_asked_for_the_norms_gain_a_zero_bias_and_nothing_changes(monkeypatch):
    """XLA_FLAGS=--xla_gpu_enable_cudnn_layer_norm=true: ModernBERT's bias-less norms become
    layers.ZeroBiasLayerNorm (a form XLA:GPU's cuDNN rewrite matches), with the same parameters, logits and
    gradients, bit for bit, in float32 and bfloat16; the flag off or false: plain nn.LayerNorm."""
    config = modernbert_config.ModernBertConfig(
        **SPECIAL, vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2
    )
    ids = jnp.asarray(np.random.default_rng(0).integers(3, VOCAB, (2, 24)))
    params = modernbert.init_params(modernbert.ModernBertForMaskedLM(config), jax.random.PRNGKey(0))

    def run(dtype):
        model = modernbert.ModernBertForMaskedLM(config, dtype=dtype)
        loss = lambda p: jnp.sum(jax.nn.log_softmax(model.apply({"params": p}, input_ids=ids).mlm_logits)[..., 5])
        text = jax.jit(loss).lower(params).as_text()
        return jax.jit(jax.value_and_grad(loss))(params), text

    for dtype in (jnp.float32, jnp.bfloat16):
        monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_cudnn_layer_norm=false")
        (loss_a, grads_a), plain = run(dtype)
        monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_gpu_enable_cudnn_layer_norm=true")
        (loss_b, grads_b), zero_bias = run(dtype)
        assert float(loss_a) == float(loss_b)
        for a, b in zip(jax.tree.leaves(grads_a), jax.tree.leaves(grads_b)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        # scale · 0 in each of the 8 norms: embeddings, attention (layers 1 and 2), MLP (3), final, head.
        assert zero_bias.count("stablehlo.multiply") - plain.count("stablehlo.multiply") == 8
    assert xla_flags_lib.cudnn_layer_norm({"XLA_FLAGS": "--xla_gpu_enable_cudnn_layer_norm"})
    assert not xla_flags_lib.cudnn_layer_norm(
        {"XLA_FLAGS": "--xla_gpu_enable_cudnn_layer_norm=1 --xla_gpu_enable_cudnn_layer_norm=0"}
    )
    assert not xla_flags_lib.cudnn_layer_norm({})
