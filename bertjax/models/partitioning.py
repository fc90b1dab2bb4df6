"""The models' side of sharding: activations pinned by their logical axes while a step is traced.

The models name logical axes only (batch, length, embed, heads, kv, mlp, vocab, layers). While the trainer traces
a step inside `activation_rules(mesh, rules)`, `constrain` pins an activation on that mesh by those rules; outside
it (init, eager use, a single-device apply) it changes nothing. The mesh and the state's shardings are the
trainer's (training/sharding.py), which lives above the models and hands them only this context.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Any, Iterator, Sequence

import flax.linen as nn
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

Rules = Sequence[tuple[str, Any]]


def divisible_spec(shape: tuple[int, ...], spec: PartitionSpec, mesh: Mesh) -> PartitionSpec:
    """Drops mesh axes from dimensions they do not divide (e.g. vocab 30522 over 8 devices)."""
    out = []
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        names = (axes,) if isinstance(axes, str) else tuple(axes or ())
        size = math.prod(mesh.shape[a] for a in names)
        out.append(axes if size == 1 or dim % size == 0 else None)
    return PartitionSpec(*out)


_ACTIVATION_CONTEXT: contextvars.ContextVar = contextvars.ContextVar("bertjax_activation_rules", default=None)


@contextlib.contextmanager
def activation_rules(mesh: Mesh, rules: Rules) -> Iterator[None]:
    """While a step is traced: `constrain` pins the model's activations on this mesh by these rules.

    Our own context rather than flax's global mesh: under a global mesh flax also constrains the
    flattened kernels DenseGeneral builds while checking parameter shapes, which fails."""
    token = _ACTIVATION_CONTEXT.set((mesh, tuple(rules)))
    try:
        yield
    finally:
        _ACTIVATION_CONTEXT.reset(token)


def current_mesh_and_rules() -> tuple[Mesh, tuple] | None:
    """(mesh, rules) while a step is traced inside `activation_rules`; None outside it."""
    return _ACTIVATION_CONTEXT.get()


def logical_spec(shape: tuple[int, ...], logical_axes: Sequence[str | None], mesh: Mesh, rules: Rules) -> PartitionSpec:
    """The PartitionSpec of an array of `shape` whose dimensions carry these logical names."""
    return divisible_spec(shape, nn.logical_to_mesh_axes(tuple(logical_axes), rules), mesh)


def constrain(x: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
    """Shards an activation by its logical axes (e.g. ("batch", "length", "embed")) inside
    `activation_rules`; unchanged outside it (init, eager use, single-device apply)."""
    context = current_mesh_and_rules()
    if context is None:
        return x
    mesh, rules = context
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, logical_spec(x.shape, logical_axes, mesh, rules)))
