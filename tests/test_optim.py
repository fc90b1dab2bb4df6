"""bertjax.training.optim: schedule, weight-decay mask, BERT's AdamW against a numpy re-implementation, LAMB, clipping."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertjax.models.bert import model as model_lib
from bertjax.training import optim
from bertjax.config.schema import OptimConfig, convert
from configs import default as default_config

TINY = model_lib.config_for_size("tiny", vocab_size=128, max_position_embeddings=16)


def _cfg(**kw) -> OptimConfig:
    return dataclasses.replace(OptimConfig(), **kw)


def _flat(tree) -> dict[str, object]:
    return {"/".join(str(k.key) for k in path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _init(scan_layers: bool):
    """The real model's param tree (names, shapes); random values, without compiling the model's init."""
    model = model_lib.BertForPreTraining(TINY, scan_layers=scan_layers)
    shapes = jax.eval_shape(lambda rng: model_lib.init_params(model, rng), jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    return jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s.shape) * 0.02, s.dtype), shapes)


@pytest.fixture(scope="module")
def loop_params():
    return _init(scan_layers=False)


def test_adamw_with_bias_correction_matches_torch_adamw():
    """`optim.bias_correction`: torch.optim.AdamW (sentence-transformers' and the HF Trainer's), with the same
    weight-decay exclusions, clip_grad_norm_ and linear schedule, for three steps."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    shapes = {"dense/kernel": (3, 4), "dense/bias": (4,), "LayerNorm/scale": (4,)}
    flat = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    grads = [{k: (rng.normal(size=s) * 2).astype(np.float32) for k, s in shapes.items()} for _ in range(3)]
    cfg = _cfg(learning_rate=1e-2, warmup_steps=2, weight_decay=0.01, max_grad_norm=1.0, bias_correction=True)
    num_steps = 10
    tx = optim.make_optimizer(cfg, num_steps)
    params = jax.tree.map(jnp.asarray, _nest(flat))
    state = tx.init(params)
    for g in grads:
        updates, state = tx.update(jax.tree.map(jnp.asarray, _nest(g)), state, params)
        params = optax.apply_updates(params, updates)

    tensors = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in flat.items()}
    decayed = [tensors["dense/kernel"]]
    opt = torch.optim.AdamW(
        [
            {"params": decayed, "weight_decay": 0.01},
            {"params": [tensors["dense/bias"], tensors["LayerNorm/scale"]], "weight_decay": 0.0},
        ],
        lr=1e-2,
        betas=(0.9, 0.999),
        eps=1e-6,
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: s / 2 if s < 2 else 1 - (s - 2) / 8)
    for g in grads:
        for k, t in tensors.items():
            t.grad = torch.tensor(g[k], dtype=torch.float64)
        torch.nn.utils.clip_grad_norm_(list(tensors.values()), 1.0)
        opt.step()
        sched.step()
    got = _flat(params)
    for name in shapes:
        np.testing.assert_allclose(got[name], tensors[name].detach().numpy(), rtol=1e-5, atol=1e-7, err_msg=name)
    # and not BERT's optimizer, which the default (bias_correction off) is
    bert = _bert_adamw_reference(
        flat, grads, lambda s: 1e-2 * s / 2 if s < 2 else 1e-2 * (1 - (s - 2) / 8), 0.01, 0.9, 0.999, 1e-6, 1.0
    )
    assert not np.allclose(got["dense/kernel"], bert["dense/kernel"], rtol=1e-4)


@pytest.fixture(scope="module")
def scan_params():
    return _init(scan_layers=True)


# --- config ------------------------------------------------------------------------------------------


def test_from_config_reads_default_section():
    cfg = convert(OptimConfig, default_config.get_config().optim, "config.optim")
    assert cfg == OptimConfig(
        name="adamw",
        learning_rate=1e-4,
        warmup_steps=10_000,
        schedule="linear",
        weight_decay=0.01,
        b1=0.9,
        b2=0.999,
        eps=1e-6,
        max_grad_norm=1.0,
        bias_correction=False,
    )
    assert isinstance(cfg.warmup_steps, int) and isinstance(cfg.learning_rate, float)
    cfg.validate(1_000_000)


