"""WordPiece (BERT vocab.txt, run by HF `tokenizers`), SentencePiece (.model) and any `tokenizers` file
(tokenizer.json: byte-level BPE, ModernBERT's own, ...): load behind one interface.

WordPiece output must equal google-research/bert's `FullTokenizer` (BasicTokenizer + WordpieceTokenizer) token for
token, so that records made here and by create_pretraining_data.py agree. The stock `BertNormalizer` +
`BertPreTokenizer` of `tokenizers` differ from that Python code on rare characters: their Unicode tables are older
than Python's `unicodedata` (new punctuation, marks, controls), they keep unassigned code points that Python drops as
category Cn, they miss CJK code points U+2B820..U+2B91F, and they lower-case Σ without Python's final-sigma rule. So the
pipeline below is composed from `tokenizers` parts whose character classes are computed from Python's `unicodedata`,
the same tables the reference uses; it still runs in Rust and batches across threads.
"""

import abc
import dataclasses
import functools
import hashlib
import json
import logging
import os
import pathlib
import posixpath
import re
import sys
import unicodedata
from collections.abc import Iterable

import numpy as np
import sentencepiece as spm
import tokenizers
from tokenizers import Regex, decoders, normalizers, pre_tokenizers, processors

from bertjax.runtime import files

log = logging.getLogger(__name__)

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
WORDPIECE_PREFIX = "##"
SENTENCEPIECE_SPACE = "\u2581"
MAX_INPUT_CHARS_PER_WORD = 100  # BERT's WordpieceTokenizer default: longer words become [UNK].
VOCAB_FILE = "vocab.txt"
SPM_PREFIX = "spm"
TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"  # beside a vocab.txt: its casing settings, as in a Hugging Face directory
BYTE_LEVEL_SPACE = "\u0120"  # "Ġ": byte-level BPE's mark of a piece that starts a word
# The same five roles under RoBERTa's names, which tokenizer.json files of that lineage use.
ROBERTA_SPECIALS = {PAD: "<pad>", UNK: "<unk>", CLS: "<s>", SEP: "</s>", MASK: "<mask>"}

# BERT's _is_chinese_char ranges (CJK ideographs, not Hangul or kana).
_CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)


@dataclasses.dataclass(frozen=True)
class Frame:
    """The special tokens around one text or a pair, where the tokenizer's own template puts them: BERT's
    [CLS] a [SEP] b [SEP] (b and the [SEP] after it in segment 1), RoBERTa's <s> a </s></s> b </s> (one segment).
    Fine-tuning frames its inputs so, as `transformers` frames them for the exported tokenizer."""

    before: tuple[int, ...]  # before a
    after: tuple[int, ...]  # after a, alone
    between: tuple[int, ...]  # between a and b
    end: tuple[int, ...]  # after b
    b_segment: int  # segment id of b and of what follows it
    pad_id: int

    @property
    def single_specials(self) -> int:
        return len(self.before) + len(self.after)

    @property
    def pair_specials(self) -> int:
        return len(self.before) + len(self.between) + len(self.end)

    def single(self, a: list[int]) -> list[int]:
        return [*self.before, *a, *self.after]

    def pair(self, a: list[int], b: list[int]) -> tuple[list[int], list[int]]:
        """(ids, segment ids) of a and b framed."""
        ids = [*self.before, *a, *self.between, *b, *self.end]
        head = len(self.before) + len(a) + len(self.between)
        return ids, [0] * head + [self.b_segment] * (len(ids) - head)


