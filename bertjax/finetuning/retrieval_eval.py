"""Dense retrieval scored on a BEIR set: the library behind `python -m bertjax.retrieval`, and what a fine-tuning
job calls for its eval rows (`config.data.eval_dir`), with whatever encoder it holds.

    encoder = embedding.Encoder(hidden_states, params, tokenizer, pooling.Pooling(), max_seq_length=512)
    scores = retrieval_eval.evaluate(encoder, beir.read(BEIR_DIR))   # {"ndcg_at_10": …, "recall_at_100": …, …}

The judged queries are embedded first and kept on the device; the corpus follows in batches, longest first, into
exact_search's running top-k; the run (the top 100 of each query, enough for recall@100) comes back to the host and
is scored there (retrieval_metrics.py). A document whose id equals the query's is dropped from that query's run, as
BEIR's and MTEB's evaluators drop it (sets like ArguAna and Quora hold each query among the documents); one more
hit is kept to make up for it.
"""

from __future__ import annotations

import logging
import time
from typing import Optional

import jax.numpy as jnp
import numpy as np

from bertjax.finetuning import beir
from bertjax.finetuning import embedding
from bertjax.finetuning import exact_search
from bertjax.finetuning import retrieval_metrics

log = logging.getLogger(__name__)

TOP_K = 100  # hits kept a query: recall@100's depth


def run_of(
    data: beir.RetrievalSet, scores: np.ndarray, indices: np.ndarray, k: int = TOP_K
) -> dict[str, list[tuple[str, float]]]:
    """query id → its top-k (document id, score), best first, identical ids and padding (-1) dropped."""
    run = {}
    for row, query in enumerate(data.query_ids):
        hits = [
            (data.doc_ids[i], float(s))
            for i, s in zip(indices[row], scores[row])
            if i >= 0 and data.doc_ids[i] != query
        ]
        run[query] = hits[:k]
    return run


def search(
    encoder: embedding.Encoder,
    data: beir.RetrievalSet,
    k: int = TOP_K,
    batch_size: int = 64,
    block_size: Optional[int] = None,
) -> dict[str, list[tuple[str, float]]]:
    """The run: every judged query's top-k documents by the encoder's similarity."""
    parts = list(embedding.embed_batches(encoder, data.query_texts, batch_size, encoder.query_prompt, "queries"))
    order = np.concatenate([i for i, _ in parts])
    # embedded longest first: put back in the queries' own order, on the device
    queries = jnp.concatenate([e[: len(i)] for i, e in parts], axis=0)[np.argsort(order)]
    block = block_size or exact_search.block_rows(data.num_queries, batch_size, num_documents=data.num_documents)
    batches = embedding.embed_batches(encoder, data.doc_texts, batch_size, encoder.document_prompt, "documents")
    scores, indices = exact_search.search(queries, batches, k + 1, block)
    return run_of(data, scores, indices, k)


def evaluate(
    encoder: embedding.Encoder,
    data: beir.RetrievalSet,
    batch_size: int = 64,
    block_size: Optional[int] = None,
) -> dict:
    """{ndcg_at_10, recall_at_100, mrr_at_10, queries, documents, seconds} of the encoder on `data`."""
    start = time.monotonic()
    log.info(
        "retrieval: %s judged queries against %s documents (%s pooling%s, %s), batches of %d, max_seq_length %d",
        f"{data.num_queries:,}",
        f"{data.num_documents:,}",
        encoder.pooling.mode,
        ", normalised" if encoder.pooling.normalize else "",
        encoder.pooling.similarity,
        batch_size,
        encoder.max_seq_length,
    )
    run = search(encoder, data, TOP_K, batch_size, block_size)
    scores = retrieval_metrics.evaluate(run, data.qrels)
    return {**scores, "documents": data.num_documents, "seconds": time.monotonic() - start}