def test_from_config_rejects_unknown_and_missing_keys():
    section = dict(dataclasses.asdict(OptimConfig()), warmup=5)
    with pytest.raises(
        ValueError, match=r"config\.optim\.warmup is not a setting; did you mean config\.optim\.warmup_steps\?"
    ):
        convert(OptimConfig, section, "config.optim")
    section = dataclasses.asdict(OptimConfig())
    del section["eps"]
    with pytest.raises(ValueError, match=r"config\.optim\.eps is missing"):
        convert(OptimConfig, section, "config.optim")


@pytest.mark.parametrize(
    "field,value,pattern",
    [
        ("name", "sgd", r"config\.optim\.name='sgd' is not one of"),
        ("schedule", "exponential", r"config\.optim\.schedule='exponential' is not one of"),
        ("decay_shape", "sqrt", r"config\.optim\.decay_shape='sqrt' is not one of"),
        ("decay_steps", 100, r"config\.optim\.decay_steps=100 is wsd's setting, but config\.optim\.schedule='linear'"),
        ("learning_rate", -1e-4, r"config\.optim\.learning_rate=-0\.0001 must be a positive"),
        ("learning_rate", float("nan"), r"config\.optim\.learning_rate"),
        ("warmup_steps", -1, r"config\.optim\.warmup_steps=-1 must be >= 0"),
        ("warmup_steps", 2000, r"config\.optim\.warmup_steps=2000 exceeds config\.train\.num_train_steps=1000"),
        ("weight_decay", -0.01, r"config\.optim\.weight_decay"),
        ("b1", 1.0, r"config\.optim\.b1=1\.0 must be in \[0, 1\)"),
        ("b2", -0.1, r"config\.optim\.b2"),
        ("eps", 0.0, r"config\.optim\.eps=0\.0 must be > 0"),
        ("max_grad_norm", -1.0, r"config\.optim\.max_grad_norm=-1\.0"),
    ],
)
def test_validate_names_the_bad_field(field, value, pattern):
    with pytest.raises(ValueError, match=pattern):
        _cfg(**{field: value}).validate(1000)
    with pytest.raises(ValueError, match=pattern):
        optim.make_optimizer(_cfg(**{field: value}), 1000)


def test_validate_num_train_steps():
    with pytest.raises(ValueError, match=r"config\.train\.num_train_steps=0"):
        _cfg(warmup_steps=0).validate(0)
    _cfg(warmup_steps=1000).validate(1000)  # warmup may take the whole run


# --- schedule ----------------------------------------------------------------------------------------


def test_linear_schedule_values():
    lr = optim.schedule(_cfg(learning_rate=1e-3, warmup_steps=100), 1000)
    expected = {0: 0.0, 50: 5e-4, 99: 9.9e-4, 100: 1e-3, 550: 5e-4, 910: 1e-4, 1000: 0.0, 1500: 0.0}
    for step, value in expected.items():
        assert float(lr(step)) == pytest.approx(value, abs=1e-9), step
    assert float(lr(np.int64(550))) == pytest.approx(5e-4)  # a host step, as a log line would pass
    # traceable with an int32 step, as inside the train step
    assert float(jax.jit(lr)(jnp.int32(50))) == pytest.approx(5e-4)


def test_schedule_without_warmup_starts_at_peak():
    lr = optim.schedule(_cfg(learning_rate=2e-4, warmup_steps=0), 100)
    assert float(lr(0)) == pytest.approx(2e-4)
    assert float(lr(50)) == pytest.approx(1e-4)
    assert float(lr(100)) == 0.0


