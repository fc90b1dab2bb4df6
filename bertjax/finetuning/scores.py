"""Held-out scores of fine-tuning tasks, computed on the host over all eval predictions at once.

Unlike `bertjax.training.metrics`, whose (sum, count) pairs add up across batches, these scores (macro F1, MCC,
rank correlation, entity F1, SQuAD F1) are not means of per-example terms, so they need every prediction
together. Each one reproduces the definition the task's papers report with — scikit-learn, scipy.stats,
seqeval (conlleval) and the official SQuAD evaluation script — so numbers compare with published ones;
tests/test_scores.py checks each against those references. Pure numpy and Python: no JAX, no
dependency on the reference packages. Every score is a plain float (JSON-ready for metrics.jsonl), and
undefined cases give the references' fallback value without warnings.
"""

from __future__ import annotations

import collections
import re
import string
from typing import Mapping, Sequence

import numpy as np

# --- Classification (GLUE-style sentence / pair tasks) ----------------------------------------------


def _confusion_matrix(labels: np.ndarray, predictions: np.ndarray, num_classes: int) -> np.ndarray:
    """[true, predicted] counts as float64, so MCC's products of counts cannot overflow."""
    flat = labels * num_classes + predictions
    return np.bincount(flat, minlength=num_classes * num_classes).reshape(num_classes, num_classes).astype(np.float64)


def classification_scores(labels: np.ndarray, predictions: np.ndarray, num_classes: int) -> dict:
    """`accuracy`, `macro_f1` and `matthews_corrcoef` (MNLI/SST-2 report accuracy, MRPC/QQP F1, CoLA MCC).

    macro_f1 is sklearn's `f1_score(labels=range(num_classes), average="macro", zero_division=0)`: every
    class counts in the mean, so a class never seen nor predicted adds an F1 of 0. MCC is sklearn's
    multiclass definition, 0 when undefined (a constant label or prediction column).
    """
    labels = np.asarray(labels)
    predictions = np.asarray(predictions)
    if labels.ndim != 1 or labels.shape != predictions.shape:
        raise ValueError(
            f"classification_scores needs two 1-D arrays of the same length; got labels of "
            f"shape {labels.shape} and predictions of shape {predictions.shape}."
        )
    if labels.size == 0:
        raise ValueError("classification_scores got no examples; pass at least one label and prediction.")
    for name, values in (("labels", labels), ("predictions", predictions)):
        if not (np.issubdtype(values.dtype, np.integer) or values.dtype == np.bool_):
            raise ValueError(
                f"classification_scores needs integer class ids in {name}; got dtype "
                f"{values.dtype} (take the argmax of the logits first)."
            )
        if values.min() < 0 or values.max() >= num_classes:
            raise ValueError(
                f"classification_scores: {name} hold class ids outside [0, {num_classes}) "
                f"(min {values.min()}, max {values.max()}); check num_classes or drop padding."
            )
    cm = _confusion_matrix(labels.astype(np.int64), predictions.astype(np.int64), num_classes)
    tp = np.diag(cm)
    true_sum, pred_sum = cm.sum(axis=1), cm.sum(axis=0)
    n = cm.sum()

    # F1 = 2tp / (2tp + fp + fn) = 2tp / (true + predicted); 0 where the class is in neither.
    denom = true_sum + pred_sum
    f1 = np.divide(2.0 * tp, denom, out=np.zeros_like(tp), where=denom > 0)

    # Gorodkin's R_K, in sklearn's covariance form.
    cov_ytyp = tp.sum() * n - true_sum @ pred_sum
    cov_ypyp = n * n - pred_sum @ pred_sum
    cov_ytyt = n * n - true_sum @ true_sum
    mcc = 0.0 if cov_ypyp * cov_ytyt == 0 else cov_ytyp / np.sqrt(cov_ytyt * cov_ypyp)

    return {"accuracy": float(tp.sum() / n), "macro_f1": float(f1.mean()), "matthews_corrcoef": float(mcc)}


def binary_f1(labels: np.ndarray, predictions: np.ndarray, positive: int = 1) -> float:
    """F1 of the `positive` class (sklearn's `f1_score(average="binary", zero_division=0)`): what GLUE
    reports for MRPC and QQP."""
    labels, predictions = np.asarray(labels) == positive, np.asarray(predictions) == positive
    denom = labels.sum() + predictions.sum()
    return float(2.0 * (labels & predictions).sum() / denom) if denom else 0.0


