"""A host's bounded window onto a record set in a bucket: its own shards (or byte ranges of them) fetched ahead
of the reader, each deleted once read, so that a pod never copies the set.

Why not copy the set to every host (what bertjax did): a BERT-Large phase-1 set is ~550 GB; 64 hosts would
download 35 TB before step 1, onto 100 GB disks. Here a host fetches only the pieces its process reads, in the
order tf.data will read them (the same seeded file order, iterated ahead of the reader), into a folder of at
most `budget` bytes: step 1 waits for the first pieces only, whatever the set's size.

The reader asks for a piece by name (`local`, from a tf.data map) and says when it has read it (`done`, from a
marker after the piece's last record); a piece is held from its fetch until it is done, then kept (LRU) until
the window needs its room. The saved position (`begin_save`/`end_save`, a few names and two counts in the
pipeline's json) says which pieces the tf.data iterator had open, so a restore fetches them before the
iterator reopens them: nothing is re-read to find the position.

Fewer files than processes: each file is split into `parts` byte ranges, and a piece holds the records whose
frames start in its range (`frames_in`): found by two CRCs at the range's start, never by reading the file from
its beginning, so consecutive ranges split a file's records exactly, and each host downloads ~1/parts of it.

Failures: a request that fails (503, 429, a dropped connection, an outage) is retried with backoff for up to
the bucket's retry budget (bucket_outage.retry_seconds) and counted, never raised; a shard deleted or replaced in
the bucket since the run listed it stops the run in one sentence (`StreamError`). The pieces live under $BERTJAX_CACHE_DIR/stream (one folder a
process and set, emptied at start and at close).
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import hashlib
import logging
import os
import shutil
import struct
import threading
import time
from concurrent import futures
from typing import Callable, Iterator, Optional, Sequence

import google_crc32c

from bertjax import runtime
from bertjax.runtime import bucket_outage, files

log = logging.getLogger(__name__)

CHUNK = 8 << 20  # bytes a ranged read asks for at once
_HEADER = struct.Struct("<QI")
_FRAME = 16  # header (12) + data CRC (4)


class StreamError(bucket_outage.Resumable):
    """A shard the run listed is gone or changed in the bucket, or the bucket failed for too long: the run stops,
    and the same command resumes (`resuming_from` names the step)."""


@dataclasses.dataclass(frozen=True)
class Piece:
    """What a process reads of one record file: all of it, or byte range `part` of `parts`."""

    url: str
    name: str  # relative to the set's directory: what tf.data and the saved position see
    size: int  # the object's bytes when the run listed it
    version: str  # its generation then
    part: int = 0
    parts: int = 1

    @property
    def byte_range(self) -> tuple[int, int]:
        return self.size * self.part // self.parts, self.size * (self.part + 1) // self.parts

    @property
    def whole(self) -> bool:
        return self.parts == 1


def _masked_crc(data: bytes) -> bytes:
    crc = google_crc32c.value(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


class _Bytes:
    """A growing buffer of a file's bytes from offset `base`, filled by ranged reads."""

    def __init__(self, read: Callable[[int, int], bytes], size: int, base: int):
        self.read, self.size, self.base, self.data = read, size, base, b""

    def have(self, end: int) -> bool:
        """Whether bytes up to `end` (capped at the file's size) are in the buffer, fetching more if needed."""
        end = min(end, self.size)
        while self.base + len(self.data) < end:
            start = self.base + len(self.data)
            more = self.read(start, min(self.size, max(end, start + CHUNK)))
            if not more:
                return False
            self.data += more
        return True

    def at(self, start: int, end: int) -> bytes:
        return self.data[start - self.base : end - self.base]

    def drop_before(self, offset: int) -> None:
        self.data, self.base = self.data[offset - self.base :], offset


def _frame_at(buf: _Bytes, offset: int) -> Optional[int]:
    """The frame's length if a whole record with valid CRCs starts at offset, else None."""
    if offset + _FRAME > buf.size or not buf.have(offset + 12):
        return None
    head = buf.at(offset, offset + 12)
    if _masked_crc(head[:8]) != head[8:12]:
        return None
    length = _HEADER.unpack(head)[0]
    end = offset + _FRAME + length
    if end > buf.size or not buf.have(end):
        return None
    return length if _masked_crc(buf.at(offset + 12, end - 4)) == buf.at(end - 4, end) else None


