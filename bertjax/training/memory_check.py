"""Sizes a job cannot have, refused before anything is allocated: a model, a batch or a step's activations
larger than all the memory this host and its devices have.

The figures are lower bounds, so nothing that could fit is refused: the parameters with their gradients and
AdamW moments (16 bytes a parameter, counted from the architecture's shapes without allocating them), the
host's input arrays of one batch, and what the backward pass must keep of one micro-batch (each layer's
input: tokens × hidden_size). Each is compared with the memory of this process's devices together (a CPU's
devices share the host's RAM; a GPU's or TPU's own memory as JAX reports it) and the host's RAM. A
refusal is one sentence with the figure, the memory and the fields that make it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional

import jax

from bertjax import models as models_lib

STATE_BYTES_PER_PARAM = 16  # float32 params, gradients and two AdamW (or LAMB) moments
INPUT_BYTES_PER_TOKEN = 12  # int32 input ids, segment ids and mask, at least


def _size(n: float) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n / 2**10:,.1f} KiB"


def host_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def device_memory(devices: Optional[list] = None) -> tuple[int, str]:
    """(bytes, words): the memory of this process's devices together; a CPU's are the host's RAM."""
    devices = devices if devices is not None else jax.local_devices()
    limits = []
    for device in devices:
        stats = device.memory_stats() if device.platform != "cpu" else None
        limits.append((stats or {}).get("bytes_limit"))
    kind = f"{len(devices)} {devices[0].platform.upper()} device(s)"
    if devices[0].platform == "cpu" or not all(limits):
        return host_memory(), f"this host's RAM, which its {kind} share"
    return sum(limits), f"this host's {kind} together"


def param_count(family: Any, architecture: Any) -> int:
    """The parameters of an architecture, from the shapes of a one- and a two-layer model (no allocation,
    no tracing of every layer): a model's layers are alike after the first."""

    def count(layers: int) -> int:
        fewer = {"num_hidden_layers": layers}
        if getattr(architecture, "layer_types", None):  # ModernBERT's per-layer attention kinds: the first ones
            fewer["layer_types"] = type(architecture.layer_types)(architecture.layer_types[:layers])
        model = family.model.from_architecture(dataclasses.replace(architecture, **fewer))
        shapes = jax.eval_shape(lambda: family.model.init_params(model, jax.random.PRNGKey(0)))
        return sum(int(x.size) for x in jax.tree.leaves(shapes))

    one = count(1)
    if architecture.num_hidden_layers == 1:
        return one
    return one + (architecture.num_hidden_layers - 1) * (count(2) - one)


def _model_fields(architecture: Any) -> str:
    names = ("vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size", "max_position_embeddings")
    return ", ".join(f"{n}={getattr(architecture, n):,}" for n in names if hasattr(architecture, n))


def check_training(
    architecture: Any,
    dtype: str,
    global_batch_size: int,
    max_seq_length: int,
    micro_batches: int = 1,
    source: str = "config.model",
    memory: Optional[tuple[int, str]] = None,
    host: Optional[int] = None,
) -> None:
    """A job's model, batch and activations against this host's and devices' memory, before anything is
    allocated. `memory`, `host`: what there is (the tests' small machines); default, what this one has."""
    available, where = memory or device_memory()
    host = host or host_memory()
    params = param_count(models_lib.of(architecture), architecture)
    need = params * STATE_BYTES_PER_PARAM
    if need > available:
        raise ValueError(
            f"the model of {source} ({_model_fields(architecture)}) has {params:,} parameters, whose "
            f"training state (parameters, gradients, optimizer moments: {STATE_BYTES_PER_PARAM} bytes "
            f"each) is {_size(need)}, more than the {_size(available)} of {where}; make it smaller."
        )
    rows = global_batch_size // jax.process_count()
    inputs = rows * max_seq_length * INPUT_BYTES_PER_TOKEN
    if inputs > host:
        raise ValueError(
            f"config.train.global_batch_size={global_batch_size:,} rows of config.data.max_seq_length="
            f"{max_seq_length:,} tokens are {_size(inputs)} of input arrays on this host alone, more "
            f"than its {_size(host)} of RAM; lower them."
        )
    micro_tokens = rows * max_seq_length // max(1, micro_batches)
    dtype_bytes = 2 if dtype == "bfloat16" else 4
    kept = micro_tokens * architecture.hidden_size * architecture.num_hidden_layers * dtype_bytes
    if kept > available:
        raise ValueError(
            f"one step keeps at least {_size(kept)} of activations for its backward pass (each of "
            f"the {architecture.num_hidden_layers:,} layers' input: {micro_tokens:,} tokens of a micro-"
            f"batch × hidden_size {architecture.hidden_size:,} × {dtype_bytes} bytes), more than the "
            f"{_size(available)} of {where}; lower config.train.global_batch_size or "
            "config.data.max_seq_length, or raise config.train.micro_batches."
        )
