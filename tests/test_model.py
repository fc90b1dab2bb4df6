"""Model options that must not change fp32 numerics, logical axes, dropout, dtype, config validation."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertjax.finetuning import tasks
from bertjax.models.bert import model as model_lib
from bertjax.models.bert import heads as bert_heads

import reference

CONFIG = model_lib.BertConfig(
    vocab_size=500,
    hidden_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=128,
    max_position_embeddings=64,
)


def loss_and_grads(model, params, inputs):
    def loss_fn(p):
        out = model.apply({"params": p}, **inputs)
        return jnp.mean(out.mlm_logits**2) + jnp.mean(out.nsp_logits**2)

    return jax.jit(jax.value_and_grad(loss_fn))(params)


def test_loop_scan_and_remat_are_numerically_identical():
    inputs = reference.batch(CONFIG)
    base = model_lib.BertForPreTraining(CONFIG)
    params = reference.random_params(base)
    base_loss, base_grads = loss_and_grads(base, params, inputs)
    for scan in (False, True):
        for policy in model_lib.REMAT_POLICIES:
            model = model_lib.BertForPreTraining(CONFIG, scan_layers=scan, remat_policy=policy)
            p = model_lib.stack_layers(params, CONFIG.num_hidden_layers) if scan else params
            loss, grads = loss_and_grads(model, p, inputs)
            grads = model_lib.unstack_layers(grads)
            np.testing.assert_allclose(loss, base_loss, rtol=1e-6, err_msg=f"scan={scan} remat={policy}")
            for g, h in zip(jax.tree.leaves(grads), jax.tree.leaves(base_grads)):
                np.testing.assert_allclose(g, h, atol=1e-6, rtol=1e-5, err_msg=f"scan={scan} remat={policy}")


def test_scan_unroll_reaches_the_scan_and_keeps_the_numbers():
    """config.model.scan_unroll: 1 leaves XLA a loop over the stacked layers, 0 none (every layer its own code,
    the params still stacked), 2 a loop of two layers an iteration; the same loss and gradients each way."""
    inputs = reference.batch(CONFIG)
    base = model_lib.BertForPreTraining(CONFIG)
    params = model_lib.stack_layers(reference.random_params(base), CONFIG.num_hidden_layers)
    results, loops = {}, {}
    for unroll in (0, 1, 2):
        model = model_lib.BertForPreTraining(CONFIG, scan_layers=True, scan_unroll=unroll)

        def loss_fn(p):
            out = model.apply({"params": p}, **inputs)
            return jnp.mean(out.mlm_logits**2) + jnp.mean(out.nsp_logits**2)

        step = jax.jit(jax.value_and_grad(loss_fn))
        loops[unroll] = step.lower(params).as_text().count("stablehlo.while")
        results[unroll] = step(params)
    assert CONFIG.num_hidden_layers > 2 and loops[0] == 0 and loops[1] > 0 and loops[2] > 0, loops
    for unroll in (1, 2):
        np.testing.assert_allclose(results[unroll][0], results[0][0], rtol=1e-6, err_msg=f"unroll={unroll}")
        for g, h in zip(jax.tree.leaves(results[unroll][1]), jax.tree.leaves(results[0][1])):
            np.testing.assert_allclose(g, h, atol=1e-6, rtol=1e-5, err_msg=f"unroll={unroll}")


def test_recomputed_activation_is_the_same_model_and_keeps_one_tensor_for_the_backward():
    """config.model.recompute_activation: layers.DenseActivation has nn.Dense's parameters and forward to the bit;
    recomputed, the backward keeps the matmul's output, not the activation's input (layers.exact_gelu keeps only
    that; jax.nn.gelu kept three [tokens, features] tensors: output, erfc, exp), and BERT's loss and gradients
    (loop and scan) stay those of the plain model."""
    from jax._src.ad_checkpoint import saved_residuals

    x = jnp.asarray(np.random.default_rng(0).normal(size=(4, 8, 16)), jnp.bfloat16)
    gelu = model_lib.ACTIVATIONS["gelu"]
    plain = nn.Dense(32, dtype=jnp.bfloat16)
    params = plain.init(jax.random.PRNGKey(0), x)
    kept = {}
    for recompute in (False, True):
        ours = model_lib.DenseActivation(32, dtype=jnp.bfloat16, activation=gelu, recompute=recompute)
        initial = ours.init(jax.random.PRNGKey(0), x)
        assert jax.tree.structure(initial) == jax.tree.structure(params)
        assert all(jax.tree.leaves(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), initial, params)))
        np.testing.assert_array_equal(ours.apply(params, x), gelu(plain.apply(params, x)))
        residuals = saved_residuals(lambda p, x: jnp.sum(ours.apply(p, x).astype(jnp.float32)), params, x)
        kept[recompute] = [why for value, why in residuals if value.shape == (4, 8, 32)]
    assert [len(kept[False]), len(kept[True])] == [1, 1], kept
    assert "output of add" in kept[False][0] and "dot_general" in kept[True][0], kept

    inputs = reference.batch(CONFIG)
    params = reference.random_params(model_lib.BertForPreTraining(CONFIG))
    base_loss, base_grads = loss_and_grads(model_lib.BertForPreTraining(CONFIG), params, inputs)
    for scan in (False, True):
        model = model_lib.BertForPreTraining(CONFIG, scan_layers=scan, recompute_activation=True)
        p = model_lib.stack_layers(params, CONFIG.num_hidden_layers) if scan else params
        loss, grads = loss_and_grads(model, p, inputs)
        np.testing.assert_allclose(loss, base_loss, rtol=1e-6)
        for g, h in zip(jax.tree.leaves(model_lib.unstack_layers(grads)), jax.tree.leaves(base_grads)):
            np.testing.assert_allclose(g, h, atol=1e-6, rtol=1e-5, err_msg=f"scan={scan}")


def test_exact_gelu_is_pytorchs_gelu_forward_and_backward():
    """layers.exact_gelu (config "gelu", BERT's and ModernBERT's) computes what torch.nn.functional.gelu computes,
    in float32 from erf whatever the dtype: in bfloat16 equal to PyTorch's but for float32 rounding on a few
    elements, where jax.nn.gelu's bfloat16 arithmetic was off by up to 0.016 (and 0.031 in the gradient)."""
    import torch

    gelu = model_lib.ACTIVATIONS["gelu"]
    x = np.random.default_rng(0).normal(0, 3, 65_536).astype(np.float32)
    g = np.random.default_rng(1).normal(size=x.shape).astype(np.float32)
    for dtype, torch_dtype, ulp in ((jnp.float32, torch.float32, 2e-6), (jnp.bfloat16, torch.bfloat16, 2**-6)):
        xt = torch.tensor(x).to(torch_dtype).requires_grad_()
        yt = torch.nn.functional.gelu(xt)
        yt.backward(torch.tensor(g).to(torch_dtype))
        y, vjp = jax.vjp(gelu, jnp.asarray(x, dtype))
        (dx,) = vjp(jnp.asarray(g, dtype))
        assert y.dtype == dx.dtype == dtype
        for ours, theirs in ((y, yt.detach()), (dx, xt.grad)):
            ours, theirs = np.asarray(ours.astype(jnp.float32)), theirs.float().numpy()
            # within a unit in the last place of the value's own size (bfloat16: 8 bits), and mostly bit for bit
            np.testing.assert_allclose(ours, theirs, rtol=ulp, atol=2e-6 if dtype == jnp.float32 else 2**-16)
            assert np.mean(ours == theirs) > (0.25 if dtype == jnp.float32 else 0.9)