def test_cosine_and_constant_schedules():
    cos = optim.schedule(_cfg(learning_rate=1e-3, warmup_steps=10, schedule="cosine"), 110)
    assert float(cos(5)) == pytest.approx(5e-4)
    assert float(cos(10)) == pytest.approx(1e-3)
    assert float(cos(60)) == pytest.approx(5e-4, rel=1e-5)
    assert float(cos(110)) == pytest.approx(0.0, abs=1e-9)
    const = optim.schedule(_cfg(learning_rate=1e-3, warmup_steps=10, schedule="constant"), 110)
    assert float(const(5)) == pytest.approx(5e-4)
    assert float(const(109)) == pytest.approx(1e-3)


@pytest.mark.parametrize(
    "shape,expected",
    [
        # warmup 10 steps to 1e-3, the peak until step 60, then 40 decay steps to 0 at 100
        ("linear", {0: 0.0, 5: 5e-4, 10: 1e-3, 59: 1e-3, 60: 1e-3, 70: 7.5e-4, 90: 2.5e-4, 100: 0.0, 150: 0.0}),
        (
            "1-sqrt",
            {
                0: 0.0,
                5: 5e-4,
                10: 1e-3,
                60: 1e-3,
                70: 5e-4,
                61: 1e-3 * (1 - 0.025**0.5),
                96: 1e-3 * (1 - 0.9**0.5),
                100: 0.0,
            },
        ),
    ],
)
def test_wsd_schedule_values(shape, expected):
    lr = optim.schedule(
        _cfg(learning_rate=1e-3, warmup_steps=10, schedule="wsd", decay_shape=shape, decay_steps=40), 100
    )
    for step, value in expected.items():
        assert float(lr(step)) == pytest.approx(value, abs=1e-9), (shape, step)
    assert float(jax.jit(lr)(jnp.int32(70))) == pytest.approx(expected[70])


def test_wsd_decay_phase_must_exist_and_fit_the_run():
    with pytest.raises(
        ValueError,
        match=r"config\.optim\.decay_steps=0 leaves schedule=wsd no decay phase; "
        r"set --config\.optim\.decay_steps=N",
    ):
        _cfg(schedule="wsd").validate(100)
    with pytest.raises(
        ValueError,
        match=r"config\.optim\.decay_steps=95 and config\.optim\.warmup_steps=10 add up "
        r"to more than config\.train\.num_train_steps=100",
    ):
        _cfg(schedule="wsd", warmup_steps=10, decay_steps=95).validate(100)
    with pytest.raises(ValueError, match=r"config\.optim\.decay_shape='1-sqrt' is wsd's setting"):
        _cfg(schedule="cosine", decay_shape="1-sqrt").validate(100)
    _cfg(schedule="wsd", warmup_steps=10, decay_steps=90).validate(100)  # no stable phase is allowed


def test_the_old_decay_setting_is_read_from_saved_runs_and_named_in_configs():
    from bertjax.config.schema import JobConfig

    saved = JobConfig().to_dict()
    saved["optim"].pop("schedule")
    saved["optim"]["decay"] = "cosine"  # a config.json written before schedule replaced decay
    assert JobConfig.from_saved(saved).optim.schedule == "cosine"
    section = dict(dataclasses.asdict(OptimConfig()), decay="cosine")
    with pytest.raises(ValueError, match=r"config\.optim\.decay is now config\.optim\.schedule; rename it"):
        convert(OptimConfig, section, "config.optim")


# --- weight-decay mask on the real model -------------------------------------------------------------

BERT_EXCLUDE = ("LayerNorm", "layer_norm", "bias")  # google-research/bert's exclude_from_weight_decay


