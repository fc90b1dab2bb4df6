"""Retrieval metrics as trec_eval computes them (BEIR and MTEB call it through pytrec_eval), on the host:

    ndcg_at_10     trec_eval's ndcg_cut.10: gain = the graded relevance itself, discount log2(rank + 1), the
                   ideal ranking from every judged document of the query
    recall_at_100  trec_eval's recall.100: relevant (relevance >= 1) documents in the top 100 / all relevant
    mrr_at_10      trec_eval's recip_rank on the top 10: 1 / rank of the first relevant document, 0 past rank 10
                   (BEIR's own MRR@10 is the same number, its ties aside)

Each is a mean over the queries that have judgements, a query with no relevant document scoring 0. Ties are
ranked as trec_eval ranks them, by score and then by document id, both descending, so that a run scores exactly
as pytrec_eval scores it (BEIR's MRR sorts with Python's stable sort instead, which keeps ties in retrieval order).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

Run = Mapping[str, Sequence[tuple[str, float]]]  # query id → (document id, score), any order
Qrels = Mapping[str, Mapping[str, int]]  # query id → {document id: graded relevance}

NAMES = ("ndcg_at_10", "recall_at_100", "mrr_at_10")
RELEVANT = 1  # trec_eval's relevance level: a judgement below it is not relevant (for recall and MRR)


def trec_order(hits: Sequence[tuple[str, float]]) -> list[tuple[str, float]]:
    """Highest score first; among equal scores the larger document id first (trec_eval's order)."""
    return sorted(hits, key=lambda hit: (hit[1], hit[0]), reverse=True)


def ndcg_at(ranked: Sequence[str], judged: Mapping[str, int], k: int) -> float:
    dcg = sum(judged.get(doc, 0) / math.log2(rank + 2) for rank, doc in enumerate(ranked[:k]))
    ideal = sorted((rel for rel in judged.values() if rel > 0), reverse=True)[:k]
    idcg = sum(rel / math.log2(rank + 2) for rank, rel in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def recall_at(ranked: Sequence[str], judged: Mapping[str, int], k: int) -> float:
    relevant = sum(1 for rel in judged.values() if rel >= RELEVANT)
    found = sum(1 for doc in ranked[:k] if judged.get(doc, 0) >= RELEVANT)
    return found / relevant if relevant else 0.0


def reciprocal_rank_at(ranked: Sequence[str], judged: Mapping[str, int], k: int) -> float:
    for rank, doc in enumerate(ranked[:k]):
        if judged.get(doc, 0) >= RELEVANT:
            return 1.0 / (rank + 1)
    return 0.0


def per_query(run: Run, qrels: Qrels) -> dict[str, dict[str, float]]:
    """{query id: {metric: value}} for every judged query (a query the run lacks scores 0)."""
    out = {}
    for query, judged in qrels.items():
        ranked = [doc for doc, _ in trec_order(run.get(query, ()))]
        out[query] = {
            "ndcg_at_10": ndcg_at(ranked, judged, 10),
            "recall_at_100": recall_at(ranked, judged, 100),
            "mrr_at_10": reciprocal_rank_at(ranked, judged, 10),
        }
    return out


def evaluate(run: Run, qrels: Qrels) -> dict[str, float]:
    """The means over judged queries, and how many there were (`queries`)."""
    values = per_query(run, qrels)
    count = len(values)
    means = {name: (sum(v[name] for v in values.values()) / count if count else 0.0) for name in NAMES}
    return {**means, "queries": count}
