"""bertjax.data.vocab.tokenization against BERT's pure-Python BasicTokenizer + WordpieceTokenizer, plus training and errors."""

import ast
import gzip
import hashlib
import pathlib
import random
import subprocess
import sys
import sysconfig

import numpy as np
import pytest

from bertjax.data.vocab import tokenization, training as vocab_training

try:  # transformers 5.x: BertTokenizer is tokenizers-backed; the pure-Python classes moved to the legacy module.
    from transformers.models.bert.tokenization_bert_legacy import (
        BasicTokenizer,
        WordpieceTokenizer,
        whitespace_tokenize,
    )
except ImportError:  # transformers 4.x keeps them in tokenization_bert.
    from transformers.models.bert.tokenization_bert import BasicTokenizer, WordpieceTokenizer, whitespace_tokenize

REPO = pathlib.Path(__file__).resolve().parents[1]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


# ---------------------------------------------------------------------------------------------------- reference


class Reference:
    """BERT's FullTokenizer from the pure-Python HF classes.

    `google=True` runs BasicTokenizer's steps without the NFC pass HF added in 2023; google-research/bert (and the
    create_pretraining_data.py records we must match) never had it. `google=False` is HF's BasicTokenizer unmodified.
    """

    def __init__(
        self, vocab_file: pathlib.Path, do_lower_case: bool, google: bool = True, strip_accents: bool | None = None
    ):
        vocab = {t.strip(): i for i, t in enumerate(vocab_file.read_text(encoding="utf-8").splitlines())}
        self.basic = BasicTokenizer(do_lower_case=do_lower_case, strip_accents=strip_accents)
        self.wordpiece = WordpieceTokenizer(vocab, unk_token="[UNK]", max_input_chars_per_word=100)
        self.google = google

    def words(self, text: str) -> list[str]:
        b = self.basic
        if not self.google:
            return b.tokenize(text)
        text = b._tokenize_chinese_chars(b._clean_text(text))
        out = []
        for token in whitespace_tokenize(text):
            if b.do_lower_case:  # BasicTokenizer.tokenize's own rule for strip_accents
                token = token.lower()
                if b.strip_accents is not False:
                    token = b._run_strip_accents(token)
            elif b.strip_accents:
                token = b._run_strip_accents(token)
            out.extend(b._run_split_on_punc(token))
        return whitespace_tokenize(" ".join(out))

    def __call__(self, text: str) -> list[str]:
        return [p for w in self.words(text) for p in self.wordpiece.tokenize(w)]


@pytest.fixture(scope="module")
def docstrings() -> list[str]:
    """Real English prose with code, punctuation and the odd non-ASCII character: stdlib docstrings."""
    docs = []
    for path in sorted(pathlib.Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:80]:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        docs += [
            d
            for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and (d := ast.get_docstring(n, clean=False))
        ]
    assert len(docs) > 300
    return docs


@pytest.fixture(scope="module")
def corpus_lines(docstrings: list[str]) -> list[str]:
    lines = [line.strip() for d in docstrings for line in d.splitlines() if line.strip()]
    assert len(lines) > 3000
    return lines[:4000]


HARD_CASES = [
    "café naïve Ångström Café NAÏVE résumé Zürich façade",
    "cafe\u0301 (decomposed) and A\u030angstro\u0308m",
    "中文字符 and 日本語のテキスト, 한국어 텍스트, 𠀀𪜀 \U0002b820\U0002b91f",
    "Wait!!! What?!... (really) [sic] {x} <y> --- ''quoted'' \"double\" `tick` ~^$%&*@#",
    "ctrl\x00chars\x01here\x07and\x1bthere\ufffd zero\u200bwidth soft\u00adhyphen bidi\u202eX",
    "a" * 200 + " short " + "é" * 101 + " " + "b" * 100,
    "MiXeD CaSe iPhone McDonald's HTTPServer getHTTPResponse",
    "emoji 😀🎉👍🏽 family 👨\u200d👩\u200d👧 flags 🇺🇸 and ☃ ✓ ©®™",
    "tabs\there\tnewlines\nand\r\nCR nbsp\u00a0here ideographic\u3000space thin\u2009sp line\u2028sep",
    "ΟΔΟΣ ΣΑΣ Α\u0301Σ Σ' ΣΣ σίσυφος İstanbul ǅungla ß ﬁ ﬀ",
    "numbers 3.14159 1,000,000 -42 1e-10 0x1F ½ ² ٣",
    "Ünïcödé ünïcödé mixed ÀÉÎÕÜ ñ Ñ ç Ç ø Ø å æ œ",
    "  leading and trailing   ",
    "",
    "[CLS] [MASK] [SEP] stay text",
]


