"""Documents → sentence pairs → masked instances, as google-research/bert's create_pretraining_data.py.

Same semantics as the original: a target length (shortened with probability short_seq_prob), segment A
from contiguous sentences, B the true continuation or (50%, or always when the chunk has one sentence)
a span from another document, pair truncation from a random end, and 15% masking — 80% [MASK], 10%
random token, 10% kept — capped at max_predictions_per_seq. Two deliberate differences:

- Whole-word masking decides [MASK] / random / keep once per word, not once per piece (the original
  can leave "##ing" visible beside a masked "runn"), and never joins pieces across [SEP].
- The random draws are made in bulk with numpy (same distributions, different streams), so results
  match the original statistically, not instance for instance.

Why it is fast: a block of documents is one flat token array, so every A or B segment is a slice
(start, end) of it; only the pairing walk is a Python loop over sentence lengths. Assembly, masking
and the 80/10/10 replacement run vectorised over all instances of the block at once.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Optional

import numpy as np


@dataclasses.dataclass(frozen=True)
class InstanceConfig:
    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 10
    do_whole_word_mask: bool = False
    next_sentence_prediction: bool = True  # False: one segment per instance, labels all 0 (MLM only)

    def validate(self, prefix: str = "--") -> None:
        """`prefix` names the settings as the caller's user wrote them: prepare's flags (--max_seq_length) or a
        job's config fields (config.data.max_seq_length)."""
        n = {name: f"{prefix}{name}" for name in ("max_seq_length", "max_predictions_per_seq", "masked_lm_prob")}
        n.update({name: f"{prefix}{name}" for name in ("short_seq_prob", "dupe_factor")})
        if self.max_seq_length < 5:
            raise ValueError(
                f"{n['max_seq_length']}={self.max_seq_length} leaves no room for [CLS], two segments and their "
                "[SEP]s; use ≥ 5 (BERT's 128 or 512)."
            )
        if self.max_predictions_per_seq < 1:
            raise ValueError(f"{n['max_predictions_per_seq']}={self.max_predictions_per_seq} must be ≥ 1.")
        if self.max_predictions_per_seq > self.max_seq_length:
            raise ValueError(
                f"{n['max_predictions_per_seq']}={self.max_predictions_per_seq} is larger than "
                f"{n['max_seq_length']}={self.max_seq_length}; a sequence cannot hold that many masks."
            )
        if not 0.0 < self.masked_lm_prob < 1.0:
            raise ValueError(f"{n['masked_lm_prob']}={self.masked_lm_prob} must be in (0, 1).")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ValueError(f"{n['short_seq_prob']}={self.short_seq_prob} must be in [0, 1].")
        if self.dupe_factor < 1:
            raise ValueError(f"{n['dupe_factor']}={self.dupe_factor} must be ≥ 1.")

    def capped_from(self) -> Optional[int]:
        """The shortest sequence length whose masks max_predictions_per_seq cuts below masked_lm_prob (each
        sequence gets round(length · masked_lm_prob) of them, as google-research/bert counts), or None."""
        for length in range(1, self.max_seq_length + 1):
            if round(length * self.masked_lm_prob) > self.max_predictions_per_seq:
                return length
        return None

    def cap_warning(self, prefix: str = "--") -> Optional[str]:
        """One sentence when max_predictions_per_seq lowers the masking rate of longer sequences."""
        length = self.capped_from()
        if length is None:
            return None
        need = round(self.max_seq_length * self.masked_lm_prob)
        return (
            f"{prefix}max_predictions_per_seq={self.max_predictions_per_seq} masks fewer than "
            f"{prefix}masked_lm_prob={self.masked_lm_prob:g} of every sequence of {length} tokens or more "
            f"(a full {self.max_seq_length}-token one would get {need}); set it to {need} to mask that share "
            "of every sequence"
        )


