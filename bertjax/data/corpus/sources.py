"""Document sources for pre-training data: BERT raw-text files, TFDS datasets and `builtin:pydocs`; and
`open_source`, which also opens Parquet and JSON Lines corpora (table.py).

A document is a list of sentences (str). Every source is opened from one spec string and exposes
work *units* (files, TFDS shards, stdlib `.py` files) so that `prepare` can hand disjoint units to
parallel workers deterministically; `read(units)` streams documents one at a time, never the whole
corpus. Whatever is skipped, replaced or cut is counted in a `CorpusStats`, so nothing is dropped
silently.

    source = open_source("data/*.txt.gz,more/part-*")     # BERT raw-text files (gs:// works too)
    source = open_source("tfds:wikipedia/20230601.en:train", data_dir="/data/tfds")
    source = open_source("builtin:pydocs")                # stdlib docstrings, fully offline
    source = open_source("web/*.parquet,more/*.jsonl.zst", text_field="text")  # one document per row
    for doc in source.read(shard_units(source.list_units(), shard_index=0, num_shards=8)):
        ...
    print(source.stats)

TFDS and pydocs text is cut into sentences by `sentencex` (Wikimedia's rule-based segmenter, a Rust
extension): offline, ~30 MB/s, as good as pysbd on abbreviations and ~300x faster.
"""

from __future__ import annotations

import ast
import bisect
import gzip
import logging
import os
import sysconfig
import zlib
from collections.abc import Iterator
from typing import Any, Optional

from bertjax.data.corpus import hf_datasets, table as table_corpus, text_checks

