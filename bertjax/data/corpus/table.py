"""Record-like corpora: Parquet files, JSON Lines (`.jsonl`, `.jsonl.gz`, `.json.gz`, `.jsonl.zst`) and the
Arrow files `datasets.save_to_disk` writes, one document per row, its text in one field (`text_field`, "text"
by default). `hf:DIR[:SPLIT]` directories resolve to such files in hf_datasets.py.

    source = TableSource("web/*.parquet,more/*.jsonl.zst", text_field="text")

Nothing is read whole: Parquet is read one row group at a time and only the text column; JSON Lines one line
at a time through the decompressor; Arrow files one record batch at a time. Units are Parquet
row groups (`RowGroup`) and JSON Lines / Arrow files. `split` cuts the corpus by *rows*, not by units: shard k
reads global rows [k·N/S, (k+1)·N/S) (`RowSpan`s of its units), so one big file of any kind spreads over all
shards, and the same documents in the same order give the same shards, and so byte-identical records, from any
container and any number of row groups or files. (JSON Lines files are read once more to count their rows.)

A row's text is cut into sentences by `split_sentences` (as TFDS text is). Rows that hold no text (null, empty,
a missing or non-string field, a line that is no JSON object) are counted in `CorpusStats`, in total and per
file, never dropped silently; a damaged file is one sentence naming it (and its row group or line).
"""

from __future__ import annotations

import bisect
import json
import logging
import re
from collections.abc import Iterator
from typing import Any, NamedTuple, Optional

from bertjax.data.corpus.base import (
    DEFAULT_MAX_LINE_CHARS,
    DEFAULT_MAX_SENTENCE_CHARS,
    CorpusStats,
    Document,
    Source,
    expand_patterns,
    split_sentences,
)
from bertjax.data.corpus import table_files
from bertjax.runtime import files as file_layer
from bertjax.runtime.files import is_remote

log = logging.getLogger(__name__)

PARQUET_SUFFIXES = (".parquet",)
# `.json` too: what `datasets.Dataset.to_json()` writes by default is JSON Lines (a JSON array is refused).
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".jsonl.zst", ".json.zst")
ARROW_SUFFIXES = (".arrow",)  # Arrow IPC streams (or files): what datasets.save_to_disk writes
TABLE_SUFFIXES = PARQUET_SUFFIXES + JSONL_SUFFIXES + ARROW_SUFFIXES
DEFAULT_TEXT_FIELD = "text"
# The CorpusStats counters of rows skipped for holding no text (metadata.json's `skipped`, the logs).
SKIPPED_ROW_COUNTERS = ("empty_texts", "missing_texts", "non_string_texts", "non_object_lines", "bad_json_lines")
_SURROGATE = re.compile("[\ud800-\udfff]")  # a lone surrogate (json.loads pairs the valid ones)
_FIELD_FIX = "set --text_field (config.data.text_field in the job) to the field that holds each document's text"


def is_table_file(name: str) -> bool:
    """Whether a file name (or glob) names a Parquet or JSON Lines file, by its extension."""
    return name.lower().endswith(TABLE_SUFFIXES)


def resolve_text_field(text_field: str, legacy: str, legacy_name: str, new_name: str) -> str:
    """The text field to use, given the deprecated TFDS-only setting too: it is used (with one warning) when
    it is set and text_field is left at its default."""
    if legacy == DEFAULT_TEXT_FIELD:
        return text_field
    log.warning(
        "%s is deprecated: use %s, which names the text field of TFDS, Parquet and JSON Lines corpora alike%s.",
        legacy_name,
        new_name,
        "" if text_field == DEFAULT_TEXT_FIELD else f" ({new_name}={text_field!r} wins over it)",
    )
    return legacy if text_field == DEFAULT_TEXT_FIELD else text_field


def skipped_rows_note(stats: CorpusStats, max_files: int = 5) -> str:
    """ "N rows, skipped 2 empty texts, ...; by file: a.parquet: 2 empty texts" for a log line; "" for corpora
    without rows (raw text)."""
    if not stats.rows:
        return ""
    skipped = ", ".join(f"{getattr(stats, k):,} {k.replace('_', ' ')}" for k in SKIPPED_ROW_COUNTERS)
    by_file = skipped_by_file_note(stats.skipped_by_file, max_files)
    return f"{stats.rows:,} rows, skipped {skipped}" + (f"; by file: {by_file}" if by_file else "")


