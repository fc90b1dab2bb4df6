"""The BM25 baseline on a BEIR set, with `bm25s` (a sparse, numpy-only BM25; the retrieval command reports it beside
the dense model's scores, so a number is never read without the lexical one).

Settings are bm25s's defaults: Lucene's BM25 (k1 1.5, b 0.75), lower-cased words of two or more letters or digits,
English stop words removed, no stemming (the same tokens on every machine). A document is the same title + text as
the dense encoder reads (beir.py); identical query and document ids are dropped as in the dense run.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from bertjax.finetuning import beir
from bertjax.finetuning import retrieval_eval
from bertjax.finetuning import retrieval_metrics

log = logging.getLogger(__name__)

NAME = "bm25s"  # the results' key


def _bm25s():
    try:
        import bm25s
    except ImportError:
        raise ImportError("the BM25 baseline needs bm25s, which bertjax installs: pip install bm25s") from None
    return bm25s


def evaluate(data: beir.RetrievalSet, k: int = retrieval_eval.TOP_K) -> dict:
    """{ndcg_at_10, recall_at_100, mrr_at_10, queries, documents, seconds} of BM25 on `data`."""
    bm25s = _bm25s()
    start = time.monotonic()
    index = bm25s.BM25()
    index.index(bm25s.tokenize(data.doc_texts, stopwords="en", show_progress=False), show_progress=False)
    queries = bm25s.tokenize(data.query_texts, stopwords="en", return_ids=False, show_progress=False)
    depth = min(k + 1, data.num_documents)
    indices, scores = index.retrieve(queries, k=depth, show_progress=False, backend_selection="numpy")
    run = retrieval_eval.run_of(data, np.asarray(scores), np.asarray(indices), k)
    out = {**retrieval_metrics.evaluate(run, data.qrels), "documents": data.num_documents}
    out["seconds"] = time.monotonic() - start
    log.info("retrieval: %s nDCG@10 %.4f (%.1f s)", NAME, out["ndcg_at_10"], out["seconds"])
    return out
