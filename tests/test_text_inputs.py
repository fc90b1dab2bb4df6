"""Text is text (issue 32): a corpus file that is not text fails in one sentence naming it, and a line
with no newline for megabytes is cut into sentences that fit an instance instead of being truncated away."""

import gzip
import io
import os
import pathlib
import random
import subprocess
import sys

import pytest

from bertjax.data.corpus import sources as corpus_lib
from bertjax.data.pretraining import instances
from bertjax.data.pretraining import shards as shards_lib
from bertjax.jobs import prepare as prepare_job
from bertjax.data.corpus import text_checks
from bertjax.data.corpus.text_checks import NotTextError, cut_sentences

REPO = pathlib.Path(__file__).resolve().parents[1]
FRENCH = "Le café crème est très apprécié à Noël. Où est l'élève ? Il a déjà mangé à la maison.\n"


def read_all(path) -> list[list[str]]:
    return list(corpus_lib.open_source(str(path)).documents())


def one_sentence(excinfo: pytest.ExceptionInfo, path, words: str) -> str:
    message = str(excinfo.value)
    assert "\n" not in message and message.startswith(f"{path} is not ") and words in message, message
    return message


# --- Files that are not text ----------------------------------------------------------------------
def test_a_binary_is_refused_in_one_sentence():
    with pytest.raises(NotTextError) as e:
        read_all(sys.executable)  # an executable: NUL bytes in its first block
    one_sentence(e, sys.executable, "is not text (NUL bytes in the first 64 KiB of it)")


def test_random_bytes_are_refused_with_or_without_nul_bytes(tmp_path):
    noise = os.urandom(200_000)
    (tmp_path / "noise.txt").write_bytes(noise)
    (tmp_path / "no_nul.txt").write_bytes(noise.replace(b"\0", b"\1"))
    with pytest.raises(NotTextError) as e:
        read_all(tmp_path / "noise.txt")
    one_sentence(e, tmp_path / "noise.txt", "NUL bytes")
    with pytest.raises(NotTextError) as e:
        read_all(tmp_path / "no_nul.txt")
    assert "re-encode it as UTF-8" in one_sentence(e, tmp_path / "no_nul.txt", "are not UTF-8")


def test_gzip_files_are_checked_on_their_decompressed_bytes(tmp_path):
    (tmp_path / "noise.txt.gz").write_bytes(gzip.compress(os.urandom(100_000)))
    with pytest.raises(NotTextError) as e:
        read_all(tmp_path / "noise.txt.gz")
    one_sentence(e, tmp_path / "noise.txt.gz", "the first 64 KiB it decompresses to")
    (tmp_path / "text.txt.gz").write_bytes(gzip.compress(FRENCH.encode() * 2000))  # gzip itself is not text
    assert len(read_all(tmp_path / "text.txt.gz")[0]) == 2000


def test_utf16_and_legacy_code_pages_are_refused_but_a_few_bad_bytes_are_read(tmp_path):
    (tmp_path / "utf16.txt").write_bytes(FRENCH.encode("utf-16") * 100)
    (tmp_path / "cp1251.txt").write_bytes("Москва — столица России.\n".encode("cp1251") * 100)
    (tmp_path / "latin1.txt").write_bytes(FRENCH.encode("latin-1") * 2000)  # ~170 KB, ~6% of bytes bad
    with pytest.raises(NotTextError) as e:
        read_all(tmp_path / "utf16.txt")
    one_sentence(e, tmp_path / "utf16.txt", "NUL bytes")
    with pytest.raises(NotTextError) as e:
        read_all(tmp_path / "cp1251.txt")
    one_sentence(e, tmp_path / "cp1251.txt", "are not UTF-8")
    source = corpus_lib.open_source(str(tmp_path / "latin1.txt"))
    (doc,) = list(source.documents())
    assert len(doc) == 2000 and doc[0].startswith("Le caf\ufffd cr\ufffdme")
    assert source.stats.replaced_lines == 2000


def test_the_head_check_threshold():
    text_checks.check_text_head("ok.txt", b"caf\xe9 " * 1000)  # 20% undecodable: read, counted later
    with pytest.raises(NotTextError, match=r"^bad\.txt is not UTF-8 text \(40% of the bytes"):
        text_checks.check_text_head("bad.txt", b"\xe9\xe9abc" * 1000)


def test_a_binary_through_prepare_and_its_command(tmp_path, minilm_dir):
    binary = tmp_path / "data.bin"
    binary.write_bytes(pathlib.Path(sys.executable).read_bytes())
    cfg = shards_lib.PrepareConfig(
        input_file=str(binary),
        output_dir=str(tmp_path / "out"),
        vocab_file=str(minilm_dir / "vocab.txt"),
        num_shards=3,
        instance=instances.InstanceConfig(max_seq_length=64, dupe_factor=1),
    )
    with pytest.raises(NotTextError) as e:  # split into 3 byte ranges: the one at byte 0 checks the file
        prepare_job.prepare(cfg, progress_stream=io.StringIO())
    one_sentence(e, binary, "NUL bytes")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bertjax.prepare",
            f"--input_file={binary}",
            f"--output_dir={tmp_path}/cli",
            f"--vocab_file={minilm_dir / 'vocab.txt'}",
            "--num_shards=1",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("prepare: error:")]
    assert len(errors) == 1 and errors[0].startswith(f"prepare: error: {binary} is not text"), done.stderr
    assert not (tmp_path / "cli" / "metadata.json").exists()


