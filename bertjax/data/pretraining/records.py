"""Pre-training records: google-research/bert's TFRecord schema, a fast encoder, and metadata.json.

Records made here train in google-research/bert and theirs train here: same feature names, dtypes and
lengths. `encode_framed` writes framed `tf.train.Example` records straight from numpy arrays, a
whole block at a time; building the protos through the protobuf API costs more than everything else
in record creation together (measured: ~45 µs vs ~4 µs per instance).
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import json
import os
import shutil
import struct
from typing import Mapping, Optional, Sequence

import google_crc32c
import numpy as np

from bertjax.data import files
from bertjax.data.corpus.sources import expand_patterns  # noqa: F401  (record globs expand as corpus globs do)

# Feature name → (dtype, length key). Lengths come from the schema: "seq" or "pred" or 1.
FEATURES: dict[str, tuple[str, str | int]] = {
    "input_ids": ("int64", "seq"),
    "input_mask": ("int64", "seq"),
    "segment_ids": ("int64", "seq"),
    "masked_lm_positions": ("int64", "pred"),
    "masked_lm_ids": ("int64", "pred"),
    "masked_lm_weights": ("float32", "pred"),
    "next_sentence_labels": ("int64", 1),
}
METADATA_NAME = "metadata.json"
# prepare writes its shards here and moves them beside metadata.json only once every shard is complete: a
# hidden folder, which record globs (`DIR/*`, `DIR/*.tfrecord`) never match. While it exists, the set is
# unfinished (a prepare failed or was killed) and training refuses the directory.
STAGING_NAME = ".prepare-incomplete"
FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class RecordSchema:
    """Feature shapes of a record set. Packed records (`max_instances_per_row` > 0; layout in
    data/pretraining/packing.py) hold several instances a row: their prediction slots (`max_predictions_per_seq`
    here) are the row's budget, and they add per-instance features."""

    max_seq_length: int
    max_predictions_per_seq: int
    max_instances_per_row: int = 0  # 0: unpacked, google-research/bert's schema exactly

    def features(self) -> dict[str, tuple[str, int]]:
        """Feature name → (dtype, length)."""
        sizes = {"seq": self.max_seq_length, "pred": self.max_predictions_per_seq}
        out = {name: (dtype, sizes.get(size, size)) for name, (dtype, size) in FEATURES.items()}
        k = self.max_instances_per_row
        if k:
            out.update(
                next_sentence_labels=("int64", k),
                position_ids=("int64", self.max_seq_length),
                next_sentence_positions=("int64", k),
                next_sentence_weights=("float32", k),
            )
        return out

    def length(self, feature: str) -> int:
        return self.features()[feature][1]

    def feature_spec(self) -> dict:
        """`tf.io.parse_example` spec."""
        import tensorflow as tf

        return {
            name: tf.io.FixedLenFeature([n], tf.float32 if dtype == "float32" else tf.int64)
            for name, (dtype, n) in self.features().items()
        }

    def to_dict(self) -> dict:
        out = {
            "max_seq_length": self.max_seq_length,
            "max_predictions_per_seq": self.max_predictions_per_seq,
            "features": {name: {"dtype": dtype, "shape": [n]} for name, (dtype, n) in self.features().items()},
        }
        if self.max_instances_per_row:
            out["max_instances_per_row"] = self.max_instances_per_row
        return out


# --- Wire format ---------------------------------------------------------------------------------
# Example{features=1: Features{feature=1: map<string, Feature>}}; a map entry is {key=1, value=2};
# Feature{float_list=2 | int64_list=3}; each list is {value=1, packed}.


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL_VARINTS = [_varint(n) for n in range(1 << 14)]


def _len_prefix(n: int) -> bytes:
    return _SMALL_VARINTS[n] if n < len(_SMALL_VARINTS) else _varint(n)


