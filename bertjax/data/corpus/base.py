"""What every corpus source shares: `Source` (units, `read`, `split`), `CorpusStats`, sentence splitting, globs.

The sources themselves live in sources.py (raw text, TFDS, builtin:pydocs) and table.py (Parquet,
JSON Lines); `corpus.open_source` picks one from a spec. This module imports neither, so that each can
import it without a circle.
"""

from __future__ import annotations

import abc
import dataclasses
import glob
import io
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple, Optional

import sentencex

from bertjax.data.corpus import text_checks
from bertjax.runtime import files as file_layer
from bertjax.runtime.files import is_remote

Document = list[str]

# A line longer than this is read in pieces (counted in `over_long_lines`), so memory stays bounded, and
# cut into sentences (text_checks.cut_sentences; counted in `split_lines`) of at most
# DEFAULT_MAX_SENTENCE_CHARS, ~250 tokens, so that its text fits instances instead of being truncated to
# one. A shorter line stays one sentence, as in google-research/bert.
DEFAULT_MAX_LINE_CHARS = 100_000
DEFAULT_MAX_SENTENCE_CHARS = 1_000

_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n")


@dataclasses.dataclass
class CorpusStats:
    """What a source read, skipped, replaced or cut; `a + b` merges the stats of two workers."""

    units: int = 0  # units read: text files, TFDS shards, stdlib .py files, row groups, JSON Lines files
    empty_files: int = 0  # text, Parquet or JSON Lines files with no text (no bytes, no rows, blank lines only)
    unparsable_files: int = 0  # pydocs: .py files that `ast` cannot parse: skipped
    documents: int = 0  # documents yielded
    sentences: int = 0  # sentences in the yielded documents
    words: int = 0  # whitespace-separated words in the yielded documents
    lines: int = 0  # text-file lines read, blank ones included
    empty_lines: int = 0  # blank text-file lines (document separators)
    replaced_lines: int = 0  # lines (TFDS: texts) with non-UTF-8 bytes, decoded to U+FFFD
    over_long_lines: int = 0  # lines or sentences over max_line_chars: read in pieces
    split_lines: int = 0  # lines or sentences over max_line_chars: cut into sentences
    short_documents: int = 0  # documents with fewer than min_sentences sentences: dropped
    # Parquet and JSON Lines (table.py): one document per row; the rows that hold none are skipped.
    rows: int = 0  # Parquet rows and JSON lines read, blank lines excepted
    empty_texts: int = 0  # rows whose text is null, empty or blank
    missing_texts: int = 0  # JSON objects without the text field
    non_string_texts: int = 0  # JSON objects whose text field is not a string (a number, a list, ...)
    non_object_lines: int = 0  # JSON lines that hold no object (a list, a string, a number)
    bad_json_lines: int = 0  # lines that are not JSON, with skip_bad_json_lines (else they stop the read)
    # The five counters above per file, for the files that have any: {path: {counter: n}}.
    skipped_by_file: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)

    def __add__(self, other: CorpusStats) -> CorpusStats:
        merged = {
            f.name: getattr(self, f.name) + getattr(other, f.name)
            for f in dataclasses.fields(self)
            if f.name != "skipped_by_file"
        }
        by_file = {path: dict(counts) for path, counts in self.skipped_by_file.items()}
        for path, counts in other.skipped_by_file.items():
            mine = by_file.setdefault(path, {})
            for key, n in counts.items():
                mine[key] = mine.get(key, 0) + n
        return CorpusStats(**merged, skipped_by_file=by_file)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def split_sentences(text: str, language: str = "en") -> list[str]:
    """Splits at paragraph breaks (blank lines), then into sentences; whitespace is collapsed."""
    sentences = []
    for paragraph in _PARAGRAPH_BREAK.split(text):
        paragraph = " ".join(paragraph.split())
        if paragraph:
            for sentence in sentencex.segment(language, paragraph):
                sentence = " ".join(sentence.split())
                if sentence:
                    sentences.append(sentence)
    return sentences


def shard_units(units: Sequence[Any], shard_index: int, num_shards: int) -> list[Any]:
    """Round-robin assignment of units to shards: disjoint, covering, the same on every host."""
    if not 0 <= shard_index < num_shards:
        raise ValueError(f"shard_index {shard_index} must be in [0, num_shards={num_shards}).")
    return list(units[shard_index::num_shards])


class FileRange(NamedTuple):
    """A part of a raw-text file, cut at document boundaries without reading the file to find them.

    It holds the lines from the first blank line starting at or after byte `start` (from the top of
    the file when start is 0) up to, not including, the first blank line starting at or after byte
    `end` (the end of the file when end is None). Ranges that tile a file's bytes therefore tile its
    lines and documents exactly: each is read once, by one range, whatever reads the others.
    """

    path: str
    start: int = 0
    end: Optional[int] = None


