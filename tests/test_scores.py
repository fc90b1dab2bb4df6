"""bertjax.finetuning.scores vs the references task papers report with: scikit-learn, scipy.stats, seqeval and the
official SQuAD v2.0 evaluation script, on random inputs and on the edge cases each metric gets wrong
first (absent classes, ties, IOB1 chunk starts, articles and punctuation, unanswerable questions)."""

import collections
import math
import re
import string
import warnings

import numpy as np
import pytest
import scipy.stats
import seqeval.metrics
import sklearn.metrics

from bertjax.finetuning import scores


@pytest.fixture
def no_warnings():
    """Fails the test on any warning raised inside it: the scores must not spam eval logs."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


# --- Classification ----------------------------------------------------------------------------------


def _sklearn_classification(labels, predictions, num_classes):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sklearn's own warnings on degenerate inputs
        return {
            "accuracy": sklearn.metrics.accuracy_score(labels, predictions),
            "macro_f1": sklearn.metrics.f1_score(
                labels, predictions, labels=list(range(num_classes)), average="macro", zero_division=0
            ),
            "matthews_corrcoef": sklearn.metrics.matthews_corrcoef(labels, predictions),
        }


@pytest.mark.parametrize("num_classes", [2, 3, 5])
def test_classification_matches_sklearn_on_random_inputs(num_classes, no_warnings):
    rng = np.random.default_rng(num_classes)
    for trial in range(60):
        n = int(rng.integers(1, 30))
        # A skewed label distribution often leaves a class out of labels, predictions, or both.
        p = rng.dirichlet(np.full(num_classes, 0.5))
        labels = rng.choice(num_classes, n, p=p)
        predictions = np.where(rng.random(n) < 0.6, labels, rng.choice(num_classes, n, p=p))
        got = scores.classification_scores(labels, predictions, num_classes)
        want = _sklearn_classification(labels, predictions, num_classes)
        assert got.keys() == want.keys()
        for key in want:
            assert got[key] == pytest.approx(want[key], abs=1e-12), (trial, key, labels, predictions)
            assert isinstance(got[key], float)


def test_classification_absent_classes_count_as_zero_f1(no_warnings):
    # Perfect on classes 0 and 1; classes 2 and 3 appear in neither, so each adds an F1 of 0.
    labels = np.array([0, 1, 1, 0])
    got = scores.classification_scores(labels, labels, num_classes=4)
    assert got["macro_f1"] == pytest.approx(0.5)
    assert got["macro_f1"] == pytest.approx(_sklearn_classification(labels, labels, 4)["macro_f1"])
    assert got["accuracy"] == 1.0 and got["matthews_corrcoef"] == pytest.approx(1.0)


def test_classification_mcc_is_zero_when_undefined(no_warnings):
    labels = np.array([0, 1, 1, 0, 1])
    constant = np.ones_like(labels)
    for y, p in [(labels, constant), (constant, labels), (constant, constant)]:
        got = scores.classification_scores(y, p, num_classes=2)
        assert got["matthews_corrcoef"] == 0.0
        assert got["matthews_corrcoef"] == _sklearn_classification(y, p, 2)["matthews_corrcoef"]


def test_classification_mcc_multiclass_and_anticorrelated(no_warnings):
    y = np.array([0, 0, 1, 1])
    assert scores.classification_scores(y, 1 - y, 2)["matthews_corrcoef"] == pytest.approx(-1.0)
    y = np.array([0, 1, 2, 2, 1, 0, 2, 1])
    p = np.array([0, 2, 2, 1, 1, 0, 2, 0])
    assert scores.classification_scores(y, p, 3)["matthews_corrcoef"] == pytest.approx(
        sklearn.metrics.matthews_corrcoef(y, p)
    )


def test_classification_large_counts_do_not_overflow(no_warnings):
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 300_000)
    predictions = np.where(rng.random(labels.size) < 0.7, labels, rng.integers(0, 3, labels.size))
    got = scores.classification_scores(labels.astype(np.int32), predictions.astype(np.int32), 3)
    assert got["matthews_corrcoef"] == pytest.approx(sklearn.metrics.matthews_corrcoef(labels, predictions), abs=1e-12)


@pytest.mark.parametrize(
    "labels, predictions, num_classes, match",
    [
        ([0, 1], [0], 2, "same length"),
        ([], [], 2, "no examples"),
        ([0, 2], [0, 1], 2, "outside"),
        ([0, -100], [0, 1], 2, "outside"),
        ([0.0, 1.0], [0, 1], 2, "integer"),
    ],
)
def test_classification_bad_inputs_say_what_to_do(labels, predictions, num_classes, match):
    with pytest.raises(ValueError, match=match):
        scores.classification_scores(np.array(labels), np.array(predictions), num_classes)


# --- Regression --------------------------------------------------------------------------------------


def test_regression_matches_scipy_on_random_inputs(no_warnings):
    rng = np.random.default_rng(1)
    for trial in range(40):
        n = int(rng.integers(2, 50))
        labels = rng.normal(size=n) * 2 + 1
        predictions = labels * rng.normal() + rng.normal(size=n)
        got = scores.regression_scores(labels, predictions)
        assert got["pearson"] == pytest.approx(scipy.stats.pearsonr(labels, predictions)[0], abs=1e-12)
        assert got["spearman"] == pytest.approx(scipy.stats.spearmanr(labels, predictions)[0], abs=1e-12)
        assert got["mse"] == pytest.approx(sklearn.metrics.mean_squared_error(labels, predictions), rel=1e-12)


def test_spearman_ranks_ties_by_their_average(no_warnings):
    rng = np.random.default_rng(2)
    for trial in range(40):
        # STS-B's gold scores come in steps of 0.2, and a saturated model repeats its outputs: ties.
        labels = rng.integers(0, 4, 25).astype(float)
        predictions = np.round(labels + rng.normal(size=25), 0)
        want = scipy.stats.spearmanr(labels, predictions)[0]
        assert scores.regression_scores(labels, predictions)["spearman"] == pytest.approx(want, abs=1e-12)
    # Ranking the ties in order of appearance instead would give another answer here.
    labels = np.array([1.0, 1.0, 1.0, 2.0, 3.0])
    predictions = np.array([3.0, 1.0, 2.0, 4.0, 5.0])
    ordinal = scipy.stats.pearsonr(scipy.stats.rankdata(labels, method="ordinal"), scipy.stats.rankdata(predictions))[0]
    want = scipy.stats.spearmanr(labels, predictions)[0]
    assert abs(ordinal - want) > 0.05
    assert scores.regression_scores(labels, predictions)["spearman"] == pytest.approx(want, abs=1e-12)
    assert scores._average_ranks(np.array([5.0, 1.0, 5.0, 3.0, 5.0])).tolist() == [4.0, 1.0, 4.0, 2.0, 4.0]


def test_regression_constant_inputs_give_zero_correlation_quietly(no_warnings):
    varied = np.array([0.5, 1.5, 2.0, 4.0])
    for y, p in [(varied, np.full(4, 0.1)), (np.full(4, 0.1), varied), (np.full(4, 3.0), np.full(4, 3.0))]:
        got = scores.regression_scores(y, p)
        assert got["pearson"] == 0.0 and got["spearman"] == 0.0
        assert got["mse"] == pytest.approx(np.mean((y - p) ** 2))
    one = scores.regression_scores([1.0], [2.0])
    assert one == {"pearson": 0.0, "spearman": 0.0, "mse": 1.0}


def test_regression_edge_values(no_warnings):
    # Perfectly (anti-)correlated, and values whose squares overflow float64.
    x = np.array([1.0, 2.0, 3.0, 10.0])
    assert scores.regression_scores(x, 3 * x + 1)["pearson"] == pytest.approx(1.0)
    assert scores.regression_scores(x, -x)["spearman"] == pytest.approx(-1.0)
    big = np.array([1e200, 3e200, 2e200, -1e200])
    assert scores.regression_scores(big, big[::-1].copy())["pearson"] == pytest.approx(
        scipy.stats.pearsonr(big, big[::-1])[0], abs=1e-12
    )
    got = scores.regression_scores([1.0, np.nan, 3.0], [1.0, 2.0, 3.0])
    assert math.isnan(got["pearson"]) and math.isnan(got["spearman"]) and math.isnan(got["mse"])


def test_regression_bad_inputs_say_what_to_do():
    with pytest.raises(ValueError, match="same size"):
        scores.regression_scores([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="no examples"):
        scores.regression_scores([], [])


# --- Entities ----------------------------------------------------------------------------------------


def _seqeval(true_tags, pred_tags):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # seqeval's UndefinedMetricWarning on empty sets
        want = {
            "precision": seqeval.metrics.precision_score(true_tags, pred_tags),
            "recall": seqeval.metrics.recall_score(true_tags, pred_tags),
            "f1": seqeval.metrics.f1_score(true_tags, pred_tags),
            "accuracy": seqeval.metrics.accuracy_score(true_tags, pred_tags),
        }
        types = sorted(
            {t for tags in (true_tags, pred_tags) for t, _, _ in seqeval.metrics.sequence_labeling.get_entities(tags)}
        )
        if types:
            per_type = seqeval.metrics.f1_score(true_tags, pred_tags, average=None)
            want.update({f"f1_{t}": f for t, f in zip(types, per_type)})
    return want


def _random_tags(rng, n_sentences, alphabet):
    return [list(rng.choice(alphabet, int(rng.integers(0, 9)))) for _ in range(n_sentences)]


@pytest.mark.parametrize(
    "alphabet",
    [
        ["O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC"],  # IOB1/IOB2, stray I- starts
        ["O", "B-PER", "I-PER", "E-PER", "S-PER", "B-ORG", "I-ORG", "S-ORG"],  # IOBES
        ["O", "I-MISC", "I-MISC", "B-MISC", "I-LOC"],  # IOB1-heavy, I- after another type
    ],
)
def test_entities_match_seqeval_on_random_tags(alphabet, no_warnings):
    rng = np.random.default_rng(len(alphabet))
    for trial in range(60):
        true_tags = _random_tags(rng, int(rng.integers(1, 6)), alphabet)
        if not any(true_tags):
            true_tags.append(["O"])
        # The prediction flips some of the true tags, so chunks partly agree.
        pred_tags = [[t if rng.random() < 0.7 else str(rng.choice(alphabet)) for t in tags] for tags in true_tags]
        got = scores.entity_scores(true_tags, pred_tags)
        want = _seqeval(true_tags, pred_tags)
        assert got.keys() == want.keys(), (true_tags, pred_tags)
        for key in want:
            assert got[key] == pytest.approx(want[key], abs=1e-12), (key, true_tags, pred_tags)


def test_entity_chunks_follow_conlleval():
    assert scores.entity_chunks(["I-PER", "I-PER", "O", "I-LOC"]) == [("PER", 0, 1), ("LOC", 3, 3)]
    # An I- of another type starts a chunk; B- after I- of the same type does too.
    assert scores.entity_chunks(["B-PER", "I-LOC", "I-LOC"]) == [("PER", 0, 0), ("LOC", 1, 2)]
    assert scores.entity_chunks(["I-PER", "B-PER", "I-PER"]) == [("PER", 0, 0), ("PER", 1, 2)]
    assert scores.entity_chunks(["B-ORG", "E-ORG", "S-LOC", "O"]) == [("ORG", 0, 1), ("LOC", 2, 2)]
    assert scores.entity_chunks(["B-LOC-CITY", "I-LOC-CITY"]) == [("LOC-CITY", 0, 1)]
    assert scores.entity_chunks(["O", "O"]) == [] and scores.entity_chunks([]) == []


def test_entities_iob1_and_iob2_spellings_of_the_same_chunks_agree(no_warnings):
    true_tags = [["I-PER", "I-PER", "O", "I-LOC"], ["B-ORG", "I-ORG"]]
    pred_tags = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "B-ORG"]]  # the last: two chunks, both wrong
    got = scores.entity_scores(true_tags, pred_tags)
    assert got["precision"] == pytest.approx(2 / 4) and got["recall"] == pytest.approx(2 / 3)
    assert got["f1"] == pytest.approx(4 / 7) and got["accuracy"] == pytest.approx(3 / 6)
    assert got["f1_PER"] == 1.0 and got["f1_LOC"] == 1.0 and got["f1_ORG"] == 0.0
    assert got == pytest.approx(_seqeval(true_tags, pred_tags))


def test_entities_exact_span_match_only(no_warnings):
    # Right type, one token short: no credit at the entity level, most at the token level.
    got = scores.entity_scores([["B-PER", "I-PER", "I-PER"]], [["B-PER", "I-PER", "O"]])
    assert (got["precision"], got["recall"], got["f1"]) == (0.0, 0.0, 0.0)
    assert got["accuracy"] == pytest.approx(2 / 3)


def test_entities_none_anywhere_scores_zero_quietly(no_warnings):
    got = scores.entity_scores([["O", "O"], ["O"]], [["O", "O"], ["O"]])
    assert got == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "accuracy": 1.0}


def test_entities_bad_inputs_say_what_to_do():
    with pytest.raises(ValueError, match="sentence 1 has 2 true tags"):
        scores.entity_scores([["O"], ["O", "B-PER"]], [["O"], ["O"]])
    with pytest.raises(ValueError, match="2 true and 1 predicted"):
        scores.entity_scores([["O"], ["O"]], [["O"]])
    with pytest.raises(ValueError, match="no tokens"):
        scores.entity_scores([[]], [[]])


# --- SQuAD -------------------------------------------------------------------------------------------
# The reference: normalize_answer, get_tokens, compute_exact and compute_f1 transcribed from the official
# SQuAD v2.0 evaluation script, evaluate-v2.0.py (rajpurkar.github.io/SQuAD-explorer, "Evaluation Script
# v2.0"), with get_raw_scores' gold-answer filtering and make_eval_dict's percentages. Its one change: a
# missing prediction scores 0 and is counted, as evaluate-v1.1.py does (v2.0 skips the question).


def _ref_normalize_answer(s):
    def remove_articles(text):
        regex = re.compile(r"\b(a|an|the)\b", re.UNICODE)
        return re.sub(regex, " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def _ref_get_tokens(s):
    if not s:
        return []
    return _ref_normalize_answer(s).split()


def _ref_compute_exact(a_gold, a_pred):
    return int(_ref_normalize_answer(a_gold) == _ref_normalize_answer(a_pred))


def _ref_compute_f1(a_gold, a_pred):
    gold_toks = _ref_get_tokens(a_gold)
    pred_toks = _ref_get_tokens(a_pred)
    common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
    num_same = sum(common.values())
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        # If either is no-answer, then F1 is 1 if they agree, 0 otherwise
        return int(gold_toks == pred_toks)
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(pred_toks)
    recall = 1.0 * num_same / len(gold_toks)
    f1 = (2 * precision * recall) / (precision + recall)
    return f1


def _ref_squad(predictions, references):
    exact, f1, has_ans = {}, {}, {}
    for qid, answers in references.items():
        has_ans[qid] = bool([a for a in answers if a])
        gold_answers = [a for a in answers if _ref_normalize_answer(a)]
        if not gold_answers:
            gold_answers = [""]  # For unanswerable questions, only correct answer is empty string
        if qid not in predictions:
            exact[qid], f1[qid] = 0, 0
            continue
        a_pred = predictions[qid]
        exact[qid] = max(_ref_compute_exact(a, a_pred) for a in gold_answers)
        f1[qid] = max(_ref_compute_f1(a, a_pred) for a in gold_answers)

    def make_eval_dict(qid_list):
        total = len(qid_list)
        return {
            "exact": 100.0 * sum(exact[k] for k in qid_list) / total,
            "f1": 100.0 * sum(f1[k] for k in qid_list) / total,
            "total": total,
        }

    out = make_eval_dict(list(references))
    out = {
        "exact_match": out["exact"],
        "f1": out["f1"],
        "total": out["total"],
        "missing": sum(q not in predictions for q in references),
    }
    has_ans_qids = [k for k, v in has_ans.items() if v]
    no_ans_qids = [k for k, v in has_ans.items() if not v]
    if no_ans_qids:
        for prefix, qids in (("HasAns", has_ans_qids), ("NoAns", no_ans_qids)):
            if qids:
                sub = make_eval_dict(qids)
                out.update(
                    {f"{prefix}_exact": sub["exact"], f"{prefix}_f1": sub["f1"], f"{prefix}_total": sub["total"]}
                )
    return out


_WORDS = [
    "the",
    "The",
    "a",
    "an",
    "An",
    "cat",
    "Cat",
    "dog",
    "sat",
    "on",
    "mat",
    "1,000",
    "U.S.",
    "Paris",
    "paris!",
    "(1879)",
    "anthem",
    "theory",
    "élan",
    "—",
    "...",
    "'s",
]


def _random_answer(rng, max_words=5):
    words = list(rng.choice(_WORDS, int(rng.integers(0, max_words + 1))))
    return rng.choice(["", " ", "  "]).join(words) if len(words) > 1 else "".join(words)


@pytest.mark.parametrize("unanswerable_fraction", [0.0, 0.3, 1.0])
def test_squad_matches_the_official_script_on_random_answers(unanswerable_fraction, no_warnings):
    rng = np.random.default_rng(int(unanswerable_fraction * 10))
    for trial in range(40):
        references, predictions = {}, {}
        for i in range(int(rng.integers(1, 12))):
            qid = f"q{i}"
            if rng.random() < unanswerable_fraction:
                references[qid] = [""]
            else:
                references[qid] = [_random_answer(rng) or "cat" for _ in range(int(rng.integers(1, 4)))]
            if rng.random() < 0.9:  # the rest are missing
                predictions[qid] = rng.choice(references[qid]) if rng.random() < 0.3 else _random_answer(rng)
        predictions["not-a-question"] = "cat"
        got = scores.squad_scores(predictions, references)
        want = _ref_squad(predictions, references)
        assert got.keys() == want.keys(), (references, predictions)
        for key in want:
            assert got[key] == pytest.approx(want[key], abs=1e-9), (key, references, predictions)


def test_squad_normalization_drops_case_punctuation_and_articles():
    for s in ["The Cat!", "  the   cat ", "An anthem, a theory.", "U.S.", "élan—'s", "Theatre the"]:
        assert scores.normalize_answer(s) == _ref_normalize_answer(s)
    assert scores.normalize_answer("The Cat!") == "cat"
    assert scores.normalize_answer("An anthem, a theory.") == "anthem theory"  # articles as words only


def test_squad_hand_cases(no_warnings):
    references = {
        "q1": ["The Eiffel Tower", "Eiffel tower."],  # exact after normalisation
        "q2": ["Denver Broncos"],  # partial overlap
        "q3": [""],  # unanswerable, answered ""
        "q4": [""],  # unanswerable, answered anyway
        "q5": ["Santa Clara"],
    }  # no prediction
    predictions = {"q1": "eiffel Tower", "q2": "the Broncos won", "q3": "", "q4": "Paris"}
    got = scores.squad_scores(predictions, references)
    # q2: 1 common token of 2 predicted ("broncos won") and 2 gold: P = R = F1 = 1/2.
    assert got["exact_match"] == pytest.approx(100.0 * 2 / 5)
    assert got["f1"] == pytest.approx(100.0 * (1 + 0.5 + 1) / 5)
    assert got["missing"] == 1 and got["total"] == 5
    assert got["HasAns_exact"] == pytest.approx(100.0 / 3) and got["HasAns_total"] == 3
    assert got["HasAns_f1"] == pytest.approx(100.0 * 1.5 / 3)
    assert got["NoAns_exact"] == 50.0 and got["NoAns_f1"] == 50.0 and got["NoAns_total"] == 2
    assert got == pytest.approx(_ref_squad(predictions, references))


def test_squad_v1_data_has_no_breakdown_and_gold_of_only_articles_means_no_answer():
    got = scores.squad_scores({"q": "a cat"}, {"q": ["the cat"]})
    assert got == {"exact_match": 100.0, "f1": 100.0, "total": 1, "missing": 0}
    # A gold answer that normalises to nothing is dropped (v2.0's filter); only "" matches then.
    assert scores.squad_scores({"q": ""}, {"q": ["The", "the."]})["exact_match"] == 100.0


def test_squad_bad_inputs_say_what_to_do():
    with pytest.raises(ValueError, match="no reference"):
        scores.squad_scores({}, {})
    with pytest.raises(ValueError, match="list of gold answers"):
        scores.squad_scores({"q": "cat"}, {"q": "cat"})


# --- Sweeps ------------------------------------------------------------------------------------------


def test_summary_of_a_sweep(no_warnings):
    values = [84.1, 85.3, 83.9, 86.0]
    got = scores.summary(values)
    assert got["mean"] == pytest.approx(np.mean(values))
    assert got["std"] == pytest.approx(np.std(values, ddof=1))
    assert (got["min"], got["max"], got["n"]) == (83.9, 86.0, 4)
    assert scores.summary([0.7]) == {"mean": 0.7, "std": 0.0, "min": 0.7, "max": 0.7, "n": 1}
    with pytest.raises(ValueError, match="at least one run"):
        scores.summary([])
