"""SQuAD fine-tuning data (bertjax.finetuning.squad): the reader (bad offsets skipped and counted, errors naming
the JSON path), strided windows against google-research/bert's run_squad.py rules, answers cut back from the
original text. Files written here with test_tasks.py's small vocab; no JAX compile, no download."""

import json
import unicodedata

import numpy as np
import pytest

from bertjax.data.vocab import training as vocab_training
from bertjax.finetuning import squad
from bertjax.finetuning.readers import Source
from bertjax.finetuning.squad import QAExample
from test_tasks import tok, vocab_file, write  # noqa: F401  (fixtures and the file helper)


# 44 context tokens: filler x25 (0-24), denver broncos , won ( super bowl 50 ) when (25-34), un ##aff ##able cafe
# (35-38), play ##ed the cat . (39-43).
LEAD = " ".join(["filler"] * 25)
CONTEXT = f"{LEAD} Denver Broncos, won (Super Bowl 50) when Unaffable Café played the cat."
QUESTION = "Who won Super Bowl?"  # 5 tokens
HEAD = 7  # [CLS] who won super bowl ? [SEP]


def squad_file(tmp_path, qas, context=CONTEXT, name="train.json"):
    data = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]}
    return write(tmp_path / name, json.dumps(data))


def test_read_squad_skips_and_counts_bad_offsets(tmp_path):
    start = CONTEXT.index("Denver")
    path = squad_file(
        tmp_path,
        [
            {"id": "q1", "question": QUESTION, "answers": [{"text": "Denver Broncos", "answer_start": start}]},
            {"id": "q2", "question": QUESTION, "answers": [{"text": "Denver Broncos", "answer_start": start + 3}]},
            {"id": "q3", "question": "?", "answers": [], "is_impossible": True},
        ],
    )
    examples, stats = squad.read_squad(path)
    assert [e.qid for e in examples] == ["q1", "q3"]
    assert stats == {"examples": 2, "skipped_bad_offsets": 1, "impossible": 1}
    assert examples[0].answers == [("Denver Broncos", start)] and examples[1].is_impossible
    assert str(examples[0].source) == f"{path} at data[0].paragraphs[0].qas[0]"
    examples, stats = squad.read_squad(path, require_answers=False)  # eval: kept, only texts matter
    assert [e.qid for e in examples] == ["q1", "q2", "q3"] and stats["skipped_bad_offsets"] == 0


@pytest.mark.parametrize(
    "qas, message",
    [
        ([{"question": "?", "answers": []}], r"train\.json: data\[0\]\.paragraphs\[0\]\.qas\[0\]\.id is missing"),
        (
            [{"id": "a", "question": "?", "answers": [{"text": "x", "answer_start": "3"}]}],
            r"qas\[0\]\.answers\[0\]\.answer_start is '3', not a int",
        ),
        ([{"id": "a", "question": "?", "answers": []}], r"qas\[0\]\.answers is empty but is_impossible is not true"),
        (
            [{"id": "a", "question": "?", "is_impossible": True}, {"id": "a", "question": "?", "is_impossible": True}],
            r"qas\[1\]\.id 'a' was used before",
        ),
    ],
)
def test_read_squad_errors_name_json_path(tmp_path, qas, message):
    with pytest.raises(ValueError, match=message):
        squad.read_squad(squad_file(tmp_path, qas))


def test_read_squad_invalid_json(tmp_path):
    with pytest.raises(ValueError, match=r"bad\.json:2: invalid JSON"):
        squad.read_squad(write(tmp_path / "bad.json", '{"data": [\n}'))
    with pytest.raises(ValueError, match=r"list\.json: data is missing"):
        squad.read_squad(write(tmp_path / "list.json", '{"version": 1}'))


def qa_example(answer="Denver Broncos", offset=None, impossible=False, qid="q1"):
    start = CONTEXT.index(answer) if offset is None else offset
    return QAExample(qid, QUESTION, CONTEXT, [] if impossible else [(answer, start)], impossible, Source("t.json"))


