"""What every encoder family builds with: the functions the option names stand for (activations, dtypes,
remat policies), a counter-based dropout, and parameter counting.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from typing import Any, Callable, Iterator, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.models import options

Array = jax.Array


@jax.custom_vjp
def exact_gelu(x: Array) -> Array:
    """BERT's GELU, x·Φ(x) = 0.5·x·(1 + erf(x/√2)), computed as PyTorch computes it: in float32 whatever x's
    dtype, from erf, the input kept for the backward. jax.nn.gelu(approximate=False) takes erfc in x's dtype,
    which XLA expands into two rational approximations, an exp and two divisions an element, and autodiff keeps
    two of its intermediates: on an H200 BERT-Large's GELU took 5.1 ms a step forward and 4.1 backward, far
    from its ~2.4 ms of memory traffic (benchmarks/results/gpu_profile/2026-11-28-h200.profiles.jsonl)."""
    x32 = x.astype(jnp.float32)
    return (x32 * _normal_cdf(x32)).astype(x.dtype)


def _normal_cdf(x32: Array) -> Array:
    return 0.5 + 0.5 * jax.lax.erf(x32 * np.float32(np.sqrt(0.5)))


def _exact_gelu_forward(x: Array) -> tuple[Array, Array]:
    return exact_gelu(x), x


def _exact_gelu_backward(x: Array, g: Array) -> tuple[Array]:
    x32 = x.astype(jnp.float32)
    pdf = jnp.exp(-0.5 * x32 * x32) * np.float32(1 / np.sqrt(2 * np.pi))
    return ((g.astype(jnp.float32) * (_normal_cdf(x32) + x32 * pdf)).astype(x.dtype),)


exact_gelu.defvjp(_exact_gelu_forward, _exact_gelu_backward)

# The functions options.ACTIVATION_NAMES and REMAT_POLICY_NAMES stand for (keyed in that order).
ACTIVATIONS: dict[str, Callable[[Array], Array]] = dict(
    zip(
        options.ACTIVATION_NAMES,
        (
            exact_gelu,  # gelu
            functools.partial(jax.nn.gelu, approximate=True),  # gelu_new
            functools.partial(jax.nn.gelu, approximate=True),  # gelu_pytorch_tanh
            jax.nn.relu,  # relu
            jax.nn.silu,  # silu
            jax.nn.silu,  # swish
            jnp.tanh,  # tanh
        ),
        strict=True,
    )
)

# Named rematerialisation policies: which intermediates a layer keeps for the backward pass.
REMAT_POLICIES: dict[str, Optional[Callable[..., bool]]] = dict(
    zip(
        options.REMAT_POLICY_NAMES,
        (
            None,  # none: no remat, keep everything
            jax.checkpoint_policies.nothing_saveable,  # full: recompute the whole layer
            jax.checkpoint_policies.checkpoint_dots,  # dots: keep matmul outputs
            jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,  # dots_no_batch: keep weight matmuls
        ),
        strict=True,
    )
)


DTYPES = dict(zip(options.DTYPE_NAMES, (jnp.float32, jnp.bfloat16), strict=True))


class DenseActivation(nn.Dense):
    """nn.Dense then `activation`: nn.Dense's parameters (kernel, bias) and forward, to the bit. With `recompute`
    the backward recomputes the activation from the matmul's output and the bias, so the forward writes only its
    output, whatever intermediates the activation's own backward would keep (jax.nn.gelu's erfc kept two more
    [tokens, intermediate] tensors a layer; exact_gelu keeps only its input, so for it this trades the input
    for the matmul's output). config.model.recompute_activation."""

    activation: Callable[[Array], Array] = jax.nn.gelu
    recompute: bool = False

    @nn.compact
    def __call__(self, inputs: Array) -> Array:
        kernel = self.param("kernel", self.kernel_init, (inputs.shape[-1], self.features), self.param_dtype)
        bias = self.param("bias", self.bias_init, (self.features,), self.param_dtype)
        inputs, kernel, bias = nn.dtypes.promote_dtype(inputs, kernel, bias, dtype=self.dtype)
        y = dot_general(inputs, kernel, (((inputs.ndim - 1,), (0,)), ((), ())), precision=self.precision)

        def activate(y: Array, bias: Array) -> Array:
            return self.activation(y + jnp.reshape(bias, (1,) * (y.ndim - 1) + (-1,)))

        return (jax.checkpoint(activate) if self.recompute else activate)(y, bias)


