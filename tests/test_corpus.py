"""Tests of bertjax.data.corpus.sources: raw-text files, a locally built TFDS dataset, builtin:pydocs."""

import gzip
import hashlib
import inspect
import pathlib
import time

import pytest

from bertjax.data.corpus import sources as corpus
from bertjax.data.corpus.sources import CorpusStats, open_source, shard_units

TWO_DOCS = "First sentence.\nSecond sentence.\n\n\n  \nOther doc line one.\nOther doc line two.\n"
TWO_DOCS_EXPECTED = [["First sentence.", "Second sentence."], ["Other doc line one.", "Other doc line two."]]


def _write(path: pathlib.Path, data: str | bytes) -> str:
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return str(path)


# --------------------------------------------------------------------------------------------------
# Raw-text files
# --------------------------------------------------------------------------------------------------
def test_blank_lines_separate_documents(tmp_path):
    source = open_source(_write(tmp_path / "a.txt", TWO_DOCS + "\nThird doc, no newline at end"))
    assert list(source.documents()) == TWO_DOCS_EXPECTED + [["Third doc, no newline at end"]]
    stats = source.stats
    assert (stats.units, stats.documents, stats.sentences) == (1, 3, 5)
    assert (stats.lines, stats.empty_lines, stats.replaced_lines) == (9, 4, 0)


def test_gzip_file(tmp_path):
    source = open_source(_write(tmp_path / "a.txt.gz", gzip.compress(TWO_DOCS.encode())))
    assert list(source.documents()) == TWO_DOCS_EXPECTED


def test_glob_and_comma_list_sorted_and_deduplicated(tmp_path):
    for name in ("a2.txt", "a1.txt"):
        _write(tmp_path / name, f"From {name}.\n")
    _write(tmp_path / "b.txt.gz", gzip.compress(b"From b.\n"))
    spec = f"{tmp_path}/a*.txt, {tmp_path}/b.txt.gz,{tmp_path}/a1.txt"
    source = open_source(spec)
    assert [pathlib.Path(u).name for u in source.list_units()] == ["a1.txt", "a2.txt", "b.txt.gz"]
    assert list(source.documents()) == [["From a1.txt."], ["From a2.txt."], ["From b."]]


def test_documents_end_at_end_of_file(tmp_path):
    spec = ",".join(_write(tmp_path / f"{i}.txt", f"Line {i}.") for i in range(2))
    assert list(open_source(spec).documents()) == [["Line 0."], ["Line 1."]]


def test_non_utf8_bytes_are_replaced_and_counted(tmp_path):
    source = open_source(_write(tmp_path / "latin1.txt", b"caf\xe9 au lait.\nfine line.\n\xff\n"))
    assert list(source.documents()) == [["caf\ufffd au lait.", "fine line.", "\ufffd"]]
    assert source.stats.replaced_lines == 2


def test_empty_files_are_counted_and_skipped(tmp_path):
    spec = ",".join(
        [
            _write(tmp_path / "zero.txt", b""),
            _write(tmp_path / "blank.txt", "\n \n"),
            _write(tmp_path / "full.txt", TWO_DOCS),
        ]
    )
    source = open_source(spec)
    assert list(source.documents()) == TWO_DOCS_EXPECTED
    assert (source.stats.units, source.stats.empty_files) == (3, 2)