def test_qa_features_strided_windows_find_the_answer(tok):
    # max_doc = 24 - 5 - 3 = 16 tokens per window, stride 8: windows start at 0, 8, 16, 24, 32 over 44 tokens.
    arrays, features = squad.qa_features([qa_example()], tok, 24, doc_stride=8, max_query_length=16, training=True)
    assert len(features) == 5 and arrays["input_ids"].shape == (5, 24)
    assert arrays["start_positions"].tolist() == [0, 0, 25 - 16 + HEAD, 25 - 24 + HEAD, 0]
    assert arrays["end_positions"].tolist() == [0, 0, 26 - 16 + HEAD, 26 - 24 + HEAD, 0]
    window2 = tok.convert_ids_to_tokens(arrays["input_ids"][2])
    assert window2[:HEAD] == ["[CLS]", "who", "won", "super", "bowl", "?", "[SEP]"]
    assert window2[16:19] == ["denver", "broncos", ","] and window2[-1] == "[SEP]"
    assert arrays["segment_ids"][2].tolist() == [0] * HEAD + [1] * 17 and arrays["input_mask"][:4].all()
    last = tok.convert_ids_to_tokens(arrays["input_ids"][4][arrays["input_mask"][4] == 1])
    assert last[HEAD:] == [
        "50",
        ")",
        "when",
        "un",
        "##aff",
        "##able",
        "cafe",
        "play",
        "##ed",
        "the",
        "cat",
        ".",
        "[SEP]",
    ]
    assert arrays["segment_ids"][4].tolist() == [0] * HEAD + [1] * 13 + [0] * 4
    # Token 25 has most context in window 2 (min(9, 6)) rather than window 3 (min(1, 14)).
    assert features[2].token_is_max_context[HEAD + 9] and not features[3].token_is_max_context[HEAD + 1]
    # Char spans point into the original context, word pieces and accents included.
    spans = features[3].token_to_char
    assert [CONTEXT[b:e] for b, e in spans[HEAD + 1 : HEAD + 5]] == ["Denver", "Broncos", ",", "won"]
    assert [CONTEXT[b:e] for b, e in spans[HEAD + 11 : HEAD + 16]] == ["Un", "aff", "able", "Café", "play"]
    assert spans[:HEAD] == ((-1, -1),) * HEAD and spans[-1] == (-1, -1) and len(spans) == 24
    impossible, _ = squad.qa_features(
        [qa_example(impossible=True)], tok, 24, doc_stride=8, max_query_length=16, training=True
    )
    assert not impossible["start_positions"].any() and not impossible["end_positions"].any()
    predict, _ = squad.qa_features([qa_example()], tok, 24, doc_stride=8, max_query_length=16)
    assert "start_positions" not in predict


def test_improve_answer_span_finds_the_tight_span(tok):
    # "(Super Bowl 50)": the whitespace words "(Super" and "50)" hold the answer among punctuation.
    arrays, features = squad.qa_features([qa_example("Super Bowl 50")], tok, 96, training=True)
    tokens = tok.convert_ids_to_tokens(arrays["input_ids"][0])
    s, e = int(arrays["start_positions"][0]), int(arrays["end_positions"][0])
    assert tokens[s : e + 1] == ["super", "bowl", "50"]
    spans = features[0].token_to_char
    assert CONTEXT[spans[s][0] : spans[e][1]] == "Super Bowl 50"