def frames_in(
    read: Callable[[int, int], bytes], size: int, start: int, stop: int, write: Callable[[bytes], None]
) -> int:
    """Writes the whole frames of a record file (`size` bytes, read by `read(a, b)`) that start in [start, stop),
    and returns how many. The first is the first offset ≥ start where a header and its data pass both CRCs (2^-64
    odds of a false match), so the ranges [0, s1), [s1, s2), … of one file hold each of its records once."""
    buf = _Bytes(read, size, start)
    offset = start
    if start > 0:  # resynchronise: the frame chain from byte 0 would need the whole file
        while offset < min(stop, size) and _frame_at(buf, offset) is None:
            offset += 1
            if offset - buf.base > CHUNK:
                buf.drop_before(offset)
    records = 0
    while offset < min(stop, size):
        if not buf.have(offset + 12):
            break
        length = _HEADER.unpack(buf.at(offset, offset + 12))[0]
        end = offset + _FRAME + length
        if not buf.have(end):
            raise ValueError(f"a record frame at byte {offset:,} runs past the end of the file ({size:,} bytes)")
        write(buf.at(offset, end))
        records, offset = records + 1, end
        buf.drop_before(offset)
    return records


def window_folder(directory: str, label: str, process_index: int) -> str:
    """$BERTJAX_CACHE_DIR/stream/NAME-HASH-pI: one process's window onto one set (several processes of a host,
    or a run's training and held-out sets, never share one)."""
    key = f"{files.resolved(directory)}|{label}|{process_index}"
    tail = os.path.basename(directory.rstrip("/")) or "root"
    return os.path.join(
        runtime.cache_dir("stream"), f"{tail}-{hashlib.sha256(key.encode()).hexdigest()[:12]}-p{process_index}"
    )


