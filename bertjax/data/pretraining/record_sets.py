"""A record set's files, before and while they are read: globs and directories expanded; a set checked complete
and fresh against its metadata.json (missing, stale or changed shards, checksums); damaged files scanned (up to
their first bad frame) and counted; the files split over processes; and what changed in a set since a
checkpoint saved its position (names and sizes, not paths, so a moved set resumes)."""

from __future__ import annotations

import dataclasses
import os
import struct
from typing import Optional, Sequence

import google_crc32c

from bertjax.runtime import files as file_layer
from bertjax.data.corpus.sources import expand_patterns
from bertjax.data.pretraining.records import METADATA_NAME, STAGING_NAME, masked_crc, metadata_in

# --- Complete and fresh record sets ---------------------------------------------------------------------


def expand_record_files(patterns: str | Sequence[str], what: str = "record") -> list[str]:
    """Record globs → files, as `expand_patterns`; a directory stands for the shards its metadata.json lists."""
    names = [n.strip() for n in (patterns.split(",") if isinstance(patterns, str) else patterns) if str(n).strip()]
    out: list[str] = []
    for name in names:
        listing = metadata_in(name) if file_layer.isdir(name) else None
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
    no shards, or that have none (google-research/bert's records): they cannot be checked; the caller warns.
    Local or in a bucket: one listing a directory (through the file layer), not a request a shard."""
    unchecked = []
    by_dir: dict[str, list[str]] = {}
    for f in files:
        by_dir.setdefault(os.path.dirname(f), []).append(f)
    for here, matched in by_dir.items():
        sizes = {os.path.basename(f): size for f, (size, _) in file_layer.versions(here).items()}
        if STAGING_NAME in sizes or file_layer.isdir(os.path.join(here, STAGING_NAME)):
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
            if name not in sizes:
                raise ValueError(
                    f"{listing} lists {name}, which is missing from {here}: the record set is "
                    "incomplete; restore the file or re-run prepare."
                )
            if path not in matched or "bytes" not in entry:
                continue
            size = sizes[name]
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
    listings: dict[str, dict] = {}
    for path in files:
        here = os.path.dirname(path)
        if here not in listings:
            listings[here] = {entry["file"]: entry for entry in (metadata_in(here) or {}).get("files", ())}
        entry = listings[here].get(os.path.basename(path), {})
        if "crc32c" not in entry:
            continue
        crc = google_crc32c.Checksum()
        with file_layer.open_file(path, "rb") as f:
            while chunk := f.read(1 << 24):
                crc.update(chunk)
        check_checksum(path, crc.hexdigest().decode(), entry["crc32c"])


def check_checksum(path: str, found: str, listed: str, whom: str = "") -> None:
    """One file's CRC32C against the one metadata.json lists for it."""
    if found != listed:
        raise ValueError(
            f"record file {path} fails its checksum (crc32c {found}, "
            f"{os.path.join(os.path.dirname(path), METADATA_NAME)} lists {listed}): its bytes changed since "
            f"prepare wrote it{whom}; re-run prepare."
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
    non-record file that a glob matched (a README, metadata.json) is named before training starts. A ranged
    read: in a bucket, 12 bytes are fetched, not the file."""
    head = file_layer.read_range(path, 0, _HEADER.size)
    return _frame_problem(head, 0) if head else ""


def scan_file(path: str, chunk_bytes: int = 1 << 24) -> FileScan:
    """Walks every frame of a record file (local, or streamed from a bucket), checking both CRCs, up to the first
    damage."""
    size = file_layer.size(path)
    records = end = 0
    with file_layer.open_file(path, "rb") as f:
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
    return {
        os.path.join(here, f["file"]): int(f["records"] if "records" in f else f["instances"])
        for f in metadata.get("files", ())
    }


def split_files(files: list[str], process_index: int, process_count: int) -> tuple[list[str], bool]:
    """This process's files, and whether examples must be split further (fewer files than processes)."""
    if len(files) >= process_count:
        return files[process_index::process_count], False
    return list(files), True


def common_dir(paths: list[str]) -> str:
    """The deepest directory holding every path ('' when they share none); '/'-separated, gs:// included."""
    common = paths[0].split("/")[:-1] if paths else []
    for p in paths[1:]:
        parts = p.split("/")[:-1]
        n = 0
        while n < min(len(common), len(parts)) and common[n] == parts[n]:
            n += 1
        common = common[:n]
    return "/".join(common)


def files_difference(saved: list, mine: list) -> Optional[str]:
    """What changed between two fingerprints' file lists ([name, bytes] pairs in reading order; a state saved
    before names holds absolute paths, compared by base name), or None when they match."""
    legacy = bool(saved) and isinstance(saved[0], str)
    pairs = lambda files: [(os.path.basename(f), None) if isinstance(f, str) else tuple(f) for f in files]  # noqa: E731
    then, now = dict(pairs(saved)), dict(pairs(mine))
    counts = f"{len(then)} file(s) then, {len(now)} now"
    for name in then:
        if name not in now:
            return f"record file {name} was removed since the checkpoint ({counts})"
    for name in now:
        if name not in then:
            return f"record file {name} was added since the checkpoint ({counts})"
    for name, size in then.items():
        if size is not None and now[name] != size:  # same name, other contents
            return f"record file {name} changed since the checkpoint ({size:,} bytes then, {now[name]:,} now)"
    if list(then) != list(now):  # the seeded file shuffle permutes positions: the order is part of the state
        return "the record files are listed in another order than at the checkpoint"
    if legacy and saved != mine:
        return (
            f"it was saved before record files were named relative to their directory, so it resumes only with "
            f"them at {os.path.dirname(saved[0])}"
        )
    return None


def count_records(files: list[str], metadata: Optional[dict]) -> list[int]:
    """Records per file: from metadata.json's per-shard counts where it lists the file, else by walking its
    frames (which also names a damaged one)."""
    listed = listed_counts(files, metadata)
    counts = []
    for f in files:
        if f in listed:
            counts.append(listed[f])
            continue
        scan = scan_file(f)
        if scan.problem:
            raise damaged_file_error(scan, listed)
        counts.append(scan.records)
    return counts