class Tokenizer(abc.ABC):
    """Text → pieces → ids, with BERT's special ids as attributes; the contract `prepare` and masking rely on."""

    path: pathlib.Path
    do_lower_case: bool
    strip_accents: bool = False  # whether accents (Mn marks after NFD) are removed: BERT's WordPiece only
    vocab: list[str]
    pad_id: int
    unk_id: int
    cls_id: int
    sep_id: int
    mask_id: int

    def _set_vocab(self, vocab: list[str]) -> None:
        """Validates the vocab once so every later failure is impossible, then records the special ids."""
        if not vocab:
            raise ValueError(
                f"Vocabulary file {self.path} is empty; point to a real vocab or train one with "
                "`python -m bertjax.tokenizer`."
            )
        seen: dict[str, int] = {}
        for i, token in enumerate(vocab):
            if token in seen:
                raise ValueError(
                    f"Vocabulary file {self.path} lists {token!r} twice (entries {seen[token]} and {i}); "
                    "remove the duplicate so every token has one id."
                )
            seen[token] = i
        missing = [t for t in SPECIAL_TOKENS if t not in seen]
        if missing:
            raise ValueError(
                f"Vocabulary file {self.path} lacks the special token(s) {' '.join(missing)}; add them "
                f"(BERT's vocab.txt has [PAD] at 0 and [UNK] [CLS] [SEP] [MASK] at 100-103) or retrain "
                "with `python -m bertjax.tokenizer`."
            )
        self.vocab = vocab
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (seen[t] for t in SPECIAL_TOKENS)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def special_ids(self) -> tuple[int, ...]:
        return (self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id)

    @abc.abstractmethod
    def tokenize(self, text: str) -> list[str]:
        """Pieces of `text`, without [CLS]/[SEP]."""

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]:
        """Ids of `text`, without [CLS]/[SEP]; instance creation adds those itself."""

    @abc.abstractmethod
    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Ids of many texts at once, using the engine's threads; the fast path for corpus preparation."""

    @abc.abstractmethod
    def decode(self, ids: Iterable[int]) -> str:
        """Readable text for ids (lower-cased / accent-stripped text stays so); for logs and debugging."""

    @abc.abstractmethod
    def is_continuation_token(self, token: str) -> bool:
        """True for a piece that continues the previous word (whole-word masking groups it with that word)."""

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self.vocab[int(i)] for i in ids]

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        index = self._index
        return [index.get(t, self.unk_id) for t in tokens]

    @functools.cached_property
    def _index(self) -> dict[str, int]:
        return {t: i for i, t in enumerate(self.vocab)}

    def continuation_mask(self) -> np.ndarray:
        """bool[vocab_size]: `mask[id]` says the piece continues a word, so whole-word masking is one gather."""
        return np.array([self.is_continuation_token(t) for t in self.vocab], dtype=bool)

    def frame(self) -> Frame:
        """BERT's template: [CLS] a [SEP], [CLS] a [SEP] b [SEP]."""
        return Frame((self.cls_id,), (self.sep_id,), (self.sep_id,), (self.sep_id,), 1, self.pad_id)

    def vocab_hash(self) -> str:
        """sha256 of the vocab file, stored in metadata.json so records are never trained with another vocab."""
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


# ----------------------------------------------------------------------------------------------------- WordPiece


def _char_class(members: bytes) -> str:
    """An Onig character class `[\\x{a}-\\x{b}...]` for the code points whose byte in `members` is 1, as ranges."""
    runs = ((m.start(), m.end() - 1) for m in re.finditer(b"\x01+", members))
    return "[" + "".join(f"\\x{{{a:X}}}" if a == b else f"\\x{{{a:X}}}-\\x{{{b:X}}}" for a, b in runs) + "]"