@dataclasses.dataclass(frozen=True, eq=False)
class Vocab:
    """What masking needs from the tokenizer."""

    size: int
    pad_id: int
    cls_id: int
    sep_id: int
    mask_id: int
    is_continuation: np.ndarray  # [size] bool: a piece that continues the previous word (##x, or no ▁)

    @classmethod
    def from_tokenizer(cls, tokenizer) -> "Vocab":
        """From a `tokenization.Tokenizer` (WordPiece or SentencePiece)."""
        return cls(
            size=tokenizer.vocab_size,
            pad_id=tokenizer.pad_id,
            cls_id=tokenizer.cls_id,
            sep_id=tokenizer.sep_id,
            mask_id=tokenizer.mask_id,
            is_continuation=tokenizer.continuation_mask(),
        )


@dataclasses.dataclass
class TokenizedBlock:
    """Documents as one flat token array. Sentence s is tokens[sentence_starts[s]:sentence_starts[s+1]];
    document d is sentences document_starts[d] .. document_starts[d+1]-1."""

    tokens: np.ndarray  # [tokens] int32
    sentence_starts: np.ndarray  # [sentences + 1] int64
    document_starts: np.ndarray  # [documents + 1] int64

    @property
    def num_documents(self) -> int:
        return len(self.document_starts) - 1


# --- Pairing: the original's walk over each document, on sentence lengths only ----------------------


def _randint(rng: random.Random, a: int, b: int) -> int:
    """Uniform in [a, b], as rng.randint but ~4× faster (one float draw; the walk is the hot loop)."""
    return a + int(rng.random() * (b - a + 1))


def _pairs_from_document(
    starts: list[int], doc_starts: list[int], d: int, cfg: InstanceConfig, rng: random.Random, out: list
) -> None:
    """Appends (a_start, a_end, b_start, b_end, is_random_next) token offsets for document d.

    `starts` are the block's sentence offsets and `doc_starts` its document offsets, as lists: the
    walk indexes them one element at a time, which is ~5× slower on numpy arrays."""
    first, last = doc_starts[d], doc_starts[d + 1]
    num_documents = len(doc_starts) - 1
    max_num_tokens = cfg.max_seq_length - 3
    target = max_num_tokens
    if rng.random() < cfg.short_seq_prob:
        target = _randint(rng, 2, max_num_tokens)
    chunk_start, i = first, first
    while i < last:
        if i == last - 1 or starts[i + 1] - starts[chunk_start] >= target:
            chunk_end = i + 1  # sentences [chunk_start, chunk_end)
            n = chunk_end - chunk_start
            a_end = chunk_start + (_randint(rng, 1, n - 1) if n >= 2 else 1)
            a0, a1 = starts[chunk_start], starts[a_end]
            if n == 1 or rng.random() < 0.5:
                target_b = target - (a1 - a0)
                for _ in range(10):
                    other = _randint(rng, 0, num_documents - 1)
                    if other != d:
                        break
                o_first, o_last = doc_starts[other], doc_starts[other + 1]
                j = _randint(rng, o_first, o_last - 1)
                b0 = starts[j]
                while j < o_last - 1 and starts[j + 1] - b0 < target_b:
                    j += 1
                out.append((a0, a1, b0, starts[j + 1], 1))
                i = a_end - 1  # the unused sentences of the chunk start the next one
            else:
                out.append((a0, a1, a1, starts[chunk_end], 0))
            chunk_start = i + 1
        i += 1


def _single_segments_from_document(
    starts: list[int], doc_starts: list[int], d: int, cfg: InstanceConfig, rng: random.Random, out: list
) -> None:
    """MLM-only: contiguous sentences up to the target length, one segment per instance."""
    first, last = doc_starts[d], doc_starts[d + 1]
    max_num_tokens = cfg.max_seq_length - 2
    target = _randint(rng, 2, max_num_tokens) if rng.random() < cfg.short_seq_prob else max_num_tokens
    chunk_start = first
    for i in range(first, last):
        if i == last - 1 or starts[i + 1] - starts[chunk_start] >= target:
            out.append((starts[chunk_start], starts[i + 1], 0, 0, 0))
            chunk_start = i + 1


