"""Learning vocabularies, reproducibly: a WordPiece vocab.txt (`train_wordpiece`) or a SentencePiece model
(`train_sentencepiece`) from text lines; `python -m bertjax.tokenizer` and the job's corpus stage call them.

The same lines and arguments give byte-identical files in every process, whatever the thread count or
PYTHONHASHSEED: a user who reruns a config, or a CI that compares a run with a stored one, gets the same
vocab, records and losses.

WordPiece is HF `tokenizers`' WordPieceTrainer algorithm run here in Python, because that trainer gives a
different vocab per process (huggingface/tokenizers#1794; PR #2066 unmerged). Its BpeTrainer (which
WordPieceTrainer wraps, tokenizers/src/models/bpe/trainer.rs) gives the "##c" forms their ids in the
iteration order of a HashMap with per-process random state, and breaks equal-count merges by those ids.
This module runs the same algorithm with every id and every tie fixed:

* ids: special tokens, then the alphabet (every char of every word, sorted by code point, as HF does), then the
  "##c" forms of the chars that occur after a word's first char, sorted by code point (HF: hash order), then one id
  per new merged token, in merge order;
* merges: the pair with the highest count first, equal counts broken by the lower (left id, right id) pair (HF's
  rule; with fixed ids it is a fixed rule), duplicate queue entries of one pair by insertion order;
* the same incremental bookkeeping as HF (pair counts, pair -> words to update, a max-heap with lazy invalidation:
  a popped entry whose count is stale is pushed back with the current count), so the same quirks: the merged pair's
  own count is not cleared, a merge whose token already exists reuses that id and adds no entry;
* stops when the vocab holds vocab_size entries, when no pair is left, or when the best pair's count is below
  min_frequency (or below 1).

Given one HF run's "##c" order (`continuation_order`), it reproduces that run's vocab token for token (tested).
Measured against HF on the same lines (2-core box, side by side): pydocs at 4,096 pieces 0.43 s vs 0.53 s,
40 MB of code text at 30,522 pieces 9.7 s vs 17.8 s, 160 MB 39.7 s vs 85.1 s (one core here, two for HF); the
vocabs share 99.9-100% of their tokens (as two HF runs do with each other) and tokenize held-out pydocs into
the same number of pieces (1.1186 per word at 4,096).

Words come from the same `tokenizers` normalizer and pre-tokenizer bertjax builds (`bert_pipeline`). They are
applied to each distinct whitespace-separated chunk of the input once, not to every line: BERT's normalization and
pre-tokenization never join or look across whitespace, so the words of a line are the words of its chunks (the few
chars Python splits on that the normalizer deletes instead, controls such as \\x0b \\x1c \\x85, are deleted before
splitting). No set or dict of strings is iterated where order matters.

SentencePiece's own trainer is deterministic on one thread given its input; `train_sentencepiece` draws the
sample of input_sentence_size lines itself (seeded) and writes the files itself (SentencePiece's record their
own path).
"""

from __future__ import annotations

import collections
import functools
import heapq
import io
import itertools
import json
import logging
import os
import pathlib
import random
import re
import sys
import unicodedata
from collections.abc import Callable, Iterable, Iterator

import sentencepiece as spm
import tokenizers

from bertjax.data.vocab import tokenization
from bertjax.data.vocab.accents import AccentCounter
from bertjax.data.vocab.tokenization import CLS, MASK, PAD, SEP, SPECIAL_TOKENS, SPM_PREFIX, UNK, VOCAB_FILE

log = logging.getLogger(__name__)
_BLOCK_CHARS = 1 << 22  # input text handled per str.split / Rust call (chars)


# Every str.isspace() char is in the Basic Multilingual Plane, so scanning it alone finds them all in a
# sixteenth of the time of all of Unicode (10 ms, not 0.2 s, per process); a test scans all of Unicode to check.
_WHITESPACE_SCAN_END = 0x10000


def _python_whitespace(end: int = _WHITESPACE_SCAN_END) -> set[str]:
    """The chars below `end` that str.split() splits on (str.isspace()), found at C speed."""
    every_char = "".join(map(chr, itertools.chain(range(min(end, 0xD800)), range(0xE000, end))))
    return set(re.findall(r"\s", every_char))