class ShardWindow:
    """The pieces one process reads, fetched ahead into `folder`, at most `budget` bytes of them at once (more
    only for pieces the reader already holds: it never waits on its own window)."""

    def __init__(
        self,
        pieces: Sequence[Piece],
        folder: str,
        budget: int,
        label: str,
        workers: int = 4,
        checksums: Optional[dict[str, str]] = None,
    ):
        self.pieces = {p.name: p for p in pieces}
        self.folder, self.budget, self.label = folder, budget, label
        self.checksums = checksums or {}
        self._cond = threading.Condition()
        self._present: collections.OrderedDict[str, int] = collections.OrderedDict()  # name → bytes; LRU first
        self._fetching: dict[str, int] = {}  # name → bytes reserved
        self._wanted: list[str] = []  # requested, absent, not yet fetching: fetched first, past the budget
        self._refs: collections.Counter[str] = collections.Counter()
        self._fresh: set[str] = set()  # fetched ahead, not asked for yet
        self._records: dict[str, int] = {}  # records in each fetched piece
        self._order_from: Optional[Callable[[int], Iterator[str]]] = None
        self._order: Optional[Iterator[str]] = None
        self._predicted: collections.deque[str] = collections.deque()
        self._first = 0  # the index in the order of _predicted[0]
        self._consumed = 0  # the index of the next name the reader is expected to ask for
        self._restart_at: Optional[int] = None  # set by the reader, done by the fetcher
        self._generation = 0  # bumped by reset: waiters of an abandoned iterator give up
        self.error: Optional[Exception] = None
        self._closed = False
        self._thread: Optional[threading.Thread] = None
        self._pool = futures.ThreadPoolExecutor(workers, thread_name_prefix="bertjax-stream")
        self.workers = workers
        # What the benchmark and the log report.
        self.fetched_bytes = self.fetched_pieces = self.peak_bytes = self.retries = 0
        self.wait_seconds = 0.0
        self._last_retry_log = 0.0
        self._check_disk()
        shutil.rmtree(folder, ignore_errors=True)  # a killed run's leftovers: this folder is ours alone
        os.makedirs(folder, exist_ok=True)
        atexit.register(self.close)
        bucket_outage.RETRIES.install()  # gcsfs's give-ups counted, not printed with their tracebacks: retried here

    def _check_disk(self) -> None:
        os.makedirs(os.path.dirname(self.folder), exist_ok=True)
        free = shutil.disk_usage(os.path.dirname(self.folder)).free
        largest = max((p.byte_range[1] - p.byte_range[0] for p in self.pieces.values()), default=0)
        if free < min(self.budget, sum(p.size for p in self.pieces.values())) + largest:
            raise OSError(
                f"the stream window of {self.label} needs {self.budget / 2**20:,.0f} MiB in {self.folder} but "
                f"{free / 2**20:,.0f} MiB are free; lower config.data.stream_window_bytes or point "
                "$BERTJAX_CACHE_DIR at a larger disk."
            )

    # --- The order the reader will ask in ----------------------------------------------------------------
    def set_order(self, order_from: Callable[[int], Iterator[str]]) -> None:
        """How to iterate the names a (new) reader will ask for from a given index (its seeded file order); the
        requests of an earlier reader are dropped (its waiters give up)."""
        with self._cond:
            self._order_from = order_from
            self._generation += 1
            self._refs.clear()
            self._wanted.clear()
            self._restart(0)
            self._restart_at = None
            self._cond.notify_all()

    def _restart(self, index: int) -> None:
        self._order = self._order_from(index) if self._order_from else None
        self._predicted.clear()
        self._first = self._consumed = index

    def _predicted_at(self, index: int) -> Optional[str]:
        while self._order is not None and index >= self._first + len(self._predicted):
            try:
                self._predicted.append(next(self._order))
            except StopIteration:
                self._order = None
        i = index - self._first
        return self._predicted[i] if 0 <= i < len(self._predicted) else None

    def _sync_order(self) -> None:
        """The fetcher's thread alone iterates the order (TensorFlow ops never run inside tf.data's callbacks)."""
        if self._restart_at is not None:
            self._restart(self._restart_at)
            self._restart_at = None
        while self._predicted and self._first < self._consumed - 1:  # names already asked for
            self._predicted.popleft()
            self._first += 1

    # --- The reader's side (tf.data's threads) ----------------------------------------------------------
    def local(self, index: int, name: str) -> str:
        """Blocks until the piece `name`, the reader's `index`-th request, is in the folder, and holds it for the
        reader; returns the name."""
        start = time.perf_counter()
        with self._cond:
            generation = self._generation
            if name not in self.pieces:
                raise StreamError(f"{self.label}: {name} is not one of this process's record files")
            if index + 1 < self._consumed - 1:  # a new pass of an eval set: the fetcher restarts its order there
                self._restart_at = index
                self._consumed = index + 1
            else:
                self._consumed = max(self._consumed, index + 1)
            self._refs[name] += 1
            self._fresh.discard(name)
            if name not in self._present and name not in self._fetching and name not in self._wanted:
                self._wanted.append(name)
            self._ensure_thread()
            self._cond.notify_all()
            while name not in self._present and generation == self._generation:
                if self.error is not None:
                    raise self.error
                self._cond.wait(0.5)
            self.wait_seconds += time.perf_counter() - start
        return name

    def done(self, name: str) -> None:
        """The reader has read the piece to its end: it may leave when the window needs room."""
        with self._cond:
            if self._refs[name] > 0:
                self._refs[name] -= 1
            if name in self._present:
                self._present.move_to_end(name)
            # Over the budget (the reader's own pieces may take it past): what was read leaves now, but not the
            # pieces fetched ahead that the reader has not asked for yet.
            self._make_room(0, self._fresh)
            self._cond.notify_all()

    # --- Position -----------------------------------------------------------------------------------------
    def begin_save(self) -> tuple[int, list[str]]:
        """Before the iterator's state is written: where the reader was, and the pieces it held."""
        with self._cond:
            return self._consumed, sorted(n for n, k in self._refs.items() if k > 0)

    def end_save(self, begun: tuple[int, list[str]]) -> dict:
        """After it is written: the saved position (the iterator's lies between the two calls)."""
        with self._cond:
            return {"consumed": begun[0], "ahead": max(0, self._consumed - begun[0]), "open": begun[1]}

    def restore(self, position: dict) -> None:
        """Before the iterator's state is read: the pieces it may reopen fetched (and held), the order resumed."""
        with self._cond:
            self._generation += 1
            self._refs.clear()
            self._wanted.clear()
            self._restart(int(position.get("consumed", 0)))
            self._restart_at = None
            ahead = [self._predicted_at(self._consumed + i) for i in range(int(position.get("ahead", 0)))]
            needed = list(dict.fromkeys([*position.get("open", ()), *(n for n in ahead if n is not None)]))
            missing = [n for n in needed if n not in self.pieces]
            if missing:
                raise StreamError(
                    f"{self.label}: the saved position holds {missing[0]}, not a record file of this process"
                )
            for name in needed:
                self._refs[name] += 1  # released by its done marker; a spare one when the reader asks again
            self._cond.notify_all()
        for name in needed:
            self.local_blocking(name)

    def local_blocking(self, name: str) -> None:
        """Fetches a piece now if it is absent (the restore's own pieces)."""
        with self._cond:
            if name in self._present:
                return
            if name not in self._wanted and name not in self._fetching:
                self._wanted.append(name)
            self._ensure_thread()
            self._cond.notify_all()
            while name not in self._present:
                if self.error is not None:
                    raise self.error
                self._cond.wait(0.5)

    # --- The fetcher -----------------------------------------------------------------------------------------
    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="bertjax-stream-window", daemon=True)
            self._thread.start()

    def _used(self) -> int:
        return sum(self._present.values()) + sum(self._fetching.values())

    def _piece_bytes(self, name: str) -> int:
        a, b = self.pieces[name].byte_range
        return b - a

    def _make_room(self, need: int, keep: set[str]) -> bool:
        """Deletes read pieces (least recently read first) until `need` more bytes fit the budget."""
        for name in list(self._present):
            if self._used() + need <= self.budget:
                break
            if self._refs[name] == 0 and name not in keep:
                os.remove(os.path.join(self.folder, name))
                del self._present[name]
                self._fresh.discard(name)
        return self._used() + need <= self.budget

    def _next(self) -> Optional[str]:
        """What to fetch next: what the reader waits for (past the budget), else the next predicted piece that fits."""
        self._sync_order()
        while self._wanted:
            name = self._wanted.pop(0)
            if name not in self._present and name not in self._fetching:
                self._make_room(self._piece_bytes(name), set())
                return name
        upcoming: set[str] = set()
        for index in range(self._consumed, self._consumed + 4 * max(1, len(self.pieces)) + 64):
            name = self._predicted_at(index)
            if name is None:
                return None
            if name not in self._present and name not in self._fetching:
                return name if self._make_room(self._piece_bytes(name), upcoming) else None
            upcoming.add(name)
            if self._used() >= self.budget:
                return None
        return None

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and self.error is None:
                    name = self._next() if len(self._fetching) < self.workers else None
                    if name is not None:
                        break
                    self._cond.wait(0.5)
                if self._closed or self.error is not None:
                    return
                self._fetching[name] = self._piece_bytes(name)
                self.peak_bytes = max(self.peak_bytes, self._used())
            self._pool.submit(self._fetch, name)

    def _fetch(self, name: str) -> None:
        try:
            written, records = self._download(self.pieces[name])
        except Exception as e:  # noqa: BLE001  (StreamError, or retries exhausted: the reader raises it)
            with self._cond:
                self.error = e if isinstance(e, StreamError) else StreamError(f"{self.label}: {name}: {e}")
                self._fetching.pop(name, None)
                self._cond.notify_all()
            return
        with self._cond:
            self._fetching.pop(name)
            self._present[name] = written
            if not self._refs[name]:
                self._fresh.add(name)
            self._records[name] = records
            self.fetched_bytes += written
            self.fetched_pieces += 1
            self.peak_bytes = max(self.peak_bytes, self._used())
            if set(self._records) == set(self.pieces) and not any(self._records.values()):
                self.error = StreamError(
                    f"{self.label}: this process's byte ranges of {len(self.pieces)} record file(s) hold no whole "
                    "record (the records are larger than a range); use fewer processes, or write more records or "
                    "shards."
                )
            self._cond.notify_all()

    def _download(self, piece: Piece) -> tuple[int, int]:
        """The piece into the folder (through a temporary name); (bytes, records or -1 when not counted)."""
        if self._closed:  # close() removed the folder: make nothing again
            raise StreamError(f"{self.label}: the window is closed")
        target = os.path.join(self.folder, piece.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        partial = f"{target}.partial"
        if piece.whole:  # one request: the generation the run listed, or not found (deleted or replaced since)
            self._retrying(lambda: files.download(piece.url, partial, piece.version), piece)
            written = os.path.getsize(partial)
            if written != piece.size:
                raise self._changed(piece, f"it has {written:,} bytes now, {piece.size:,} when the run listed it")
            records = -1 if written else 0
            if piece.name in self.checksums:
                with open(partial, "rb") as f:
                    found = google_crc32c.Checksum()
                    while chunk := f.read(CHUNK):
                        found.update(chunk)
                if found.hexdigest().decode() != self.checksums[piece.name]:
                    raise self._changed(piece, "its CRC32C differs from metadata.json's")
        else:  # ranged reads name no generation: the object is checked once before them
            self._retrying(lambda: self._check_unchanged(piece), piece)
            start, stop = piece.byte_range
            with open(partial, "wb") as out:
                records = frames_in(
                    lambda a, b: self._retrying(lambda: files.read_range(piece.url, a, b), piece),
                    piece.size,
                    start,
                    stop,
                    out.write,
                )
            written = os.path.getsize(partial)
        os.replace(partial, target)
        return written, records

    def _check_unchanged(self, piece: Piece) -> None:
        """A StreamError saying how the object differs from the one the run listed, if it does."""
        try:
            size, version = files.version(piece.url)
        except FileNotFoundError:
            raise self._changed(piece, "it was deleted") from None
        if (size, version) != (piece.size, piece.version):
            raise self._changed(
                piece, f"it was replaced (generation {version}, {piece.version} when the run listed it)"
            )

    def _changed(self, piece: Piece, what: str) -> StreamError:
        return StreamError(
            f"record file {piece.url} changed in the bucket while the run read it ({what}), so the run stopped: put "
            "the set back as it was (or point the config at a new set and a new workdir) and rerun the same command, "
            f"which resumes from {StreamError.RESUME}."
        )

    def _retrying(self, call: Callable, piece: Piece):
        """call(), retried with backoff for up to the retry budget on a transient error (bucket_outage.transient)."""
        budget = bucket_outage.retry_seconds()
        deadline, delay = time.monotonic() + budget, 0.5
        while True:
            try:
                return call()
            except StreamError:
                raise
            except FileNotFoundError:  # its listed generation is gone: one more request says how (a failure path)
                self._retrying(lambda: self._check_unchanged(piece), piece)
                raise self._changed(piece, "its listed generation is gone") from None
            except PermissionError:
                raise
            except Exception as e:  # noqa: BLE001  (gcsfs and aiohttp raise many kinds for one outage)
                if not bucket_outage.transient(e):  # a mistake in the code or the data: at once, not after 15 minutes
                    raise
                if self._closed or time.monotonic() > deadline:
                    raise StreamError(
                        f"reading {piece.url} failed for {bucket_outage.duration(budget)} ({type(e).__name__}: "
                        f"{str(e).splitlines()[0][:160] if str(e) else ''}), so the run stopped: rerun the same "
                        f"command when the bucket answers, and it resumes from {StreamError.RESUME}."
                    ) from None
                with self._cond:
                    self.retries += 1
                    now = time.monotonic()
                    if now - self._last_retry_log > 30:
                        self._last_retry_log = now
                        log.warning(
                            "stream: %s: %d failed request(s) retried so far (last: %s); still trying",
                            self.label,
                            self.retries,
                            type(e).__name__,
                        )
                time.sleep(delay)
                delay = min(delay * 2, 15.0)

    # --- End --------------------------------------------------------------------------------------------------
    def stats(self) -> dict:
        with self._cond:
            return {
                "fetched_bytes": self.fetched_bytes,
                "fetched_pieces": self.fetched_pieces,
                "peak_bytes": self.peak_bytes,
                "budget_bytes": self.budget,
                "retries": self.retries,
                "wait_seconds": round(self.wait_seconds, 3),
            }

    def close(self) -> None:
        """Stops fetching and deletes the folder; the window's figures go to the log."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._generation += 1
            self._cond.notify_all()
        self._pool.shutdown(wait=False, cancel_futures=True)  # a fetch in flight ends at its next retry
        shutil.rmtree(self.folder, ignore_errors=True)
        if self.fetched_pieces:
            log.info(
                "stream: %s: %s MB fetched in %d piece(s), at most %s MB on disk (window %s MB), %d request(s) "
                "retried, the reader waited %.1f s",
                self.label,
                f"{self.fetched_bytes / 1e6:,.1f}",
                self.fetched_pieces,
                f"{self.peak_bytes / 1e6:,.1f}",
                f"{self.budget / 1e6:,.1f}",
                self.retries,
                self.wait_seconds,
            )