def skipped_by_file_note(by_file: dict[str, dict[str, int]], max_files: int = 5) -> str:
    """ "a.parquet: 2 empty texts; b.jsonl: 1 bad json lines" for the first `max_files` files, the rest counted
    (metadata.json's corpus.skipped_by_file lists them all)."""
    files = sorted(by_file.items())
    note = "; ".join(
        f"{path}: " + ", ".join(f"{n:,} {k.replace('_', ' ')}" for k, n in sorted(counts.items()))
        for path, counts in files[:max_files]
    )
    if len(files) > max_files:
        note += f"; and {len(files) - max_files:,} more file(s)"
    return note


class RowGroup(NamedTuple):
    """One row group of a Parquet file: a work unit."""

    path: str
    index: int


class RowSpan(NamedTuple):
    """Rows [start, stop) of a unit (a RowGroup, or the path of a JSON Lines or Arrow file), numbered from 0 in
    that unit; stop None: to its end. Spans that tile a unit's rows read each row (and blank line) once.
    `seek`: in an uncompressed JSON Lines file, (row, line number, byte offset) of a row at or before start,
    where reading begins instead of at the top of the file."""

    unit: Any
    start: int
    stop: Optional[int] = None
    seek: tuple = ()


class SeekPoint(NamedTuple):
    """Where a row of an uncompressed JSON Lines file starts: its row and line numbers and byte offset."""

    row: int
    line: int
    offset: int


# An uncompressed JSON Lines file's row count pass notes every SEEK_EVERY-th row's offset, so a span of a big
# file starts reading at most SEEK_EVERY rows before its first row (a line-aligned byte range, in effect).
SEEK_EVERY = 4096


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
        if is_remote(path):  # through the file layer (gcsfs), which the clients' settings point anywhere
            return pq.ParquetFile(pa.PythonFile(file_layer.open_file(path, "rb"), mode="r"))
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise ValueError(
            f"{path} is not a readable Parquet file ({table_files.why(e)}): its footer is damaged or the file is "
            "truncated; write or download it again."
        ) from None


def _is_string_type(kind: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or getattr(pa.types, "is_string_view", lambda _: False)(kind)
    )


