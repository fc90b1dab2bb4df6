"""Record-like corpora: Parquet files and JSON Lines (`.jsonl`, `.jsonl.gz`, `.json.gz`, `.jsonl.zst`), one
document per row, its text in one field (`text_field`, "text" by default).

    source = TableSource("web/*.parquet,more/*.jsonl.zst", text_field="text")

Nothing is read whole: Parquet is read one row group at a time and only the text column; JSON Lines one line
at a time through the decompressor. Units are Parquet row groups (`RowGroup`) and JSON Lines files, so one
big Parquet file spreads over many workers. A row's text is cut into sentences by `split_sentences` (as TFDS
text is), and the same documents in the same order read as the same documents from any container. Rows that
hold no text (null, empty, a missing or non-string field, a line that is no JSON object) are counted in
`CorpusStats`, never dropped silently; a damaged file is one sentence naming it (and its row group or line).
"""

from __future__ import annotations

import gzip
import json
import logging
import zlib
from collections.abc import Iterator
from typing import Any, NamedTuple

from bertjax.data.corpus_base import (
    DEFAULT_MAX_LINE_CHARS, DEFAULT_MAX_SENTENCE_CHARS, CorpusStats, Document, Source, _is_remote, _open_binary,
    expand_patterns, split_sentences)

log = logging.getLogger(__name__)

PARQUET_SUFFIXES = (".parquet",)
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json.gz", ".jsonl.zst", ".json.zst")
TABLE_SUFFIXES = PARQUET_SUFFIXES + JSONL_SUFFIXES
DEFAULT_TEXT_FIELD = "text"
# The CorpusStats counters of rows skipped for holding no text (metadata.json's `skipped`, the logs).
SKIPPED_ROW_COUNTERS = ("empty_texts", "missing_texts", "non_string_texts", "non_object_lines", "bad_json_lines")
_CHUNK = 1 << 20
_FIELD_FIX = "set --text_field (config.data.text_field in the job) to the field that holds each document's text"


def _why(e: Exception) -> str:
    """An exception's message on one line (Arrow's run over several)."""
    return " ".join(str(e).split()).rstrip(".")


def is_table_file(name: str) -> bool:
    """Whether a file name (or glob) names a Parquet or JSON Lines file, by its extension."""
    return name.lower().endswith(TABLE_SUFFIXES)


def resolve_text_field(text_field: str, legacy: str, legacy_name: str, new_name: str) -> str:
    """The text field to use, given the deprecated TFDS-only setting too: it is used (with one warning) when
    it is set and text_field is left at its default."""
    if legacy == DEFAULT_TEXT_FIELD:
        return text_field
    log.warning("%s is deprecated: use %s, which names the text field of TFDS, Parquet and JSON Lines "
                "corpora alike%s.", legacy_name, new_name,
                "" if text_field == DEFAULT_TEXT_FIELD else f" ({new_name}={text_field!r} wins over it)")
    return legacy if text_field == DEFAULT_TEXT_FIELD else text_field


def skipped_rows_note(stats: CorpusStats) -> str:
    """"N rows, skipped: 2 empty texts, ..." for a log line; "" for corpora without rows (raw text)."""
    if not stats.rows:
        return ""
    skipped = ", ".join(f"{getattr(stats, k):,} {k.replace('_', ' ')}" for k in SKIPPED_ROW_COUNTERS)
    return f"{stats.rows:,} rows, skipped {skipped}"


class RowGroup(NamedTuple):
    """One row group of a Parquet file: a work unit."""

    path: str
    index: int


def _pyarrow() -> Any:
    try:
        import pyarrow  # noqa: F401  (deferred: raw-text corpora need no Arrow)
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("Reading Parquet corpora needs pyarrow: pip install pyarrow.") from None
    return pq


def _open_parquet(path: str) -> Any:
    pq = _pyarrow()
    import pyarrow as pa

    try:
        if _is_remote(path):
            fs, inner = pa.fs.FileSystem.from_uri(path)
            return pq.ParquetFile(fs.open_input_file(inner))
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{path} is not a readable Parquet file ({_why(e)}): its footer is damaged or the file is "
                         "truncated; write or download it again.") from None


