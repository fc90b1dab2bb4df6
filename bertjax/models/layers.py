"""What every encoder family builds with: the functions the option names stand for (activations, dtypes,
remat policies), a counter-based dropout, and parameter counting.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.models import options

Array = jax.Array

# The functions options.ACTIVATION_NAMES and REMAT_POLICY_NAMES stand for (keyed in that order).
ACTIVATIONS: dict[str, Callable[[Array], Array]] = dict(zip(options.ACTIVATION_NAMES, (
    functools.partial(jax.nn.gelu, approximate=False),  # gelu
    functools.partial(jax.nn.gelu, approximate=True),  # gelu_new
    functools.partial(jax.nn.gelu, approximate=True),  # gelu_pytorch_tanh
    jax.nn.relu,  # relu
    jax.nn.silu,  # silu
    jax.nn.silu,  # swish
    jnp.tanh,  # tanh
), strict=True))

# Named rematerialisation policies: which intermediates a layer keeps for the backward pass.
REMAT_POLICIES: dict[str, Optional[Callable[..., bool]]] = dict(zip(options.REMAT_POLICY_NAMES, (
    None,  # none: no remat, keep everything
    jax.checkpoint_policies.nothing_saveable,  # full: recompute the whole layer
    jax.checkpoint_policies.checkpoint_dots,  # dots: keep matmul outputs
    jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,  # dots_no_batch: keep weight matmuls
), strict=True))


DTYPES = dict(zip(options.DTYPE_NAMES, (jnp.float32, jnp.bfloat16), strict=True))


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



def param_count(params: Any) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))