def create_pairs(block: TokenizedBlock, cfg: InstanceConfig, rng: random.Random) -> np.ndarray:
    """[instances, 5] int64: a_start, a_end, b_start, b_end, is_random_next; dupe_factor passes."""
    walk = _pairs_from_document if cfg.next_sentence_prediction else _single_segments_from_document
    starts, doc_starts = block.sentence_starts.tolist(), block.document_starts.tolist()
    documents = [d for d in range(block.num_documents) if doc_starts[d + 1] > doc_starts[d]]
    out: list = []
    for _ in range(cfg.dupe_factor):
        for d in documents:
            walk(starts, doc_starts, d, cfg, rng, out)
    return np.asarray(out, np.int64).reshape(-1, 5)


def truncate_pairs(pairs: np.ndarray, max_num_tokens: int, rng: np.random.Generator) -> np.ndarray:
    """The original's truncate_seq_pair in closed form: trim the longer segment one token at a time
    (B on ties), each token from the front or the back with probability 1/2."""
    a0, a1, b0, b1 = (pairs[:, k] for k in range(4))
    la, lb = a1 - a0, b1 - b0
    excess = np.maximum(la + lb - max_num_tokens, 0)
    # First the longer segment down to the other's length; then B, A, B, A ... (ties trim B).
    first = np.minimum(excess, np.abs(la - lb))
    rest = excess - first
    cut_a = np.where(la > lb, first, 0) + rest // 2
    cut_b = excess - cut_a
    front_a = rng.binomial(cut_a, 0.5)
    front_b = rng.binomial(cut_b, 0.5)
    out = pairs.copy()
    out[:, 0], out[:, 1] = a0 + front_a, a1 - (cut_a - front_a)
    out[:, 2], out[:, 3] = b0 + front_b, b1 - (cut_b - front_b)
    return out


def assemble(block: TokenizedBlock, pairs: np.ndarray, cfg: InstanceConfig, vocab: Vocab) -> dict[str, np.ndarray]:
    """[CLS] A [SEP] B [SEP] (or [CLS] A [SEP]) padded to max_seq_length, vectorised over instances."""
    a0, a1, b0, b1 = (pairs[:, k, None] for k in range(4))
    la, lb = a1 - a0, b1 - b0
    pos = np.arange(cfg.max_seq_length)[None, :]
    has_b = lb > 0
    end = la + 1 + np.where(has_b, lb + 1, 0)  # index of the last [SEP]
    source = np.where(pos <= la, a0 + pos - 1, b0 + pos - la - 2)
    ids = block.tokens[np.clip(source, 0, len(block.tokens) - 1)]
    ids = np.where((pos == 0), vocab.cls_id, ids)
    ids = np.where((pos == la + 1) | (pos == end), vocab.sep_id, ids)
    mask = pos <= end
    ids = np.where(mask, ids, vocab.pad_id).astype(np.int32)
    segment = ((pos > la + 1) & mask).astype(np.int32)
    return dict(
        input_ids=ids,
        input_mask=mask.astype(np.int32),
        segment_ids=segment,
        next_sentence_labels=pairs[:, 4:5].astype(np.int32),
    )