def test_5mb_single_line_is_cut_into_counted_pieces(tmp_path):
    line = "".join(f"word{i:07d}" for i in range(500_000))  # 5.5 MB, no newline, no space
    source = open_source(_write(tmp_path / "huge.txt", "Before.\n" + line + "\nAfter.\n"))
    (doc,) = list(source.documents())
    cap = corpus.DEFAULT_MAX_SENTENCE_CHARS  # no sentence end, no space: cut every cap characters
    assert doc[0] == "Before." and doc[-1] == "After."
    assert all(len(piece) <= cap for piece in doc)
    assert len(doc) == 2 + -(-len(line) // cap)
    assert "".join(doc[1:-1]) == line
    assert (source.stats.over_long_lines, source.stats.split_lines, source.stats.lines) == (1, 1, 3)


def test_over_long_line_is_cut_on_character_boundaries(tmp_path):
    line = "aé€😀" * 50  # 1-, 2-, 3- and 4-byte UTF-8 characters
    source = open_source(_write(tmp_path / "utf8.txt", line + "\nnext\n"), max_line_chars=7)
    (doc,) = list(source.documents())
    assert "".join(doc[:-1]) == line and doc[-1] == "next"
    assert source.stats.replaced_lines == 0 and source.stats.over_long_lines == 1


def test_missing_file_error_names_it(tmp_path):
    missing = str(tmp_path / "nope.txt")
    with pytest.raises(FileNotFoundError, match=r"--input_file '.*nope\.txt' does not exist"):
        open_source(missing)


def test_glob_without_match_error_names_pattern(tmp_path):
    _write(tmp_path / "real.txt", TWO_DOCS)
    with pytest.raises(FileNotFoundError, match=r"pattern '.*shard-\*\.txt' matches no files"):
        open_source(f"{tmp_path}/real.txt,{tmp_path}/shard-*.txt")


def test_reading_streams_one_document_at_a_time(tmp_path):
    docs = "".join(f"Document {i} first.\nDocument {i} second.\n\n" for i in range(400_000))
    source = open_source(_write(tmp_path / "big.txt", docs))  # ~18 MB
    stream = source.read(source.list_units())
    assert inspect.isgenerator(stream)
    start = time.perf_counter()
    assert next(stream) == ["Document 0 first.", "Document 0 second."]
    assert time.perf_counter() - start < 2.0
    assert source.stats.lines <= 3  # nothing past the first document was split into lines
    stream.close()


def test_min_sentences_drops_and_counts(tmp_path):
    source = open_source(_write(tmp_path / "a.txt", "Alone.\n\nOne.\nTwo.\n"), min_sentences=2)
    assert list(source.documents()) == [["One.", "Two."]]
    assert (source.stats.documents, source.stats.short_documents) == (1, 1)


def test_shard_units_is_a_disjoint_cover():
    units = [f"u{i}" for i in range(10)]
    shards = [shard_units(units, i, 3) for i in range(3)]
    assert sorted(sum(shards, [])) == sorted(units)
    assert shards[1] == ["u1", "u4", "u7"]
    with pytest.raises(ValueError, match="shard_index 3"):
        shard_units(units, 3, 3)


def test_stats_add():
    total = CorpusStats(documents=2, lines=5) + CorpusStats(documents=1, empty_files=1)
    assert (total.documents, total.lines, total.empty_files) == (3, 5, 1)


def test_unknown_builtin_is_an_error():
    with pytest.raises(ValueError, match="Unknown builtin corpus 'builtin:nope'"):
        open_source("builtin:nope")


def test_split_sentences_on_abbreviations_and_paragraphs():
    text = "Dr. Smith paid $3.50 for e.g. coffee. He left!\n\nA heading without stop\nwraps here."
    assert corpus.split_sentences(text) == [
        "Dr. Smith paid $3.50 for e.g. coffee.",
        "He left!",
        "A heading without stop wraps here.",
    ]


# --------------------------------------------------------------------------------------------------
# TFDS, through a builder defined here and prepared into a temporary data_dir
# --------------------------------------------------------------------------------------------------
NUM_EXAMPLES = 300


def _example_text(i: int) -> str:
    return f"Document {i} starts here. Dr. Smith wrote it.\n\nParagraph {i} has no full stop"


def _expected_doc(i: int) -> list[str]:
    return [f"Document {i} starts here.", "Dr. Smith wrote it.", f"Paragraph {i} has no full stop"]


@pytest.fixture(scope="module")
def tfds_data_dir(tmp_path_factory) -> str:
    tfds = pytest.importorskip("tensorflow_datasets")

    class BertjaxCorpusTestSet(tfds.core.GeneratorBasedBuilder):
        """Text documents made up by the test; nothing is downloaded."""

        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self,
                features=tfds.features.FeaturesDict({"text": tfds.features.Text(), "title": tfds.features.Text()}),
            )

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            for i in range(NUM_EXAMPLES):
                yield i, {"text": _example_text(i), "title": f"Title {i}"}

    data_dir = str(tmp_path_factory.mktemp("tfds"))
    BertjaxCorpusTestSet(data_dir=data_dir).download_and_prepare(
        download_config=tfds.download.DownloadConfig(num_shards=4)
    )
    return data_dir