@functools.cache
def _glue_re() -> re.Pattern:
    """Chars that str.split() splits on but the BERT normalizer deletes (controls): deleted before splitting.

    Checks the other assumptions of chunk-wise normalization against this Python's unicodedata: every other char
    str.split() splits on is either BERT whitespace (" \\t\\n\\r" or Zs, → " ") or a line/paragraph separator that
    the normalizer keeps and WhitespaceSplit (Rust char::is_whitespace) splits on; and every BERT whitespace char is
    one str.split() splits on.
    """
    python_ws = _python_whitespace()
    # Python's isspace() includes every Zs char by definition, so every BERT whitespace char splits a chunk.
    zs = {ch for ch in python_ws if unicodedata.category(ch) == "Zs"}
    glue = []
    for ch in sorted(python_ws - {" ", "\t", "\n", "\r"} - zs):
        if unicodedata.category(ch)[0] == "C":  # BERT's _is_control: deleted by the normalizer
            glue.append(ch)
        else:
            assert ch in "\u2028\u2029", hex(ord(ch))  # kept by the normalizer, split by WhitespaceSplit
    return re.compile("[" + re.escape("".join(glue)) + "]")


def _blocks(lines: Iterable[str]) -> Iterator[str]:
    """Lines joined by "\\n" into blocks of about _BLOCK_CHARS chars (a line never straddles two blocks)."""
    buf: list[str] = []
    size = 0
    for line in lines:
        buf.append(line)
        size += len(line) + 1
        if size >= _BLOCK_CHARS:
            yield "\n".join(buf)
            buf, size = [], 0
    if buf:
        yield "\n".join(buf)


# ASCII chunks skip the Rust pipeline, by an exact equivalence: on ASCII text without whitespace, BERT's normalizer
# only deletes the controls \x00-\x08 \x0e-\x1b \x7f (\x0b \x0c \x1c-\x1f are deleted before splitting) and
# lower-cases A-Z (NFD, mark removal and the final-sigma rule change no ASCII char); what remains is printable
# ASCII, whose non-alphanumerics are all BERT punctuation, each its own word, and whose alphanumeric runs are words.
_ASCII_CONTROL_RE = re.compile("[\x00-\x08\x0e-\x1b\x7f]")
_ASCII_WORD_RE = {True: re.compile("[0-9a-z]+|[^0-9a-z ]"), False: re.compile("[0-9A-Za-z]+|[^0-9A-Za-z ]")}
_RUST_BLOCK_CHARS = 2048  # tokenizers' pre_tokenize_str slows down on long strings; short calls are fastest


def _words_ascii(chunks: list[str], do_lower_case: bool) -> list[str]:
    text = " ".join(chunks)
    if _ASCII_CONTROL_RE.search(text):
        text = _ASCII_CONTROL_RE.sub("", text)
    if do_lower_case:
        text = text.lower()
    return _ASCII_WORD_RE[do_lower_case].findall(text)


def _words_rust(chunks: list[str], normalizer, pre_tokenizer) -> list[str]:
    found: list[str] = []
    start = 0
    while start < len(chunks):
        end, size = start, 0
        while end < len(chunks) and size < _RUST_BLOCK_CHARS:
            size += len(chunks[end]) + 1
            end += 1
        text = normalizer.normalize_str("\n".join(chunks[start:end]))
        found += [w for w, _ in pre_tokenizer.pre_tokenize_str(text)]
        start = end
    return found


def count_words(
    lines: Iterable[str],
    do_lower_case: bool = True,
    ascii_fast_path: bool = True,
    strip_accents: bool | None = None,
    accents: AccentCounter | None = None,
) -> dict[str, int]:
    """Word -> count, words being what BERT's normalizer + pre-tokenizer (as bertjax builds them) make of the lines.

    Equal to counting `pre_tokenize_str(normalize_str(line))` over every line, but the (slow, regex-based) Rust
    pipeline runs once per distinct whitespace-separated chunk, not per occurrence: chunks are counted with
    str.split(), then the chunks seen k times are normalized and pre-tokenized together and their words counted k
    times. Pure-ASCII chunks take an exactly equivalent Python path (see _ASCII_WORD_RE) unless ascii_fast_path is
    False. `accents`, when given, counts what accent stripping changes in the non-ASCII chunks.
    """
    # the words bertjax's tokenizer sees
    normalizer, pre_tokenizer = tokenization.bert_pipeline(do_lower_case, strip_accents)
    chunks: collections.Counter[str] = collections.Counter()
    glue = _glue_re()
    for block in _blocks(lines):
        if glue.search(block):
            block = glue.sub("", block)
        chunks.update(block.split())
    by_count: dict[tuple[int, bool], list[str]] = collections.defaultdict(list)
    for chunk, k in chunks.items():  # insertion (first-seen) order: deterministic, and order does not matter here
        by_count[k, ascii_fast_path and chunk.isascii()].append(chunk)
        if accents is not None:
            accents.add(chunk, k)
    del chunks
    words: collections.Counter[str] = collections.Counter()
    for key in sorted(by_count):
        k, is_ascii = key
        group = by_count.pop(key)
        for start in range(0, len(group), 1 << 16):
            part = group[start : start + (1 << 16)]
            found = _words_ascii(part, do_lower_case) if is_ascii else _words_rust(part, normalizer, pre_tokenizer)
            if k == 1:
                words.update(found)
            else:
                for w, n in collections.Counter(found).items():
                    words[w] += n * k
    return dict(words)