@functools.cache
def _bert_char_classes() -> dict[str, str]:
    """BERT's character predicates (_is_control, _is_punctuation, _is_chinese_char, Mn) as regex classes.

    Computed from this Python's `unicodedata`, exactly as the reference computes them per character, but a table
    at a time: one category per code point, mapped to a byte (1: in the class) and cut into runs by `re`, all in C
    (every command that loads a WordPiece vocab does this: 0.46 s as a Python loop over 1.1M code points, 0.21 s so).
    """
    categories = list(map(unicodedata.category, map(chr, range(sys.maxunicode + 1))))
    names = sorted(set(categories))
    coded = bytes(map({name: i for i, name in enumerate(names)}.__getitem__, categories))  # a byte a code point

    def members(in_class, *, add: Iterable[tuple[int, int]] = (), remove: str = "") -> bytes:
        """1 for the code points whose category is in the class or in an `add` range (inclusive), 0 elsewhere."""
        out = bytearray(coded.translate(bytes(int(in_class(name)) for name in names).ljust(256, b"\0")))
        for a, b in add:
            out[a : b + 1] = b"\1" * (b + 1 - a)
        for c in remove:
            out[ord(c)] = 0
        out[0xD800 : 0xDFFF + 1] = bytes(0xDFFF + 1 - 0xD800)  # surrogates cannot occur in a decoded str
        return bytes(out)

    ascii_punct = ((33, 47), (58, 64), (91, 96), (123, 126))
    return {
        "control": _char_class(members(lambda cat: cat[0] == "C", add=((0, 0), (0xFFFD, 0xFFFD)), remove="\t\n\r")),
        "whitespace": _char_class(members(lambda cat: cat == "Zs", add=[(ord(c), ord(c)) for c in " \t\n\r"])),
        "split": _char_class(members(lambda cat: cat[0] == "P", add=ascii_punct + _CJK_RANGES)),
        "marks": _char_class(members(lambda cat: cat == "Mn")),
    }


# Python's str.lower() Final_Sigma rule: Σ after a cased letter and not before one, case-ignorables skipped both ways.
_FINAL_SIGMA = r"(?<=[\p{Cased}&&\P{Case_Ignorable}]\p{Case_Ignorable}*)Σ(?!\p{Case_Ignorable}*+\p{Cased})"


def strips_accents(do_lower_case: bool, strip_accents: bool | None) -> bool:
    """Whether accents are stripped: BERT strips them with lower-casing; `strip_accents` (transformers' own
    BertTokenizer setting, None = as lower-casing) decides when set."""
    return do_lower_case if strip_accents is None else bool(strip_accents)


def bert_pipeline(
    do_lower_case: bool, strip_accents: bool | None = None
) -> tuple[normalizers.Normalizer, pre_tokenizers.PreTokenizer]:
    """Normalizer and pre-tokenizer equal to BERT's BasicTokenizer (google-research/bert, no NFC step), and to
    transformers' BertTokenizer with `strip_accents`.

    Order as in BasicTokenizer: drop controls, whitespace → " ", lower-case (final Σ → ς as Python's str.lower does
    within a word), NFD + drop Mn (accent stripping: with lower-casing unless strip_accents says otherwise), split on
    whitespace, isolate punctuation and CJK ideographs.
    """
    classes = _bert_char_classes()
    steps = [normalizers.Replace(Regex(classes["control"]), ""), normalizers.Replace(Regex(classes["whitespace"]), " ")]
    if do_lower_case:
        steps += [normalizers.Replace(Regex(_FINAL_SIGMA), "ς"), normalizers.Lowercase()]
    if strips_accents(do_lower_case, strip_accents):
        steps += [normalizers.NFD(), normalizers.Replace(Regex(classes["marks"]), "")]
    pre = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(classes["split"]), behavior="isolated")]
    )
    return normalizers.Sequence(steps), pre


def _hf_wordpiece(
    vocab: dict[str, int] | None, do_lower_case: bool, strip_accents: bool | None = None
) -> tokenizers.Tokenizer:
    kwargs = {} if vocab is None else {"vocab": vocab}  # No vocab: an empty model for the trainer to fill.
    model = tokenizers.models.WordPiece(
        **kwargs,
        unk_token=UNK,
        max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD,
        continuing_subword_prefix=WORDPIECE_PREFIX,
    )
    tok = tokenizers.Tokenizer(model)
    tok.normalizer, tok.pre_tokenizer = bert_pipeline(do_lower_case, strip_accents)
    tok.decoder = decoders.WordPiece(prefix=WORDPIECE_PREFIX)
    return tok