def test_qa_predictions_recover_original_text(tok):
    examples = [qa_example(), qa_example(qid="q2", impossible=True)]
    arrays, features = squad.qa_features(examples, tok, 24, doc_stride=8, max_query_length=16)
    assert [f.example_index for f in features] == [0] * 5 + [1] * 5
    start, end = np.zeros((10, 24)), np.zeros((10, 24))
    start[2, HEAD + 9], end[2, HEAD + 10] = 5.0, 5.0  # window 2: "Denver Broncos" (max context for token 25)
    start[3, HEAD + 1], end[3, HEAD + 2] = 9.0, 9.0  # window 3: the same start, not max context there
    start[3, 0] = end[3, 0] = -1.0
    start[1, 2], end[1, 3] = 20.0, 20.0  # a span in the question is never an answer
    start[1, 23], end[1, 23] = 30.0, 30.0  # nor the final [SEP]
    start[8, HEAD + 11], end[8, HEAD + 14] = 3.0, 3.0  # q2, window 3: "Unaffable Café"
    predictions = squad.qa_predictions(examples, features, start, end)
    assert predictions == {"q1": "Denver Broncos", "q2": "Unaffable Café"}
    # The comma is its own token: a span ending on it keeps the context's own text.
    end[2, HEAD + 11] = 6.0
    assert squad.qa_predictions(examples, features, start, end)["q1"] == "Denver Broncos,"
    assert squad.qa_predictions(examples, features, start, end, max_answer_length=2)["q1"] == "Denver Broncos"
    # SQuAD v2.0: q2's null score (min over its windows of start[0] + end[0] = 8) beats its best span (6).
    start[5:, 0] = end[5:, 0] = 4.0
    v2 = squad.qa_predictions(examples, features, start, end, version_2=True)
    assert v2 == {"q1": "Denver Broncos,", "q2": ""}
    assert (
        squad.qa_predictions(examples, features, start, end, version_2=True, null_score_diff_threshold=3.0)["q2"]
        == "Unaffable Café"
    )
    with pytest.raises(ValueError, match=r"must both be \[10 features, max_seq_length\]"):
        squad.qa_predictions(examples, features, start[:3], end[:3])


def test_qa_features_bad_lengths_and_empty_context(tok):
    with pytest.raises(ValueError, match="max_seq_length=64 leaves no room .* max_query_length=64"):
        squad.qa_features([qa_example()], tok, 64)
    with pytest.raises(ValueError, match="outside the context"):
        squad.qa_features([qa_example(offset=len(CONTEXT))], tok, 96, training=True)
    empty = QAExample("e", "who", "", [], True, Source("t.json"))
    arrays, features = squad.qa_features([empty], tok, 16, max_query_length=8, training=True)
    assert len(features) == 1 and int(arrays["input_mask"][0].sum()) == 4  # [CLS] who [SEP] [SEP]
    assert squad.qa_predictions([empty], features, np.zeros((1, 16)), np.zeros((1, 16))) == {"e": ""}


def test_char_spans_with_sentencepiece(tmp_path):
    texts = [
        "The Denver Broncos won Super Bowl 50, beating the Carolina Panthers.",
        "Unaffable cafés played the cat game (Super Bowl).",
    ] * 100
    sp = vocab_training.train_sentencepiece(texts, 46, tmp_path, do_lower_case=True)
    context = "Who? The Denver Broncos, won (Super Bowl 50) at Café Ünaffable ｆｕｌｌ."
    example = QAExample("q", "who won?", context, [("Denver Broncos", context.index("Denver"))], False, Source("x"))
    arrays, features = squad.qa_features([example], sp, 96, max_query_length=8, training=True)
    pieces = sp.convert_ids_to_tokens(arrays["input_ids"][0])
    checked = 0
    for piece, (b, e) in zip(pieces, features[0].token_to_char):
        spelled = piece.lstrip("\u2581")
        if b >= 0 and spelled and piece != "[UNK]":  # each spelled piece maps onto exactly its original chars
            assert unicodedata.normalize("NFKC", context[b:e].lower()) == spelled, (piece, context[b:e])
            checked += 1
    assert checked > 30
    s, e = int(arrays["start_positions"][0]), int(arrays["end_positions"][0])
    start, end = np.zeros((1, 96)), np.zeros((1, 96))
    start[0, s], end[0, e] = 1.0, 1.0
    assert squad.qa_predictions([example], features, start, end) == {"q": "Denver Broncos"}