# --- Over-long lines ------------------------------------------------------------------------------
def test_cut_sentences_at_sentence_ends_then_whitespace_then_anywhere():
    assert cut_sentences("One. Two! Three?  “Four.” Five", 100) == (["One.", "Two!", "Three?", "“Four.”", "Five"], "")
    assert cut_sentences("aaa bbb ccc ddd", 8) == (["aaa bbb", "ccc ddd"], "")
    assert cut_sentences("abcdefghij", 4) == (["abcd", "efgh", "ij"], "")
    assert cut_sentences("第一句。第二句。", 100) == (["第一句。", "第二句。"], "")
    assert cut_sentences("Done. and a half-wri", 100, final=False) == (["Done."], "and a half-wri")


def test_an_over_long_line_keeps_its_words_whole_across_pieces(tmp_path):
    words = [f"w{i}" for i in range(3000)]
    line = " ".join(words)  # no sentence end; read in pieces of 50 bytes that cut words in two
    (tmp_path / "a.txt").write_text(line + "\nAfter.\n")
    source = corpus_lib.open_source(str(tmp_path / "a.txt"), max_line_chars=50, max_sentence_chars=30)
    (doc,) = list(source.documents())
    assert " ".join(doc).split() == words + ["After."]  # no word cut in two, none lost
    assert all(len(s) <= 30 for s in doc) and len(doc) > len(line) // 30
    assert (source.stats.over_long_lines, source.stats.split_lines, source.stats.lines) == (1, 1, 2)
    (tmp_path / "b.txt").write_text(line[:1000])  # no newline: the file ends at the cut of its 20th piece
    source = corpus_lib.open_source(str(tmp_path / "b.txt"), max_line_chars=50, max_sentence_chars=30)
    assert " ".join(s for doc in source.documents() for s in doc) == line[:1000].strip()


def test_lines_that_fit_one_read_stay_whole_as_in_google_bert(tmp_path):
    # Records equal google-research/bert's for any corpus whose lines fit one read (max_line_chars): a
    # 2,000-character line stays one sentence, and only a longer line is cut into sentences.
    short, long = "Dr. Who went home. " * 105, "Dr. Who went home. " * 106  # 1,995 and 2,014 characters
    (tmp_path / "a.txt").write_text(f"{short}\n{long}\n")
    source = corpus_lib.open_source(str(tmp_path / "a.txt"), max_line_chars=2_000)
    (doc,) = list(source.documents())
    assert doc[0] == short.strip() and doc[1:] == ["Dr.", "Who went home."] * 106
    assert (source.stats.split_lines, source.stats.over_long_lines) == (1, 1)


def test_over_long_sentences_of_segmented_sources_are_cut_too():
    source = corpus_lib.TfdsSource.__new__(corpus_lib.TfdsSource)  # _cap is the Source's: no dataset needed
    corpus_lib.Source.__init__(source, 1, 2_000)
    stats = corpus_lib.CorpusStats()
    cut = list(source._cap(["short one.", "x" * 1_900, "x" * 2_500], stats))
    assert cut == ["short one.", "x" * 1_900, "x" * 1000, "x" * 1000, "x" * 500]
    assert (stats.split_lines, stats.over_long_lines) == (1, 1)


def _prepare(path: pathlib.Path, out: pathlib.Path, vocab: pathlib.Path) -> dict:
    cfg = shards_lib.PrepareConfig(
        input_file=str(path),
        output_dir=str(out),
        vocab_file=str(vocab),
        num_shards=1,
        instance=instances.InstanceConfig(
            max_seq_length=128, max_predictions_per_seq=20, dupe_factor=1, next_sentence_prediction=False
        ),
    )
    return prepare_job.prepare(cfg, progress_stream=io.StringIO())


def test_a_3mb_line_without_newline_keeps_its_tokens(tmp_path, minilm_dir):
    """Before: 100k-character pieces of ~25k tokens each, truncated to one instance: ~1% of the tokens kept."""
    vocab = minilm_dir / "vocab.txt"
    words = [w for w in vocab.read_text(encoding="utf-8").splitlines() if w.isascii() and w.isalpha() and len(w) > 2]
    rng = random.Random(0)
    sentences, size = [], 0
    while size < 3_000_000:
        sentences.append(" ".join(rng.choice(words) for _ in range(rng.randint(4, 8))).capitalize() + ".")
        size += len(sentences[-1]) + 1
    (tmp_path / "line.txt").write_text(" ".join(sentences), encoding="utf-8")
    (tmp_path / "lines.txt").write_text("\n".join(sentences), encoding="utf-8")
    one_line = _prepare(tmp_path / "line.txt", tmp_path / "out_line", vocab)
    c = one_line["counts"]
    assert c["sentences"] == len(sentences) and one_line["corpus"]["split_lines"] == 1
    assert (c["real_tokens"] - 2 * c["instances"]) / c["tokens"] >= 0.95  # [CLS] and [SEP] are not corpus tokens
    # The same sentences one per line, as BERT's format has them, make the same instances.
    assert _prepare(tmp_path / "lines.txt", tmp_path / "out_lines", vocab)["counts"] == c