# --- Regression (STS-B) ------------------------------------------------------------------------------


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    """scipy.stats.pearsonr's r (rescaled before the norms so large values cannot overflow); 0.0 for a
    constant input or fewer than two points, where scipy answers nan with a warning."""
    if x.size < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return 0.0
    xm, ym = x - x.mean(), y - y.mean()
    xm /= np.abs(xm).max()
    ym /= np.abs(ym).max()
    r = (xm / np.linalg.norm(xm)) @ (ym / np.linalg.norm(ym))
    return float(np.clip(r, -1.0, 1.0))


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing the mean of the ranks they span (scipy.stats.rankdata 'average')."""
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    starts_group = np.r_[True, sorted_x[1:] != sorted_x[:-1]]
    group = np.cumsum(starts_group) - 1
    starts = np.flatnonzero(starts_group)
    counts = np.diff(np.r_[starts, x.size])
    ranks = np.empty(x.size, np.float64)
    ranks[order] = (starts + (counts + 1) / 2.0)[group]
    return ranks


def regression_scores(labels: np.ndarray, predictions: np.ndarray) -> dict:
    """`pearson`, `spearman` (STS-B reports both) and `mse`.

    Spearman is Pearson on average ranks, as scipy.stats.spearmanr. A constant input (say, a model that
    collapsed to one value) scores 0.0 on both correlations rather than nan; a non-finite value in
    either array makes them nan, since no rank order is meaningful then.
    """
    y = np.asarray(labels, np.float64).ravel()
    p = np.asarray(predictions, np.float64).ravel()
    if y.shape != p.shape:
        raise ValueError(f"regression_scores needs labels and predictions of the same size; got {y.size} and {p.size}.")
    if y.size == 0:
        raise ValueError("regression_scores got no examples; pass at least one label and prediction.")
    with np.errstate(all="ignore"):
        mse = float(np.mean((p - y) ** 2))
    if not (np.all(np.isfinite(y)) and np.all(np.isfinite(p))):
        return {"pearson": float("nan"), "spearman": float("nan"), "mse": mse}
    return {"pearson": _pearson(y, p), "spearman": _pearson(_average_ranks(y), _average_ranks(p)), "mse": mse}


# --- Entities (token classification: CoNLL NER) ------------------------------------------------------


def _tag_parts(tag: str) -> tuple[str, str]:
    """('B', 'PER') from 'B-PER'; seqeval's parse, so 'O' is ('O', '_') and 'B-LOC-CITY' keeps 'LOC-CITY'."""
    return tag[:1], tag[1:].split("-", 1)[-1] or "_"


