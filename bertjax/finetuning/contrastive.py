"""Contrastive fine-tuning's loss and its cached gradient: sentence-transformers' MultipleNegativesRankingLoss
(in-batch negatives, scale 20, given hard negatives as more candidates), optionally symmetric and Matryoshka, over
the whole global batch, and GradCache's two-pass gradient so that a batch of thousands of pairs fits.

The negatives are every device's and host's: the step sees the global batch as one array (sharded over the mesh's
data axes), so `queries @ candidates.T` is the global product; XLA gathers the candidates' embeddings (B × dim
floats, small) across devices, never the model's activations. sentence-transformers only gained cross-device
negatives in 2025 (its `gather_across_devices`), where each process must all-gather by hand.

GradCache (Gao et al., 2021; sentence-transformers' CachedMultipleNegativesRankingLoss): the embeddings of the
whole batch are computed in chunks without keeping activations, the loss and its gradient with respect to the
embeddings are taken on them, then each chunk runs forward again and back with its slice of that gradient. The
sum over chunks is exactly the gradient of the whole batch (the same dropout masks in both passes), at the memory
of one chunk and the cost of one more forward pass.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp

from bertjax.finetuning import pooling

Array = jax.Array
DEFAULT_SCALE = 20.0  # sentence-transformers' MultipleNegativesRankingLoss (1 / temperature 0.05)
SIMILARITIES = ("cosine", "dot")


@dataclasses.dataclass(frozen=True)
class ContrastiveLoss:
    """How query and document embeddings are scored and compared."""

    scale: float = DEFAULT_SCALE
    similarity: str = "cosine"  # cosine (embeddings normalised in the loss, as MNRL's cos_sim) | dot
    symmetric: bool = False  # also rank each positive's query among the batch's queries (MNSRL), mean of both
    matryoshka_dims: tuple[int, ...] = ()  # also the loss on each truncated embedding, summed (MatryoshkaLoss)

    def __post_init__(self):
        if self.similarity not in SIMILARITIES:
            raise ValueError(f"similarity {self.similarity!r} is not one of {list(SIMILARITIES)}.")

    def scores(self, a: Array, b: Array) -> Array:
        """[n, m] similarities × scale, in float32."""
        a, b = a.astype(jnp.float32), b.astype(jnp.float32)
        if self.similarity == "cosine":
            a, b = pooling.normalize(a), pooling.normalize(b)
        return self.scale * a @ b.T

    def one_size(
        self, queries: Array, documents: Array, weights: Array, hashes: Optional[Array] = None
    ) -> tuple[Array, Array]:
        """(loss sum, correct sum) at one embedding size. queries [B, d]; documents [B, D, d], document 0 of
        each query its positive, the rest its hard negatives; weights [B] (0: a padding pair, neither anchor nor
        candidate); hashes [B, D] (each document's text hash): a candidate with the text of a query's positive is
        not that query's negative."""
        batch, per_query, _ = documents.shape
        # Candidate order, as sentence-transformers': every positive (column i is query i's), then every first
        # hard negative, and so on.
        candidates = jnp.swapaxes(documents, 0, 1).reshape(batch * per_query, -1)
        keep = jnp.tile(weights > 0, per_query)[None, :]  # a padding pair's documents are no one's candidates
        if hashes is not None:
            same = jnp.swapaxes(hashes, 0, 1).reshape(-1)[None, :] == hashes[:, :1]
            keep = keep & ~(same & (jnp.arange(batch * per_query)[None, :] != jnp.arange(batch)[:, None]))
        keep = keep | (weights <= 0)[:, None]  # a padding query's row stays finite (its loss is weighted 0)
        logits = jnp.where(keep, self.scores(queries, candidates), -jnp.inf)
        labels = jnp.arange(batch)
        losses = _cross_entropy(logits, labels)
        correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
        if self.symmetric:  # each positive's query among all queries (sentence-transformers: in-batch only)
            backward = jnp.where(
                (weights > 0)[None, :] | (weights <= 0)[:, None], self.scores(documents[:, 0], queries), -jnp.inf
            )
            losses = (losses + _cross_entropy(backward, labels)) / 2
        return jnp.sum(losses * weights), jnp.sum(correct * weights)

    def sums(
        self, queries: Array, documents: Array, weights: Array, hashes: Optional[Array] = None
    ) -> dict[str, tuple[Array, Array]]:
        """(sum, count) metrics of a batch: `contrastive_loss` (the loss; Matryoshka: summed over the sizes, as
        MatryoshkaLoss with equal weights) and `in_batch_accuracy` (the positive ranked first)."""
        count = jnp.sum(weights)
        loss, correct = self.one_size(queries, documents, weights, hashes)
        for dims in self.matryoshka_dims:
            part, _ = self.one_size(queries[..., :dims], documents[..., :dims], weights, hashes)
            loss = loss + part
        return {"contrastive_loss": (loss, count), "in_batch_accuracy": (correct, count)}


def _cross_entropy(logits: Array, labels: Array) -> Array:
    return -jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), labels[:, None], axis=-1)[:, 0]