def test_tfds_reads_all_documents_split_into_sentences(tfds_data_dir):
    source = open_source("tfds:bertjax_corpus_test_set:train", data_dir=tfds_data_dir)
    docs = list(source.documents())
    assert len(docs) == NUM_EXAMPLES
    assert sorted(docs) == sorted(_expected_doc(i) for i in range(NUM_EXAMPLES))
    assert (source.stats.units, source.stats.documents, source.stats.sentences) == (4, NUM_EXAMPLES, 3 * NUM_EXAMPLES)


def test_tfds_units_reproduce_the_whole_split(tfds_data_dir):
    source = open_source("tfds:bertjax_corpus_test_set", data_dir=tfds_data_dir)
    units = source.list_units()
    assert units == [f"train[{i}shard]" for i in range(4)]
    whole = list(source.read(units))
    per_shard = [list(source.read(shard_units(units, i, 2))) for i in range(2)]
    assert all(per_shard)
    assert sorted(per_shard[0] + per_shard[1]) == sorted(whole)
    assert [d for u in units for d in source.read([u])] == whole  # deterministic order


def test_tfds_other_text_feature(tfds_data_dir):
    source = open_source("tfds:bertjax_corpus_test_set:train[:5]", data_dir=tfds_data_dir, text_feature="title")
    assert source.list_units() == ["train[:5]"]
    assert all(len(doc) == 1 and doc[0].startswith("Title ") for doc in source.documents())
    with pytest.raises(ValueError, match="no feature 'body'.*'text', 'title'"):
        open_source("tfds:bertjax_corpus_test_set", data_dir=tfds_data_dir, text_feature="body")


def test_tfds_missing_dataset_error_names_data_dir_and_fix(tfds_data_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"not_a_dataset_zz.*data_dir.*tfds build"):
        open_source("tfds:not_a_dataset_zz:train", data_dir=tfds_data_dir)
    empty = str(tmp_path)
    with pytest.raises(FileNotFoundError, match=rf"not prepared in data_dir '{empty}'.*tfds_data_dir"):
        open_source("tfds:bertjax_corpus_test_set:train", data_dir=empty)


# --------------------------------------------------------------------------------------------------
# builtin:pydocs
# --------------------------------------------------------------------------------------------------
def _digest(source: corpus.Source) -> str:
    digest = hashlib.sha256()
    for doc in source.documents():
        digest.update("\x1e".join(doc).encode() + b"\x1d")
    return digest.hexdigest()


def test_pydocs_is_deterministic_and_big_enough():
    first, second = open_source("builtin:pydocs"), open_source("builtin:pydocs")
    assert first.list_units() == sorted(second.list_units())
    assert not any("/test/" in f"/{u}" or "/tests/" in f"/{u}" for u in first.list_units())
    assert _digest(first) == _digest(second)
    stats = first.stats
    assert stats == second.stats
    assert stats.documents > 300 and stats.sentences > 10_000 and stats.words > 100_000
    assert stats.short_documents > 0  # modules with fewer than 2 sentences were dropped, counted


def test_pydocs_documents_are_prose():
    source = open_source("builtin:pydocs")
    docs = list(source.read([u for u in source.list_units() if u in ("random.py", "textwrap.py")]))
    assert len(docs) == 2 and all(len(doc) >= 2 for doc in docs)
    sentences = [s for doc in docs for s in doc]
    assert not any(">>>" in s or "\n" in s or "  " in s for s in sentences)
    assert docs[0][0] == "Random variable generators."


def test_clean_docstring_drops_doctests_literal_blocks_and_code():
    doc = (
        "Frobnicate the widget.\n\n>>> frob(1)\n2\n\nUse it like this::\n\n"
        "    x = frob(y)[0]\n\n.. versionadded:: 3.2\n   Extra.\n\n"
        "x = {'a': 1, 'b': [2, 3]}\n=====  =====\nThe end."
    )
    assert corpus.clean_docstring(doc).split() == ("Frobnicate the widget. Use it like this: The end.").split()