def _packed_varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of non-negative ints → (flat varint bytes, bytes per row), vectorised over the block."""
    vmax = int(values.max()) if values.size else 0
    width = max(1, (vmax.bit_length() + 6) // 7)  # bytes of the longest varint
    if width == 1:  # masks, segment ids, labels: one byte per value
        return values.astype(np.uint8).ravel(), np.full(len(values), values.shape[1], np.int64)
    v = values.astype(np.uint32 if vmax < 2**32 else np.uint64).ravel()
    nbytes = np.ones(v.shape, np.int8)
    for k in range(1, width):
        nbytes += v >= (1 << (7 * k))
    ends = np.cumsum(nbytes, dtype=np.int64)
    starts = ends - nbytes
    out = np.empty(int(ends[-1]), np.uint8)
    out[starts] = (v & 0x7F).astype(np.uint8) | ((nbytes > 1).astype(np.uint8) << 7)
    for k in range(1, width):  # byte k of the values that have more than k bytes
        has = np.flatnonzero(nbytes > k)
        out[starts[has] + k] = ((v[has] >> (7 * k)) & 0x7F).astype(np.uint8) | (
            (nbytes[has] > k + 1).astype(np.uint8) << 7
        )
    return out, nbytes.reshape(values.shape).sum(axis=1, dtype=np.int64)


@functools.lru_cache(maxsize=4096)
def _entry_header(name: str, payload_len: int, list_field: int) -> bytes:
    """Map-entry bytes up to the packed payload: key, Feature, the list message and its value field."""
    key = name.encode()
    values = b"\x0a" + _len_prefix(payload_len)  # list.value, packed
    feature = bytes([(list_field << 3) | 2]) + _len_prefix(len(values) + payload_len)
    value = feature + values
    entry = b"\x0a" + _len_prefix(len(key)) + key + b"\x12" + _len_prefix(len(value) + payload_len)
    return b"\x0a" + _len_prefix(len(entry) + len(value) + payload_len) + entry + value


def _feature_bytes(name: str, a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One feature of every row: (flat payload bytes, payload bytes per row, flat header bytes (the map
    entry up to the packed values), header bytes per row)."""
    rows = len(a)
    if np.issubdtype(a.dtype, np.floating):
        payload = np.ascontiguousarray(a, dtype="<f4").view(np.uint8).ravel()
        lengths, list_field = np.full(rows, a.shape[1] * 4, np.int64), 2
    else:
        if a.size and a.min() < 0:
            raise ValueError(f"feature {name} has negative values; record ids and labels are never negative.")
        payload, lengths = _packed_varints(a)
        list_field = 3
    sizes, which = np.unique(lengths, return_inverse=True)
    headers = [_entry_header(name, int(n), list_field) for n in sizes]
    header, header_lengths = _table_lookup(headers, which.ravel())
    return payload, lengths, header, header_lengths