@pytest.mark.parametrize("layout", ["loop", "scan"])
def test_mask_matches_berts_exclusion_regexes(layout, loop_params, scan_params):
    params = loop_params if layout == "loop" else scan_params
    mask = _flat(optim.weight_decay_mask(params))
    shapes = {k: v.shape for k, v in _flat(params).items()}
    assert set(mask) == set(shapes)
    for name, decays in mask.items():
        assert decays == (not any(re.search(r, name) for r in BERT_EXCLUDE)), name
        leaf = name.split("/")[-1]
        if leaf in ("kernel", "embedding"):
            assert decays, name
    excluded = {n for n, d in mask.items() if not d}
    # every LayerNorm module's scale and bias, every bias, and the MLM output bias
    for module in ("bert/embeddings/LayerNorm", "transform_layer_norm"):
        assert {f"{module}/scale", f"{module}/bias"} <= excluded
    prefix = "bert/encoder/layers" if layout == "scan" else "bert/encoder/layer_1"
    for module in ("attention_layer_norm", "output_layer_norm"):
        assert {f"{prefix}/{module}/scale", f"{prefix}/{module}/bias"} <= excluded
    assert {"mlm_bias", "nsp/bias", "bert/pooler/bias", f"{prefix}/query/bias"} <= excluded
    assert {"bert/embeddings/word_embeddings/embedding", f"{prefix}/query/kernel", "nsp/kernel"} <= set(mask) - excluded
    if layout == "scan":  # scanned LayerNorm scales are 2-D: an ndim rule would get them wrong
        assert shapes[f"{prefix}/attention_layer_norm/scale"] == (TINY.num_hidden_layers, TINY.hidden_size)


def test_scan_mask_is_the_stacked_loop_mask(loop_params, scan_params):
    stacked = model_lib.stack_layers(loop_params, TINY.num_hidden_layers)
    assert _flat(optim.weight_decay_mask(stacked)) == _flat(optim.weight_decay_mask(scan_params))


# --- BERT's AdamW -----------------------------------------------------------------------------------


def _bert_adamw_reference(params, grads_per_step, lr_fn, wd, b1, b2, eps, clip_norm):
    """numpy re-implementation of google-research/bert optimization.py: clip_by_global_norm, then
    AdamWeightDecayOptimizer.apply_gradients (no bias correction), exclusion by name regex."""
    params = {k: np.asarray(v, np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(p) for k, p in params.items()}
    for step, grads in enumerate(grads_per_step):
        grads = {k: np.asarray(g, np.float64) for k, g in grads.items()}
        norm = np.sqrt(sum(np.sum(g**2) for g in grads.values()))
        grads = {k: g * clip_norm / max(norm, clip_norm) for k, g in grads.items()}
        lr = lr_fn(step)
        for k in params:
            m[k] = b1 * m[k] + (1 - b1) * grads[k]
            v[k] = b2 * v[k] + (1 - b2) * grads[k] ** 2
            update = m[k] / (np.sqrt(v[k]) + eps)
            if not any(re.search(r, k) for r in BERT_EXCLUDE):
                update = update + wd * params[k]
            params[k] = params[k] - lr * update
    return params


def _nest(flat: dict) -> dict:
    out: dict = {}
    for name, value in flat.items():
        *parents, leaf = name.split("/")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def test_adamw_matches_google_research_bert_for_three_steps():
    rng = np.random.default_rng(0)
    shapes = {
        "dense/kernel": (3, 4),
        "dense/bias": (4,),
        "LayerNorm/scale": (4,),
        "LayerNorm/bias": (4,),
        "word_embeddings/embedding": (5, 4),
        "mlm_bias": (5,),
    }
    flat = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    grads = [{k: (rng.normal(size=s) * 2).astype(np.float32) for k, s in shapes.items()} for _ in range(3)]
    cfg = _cfg(learning_rate=1e-2, warmup_steps=2, weight_decay=0.01, max_grad_norm=1.0)
    num_steps = 10
    lr_fn = lambda s: 1e-2 * s / 2 if s < 2 else 1e-2 * (1 - (s - 2) / 8)  # noqa: E731
    expected = _bert_adamw_reference(flat, grads, lr_fn, 0.01, 0.9, 0.999, 1e-6, 1.0)

    tx = optim.make_optimizer(cfg, num_steps)
    params = jax.tree.map(jnp.asarray, _nest(flat))
    state = tx.init(params)
    step = jax.jit(lambda p, s, g: (lambda u, s2: (optax.apply_updates(p, u), s2))(*tx.update(g, s, p)))
    for g in grads:
        params, state = step(params, state, jax.tree.map(jnp.asarray, _nest(g)))
    got = _flat(params)
    for name in shapes:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-7, err_msg=name)
    # and it is *not* optax.adamw (which bias-corrects): the difference is visible after 3 steps
    ref = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(optim.schedule(cfg, num_steps), 0.9, 0.999, 1e-6, weight_decay=0.01, mask=optim.weight_decay_mask),
    )
    p2, s2 = jax.tree.map(jnp.asarray, _nest(flat)), None
    s2 = ref.init(p2)
    for g in grads:
        u, s2 = ref.update(jax.tree.map(jnp.asarray, _nest(g)), s2, p2)
        p2 = optax.apply_updates(p2, u)
    assert not np.allclose(_flat(p2)["dense/kernel"], got["dense/kernel"], rtol=1e-4)