# --- The gradient of the whole batch, one chunk of activations at a time ----------------------------------------


Embed = Callable[[Any, dict, Optional[Array]], tuple[Array, Array]]  # (params, chunk, rng) → (queries, documents)


def split_chunks(batch: dict, chunks: int) -> dict:
    """[B, ...] → [chunks, B / chunks, ...], chunk c holding rows c, c + chunks, …: each device keeps its own
    rows (as the trainer's micro-batches), so no chunk moves data between devices."""
    return jax.tree.map(lambda x: jnp.swapaxes(x.reshape((-1, chunks) + x.shape[1:]), 0, 1), batch)


def _merge_chunks(x: Array) -> Array:
    """split_chunks' inverse: [chunks, B / chunks, ...] → [B, ...] in the batch's own row order."""
    return jnp.swapaxes(x, 0, 1).reshape((-1,) + x.shape[2:])


def cached_value_and_grad(
    embed: Embed,
    objective: Callable[[Array, Array], tuple[Array, Any]],
    params: Any,
    batch: dict,
    rng: Optional[Array],
    chunks: int,
) -> tuple[tuple[Array, Any], Any]:
    """((loss, aux), grads) of `objective(queries, documents)` over the whole batch, its embeddings computed by
    `embed` in `chunks` chunks (GradCache). chunks == 1 is the plain gradient."""

    def whole(p):
        queries, documents = embed(p, batch, rng)
        return objective(queries, documents)

    if chunks == 1:
        return jax.value_and_grad(whole, has_aux=True)(params)
    parts = split_chunks(batch, chunks)
    keys = jnp.arange(chunks)

    def chunk_rng(c):
        return None if rng is None else jax.random.fold_in(rng, c)

    # Pass 1: every chunk's embeddings, no activations kept (lax.map runs them one after another).
    queries, documents = jax.lax.map(lambda kc: embed(params, kc[1], chunk_rng(kc[0])), (keys, parts))
    queries, documents = jax.lax.stop_gradient((_merge_chunks(queries), _merge_chunks(documents)))
    (loss, aux), (d_queries, d_documents) = jax.value_and_grad(objective, argnums=(0, 1), has_aux=True)(
        queries, documents
    )
    cotangents = split_chunks({"q": d_queries, "d": d_documents}, chunks)

    # Pass 2: each chunk forward again (the same dropout key) and back with its slice of the embeddings' gradient.
    def backward(grads, inputs):
        c, chunk, cotangent = inputs
        _, pull = jax.vjp(lambda p: embed(p, chunk, chunk_rng(c)), params)
        (g,) = pull((cotangent["q"].astype(queries.dtype), cotangent["d"].astype(documents.dtype)))
        return jax.tree.map(jnp.add, grads, g), None

    grads, _ = jax.lax.scan(backward, jax.tree.map(jnp.zeros_like, params), (keys, parts, cotangents))
    return (loss, aux), grads


def matryoshka_dims(text: str | Sequence[int], hidden_size: int) -> tuple[int, ...]:
    """`768,512,256` → (512, 256): the truncated sizes trained beside the full one, each checked to be below the
    model's hidden size."""
    values = [int(v) for v in (text.split(",") if isinstance(text, str) else text) if str(v).strip()]
    bad = [v for v in values if not 0 < v <= hidden_size]
    if bad:
        raise ValueError(
            f"config.data.matryoshka_dims={text!r} holds {bad[0]}, not a size between 1 and the model's hidden size "
            f"{hidden_size}; list smaller sizes, e.g. {hidden_size // 2},{hidden_size // 4}."
        )
    return tuple(sorted({v for v in values if v != hidden_size}, reverse=True))
