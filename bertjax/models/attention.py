"""Attention implementations behind `config.model.attention`: xla, splash, cudnn, and auto.

- `xla`: einsum + softmax in float32 with attention-probability dropout; the reference, any backend.
- `splash`: Pallas's TPU splash-attention kernel (`make_splash_mha`, a full mask with segment ids),
  under `shard_map` over the mesh's batch and head axes. Off TPU the same kernel runs in Pallas
  interpret mode: slow, but how the tests and a user without a TPU check it.
- `cudnn`: `jax.nn.dot_product_attention(implementation="cudnn")` on NVIDIA GPUs.
- `auto`: splash on TPU, cudnn on GPU, xla elsewhere, and xla wherever attention dropout is on.

A sliding window (ModernBERT's local layers) on xla or cudnn can be computed in blocks (`windowed`): the
queries in blocks of `block`, each block against only the keys its window reaches (block + 2·window of them)
instead of every key under a band mask. Splash skips the blocks outside the window itself.

One mask serves all of them: `input_mask` holds per token 0 for padding, else the number of the
instance the token belongs to (1 in an unpacked row, 1..k in a packed row). A real token attends to the
tokens of its own instance only. Padding queries differ by implementation (xla: every real key, as
BERT's key-padding mask; splash: the other padding tokens) but their outputs are never used.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.models import options
from bertjax.models import partitioning

log = logging.getLogger(__name__)
IMPLEMENTATIONS = options.ATTENTION_IMPLEMENTATIONS
FUSED = ("splash", "cudnn")
_SPLASH_LANES = 128  # splash's blocks are multiples of this: sequences are padded up to one


def choose(requested: str, attention_probs_dropout_prob: float, platform: str) -> str:
    """The implementation `requested` resolves to on `platform` (cpu, gpu, tpu); says why for auto.

    Fused kernels have no attention-probability dropout: asking for one with dropout on is an error."""
    if requested not in IMPLEMENTATIONS:
        raise ValueError(f"config.model.attention={requested!r} is not one of {list(IMPLEMENTATIONS)}.")
    if requested == "auto":
        best = {"tpu": "splash", "gpu": "cudnn"}.get(platform, "xla")
        if best != "xla" and attention_probs_dropout_prob > 0:
            log.info(
                "attention: auto chose xla on %s: config.model.attention_probs_dropout_prob=%g, and %s "
                "has no attention dropout (set it to 0 for %s)",
                platform,
                attention_probs_dropout_prob,
                best,
                best,
            )
            return "xla"
        log.info("attention: auto chose %s on %s", best, platform)
        return best
    if requested in FUSED and attention_probs_dropout_prob > 0:
        raise ValueError(
            f"config.model.attention={requested} has no attention-probability dropout but "
            f"config.model.attention_probs_dropout_prob={attention_probs_dropout_prob}; set "
            "--config.model.attention_probs_dropout_prob=0 (as MosaicBERT and ModernBERT do) or "
            "use --config.model.attention=xla."
        )
    if requested == "cudnn" and platform != "gpu":
        raise ValueError(
            f"config.model.attention=cudnn needs an NVIDIA GPU, but the devices are {platform}; "
            "use --config.model.attention=xla (or auto)."
        )
    if requested == "splash" and platform != "tpu":
        log.info(
            "attention: splash on %s runs the TPU kernel in Pallas interpret mode (slow: for checking "
            "numerics, not for training)",
            platform,
        )
    return requested


def allowed_keys(input_mask: jax.Array, packed: bool, window: Optional[int] = None) -> jax.Array:
    """Which keys each query sees, boolean: [batch, 1, 1, keys] (real keys) or [batch, 1, queries, keys] also
    of the query's own instance when rows are packed (a padding query: any real key), and with `window` (a
    sliding window) at most `window` positions from the query."""
    mask = input_mask.astype(jnp.int32)
    allowed = (mask > 0)[:, None, None, :]
    if packed or window is not None:
        same = (mask[:, :, None] == mask[:, None, :]) | (mask[:, :, None] == 0)
        allowed = allowed & same[:, None]
    if window is not None:
        index = jnp.arange(mask.shape[-1])
        allowed = allowed & (jnp.abs(index[:, None] - index[None, :]) <= window)[None, None]
    return allowed


def xla_bias(input_mask: jax.Array, packed: bool, window: Optional[int] = None) -> jax.Array:
    """`allowed_keys` as an additive float32 bias: 0 where a key is seen, float32's minimum where not."""
    return _additive(allowed_keys(input_mask, packed, window))