# ------------------------------------------------------------------------------------------ reference equality


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_matches_hf_basic_tokenizer_on_docstrings(vocab_file, docstrings, do_lower_case):
    ours = tokenization.load(vocab_file, do_lower_case=do_lower_case)
    ref = Reference(vocab_file, do_lower_case, google=False)
    got = [ours.convert_ids_to_tokens(ids) for ids in ours.encode_batch(docstrings)]
    mismatches = [(d[:80], g[:20], r[:20]) for d, g in zip(docstrings, got) if g != (r := ref(d))]
    assert not mismatches, mismatches[:3]
    assert sum(map(len, got)) > 50_000


@pytest.mark.parametrize("do_lower_case", [True, False])
@pytest.mark.parametrize("text", HARD_CASES)
def test_matches_bert_on_hard_cases(vocab_file, text, do_lower_case):
    ours = tokenization.load(vocab_file, do_lower_case=do_lower_case)
    assert ours.tokenize(text) == Reference(vocab_file, do_lower_case)(text)


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_matches_bert_across_unicode(vocab_file, do_lower_case):
    """Each code point in and around words: stock BertNormalizer fails here (old Unicode tables, CJK typo)."""
    ours = tokenization.load(vocab_file, do_lower_case=do_lower_case)
    ref = Reference(vocab_file, do_lower_case)
    cps = [*range(0x3000), *range(0x3000, sys.maxunicode + 1, 61), *range(0x2B810, 0x2B830)]
    texts = [f"a{c}b x{c}{c} {c}A" for c in map(chr, cps) if not 0xD800 <= ord(c) <= 0xDFFF]
    got = ours.encode_batch(texts)
    bad = [
        (hex(ord(t[1])), ours.convert_ids_to_tokens(g), r)
        for t, g in zip(texts, got)
        if ours.convert_ids_to_tokens(g) != (r := ref(t))
    ]
    assert not bad, bad[:5]


def test_final_sigma_fuzz(vocab_file):
    """Python's str.lower() makes word-final Σ a ς; the Rust Lowercase does not, so bertjax adds the rule."""
    ours = tokenization.load(vocab_file, do_lower_case=True)
    ref = Reference(vocab_file, True)
    alphabet = list("ΑΣσςΒaAb1'.-·\u0301\u0345\u00ad\u200b \u00a0İ中ʼ:") + ["ΣΣ"]
    rng = random.Random(0)
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 10))) for _ in range(5000)]
    bad = [
        (t, ours.convert_ids_to_tokens(g), ref(t))
        for t, g in zip(texts, ours.encode_batch(texts))
        if ours.convert_ids_to_tokens(g) != ref(t)
    ]
    assert not bad, bad[:5]


def test_no_nfc_like_google_bert(vocab_file):
    """The one documented difference from HF's BasicTokenizer: its NFC pass (absent in google-research/bert)."""
    ours = tokenization.load(vocab_file, do_lower_case=False)
    text = "cafe\u0301 \u037e"  # decomposed é; GREEK QUESTION MARK, which NFC maps to ';'
    assert ours.tokenize(text) == Reference(vocab_file, False, google=True)(text)
    assert ours.tokenize(text) != Reference(vocab_file, False, google=False)(text)
    # Uncased strips accents after NFD, so NFC makes no difference there.
    assert tokenization.load(vocab_file).tokenize("cafe\u0301") == ["cafe"]