def _ends_chunk(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    """conlleval's endOfChunk (as seqeval's end_of_chunk): IOB1, IOB2 and IOBES all read right."""
    if prev_tag in ("E", "S"):
        return True
    if prev_tag in ("B", "I") and tag in ("B", "S", "O"):
        return True
    return prev_tag != "O" and prev_type != type_


def _starts_chunk(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    """conlleval's startOfChunk: an I- after O, E, S or another type opens a chunk (IOB1's convention)."""
    if tag in ("B", "S"):
        return True
    if prev_tag in ("E", "S", "O") and tag in ("E", "I"):
        return True
    return tag != "O" and prev_type != type_


def entity_chunks(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """The (type, first, last) token spans of one sentence's tags, both ends inclusive."""
    chunks = []
    prev_tag, prev_type, begin = "O", "", 0
    for i, full in enumerate([*tags, "O"]):  # the trailing O closes a chunk that ends the sentence
        tag, type_ = _tag_parts(full)
        if _ends_chunk(prev_tag, tag, prev_type, type_):
            chunks.append((prev_type, begin, i - 1))
        if _starts_chunk(prev_tag, tag, prev_type, type_):
            begin = i
        prev_tag, prev_type = tag, type_
    return chunks


def _prf(correct: int, predicted: int, true: int) -> tuple[float, float, float]:
    """Precision, recall and F1 as seqeval computes them, each 0.0 where its denominator is 0."""
    precision = correct / predicted if predicted else 0.0
    recall = correct / true if true else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def entity_scores(true_tags: Sequence[Sequence[str]], pred_tags: Sequence[Sequence[str]]) -> dict:
    """Entity-level micro `precision`, `recall`, `f1` (seqeval's default, conlleval's definition: an
    entity counts only if its type, start and end all match), token-level `accuracy`, and `f1_<TYPE>`
    for every type seen in either. Token accuracy alone flatters NER, since most tokens are O."""
    if len(true_tags) != len(pred_tags):
        raise ValueError(
            f"entity_scores needs one predicted tag sequence per sentence; got "
            f"{len(true_tags)} true and {len(pred_tags)} predicted sentences."
        )
    true_by_type: dict[str, set] = collections.defaultdict(set)
    pred_by_type: dict[str, set] = collections.defaultdict(set)
    tokens = same = 0
    for s, (true_seq, pred_seq) in enumerate(zip(true_tags, pred_tags)):
        if len(true_seq) != len(pred_seq):
            raise ValueError(
                f"entity_scores: sentence {s} has {len(true_seq)} true tags but "
                f"{len(pred_seq)} predicted ones; predict one tag per token."
            )
        tokens += len(true_seq)
        same += sum(t == p for t, p in zip(true_seq, pred_seq))
        for type_, first, last in entity_chunks(true_seq):
            true_by_type[type_].add((s, first, last))
        for type_, first, last in entity_chunks(pred_seq):
            pred_by_type[type_].add((s, first, last))
    if tokens == 0:
        raise ValueError("entity_scores got no tokens; pass at least one non-empty sentence.")

    per_type = {}
    for type_ in sorted(true_by_type.keys() | pred_by_type.keys()):
        true_set, pred_set = true_by_type[type_], pred_by_type[type_]
        per_type[type_] = (len(true_set & pred_set), len(pred_set), len(true_set))
    correct, predicted, true = (sum(c[i] for c in per_type.values()) for i in range(3))
    precision, recall, f1 = _prf(correct, predicted, true)
    scores = {"precision": precision, "recall": recall, "f1": f1, "accuracy": same / tokens}
    for type_, counts in per_type.items():
        scores[f"f1_{type_}"] = _prf(*counts)[2]
    return scores


# --- Extractive QA (SQuAD v1.1 / v2.0) ---------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(s: str) -> str:
    """The official script's normalisation: lowercase, drop punctuation, articles, extra whitespace."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", s).split())


def _answer_tokens(s: str) -> list[str]:
    return normalize_answer(s).split() if s else []


def _exact(gold: str, pred: str) -> int:
    return int(normalize_answer(gold) == normalize_answer(pred))


def _f1(gold: str, pred: str) -> float:
    """Token-overlap F1; when either side is empty (no answer), 1 if both are and 0 otherwise."""
    gold_toks, pred_toks = _answer_tokens(gold), _answer_tokens(pred)
    if not gold_toks or not pred_toks:
        return float(gold_toks == pred_toks)
    same = sum((collections.Counter(gold_toks) & collections.Counter(pred_toks)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_toks), same / len(gold_toks)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: Mapping[str, str], references: Mapping[str, Sequence[str]]) -> dict:
    """`exact_match` and `f1` in percent, as the official SQuAD evaluate-v2.0 script (v1.1's on
    answerable data), each the max over a question's gold answers.

    An unanswerable question has gold answers [""] (or []) and only the prediction "" scores on it; then
    `HasAns_*`/`NoAns_*` break the scores down as the v2.0 script does. A question with no prediction
    scores 0 and stays in the denominator (v1.1's rule; v2.0 would drop it and inflate the score), and
    `missing` counts them. Predictions for questions not in `references` are ignored.
    """
    if not references:
        raise ValueError("squad_scores got no reference questions; pass at least one qid with its answers.")
    exact, f1, has_answer = {}, {}, {}
    missing = 0
    for qid, answers in references.items():
        if isinstance(answers, str):
            raise ValueError(
                f"squad_scores: the references of question {qid!r} are a string; pass a "
                f'list of gold answers ([""] for an unanswerable question).'
            )
        has_answer[qid] = any(answers)
        golds = [a for a in answers if normalize_answer(a)] or [""]
        if qid not in predictions:
            missing += 1
            exact[qid], f1[qid] = 0, 0.0
            continue
        pred = predictions[qid]
        exact[qid] = max(_exact(g, pred) for g in golds)
        f1[qid] = max(_f1(g, pred) for g in golds)

    def percent(values: dict, qids: list[str]) -> float:
        return 100.0 * sum(values[q] for q in qids) / len(qids)

    qids = list(references)
    scores = {"exact_match": percent(exact, qids), "f1": percent(f1, qids), "total": len(qids), "missing": missing}
    no_ans = [q for q in qids if not has_answer[q]]
    if no_ans:
        has_ans = [q for q in qids if has_answer[q]]
        if has_ans:  # as the v2.0 script, a subset with no questions gets no keys
            scores.update(
                HasAns_exact=percent(exact, has_ans), HasAns_f1=percent(f1, has_ans), HasAns_total=len(has_ans)
            )
        scores.update(NoAns_exact=percent(exact, no_ans), NoAns_f1=percent(f1, no_ans), NoAns_total=len(no_ans))
    return scores


# --- Sweeps (several seeds or learning rates of one task) --------------------------------------------


def summary(values: Sequence[float]) -> dict:
    """`mean`, sample `std` (ddof=1; 0.0 for one run), `min`, `max`, `n` of one score over a sweep:
    fine-tuning BERT on small GLUE sets varies by points between seeds, so one run is not a result."""
    x = np.asarray(values, np.float64).ravel()
    if x.size == 0:
        raise ValueError("summary got no values; pass the score of at least one run.")
    return {
        "mean": float(x.mean()),
        "std": float(x.std(ddof=1)) if x.size > 1 else 0.0,
        "min": float(x.min()),
        "max": float(x.max()),
        "n": int(x.size),
    }