def expand_patterns(patterns: str | Iterable[str], what: str = "--input_file") -> list[str]:
    """Comma-separated globs (or a list of them) → files, each glob's matches sorted, duplicates dropped.

    Local paths are globbed by Python; `gs://` URLs by the file layer (runtime/files.py, gcsfs).
    A glob that matches nothing or a path that does not exist is one clear error naming it.
    """
    if isinstance(patterns, str):
        names = [name.strip() for name in patterns.split(",") if name.strip()]
    else:
        names = [str(name).strip() for name in patterns if str(name).strip()]
    if not names:
        raise ValueError(f"{what} {patterns!r} names no file: give a path, a glob or a comma-separated list of them.")
    files: dict[str, None] = {}
    for name in names:
        if is_remote(name):
            matches = [m for m in file_layer.glob(name) if not file_layer.isdir(m)]
        else:
            matches = sorted(m for m in glob.glob(name) if not os.path.isdir(m))
        if not matches:
            if not is_remote(name) and os.path.isdir(name):
                raise IsADirectoryError(
                    f"{what} {name!r} is a directory: name its files, e.g. {os.path.join(name, '*.txt')!r}."
                )
            if set(name) & set("*?["):
                raise FileNotFoundError(
                    f"{what} pattern {name!r} matches no files: check the directory and "
                    "the pattern (quote it so that the shell does not expand it)."
                )
            raise FileNotFoundError(
                f"{what} {name!r} does not exist: check the path, or "
                "pass a glob or a comma-separated list of existing files."
            )
        files.update(dict.fromkeys(matches))
    return list(files)


class Source(abc.ABC):
    """A corpus cut into named units; documents stream from `read`, counters go to `stats`."""

    def __init__(self, min_sentences: int, max_line_chars: int, max_sentence_chars: int = DEFAULT_MAX_SENTENCE_CHARS):
        if max_line_chars < 4:
            raise ValueError(f"max_line_chars must be at least 4, got {max_line_chars}.")
        if max_sentence_chars < 1:
            raise ValueError(f"max_sentence_chars must be at least 1, got {max_sentence_chars}.")
        self.min_sentences = min_sentences
        self.max_line_chars = max_line_chars
        # No larger than max_line_chars: what an over-long line carries from piece to piece stays bounded.
        self.max_sentence_chars = min(max_sentence_chars, max_line_chars)
        self.stats = CorpusStats()

    @abc.abstractmethod
    def list_units(self) -> list[str]:
        """All units of the corpus in a deterministic order; cheap: no unit is read."""

    @abc.abstractmethod
    def _read_unit(self, unit: Any, stats: CorpusStats) -> Iterator[Document]:
        """Documents of one unit, before the min_sentences filter."""

    def split(self, num_shards: int) -> Optional[list[list[Any]]]:
        """Disjoint work for each of `num_shards` shards that covers the corpus, the same on every
        host; None when the corpus has fewer units than shards and cannot be cut finer."""
        units = self.list_units()
        if len(units) < num_shards:
            return None
        return [shard_units(units, k, num_shards) for k in range(num_shards)]

    def read(self, units: Iterable[Any], stats: CorpusStats | None = None) -> Iterator[Document]:
        """Streams the documents of `units` in order; counts into `stats` (default self.stats)."""
        stats = self.stats if stats is None else stats
        for unit in units:
            if not getattr(unit, "start", 0):  # a file (row group) counts once: by its range that starts it
                stats.units += 1
            for doc in self._read_unit(unit, stats):
                if len(doc) < self.min_sentences:
                    stats.short_documents += 1
                    continue
                stats.documents += 1
                stats.sentences += len(doc)
                stats.words += sum(len(s.split()) for s in doc)
                yield doc

    def documents(self) -> Iterator[Document]:
        """Streams the whole corpus: `read(list_units())`."""
        return self.read(self.list_units())

    def _cap(self, sentences: Iterable[str], stats: CorpusStats) -> Iterator[str]:
        """Cuts sentences longer than max_line_chars into sentences of at most max_sentence_chars (counted);
        shorter ones stay whole, as a raw-text line that fits one read does."""
        for sentence in sentences:
            if len(sentence) <= self.max_line_chars:
                yield sentence
                continue
            stats.split_lines += 1
            stats.over_long_lines += 1
            yield from text_checks.cut_sentences(sentence, self.max_sentence_chars)[0]


def file_size(path: str) -> int:
    return file_layer.filesystem(path).size(path) if is_remote(path) else os.path.getsize(path)


def open_binary(path: str, offset: int) -> Any:
    """A buffered binary stream positioned at `offset` (an object's read in 8 MB ranges; io.BufferedReader
    gives it the readline(limit) that fsspec's files lack)."""
    if not is_remote(path):
        f = open(path, "rb", buffering=1 << 20)
        if offset:
            f.seek(offset)
        return f
    remote = file_layer.filesystem(path).open(path, "rb", block_size=8 << 20)
    if offset:
        remote.seek(offset)
    return io.BufferedReader(remote, buffer_size=1 << 20)