# --- Weight matmuls that accumulate in float32 -----------------------------------------------------------

_ACCUMULATE_F32: contextvars.ContextVar = contextvars.ContextVar("bertjax_accumulate_f32", default=False)


@contextlib.contextmanager
def bf16_dots_accumulate_f32(enabled: bool) -> Iterator[None]:
    """While a step is traced: bfloat16 weight matmuls are written as bf16 × bf16 → float32, cast back to bf16,
    forward and backward (`dot_general`). XLA:CPU runs that form natively (YNNPACK, AVX512-BF16: 373 GFLOP/s
    against 185 in float32 on the 2-core EPYC) but upcasts a bf16 → bf16 dot to float32 operands first, so without
    this bf16 was no faster than float32 on a CPU. The same products GPUs and TPUs compute (they accumulate bf16
    in float32 inside); the trainer turns it on for CPUs (`config.model.dtype=bfloat16`)."""
    token = _ACCUMULATE_F32.set(enabled)
    try:
        yield
    finally:
        _ACCUMULATE_F32.reset(token)


def _matmul_f32_accumulate(a: Array, b: Array, contract: tuple[int, int] = (1, 0)) -> Array:
    dims = (((contract[0],), (contract[1],)), ((), ()))
    return jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32).astype(a.dtype)


@jax.custom_vjp
def _matmul(a: Array, b: Array) -> Array:
    """[m, k] · [k, n] in a's dtype, accumulated in float32; both gradient matmuls the same way."""
    return _matmul_f32_accumulate(a, b)


def _matmul_forward(a: Array, b: Array) -> tuple[Array, tuple[Array, Array]]:
    return _matmul_f32_accumulate(a, b), (a, b)


def _matmul_backward(saved: tuple[Array, Array], g: Array) -> tuple[Array, Array]:
    a, b = saved
    g = g.astype(a.dtype)
    # The transposes as contracting dimensions, not transposed copies: XLA:CPU keeps g·bᵀ in bf16 only so.
    return _matmul_f32_accumulate(g, b, (1, 1)), _matmul_f32_accumulate(a, g, (0, 0)).astype(b.dtype)


_matmul.defvjp(_matmul_forward, _matmul_backward)


def dot_general(
    x: Array, kernel: Array, dimension_numbers: Any, precision: Any = None, preferred_element_type: Any = None
) -> Array:
    """lax.dot_general for a weight matmul (nn.Dense's and nn.DenseGeneral's `dot_general`, the fused QKV): the
    input's trailing axes against the kernel's leading ones. Inside `bf16_dots_accumulate_f32(True)` a bfloat16
    one is a 2-D matmul accumulated in float32 (`_matmul`); anything else is lax.dot_general unchanged."""
    (x_contract, k_contract), (x_batch, k_batch) = dimension_numbers
    n = len(x_contract)
    if (
        _ACCUMULATE_F32.get()
        and x.dtype == jnp.bfloat16
        and kernel.dtype == jnp.bfloat16
        and preferred_element_type is None
        and not x_batch
        and not k_batch
        and tuple(x_contract) == tuple(range(x.ndim - n, x.ndim))
        and tuple(k_contract) == tuple(range(n))
    ):
        lead, features = x.shape[: x.ndim - n], kernel.shape[n:]
        y = _matmul(x.reshape(math.prod(lead), -1), kernel.reshape(math.prod(kernel.shape[:n]), -1))
        return y.reshape(*lead, *features)
    return jax.lax.dot_general(
        x, kernel, dimension_numbers, precision=precision, preferred_element_type=preferred_element_type
    )


@jax.custom_vjp
def vocab_logits(x: Array, table: Array) -> Array:
    """float32 logits `x · tableᵀ` of x [..., embed] in the compute dtype and a [vocab, embed] table (float32
    parameters), multiplied in x's dtype. Its backward multiplies in x's dtype too, the logits' float32
    gradient cast to it, as PyTorch's autocast does: left to autodiff, both gradient matmuls took float32
    operands (TF32 on a GPU: 2.4 of ModernBERT-base's 95 busy ms a step on the H200, for 0.8 TFLOP). In float32
    the same products as autodiff's; the table's gradient stays float32 (accumulated there)."""
    return jnp.einsum("...e,ve->...v", x, table.astype(x.dtype), preferred_element_type=jnp.float32)


def _vocab_logits_forward(x: Array, table: Array) -> tuple[Array, tuple[Array, Array]]:
    return vocab_logits(x, table), (x, table)


