"""SQuAD v1.1 / v2.0 for fine-tuning: the reader, strided windows over long contexts, and best spans back to text.

As google-research/bert's run_squad.py: the context split on whitespace with char_to_word_offset, each
word tokenized, [CLS] question [SEP] window [SEP] rows `doc_stride` tokens apart, max-context scoring,
_improve_answer_span; answers are cut from the original context by character offsets, never detokenised.
Bad offsets in training files are skipped and counted; malformed JSON names the file and the JSON path.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import logging
import unicodedata
from collections.abc import Sequence
from typing import Any, Optional, Union

import numpy as np

from bertjax.data.corpus.sources import expand_patterns
from bertjax.finetuning.readers import Arrays, Source, pad_to, pieces_of, read_text
from bertjax.data.vocab.tokenization import SENTENCEPIECE_SPACE, UNK, WORDPIECE_PREFIX, Tokenizer

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class QAExample:
    """One SQuAD question; `answers` are (text, answer_start char offset in context), empty when impossible."""

    qid: str
    question: str
    context: str
    answers: list[tuple[str, int]]
    is_impossible: bool
    source: Source


def _field(
    obj: Any, key: str, kind: Union[type, tuple[type, ...]], path: str, file: str, default: Any = dataclasses.MISSING
) -> Any:
    """obj[key] checked for type; the error names the file and the JSON path (data[3].paragraphs[0].qas[2].id)."""
    where = f"{path}.{key}" if path else key
    if not isinstance(obj, dict):
        raise ValueError(
            f"{file}: {path or 'the top level'} is a JSON {type(obj).__name__}, not an object; follow "
            'the SQuAD format {"data": [{"paragraphs": [{"context", "qas": [...]}]}]}.'
        )
    if key not in obj:
        if default is not dataclasses.MISSING:
            return default
        raise ValueError(f"{file}: {where} is missing; add it (SQuAD v1.1/v2.0 format).")
    value = obj[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, (str, int))):
        names = "/".join(t.__name__ for t in (kind if isinstance(kind, tuple) else (kind,)))
        raise ValueError(f"{file}: {where} is {value!r:.60}, not a {names}; fix that value.")
    return value


def read_squad(
    pattern: str, require_answers: bool = True, what: str = "data file"
) -> tuple[list[QAExample], dict[str, int]]:
    """SQuAD v1.1 / v2.0 JSON → examples and stats {"examples", "skipped_bad_offsets", "impossible"}.

    `require_answers=True` reads training data: every possible question needs an answer, and one whose first answer
    does not sit at its answer_start (context[start:start+len(text)] != text) is skipped and counted, as
    google-research/bert skips what it cannot find. False reads eval/prediction data: answers are optional and kept
    as given (their texts are what scoring uses).
    """
    examples: list[QAExample] = []
    stats = {"examples": 0, "skipped_bad_offsets": 0, "impossible": 0}
    seen: dict[str, Source] = {}
    bad: list[str] = []
    for path in expand_patterns(pattern, what=what):
        try:
            root = json.loads(read_text(path))
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{path}:{e.lineno}: invalid JSON ({e.msg} at column {e.colno}); pass a SQuAD .json file."
            ) from None
        for i, article in enumerate(_field(root, "data", list, "", path)):
            for j, paragraph in enumerate(_field(article, "paragraphs", list, f"data[{i}]", path)):
                at = f"data[{i}].paragraphs[{j}]"
                context = _field(paragraph, "context", str, at, path)
                for k, qa in enumerate(_field(paragraph, "qas", list, at, path)):
                    qpath = f"{at}.qas[{k}]"
                    source = Source(path, 0, qpath)
                    qid = str(_field(qa, "id", (str, int), qpath, path))
                    question = _field(qa, "question", str, qpath, path)
                    impossible = _field(qa, "is_impossible", bool, qpath, path, default=False)
                    answers = []
                    for n, answer in enumerate(_field(qa, "answers", list, qpath, path, default=[])):
                        apath = f"{qpath}.answers[{n}]"
                        answers.append(
                            (_field(answer, "text", str, apath, path), _field(answer, "answer_start", int, apath, path))
                        )
                    if qid in seen:
                        raise ValueError(
                            f"{path}: {qpath}.id {qid!r} was used before ({seen[qid]}); give every question its own id."
                        )
                    seen[qid] = source
                    if require_answers and not impossible:
                        if not answers:
                            raise ValueError(
                                f"{path}: {qpath}.answers is empty but is_impossible is not true; "
                                "training needs an answer (or is_impossible: true for SQuAD v2.0)."
                            )
                        text, start = answers[0]
                        if not text or start < 0 or context[start : start + len(text)] != text:
                            stats["skipped_bad_offsets"] += 1
                            bad.append(f"{qpath} ({text!r:.40} at {start})")
                            continue
                    stats["impossible"] += impossible
                    examples.append(QAExample(qid, question, context, answers, impossible, source))
    stats["examples"] = len(examples)
    if bad:
        log.warning(
            "read_squad: skipped %d question(s) whose answer text is not at its answer_start in %s, e.g. %s",
            len(bad),
            pattern,
            "; ".join(bad[:3]),
        )
    if not examples:
        raise ValueError(f"{what} {pattern!r} holds no usable questions ({stats}); check it is SQuAD JSON.")
    return examples, stats


@dataclasses.dataclass(frozen=True)
class QAFeature:
    """One window of one example: maps its tokens back to char spans of the ORIGINAL context for answers.

    token_to_char[t] is (start, end) in the context ((-1, -1) for [CLS], question and [SEP] tokens);
    token_is_max_context[t] says this window gives token t its most context (only there may an answer start).
    """

    example_index: int
    token_to_char: tuple[tuple[int, int], ...]
    token_is_max_context: tuple[bool, ...]


_SQUAD_WHITESPACE = frozenset(" \t\r\n\u202f")  # run_squad.py's is_whitespace


def _context_words(context: str) -> tuple[list[str], list[int], list[int]]:
    """run_squad.py's doc_tokens and char_to_word_offset, plus each word's first char."""
    words: list[str] = []
    starts: list[int] = []
    char_to_word: list[int] = []
    prev_is_space = True
    for i, c in enumerate(context):
        if c in _SQUAD_WHITESPACE:
            prev_is_space = True
        else:
            if prev_is_space:
                words.append(c)
                starts.append(i)
            else:
                words[-1] += c
            prev_is_space = False
        char_to_word.append(len(words) - 1)
    return words, starts, char_to_word


class _Aligner:
    """Char span in the original text of each piece of a word, so answers keep the context's case and punctuation.

    Pieces are spelled back (## / ▁ removed) and found in the word folded as the tokenizer folds it (controls and
    spaces dropped; lower-cased, and for WordPiece accents stripped, when it lower-cases; NFKC for SentencePiece).
    [UNK] covers the chars up to the next piece found. A piece that cannot be found (or spells nothing, as a lone ▁)
    gets the whole word's span: an answer starting or ending there is a little long, never cut.
    """

    def __init__(self, tokenizer: Tokenizer):
        from bertjax.data.vocab.tokenization import SentencePieceTokenizer

        self.lower = tokenizer.do_lower_case
        self.nfkc = isinstance(tokenizer, SentencePieceTokenizer)
        self.is_continuation = tokenizer.is_continuation_token
        self.fold = functools.lru_cache(maxsize=65536)(self._fold)

    def _fold(self, c: str) -> str:
        cat = unicodedata.category(c)
        if cat[0] in "CZ" or c == "\ufffd":
            return ""
        if self.nfkc:  # SentencePiece: lower-cased in Python, then NFKC inside the engine; accents stay
            return unicodedata.normalize("NFKC", c.lower() if self.lower else c).replace("ς", "σ")
        if self.lower:  # BERT's BasicTokenizer: lower-case, NFD, drop accents
            c = "".join(x for x in unicodedata.normalize("NFD", c.lower()) if unicodedata.category(x) != "Mn")
        return c.replace("ς", "σ")

    def spell(self, piece: str) -> str:
        if piece.startswith(WORDPIECE_PREFIX) and self.is_continuation(piece):
            piece = piece[len(WORDPIECE_PREFIX) :]
        elif piece.startswith(SENTENCEPIECE_SPACE):
            piece = piece[len(SENTENCEPIECE_SPACE) :]
        return piece.replace("ς", "σ")

    def spans(self, word: str, start: int, pieces: list[str]) -> list[tuple[int, int]]:
        chars = [(f, start + k) for k, c in enumerate(word) for f in self.fold(c)]
        text = "".join(f for f, _ in chars)
        spelled = [None if p == UNK else self.spell(p) for p in pieces]
        out, p = [], 0
        for j, s in enumerate(spelled):
            if s is None:  # [UNK]: at least one char, up to where the next spelled piece is found
                nxt = next((t for t in spelled[j + 1 :] if t), None)
                b, e = p, (text.find(nxt, p + 1) if nxt else -1)
                e = len(text) if e < 0 else e
            else:
                b = text.find(s, p) if s else -1
                e = b + len(s)
            if b < 0 or b >= e or e > len(text):
                out.append((start, start + len(word)))
                continue
            out.append((chars[b][1], chars[e - 1][1] + 1))
            p = e
        return out


def _improve_answer_span(
    doc_tokens: list[str], start: int, end: int, tokenizer: Tokenizer, answer_text: str
) -> tuple[int, int]:
    """run_squad.py: the tightest token span equal to the tokenized answer (e.g. "1895" inside "(1895-1943).")."""
    target = " ".join(tokenizer.tokenize(answer_text))
    for new_start in range(start, end + 1):
        for new_end in range(end, new_start - 1, -1):
            if " ".join(doc_tokens[new_start : new_end + 1]) == target:
                return new_start, new_end
    return start, end


def _check_is_max_context(windows: list[tuple[int, int]], current: int, position: int) -> bool:
    """run_squad.py: a token belongs to the window where min(left, right) context (+ 0.01 * length) is largest."""
    best_score, best = None, None
    for index, (start, length) in enumerate(windows):
        end = start + length - 1
        if start <= position <= end:
            score = min(position - start, end - position) + 0.01 * length
            if best_score is None or score > best_score:
                best_score, best = score, index
    return best == current


def qa_features(
    examples: Sequence[QAExample],
    tokenizer: Tokenizer,
    max_seq_length: int,
    doc_stride: int = 128,
    max_query_length: int = 64,
    training: bool = False,
) -> tuple[Arrays, list[QAFeature]]:
    """run_squad.py's convert_examples_to_features: [CLS] question [SEP] window [SEP], windows `doc_stride` apart.

    Arrays: input_ids, input_mask, segment_ids int32 [F, max_seq_length]; with `training`, start_positions and
    end_positions int32 [F] (0 = [CLS] when the answer is not inside the window or the question is impossible).
    Every example yields at least one window, so every question gets a prediction.
    """
    frame = tokenizer.frame()  # [CLS] question [SEP] window [SEP], or the tokenizer's own template
    if max_seq_length <= max_query_length + frame.pair_specials:
        raise ValueError(
            f"max_seq_length={max_seq_length} leaves no room for the context after a question of up to "
            f"max_query_length={max_query_length} tokens; raise max_seq_length or lower "
            "max_query_length."
        )
    if doc_stride < 1:
        raise ValueError(f"doc_stride={doc_stride} must be at least 1 (google-research/bert uses 128).")
    aligner = _Aligner(tokenizer)
    rows: dict[str, list[Any]] = {
        k: [] for k in ("input_ids", "input_mask", "segment_ids", "start_positions", "end_positions")
    }
    features: list[QAFeature] = []
    queries_cut = 0
    context: Optional[str] = None
    questions = pieces_of(tokenizer, [ex.question for ex in examples])
    for example_index, (ex, query) in enumerate(zip(examples, questions)):
        if len(query) > max_query_length:
            query, queries_cut = query[:max_query_length], queries_cut + 1
        if ex.context != context:  # a paragraph's questions come together: tokenize its context once
            context = ex.context
            words, word_starts, char_to_word = _context_words(context)
            doc_tokens: list[str] = []
            doc_chars: list[tuple[int, int]] = []
            word_to_tok: list[int] = []
            for word, start, pieces in zip(words, word_starts, pieces_of(tokenizer, words)):
                word_to_tok.append(len(doc_tokens))
                doc_tokens += pieces
                doc_chars += aligner.spans(word, start, pieces)
        tok_start = tok_end = -1
        if training and not ex.is_impossible:
            if not ex.answers:
                raise ValueError(
                    f"{ex.source}: no answer for a possible question; training needs one (or is_impossible: true)."
                )
            text, char_start = ex.answers[0]
            if not text or char_start < 0 or char_start + len(text) > len(ex.context):
                raise ValueError(
                    f"{ex.source}: answer {text!r:.40} at {char_start} lies outside the context; read "
                    "training data with read_squad(require_answers=True), which skips such answers."
                )
            first = max(char_to_word[char_start], 0)
            last = char_to_word[char_start + len(text) - 1]
            tok_start = word_to_tok[first] if first < len(words) else len(doc_tokens)
            tok_end = word_to_tok[last + 1] - 1 if last < len(words) - 1 else len(doc_tokens) - 1
            tok_start, tok_end = _improve_answer_span(doc_tokens, tok_start, tok_end, tokenizer, text)
        max_doc = max_seq_length - len(query) - frame.pair_specials
        windows: list[tuple[int, int]] = []
        offset = 0
        while True:  # at least one window, even for an empty context
            length = min(len(doc_tokens) - offset, max_doc)
            windows.append((offset, length))
            if offset + length >= len(doc_tokens):
                break
            offset += min(length, doc_stride)
        head = len(frame.before) + len(query) + len(frame.between)  # where the window starts
        tail = len(frame.end)
        query_ids = tokenizer.convert_tokens_to_ids(query)
        for index, (start, length) in enumerate(windows):
            ids, segments = frame.pair(query_ids, tokenizer.convert_tokens_to_ids(doc_tokens[start : start + length]))
            rows["input_ids"].append(pad_to(ids, max_seq_length, frame.pad_id))
            rows["input_mask"].append(pad_to([1] * len(ids), max_seq_length, 0))
            rows["segment_ids"].append(pad_to(segments, max_seq_length, 0))
            features.append(
                QAFeature(
                    example_index,
                    tuple([(-1, -1)] * head + doc_chars[start : start + length] + [(-1, -1)] * tail),
                    tuple(
                        [False] * head
                        + [_check_is_max_context(windows, index, start + i) for i in range(length)]
                        + [False] * tail
                    ),
                )
            )
            inside = start <= tok_start and tok_end <= start + length - 1 and tok_start <= tok_end
            rows["start_positions"].append(tok_start - start + head if inside else 0)
            rows["end_positions"].append(tok_end - start + head if inside else 0)
    shape = (len(features), max_seq_length)
    arrays = {k: np.array(rows[k], np.int32).reshape(shape) for k in ("input_ids", "input_mask", "segment_ids")}
    if training:
        arrays.update({k: np.array(rows[k], np.int32) for k in ("start_positions", "end_positions")})
    if queries_cut:
        log.info(
            "qa_features: %d of %d questions cut to max_query_length=%d tokens",
            queries_cut,
            len(examples),
            max_query_length,
        )
    return arrays, features


def _best_indexes(logits: np.ndarray, allowed: np.ndarray, n_best_size: int) -> np.ndarray:
    """The n_best_size highest-scoring allowed positions (ties to the earlier, as run_squad.py's sort)."""
    positions = np.flatnonzero(allowed)
    return positions[np.argsort(-logits[positions], kind="stable")[:n_best_size]]


def qa_predictions(
    examples: Sequence[QAExample],
    features: Sequence[QAFeature],
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    n_best_size: int = 20,
    max_answer_length: int = 30,
    version_2: bool = False,
    null_score_diff_threshold: float = 0.0,
) -> dict[str, str]:
    """qid → answer text cut from the original context, as run_squad.py's write_predictions picks it.

    The best span over all windows of an example by start + end logit (start in a max-context token, start <= end,
    at most max_answer_length tokens, both in the context). SQuAD v2.0: "" when the [CLS] null score (lowest over the
    windows) exceeds the best span's score by more than null_score_diff_threshold. No valid span also gives "".
    """
    start_logits, end_logits = np.asarray(start_logits, np.float64), np.asarray(end_logits, np.float64)
    if start_logits.shape != end_logits.shape or start_logits.ndim != 2 or start_logits.shape[0] != len(features):
        raise ValueError(
            f"start_logits {start_logits.shape} and end_logits {end_logits.shape} must both be "
            f"[{len(features)} features, max_seq_length]; pass the logits of every feature in order."
        )
    by_example: dict[int, list[int]] = {}
    for f_index, feature in enumerate(features):
        by_example.setdefault(feature.example_index, []).append(f_index)
    predictions: dict[str, str] = {}
    for e_index, ex in enumerate(examples):
        best_score, best_text, null_score = -math.inf, "", math.inf
        for f_index in by_example.get(e_index, []):
            feature, s_logits, e_logits = features[f_index], start_logits[f_index], end_logits[f_index]
            n = min(len(feature.token_to_char), s_logits.shape[0])
            null_score = min(null_score, s_logits[0] + e_logits[0])
            chars = np.asarray(feature.token_to_char, np.int64).reshape(-1, 2)[:n]
            in_context = chars[:, 0] >= 0
            starts = _best_indexes(
                s_logits[:n], in_context & np.asarray(feature.token_is_max_context[:n], bool), n_best_size
            )
            ends = _best_indexes(e_logits[:n], in_context, n_best_size)
            # run_squad.py's double loop over (start, end) candidates, as one masked matrix; row-major argmax keeps
            # its order among equal scores.
            length = ends[None, :] - starts[:, None] + 1
            scores = np.where(
                (length >= 1) & (length <= max_answer_length),
                s_logits[starts][:, None] + e_logits[ends][None, :],
                -np.inf,
            )
            if not scores.size:
                continue
            i, j = np.unravel_index(np.argmax(scores), scores.shape)
            text = ex.context[chars[starts[i], 0] : chars[ends[j], 1]]
            if scores[i, j] > best_score and text:
                best_score, best_text = float(scores[i, j]), text
        if version_2 and null_score - best_score > null_score_diff_threshold:
            best_text = ""
        predictions[ex.qid] = best_text
    return predictions