def test_adamw_state_mirrors_params(loop_params):
    tx = optim.make_optimizer(_cfg(warmup_steps=1), 10)
    state = tx.init(loop_params)
    adam = [s for s in state if isinstance(s, optim.BertAdamState)]
    assert len(adam) == 1
    for moment in (adam[0].mu, adam[0].nu):
        assert jax.tree.structure(moment) == jax.tree.structure(loop_params)
        assert jax.tree.map(lambda a, b: a.shape == b.shape and a.dtype == b.dtype, moment, loop_params)
    # only arrays in the state (orbax-friendly), and it survives jit as in/out
    assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(state))


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_no_weight_decay_on_biases_and_layernorm(name):
    params = {
        "dense": {"kernel": jnp.full((2, 3), 2.0), "bias": jnp.full((3,), 2.0)},
        "LayerNorm": {"scale": jnp.full((3,), 2.0), "bias": jnp.full((3,), 2.0)},
        "mlm_bias": jnp.ones(4),
    }
    cfg = _cfg(name=name, learning_rate=0.1, warmup_steps=0, schedule="constant", weight_decay=0.01)
    tx = optim.make_optimizer(cfg, 10)
    state = tx.init(params)
    zeros = jax.tree.map(jnp.zeros_like, params)
    updates, state = tx.update(zeros, state, params)
    new = optax.apply_updates(params, updates)
    for path in ("dense/bias", "LayerNorm/scale", "LayerNorm/bias", "mlm_bias"):
        np.testing.assert_array_equal(_flat(new)[path], _flat(params)[path], err_msg=path)
    if name == "adamw":  # decoupled decay: w ← w − lr·wd·w
        np.testing.assert_allclose(new["dense"]["kernel"], 2.0 * (1 - 0.1 * 0.01), rtol=1e-6)
    else:  # LAMB: decay then trust ratio ||w||/||wd·w|| rescales the update to lr·||w||
        np.testing.assert_allclose(new["dense"]["kernel"], 2.0 * (1 - 0.1), rtol=1e-5)


# --- LAMB --------------------------------------------------------------------------------------------


def test_lamb_trust_ratio_per_layer_and_layout_independent(loop_params):
    cfg = _cfg(
        name="lamb", learning_rate=1e-2, warmup_steps=0, schedule="constant", weight_decay=0.0, max_grad_norm=0.0
    )
    tx = optim.make_optimizer(cfg, 10)
    rng = np.random.default_rng(0)
    grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), loop_params)
    updates, _ = jax.jit(tx.update)(grads, tx.init(loop_params), loop_params)
    flat_u, flat_p, flat_g = _flat(updates), _flat(loop_params), _flat(grads)
    for name, p in flat_p.items():
        u = np.asarray(flat_u[name])
        if name.endswith("kernel") or name.endswith("embedding"):
            # trust ratio: every decayed tensor moves by exactly lr · ||w||
            assert np.linalg.norm(u) == pytest.approx(1e-2 * np.linalg.norm(p), rel=1e-4), name
        else:  # biases / LayerNorm: plain bias-corrected Adam step, |u| = lr·|g|/(|g|+eps) ≈ lr
            g = np.abs(np.asarray(flat_g[name]))
            np.testing.assert_allclose(np.abs(u), 1e-2 * g / (g + 1e-6), rtol=1e-5, err_msg=name)
    # scanned layout: one trust ratio per layer, so the updates equal the stacked loop updates
    n = TINY.num_hidden_layers
    sp, sg = model_lib.stack_layers(loop_params, n), model_lib.stack_layers(grads, n)
    s_updates, _ = jax.jit(tx.update)(sg, tx.init(sp), sp)
    expected = _flat(model_lib.stack_layers(updates, n))
    for name, u in _flat(s_updates).items():
        np.testing.assert_allclose(u, expected[name], rtol=1e-5, atol=1e-9, err_msg=name)