@functools.partial(jax.jit, static_argnums=(0, 3))
def _pooled(model, params, inputs, pooled_only, rng=None, **extra):
    return model.apply(
        {"params": params},
        inputs["input_ids"],
        inputs["segment_ids"],
        inputs["input_mask"],
        deterministic=rng is None,
        rngs={} if rng is None else {"dropout": rng},
        pooled_only=pooled_only,
        **extra,
    )[1]


@pytest.mark.parametrize("packed", [False, True])
def test_pooled_only_computes_the_same_pooled_output_with_less_work(packed):
    """pooled_only: the last layer computes only the [CLS] rows. Same pooled output and gradients (loop,
    scan, remat; padded rows, or packed rows with several instances), dropout still keyed, fewer FLOPs."""
    inputs = reference.batch(CONFIG, seq_len=32)
    extra = {}
    if packed:  # two instances per row: tokens 0..15 and 16..31, each starting with its [CLS]
        half = np.arange(32) >= 16
        inputs["input_mask"] = (1 + half[None, :] * np.ones((3, 1), int)).astype(np.int32)
        extra = dict(
            position_ids=jnp.asarray(np.tile(np.arange(32) % 16, (3, 1)), jnp.int32),
            cls_positions=jnp.asarray(np.tile([0, 16], (3, 1)), jnp.int32),
        )
    loop = model_lib.BertModel(CONFIG, packed=packed)
    params = reference.random_params(model_lib.BertForPreTraining(CONFIG))["bert"]
    full = _pooled(loop, params, inputs, False, **extra)
    assert full.shape == ((3, 2, 64) if packed else (3, 64))
    full_grads = jax.jit(jax.grad(lambda p: jnp.sum(_pooled(loop, p, inputs, False, **extra) ** 2)))(params)
    for scan in (False, True):
        for policy in ("none", "full"):
            model = model_lib.BertModel(CONFIG, scan_layers=scan, remat_policy=policy, packed=packed)
            p = model_lib.stack_layers({"bert": params}, CONFIG.num_hidden_layers)["bert"] if scan else params
            np.testing.assert_allclose(
                _pooled(model, p, inputs, True, **extra), full, atol=2e-6, err_msg=f"scan={scan} remat={policy}"
            )
            grads = jax.jit(jax.grad(lambda q: jnp.sum(_pooled(model, q, inputs, True, **extra) ** 2)))(p)
            if scan:
                grads = model_lib.unstack_layers({"bert": grads})["bert"]
            for g, h in zip(jax.tree.leaves(grads), jax.tree.leaves(full_grads)):
                np.testing.assert_allclose(g, h, atol=2e-5, rtol=1e-4, err_msg=f"scan={scan} remat={policy}")
            key = jax.random.PRNGKey(3)
            dropped = _pooled(model, p, inputs, True, key, **extra)
            np.testing.assert_array_equal(dropped, _pooled(model, p, inputs, True, key, **extra))
            assert not np.allclose(dropped, full, atol=1e-3)
    flops = {
        only: jax.jit(lambda q, only=only: _pooled(loop, q, inputs, only, **extra))
        .lower(params)
        .compile()
        .cost_analysis()["flops"]
        for only in (False, True)
    }
    # The last layer's queries, output projection and feed-forward run on 1 (or 2) rows of 32: 1 of the 3
    # layers is ~10/12 skipped.
    assert flops[True] < 0.8 * flops[False], flops