def _vocab_logits_backward(saved: tuple[Array, Array], g: Array) -> tuple[Array, Array]:
    x, table = saved
    g = g.astype(x.dtype)
    d_x = jnp.einsum("...v,ve->...e", g, table.astype(x.dtype), preferred_element_type=jnp.float32)
    d_table = jnp.einsum("...v,...e->ve", g, x, preferred_element_type=jnp.float32)
    return d_x.astype(x.dtype), d_table.astype(table.dtype)


vocab_logits.defvjp(_vocab_logits_forward, _vocab_logits_backward)


def _mix32(x: Array) -> Array:
    """lowbias32 (C. Wellons' hash-prospector): a bijection on uint32 with near-ideal avalanche."""
    x = (x ^ (x >> 16)) * jnp.uint32(0x7FEB352D)
    x = (x ^ (x >> 15)) * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def hash_bits(key: Array, shape: tuple[int, ...]) -> Array:
    """uint32 random bits: element i is a keyed hash of its flat index, mix(mix(i ^ k0) + k1), with the
    two 32-bit keys drawn from `key` by jax.random. Counter-based like threefry (any sharding of the
    array computes the same bits), at a few integer ops per element instead of threefry's ~40."""
    k = jax.random.bits(key, (2,), jnp.uint32)
    # The flat index as a sum of per-axis iotas (not a reshaped 1-D iota): each device of a sharded
    # array computes only its own indices.
    index = jnp.zeros(shape, jnp.uint32)
    stride = 1
    for axis in reversed(range(len(shape))):
        index = index + jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(stride % 2**32)
        stride *= shape[axis]
    return _mix32(_mix32(index ^ k[0]) + k[1])


class Dropout(nn.Module):
    """Inverted dropout as `nn.Dropout` (same rng collection, scaling and `deterministic` switch) with
    the keep-mask drawn from `hash_bits` instead of threefry: threefry's bits were 6–7% of a BERT-base
    CPU train step and 29% of the demo model's; the hash's cost is within noise. P(drop) = round(rate·2³²)/2³²."""

    rate: float
    deterministic: Optional[bool] = None
    rng_collection: str = "dropout"

    @nn.compact
    def __call__(self, x: Array, deterministic: Optional[bool] = None) -> Array:
        deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
        if deterministic or self.rate == 0.0:
            return x
        if self.rate >= 1.0:
            return jnp.zeros_like(x)
        threshold = jnp.uint32(min(round(self.rate * 2**32), 2**32 - 1))
        keep = hash_bits(self.make_rng(self.rng_collection), x.shape) >= threshold
        return jnp.where(keep, x / jnp.asarray(1.0 - self.rate, x.dtype), jnp.zeros_like(x))


# Tables of at most this many rows (token types) are looked up by a one-hot matmul: no scatter in the backward.
ONE_HOT_ROWS = 16


class Embed(nn.Embed):
    """`nn.Embed` (same parameter, initialiser, `attend`) whose lookup takes float32 rows and casts them,
    where nn.Embed casts the whole table to the compute dtype and takes from that. Same forward values;
    the difference is the backward pass, which becomes a scatter-add of every token's gradient row into
    the table: nn.Embed's runs in bf16, which on an H200 was 60% of a BERT-Base train step (133 of 217 ms:
    bf16 atomics, and for the two-row token-type table every token lands on the same 2 × 768 addresses)
    and rounds a sum of 32,768 rows to 8 bits. Here it accumulates in float32, as PyTorch's embedding
    gradient does under autocast; tables of at most ONE_HOT_ROWS rows (token types) take a one-hot matmul
    (exact in float32), whose gradient is a matmul, with no scatter at all."""

    def __call__(self, inputs: Array) -> Array:
        if not jnp.issubdtype(inputs.dtype, jnp.integer):
            raise ValueError("Input type must be an integer or unsigned integer.")
        table = self.embedding
        if self.num_embeddings == 1:
            rows = jnp.broadcast_to(table, inputs.shape + (self.features,))
        elif self.num_embeddings <= ONE_HOT_ROWS:
            one_hot = jax.nn.one_hot(inputs, self.num_embeddings, dtype=table.dtype)
            rows = jnp.einsum("...t,tf->...f", one_hot, table, precision=jax.lax.Precision.HIGHEST)
        else:
            rows = jnp.take(table, inputs, axis=0)
        return rows if self.dtype is None else rows.astype(self.dtype)


def param_count(params: Any) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))