def test_specific_expectations(vocab_file):
    uncased = tokenization.load(vocab_file, do_lower_case=True)
    cased = tokenization.load(vocab_file, do_lower_case=False)
    assert uncased.tokenize("Ångström café") == uncased.tokenize("angstrom cafe")
    assert uncased.tokenize("a" * 200) == ["[UNK]"]
    assert uncased.tokenize("a" * 100) != ["[UNK]"]
    assert uncased.tokenize("中文") == ["中", "文"]
    assert uncased.tokenize("x\u00a0y\u3000z\tw") == ["x", "y", "z", "w"]
    assert uncased.tokenize("wait!!!") == ["wait", "!", "!", "!"]
    assert uncased.tokenize("[MASK]") == ["[", "mask", "]"]  # specials are never produced from text
    assert cased.tokenize("Hello") != uncased.tokenize("Hello")


# ---------------------------------------------------------------------------------------------- interface


def test_interface_on_bert_vocab(vocab_file):
    tok = tokenization.load(vocab_file)
    assert isinstance(tok, tokenization.WordPieceTokenizer)
    assert tok.vocab_size == 30522 == len(tok.vocab)
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 100, 101, 102, 103)
    text = "The unaffable tokenizer tokenizes."
    ids = tok.encode(text)
    assert tok.encode_batch([text, "", text]) == [ids, [], ids]
    assert tok.convert_ids_to_tokens(ids) == tok.tokenize(text)
    assert tok.convert_tokens_to_ids(tok.tokenize(text)) == ids
    assert tok.decode(ids).startswith("the unaffable")
    mask = tok.continuation_mask()
    assert mask.shape == (30522,) and mask.dtype == np.bool_
    assert [bool(mask[i]) for i in tok.encode("unaffable")] == [False, True, True]
    assert not mask[list(tok.special_ids)].any()
    assert tok.vocab_hash() == hashlib.sha256(vocab_file.read_bytes()).hexdigest()
    assert tokenization.load(vocab_file.parent).vocab == tok.vocab  # a directory finds its vocab.txt


# ----------------------------------------------------------------------------------------------- training


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_train_wordpiece(tmp_path, corpus_lines, do_lower_case):
    tok = vocab_training.train_wordpiece(iter(corpus_lines), 2000, tmp_path, do_lower_case=do_lower_case)
    assert (tmp_path / "vocab.txt").read_text(encoding="utf-8").splitlines()[:5] == SPECIALS
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert tok.vocab_size == 2000
    reloaded = tokenization.load(tmp_path, do_lower_case=do_lower_case)
    assert reloaded.vocab == tok.vocab
    ref = Reference(tmp_path / "vocab.txt", do_lower_case)
    for line, ids in zip(corpus_lines[:500], reloaded.encode_batch(corpus_lines[:500])):
        pieces = reloaded.convert_ids_to_tokens(ids)
        assert tok.unk_id not in ids, line
        assert pieces == ref(line)
        words = []  # Round trip: merging ## pieces gives back BERT's basic-tokenized words.
        for p in pieces:
            if p.startswith("##"):
                words[-1] += p[2:]
            else:
                words.append(p)
        assert words == ref.words(line)


def test_train_sentencepiece(tmp_path, corpus_lines):
    tok = vocab_training.train_sentencepiece(iter(corpus_lines), 1000, tmp_path, do_lower_case=True)
    assert (tmp_path / "spm.model").is_file() and (tmp_path / "spm.vocab").is_file()
    assert tok.vocab[:5] == SPECIALS and tok.vocab_size == 1000
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    tok = tokenization.load(tmp_path / "spm.model", do_lower_case=True)
    assert isinstance(tok, tokenization.SentencePieceTokenizer)
    line = "Return the Number of items in a Sequence."
    assert tok.decode(tok.encode(line)) == line.lower()
    assert tok.encode_batch([line, line]) == [tok.encode(line)] * 2
    assert tok.mask_id not in tok.encode("[MASK]")  # control symbol: never produced from text
    mask = tok.continuation_mask()
    assert not mask[list(tok.special_ids)].any()
    assert all(mask[i] == (not p.startswith("\u2581")) for i, p in zip(tok.encode(line), tok.tokenize(line)))
    assert tok.vocab_hash() == hashlib.sha256((tmp_path / "spm.model").read_bytes()).hexdigest()