def _is_string_type(kind: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return (pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or getattr(pa.types, "is_string_view", lambda _: False)(kind))


class TableSource(Source):
    """Parquet and JSON Lines files (globs / comma lists, local or gs://), one document per row.

    JSON lines are parsed strictly: a line that is not JSON stops the read with its file and line number,
    unless `skip_bad_json_lines` (then it is counted in `bad_json_lines`). A blank line is skipped (counted
    in `empty_lines`); bytes that are not UTF-8 become U+FFFD (`replaced_lines`).
    """

    def __init__(self, patterns: str, text_field: str = DEFAULT_TEXT_FIELD, language: str = "en",
                 min_sentences: int = 1, max_line_chars: int = DEFAULT_MAX_LINE_CHARS,
                 max_sentence_chars: int = DEFAULT_MAX_SENTENCE_CHARS, what: str = "--input_file",
                 skip_bad_json_lines: bool = False):
        super().__init__(min_sentences, max_line_chars, max_sentence_chars)
        self.text_field, self.language = text_field, language
        self.skip_bad_json_lines = skip_bad_json_lines
        files = expand_patterns(patterns, what)
        others = [f for f in files if not is_table_file(f)]
        if others:
            raise ValueError(f"{what} mixes Parquet / JSON Lines files with {others[0]!r}, which is neither "
                             f"(by its extension: {', '.join(TABLE_SUFFIXES)}): a corpus is either raw-text files "
                             "or Parquet / JSON Lines files, so convert the others or leave them out.")
        self._units: list[Any] = []
        self._parquet: tuple[str, Any] | None = None  # the last Parquet file opened: its footer is read once
        for path in files:
            if path.lower().endswith(PARQUET_SUFFIXES):
                # Opened here, so that a damaged footer or a missing column fails before any work.
                groups = self._parquet_file(path).num_row_groups
                self._units += [RowGroup(path, i) for i in range(max(groups, 1))]  # no group: counted empty
            else:
                self._units.append(path)

    def list_units(self) -> list[Any]:
        return list(self._units)

    def _parquet_file(self, path: str) -> Any:
        if self._parquet is None or self._parquet[0] != path:
            pf = _open_parquet(path)
            schema = pf.schema_arrow
            if self.text_field not in schema.names:
                raise ValueError(f"{path} has no column {self.text_field!r} (its columns: {schema.names}): "
                                 f"{_FIELD_FIX}.")
            kind = schema.field(self.text_field).type
            if not _is_string_type(kind):
                strings = [f.name for f in schema if _is_string_type(f.type)]
                raise ValueError(f"{path}: column {self.text_field!r} holds {kind}, not strings: {_FIELD_FIX} "
                                 f"(its string columns: {strings}).")
            self._parquet = path, pf
        return self._parquet[1]

    def _read_unit(self, unit: Any, stats: CorpusStats) -> Iterator[Document]:
        if isinstance(unit, RowGroup):
            yield from self._read_row_group(unit, stats)
        else:
            yield from self._read_jsonl(unit, stats)

    def _document(self, text: Any, stats: CorpusStats) -> Document | None:
        if text is None or not text.strip():
            stats.empty_texts += 1
            return None
        return list(self._cap(split_sentences(text, self.language), stats))

    # --- Parquet ---------------------------------------------------------------------------------
    def _read_row_group(self, unit: RowGroup, stats: CorpusStats) -> Iterator[Document]:
        import pyarrow as pa

        pf = self._parquet_file(unit.path)
        if pf.metadata.num_rows == 0:  # no rows (or no row group at all): counted once, by its first unit
            stats.empty_files += unit.index == 0
            return
        try:
            column = pf.read_row_group(unit.index, columns=[self.text_field]).column(0)
        except (pa.ArrowException, OSError) as e:
            raise ValueError(f"{unit.path}, row group {unit.index} of {pf.num_row_groups}, cannot be read ({_why(e)}): "
                             "the file is damaged; write or download it again.") from None
        for chunk in column.chunks:
            for start in range(0, len(chunk), 4096):  # Python strings for 4096 rows at a time
                stats.rows += min(4096, len(chunk) - start)
                for text in self._texts(chunk.slice(start, 4096), stats):
                    doc = self._document(text, stats)
                    if doc is not None:
                        yield doc

    @staticmethod
    def _texts(chunk: Any, stats: CorpusStats) -> list[Any]:
        try:
            return chunk.to_pylist()
        except UnicodeDecodeError:  # Arrow strings should be UTF-8; a writer that did not check: U+FFFD
            import pyarrow as pa

            raw = chunk.cast(pa.large_binary()).to_pylist()
            texts = []
            for data in raw:
                try:
                    texts.append(None if data is None else data.decode("utf-8"))
                except UnicodeDecodeError:
                    texts.append(data.decode("utf-8", errors="replace"))
                    stats.replaced_lines += 1
            return texts

    # --- JSON Lines ------------------------------------------------------------------------------
    def _read_jsonl(self, path: str, stats: CorpusStats) -> Iterator[Document]:
        has_rows = False
        for number, line in enumerate(_lines(path), 1):
            if number == 1 and line.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark
                line = line[3:]
            if not line.strip():
                stats.empty_lines += 1
                continue
            has_rows = True
            stats.rows += 1
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError:
                text = line.decode("utf-8", errors="replace")
                stats.replaced_lines += 1
            try:
                row = json.loads(text)
            except ValueError as e:
                if self.skip_bad_json_lines:
                    stats.bad_json_lines += 1
                    continue
                raise ValueError(f"{path}, line {number}, is not valid JSON ({_why(e)}): fix or delete the line, or pass "
                                 "--skip_bad_json_lines to skip and count such lines.") from None
            if not isinstance(row, dict):
                stats.non_object_lines += 1
                continue
            if self.text_field not in row:
                stats.missing_texts += 1
                continue
            value = row[self.text_field]
            if value is not None and not isinstance(value, str):
                stats.non_string_texts += 1
                continue
            doc = self._document(value, stats)
            if doc is not None:
                yield doc
        if not has_rows:
            stats.empty_files += 1


def _lines(path: str) -> Iterator[bytes]:
    """The lines of a JSON Lines file (newline kept off), decompressed as its extension says, streamed."""
    name = path.lower()
    with _open_binary(path, 0) as raw:
        if name.endswith(".gz"):
            chunks = _gzip_chunks(raw, path)
        elif name.endswith(".zst"):
            chunks = _zstd_chunks(raw, path)
        else:
            chunks = iter(lambda: raw.read(_CHUNK), b"")
        pending: list[bytes] = []  # the start of a line that goes on in the next chunk(s): joined once
        for chunk in chunks:
            if b"\n" not in chunk:
                pending.append(chunk)
                continue
            lines = chunk.split(b"\n")
            if pending:
                lines[0] = b"".join(pending + [lines[0]])
            pending = [lines.pop()]
            yield from lines
        if rest := b"".join(pending):
            yield rest


def _gzip_chunks(raw: Any, path: str) -> Iterator[bytes]:
    try:
        with gzip.GzipFile(fileobj=raw, mode="rb") as f:
            while chunk := f.read(_CHUNK):
                yield chunk
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise ValueError(f"{path} is not a complete gzip stream ({_why(e)}): it is truncated or damaged; compress or "
                         "download it again.") from None


def _zstd_chunks(raw: Any, path: str) -> Iterator[bytes]:
    """Decompressed chunks of every zstd frame. A stream that stops inside a frame is refused: zstandard's
    own stream reader ends such a stream silently, losing its last documents."""
    try:
        import zstandard
    except ImportError:
        raise ImportError(f"Reading {path} needs zstandard: pip install zstandard.") from None
    dctx = zstandard.ZstdDecompressor()
    dobj, in_frame = dctx.decompressobj(), False
    try:
        while data := raw.read(_CHUNK):
            while data:
                in_frame = True
                out = dobj.decompress(data)
                if out:
                    yield out
                data = b""
                if dobj.eof:  # a frame ended: the next one (if any) starts in unused_data
                    data, dobj, in_frame = dobj.unused_data, dctx.decompressobj(), False
    except zstandard.ZstdError as e:
        raise ValueError(f"{path} is not a valid zstd stream ({_why(e)}): it is damaged; compress or download it "
                         "again.") from None
    if in_frame:
        raise ValueError(f"{path} is a truncated zstd stream (it ends inside a frame): compress or download it "
                         "again.")
