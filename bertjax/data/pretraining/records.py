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

from bertjax.runtime import files
from bertjax.runtime import files as file_io  # infer_schema: its parameter `files` shadows the module

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
        files.rename(self._tmp, self.path)

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
                files.remove(self._tmp)
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
    path = os.path.join(directory, METADATA_NAME)
    return files.read_json(path) if files.exists(path) else None


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

    head = file_io.read_range(files[0], 0, 12)  # the first frame, by ranged reads (local or in a bucket)
    if not head:
        raise ValueError(f"{files[0]} holds no records; re-run prepare or drop it from the file list.")
    length = struct.unpack("<Q", head[:8])[0]
    example = tf.train.Example.FromString(file_io.read_range(files[0], 12, 12 + length))
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
