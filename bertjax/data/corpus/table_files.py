"""The bytes and batches of table corpus files (table.py reads its rows from them): Arrow IPC streams and
files, and JSON Lines from plain, gzip and zstd files, read in chunks from an offset; a damaged or truncated
file is one sentence naming it."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from typing import Any

from bertjax.data.corpus.base import open_binary
from bertjax.runtime import files
from bertjax.runtime.files import is_remote

CHUNK = 1 << 20
# zstd input is fed 64 KiB at a time: one call's output is the input times the compression ratio (20x and
# more on repetitive text), and a 1 MiB feed made peak RSS grow with such a corpus.
ZSTD_FEED = 1 << 16


def why(e: Exception) -> str:
    """An exception's message on one line (Arrow's run over several)."""
    return " ".join(str(e).split()).rstrip(".")


def arrow_reader(path: str, mapped: bool = False) -> Any:
    """An Arrow IPC stream reader (what datasets writes), or a file reader. `mapped`: memory-mapped, for
    reading batch headers only (row counts, the schema); the texts are read through a plain file, whose
    buffers are freed batch by batch, where touched mapped pages would add the file's size to the RSS."""
    import pyarrow as pa

    try:
        if is_remote(path):  # through the file layer (gcsfs), which the clients' settings point anywhere
            data = pa.PythonFile(files.open_file(path, "rb"), mode="r")
        else:
            data = pa.memory_map(path) if mapped else pa.OSFile(path, "rb")
        try:
            return pa.ipc.open_stream(data)
        except pa.ArrowInvalid:
            data.seek(0)
            return pa.ipc.open_file(data)
    except (pa.ArrowException, OSError) as e:
        raise ValueError(
            f"{path} is not a readable Arrow file ({why(e)}): it is damaged or truncated; write or download it again."
        ) from None


def arrow_schema(path: str) -> Any:
    return arrow_reader(path, mapped=True).schema


def arrow_batches(path: str, mapped: bool = False) -> Iterator[Any]:
    import pyarrow as pa

    reader = arrow_reader(path, mapped)
    batches = (
        (reader.get_batch(i) for i in range(reader.num_record_batches))
        if hasattr(reader, "num_record_batches")
        else reader
    )
    try:
        yield from batches
    except (pa.ArrowException, OSError) as e:
        raise ValueError(
            f"{path} is not a readable Arrow file ({why(e)}): it is damaged or truncated; write or download it again."
        ) from None


def json_lines(path: str, offset: int = 0) -> Iterator[bytes]:
    """The lines of a JSON Lines file (newline kept off), decompressed as its extension says, streamed; from
    byte `offset` of an uncompressed file (a line's start)."""
    name = path.lower()
    with open_binary(path, offset) as raw:
        if name.endswith(".gz"):
            chunks = gzip_chunks(raw, path)
        elif name.endswith(".zst"):
            chunks = zstd_chunks(raw, path)
        else:
            chunks = iter(lambda: raw.read(CHUNK), b"")
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


def gzip_chunks(raw: Any, path: str) -> Iterator[bytes]:
    try:
        with gzip.GzipFile(fileobj=raw, mode="rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise ValueError(
            f"{path} is not a complete gzip stream ({why(e)}): it is truncated or damaged; compress or "
            "download it again."
        ) from None


def zstd_chunks(raw: Any, path: str) -> Iterator[bytes]:
    """Decompressed chunks of every zstd frame. A stream that stops inside a frame is refused: zstandard's
    own stream reader ends such a stream silently, losing its last documents."""
    try:
        import zstandard
    except ImportError:
        raise ImportError(f"Reading {path} needs zstandard: pip install zstandard.") from None
    dctx = zstandard.ZstdDecompressor()
    dobj, in_frame = dctx.decompressobj(), False
    try:
        while data := raw.read(ZSTD_FEED):
            while data:
                in_frame = True
                out = dobj.decompress(data)
                if out:
                    yield out
                data = b""
                if dobj.eof:  # a frame ended: the next one (if any) starts in unused_data
                    data, dobj, in_frame = dobj.unused_data, dctx.decompressobj(), False
    except zstandard.ZstdError as e:
        raise ValueError(
            f"{path} is not a valid zstd stream ({why(e)}): it is damaged; compress or download it again."
        ) from None
    if in_frame:
        raise ValueError(f"{path} is a truncated zstd stream (it ends inside a frame): compress or download it again.")