# --- clipping ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_clipping_bounds_the_gradient_that_reaches_the_moments(name):
    params = {"dense": {"kernel": jnp.ones((10, 10))}}
    grads = {"dense": {"kernel": jnp.full((10, 10), 100.0)}}  # global norm 1000

    def first_moment(max_grad_norm):
        tx = optim.make_optimizer(_cfg(name=name, max_grad_norm=max_grad_norm, warmup_steps=0), 10)
        _, state = tx.update(grads, tx.init(params), params)
        return optax.tree_utils.tree_get(state, "mu")

    assert float(optax.global_norm(first_moment(1.0))) == pytest.approx(0.1 * 1.0, rel=1e-5)
    assert float(optax.global_norm(first_moment(0.0))) == pytest.approx(0.1 * 1000.0, rel=1e-5)


def test_clip_by_global_norm_is_tensorflows():
    """g · max / max(‖g‖, max): untouched (bitwise) below the bound, norm exactly max above it, and a
    NaN gradient stays NaN (so the train step's non-finite check sees it)."""
    clip = optim.clip_by_global_norm(1.0)
    small = {"a": jnp.array([0.3, -0.4]), "b": jnp.array([[0.1]])}
    out, _ = clip.update(small, clip.init(small))
    jax.tree.map(np.testing.assert_array_equal, out, small)
    big = jax.tree.map(lambda x: x * 100.0, small)
    out, _ = clip.update(big, clip.init(big))
    assert float(optax.global_norm(out)) == pytest.approx(1.0, rel=1e-6)
    np.testing.assert_allclose(out["a"] / out["a"][0], big["a"] / big["a"][0], rtol=1e-6)
    nan = {"a": jnp.array([jnp.nan, 1.0]), "b": jnp.array([[0.1]])}
    assert np.isnan(np.asarray(clip.update(nan, clip.init(nan))[0]["b"])).all()


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_state_shards_like_params(name):
    """optax.tree_map_params puts each param's PartitionSpec on its mu/nu; counters stay replicated."""
    from jax.sharding import PartitionSpec as P

    params = {"dense": {"kernel": jnp.ones((4, 4)), "bias": jnp.ones(4)}, "LayerNorm": {"scale": jnp.ones(4)}}
    specs = {"dense": {"kernel": P("fsdp", "tensor"), "bias": P("tensor")}, "LayerNorm": {"scale": P(None)}}
    tx = optim.make_optimizer(_cfg(name=name, warmup_steps=1), 10)
    state_specs = optax.tree_map_params(
        tx,
        lambda _, spec: spec,
        jax.eval_shape(tx.init, params),
        specs,
        transform_non_params=lambda _: P(),
        is_leaf=lambda x: isinstance(x, P),
    )
    assert optax.tree_utils.tree_get(state_specs, "mu") == specs
    assert optax.tree_utils.tree_get(state_specs, "nu") == specs
    leaves = jax.tree.leaves(state_specs, is_leaf=lambda x: isinstance(x, P))
    assert sum(spec == P() for spec in leaves) == 2  # adam count + schedule count
