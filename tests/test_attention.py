"""config.model.attention: how each name resolves, and splash (Pallas interpret mode on this CPU) against
the xla reference in fp32: outputs and gradients w.r.t. every parameter, with padding and with packed
instances, loop and scan layers, on one device and on a (data, fsdp, tensor) mesh of 8 virtual devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.models import attention
from bertjax.models import partitioning
from bertjax.training import metrics as metrics_lib
from bertjax.models.bert import model as model_lib
from bertjax.training import sharding as sharding_lib
from bertjax.config.schema import JobConfig

SEQ, PRED, VOCAB = 48, 6, 300  # 48 is no multiple of splash's 128: the kernel pads and slices
RULES = JobConfig().mesh.logical_axis_rules


# --- Which implementation ----------------------------------------------------------------------------


def test_auto_picks_the_backends_kernel_and_says_why(caplog):
    with caplog.at_level("INFO", logger="bertjax"):
        assert attention.choose("auto", 0.0, "cpu") == "xla"
        assert attention.choose("auto", 0.0, "tpu") == "splash"
        assert attention.choose("auto", 0.0, "gpu") == "cudnn"
        assert attention.choose("auto", 0.1, "tpu") == "xla"
    assert "auto chose splash on tpu" in caplog.text
    assert "auto chose xla on tpu: config.model.attention_probs_dropout_prob=0.1" in caplog.text


@pytest.mark.parametrize("name", ["splash", "cudnn"])
def test_a_fused_kernel_with_attention_dropout_names_both_ways_out(name):
    with pytest.raises(
        ValueError,
        match=rf"attention={name} has no attention-probability dropout .*"
        r"attention_probs_dropout_prob=0 .* or use --config.model.attention=xla",
    ):
        attention.choose(name, 0.1, "gpu")


def test_cudnn_off_a_gpu_and_unknown_names_are_one_sentence():
    with pytest.raises(ValueError, match="attention=cudnn needs an NVIDIA GPU, but the devices are cpu"):
        attention.choose("cudnn", 0.0, "cpu")
    with pytest.raises(ValueError, match=r"config.model.attention='flash' is not one of"):
        JobConfig.from_configdict(
            dict(JobConfig().to_dict(), model=dict(JobConfig().to_dict()["model"], attention="flash"))
        )


def test_splash_off_tpu_says_it_interprets(caplog):
    with caplog.at_level("INFO", logger="bertjax"):
        assert attention.choose("splash", 0.0, "cpu") == "splash"
    assert "Pallas interpret mode" in caplog.text


# --- What cuDNN is given (its kernel needs a GPU; the arguments are checked here by jax's xla path) ----


def _reference_attention(q, k, v, mask, window):
    """Softmax attention of each real query over the keys it may see: real, of its own instance (packed
    rows number them 1, 2, ...), at most `window` positions away."""
    q, k, v, mask = (np.asarray(a, np.float64) for a in (q, k, v, mask))
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    index = np.arange(mask.shape[1])
    allowed = (mask[:, None, :] > 0) & (mask[:, :, None] == mask[:, None, :])
    if window is not None:
        allowed &= np.abs(index[:, None] - index[None, :])[None] <= window
    scores = np.where(allowed[:, None], scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return np.einsum("bhqk,bkhd->bqhd", weights / weights.sum(-1, keepdims=True), v)


@pytest.mark.parametrize("packed,window", [(False, None), (True, None), (False, 3), (True, 3)])
def test_cudnn_arguments_mask_padding_instances_and_the_window_both_sides(packed, window):
    # On an H200, jax 0.11's cuDNN path refused ModernBERT's window: "cuDNN doesn't support right window: 64
    # when causal mask is not used". The window now travels in the bias; no local_window_size is passed.
    q, k, v = (jax.random.normal(jax.random.PRNGKey(i), (2, 16, 2, 8)) for i in range(3))
    mask = (
        np.array([[1] * 12 + [0] * 4, [1] * 16])
        if not packed
        else np.array([[1] * 5 + [2] * 7 + [0] * 4, [1] * 9 + [2] * 7])
    )
    arguments = attention.cudnn_arguments(jnp.asarray(mask), packed, window)
    assert "local_window_size" not in arguments and "bias" not in arguments
    # Boolean: jax then asks cuDNN for no bias gradient (jax-ml/jax#39512), as it does for any float bias.
    assert ("mask" in arguments) == (packed or window is not None)
    assert "mask" not in arguments or arguments["mask"].dtype == jnp.bool_
    out = jax.nn.dot_product_attention(q, k, v, **arguments, implementation="xla")
    real = mask > 0
    np.testing.assert_allclose(np.asarray(out)[real], _reference_attention(q, k, v, mask, window)[real], atol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_cudnn_arguments_keep_padding_beyond_the_window_finite_in_half_precision(dtype):
    # A padding query more than the window away from every real token sees no key. With float32's minimum as
    # the bias (-inf in half precision) its softmax was NaN, and the next layer spread that to real tokens.
    # The bias cuDNN gets is jax's own from the boolean mask; the xla implementation stands in for the kernel.
    from jax._src.cudnn.fused_attention_stablehlo import combine_bias_and_mask

    mask = np.array([[1] * 4 + [0] * 12, [1] * 5 + [2] * 3 + [0] * 8])
    q, k, v = (jax.random.normal(jax.random.PRNGKey(i), (2, 16, 2, 8)).astype(dtype) for i in range(3))
    for packed in (False, True):
        rows = mask if packed else (mask > 0).astype(int)
        arguments = attention.cudnn_arguments(jnp.asarray(rows), packed, 2)
        bias = combine_bias_and_mask(None, arguments["mask"], dtype)
        assert bias.dtype == dtype and np.isfinite(np.asarray(bias, np.float32)).all()
        first = jax.nn.dot_product_attention(q, k, v, bias=bias, implementation="xla")
        second = jax.nn.dot_product_attention(first, first, first, bias=bias, implementation="xla")
        assert np.isfinite(np.asarray(first, np.float32)).all() and np.isfinite(np.asarray(second, np.float32)).all()
        reference = _reference_attention(*(np.asarray(x, np.float32) for x in (q, k, v)), rows, 2)
        np.testing.assert_allclose(np.asarray(first, np.float32)[rows > 0], reference[rows > 0], atol=3e-2)


# --- splash equals xla ---------------------------------------------------------------------------------


def batch(packed: bool) -> dict[str, np.ndarray]:
    """4 rows: padded unpacked rows, or rows of 1–3 instances (input_mask numbers them) and padding."""
    rng = np.random.default_rng(0)
    input_mask = np.zeros((4, SEQ), np.int32)
    for row, lengths in enumerate([[48], [30], [20, 15, 10], [12, 30]] if packed else [[48], [30], [40], [9]]):
        start = 0
        for i, n in enumerate(lengths):
            input_mask[row, start : start + n] = i + 1
            start += n
    input_ids = rng.integers(5, VOCAB, (4, SEQ)) * (input_mask > 0)
    positions = np.stack([rng.choice(np.flatnonzero(m), PRED, replace=False) for m in input_mask])
    return dict(
        input_ids=input_ids.astype(np.int32),
        input_mask=input_mask,
        segment_ids=(rng.random((4, SEQ)) < 0.5).astype(np.int32) * (input_mask > 0),
        masked_lm_positions=positions.astype(np.int32),
        masked_lm_ids=rng.integers(5, VOCAB, (4, PRED)).astype(np.int32),
        masked_lm_weights=np.ones((4, PRED), np.float32),
        next_sentence_labels=rng.integers(0, 2, (4,)).astype(np.int32),
    )


def loss_grads_and_output(implementation: str, scan: bool, packed: bool, mesh_shape=None):
    arch = model_lib.config_for_size(
        "tiny",
        vocab_size=VOCAB,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = model_lib.BertForPreTraining(arch, scan_layers=scan, attention=implementation, packed=packed)
    params = model_lib.init_params(model, jax.random.PRNGKey(0))
    b = {k: jnp.asarray(v) for k, v in batch(packed).items()}

    def loss(params, b):
        out = model.apply(
            {"params": params},
            b["input_ids"],
            b["segment_ids"],
            b["input_mask"],
            masked_lm_positions=b["masked_lm_positions"],
        )
        sums = metrics_lib.pretraining_metrics(
            out.mlm_logits, b["masked_lm_ids"], b["masked_lm_weights"], out.nsp_logits, b["next_sentence_labels"]
        )
        real = (b["input_mask"] > 0)[..., None]
        return metrics_lib.pretraining_loss(sums), jnp.where(real, out.sequence_output, 0.0)

    step = jax.jit(jax.value_and_grad(loss, has_aux=True))
    if mesh_shape is None:
        return step(params, b)
    mesh = sharding_lib.make_mesh(mesh_shape)
    boxed = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), **model_lib.dummy_inputs(1, SEQ))["params"])
    params = jax.device_put(params, sharding_lib.logical_shardings(boxed, mesh, RULES))
    b = {k: jax.device_put(v, sharding_lib.batch_sharding(mesh, RULES, v.ndim)) for k, v in b.items()}
    with partitioning.activation_rules(mesh, RULES):
        return step(params, b)


def assert_same(reference, other, label: str):
    (loss_a, out_a), grads_a = reference
    (loss_b, out_b), grads_b = other
    np.testing.assert_allclose(float(loss_b), float(loss_a), rtol=1e-6, err_msg=label)
    np.testing.assert_allclose(np.asarray(out_b), np.asarray(out_a), atol=1e-5, err_msg=label)
    flat_a = jax.tree_util.tree_leaves_with_path(grads_a)
    flat_b = jax.tree.leaves(grads_b)
    assert len(flat_a) == len(flat_b)
    for (path, a), b in zip(flat_a, flat_b):
        np.testing.assert_allclose(
            np.asarray(b), np.asarray(a), atol=1e-5, err_msg=f"{label}: d loss / d {jax.tree_util.keystr(path)}"
        )


@pytest.mark.parametrize("scan,packed", [(False, False), (True, True)], ids=["loop-padded", "scan-packed"])
def test_splash_equals_xla_on_one_device(scan, packed):
    reference = loss_grads_and_output("xla", scan, packed)
    assert_same(reference, loss_grads_and_output("splash", scan, packed), f"scan={scan} packed={packed}")


def test_splash_equals_xla_on_a_mesh_of_8_devices():
    """Batch over data and fsdp, heads over tensor: splash runs under shard_map on each device's share."""
    reference = loss_grads_and_output("xla", False, True)
    assert_same(reference, loss_grads_and_output("splash", False, True, (2, 2, 2)), "mesh (2, 2, 2)")


