"""Texts → one embedding each, on the device, as sentence-transformers' encode makes them: texts sorted by length
(longest first) so a batch's rows are alike, tokenized a batch at a time ([CLS] text [SEP], cut to
max_seq_length), each batch padded to the smallest of a few lengths (powers of two up to max_seq_length) so the
jitted forward compiles a handful of times, not once a batch, and pooled (pooling.py).

`Encoder` is what the retrieval evaluation needs of a model, whoever built it: the retrieval command from a
workdir or a directory (jobs/retrieval.py), a fine-tuning job from its train state.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.data.vocab import tokenization
from bertjax.finetuning import pooling as pooling_lib
from bertjax.training import metrics as metrics_lib

log = logging.getLogger(__name__)

Array = jax.Array
HiddenStates = Callable[[Any, Array, Array], Array]  # (params, ids [n, L], mask [n, L]) → [n, L, hidden]
MIN_BUCKET = 16
PROGRESS_EVERY_S = 30.0
CHARS_PER_TOKEN = 8  # generous: text past max_seq_length × this is cut anyway, so it costs nothing (for the ETA)


@dataclasses.dataclass(frozen=True, eq=False)
class Encoder:
    """A model ready to embed text: its hidden states, parameters, tokenizer and pooling."""

    hidden_states: HiddenStates  # traceable under jax.jit
    params: Any
    tokenizer: tokenization.Tokenizer
    pooling: pooling_lib.Pooling
    max_seq_length: int  # tokens a text is cut to, [CLS] and [SEP] included
    lower_case_text: bool = False  # lower-case the text first (sentence-transformers' do_lower_case)
    query_prompt: str = ""  # prepended to each query
    document_prompt: str = ""  # prepended to each document

    def __post_init__(self):
        if self.max_seq_length <= self.tokenizer.frame().single_specials:
            raise ValueError(f"max_seq_length={self.max_seq_length} leaves no room for text beside the special tokens.")

    @property
    def embed_fn(self) -> Callable[[Any, Array, Array], Array]:
        """Jitted (params, ids, mask) → [n, dim] float32, ready for dot products (pooling.for_scoring); one
        compile per padded shape."""
        fn = self.__dict__.get("_embed_fn")
        if fn is None:
            hidden_states, pooling = self.hidden_states, self.pooling

            def embed(params, ids, mask):
                return pooling_lib.for_scoring(
                    pooling_lib.pool(hidden_states(params, ids, mask), mask, pooling), pooling
                )

            fn = jax.jit(embed)
            object.__setattr__(self, "_embed_fn", fn)
        return fn

    def with_params(self, params: Any) -> "Encoder":
        """The same encoder with other parameters, sharing its compiled embedding (a training run's evals)."""
        other = dataclasses.replace(self, params=params)
        object.__setattr__(other, "_embed_fn", self.embed_fn)
        return other


def buckets(max_seq_length: int) -> list[int]:
    """The padded lengths: powers of two from MIN_BUCKET, and max_seq_length itself."""
    out, length = [], MIN_BUCKET
    while length < max_seq_length:
        out.append(length)
        length *= 2
    return out + [max_seq_length]


def bucket_of(length: int, lengths: Sequence[int]) -> int:
    return next(b for b in lengths if b >= length)


def tokenize(encoder: Encoder, texts: Sequence[str], prompt: str = "") -> list[list[int]]:
    """Framed token ids of each text ([CLS] text [SEP] for BERT's template), cut to max_seq_length."""
    if encoder.lower_case_text:
        texts = [t.lower() for t in texts]
    if prompt:
        texts = [prompt + t for t in texts]
    frame = encoder.tokenizer.frame()
    room = encoder.max_seq_length - frame.single_specials
    return [frame.single(ids[:room]) for ids in encoder.tokenizer.encode_batch(list(texts))]


def length_order(texts: Sequence[str]) -> np.ndarray:
    """Longest first, by characters (sentence-transformers' order): the first batch is the largest shape, so a
    batch that does not fit fails at once, and later batches need no longer padding than their neighbours."""
    return np.argsort(-np.fromiter((len(t) for t in texts), np.int64, len(texts)), kind="stable")


class Progress:
    """A log line every PROGRESS_EVERY_S: done, the rate and an ETA, measured in characters (the texts come longest
    first, so texts per second rises as they go; characters track the work)."""

    def __init__(self, what: str, texts: Sequence[str], max_seq_length: int):
        cap = max_seq_length * CHARS_PER_TOKEN
        self.what, self.total = what, len(texts)
        self.work = np.fromiter((min(len(t), cap) + 1 for t in texts), np.float64, len(texts))
        self.total_work = float(self.work.sum())
        self.done = self.done_work = 0.0
        self.start = self.last = time.monotonic()

    def update(self, indices: np.ndarray) -> None:
        self.done += len(indices)
        self.done_work += float(self.work[indices].sum())
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY_S and self.done < self.total:
            self.last, elapsed = now, now - self.start
            eta = elapsed * (self.total_work - self.done_work) / max(self.done_work, 1e-9)
            log.info(
                "retrieval: %s %s/%s (%.1f%%), %.1f/s, ETA %s",
                self.what,
                f"{int(self.done):,}",
                f"{self.total:,}",
                100 * self.done / self.total,
                self.done / elapsed,
                metrics_lib.format_eta(eta),
            )


def embed_batches(
    encoder: Encoder, texts: Sequence[str], batch_size: int, prompt: str = "", what: str = "texts"
) -> Iterator[tuple[np.ndarray, Array]]:
    """(indices into `texts`, their embeddings [batch_size, dim] on the device) a batch at a time, longest texts
    first; rows past len(indices) are padding. The forward of one batch runs while the next is tokenized."""
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be at least 1.")
    lengths = buckets(encoder.max_seq_length)
    order = length_order(texts)
    progress = Progress(what, texts, encoder.max_seq_length)
    pad = encoder.tokenizer.pad_id
    in_flight: tuple[np.ndarray, Array] | None = None
    for begin in range(0, len(order), batch_size):
        indices = order[begin : begin + batch_size]
        rows = tokenize(encoder, [texts[i] for i in indices], prompt)
        width = bucket_of(max(len(r) for r in rows), lengths)
        ids = np.full((batch_size, width), pad, np.int32)
        mask = np.zeros((batch_size, width), np.int32)
        for j, row in enumerate(rows):
            ids[j, : len(row)] = row
            mask[j, : len(row)] = 1
        values = encoder.embed_fn(encoder.params, jnp.asarray(ids), jnp.asarray(mask))
        if in_flight is not None:  # one batch ahead at most: the rate is the device's, its queue stays short
            in_flight[1].block_until_ready()
            progress.update(in_flight[0])
        in_flight = (indices, values)
        yield indices, values


def embed(encoder: Encoder, texts: Sequence[str], batch_size: int = 32, prompt: str = "") -> np.ndarray:
    """[len(texts), dim] float32 on the host, in the texts' order: for small sets and tests (the search keeps a
    corpus's embeddings on the device, exact_search.py)."""
    out: np.ndarray | None = None
    for indices, values in embed_batches(encoder, texts, batch_size, prompt):
        values = np.asarray(values)[: len(indices)]
        if out is None:
            out = np.zeros((len(texts), values.shape[1]), np.float32)
        out[indices] = values
    return out if out is not None else np.zeros((0, 0), np.float32)