def test_predictions_only_gives_the_same_pretraining_logits_and_gradients():
    """Pre-training's last layer on the [CLS] and masked rows only (the train step's forward)."""
    inputs = reference.batch(CONFIG)
    params = reference.random_params(model_lib.BertForPreTraining(CONFIG))
    base_loss, base_grads = loss_and_grads(model_lib.BertForPreTraining(CONFIG), params, inputs)
    for scan in (False, True):
        model = model_lib.BertForPreTraining(CONFIG, scan_layers=scan)
        p = model_lib.stack_layers(params, CONFIG.num_hidden_layers) if scan else params
        assert model.apply({"params": p}, **inputs, predictions_only=True).sequence_output is None
        loss, grads = loss_and_grads(model, p, dict(inputs, predictions_only=True))
        grads = model_lib.unstack_layers(grads) if scan else grads
        np.testing.assert_allclose(loss, base_loss, rtol=1e-6, err_msg=f"scan={scan}")
        for g, h in zip(jax.tree.leaves(grads), jax.tree.leaves(base_grads)):
            np.testing.assert_allclose(g, h, atol=2e-6, rtol=1e-5, err_msg=f"scan={scan}")
    model = model_lib.BertForPreTraining(CONFIG)
    flops = {
        only: jax.jit(lambda q, only=only: model.apply({"params": q}, **inputs, predictions_only=only).mlm_logits)
        .lower(params)
        .compile()
        .cost_analysis()["flops"]
        for only in (False, True)
    }
    assert flops[True] < 0.9 * flops[False], flops  # 6 of 24 rows in the last of 3 layers


def test_stack_unstack_round_trip():
    params = reference.random_params(model_lib.BertForPreTraining(CONFIG))
    stacked = model_lib.stack_layers(params, CONFIG.num_hidden_layers)
    assert stacked["bert"]["encoder"]["layers"]["query"]["kernel"].shape == (3, 64, 4, 16)
    back = model_lib.unstack_layers(stacked)
    assert jax.tree.structure(back) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("scan", [False, True])