def test_cli(tmp_path, corpus_lines):
    (tmp_path / "a.txt").write_text("\n".join(corpus_lines[:1500]) + "\n\n", encoding="utf-8")
    with gzip.open(tmp_path / "b.txt.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(corpus_lines[1500:3000]))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bertjax.tokenizer",
            f"--input_file={tmp_path}/*.txt*",
            "--vocab_size=800",
            f"--output_dir={tmp_path}/out",
            "--nodo_lower_case",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "vocab_size=800" in out and str(tmp_path / "out" / "vocab.txt") in out
    assert "Read 2 unit(s)" in out and "3,000 sentences" in out
    assert tokenization.load(tmp_path / "out", do_lower_case=False).vocab[:5] == SPECIALS


# ------------------------------------------------------------------------------------------------- errors


def _write(path: pathlib.Path, tokens: list[str]) -> pathlib.Path:
    path.write_text("".join(f"{t}\n" for t in tokens), encoding="utf-8")
    return path


def test_errors(tmp_path):
    missing = tmp_path / "nope" / "vocab.txt"
    with pytest.raises(FileNotFoundError, match=f"{missing}.*does not exist"):
        tokenization.load(missing)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        tokenization.load(tmp_path / "nope.model")
    with pytest.raises(
        FileNotFoundError, match=f"Directory {tmp_path} holds none of vocab.txt, spm.model or tokenizer.json"
    ):
        tokenization.load(tmp_path)
    with pytest.raises(ValueError, match=r"empty\.txt is empty"):
        tokenization.load(_write(tmp_path / "empty.txt", []))
    lacking = _write(tmp_path / "lacking.txt", ["[PAD]", "[UNK]", "[CLS]", "hello"])
    with pytest.raises(ValueError, match=r"lacking\.txt lacks the special token\(s\) \[SEP\] \[MASK\];"):
        tokenization.load(lacking)
    dup = _write(tmp_path / "dup.txt", SPECIALS + ["hello", "world", "hello"])
    with pytest.raises(ValueError, match=r"dup\.txt lists 'hello' twice \(entries 5 and 7\)"):
        tokenization.load(dup)
    blank = _write(tmp_path / "blank.txt", SPECIALS + ["", "x"])
    with pytest.raises(ValueError, match=r"blank\.txt has a blank line 6"):
        tokenization.load(blank)
    corrupt = tmp_path / "bad.model"
    corrupt.write_bytes(b"not a model")
    with pytest.raises(ValueError, match=r"bad\.model cannot be read"):
        tokenization.load(corrupt)
    (tmp_path / "a.txt").write_text("x\n", encoding="utf-8")
    failed = subprocess.run(
        [
            sys.executable,
            "-m",
            "bertjax.tokenizer",
            f"--input_file={tmp_path}/nothing*.txt",
            "--vocab_size=800",
            f"--output_dir={tmp_path}/out",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert failed.returncode != 0 and "nothing*.txt" in failed.stderr and "Traceback" not in failed.stderr
    with pytest.raises(ValueError, match="vocab_size=5 leaves no room"):
        vocab_training.train_wordpiece(iter(["a b c"]), 5, tmp_path / "wp")
    with pytest.raises(ValueError, match="lower --vocab_size"):
        vocab_training.train_sentencepiece(iter(["tiny corpus"] * 10), 5000, tmp_path / "sp")


def test_sentencepiece_model_without_specials(tmp_path):
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(["hello world foo bar"] * 50),
        model_prefix=str(tmp_path / "plain"),
        vocab_size=15,
        minloglevel=2,
    )
    with pytest.raises(ValueError, match=r"plain\.model lacks the special token\(s\) \[PAD\] \[UNK\] \[CLS\]"):
        tokenization.load(tmp_path / "plain.model")


def test_a_tokenizer_json_saved_with_padding_and_truncation_is_read_without_them(minilm_dir, tmp_path):
    """sentence-transformers saves tokenizer.json with its padding and truncation on: read as they are, a batch's
    shorter texts got [PAD] ids as if they were text, and longer ones were cut."""
    import tokenizers

    saved = tokenizers.Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    saved.enable_padding()
    saved.enable_truncation(5)
    saved.save(str(tmp_path / "tokenizer.json"))
    ours = tokenization.load(tmp_path / "tokenizer.json")
    long, short = "the quick brown fox jumps over the lazy dog", "a"
    assert ours.encode_batch([long, short]) == [ours.encode(long), ours.encode(short)]
    assert len(ours.encode(long)) == 9 and ours.encode(short) == [1037]