def train_from_counts(
    word_counts: dict[str, int],
    vocab_size: int,
    min_frequency: int = 2,
    special_tokens: Iterable[str] = tokenization.SPECIAL_TOKENS,
    limit_alphabet: int | None = None,
    initial_alphabet: Iterable[str] = (),
    continuing_subword_prefix: str = tokenization.WORDPIECE_PREFIX,
    continuation_order: list[str] | None = None,
) -> list[str]:
    """The vocab (tokens in id order) HF's WordPieceTrainer would learn from these word counts, with fixed ids/ties.

    `continuation_order` gives the "##c" forms their ids in that order instead of sorted: it replays one HF run's
    random order, so that the rest of the algorithm can be checked against HF merge for merge (the tests do).
    """
    return _train_from_counts(
        word_counts,
        vocab_size,
        min_frequency,
        special_tokens,
        limit_alphabet,
        initial_alphabet,
        continuing_subword_prefix,
        continuation_order,
    )[0]


def _train_from_counts(
    word_counts,
    vocab_size,
    min_frequency,
    special_tokens,
    limit_alphabet=None,
    initial_alphabet=(),
    continuing_subword_prefix=tokenization.WORDPIECE_PREFIX,
    continuation_order=None,
) -> tuple[list[str], str]:
    """`train_from_counts`, and why it stopped: "full", "no_pairs" (every word is one piece) or "min_frequency"."""
    prefix = continuing_subword_prefix
    id2w: list[str] = []
    w2id: dict[str, int] = {}

    def add(token: str) -> int:
        i = w2id.get(token)
        if i is None:
            i = w2id[token] = len(id2w)
            id2w.append(token)
        return i

    for t in special_tokens:
        add(t)

    # Alphabet: every char of every word, weighted by the word's count (HF compute_alphabet).
    words = sorted(word_counts)  # fixed word order (HF: hash order; only ties inside one pair's updates depend on it)
    char_count: dict[str, int] = collections.defaultdict(int)
    for w in words:
        c = word_counts[w]
        for ch in w:  # one pass per distinct char would be faster for long words; words are short
            char_count[ch] += c
    for ch in initial_alphabet:
        char_count[ch] = sys.maxsize
    kept = sorted(char_count, key=ord)
    if limit_alphabet is not None and len(kept) > limit_alphabet:
        # HF drops the rarest chars, equal counts in hash order; here equal counts drop the lower code point first.
        by_rarity = sorted(kept, key=lambda ch: (char_count[ch], ord(ch)))
        dropped = set(by_rarity[: len(kept) - limit_alphabet])
        kept = [ch for ch in kept if ch not in dropped]
    alphabet = set(kept)
    for ch in kept:
        add(ch)

    # "##c" forms, for chars in the alphabet seen after a word's first char; ids in code point order.
    cont_chars = set()
    for w in words:
        cont_chars.update(w[1:])
    cont_chars &= alphabet
    if continuation_order is not None:
        order = list(continuation_order)
        assert sorted(order) == sorted(prefix + ch for ch in cont_chars), "continuation order must list every ##c"
        for t in order:
            add(t)
    else:
        for ch in sorted(cont_chars, key=ord):
            add(prefix + ch)

    # Words as id lists; words of one symbol have no pairs and need no further work.
    first_id = {ch: w2id[ch] for ch in alphabet}
    cont_id = {ch: w2id[prefix + ch] for ch in cont_chars}
    seqs: list[list[int]] = []
    counts: list[int] = []
    for w in words:
        ids = [first_id[w[0]]] if w[0] in alphabet else []
        for ch in w[1:]:
            i = cont_id.get(ch)
            if i is not None:
                ids.append(i)
        if len(ids) >= 2:
            seqs.append(ids)
            counts.append(word_counts[w])

    # Pair counts and pair -> word indices; a pair (a, b) is the int a << 32 | b, ordered as (a, b).
    pair_counts: dict[int, int] = collections.defaultdict(int)
    where: dict[int, set[int]] = collections.defaultdict(set)
    for wi, ids in enumerate(seqs):
        c = counts[wi]
        for a, b in zip(ids, ids[1:]):
            p = a << 32 | b
            pair_counts[p] += c
            where[p].add(wi)
    # Max-heap on (count, then lower pair first) via heapq on (-count, pair, seq); seq orders duplicate entries.
    heap = [(-pair_counts[p], p, seq, pos) for seq, (p, pos) in enumerate(sorted(where.items()))]
    seq = len(heap)
    heapq.heapify(heap)
    where = collections.defaultdict(set)
    mask = (1 << 32) - 1
    plen = len(prefix)

    stopped = "full"
    while len(w2id) < vocab_size and heap:
        negc, p, s, pos = heapq.heappop(heap)
        cur = pair_counts[p]
        if -negc != cur:  # stale: push back with the current count (HF does the same)
            heapq.heappush(heap, (-cur, p, s, pos))
            continue
        if cur < 1 or cur < min_frequency:
            stopped = "min_frequency" if cur >= 1 else "no_pairs"
            break
        a, b = p >> 32, p & mask
        part_b = id2w[b]
        if part_b.startswith(prefix):
            part_b = part_b[plen:]
        new = add(id2w[a] + part_b)

        for wi in pos:  # a set of ints: its order is fixed by the operations, not by PYTHONHASHSEED
            # HF's Word::merge: left to right, non-overlapping; list.index finds each candidate `a` at C speed.
            ids = seqs[wi]
            c = counts[wi]
            n = len(ids)
            i = 0
            while True:
                try:
                    i = ids.index(a, i, n - 1)  # pair starts only before the last symbol
                except ValueError:
                    break
                if ids[i + 1] == b:
                    if i > 0:
                        left = ids[i - 1]
                        pair_counts[left << 32 | a] -= c
                        q = left << 32 | new
                        pair_counts[q] += c
                        where[q].add(wi)
                    ids[i : i + 2] = (new,)
                    n -= 1
                    if i < n - 1:
                        right = ids[i + 1]
                        pair_counts[b << 32 | right] -= c
                        q = new << 32 | right
                        pair_counts[q] += c
                        where[q].add(wi)
                i += 1
        for q, qpos in where.items():
            cnt = pair_counts[q]
            if cnt > 0:
                heapq.heappush(heap, (-cnt, q, seq, qpos))
                seq += 1
        where.clear()

    if len(w2id) < vocab_size and not heap:
        stopped = "no_pairs"
    return id2w, stopped


