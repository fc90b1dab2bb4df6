"""One embedding a text from an encoder's hidden states, as sentence-transformers' Pooling (and Normalize) modules
make it: the mean over real tokens or the first token ([CLS]), optionally scaled to unit length, optionally cut to
Matryoshka sizes. The retrieval evaluation and the contrastive task pool with this one function, so a model is
scored as it was trained and as sentence-transformers will run it after the export.
"""

from __future__ import annotations

import dataclasses
import logging

import jax
import jax.numpy as jnp

log = logging.getLogger(__name__)

Array = jax.Array
MODES = ("mean", "cls")
SIMILARITIES = ("cosine", "dot")  # sentence-transformers' names; "dot_product" is read as "dot"


@dataclasses.dataclass(frozen=True)
class Pooling:
    """How hidden states become one vector, and how two vectors are compared."""

    mode: str = "mean"  # "mean": over real tokens (sentence-transformers' default) | "cls": the first token
    normalize: bool = True  # unit length after pooling (sentence-transformers' Normalize module)
    similarity: str = "cosine"  # how retrieval scores a pair: cosine | dot (config_sentence_transformers.json)
    matryoshka_dims: tuple[int, ...] = ()  # truncated sizes trained beside the full one; () for none

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"pooling mode {self.mode!r} is not one of {list(MODES)}.")
        if self.similarity not in SIMILARITIES:
            raise ValueError(f"similarity {self.similarity!r} is not one of {list(SIMILARITIES)}.")
        if any(d < 1 for d in self.matryoshka_dims):
            raise ValueError(f"matryoshka_dims {self.matryoshka_dims} must all be positive.")


DEFAULT = Pooling()  # what a model that records no pooling is scored with (sentence-transformers' usual settings)


def assumed(source: str) -> Pooling:
    """DEFAULT, said once in the log: the pooling of a model that records none is a guess worth seeing."""
    log.info(
        "%s records no pooling: assuming %s pooling, %s, %s similarity (sentence-transformers' defaults)",
        source,
        DEFAULT.mode,
        "normalised" if DEFAULT.normalize else "not normalised",
        DEFAULT.similarity,
    )
    return DEFAULT


def normalize(x: Array) -> Array:
    """Unit length, as torch.nn.functional.normalize (eps 1e-12): a zero vector stays zero, and so does its gradient
    (x / max(norm, eps) would give NaN there: the norm's derivative at 0 is 0/0, even where max picks eps)."""
    return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), 1e-24))


def pool(hidden: Array, mask: Array, pooling: Pooling, dims: int | None = None) -> Array:
    """[n, length, hidden] under mask [n, length] → [n, dims or hidden] in float32; `dims` cuts a Matryoshka size
    before normalising (so a truncated embedding has unit length too, as sentence-transformers' truncate_dim)."""
    hidden = hidden.astype(jnp.float32)
    if pooling.mode == "cls":
        out = hidden[:, 0]
    else:
        real = (mask > 0).astype(jnp.float32)[..., None]
        out = jnp.sum(hidden * real, axis=1) / jnp.maximum(jnp.sum(real, axis=1), 1e-9)
    if dims is not None:
        out = out[..., :dims]
    return normalize(out) if pooling.normalize else out


def pool_slots(hidden: Array, slot_of_token: Array, first_tokens: Array, pooling: Pooling) -> Array:
    """Packed rows (several texts a row): [rows, length, hidden], each token's text numbered 1..k in `slot_of_token`
    (0: padding), each text's first token at `first_tokens` [rows, k] → [rows, k, hidden] in float32, every text
    pooled over its own tokens as `pool` pools a row."""
    hidden = hidden.astype(jnp.float32)
    if pooling.mode == "cls":
        out = jnp.take_along_axis(hidden, first_tokens[..., None].astype(jnp.int32), axis=1)
    else:
        slots = jnp.arange(1, first_tokens.shape[1] + 1)
        member = (slot_of_token[:, None, :] == slots[None, :, None]).astype(jnp.float32)  # [rows, k, length]
        out = jnp.einsum("rkl,rlh->rkh", member, hidden) / jnp.maximum(jnp.sum(member, axis=-1), 1e-9)[..., None]
    return normalize(out) if pooling.normalize else out


def for_scoring(embeddings: Array, pooling: Pooling) -> Array:
    """Vectors whose dot product is the similarity: cosine normalises (again, harmlessly, when pooled so)."""
    return normalize(embeddings) if pooling.similarity == "cosine" else embeddings
