"""The device mesh, logical-axis rules → shardings of the state, and global batches (the activations' constraints
are the models' own: models/partitioning.py).

The model names logical axes only (batch, length, embed, heads, kv, mlp, vocab, layers). The config's
`mesh.shape` over (data, fsdp, tensor) and `mesh.logical_axis_rules` decide where each lands:
data parallelism shards the batch, fsdp shards parameters and optimizer state along `embed` (and the
batch), tensor parallelism shards heads, mlp and vocab.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Mapping, Sequence

import flax.linen as nn
import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bertjax.config.schema import MESH_AXES
from bertjax.models.partitioning import Rules, divisible_spec

log = logging.getLogger(__name__)


def resolve_mesh_shape(shape: Sequence[int], num_devices: int) -> tuple[int, ...]:
    """Replaces the one -1 in shape by whatever makes the product equal num_devices."""
    shape = tuple(int(s) for s in shape)
    if len(shape) != len(MESH_AXES):
        raise ValueError(f"config.mesh.shape={shape} must have {len(MESH_AXES)} entries, one per axis {MESH_AXES}.")
    if shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
        raise ValueError(
            f"config.mesh.shape={shape}: sizes must be positive, with at most one -1 (= the rest); "
            "e.g. (-1, 1, 1) puts every device on the data axis."
        )
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if num_devices % known:
            raise ValueError(
                f"config.mesh.shape={shape}: {num_devices} devices do not divide by {known}; "
                f"choose sizes whose product divides {num_devices} ({_divisors(num_devices)})."
            )
        shape = tuple(num_devices // known if s == -1 else s for s in shape)
    if math.prod(shape) != num_devices:
        raise ValueError(
            f"config.mesh.shape={shape} needs {math.prod(shape)} devices but {num_devices} are "
            f"available; make the product {num_devices}, or set one axis to -1 and the others to "
            f"sizes whose product divides {num_devices} ({_divisors(num_devices)})."
        )
    return shape


def _divisors(n: int) -> str:
    return "its divisors: " + ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def make_mesh(shape: Sequence[int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh over all devices (or the given ones), laid out for the interconnect."""
    devices = list(devices if devices is not None else jax.devices())
    shape = resolve_mesh_shape(shape, len(devices))
    try:
        from jax.experimental import mesh_utils

        grid = mesh_utils.create_device_mesh(shape, devices=devices, allow_split_physical_axes=True)
    except (ValueError, NotImplementedError, AssertionError):  # a topology mesh_utils does not know
        grid = np.asarray(devices).reshape(shape)
    return Mesh(grid, MESH_AXES)


def logical_shardings(boxed_abstract: Any, mesh: Mesh, rules: Rules) -> Any:
    """NamedShardings for a tree of nn.Partitioned abstract values (e.g. `jax.eval_shape(model.init)`)."""
    specs = nn.get_partition_spec(boxed_abstract)
    mesh_specs = nn.logical_to_mesh(specs, rules)
    values = nn.meta.unbox(boxed_abstract)
    dropped = []

    def shard(path, value, spec):
        fitted = divisible_spec(value.shape, spec, mesh)
        if fitted != spec:
            dropped.append(f"{jax.tree_util.keystr(path)} {value.shape} {spec}")
        return NamedSharding(mesh, fitted)

    out = jax.tree_util.tree_map_with_path(shard, values, mesh_specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
    if dropped:
        log.info(
            "sharding: %d parameter dimension(s) not divisible by their mesh axes stay replicated along them: %s",
            len(dropped),
            "; ".join(dropped[:4]) + (" …" if len(dropped) > 4 else ""),
        )
    return out


def optimizer_shardings(
    tx: optax.GradientTransformation, opt_state_abstract: Any, param_shardings: Any, mesh: Mesh
) -> Any:
    """Optimizer state sharded like the parameters it mirrors (Adam's mu and nu); counters replicated."""
    replicated = NamedSharding(mesh, PartitionSpec())
    return optax.tree_map_params(
        tx,
        lambda _, s: s,
        opt_state_abstract,
        param_shardings,
        transform_non_params=lambda _: replicated,
        is_leaf=lambda x: isinstance(x, NamedSharding),
    )


def gathered_for_compute(shardings: Any, axis: str = "fsdp") -> Any:
    """The parameter shardings with `axis` removed: what the forward and backward pass compute with.

    Fully sharded data parallelism stores parameters split over fsdp and all-gathers them for the
    computation (gradients come back reduce-scattered). Saying so explicitly is also a correctness
    fix: left to propagation, XLA's CPU partitioner computes wrong gradients on meshes where data,
    fsdp and tensor are all > 1 (it reshards activations between the batch and embed axes through an
    "involuntary full rematerialization"). For BERT sizes a whole copy of the weights per device is small."""

    def drop(sharding: NamedSharding) -> NamedSharding:
        dims = []
        for axes in sharding.spec:
            names = tuple(a for a in ((axes,) if isinstance(axes, str) else tuple(axes or ())) if a != axis)
            dims.append(names[0] if len(names) == 1 else (names or None))
        return NamedSharding(sharding.mesh, PartitionSpec(*dims))

    return jax.tree.map(drop, shardings, is_leaf=lambda x: isinstance(x, NamedSharding))


def batch_spec(rules: Rules, ndim: int = 1) -> PartitionSpec:
    """The batch dimension sharded as the rules say for the logical axis "batch"; others replicated."""
    return nn.logical_to_mesh_axes(("batch",) + (None,) * (ndim - 1), rules)


def batch_sharding(mesh: Mesh, rules: Rules, ndim: int = 1) -> NamedSharding:
    return NamedSharding(mesh, batch_spec(rules, ndim))


def batch_axis_size(mesh: Mesh, rules: Rules) -> int:
    """How many ways the batch is split: the global batch must divide by this."""
    axes = batch_spec(rules)[0]
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    return math.prod(mesh.shape[a] for a in names)


def global_batch(local: Mapping[str, np.ndarray], mesh: Mesh, rules: Rules) -> dict[str, jax.Array]:
    """Assembles every process's host-local batch into global arrays sharded over the batch axis.

    Process p's rows become rows [p·local, (p+1)·local) of the global batch, so the global batch is
    the same whatever the process count.
    """
    out = {}
    for name, value in local.items():
        out[name] = jax.make_array_from_process_local_data(batch_sharding(mesh, rules, value.ndim), value)
    return out


def per_device_bytes(abstract: Any) -> int:
    """Bytes one device holds of a tree of ShapeDtypeStructs carrying shardings (the largest shard)."""
    return sum(
        math.prod(x.sharding.shard_shape(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(abstract)
    )


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())