def _additive(allowed: jax.Array) -> jax.Array:
    return jnp.where(allowed, 0.0, jnp.finfo(jnp.float32).min).astype(jnp.float32)


def fused(
    implementation: str,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    input_mask: jax.Array,
    packed: bool,
    window: Optional[int] = None,
) -> jax.Array:
    """Attention output [batch, length, heads, kv] of q, k, v [batch, length, heads, kv] by a fused kernel;
    `window`: each query sees keys at most that many positions away (ModernBERT's local layers)."""
    if implementation == "splash":
        return _splash(q, k, v, input_mask.astype(jnp.int32), window)
    return _cudnn(q, k, v, input_mask.astype(jnp.int32), packed, window)


# --- splash -------------------------------------------------------------------------------------------


def splash_block(length: int, window: Optional[int] = None) -> int:
    """Splash's block size: the largest of 512, 256, 128 dividing the (padded) length; with a sliding window
    no larger than about the window, so the blocks wholly outside it can be skipped."""
    fits = [b for b in (512, 256, 128) if length % b == 0]
    if window is not None:
        fits = [b for b in fits if b <= max(_SPLASH_LANES, 2 * window)] or fits[-1:]
    return fits[0]


def _splash_mask(heads: int, length: int, window: Optional[int]):
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib

    # A local mask lets the kernel skip the blocks wholly outside the window (fewer FLOPs, not only masked).
    one = (
        mask_lib.FullMask((length, length))
        if window is None
        else mask_lib.LocalMask((length, length), window_size=(window, window), offset=0)
    )
    return mask_lib.MultiHeadMask([one for _ in range(heads)])


def splash_blocks_computed(length: int, window: Optional[int] = None) -> tuple[int, int]:
    """(query × key blocks splash computes, blocks in all) for one head of a sequence of `length` tokens: the
    work a window saves on TPU, which XLA's cost analysis does not see inside the kernel."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as info_lib

    padded = math.ceil(length / _SPLASH_LANES) * _SPLASH_LANES
    block = splash_block(padded, window)
    info, _ = info_lib.process_mask(_splash_mask(1, padded, window), (block, block), shrink_grid=False)
    return int(np.count_nonzero(info.block_mask)), (padded // block) ** 2


def _splash_kernel(heads: int, length: int, interpret: bool, window: Optional[int] = None):
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel_lib

    block = splash_block(length, window)
    sizes = kernel_lib.BlockSizes(
        block_q=block,
        block_kv=block,
        block_kv_compute=block,
        block_q_dkv=block,
        block_kv_dkv=block,
        block_kv_dkv_compute=block,
        block_q_dq=block,
        block_kv_dq=block,
    )
    return kernel_lib.make_splash_mha(
        _splash_mask(heads, length, window), block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret
    ), kernel_lib.SegmentIds


def _splash_local(
    q: jax.Array, k: jax.Array, v: jax.Array, segments: jax.Array, interpret: bool, window: Optional[int] = None
) -> jax.Array:
    """One device's share: q, k, v [batch, length, heads, kv], segments [batch, length]."""
    length, heads, head_dim = q.shape[1:]
    padded = math.ceil(length / _SPLASH_LANES) * _SPLASH_LANES
    if padded != length:  # pad tokens form segment 0 with the row's own padding: no row is empty
        q, k, v = (jnp.pad(x, ((0, 0), (0, padded - length), (0, 0), (0, 0))) for x in (q, k, v))
        segments = jnp.pad(segments, ((0, 0), (0, padded - length)))
    kernel, segment_ids = _splash_kernel(heads, padded, interpret, window)
    scale = jnp.asarray(1.0 / np.sqrt(head_dim), q.dtype)  # the kernel does not scale by 1/√d itself

    def one_row(q, k, v, s):  # kernel layout: [heads, length, kv]
        return kernel(
            q.swapaxes(0, 1) * scale, k.swapaxes(0, 1), v.swapaxes(0, 1), segment_ids=segment_ids(s, s)
        ).swapaxes(0, 1)

    return jax.vmap(one_row)(q, k, v, segments)[:, :length]