def read_vocab_txt(path: pathlib.Path) -> list[str]:
    """One token per line, id = line number; lines stripped as google-research/bert's load_vocab does."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:  # a gzip, a binary or a Latin-1 file: name it rather than the codec
        raise ValueError(
            f"Vocabulary file {path} is not UTF-8 text (byte {e.object[e.start]:#04x} at offset "
            f"{e.start}); pass a WordPiece vocab.txt with one token per line, or a SentencePiece "
            "file named *.model."
        ) from None
    vocab = [line.strip() for line in lines]
    for i, token in enumerate(vocab):
        if not token:
            raise ValueError(f"Vocabulary file {path} has a blank line {i + 1}; delete it (each line is one token).")
    return vocab


class _TokenizersEngine(Tokenizer):
    """A tokenizer run by HF `tokenizers` (self._tok): the specials are added by instance creation, not here."""

    _tok: tokenizers.Tokenizer

    def tokenize(self, text: str) -> list[str]:
        return self._tok.encode(text, add_special_tokens=False).tokens

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)


def recorded_strip_accents(vocab_path: str | os.PathLike) -> bool | None:
    """The `strip_accents` of the tokenizer_config.json beside a vocab file (as in a Hugging Face directory, and
    as the vocab trainer writes it), None when there is none: the setting travels with the vocab."""
    sidecar = pathlib.Path(vocab_path).parent / TOKENIZER_CONFIG
    try:
        value = json.loads(sidecar.read_text(encoding="utf-8")).get("strip_accents")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, bool) else None


class WordPieceTokenizer(_TokenizersEngine):
    """BERT vocab.txt applied with BasicTokenizer + WordpieceTokenizer semantics.

    strip_accents: None takes what tokenizer_config.json beside the vocab records, else BERT's rule (strip with
    lower-casing). False keeps the letters of scripts whose marks are part of the letter (й, が, č) when
    lower-casing, as transformers' BertTokenizer(strip_accents=False) does."""

    def __init__(self, path: str | os.PathLike, do_lower_case: bool = True, strip_accents: bool | None = None):
        self.path = pathlib.Path(path)
        self.do_lower_case = do_lower_case
        if not self.path.is_file():
            raise FileNotFoundError(
                f"Vocabulary file {self.path} does not exist; pass the vocab.txt of your BERT "
                "checkpoint or train one with `python -m bertjax.tokenizer`."
            )
        if strip_accents is None:
            strip_accents = recorded_strip_accents(self.path)
        self.strip_accents = strips_accents(do_lower_case, strip_accents)
        self._set_vocab(read_vocab_txt(self.path))
        self._tok = _hf_wordpiece({t: i for i, t in enumerate(self.vocab)}, do_lower_case, self.strip_accents)

    def is_continuation_token(self, token: str) -> bool:
        return token.startswith(WORDPIECE_PREFIX) and len(token) > len(WORDPIECE_PREFIX)

    def save_tokenizer_json(self, path: str | os.PathLike) -> None:
        """This tokenizer as a `tokenizers` file (tokenizer.json), with BERT's [CLS] A [SEP] (B [SEP]) template:
        transformers' fast tokenizers load it and tokenize exactly as this class does."""
        tok = _hf_wordpiece({t: i for i, t in enumerate(self.vocab)}, self.do_lower_case, self.strip_accents)
        cls, sep = self.vocab[self.cls_id], self.vocab[self.sep_id]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{cls} $A {sep}",
            pair=f"{cls} $A {sep} $B:1 {sep}:1",
            special_tokens=[(cls, self.cls_id), (sep, self.sep_id)],
        )
        tok.save(str(path))