# The shared pieces live in base.py (table.py imports them too); re-exported: callers use corpus.X.
from bertjax.data.corpus.base import (  # noqa: F401
    DEFAULT_MAX_LINE_CHARS,
    DEFAULT_MAX_SENTENCE_CHARS,
    CorpusStats,
    Document,
    FileRange,
    Source,
    file_size,
    open_binary,
    expand_patterns,
    shard_units,
    split_sentences,
)

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------------
# BERT raw-text files
# --------------------------------------------------------------------------------------------------
class TextSource(Source):
    """google-research/bert raw text: one sentence per line, a blank line between documents.

    Units are files (globs expanded when opened, each glob's matches sorted). A document also ends
    at the end of its file (the reference tool lets it run on into the next file), so documents
    never straddle units. Lines are stripped; bytes that are not UTF-8 become U+FFFD (the line is
    counted in `replaced_lines`), but a file whose first 64 KiB hold NUL bytes or mostly non-UTF-8
    bytes is refused (text_checks.NotTextError). A line longer than `max_line_chars` bytes is read in
    pieces of at most that many bytes, cut on a character boundary, so memory stays bounded whatever
    the line length (counted once in `over_long_lines`); a line longer than `max_sentence_chars` is
    cut into sentences of at most that many characters (counted once in `split_lines`).

    `split` cuts the files into byte ranges (`FileRange`) of equal size, so that one big file
    spreads over all shards and every byte is read by one shard only; `.gz` files stay whole.
    """

    def __init__(
        self,
        patterns: str,
        min_sentences: int = 1,
        max_line_chars: int = DEFAULT_MAX_LINE_CHARS,
        what: str = "--input_file",
        max_sentence_chars: int = DEFAULT_MAX_SENTENCE_CHARS,
    ):
        super().__init__(min_sentences, max_line_chars, max_sentence_chars)
        self._files = expand_patterns(patterns, what)

    def list_units(self) -> list[str]:
        return list(self._files)

    def split(self, num_shards: int) -> list[list[Any]]:
        """The files as one byte stream cut into `num_shards` equal spans: shard k reads the ranges
        of the files in its span. A `.gz` or empty file goes whole to the span holding its middle."""
        sizes = [file_size(f) for f in self._files]
        total = sum(sizes)
        bounds = [total * k // num_shards for k in range(num_shards + 1)]
        work: list[list[Any]] = [[] for _ in range(num_shards)]
        offset = 0
        for path, size in zip(self._files, sizes):
            if size == 0 or path.endswith(".gz"):
                k = min(bisect.bisect_right(bounds, offset + size // 2) - 1, num_shards - 1)
                work[k].append(FileRange(path))
            else:
                first = bisect.bisect_right(bounds, offset) - 1
                for k in range(first, num_shards):
                    lo, hi = max(bounds[k], offset), min(bounds[k + 1], offset + size)
                    if lo >= offset + size:
                        break
                    if lo < hi:
                        work[k].append(FileRange(path, lo - offset, None if hi == offset + size else hi - offset))
            offset += size
        return work

    def _read_unit(self, unit: Any, stats: CorpusStats) -> Iterator[Document]:
        part = unit if isinstance(unit, FileRange) else FileRange(unit)
        try:
            yield from self._read_range(part, stats)
        except (gzip.BadGzipFile, EOFError, zlib.error) as e:  # only a .gz stream raises these
            raise ValueError(
                f"{part.path} is not a readable gzip file ({e}); re-compress it with gzip, or "
                "drop the .gz from the name of a plain-text file."
            ) from None

    def _read_range(self, part: FileRange, stats: CorpusStats) -> Iterator[Document]:
        if part.start == 0:  # once per file: one range of each file starts at byte 0
            gz = part.path.endswith(".gz")
            with open_binary(part.path, 0) as raw, gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw as f:
                text_checks.check_text_head(part.path, f.read(text_checks.SNIFF_BYTES), decompressed=gz)
        with open_binary(part.path, part.start - 1 if part.start else 0) as raw:
            if part.path.endswith(".gz"):
                if part.start or part.end is not None:
                    raise ValueError(f"{part.path}: a gzip file can only be read whole, not from byte {part.start}.")
                stream: Any = gzip.GzipFile(fileobj=raw, mode="rb")
            else:
                stream = raw
            pieces = self._pieces(stream, part.start - 1 if part.start else 0)
            if part.start:  # Move to the first document boundary at or after `start`.
                for line_start, text, cut, _ in pieces:
                    if line_start is not None and line_start >= part.start and not (cut or text):
                        break
                else:
                    return  # no boundary left: the lines here belong to an earlier range
                if part.end is not None and line_start >= part.end:
                    return  # a document longer than the range covers it: nothing starts here
                stats.lines += 1
                stats.empty_lines += 1
            doc: Document = []
            has_text = False
            max_chars = self.max_sentence_chars
            rest = ""  # an over-long line's text after its last cut: goes in front of its next piece
            for line_start, text, cut, replaced in pieces:
                # A line that fits one read (max_line_chars) stays one sentence, as in google-research/bert;
                # only a longer one is cut into sentences, which would otherwise be truncated to one instance.
                whole = line_start is not None and not cut
                if line_start is not None:
                    if part.end is not None and line_start >= part.end and not (cut or text):
                        break  # the next range starts at this blank line
                    stats.lines += 1
                    if not whole:
                        stats.over_long_lines += cut
                        stats.split_lines += 1
                if replaced:
                    stats.replaced_lines += 1
                if not whole:
                    sentences, rest = text_checks.cut_sentences(rest + text, max_chars, final=not cut)
                    doc.extend(sentences)
                    has_text = has_text or bool(sentences)
                elif text:
                    doc.append(text)
                    has_text = True
                else:  # a blank line ends the document
                    stats.empty_lines += 1
                    if doc:
                        yield doc
                        doc = []
            if rest:  # the file ended in an over-long line, exactly at a cut
                doc.extend(text_checks.cut_sentences(rest, max_chars)[0])
            if doc:
                yield doc
            if part.start == 0 and not has_text:
                # The file is empty only if the ranges after this one hold no text either.
                if part.end is None or not any(text.strip() for _, text, _, _ in pieces):
                    stats.empty_files += 1

    def _pieces(self, stream: Any, position: int) -> Iterator[tuple[Optional[int], str, bool, bool]]:
        """(line_start, text, cut, replaced) per piece of a line: line_start is the byte offset where
        the line starts (None for the later pieces of an over-long line), text the piece (stripped,
        unless it is part of an over-long line: whitespace at a cut matters when the pieces are joined),
        cut whether the line goes on in the next piece, replaced whether bytes were not UTF-8."""
        cap = self.max_line_chars
        carry = b""  # start of a character cut off at the end of the previous piece
        continued = False  # the previous piece was cut: this one continues its line
        while True:
            piece_start = position - len(carry)
            chunk = stream.readline(cap - len(carry))
            position += len(chunk)
            data = carry + chunk
            carry = b""
            if not data:
                return
            cut = len(data) >= cap and not data.endswith(b"\n")
            if cut:
                tail = text_checks.incomplete_utf8_tail(data)
                if tail:
                    data, carry = data[:-tail], data[-tail:]
            try:
                text, replaced = data.decode("utf-8"), False
            except UnicodeDecodeError:
                text, replaced = data.decode("utf-8", errors="replace"), True
            if not (cut or continued):
                text = text.strip()
            yield (None if continued else piece_start), text, cut, replaced
            continued = cut


# --------------------------------------------------------------------------------------------------
# TFDS datasets
# --------------------------------------------------------------------------------------------------
class TfdsSource(Source):
    """A prepared TFDS dataset, one document per example; units are the split's shards.

    Units are TFDS split strings `SPLIT[Ishard]`, read without shuffling, so reading all units in
    order gives the split in file order. A split given with a slice (`train[:10%]`) is one unit.
    The text feature is cut into sentences at blank lines and by `split_sentences`.
    """

    def __init__(
        self,
        name: str,
        split: str = "train",
        data_dir: str | None = None,
        text_feature: str = "text",
        language: str = "en",
        min_sentences: int = 1,
        max_line_chars: int = DEFAULT_MAX_LINE_CHARS,
        max_sentence_chars: int = DEFAULT_MAX_SENTENCE_CHARS,
    ):
        super().__init__(min_sentences, max_line_chars, max_sentence_chars)
        import tensorflow_datasets as tfds  # Deferred: heavy, and only this source needs it.

        self.name, self.split = name, split
        self.text_feature, self.language = text_feature, language
        where = f"data_dir {data_dir!r}" if data_dir else "the default TFDS data_dir"
        fix = (
            f"run `tfds build {name.split('/')[0]} --data_dir=DIR` (or copy a prepared copy "
            "there) and pass --tfds_data_dir=DIR."
        )
        try:
            self._builder = tfds.builder(name, data_dir=data_dir)
        except tfds.core.registered.DatasetNotFoundError:
            raise FileNotFoundError(
                f"TFDS dataset {name!r} is neither registered nor prepared in {where}: {fix}"
            ) from None
        if not self._builder.is_prepared():
            raise FileNotFoundError(
                f"TFDS dataset {name!r} is not prepared in {where} (no {self._builder.data_dir}): {fix}"
            )
        info = self._builder.info
        split_name = split.split("[", 1)[0]
        if split_name not in info.splits:
            raise ValueError(f"TFDS dataset {name!r} has no split {split_name!r}: use one of {sorted(info.splits)}.")
        if text_feature not in info.features:
            raise ValueError(
                f"TFDS dataset {name!r} has no feature {text_feature!r}: pass "
                f"--text_field (config.data.text_field) one of {sorted(info.features)}."
            )
        self._num_shards = 1 if "[" in split else info.splits[split].num_shards

    def list_units(self) -> list[str]:
        if "[" in self.split:
            return [self.split]
        return [f"{self.split}[{i}shard]" for i in range(self._num_shards)]

    def _read_unit(self, unit: str, stats: CorpusStats) -> Iterator[Document]:
        import tensorflow_datasets as tfds

        dataset = self._builder.as_dataset(
            split=unit, shuffle_files=False, decoders=tfds.decode.PartialDecoding({self.text_feature: True})
        )
        for example in dataset.as_numpy_iterator():
            text = example[self.text_feature]
            if isinstance(text, bytes):
                try:
                    text = text.decode("utf-8")
                except UnicodeDecodeError:
                    text = text.decode("utf-8", errors="replace")
                    stats.replaced_lines += 1
            yield list(self._cap(split_sentences(text, self.language), stats))


# --------------------------------------------------------------------------------------------------
# builtin:pydocs — docstrings of the installed Python standard library
# --------------------------------------------------------------------------------------------------
_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test", "lib-dynload"})
_DOC_NODES = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
_BODY_FIELDS = ("body", "orelse", "finalbody", "handlers", "cases")  # fields holding statements
_RULE_CHARS = frozenset("=-~^*+#|_:. ")


def _is_code_or_table(line: str) -> bool:
    """Heuristic: prose is mostly letters and spaces; code, tables and rules are not."""
    if set(line) <= _RULE_CHARS or line.startswith(("|", "+-", "+=")):
        return True
    prose = sum(c.isalpha() or c.isspace() for c in line)
    return prose < 0.75 * len(line)


def clean_docstring(doc: str) -> str:
    """Keeps a docstring's prose: drops doctests, `::` literal blocks, reST directives, code."""
    kept: list[str] = []
    in_doctest = False  # after a `>>>` prompt: its output runs to the next blank line
    block_indent: int | None = None  # indentation of the line that opened a literal block
    for line in doc.splitlines():
        stripped = line.strip()
        if not stripped:
            in_doctest = False
            kept.append("")
            continue
        indent = len(line) - len(line.lstrip())
        if block_indent is not None:
            if indent > block_indent:
                continue
            block_indent = None
        if in_doctest or stripped.startswith(">>>"):
            in_doctest = True
            continue
        if stripped.startswith(".. "):
            block_indent = indent
            continue
        if stripped.endswith("::"):
            block_indent = indent
            stripped = stripped[:-1]
            if stripped == ":":
                continue
        if not _is_code_or_table(stripped):
            kept.append(stripped)
    return "\n".join(kept)


def _doc_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Module, classes and functions in source order; descends statements only (ast.walk also
    visits every expression, which makes reading the stdlib three times slower)."""
    if isinstance(node, _DOC_NODES):
        yield node
    for field in _BODY_FIELDS:
        for child in getattr(node, field, ()):
            yield from _doc_nodes(child)


class PyDocsSource(Source):
    """Docstrings of the standard library's `.py` files, parsed with `ast` (nothing is imported).

    One document per module: the module docstring, then every class and function docstring in
    source order. Single docstrings are mostly one or two sentences, too short for next-sentence
    prediction; a module keeps to one topic over many sentences. Units are the `.py` paths relative
    to the stdlib directory, sorted; test suites are skipped. The corpus is deterministic for one
    Python version and differs between versions.
    """

    def __init__(
        self,
        root: str | None = None,
        language: str = "en",
        min_sentences: int = 2,
        max_line_chars: int = DEFAULT_MAX_LINE_CHARS,
        max_sentence_chars: int = DEFAULT_MAX_SENTENCE_CHARS,
    ):
        super().__init__(min_sentences, max_line_chars, max_sentence_chars)
        self.root = root or sysconfig.get_paths()["stdlib"]
        self.language = language
        if not os.path.isdir(self.root):
            raise FileNotFoundError(
                f"Python standard library directory {self.root!r} does not "
                "exist: builtin:pydocs needs a Python with its .py sources."
            )

    def list_units(self) -> list[str]:
        units = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
            rel = os.path.relpath(dirpath, self.root).replace(os.sep, "/")
            for filename in filenames:
                if filename.endswith(".py") and not filename.startswith("test_"):
                    units.append(filename if rel == "." else f"{rel}/{filename}")
        return sorted(units)

    def _read_unit(self, unit: str, stats: CorpusStats) -> Iterator[Document]:
        with open(os.path.join(self.root, unit), "rb") as f:
            source = f.read()
        try:
            tree = ast.parse(source, filename=unit)
        except (SyntaxError, ValueError, UnicodeDecodeError, RecursionError):
            stats.unparsable_files += 1
            return
        doc: Document = []
        for node in _doc_nodes(tree):
            docstring = ast.get_docstring(node, clean=True)
            if docstring:
                sentences = split_sentences(clean_docstring(docstring), self.language)
                doc.extend(self._cap(sentences, stats))
        yield doc


# --------------------------------------------------------------------------------------------------
# Spec → source
# --------------------------------------------------------------------------------------------------
BUILTIN_CORPORA = ("builtin:pydocs",)


def open_source(
    spec: str,
    *,
    data_dir: str | None = None,
    text_field: str = "text",
    text_feature: str = "text",
    language: str = "en",
    min_sentences: int | None = None,
    max_line_chars: int = DEFAULT_MAX_LINE_CHARS,
    what: str = "--input_file",
    max_sentence_chars: int = DEFAULT_MAX_SENTENCE_CHARS,
    skip_bad_json_lines: bool = False,
) -> Source:
    """Opens the corpus a spec names; fails here, in one clear sentence, if it cannot be read.

    spec: `tfds:NAME[/CONFIG][:SPLIT]` (SPLIT defaults to train; `data_dir` is --tfds_data_dir),
      `builtin:pydocs`, Parquet / JSON Lines files (`.parquet`, `.jsonl`, `.json`, `.jsonl.gz`,
      `.json.gz`, `.jsonl.zst`, `.arrow`: table.TableSource, one document per row), `hf:DIR[:SPLIT]`
      (a Hugging Face dataset directory: hf_datasets.py), or else BERT raw-text files: a path, glob or
      comma-separated list of them (`.gz` is decompressed; `gs://` works).
    text_field: the TFDS feature / Parquet column / JSON key holding a document's text; `text_feature` is
      its deprecated TFDS-only alias, used when text_field is left at "text".
    skip_bad_json_lines: JSON lines that do not parse are skipped and counted instead of stopping the read.
    min_sentences: documents with fewer sentences are dropped and counted (default 1; pydocs 2).
    max_line_chars: longer lines are read in pieces of at most this size, so memory stays bounded.
    max_sentence_chars: longer lines / sentences are cut into sentences of at most this size (at
      sentence ends, else whitespace; counted), so that they fit an instance instead of being truncated.
      Only lines / sentences longer than max_line_chars are cut: shorter ones stay whole, as in
      google-research/bert, whose records bertjax's equal.
    what: the flag or config field that gave `spec`, named in the errors about its files.
    """
    spec = spec.strip()
    text_field = text_feature if text_field == "text" else text_field
    if spec.startswith("tfds:"):
        name, _, split = spec[len("tfds:") :].partition(":")
        if not name:
            raise ValueError(f"Corpus spec {spec!r} names no dataset: use tfds:NAME[/CONFIG][:SPLIT].")
        return TfdsSource(
            name,
            split or "train",
            data_dir=data_dir,
            text_feature=text_field,
            language=language,
            min_sentences=min_sentences or 1,
            max_line_chars=max_line_chars,
            max_sentence_chars=max_sentence_chars,
        )
    if spec.startswith("builtin:"):
        if spec not in BUILTIN_CORPORA:
            raise ValueError(f"Unknown builtin corpus {spec!r}: use one of {BUILTIN_CORPORA}.")
        return PyDocsSource(
            language=language,
            min_sentences=min_sentences or 2,
            max_line_chars=max_line_chars,
            max_sentence_chars=max_sentence_chars,
        )
    table_args = dict(
        text_field=text_field,
        language=language,
        min_sentences=min_sentences or 1,
        max_line_chars=max_line_chars,
        max_sentence_chars=max_sentence_chars,
        what=what,
        skip_bad_json_lines=skip_bad_json_lines,
    )
    if hf_datasets.is_hf_spec(spec):
        files, split = hf_datasets.resolve(spec, what)
        log.info(
            "%s: split %r, %d data file(s) (%s%s)", spec, split, len(files), files[0], ", ..." if len(files) > 1 else ""
        )
        return table_corpus.TableSource(spec, files=files, **table_args)
    names = [name.strip() for name in spec.split(",") if name.strip()]
    if any(table_corpus.is_table_file(name) for name in names):  # by extension; raw text is the rest
        return table_corpus.TableSource(spec, **table_args)
    return TextSource(
        spec,
        min_sentences=min_sentences or 1,
        max_line_chars=max_line_chars,
        what=what,
        max_sentence_chars=max_sentence_chars,
    )