def _splash(q: jax.Array, k: jax.Array, v: jax.Array, segments: jax.Array, window: Optional[int] = None) -> jax.Array:
    context = partitioning.current_mesh_and_rules()
    if context is None:  # eager use or one device outside the trainer
        return _splash_local(q, k, v, segments, jax.default_backend() != "tpu", window)
    mesh, rules = context
    qkv_spec = partitioning.logical_spec(q.shape, ("batch", "length", "heads", "kv"), mesh, rules)
    segment_spec = partitioning.logical_spec(segments.shape, ("batch", "length"), mesh, rules)
    if qkv_spec[1] is not None:
        raise ValueError(
            "config.mesh.logical_axis_rules shard 'length', which splash attention needs whole on "
            "each device; map 'length' to None."
        )
    interpret = mesh.devices.flat[0].platform != "tpu"
    local = functools.partial(_splash_local, interpret=interpret, window=window)
    return jax.shard_map(
        local, mesh=mesh, in_specs=(qkv_spec, qkv_spec, qkv_spec, segment_spec), out_specs=qkv_spec, check_vma=False
    )(q, k, v, segments)


# --- cuDNN --------------------------------------------------------------------------------------------


def cudnn_arguments(mask: jax.Array, packed: bool, window: Optional[int] = None) -> dict:
    """What `jax.nn.dot_product_attention` gets besides q, k, v. Unpacked rows (real tokens first, then
    padding) pass their lengths. Packed rows pass which keys each query sees (`allowed_keys`), which cuDNN's
    fused kernel takes as a bias. So does a sliding window: cuDNN's own window is one-sided (causal) in
    jax <= 0.11, which refuses a right window without a causal mask, so the band goes into the mask. That is
    exact, but cuDNN then computes the blocks outside the window too (splash on TPU skips them)."""
    if packed or window is not None:
        return dict(mask=allowed_keys(mask, packed, window))
    lengths = jnp.sum(mask > 0, axis=1).astype(jnp.int32)
    return dict(query_seq_lengths=lengths, key_value_seq_lengths=lengths)


# A boolean mask, never a float bias, goes to cuDNN. jax turns it into an additive bias itself, of a finite
# -2**41 in half precision: a padding query more than the window away from every real token sees no key, and
# a bias of -inf (float32's minimum in bfloat16) made its softmax NaN, which the next layer's keys and values
# carried to real tokens. And from jax 0.11.1 on (jax-ml/jax#39512) a boolean mask spares the backward the
# bias gradient that jax has cuDNN compute for any float bias, nobody reading it: ModernBERT-base 1,024 × 32 on
# the H200 spent 8.6 of 95 busy ms a step on its sliding layers' `fmha_dbias` (3.6) and `matmul_dq` (5.0, dQ
# from the materialised score gradient; the layers without a bias convert a fused dQ instead, 0.03 ms each).
def _cudnn(
    q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, packed: bool, window: Optional[int] = None
) -> jax.Array:
    arguments = cudnn_arguments(mask, packed, window)
    return jax.nn.dot_product_attention(q, k, v, **arguments, implementation="cudnn")


# --- sliding windows in blocks ------------------------------------------------------------------------


AUTO_BLOCK = -1  # config.model.window_block's default: `block_size` decides
BLOCKS_FROM = 6  # auto: blocks of the window on xla once a row holds this many windows (keys ≤ half the row)