# ------------------------------------------------------------------------------------------------- SentencePiece


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece .model; do_lower_case lower-cases text in Python before encoding (as at training time)."""

    def __init__(self, path: str | os.PathLike, do_lower_case: bool = True):
        self.path = pathlib.Path(path)
        self.do_lower_case = do_lower_case
        if not self.path.is_file():
            raise FileNotFoundError(
                f"SentencePiece model {self.path} does not exist; pass the .model file or train "
                "one with `python -m bertjax.tokenizer --model_type=sentencepiece`."
            )
        try:
            self._sp = spm.SentencePieceProcessor(model_file=str(self.path))
        except (OSError, RuntimeError) as e:
            raise ValueError(
                f"SentencePiece model {self.path} cannot be read ({' '.join(str(e).split())}); pass "
                "a file written by sentencepiece training."
            ) from None
        self._set_vocab([self._sp.id_to_piece(i) for i in range(self._sp.get_piece_size())])

    def _prep(self, text: str) -> str:
        return text.lower() if self.do_lower_case else text

    def tokenize(self, text: str) -> list[str]:
        return self._sp.encode(self._prep(text), out_type=str)

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(self._prep(text))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self._sp.encode([self._prep(t) for t in texts], num_threads=os.cpu_count() or 1)

    def decode(self, ids: Iterable[int]) -> str:
        return self._sp.decode([int(i) for i in ids])

    def is_continuation_token(self, token: str) -> bool:
        return not token.startswith(SENTENCEPIECE_SPACE) and token not in SPECIAL_TOKENS


# ---------------------------------------------------------------------------------------------- tokenizer.json


class JsonTokenizer(_TokenizersEngine):
    """A `tokenizers` file (tokenizer.json) as it is: its own normalizer (lower-casing included), pre-tokenizer and
    model, so do_lower_case is the file's business. Specials are found by BERT's names ([CLS] ...) or RoBERTa's
    (<s> ...); a piece continues a word when the file's model says so (WordPiece's "##", byte-level BPE's missing
    "Ġ", Metaspace's missing "▁")."""

    def __init__(self, path: str | os.PathLike, do_lower_case: bool = True):
        self.path = pathlib.Path(path)
        self.do_lower_case = do_lower_case
        if not self.path.is_file():
            raise FileNotFoundError(
                f"Tokenizer file {self.path} does not exist; pass a tokenizer.json or train one "
                "with `python -m bertjax.tokenizer --model_type=bpe`."
            )
        try:
            self._tok = tokenizers.Tokenizer.from_file(str(self.path))
        except Exception as e:  # noqa: BLE001  (tokenizers raises its own Exception subclass)
            raise ValueError(
                f"Tokenizer file {self.path} cannot be read by `tokenizers` ({str(e).strip()[:200]}); "
                "pass a tokenizer.json that transformers' fast tokenizers load."
            ) from None
        # The file's own padding and truncation would make [PAD] tokens of a batch's shorter texts and cut longer
        # ones (sentence-transformers saves tokenizer.json with both on): bertjax pads and cuts rows itself.
        self._tok.no_padding()
        self._tok.no_truncation()
        self._frame: Frame | None = None
        index = self._tok.get_vocab(with_added_tokens=True)
        vocab = [""] * (max(index.values()) + 1 if index else 0)
        for token, i in index.items():
            vocab[i] = token
        holes = [i for i, t in enumerate(vocab) if not t]
        if holes:
            raise ValueError(f"Tokenizer file {self.path} has no token for id(s) {holes[:5]}; its ids must be 0..N-1.")
        names = set(index)
        if not set(SPECIAL_TOKENS) <= names and set(ROBERTA_SPECIALS.values()) <= names:
            self._specials = ROBERTA_SPECIALS
        else:
            self._specials = {t: t for t in SPECIAL_TOKENS}
        self._set_vocab(vocab)
        spec = self._tok.to_str()
        model = self._tok.model
        self._prefix = (
            getattr(model, "continuing_subword_prefix", None) if type(model).__name__ == "WordPiece" else None
        )
        self._word_start = (
            BYTE_LEVEL_SPACE if '"ByteLevel"' in spec else SENTENCEPIECE_SPACE if '"Metaspace"' in spec else None
        )

    def _set_vocab(self, vocab: list[str]) -> None:
        mapped = {self._specials[t]: t for t in SPECIAL_TOKENS}  # RoBERTa's names stand in for BERT's
        missing = [t for t in SPECIAL_TOKENS if self._specials[t] not in set(vocab)]
        if missing:
            raise ValueError(
                f"Tokenizer file {self.path} lacks the special token(s) {' '.join(missing)} (or RoBERTa's "
                "<pad> <unk> <s> </s> <mask>); add them, or train one with `python -m bertjax.tokenizer "
                "--model_type=bpe`, which places them at ids 0-4."
            )
        super()._set_vocab([mapped.get(t, t) for t in vocab])
        self.vocab = vocab  # the file's own names

    def frame(self) -> Frame:
        """The file's own post-processor's template (BERT's, RoBERTa's <s> a </s></s> b </s>, a TemplateProcessing),
        read off two framed placeholder texts; BERT's with this file's specials (as both families frame inputs) when
        the file has none or its post-processor adds no special token (a ByteLevelBPETokenizer().save()'s), said
        once in the log."""
        if self._frame is None:
            self._frame = self._own_frame()
        return self._frame

    def _own_frame(self) -> Frame:
        if self._tok.post_processor is not None:
            # encode(), not post_process(): the latter loses the first text's sequence ids (tokenizers 0.22).
            single, pair = self._tok.encode("a"), self._tok.encode("a", "b")

            def parts(encoding: tokenizers.Encoding) -> list[tuple[int, ...]]:
                """The special ids before, between and after the texts: one run more than there are texts."""
                runs, current, text = [], [], None
                for token_id, sequence in zip(encoding.ids, encoding.sequence_ids):
                    if sequence is None:
                        current.append(token_id)
                    elif sequence != text:  # a text starts: the specials before it are a run
                        runs.append(tuple(current))
                        current, text = [], sequence
                return runs + [tuple(current)]

            (before, after), (_, between, end) = parts(single), parts(pair)
            if before or after or between or end:
                b_segment = pair.type_ids[pair.sequence_ids.index(1)]
                return Frame(before, after, between, end, b_segment, self.pad_id)
        cls, sep = self.vocab[self.cls_id], self.vocab[self.sep_id]
        log.warning(
            "%s: its post-processor adds no special tokens, so inputs are framed as BERT and ModernBERT frame them: "
            "%s a %s, %s a %s b %s (segment ids 0, 1).",
            *(self.path, cls, sep, cls, sep, sep),
        )
        return super().frame()

    def is_continuation_token(self, token: str) -> bool:
        if token in self._index and self._index[token] in self.special_ids:
            return False
        if self._prefix:
            return token.startswith(self._prefix) and len(token) > len(self._prefix)
        if self._word_start:
            return not token.startswith(self._word_start)
        return False  # no word marks: every piece is a word of its own for whole-word masking