def learn_wordpiece(
    lines: Iterable[str],
    vocab_size: int,
    do_lower_case: bool = True,
    min_frequency: int = 2,
    special_tokens: Iterable[str] = tokenization.SPECIAL_TOKENS,
    limit_alphabet: int | None = None,
) -> list[str]:
    """Learns a WordPiece vocab from text lines; returns the tokens in id order (specials first, ids 0..4)."""
    return train_from_counts(
        count_words(lines, do_lower_case), vocab_size, min_frequency, special_tokens, limit_alphabet
    )


# --- Writing vocab files ---------------------------------------------------------------------------------


def _nonempty(texts: Iterable[str]) -> Iterator[str]:
    for text in texts:
        if text and not text.isspace():
            yield text


def sample_lines(lines: Iterable[str], size: int, seed: int) -> list[str]:
    """All lines when there are at most `size` (in order), else a uniform sample of `size` of them drawn with
    `seed` (reservoir sampling, in the order they were kept): the same lines and seed, the same sample."""
    kept: list[str] = []
    rng = random.Random(seed)
    for i, line in enumerate(lines):
        if i < size:
            kept.append(line)
        else:
            j = rng.randrange(i + 1)
            if j < size:
                kept[j] = line
    return kept


def _output_dir(output_dir: str | os.PathLike) -> pathlib.Path:
    """Creates the trainers' output directory; a file in its place is one sentence, not mkdir's errno."""
    out = pathlib.Path(output_dir)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(
            f"Tokenizer output directory {out} is a file; pass a directory (it is created if missing)."
        )
    out.mkdir(parents=True, exist_ok=True)
    return out