def test_every_parameter_has_logical_axes(scan):
    model = model_lib.BertForPreTraining(CONFIG, scan_layers=scan)
    boxed = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), **model_lib.dummy_inputs()))["params"]
    leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
    assert leaves and all(isinstance(x, nn.LogicallyPartitioned) for x in leaves)
    allowed = {"embed", "heads", "kv", "mlp", "vocab", "layers", None}
    for leaf in leaves:
        assert len(leaf.names) == leaf.value.ndim and set(leaf.names) <= allowed, leaf.names
    names = {tuple(x.names) for x in leaves}
    assert (("layers", "embed", "heads", "kv") in names) == scan
    assert ("vocab", "embed") in names


def test_dropout_is_active_only_when_not_deterministic():
    model = model_lib.BertForPreTraining(CONFIG, scan_layers=True)
    params = model_lib.init_params(model, jax.random.PRNGKey(0))
    inputs = {k: v for k, v in reference.batch(CONFIG).items() if k != "masked_lm_positions"}

    def run(seed, deterministic):
        return model.apply(
            {"params": params}, **inputs, deterministic=deterministic, rngs={"dropout": jax.random.PRNGKey(seed)}
        ).sequence_output

    np.testing.assert_array_equal(run(0, True), run(1, True))
    np.testing.assert_array_equal(run(0, False), run(0, False))
    assert not np.allclose(run(0, False), run(1, False))
    assert not np.allclose(run(0, False), run(0, True))


def _drop_masks(rate, keys, shape):
    dropout = model_lib.Dropout(rate)
    ones = jnp.ones(shape)
    return [np.asarray(dropout.apply({}, ones, deterministic=False, rngs={"dropout": k}) == 0) for k in keys]