def block_size(requested: int, implementation: str, length: int, window: int) -> int:
    """The queries per block `windowed` computes a sliding-window layer in, 0 for one attention over the row.

    `requested` is config.model.window_block: > 0 that size, 0 off, AUTO_BLOCK the measured choice: on xla
    blocks of the window once the row holds BLOCKS_FROM windows (ModernBERT-base on a CPU: 1.39-1.42× the step
    at 1,024 tokens, 16 windows; 1.13× at 512, docs/modernbert.md); off on cuDNN until a GPU has measured it (gpu_profile's
    cudnn_window_blocks); splash skips the blocks outside the window itself."""
    if implementation == "splash":
        return 0
    if requested != AUTO_BLOCK:
        return requested
    return window if implementation == "xla" and length >= BLOCKS_FROM * window else 0


def window_blocks(x: jax.Array, block: int, window: int, keys: bool) -> jax.Array:
    """[batch, length, ...] → [batch, blocks, block, ...] (queries), or (keys) the block + 2·window positions
    block i's window reaches, from i·block − window: padding (zeros) past either end. Keys are strided slices
    of the padded sequence concatenated, never a gather, whose gradient would be a scatter-add."""
    batch, length = x.shape[:2]
    blocks = -(-length // block)
    before, after = (window, window) if keys else (0, 0)
    x = jnp.pad(x, [(0, 0), (before, blocks * block - length + after)] + [(0, 0)] * (x.ndim - 2))
    if not keys:
        return x.reshape(batch, blocks, block, *x.shape[2:])
    unit = math.gcd(block, window)  # block and window in whole units: each block's keys are whole units
    units = x.reshape(batch, -1, unit, *x.shape[2:])
    stride = block // unit
    parts = [units[:, j : j + (blocks - 1) * stride + 1 : stride] for j in range((block + 2 * window) // unit)]
    return jnp.concatenate(parts, axis=2)


def window_allowed(input_mask: jax.Array, block: int, window: int) -> jax.Array:
    """Which keys each query of `windowed` sees, boolean [batch · blocks, 1, block, block + 2·window]: at most
    `window` positions away, real, of its own instance (a padding query: any real key), as
    `allowed_keys(mask, packed, window)` says for the whole sequence."""
    mask = input_mask.astype(jnp.int32)
    queries, keys = window_blocks(mask, block, window, False), window_blocks(mask, block, window, True)
    offset = jnp.arange(block)[:, None] + window - jnp.arange(block + 2 * window)[None, :]  # query − key position
    allowed = (jnp.abs(offset) <= window)[None, None] & (keys > 0)[:, :, None, :]
    allowed &= (queries[..., :, None] == keys[..., None, :]) | (queries[..., :, None] == 0)
    return allowed.reshape(-1, 1, block, block + 2 * window)


def windowed(
    implementation: str,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    input_mask: jax.Array,
    window: int,
    block: int,
    xla_attention=None,
) -> jax.Array:
    """Sliding-window attention [batch, length, heads, kv] computed in blocks of `block` queries, each against
    the block + 2·window keys its window reaches: (block + 2·window) / length of the work of one attention over
    every key (ModernBERT-base at 1,024 tokens, window 64, blocks of 64: 3/16). Real tokens' outputs equal the
    whole sequence's under `xla_bias(mask, packed, window)`. `xla_attention(q, k, v, bias)` is the caller's
    (its dropout); cudnn passes the mask to the fused kernel."""
    batch, length = q.shape[:2]
    allowed = window_allowed(input_mask, block, window)

    def flat(x):  # [batch, blocks, n, ...] → [batch · blocks, n, ...]
        return x.reshape(-1, *x.shape[2:])

    q = flat(window_blocks(q, block, window, False))
    k, v = (flat(window_blocks(x, block, window, True)) for x in (k, v))
    if implementation == "xla":
        context = xla_attention(q, k, v, _additive(allowed))
    else:  # a boolean mask, as _cudnn passes: finite for a query with no key, and no bias gradient
        context = jax.nn.dot_product_attention(q, k, v, mask=allowed, implementation="cudnn")
    return context.reshape(batch, -1, *context.shape[2:])[:, :length]