def size_note(
    vocab: list[str], vocab_size: int, word_counts: dict[str, int], min_frequency: int, stopped: str
) -> str | None:
    """One line saying why a learned WordPiece vocab is not the size asked (None when it is)."""
    if len(vocab) == vocab_size:
        return None
    words, chars = len(word_counts), len({ch for w in word_counts for ch in w})
    head = f"WordPiece vocab has {len(vocab):,} entries, not the {vocab_size:,} asked for: "
    if len(vocab) > vocab_size:  # HF's rule too: every char and its ##form get an entry, whatever the size
        return head + (
            f"the corpus has {chars:,} distinct characters and each, with its ## form, takes an entry "
            f"whatever the size; ask for more than {len(vocab):,} to leave room for merges."
        )
    if stopped == "no_pairs":
        return head + (
            f"the corpus has only {words:,} distinct words ({chars:,} distinct characters) and every one "
            "is already a single piece; give it more text or ask for fewer."
        )
    return head + (
        f"every pair of pieces left occurs fewer than min_frequency={min_frequency} times in the "
        f"corpus's {words:,} distinct words ({sum(word_counts.values()):,} in all); give it more text "
        "or ask for fewer."
    )


class NoText(ValueError):
    """The corpus gave no text to learn from (the command then says what it read)."""


def train_wordpiece(
    texts: Iterable[str],
    vocab_size: int,
    output_dir: str | os.PathLike,
    do_lower_case: bool = True,
    min_frequency: int = 2,
    report: Callable[[str], None] | None = None,
    strip_accents: bool | None = None,
    how_to_keep: str = "pass --strip_accents=false",
) -> tokenization.WordPieceTokenizer:
    """Learns a WordPiece vocab from an iterator of text lines (any corpus source) and writes output_dir/vocab.txt,
    and beside it tokenizer_config.json with the casing (`strip_accents`: None is BERT's rule, accents stripped with
    lower-casing; every later load of the vocab follows it).

    The specials take ids 0..4 as [PAD] [UNK] [CLS] [SEP] [MASK], not BERT's 0/100-103: a small trained vocab should
    not spend 99 ids on [unused*] fillers, every consumer looks specials up by name (Tokenizer.*_id), and [PAD] stays
    0, the one id that padding code and masks assume. A vocab of another size than asked (a small corpus, or
    min_frequency) is said in one line (`size_note`) to `report` (default: a logged warning).
    """
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(
            f"vocab_size={vocab_size} leaves no room beside the {len(SPECIAL_TOKENS)} special tokens; "
            "ask for a larger --vocab_size."
        )
    out = _output_dir(output_dir)
    accents = AccentCounter() if tokenization.strips_accents(do_lower_case, strip_accents) else None
    counts = count_words(_nonempty(texts), do_lower_case, strip_accents=strip_accents, accents=accents)
    if accents is not None and accents.total:  # said once, where the vocab is made
        (report or log.warning)(accents.warning("WordPiece vocab", how_to_keep))
    vocab, stopped = _train_from_counts(counts, vocab_size, min_frequency, SPECIAL_TOKENS)
    if len(vocab) <= len(SPECIAL_TOKENS):
        raise NoText("WordPiece training saw no text; check that --input_file matches non-empty text files.")
    note = size_note(vocab, vocab_size, counts, min_frequency, stopped)
    if note:
        (report or log.warning)(note)
    assert tuple(vocab[: len(SPECIAL_TOKENS)]) == SPECIAL_TOKENS, vocab[: len(SPECIAL_TOKENS)]
    (out / VOCAB_FILE).write_text("".join(f"{t}\n" for t in vocab), encoding="utf-8")
    casing = {"do_lower_case": do_lower_case, "strip_accents": strip_accents}
    (out / tokenization.TOKENIZER_CONFIG).write_text(json.dumps(casing, indent=2) + "\n", encoding="utf-8")
    return tokenization.WordPieceTokenizer(out / VOCAB_FILE, do_lower_case)