def _leaves(schema: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Every field's dotted name and type, inside structs too: what --text_field can name."""
    import pyarrow as pa

    out = []
    for field in schema:
        name = prefix + field.name
        out.extend(_leaves(field.type, name + ".") if pa.types.is_struct(field.type) else [(name, field.type)])
    return out


def _inside(column: Any, names: tuple[str, ...]) -> Any:
    """The field `names` inside a struct column (a null struct gives a null text); the column itself for ()."""
    import pyarrow.compute as pc

    return pc.struct_field(column, list(names)) if names else column


_MISSING = object()


def _json_field(value: dict, name: str) -> Any:
    """value[name], or for a dotted name without such a key the nested value ("meta.text": value["meta"]["text"])."""
    if name in value:
        return value[name]
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


class TableSource(Source):
    """Parquet, JSON Lines and Arrow files (globs / comma lists, local or gs://), one document per row.

    JSON lines are parsed strictly: a line that is not JSON stops the read with its file and line number,
    unless `skip_bad_json_lines` (then it is counted in `bad_json_lines`). A blank line is skipped (counted
    in `empty_lines`); bytes that are not UTF-8 become U+FFFD (`replaced_lines`). `files` (a list of paths,
    as hf_datasets resolves them) replaces `patterns`' globs.
    """

    def __init__(
        self,
        patterns: str,
        text_field: str = DEFAULT_TEXT_FIELD,
        language: str = "en",
        min_sentences: int = 1,
        max_line_chars: int = DEFAULT_MAX_LINE_CHARS,
        max_sentence_chars: int = DEFAULT_MAX_SENTENCE_CHARS,
        what: str = "--input_file",
        skip_bad_json_lines: bool = False,
        files: Optional[list[str]] = None,
    ):
        super().__init__(min_sentences, max_line_chars, max_sentence_chars)
        self.text_field, self.language = text_field, language
        self.skip_bad_json_lines = skip_bad_json_lines
        files = list(files) if files is not None else expand_patterns(patterns, what)
        others = [f for f in files if not is_table_file(f)]
        if others:
            raise ValueError(
                f"{what} mixes Parquet / JSON Lines files with {others[0]!r}, which is neither "
                f"(by its extension: {', '.join(TABLE_SUFFIXES)}): a corpus is either raw-text files "
                "or Parquet / JSON Lines files, so convert the others or leave them out."
            )
        self._units: list[Any] = []
        self._parquet: tuple[str, Any, tuple[str, ...]] | None = None  # the last Parquet file opened, its text
        # field's names inside a struct column: the footer is read and the schema checked once per file
        self._seek_points: dict[str, list[SeekPoint]] = {}  # uncompressed JSON Lines files: noted by unit_rows
        for path in files:
            # Opened here, so that a damaged footer or a missing column fails before any work.
            if path.lower().endswith(PARQUET_SUFFIXES):
                groups = self._parquet_file(path).num_row_groups
                self._units += [RowGroup(path, i) for i in range(max(groups, 1))]  # no group: counted empty
            else:
                if path.lower().endswith(ARROW_SUFFIXES):
                    self._arrow_column(path)
                elif path.lower().endswith(".json"):
                    check_json_lines(path)
                self._units.append(path)

    def list_units(self) -> list[Any]:
        return list(self._units)

    # --- Work split by rows ----------------------------------------------------------------------
    def unit_rows(self, unit: Any) -> int:
        """A unit's rows: Parquet's footer, an Arrow file's batch headers, a JSON Lines file read through."""
        if isinstance(unit, RowGroup):
            pf = self._parquet_file(unit.path)
            return pf.metadata.row_group(unit.index).num_rows if pf.num_row_groups else 0
        if unit.lower().endswith(ARROW_SUFFIXES):
            return sum(batch.num_rows for batch in table_files.arrow_batches(unit, mapped=True))
        seekable = not is_remote(unit) and not unit.lower().endswith((".gz", ".zst"))
        points, rows = [], 0
        for rows, (row, number, line, offset) in enumerate(_rows(unit, CorpusStats()), 1):
            if seekable and row and row % SEEK_EVERY == 0:
                points.append(SeekPoint(row, number, offset))
        self._seek_points[unit] = points
        return rows

    def split(self, num_shards: int) -> list[list[Any]]:
        """The corpus's rows, in order, cut into `num_shards` equal spans: shard k reads the units (or
        `RowSpan`s of them) that hold rows [k·N/S, (k+1)·N/S). Which rows go to a shard depends on the rows
        alone, never on how they are laid out in files or row groups. A unit without rows goes whole to the
        shard where it sits."""
        if num_shards == 1:
            return [self.list_units()]
        jsonl = [u for u in self._units if isinstance(u, str) and not u.lower().endswith(ARROW_SUFFIXES)]
        if jsonl:
            log.info("Counting the rows of %d JSON Lines file(s) to split them over %d shards", len(jsonl), num_shards)
        sizes = [self.unit_rows(u) for u in self._units]
        total = sum(sizes)
        bounds = [total * k // num_shards for k in range(num_shards + 1)]
        work: list[list[Any]] = [[] for _ in range(num_shards)]
        offset = 0
        for unit, size in zip(self._units, sizes):
            first = min(bisect.bisect_right(bounds, offset) - 1, num_shards - 1)
            if size == 0:
                work[first].append(unit)
            for k in range(first, num_shards):
                lo, hi = max(bounds[k], offset) - offset, min(bounds[k + 1], offset + size) - offset
                if lo >= size:
                    break
                if lo < hi:
                    work[k].append(
                        unit
                        if (lo, hi) == (0, size)
                        else RowSpan(unit, lo, None if hi == size else hi, self._seek(unit, lo))
                    )
            offset += size
        return work

    def _seek(self, unit: Any, row: int) -> tuple:
        """The last seek point at or before `row` of an uncompressed JSON Lines file; () for other units."""
        points = self._seek_points.get(unit) if isinstance(unit, str) else None
        if not points or row < points[0].row:
            return ()
        return tuple(points[bisect.bisect_right([p.row for p in points], row) - 1])

    # --- Reading -----------------------------------------------------------------------------------
    def _parquet_file(self, path: str) -> Any:
        if self._parquet is None or self._parquet[0] != path:
            pf = _open_parquet(path)
            self._parquet = path, pf, self._check_column(path, pf.schema_arrow)[1]
        return self._parquet[1]

    def _check_column(self, path: str, schema: Any) -> tuple[int, tuple[str, ...]]:
        """Where the text field is in `schema`: its column's index, and the names inside that column's structs
        ("meta.text": column meta, field text; a column literally named "meta.text" wins). One sentence if it
        is missing or holds no strings."""
        import pyarrow as pa

        parts = (self.text_field,) if self.text_field in schema.names else tuple(self.text_field.split("."))
        kind = schema.field(parts[0]).type if parts[0] in schema.names else None
        for part in parts[1:]:
            kind = (
                kind.field(part).type
                if (kind is not None and pa.types.is_struct(kind) and kind.get_field_index(part) >= 0)
                else None
            )
        if kind is None:
            names = [n for n, _ in _leaves(schema)]
            raise ValueError(f"{path} has no column {self.text_field!r} (its columns: {names}): {_FIELD_FIX}.")
        if not _is_string_type(kind):
            strings = [n for n, t in _leaves(schema) if _is_string_type(t)]
            raise ValueError(
                f"{path}: column {self.text_field!r} holds {kind}, not strings: {_FIELD_FIX} "
                f"(its string columns: {strings})."
            )
        return schema.get_field_index(parts[0]), parts[1:]

    def _arrow_column(self, path: str) -> tuple[int, tuple[str, ...]]:
        return self._check_column(path, table_files.arrow_schema(path))

    def _read_unit(self, unit: Any, stats: CorpusStats) -> Iterator[Document]:
        start, stop, seek = 0, None, ()
        if isinstance(unit, RowSpan):
            unit, start, stop, seek = unit
        if isinstance(unit, RowGroup):
            yield from self._read_row_group(unit, start, stop, stats)
        elif unit.lower().endswith(ARROW_SUFFIXES):
            yield from self._read_arrow(unit, start, stop, stats)
        else:
            yield from self._read_jsonl(unit, start, stop, stats, SeekPoint(*seek) if seek else None)

    def _document(self, text: Any, path: str, stats: CorpusStats) -> Document | None:
        if text is None or not text.strip():
            _skip(stats, path, "empty_texts")
            return None
        return list(self._cap(split_sentences(text, self.language), stats))

    def _column_documents(self, column: Any, path: str, stats: CorpusStats) -> Iterator[Document]:
        """The documents of an Arrow string array (or chunked array), 4096 rows at a time."""
        for chunk in getattr(column, "chunks", [column]):
            for start in range(0, len(chunk), 4096):  # Python strings for 4096 rows at a time
                stats.rows += min(4096, len(chunk) - start)
                for text in _texts(chunk.slice(start, 4096), stats):
                    doc = self._document(text, path, stats)
                    if doc is not None:
                        yield doc

    # --- Parquet ---------------------------------------------------------------------------------
    def _read_row_group(
        self, unit: RowGroup, start: int, stop: Optional[int], stats: CorpusStats
    ) -> Iterator[Document]:
        import pyarrow as pa

        pf = self._parquet_file(unit.path)
        if pf.metadata.num_rows == 0:  # no rows (or no row group at all): counted once, by its first unit
            stats.empty_files += unit.index == 0
            return
        try:
            column = _inside(pf.read_row_group(unit.index, columns=[self.text_field]).column(0), self._parquet[2])
        except (pa.ArrowException, OSError) as e:
            raise ValueError(
                f"{unit.path}, row group {unit.index} of {pf.num_row_groups}, cannot be read ({table_files.why(e)}): "
                "the file is damaged; write or download it again."
            ) from None
        if start or stop is not None:
            column = column.slice(start, (len(column) if stop is None else stop) - start)
        yield from self._column_documents(column, unit.path, stats)

    # --- Arrow (datasets.save_to_disk) ------------------------------------------------------------
    def _read_arrow(self, path: str, start: int, stop: Optional[int], stats: CorpusStats) -> Iterator[Document]:
        (index, inner), offset = self._arrow_column(path), 0
        for batch in table_files.arrow_batches(path):
            size = batch.num_rows
            lo, hi = max(start - offset, 0), size if stop is None else min(stop - offset, size)
            offset += size
            if lo < hi:
                yield from self._column_documents(_inside(batch.column(index).slice(lo, hi - lo), inner), path, stats)
            if stop is not None and offset >= stop:
                return
        if offset == 0:
            stats.empty_files += 1

    # --- JSON Lines ------------------------------------------------------------------------------
    def _read_jsonl(
        self, path: str, start: int, stop: Optional[int], stats: CorpusStats, seek: Optional[SeekPoint] = None
    ) -> Iterator[Document]:
        row_count = 0
        for _, number, line, _ in _rows(path, stats, start, stop, seek):
            row_count += 1
            stats.rows += 1
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError:
                text = line.decode("utf-8", errors="replace")
                stats.replaced_lines += 1
            try:
                value = json.loads(text)
            except ValueError as e:
                if self.skip_bad_json_lines:
                    _skip(stats, path, "bad_json_lines")
                    continue
                raise ValueError(
                    f"{path}, line {number}, is not valid JSON ({table_files.why(e)}): fix or delete the line, or pass "
                    "--skip_bad_json_lines to skip and count such lines."
                ) from None
            if not isinstance(value, dict):
                _skip(stats, path, "non_object_lines")
                continue
            value = _json_field(value, self.text_field)
            if value is _MISSING:
                _skip(stats, path, "missing_texts")
                continue
            if value is not None and not isinstance(value, str):
                _skip(stats, path, "non_string_texts")
                continue
            if value and _SURROGATE.search(value):  # "\ud800" is valid JSON but no text: as bytes that are not UTF-8
                value = _SURROGATE.sub("\ufffd", value)
                stats.replaced_lines += 1
            doc = self._document(value, path, stats)
            if doc is not None:
                yield doc
        if row_count == 0 and start == 0:
            stats.empty_files += 1


def check_json_lines(path: str) -> None:
    """A `.json` file must hold JSON Lines (one object per line), not a JSON array or one document over many
    lines: said before any work, where reading on would count every line as bad JSON."""
    for _, number, line, _ in _rows(path, CorpusStats(), 0, 1):
        head = line.lstrip()[:1]
        if head == b"[":
            raise ValueError(
                f"{path} holds a JSON array, not JSON Lines (one object per line); write it as JSON "
                "Lines: datasets' Dataset.to_json(path) does by default, pandas' to_json(path, "
                "orient='records', lines=True)."
            )
        try:
            json.loads(line)
        except ValueError:
            raise ValueError(
                f"{path}: line {number} is not a JSON object by itself, so the file is one JSON "
                "document over several lines, not JSON Lines (one object per line); write one "
                "object per line (datasets' Dataset.to_json(path) does)."
            ) from None


def _skip(stats: CorpusStats, path: str, counter: str) -> None:
    """Counts a skipped row, in total and for its file."""
    setattr(stats, counter, getattr(stats, counter) + 1)
    counts = stats.skipped_by_file.setdefault(path, {})
    counts[counter] = counts.get(counter, 0) + 1


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


def _rows(
    path: str, stats: CorpusStats, start: int = 0, stop: Optional[int] = None, seek: Optional[SeekPoint] = None
) -> Iterator[tuple[int, int, bytes, int]]:
    """(row, line number, line, byte offset) for the non-blank lines of a JSON Lines file whose row (counted from
    0) is in [start, stop); reading begins at `seek` if given. The blank lines before a row (and, with stop None,
    those at the end) are counted in stats.empty_lines by the span that reads that row. Offsets are of the
    decompressed stream; lines end at b"\\n"."""
    row, number, offset = (seek.row, seek.line - 1, seek.offset) if seek else (0, 0, 0)
    for line in table_files.json_lines(path, offset):
        number += 1
        line_offset, offset = offset, offset + len(line) + 1
        if number == 1 and line.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark
            line = line[3:]
        if not line.strip():
            stats.empty_lines += start <= row and (stop is None or row < stop)
            continue
        if stop is not None and row >= stop:
            return
        if row >= start:
            yield row, number, line, line_offset
        row += 1
