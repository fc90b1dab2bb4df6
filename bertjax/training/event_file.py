"""TensorBoard event files written without TensorFlow: importing TF costs every job ~4 s before its first step
(and each run of a fine-tuning sweep or the GLUE suite pays it again).

An event file is a TFRecord file of `Event` protos; each scalar is what `tf.summary.scalar` writes: a float32
tensor tagged for TensorBoard's scalars plugin. The few protobuf fields that takes are encoded here:

    Event         wall_time=1 (double), step=2 (int64), file_version=3 (string), summary=5
    Summary       value=1 (repeated)
    Value         tag=1 (string), tensor=8 (TensorProto), metadata=9 (SummaryMetadata)
    TensorProto   dtype=1 (DT_FLOAT = 1), tensor_shape=2 (empty: a scalar), float_val=5 (packed float)
    SummaryMetadata  plugin_data=1 {plugin_name=1 "scalars"}, data_class=4 (DATA_CLASS_SCALAR = 1)

tests/test_metrics.py checks each Event byte for byte against the one TensorFlow serializes.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from typing import Mapping

from bertjax.data.pretraining.records import masked_crc
from bertjax.runtime import files
from bertjax.runtime.files import is_remote

_FILE_VERSION = b"brain.Event:2"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, data: bytes) -> bytes:
    """A length-delimited field (wire type 2): a string, bytes or an embedded message."""
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _uint(number: int, value: int) -> bytes:
    """A varint field (wire type 0): int64, enum."""
    return _varint(number << 3) + _varint(value)


_SCALAR_METADATA = _field(1, _field(1, b"scalars")) + _uint(4, 1)  # plugin "scalars", DATA_CLASS_SCALAR
_EMPTY_SHAPE = _field(2, b"")


def scalar_value(tag: str, value: float) -> bytes:
    """A Summary's `value` field holding one float32 scalar, as tf.summary.scalar writes it."""
    tensor = _uint(1, 1) + _EMPTY_SHAPE + _field(5, struct.pack("<f", value))  # DT_FLOAT, shape [], float_val
    return _field(1, _field(1, tag.encode("utf-8")) + _field(8, tensor) + _field(9, _SCALAR_METADATA))


def event(step: int, values: bytes = b"", wall_time: float | None = None, file_version: bytes = b"") -> bytes:
    out = struct.pack("<B", 1 << 3 | 1) + struct.pack("<d", time.time() if wall_time is None else wall_time)
    out += _uint(2, step) if step else b""
    out += _field(3, file_version) if file_version else b""
    return out + (_field(5, values) if values else b"")


def _framed(record: bytes) -> bytes:
    length = struct.pack("<Q", len(record))
    return length + masked_crc(length) + record + masked_crc(record)


class EventFileWriter:
    """Appends scalar events to a new `events.out.tfevents.*` file in `directory` (local or gs://)."""

    def __init__(self, directory: str, uploads: "files.BackgroundWrites | None" = None):
        """`uploads`: where an object store's rewrites go (a background thread), else written at once."""
        self._uploads = uploads
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.0.v2"
        self.path = os.path.join(directory, name)
        self._remote = is_remote(directory)
        self._pending = [_framed(event(0, file_version=_FILE_VERSION))]
        self._written = b""
        if not self._remote:
            os.makedirs(directory, exist_ok=True)
            self._file = open(self.path, "ab")
        self.flush()

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        self._pending.append(_framed(event(step, b"".join(scalar_value(tag, v) for tag, v in values.items()))))

    def flush(self) -> None:
        data, self._pending = b"".join(self._pending), []
        if not data:
            return
        if self._remote:  # an object store cannot append: the object is rewritten whole (small: scalars only)
            self._written += data
            if self._uploads is not None:
                self._uploads.put(self.path, self._written)
            else:
                files.write_whole(self.path, self._written)
        else:
            self._file.write(data)
            self._file.flush()

    def close(self) -> None:
        self.flush()
        if not self._remote:
            self._file.close()