def train_sentencepiece(
    texts: Iterable[str],
    vocab_size: int,
    output_dir: str | os.PathLike,
    do_lower_case: bool = True,
    model_type: str = "unigram",
    character_coverage: float = 0.9995,
    input_sentence_size: int = 10_000_000,
    seed: int = 12345,
    num_threads: int = 1,
) -> tokenization.SentencePieceTokenizer:
    """Learns a SentencePiece model from an iterator of text lines; writes output_dir/spm.model and spm.vocab.

    [PAD]=0 and [UNK]=1 are SentencePiece's own pad/unk pieces; [CLS]=2 [SEP]=3 [MASK]=4 are control symbols, so
    like BERT's specials they sit in the vocab but are never produced from text (raw "[MASK]" in a corpus stays text).
    No BOS/EOS: instances add [CLS]/[SEP] themselves. input_sentence_size caps the lines kept in memory.

    Reproducible: the same lines and arguments give the same files in every process. SentencePiece's own
    sampling of input_sentence_size lines ignores its seed from Python, so the sample (seeded, uniform) is
    drawn here; its multi-threaded EM sums scores in a different order per run, so one thread is the
    default (pydocs, 4k pieces: 4.1 s on one thread, 5.8 s on its default 16, on 2 cores); more threads
    train faster on a large corpus, but not reproducibly.
    """
    out = _output_dir(output_dir)
    lines = sample_lines((t.lower() if do_lower_case else t for t in _nonempty(texts)), input_sentence_size, seed)
    model = io.BytesIO()  # written here, not by SentencePiece: its files would record their own path
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines),
            model_writer=model,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            input_sentence_size=0,
            shuffle_input_sentence=False,
            num_threads=num_threads,
            pad_id=0,
            pad_piece=PAD,
            unk_id=1,
            unk_piece=UNK,
            bos_id=-1,
            eos_id=-1,
            control_symbols=[CLS, SEP, MASK],
            minloglevel=2,
        )
    except RuntimeError as e:
        raise ValueError(
            f"SentencePiece training into {out} failed ({str(e).strip()}); lower --vocab_size or give it more text."
        ) from None
    (out / f"{SPM_PREFIX}.model").write_bytes(model.getvalue())
    trained = spm.SentencePieceProcessor(model_proto=model.getvalue())
    (out / f"{SPM_PREFIX}.vocab").write_text(
        "".join(f"{trained.id_to_piece(i)}\t{trained.get_score(i):g}\n" for i in range(trained.get_piece_size())),
        encoding="utf-8",
    )
    return tokenization.SentencePieceTokenizer(out / f"{SPM_PREFIX}.model", do_lower_case)


def train_bpe(
    texts: Iterable[str],
    vocab_size: int,
    output_dir: str | os.PathLike,
    do_lower_case: bool = False,
    min_frequency: int = 2,
) -> tokenization.JsonTokenizer:
    """Learns a byte-level BPE (as RoBERTa and ModernBERT tokenize) with HF `tokenizers` and writes
    output_dir/tokenizer.json: NFC (and lower-casing with do_lower_case) in the file's normalizer, a "Ġ" before
    every word (add_prefix_space, so a sentence's first word is the same piece as elsewhere), all 256 bytes
    in the alphabet (no [UNK] from text), [PAD] [UNK] [CLS] [SEP] [MASK] at ids 0-4 and BERT's
    [CLS] A [SEP] (B [SEP]) template, so transformers' fast tokenizers load it and tokenize as bertjax does.
    Cased by default, as RoBERTa's and ModernBERT's. [MASK] takes the space before it (lstrip, as RoBERTa's
    <mask>): "installs [MASK] from" is then "Ġinstalls [MASK] Ġfrom", not a lone "Ġ" piece before the mask,
    a sequence pre-training never shows the model. Reproducible: the same lines and arguments give the same bytes in every process."""
    if vocab_size <= len(SPECIAL_TOKENS) + 256:
        raise ValueError(
            f"vocab_size={vocab_size} leaves no room for merges beside the 256 bytes and "
            f"{len(SPECIAL_TOKENS)} special tokens; ask for a larger --vocab_size."
        )
    out = _output_dir(output_dir)
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=UNK))
    tok.normalizer = tokenizers.normalizers.Sequence(
        [tokenizers.normalizers.NFC()] + [tokenizers.normalizers.Lowercase()] * do_lower_case
    )
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=False,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_nonempty(texts), trainer=trainer)
    if tok.get_vocab_size() <= len(SPECIAL_TOKENS) + 256:
        raise ValueError("BPE training learned no merges; check that --input_file matches non-empty text files.")
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single=f"{CLS} $A {SEP}",
        pair=f"{CLS} $A {SEP} $B:1 {SEP}:1",
        special_tokens=[(CLS, tok.token_to_id(CLS)), (SEP, tok.token_to_id(SEP))],
    )
    tok.add_special_tokens([tokenizers.AddedToken(MASK, lstrip=True, special=True, normalized=False)])  # same id
    path = out / tokenization.TOKENIZER_JSON
    tok.save(str(path))
    return tokenization.JsonTokenizer(path, do_lower_case)