def load(path: str | os.PathLike, do_lower_case: bool = True) -> Tokenizer:
    """Picks the engine by file: `*.model` is SentencePiece, `*.json` a `tokenizers` file (tokenizer.json),
    anything else a WordPiece vocab.txt.

    A directory is searched for vocab.txt, then spm.model, then tokenizer.json (what vocab_training.py writes).
    A file in a bucket (gs://) is read from its local copy (data/remote_cache.py), with the tokenizer_config.json
    beside it, if any (it says whether accents are stripped).
    """
    if files.is_remote(str(path)):
        from bertjax.data import remote_cache

        sidecar = posixpath.join(posixpath.dirname(str(path)), TOKENIZER_CONFIG)
        if files.exists(sidecar):
            remote_cache.copy_of(sidecar)
        path = remote_cache.copy_of(str(path))
    path = pathlib.Path(path)
    if path.is_dir():
        for name in (VOCAB_FILE, f"{SPM_PREFIX}.model", TOKENIZER_JSON):
            if (path / name).is_file():
                return load(path / name, do_lower_case)
        raise FileNotFoundError(
            f"Directory {path} holds none of {VOCAB_FILE}, {SPM_PREFIX}.model or "
            f"{TOKENIZER_JSON}; pass the vocab file itself or train one with "
            "`python -m bertjax.tokenizer`."
        )
    if path.suffix == ".model":
        return SentencePieceTokenizer(path, do_lower_case)
    if path.suffix == ".json":
        return JsonTokenizer(path, do_lower_case)
    return WordPieceTokenizer(path, do_lower_case)