def test_packed_instances_do_not_see_each_other():
    """A packed row computes each instance as if it stood alone in its own row (xla reference)."""
    arch = model_lib.config_for_size(
        "tiny", vocab_size=VOCAB, max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    packed = model_lib.BertForPreTraining(arch, packed=True)
    alone = model_lib.BertForPreTraining(arch)
    params = model_lib.init_params(alone, jax.random.PRNGKey(1))
    ids = np.random.default_rng(1).integers(5, VOCAB, (1, SEQ)).astype(np.int32)
    mask = np.zeros((1, SEQ), np.int32)
    mask[0, :20], mask[0, 20:44] = 1, 2
    together = packed.apply({"params": params}, ids, np.zeros_like(ids), mask).sequence_output
    first = alone.apply(
        {"params": params}, ids[:, :20], np.zeros((1, 20), np.int32), np.ones((1, 20), np.int32)
    ).sequence_output
    np.testing.assert_allclose(np.asarray(together[0, :20]), np.asarray(first[0]), atol=1e-5)
    other = ids.copy()
    other[0, 20:44] = 7  # the second instance's tokens change; the first instance's outputs must not
    again = packed.apply({"params": params}, other, np.zeros_like(ids), mask).sequence_output
    np.testing.assert_allclose(np.asarray(again[0, :20]), np.asarray(together[0, :20]), atol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_the_window_in_blocks_hands_cudnn_what_it_takes(monkeypatch, dtype):
    """attention.windowed's cuDNN branch, with jax.nn.dot_product_attention's own checks and its xla
    implementation standing in for the kernel (no GPU here): the blocks' boolean mask is accepted for
    [batch · blocks] queries against block + 2·window keys, kept finite in half precision, and gives the
    reference attention."""
    calls = []
    real_attention = jax.nn.dot_product_attention

    def stand_in(q, k, v, mask=None, implementation=None, **rest):
        calls.append((q.shape, k.shape, mask.shape, mask.dtype, implementation, sorted(rest)))
        return real_attention(q, k, v, mask=mask, implementation="xla", **rest)

    monkeypatch.setattr(jax.nn, "dot_product_attention", stand_in)
    mask = np.array([[1] * 20 + [2] * 14 + [0] * 6, [1] * 40])  # a packed row ending in padding, a full row
    q, k, v = (jax.random.normal(jax.random.PRNGKey(i), (2, 40, 2, 8)).astype(dtype) for i in range(3))
    out = attention.windowed("cudnn", q, k, v, jnp.asarray(mask), window=4, block=8)
    assert calls == [((10, 8, 2, 8), (10, 16, 2, 8), (10, 1, 8, 16), jnp.bool_, "cudnn", [])]
    assert out.shape == q.shape and bool(jnp.all(jnp.isfinite(out)))
    real = mask > 0
    expect = _reference_attention(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), mask, 4)
    atol = 1e-5 if dtype == jnp.float32 else 3e-2
    np.testing.assert_allclose(np.asarray(out, np.float32)[real], expect[real], atol=atol)