def mask_tokens(
    input_ids: np.ndarray, input_mask: np.ndarray, cfg: InstanceConfig, vocab: Vocab, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Chooses up to max_predictions_per_seq positions per row (whole words when do_whole_word_mask)
    and replaces them 80% [MASK] / 10% random / 10% kept, one decision per word."""
    n, length = input_ids.shape
    cand = (input_mask > 0) & (input_ids != vocab.cls_id) & (input_ids != vocab.sep_id)
    if cfg.do_whole_word_mask:
        prev_cand = np.concatenate([np.zeros((n, 1), bool), cand[:, :-1]], axis=1)
        starts = cand & ~(vocab.is_continuation[input_ids] & prev_cand)
    else:
        starts = cand
    word = np.maximum(np.cumsum(starts, axis=1, dtype=np.int32) - 1, 0)  # word index (valid where cand)
    num_words = starts.sum(axis=1)
    width = max(int(num_words.max()) if n else 0, 1)
    flat_word = (np.arange(n, dtype=np.int64)[:, None] * width + word)[cand]
    word_len = np.bincount(flat_word, minlength=n * width).reshape(n, width)
    seq_len = input_mask.sum(axis=1)
    k = np.minimum(cfg.max_predictions_per_seq, np.maximum(1, np.rint(seq_len * cfg.masked_lm_prob))).astype(np.int64)

    # Visit words in a random order; take a word if it still fits (the original's greedy with skips).
    keys = rng.random((n, width))
    keys[np.arange(width)[None, :] >= num_words[:, None]] = 2.0
    order = np.argsort(keys, axis=1)
    chosen = np.zeros((n, width), bool)
    count = np.zeros(n, np.int64)
    all_rows = np.arange(n)
    for j in range(width):
        w = order[:, j]
        size = word_len[all_rows, w]
        take = (size > 0) & (count + size <= k)
        chosen[all_rows, w] = take
        count += size * take
        if np.all(count >= k):
            break
    selected = cand & np.take_along_axis(chosen, word, axis=1)

    # One 80/10/10 draw per word; a "random" word gets a random token at each of its pieces.
    fate = np.take_along_axis(rng.random((n, width), dtype=np.float32), word, axis=1)
    random_ids = rng.integers(0, vocab.size, (n, length), dtype=np.int32)
    masked = np.where(selected & (fate < 0.8), vocab.mask_id, input_ids)
    masked = np.where(selected & (fate >= 0.8) & (fate < 0.9), random_ids, masked).astype(np.int32)

    p = cfg.max_predictions_per_seq
    r, c = np.nonzero(selected)  # row-major: positions ascending within each row
    slot = (np.cumsum(selected, axis=1) - 1)[r, c]
    positions = np.zeros((n, p), np.int32)
    labels = np.zeros((n, p), np.int32)
    weights = np.zeros((n, p), np.float32)
    positions[r, slot], labels[r, slot], weights[r, slot] = c, input_ids[r, c], 1.0
    return dict(input_ids=masked, masked_lm_positions=positions, masked_lm_ids=labels, masked_lm_weights=weights)


def covered_tokens(pairs: np.ndarray, num_tokens: int) -> int:
    """Tokens of the block that are in at least one instance of their own document: A segments, and B
    segments that are the true next (a random next segment's tokens are counted where they belong)."""
    own_b = pairs[:, 4] == 0
    starts = np.concatenate([pairs[:, 0], pairs[own_b, 2]])
    ends = np.concatenate([pairs[:, 1], pairs[own_b, 3]])
    delta = np.zeros(num_tokens + 1, np.int64)
    np.add.at(delta, starts, 1)
    np.add.at(delta, ends, -1)
    return int((np.cumsum(delta[:-1]) > 0).sum())


def create_instances(
    block: TokenizedBlock,
    cfg: InstanceConfig,
    vocab: Vocab,
    seed: int,
    shuffle: bool = True,
    counts: Optional[dict] = None,
) -> dict[str, np.ndarray]:
    """All instances of a block (dupe_factor passes), masked and shuffled, as record-ready arrays.
    `counts["covered_tokens"]`, when given, grows by the block's tokens that some instance keeps."""
    rng = random.Random(seed)
    np_rng = np.random.default_rng(seed)
    pairs = create_pairs(block, cfg, rng)
    max_num_tokens = cfg.max_seq_length - (3 if cfg.next_sentence_prediction else 2)
    pairs = truncate_pairs(pairs, max_num_tokens, np_rng)
    if counts is not None:
        counts["covered_tokens"] = counts.get("covered_tokens", 0) + covered_tokens(pairs, len(block.tokens))
    if shuffle:
        pairs = pairs[np_rng.permutation(len(pairs))]
    parts = []
    for i in range(0, max(len(pairs), 1), _CHUNK):  # chunks that stay in cache: ~3× faster than one array
        arrays = assemble(block, pairs[i : i + _CHUNK], cfg, vocab)
        arrays.update(mask_tokens(arrays["input_ids"], arrays["input_mask"], cfg, vocab, np_rng))
        parts.append(arrays)
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


_CHUNK = 2048


def unmask(input_ids: np.ndarray, positions: np.ndarray, ids: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The original tokens of masked instances (for dynamic re-masking)."""
    out = input_ids.copy()
    r, c = np.nonzero(weights > 0)
    out[r, positions[r, c]] = ids[r, c]
    return out