def test_dropout_rate_scaling_and_independence():
    """The hash keep-mask behaves like independent Bernoulli draws: the drop rate, inverted scaling,
    no correlation between neighbouring elements or between keys, and none within a key's stream."""
    rate, shape = 0.1, (4, 12, 128, 128)  # an attention-probs tensor, 786k elements
    n = np.prod(shape)
    sigma = np.sqrt(rate * (1 - rate) / n)
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    a, b, c = _drop_masks(rate, keys, shape)
    for m in (a, b, c):
        assert abs(m.mean() - rate) < 5 * sigma
    flat = a.reshape(-1)
    assert abs((flat[1:] & flat[:-1]).mean() - rate**2) < 5 * np.sqrt(rate**2 / n)  # neighbours
    assert abs((a & b).mean() - rate**2) < 5 * np.sqrt(rate**2 / n)  # two keys
    assert abs((a.reshape(-1)[: n // 2] & a.reshape(-1)[n // 2 :]).mean() - rate**2) < 10 * np.sqrt(rate**2 / n)
    # Each row of the attention-probs tensor drops its own positions.
    rows = a.reshape(-1, shape[-1])
    assert len({r.tobytes() for r in rows[:1000]}) == 1000
    out = model_lib.Dropout(rate).apply({}, jnp.full((1000,), 3.0), deterministic=False, rngs={"dropout": keys[0]})
    out = np.asarray(out)
    np.testing.assert_allclose(out[out != 0], 3.0 / 0.9, rtol=1e-6)  # inverted dropout keeps E[x]
    for edge, expected in ((0.0, 0.0), (1.0, 1.0)):
        assert _drop_masks(edge, keys[:1], (64,))[0].mean() == expected


def test_dropout_bits_do_not_depend_on_sharding():
    """Counter-based like threefry: an 8-way sharded computation draws the same mask as one device."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    key, shape = jax.random.PRNGKey(3), (8, 12, 16, 16)
    single = jax.jit(lambda k: model_lib.hash_bits(k, shape))(key)
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "tensor"))
    sharded = jax.jit(lambda k: model_lib.hash_bits(k, shape), out_shardings=NamedSharding(mesh, P("data", "tensor")))(
        key
    )
    assert len(sharded.sharding.device_set) == 8
    np.testing.assert_array_equal(np.asarray(sharded), np.asarray(single))


def _relative_error(a, b) -> float:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_bfloat16_compute_keeps_float32_params_and_logits():
    model32 = model_lib.BertForPreTraining(CONFIG)
    model16 = model_lib.BertForPreTraining(CONFIG, dtype=jnp.bfloat16)
    params = model_lib.init_params(model16, jax.random.PRNGKey(0))
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
    inputs = reference.batch(CONFIG)
    out16 = model16.apply({"params": params}, **inputs)
    out32 = model32.apply({"params": params}, **inputs)
    assert out16.mlm_logits.dtype == jnp.float32 and out16.nsp_logits.dtype == jnp.float32
    assert out16.sequence_output.dtype == jnp.bfloat16
    np.testing.assert_allclose(out16.mlm_logits, out32.mlm_logits, atol=0.1)
    assert np.corrcoef(np.ravel(out16.mlm_logits), np.ravel(out32.mlm_logits))[0, 1] > 0.999


def test_bfloat16_layer_norm_keeps_float32_statistics():
    # Rows far from zero mean: bf16 sums of 64 values near 100 lose whole units, fp32 ones do not.
    x = (100 + jax.random.normal(jax.random.PRNGKey(0), (4, 64))).astype(jnp.bfloat16)
    norm = model_lib.make_layer_norm(CONFIG, jnp.bfloat16, "LayerNorm")
    params = norm.init(jax.random.PRNGKey(1), x)
    out = norm.apply(params, x)
    exact = np.asarray(x, np.float64)
    exact = (exact - exact.mean(-1, keepdims=True)) / np.sqrt(exact.var(-1, keepdims=True) + CONFIG.layer_norm_eps)
    assert out.dtype == jnp.bfloat16
    assert _relative_error(out, exact) < 5e-3  # bf16 rounding of the output only (8 bits: 2^-9 ≈ 2e-3)


def test_bfloat16_per_op_tolerances_against_float32():
    """Each stage of a bf16 step against fp32 on the same params: embeddings, every layer, logits, loss
    and gradients; softmax scores, logits, loss and gradients are float32 in both."""
    model32 = model_lib.BertForPreTraining(CONFIG)
    model16 = model_lib.BertForPreTraining(CONFIG, dtype=jnp.bfloat16)
    params = reference.random_params(model32)
    inputs = reference.batch(CONFIG)

    def intermediates(model):
        out, state = model.apply({"params": params}, **inputs, capture_intermediates=True)
        return out, state["intermediates"]

    out32, mid32 = intermediates(model32)
    out16, mid16 = intermediates(model16)
    embeddings = ("bert", "embeddings", "__call__")
    layers = [("bert", "encoder", f"layer_{i}", "__call__") for i in range(CONFIG.num_hidden_layers)]
    for path, tolerance in [(embeddings, 5e-3)] + [(p, 1.5e-2) for p in layers]:  # measured: 0.3%, ≤ 0.7%
        a, b = mid16, mid32
        for key in path:
            a, b = a[key], b[key]
        a, b = (a[0][0], b[0][0]) if isinstance(a[0], tuple) else (a[0], b[0])
        assert a.dtype == jnp.bfloat16 and b.dtype == jnp.float32, path
        assert _relative_error(a, b) < tolerance, (path, _relative_error(a, b))
    assert _relative_error(out16.mlm_logits, out32.mlm_logits) < 3e-2
    assert _relative_error(out16.nsp_logits, out32.nsp_logits) < 6e-2  # small logits: rounding weighs more
    loss16, grads16 = loss_and_grads(model16, params, inputs)
    loss32, grads32 = loss_and_grads(model32, params, inputs)
    assert loss16.dtype == jnp.float32 and abs(float(loss16) / float(loss32) - 1) < 2e-2
    scale = float(optax.global_norm(grads32))
    for (path, g16), g32 in zip(jax.tree_util.tree_leaves_with_path(grads16), jax.tree.leaves(grads32)):
        assert g16.dtype == jnp.float32
        # Relative to the leaf, or to a thousandth of all gradients for leaves whose true gradient is ~0
        # (the key bias: softmax ignores what it adds to every score of a query).
        error = float(np.linalg.norm(g16 - g32)) / max(float(np.linalg.norm(g32)), 1e-3 * scale)
        assert error < 0.03, (jax.tree_util.keystr(path), error)  # measured: ≤ 1.4%


def test_bf16_weight_matmuls_accumulate_in_float32_forward_and_backward_in_the_form_xla_cpu_runs_natively():
    """layers.dot_general inside bf16_dots_accumulate_f32(True) (what the trainer traces CPU steps under): a bf16
    weight matmul is bf16 × bf16 → float32, cast to bf16, and so are both gradient matmuls, whose float32
    gradient is cast to bf16 first, as PyTorch's autocast does. Outside the context, and for float32, it is
    lax.dot_general itself. XLA:CPU then multiplies bf16 operands (no float32 copy of them in the program)."""
    from bertjax.models import layers

    x = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 3, 8)).astype(jnp.bfloat16)
    k = jax.random.normal(jax.random.PRNGKey(1), (3, 8, 6)).astype(jnp.bfloat16)
    dims = (((2, 3), (0, 1)), ((), ()))  # nn.DenseGeneral(axis=(-2, -1)): the attention output's form
    f32 = functools.partial(jax.lax.dot_general, dimension_numbers=dims, preferred_element_type=jnp.float32)

    def loss(f, x, k):
        return jnp.sum(f(x, k).astype(jnp.float32) ** 2)

    with layers.bf16_dots_accumulate_f32(True):
        y = layers.dot_general(x, k, dims)
        gx, gk = jax.grad(functools.partial(loss, lambda a, b: layers.dot_general(a, b, dims)), (0, 1))(x, k)
        text = jax.jit(lambda a, b: layers.dot_general(a, b, dims)).lower(x, k).compile().as_text()
    assert y.dtype == jnp.bfloat16 and gx.dtype == jnp.bfloat16 and gk.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(f32(x, k).astype(jnp.bfloat16), np.float32))
    g = (2 * f32(x, k).astype(jnp.bfloat16).astype(jnp.float32)).astype(jnp.bfloat16)  # d(sum y²)/dy, in bf16
    g2, x2, k2 = g.reshape(10, 6), x.reshape(10, 24), k.reshape(24, 6)
    want_x = jax.lax.dot(g2, k2.T, preferred_element_type=jnp.float32).astype(jnp.bfloat16).reshape(x.shape)
    want_k = jax.lax.dot(x2.T, g2, preferred_element_type=jnp.float32).astype(jnp.bfloat16).reshape(k.shape)
    np.testing.assert_array_equal(np.asarray(gx, np.float32), np.asarray(want_x, np.float32))
    np.testing.assert_array_equal(np.asarray(gk, np.float32), np.asarray(want_k, np.float32))
    if jax.default_backend() == "cpu":  # the operands reach the matmul as bf16; a plain bf16 dot copies them to f32
        plain_text = jax.jit(lambda a, b: layers.dot_general(a, b, dims)).lower(x, k).compile().as_text()
        assert "f32[10,24]" in plain_text and "f32[24,6]" in plain_text
        assert "f32[10,24]" not in text and "f32[24,6]" not in text, text[-2000:]
    # Off (the default: GPUs, TPUs), and in float32: lax.dot_general to the bit.
    plain = jax.lax.dot_general(x, k, dims)
    np.testing.assert_array_equal(np.asarray(layers.dot_general(x, k, dims), np.float32), np.asarray(plain, np.float32))
    x32, k32 = x.astype(jnp.float32), k.astype(jnp.float32)
    with layers.bf16_dots_accumulate_f32(True):
        np.testing.assert_array_equal(layers.dot_general(x32, k32, dims), jax.lax.dot_general(x32, k32, dims))


def test_bfloat16_embedding_gradients_accumulate_in_float32():
    """layers.Embed: the forward values of nn.Embed in bf16, bit for bit, but the table's gradient summed in
    float32 (a scatter-add in bf16 was 60% of a GPU step, and rounds a sum over every token to 8 bits), and
    for the two-row token-type table by a one-hot matmul: no scatter at all."""
    rng = np.random.default_rng(0)
    for rows in (2, 64, 500):
        ids = jnp.asarray(rng.integers(0, rows, (32, 128)), jnp.int32)
        cotangent = jnp.asarray(rng.normal(size=(32, 128, 16)), jnp.float32)
        ours, flax_bf16 = model_lib.Embed(rows, 16, dtype=jnp.bfloat16), nn.Embed(rows, 16, dtype=jnp.bfloat16)
        params = ours.init(jax.random.PRNGKey(0), ids)
        np.testing.assert_array_equal(ours.apply(params, ids), flax_bf16.apply(params, ids))

        def grad(module):
            loss = lambda p: jnp.sum(module.apply(p, ids).astype(jnp.float32) * cotangent)  # noqa: E731
            return jax.jit(jax.grad(loss))(params)["params"]["embedding"]

        exact = grad(nn.Embed(rows, 16, dtype=jnp.float32))
        assert _relative_error(grad(ours), exact) < 3e-3, rows  # the bf16 rounding of each row's cotangent
        if rows == 2:  # what the bf16 sum of 2,048 rows per entry loses
            assert _relative_error(grad(flax_bf16), exact) > 1e-2

    model = model_lib.BertForPreTraining(CONFIG, dtype=jnp.bfloat16)
    params = reference.random_params(model)
    inputs = reference.batch(CONFIG)
    # The program jax hands XLA: the scatter's dtype is jax's choice (XLA:CPU may then lower scatters to loops).
    hlo = jax.jit(lambda p: loss_and_grads(model, p, inputs)[1]).lower(params).compiler_ir("hlo").as_hlo_text()
    scatters = [line.split("=", 1)[1].strip() for line in hlo.splitlines() if " scatter(" in line]
    tables = [s for s in scatters if s.split("{")[0].count(",") == 1]  # into a 2-D table: an embedding's gradient
    assert tables and all(s.startswith("f32[") for s in tables), scatters
    assert not any(s.startswith(f"f32[{CONFIG.type_vocab_size},") for s in tables), scatters


def test_mlm_decoder_is_tied_to_word_embeddings():
    model = model_lib.BertForPreTraining(CONFIG)
    params = reference.random_params(model)
    inputs = reference.batch(CONFIG)
    bumped = jax.tree.map(lambda x: x, params)
    table = bumped["bert"]["embeddings"]["word_embeddings"]["embedding"]
    direction = jax.random.normal(jax.random.PRNGKey(3), table.shape[1:])
    bumped["bert"]["embeddings"]["word_embeddings"]["embedding"] = table.at[7].add(direction)
    h = model.apply({"params": params}, **inputs)
    g = model.apply({"params": bumped}, **inputs)
    # Token 7's logit moves at every position; no separate decoder matrix exists to absorb it.
    assert np.all(np.abs(g.mlm_logits[..., 7] - h.mlm_logits[..., 7]) > 1e-3)
    assert not any("decoder" in "/".join(map(str, path)) for path, _ in jax.tree_util.tree_leaves_with_path(params))


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("num_attention_heads", 5, "hidden_size=64 is not divisible by num_attention_heads=5"),
        ("hidden_act", "gelu_fast", "hidden_act='gelu_fast' is not one of"),
        ("hidden_dropout_prob", 1.5, r"hidden_dropout_prob=1.5 must be in \[0, 1\)"),
        ("vocab_size", 0, "vocab_size=0 must be a positive integer"),
    ],
)
def test_bad_architecture_is_one_clear_error(field, value, message):
    fields = {**CONFIG.to_dict(), field: value}
    with pytest.raises(ValueError, match=message):
        model_lib.BertConfig(**fields)
    with pytest.raises(ValueError, match=f"my_config.json: {message}"):
        model_lib.BertConfig.from_dict(fields, source="my_config.json")


@pytest.mark.parametrize("scan_layers", [False, True])
def test_heads_initialised_alone_equal_a_full_init(scan_layers):
    """Loading an encoder-only checkpoint (hf.from_hf_state_dict) and starting a fine-tuning head
    (finetuning, heads.fresh_head) initialise the heads without the body: the values must be those a full init
    gives, or a run from init_from would depend on which path built its head."""

    rng = jax.random.PRNGKey(3)
    model = model_lib.BertForPreTraining(CONFIG, scan_layers=scan_layers)
    full, alone = model_lib.init_params(model, rng), model_lib.init_params(model, rng, heads_only=True)
    assert set(alone) == set(full) - {"bert"}
    jax.tree.map(np.testing.assert_array_equal, alone, {k: full[k] for k in alone})
    for task in ("sequence_classification", "token_classification", "question_answering"):
        head_model = bert_heads.BertForFinetuning(CONFIG, tasks.get(task).head(3), scan_layers=scan_layers)
        full = nn.meta.unbox(head_model.init(rng, **model_lib.dummy_inputs(1, 8))["params"])
        alone = head_model.fresh_head(rng)
        assert set(alone) == set(full) - {"bert"} and alone
        jax.tree.map(np.testing.assert_array_equal, alone, {k: full[k] for k in alone})
