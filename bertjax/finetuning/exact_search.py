"""Exact nearest-neighbour search on the device, a block of documents at a time.

The queries' embeddings stay on the device; documents arrive in batches (embedding.py) and are gathered into
blocks of `block_size` rows. Each block is scored against every query ([queries, block] on the device, float32 at
full precision) and reduced with `jax.lax.top_k` into a running top-k of (score, document index) per query, merged
with the blocks before. The host never holds more than [queries, k], so a million documents never need a
million-by-anything matrix anywhere, and the device holds one block's scores. One jitted merge serves every block
(the last one padded, its padding scored -inf).
"""

from __future__ import annotations

import functools
from typing import Iterable, Optional

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
SCORE_BYTES_BUDGET = 256 * 2**20  # a block's [queries, block] float32 scores and their top-k's working copies
MIN_BLOCK, MAX_BLOCK = 1024, 65536


def block_rows(
    num_queries: int, batch_size: int, budget: int = SCORE_BYTES_BUDGET, num_documents: Optional[int] = None
) -> int:
    """Rows a block: as many as keep its scores (three [queries, rows] float32 arrays at once) within `budget`,
    a multiple of the batch size (so batches never straddle blocks), and no more than the corpus needs (a corpus
    of 61 documents was padded to a block of 65,536 rows, all scored)."""
    rows = max(MIN_BLOCK, min(MAX_BLOCK, budget // max(12 * num_queries, 1)))
    if num_documents is not None:
        rows = min(rows, -(-max(num_documents, 1) // batch_size) * batch_size)
    return max(batch_size, rows // batch_size * batch_size)


@functools.partial(jax.jit, static_argnames=("k",), donate_argnums=(0, 1))
def _merge(best: Array, best_ids: Array, queries: Array, block: Array, block_ids: Array, k: int):
    scores = jnp.matmul(queries, block.T, precision=jax.lax.Precision.HIGHEST)  # not bf16 passes (TPU default)
    scores = jnp.where(block_ids[None, :] >= 0, scores, -jnp.inf)
    block_top, where = jax.lax.top_k(scores, min(k, scores.shape[1]))
    merged = jnp.concatenate([best, block_top], axis=1)
    merged_ids = jnp.concatenate([best_ids, block_ids[where]], axis=1)
    top, where = jax.lax.top_k(merged, k)
    return top, jnp.take_along_axis(merged_ids, where, axis=1)


class TopK:
    """The running top-k of every query over the documents added so far."""

    def __init__(self, queries: Array, k: int, block_size: int):
        if block_size < 1 or k < 1:
            raise ValueError(f"block_size={block_size} and k={k} must be positive.")
        self.queries, self.k, self.block_size = jnp.asarray(queries, jnp.float32), k, block_size
        self.best = jnp.full((self.queries.shape[0], k), -jnp.inf, jnp.float32)
        self.best_ids = jnp.full((self.queries.shape[0], k), -1, jnp.int32)
        self._pending: list[tuple[np.ndarray, Array]] = []  # batches of the block being gathered
        self._rows = 0
        self.blocks = 0

    def add(self, doc_indices: np.ndarray, embeddings: Array) -> None:
        """Documents `doc_indices` (their positions in the corpus), embeddings [>= len(doc_indices), dim] on the
        device (rows past len(doc_indices) are padding)."""
        embeddings = embeddings[: len(doc_indices)] if embeddings.shape[0] != len(doc_indices) else embeddings
        while len(doc_indices):
            room = self.block_size - self._rows
            self._pending.append((doc_indices[:room], embeddings[:room]))
            self._rows += min(room, len(doc_indices))
            doc_indices, embeddings = doc_indices[room:], embeddings[room:]
            if self._rows == self.block_size:
                self._flush()

    def _flush(self) -> None:
        if not self._rows:
            return
        ids = np.full(self.block_size, -1, np.int32)
        ids[: self._rows] = np.concatenate([i for i, _ in self._pending])
        block = jnp.concatenate([e for _, e in self._pending], axis=0)
        if self._rows < self.block_size:  # the last block: one shape for every merge, so one compile
            block = jnp.pad(block, ((0, self.block_size - self._rows), (0, 0)))
        self.best, self.best_ids = _merge(self.best, self.best_ids, self.queries, block, jnp.asarray(ids), self.k)
        self._pending, self._rows = [], 0
        self.blocks += 1

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(scores [queries, k], document indices [queries, k]) on the host, best first; -1 where fewer than k
        documents were added."""
        self._flush()
        return np.asarray(self.best), np.asarray(self.best_ids)


def search(
    queries: Array, batches: Iterable[tuple[np.ndarray, Array]], k: int, block_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """The top-k documents of every query over `batches` of (indices, embeddings): TopK fed to its end."""
    top = TopK(queries, k, block_size)
    for indices, embeddings in batches:
        top.add(indices, embeddings)
    return top.result()
