"""ModernBERT's compute paths, each the same numbers as the reference path it replaces: splash's local mask and the
sliding window computed in blocks against xla's band, the recomputed GeGLU, the tied decoder's bf16 backward; and
what the compiled programs do (the FLOPs formula, splash's skipped blocks, no fusion across layers)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.models import attention as attention_lib, layers
from bertjax.models.modernbert import model as modernbert, config as modernbert_config

VOCAB = 97
SPECIAL = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)


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
        # Two programs, which XLA may fuse differently: float32 rounding apart (3e-7 relative under the suite's emitters).
        np.testing.assert_allclose(
            np.asarray(b), np.asarray(a), rtol=1e-6, atol=1e-6, err_msg=jax.tree_util.keystr(path)
        )


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