def _table_lookup(entries: Sequence[bytes], which: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """entries[which[i]] for every i, concatenated: (flat bytes, bytes per i)."""
    sizes = np.array([len(e) for e in entries], np.int64)
    table = np.zeros((len(entries), int(sizes.max())), np.uint8)
    for i, e in enumerate(entries):
        table[i, : len(e)] = np.frombuffer(e, np.uint8)
    rows = table[which]
    return rows[np.arange(table.shape[1])[None, :] < sizes[which][:, None]], sizes[which]


def _scatter(out: np.ndarray, dest: np.ndarray, data: np.ndarray, lengths: np.ndarray) -> None:
    """out[dest[i]:dest[i] + lengths[i]] = the i-th run of `data` (runs laid end to end)."""
    if len(lengths) and np.all(lengths == lengths[0]):
        out[(dest[:, None] + np.arange(lengths[0])).ravel()] = data
        return
    starts = np.cumsum(lengths) - lengths
    out[np.repeat(dest - starts, lengths) + np.arange(len(data))] = data


def masked_crc(data: bytes) -> bytes:
    crc = google_crc32c.value(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def _mask_crc_array(crc: np.ndarray) -> np.ndarray:
    crc = crc.astype(np.uint32)
    return (((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(0xA282EAD8)).astype("<u4")


def encode_framed(arrays: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of [rows, length] arrays (int → int64, float → float) as framed TFRecords of serialised
    `tf.train.Example`s, vectorised over rows: (file bytes, each record's offset in them, its length).

    A row is frame header (length, masked CRC), Example{features: {entry, ...}}, masked CRC: every part
    is built for all rows at once and scattered into place; only the data CRC is a call per row.
    """
    names = list(arrays)
    rows = len(arrays[names[0]])
    if rows == 0:
        return np.zeros(0, np.uint8), np.zeros(0, np.int64), np.zeros(0, np.int64)
    parts = []  # (flat bytes, bytes per row), in the order they lie in a row
    for name in names:
        payload, lengths, header, header_lengths = _feature_bytes(name, np.asarray(arrays[name]).reshape(rows, -1))
        parts += [(header, header_lengths), (payload, lengths)]
    features_len = sum(lengths for _, lengths in parts)
    # Record = 0x0a, varint(features_len), features; frame = u64 length, masked CRC of it, record, masked CRC.
    sizes, which = np.unique(features_len, return_inverse=True)
    prefixes = []
    for n in sizes.tolist():
        record_len = 1 + len(_len_prefix(n)) + n
        length = struct.pack("<Q", record_len)
        prefixes.append(length + masked_crc(length) + b"\x0a" + _len_prefix(n))
    prefix, prefix_len = _table_lookup(prefixes, which.ravel())
    parts.insert(0, (prefix, prefix_len))
    row_len = prefix_len + features_len + 4
    row_start = np.cumsum(row_len) - row_len
    out = np.empty(int(row_len.sum()), np.uint8)
    at = row_start.copy()
    for data, lengths in parts:
        _scatter(out, at, data, lengths)
        at += lengths
    record_start = row_start + 12
    record_len = prefix_len - 12 + features_len
    data = out.tobytes()  # google_crc32c takes bytes only: one copy, then a slice per record
    crcs = np.fromiter(
        (google_crc32c.value(data[a:b]) for a, b in zip(record_start.tolist(), at.tolist())), np.uint32, rows
    )
    out[(at[:, None] + np.arange(4)).ravel()] = _mask_crc_array(crcs).view(np.uint8)
    return out, record_start, record_len


def open_for_write(path: str):
    return files.open_file(path, "wb")


def disk_full_error(path: str, error: OSError) -> OSError:
    """ENOSPC as one sentence naming the file being written and the bytes left (local disks)."""
    where = os.path.dirname(os.path.abspath(path)) if not files.is_remote(path) else ""
    free = f" ({shutil.disk_usage(where).free:,} bytes free)" if where and os.path.isdir(where) else ""
    full = OSError(f"no space left on the device writing {path}{free}: free space there or choose another --output_dir")
    full.errno = error.errno  # str() stays the sentence alone, without "[Errno 28]"
    return full


def _raise_disk_full(path: str, error: OSError) -> None:
    if error.errno == errno.ENOSPC:
        raise disk_full_error(path, error) from None
    raise error


class RecordWriter:
    """Writes one TFRecord shard, framed here (length, masked CRC32C) so that writing records does not
    import TensorFlow: that import costs each worker ~3 s. The file appears under its name only once
    complete (written as NAME.tmp, then renamed), so a killed job never leaves a truncated shard.
    `size` and `crc32c` (of the whole file, for metadata.json) are known once it is closed."""

    def __init__(self, path: str):
        self.path = path
        self.count = 0
        self.size = 0
        self._crc = google_crc32c.Checksum()
        self._tmp = path + ".tmp"
        self._file = open_for_write(self._tmp)

    @property
    def crc32c(self) -> str:
        return self._crc.hexdigest().decode()

    def write_block(self, arrays: Mapping[str, np.ndarray], chunk: int = 2048) -> None:
        rows = len(next(iter(arrays.values())))
        for start in range(0, rows, chunk):  # chunks that stay in cache
            framed, _, _ = encode_framed({k: v[start : start + chunk] for k, v in arrays.items()})
            data = framed.tobytes()  # google_crc32c takes read-only bytes only
            try:
                self._file.write(data)
            except OSError as e:
                _raise_disk_full(self.path, e)
            self._crc.update(data)
            self.size += len(data)
        self.count += rows

    def close(self) -> None:
        try:
            self._file.close()
        except OSError as e:  # buffered bytes meet a full disk here
            _raise_disk_full(self.path, e)
        if files.is_remote(self.path):
            import tensorflow as tf

            tf.io.gfile.rename(self._tmp, self.path, overwrite=True)
        else:
            os.replace(self._tmp, self.path)

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.close()
        else:  # leave no partial shard behind
            try:
                self._file.close()
            except OSError:
                pass
            try:
                os.remove(self._tmp)
            except OSError:
                pass


# --- Metadata ------------------------------------------------------------------------------------


def write_metadata(output_dir: str, schema: RecordSchema, **fields) -> dict:
    """Writes output_dir/metadata.json; returns what it holds."""
    path = os.path.join(output_dir, METADATA_NAME)
    metadata = {"format_version": FORMAT_VERSION, "schema": schema.to_dict(), **fields}
    try:
        with open_for_write(path) as f:
            f.write(json.dumps(metadata, indent=2, sort_keys=True).encode())
    except OSError as e:
        _raise_disk_full(path, e)
    return metadata


def metadata_in(directory: str) -> Optional[dict]:
    """The directory's metadata.json, or None (google-research/bert writes none); local or gs://."""
    import tensorflow as tf

    path = os.path.join(directory, METADATA_NAME)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)


def read_metadata(files: Sequence[str]) -> Optional[dict]:
    """metadata.json beside the first shard, if there is one."""
    return metadata_in(os.path.dirname(files[0]))


def infer_schema(files: Sequence[str]) -> tuple[RecordSchema, Optional[dict]]:
    """The schema from metadata.json, else from the first record (as for the original's records)."""
    metadata = read_metadata(files)
    if metadata is not None:
        s = metadata["schema"]
        return RecordSchema(
            s["max_seq_length"], s["max_predictions_per_seq"], s.get("max_instances_per_row", 0)
        ), metadata
    import tensorflow as tf

    for first in tf.data.TFRecordDataset(files[0]).take(1):
        example = tf.train.Example.FromString(first.numpy())
        break
    else:
        raise ValueError(f"{files[0]} holds no records; re-run prepare or drop it from the file list.")
    feature = example.features.feature
    missing = [name for name in FEATURES if name not in feature]
    if missing:
        raise ValueError(f"{files[0]}: records lack feature(s) {missing}; they are not BERT pre-training records.")
    packed = "next_sentence_positions" in feature
    return RecordSchema(
        len(feature["input_ids"].int64_list.value),
        len(feature["masked_lm_ids"].int64_list.value),
        len(feature["next_sentence_positions"].int64_list.value) if packed else 0,
    ), None


def check_schema(
    files: Sequence[str],
    max_seq_length: int,
    max_predictions_per_seq: int,
    vocab_size: Optional[int] = None,
    max_instances_per_row: int = 0,
) -> Optional[dict]:
    """Raises one clear error when the records disagree with the config; returns their metadata.

    For packed records (max_instances_per_row > 0) max_predictions_per_seq is the row's budget."""
    schema, metadata = infer_schema(files)
    where = os.path.join(os.path.dirname(files[0]), METADATA_NAME) if metadata else files[0]
    if bool(schema.max_instances_per_row) != bool(max_instances_per_row):
        raise ValueError(
            f"{where}: the records are {'packed' if schema.max_instances_per_row else 'unpacked'} but "
            f"config.data.packing={bool(max_instances_per_row)}; set it to "
            f"{bool(schema.max_instances_per_row)} or use records made with"
            f"{'out' if not max_instances_per_row else ''} `prepare --packing`."
        )
    if schema.max_instances_per_row != max_instances_per_row:
        raise ValueError(
            f"{where}: records pack up to {schema.max_instances_per_row} instances a row but "
            f"config.data.max_instances_per_row={max_instances_per_row}; set the config to match."
        )
    if max_instances_per_row and schema.max_predictions_per_seq != max_predictions_per_seq:
        raise ValueError(
            f"{where}: packed records have {schema.max_predictions_per_seq} prediction slots a row "
            f"but config.data.max_predictions_per_row={max_predictions_per_seq}; set the config to "
            "match or re-run prepare."
        )
    if schema.max_seq_length != max_seq_length:
        raise ValueError(
            f"{where}: records have max_seq_length={schema.max_seq_length} but config.data."
            f"max_seq_length={max_seq_length}; set the config to match or re-run prepare."
        )
    if schema.max_predictions_per_seq != max_predictions_per_seq:
        raise ValueError(
            f"{where}: records have max_predictions_per_seq={schema.max_predictions_per_seq} but "
            f"config.data.max_predictions_per_seq={max_predictions_per_seq}; set the config to "
            "match or re-run prepare."
        )
    if vocab_size is not None and metadata and metadata.get("vocab_size") not in (None, vocab_size):
        raise ValueError(
            f"{where}: records were made with a vocabulary of {metadata['vocab_size']} tokens but "
            f"config.model.vocab_size={vocab_size}; set the config to match or re-run prepare."
        )
    return metadata


# --- Complete and fresh record sets ---------------------------------------------------------------------


def expand_record_files(patterns: str | Sequence[str], what: str = "record") -> list[str]:
    """Record globs → files, as `expand_patterns`; a directory stands for the shards its metadata.json lists."""
    import tensorflow as tf

    names = [n.strip() for n in (patterns.split(",") if isinstance(patterns, str) else patterns) if str(n).strip()]
    out: list[str] = []
    for name in names:
        listing = metadata_in(name) if tf.io.gfile.isdir(name) else None
        if listing is not None:
            out += [os.path.join(name, entry["file"]) for entry in listing.get("files", ())]
        else:  # a glob such as DIR/* means the shards, not the metadata.json beside them
            out += [
                f
                for f in expand_patterns(name, what)
                if not (set(name) & set("*?[") and os.path.basename(f) == METADATA_NAME)
            ]
    if not out:
        raise FileNotFoundError(
            f"{what} {patterns!r} matches only {METADATA_NAME}: name the record shards, or their directory."
        )
    return list(dict.fromkeys(out))


def damaged_file_error(scan: "FileScan", listed: dict[str, int]) -> ValueError:
    return ValueError(
        f"record file {scan.describe(listed.get(scan.path))}; re-create it with `python -m "
        "bertjax.prepare`, drop it from the file list, or set config.data.skip_damaged_records=true "
        "to read every file up to its first damage (counted in the log)."
    )


def check_record_set(files: Sequence[str], damaged_ok: bool = False) -> list[str]:
    """Refuses, in one sentence naming the file, record files that are not the complete, fresh set their
    directory's metadata.json lists: an unfinished prepare, a listed shard missing, a shard it does not list
    (left from another run) or one whose size differs (a damaged one: where, unless `damaged_ok`, as
    config.data.skip_damaged_records). Returns the directories whose metadata.json lists
    no shards, or that have none (google-research/bert's records): they cannot be checked; the caller warns."""
    import tensorflow as tf

    unchecked = []
    by_dir: dict[str, list[str]] = {}
    for f in files:
        by_dir.setdefault(os.path.dirname(f), []).append(f)
    for here, matched in by_dir.items():
        if tf.io.gfile.exists(os.path.join(here, STAGING_NAME)):
            raise ValueError(
                f"{here} holds an unfinished record set ({STAGING_NAME}: a prepare into it failed or "
                "was killed); re-run `python -m bertjax.prepare` into it (it clears the leftovers)."
            )
        metadata = metadata_in(here)
        if metadata is None or "files" not in metadata:  # none, or written by hand: no shards listed to check
            unchecked.append(here or ".")
            continue
        listing = os.path.join(here, METADATA_NAME)
        listed = {entry["file"]: entry for entry in metadata["files"]}
        for path in matched:
            if os.path.basename(path) not in listed:
                raise ValueError(
                    f"record file {path} is not in {listing}: it is left from another run; delete it, "
                    "or re-run prepare with --overwrite, which replaces the whole set."
                )
        for name, entry in listed.items():
            path = os.path.join(here, name)
            if not tf.io.gfile.exists(path):
                raise ValueError(
                    f"{listing} lists {name}, which is missing from {here}: the record set is "
                    "incomplete; restore the file or re-run prepare."
                )
            if path not in matched or "bytes" not in entry:
                continue
            size = tf.io.gfile.stat(path).length
            if size != entry["bytes"]:
                scan = scan_file(path)  # damaged (truncated): say where, or leave it to skip_damaged_records
                if scan.problem and damaged_ok:
                    continue
                if scan.problem:
                    raise damaged_file_error(scan, {path: int(entry.get("records", entry.get("instances", 0)))})
                raise ValueError(
                    f"record file {path} has {size:,} bytes but {listing} lists {entry['bytes']:,}: it "
                    "was changed or cut short since prepare wrote it; restore it or re-run prepare."
                )
    return unchecked


def verify_checksums(files: Sequence[str]) -> None:
    """Reads every byte of `files` and compares each file's CRC32C with its metadata.json's (a full read:
    ~1 GB/s a core); files that no metadata.json lists with a checksum are left to `check_record_set`."""
    import tensorflow as tf

    listings: dict[str, dict] = {}
    for path in files:
        here = os.path.dirname(path)
        if here not in listings:
            listings[here] = {entry["file"]: entry for entry in (metadata_in(here) or {}).get("files", ())}
        entry = listings[here].get(os.path.basename(path), {})
        if "crc32c" not in entry:
            continue
        crc = google_crc32c.Checksum()
        with tf.io.gfile.GFile(path, "rb") as f:
            while chunk := f.read(1 << 24):
                crc.update(chunk)
        if crc.hexdigest().decode() != entry["crc32c"]:
            raise ValueError(
                f"record file {path} fails its checksum (crc32c {crc.hexdigest().decode()}, "
                f"{os.path.join(here, METADATA_NAME)} lists {entry['crc32c']}): its bytes changed since "
                "prepare wrote it; re-run prepare."
            )


# --- Damaged files -------------------------------------------------------------------------------------
# TFRecord framing: length (8 bytes little-endian) and its masked CRC (4), the data, the data's masked CRC
# (4). TensorFlow's reader reports a damaged frame by byte offset only, without the file, and cannot read
# past it; walking the frames here names the file, the offset and what is wrong, at ~200 MB/s a core.

FRAME_BYTES = 16
_HEADER = struct.Struct("<QI")


@dataclasses.dataclass(frozen=True)
class FileScan:
    """How much of a record file reads: `records` whole records from the start, ending at byte `end` of
    `size`; `problem` names what stands at `end` when that is not the end of the file ("" when it is)."""

    path: str
    records: int
    end: int
    size: int
    problem: str = ""

    def describe(self, listed: Optional[int] = None) -> str:
        """'PATH has a truncated record at byte N after K good records (...)': one clause for a sentence."""
        lost = (
            f"{listed - self.records:,} of the {listed:,} records metadata.json lists are lost"
            if listed is not None and listed >= self.records
            else f"{self.size - self.end:,} bytes unread"
        )
        return f"{self.path} has {self.problem} at byte {self.end:,} after {self.records:,} good records ({lost})"


def _frame_problem(head: bytes, at: int) -> str:
    if len(head) < _HEADER.size:
        return "a truncated record header"
    if masked_crc(head[:8]) != head[8:12]:
        return "no TFRecord header (it is not a record file)" if at == 0 else "a damaged record header"
    return ""


def record_header_problem(path: str) -> str:
    """What is wrong with the file's first record header ("" when it is one, or the file is empty): a
    non-record file that a glob matched (a README, metadata.json) is named before training starts."""
    import tensorflow as tf

    with tf.io.gfile.GFile(path, "rb") as f:
        head = f.read(_HEADER.size)
    return _frame_problem(head, 0) if head else ""


def scan_file(path: str, chunk_bytes: int = 1 << 24) -> FileScan:
    """Walks every frame of a record file, checking both CRCs, up to the first damage."""
    import tensorflow as tf

    size = tf.io.gfile.stat(path).length
    records = end = 0
    with tf.io.gfile.GFile(path, "rb") as f:
        buf, base = b"", 0  # buf holds the file's bytes from offset `base`
        while end < size:
            pos = end - base
            if len(buf) - pos < _HEADER.size:
                buf, base, pos = buf[pos:] + f.read(max(chunk_bytes, _HEADER.size)), end, 0
            problem = _frame_problem(buf[pos : pos + _HEADER.size], end)
            if problem:
                return FileScan(path, records, end, size, problem)
            length = _HEADER.unpack_from(buf, pos)[0]
            stop = pos + _HEADER.size + length + 4
            if stop > len(buf):
                buf, base, pos = buf[pos:] + f.read(max(chunk_bytes, stop - pos)), end, 0
                stop = _HEADER.size + length + 4
                if stop > len(buf):
                    return FileScan(path, records, end, size, "a truncated record")
            if masked_crc(buf[pos + _HEADER.size : stop - 4]) != buf[stop - 4 : stop]:
                return FileScan(path, records, end, size, "a record whose data fails its CRC check")
            records, end = records + 1, end + FRAME_BYTES + length
    return FileScan(path, records, end, size)


def listed_counts(files: Sequence[str], metadata: Optional[dict]) -> dict[str, int]:
    """Records per file as metadata.json lists them (files it does not list are absent)."""
    if not metadata or not files:
        return {}
    here = os.path.dirname(files[0])
    # "records" since shards carry sizes and checksums; before, "instances" (records too, unless packed)
    return {os.path.join(here, f["file"]): int(f.get("records", f["instances"])) for f in metadata.get("files", ())}
