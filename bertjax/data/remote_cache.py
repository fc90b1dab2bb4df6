"""Local copies of what a job reads from an object store (gs://): record sets and vocab files.

TensorFlow's record readers and the tokenizers read local files, and TensorFlow's own gs:// file system cannot
be pointed at an emulator (so it could never be tested here). A job whose records or vocab are in a bucket
therefore reads them from a copy on the host's disk, made through the file layer (gcsfs) before training:
the input pipeline then runs at local-disk speed, and its checkpointed position is by file name and size, so
a run resumes on the copies of a later job, or on the bucket's files themselves.

The copies live under $BERTJAX_CACHE_DIR (default ~/.cache/bertjax), one folder per bucket directory (named
by a hash of its URL); a copy whose object is unchanged since (its generation and size, kept beside it in
`.NAME.source`) is not fetched again. Downloads go to a temporary name and are renamed, so a copy cut short
is never read as whole, and processes sharing a host can fetch at once. Every host copies the whole set its patterns name (each then reads its own share).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import time
from typing import Sequence

from bertjax import runtime
from bertjax.data import files
from bertjax.data.pretraining.records import METADATA_NAME, STAGING_NAME

log = logging.getLogger(__name__)


def cache_root() -> str:
    return runtime.cache_dir("remote")


def _folder(directory: str) -> str:
    """The local folder that mirrors one object-store directory."""
    url = files.resolved(directory).rstrip("/")
    tail = posixpath.basename(url) or "root"
    return os.path.join(cache_root(), f"{tail}-{hashlib.sha256(url.encode()).hexdigest()[:16]}")


def _is_glob(name: str) -> bool:
    return bool(set(name) & set("*?["))


def _source(folder: str, url: str) -> str:
    return os.path.join(folder, f".{posixpath.basename(url)}.source")


def _current(folder: str, url: str, size: int, version: str) -> bool:
    """Whether the copy of url in folder is of the object as it is now."""
    path = os.path.join(folder, posixpath.basename(url))
    try:
        with open(_source(folder, url)) as f:
            recorded = json.load(f)
    except (OSError, ValueError):
        return False
    return os.path.isfile(path) and os.path.getsize(path) == size and recorded == [url, size, version]


def _fetch(objects: dict[str, tuple[int, str]], folder: str) -> tuple[int, int]:
    """Copies {URL: (size, version)} into folder, skipping current copies; (files fetched, bytes)."""
    os.makedirs(folder, exist_ok=True)
    wanted = [url for url, (size, version) in objects.items() if not _current(folder, url, size, version)]
    if not wanted:
        return 0, 0
    suffix = f".{os.getpid()}.partial"
    local = {url: os.path.join(folder, posixpath.basename(url)) for url in wanted}
    fs = files.filesystem(wanted[0])
    fs.get(wanted, [local[url] + suffix for url in wanted])  # concurrent (gcsfs is asynchronous)
    for url in wanted:
        os.replace(local[url] + suffix, local[url])
        with open(_source(folder, url) + suffix, "w") as f:
            json.dump([url, *objects[url]], f)
        os.replace(_source(folder, url) + suffix, _source(folder, url))
    return len(wanted), sum(objects[url][0] for url in wanted)


def record_set(patterns: str | Sequence[str], what: str = "config.data.train_files") -> str | tuple[str, ...]:
    """Record patterns (globs, directories, comma lists) with every gs:// one replaced by the same pattern over
    a local copy of its directory's matching shards and metadata.json; local patterns are returned as given."""
    names = [n.strip() for n in (patterns.split(",") if isinstance(patterns, str) else patterns) if str(n).strip()]
    if not any(files.is_remote(n) for n in names):
        return patterns
    out = []
    for name in names:
        if not files.is_remote(name):
            out.append(name)
            continue
        directory = name.rstrip("/") if not _is_glob(name) and files.isdir(name) else posixpath.dirname(name)
        if not files.isdir(directory):
            raise FileNotFoundError(f"{what}: {name} matches nothing (no objects under {directory}/).")
        listing = files.versions(directory)
        if _is_glob(name):
            matched = set(files.glob(name))
            chosen = {u: s for u, s in listing.items() if u in matched or posixpath.basename(u) == METADATA_NAME}
        else:
            chosen = listing
        if not chosen:
            raise FileNotFoundError(f"{what}: {name} matches no record files.")
        folder = _folder(directory)
        if files.exists(posixpath.join(directory, STAGING_NAME)):  # an unfinished prepare: refused as locally
            os.makedirs(os.path.join(folder, STAGING_NAME), exist_ok=True)
        start = time.perf_counter()
        fetched, size = _fetch(chosen, folder)
        seconds = time.perf_counter() - start
        log.info(
            "data: %s → %s: %d file(s) fetched (%.1f MB in %.1f s, %.0f MB/s), %d already there",
            name,
            folder,
            fetched,
            size / 1e6,
            seconds,
            size / 1e6 / max(seconds, 1e-9),
            len(chosen) - fetched,
        )
        out.append(os.path.join(folder, posixpath.basename(name)) if _is_glob(name) else folder)
    return ",".join(out) if isinstance(patterns, str) else tuple(out)


def copy_of(path: str) -> str:
    """A local path holding path's bytes: path itself when local, else its cached copy (fetched if needed)."""
    if not files.is_remote(path):
        return path
    folder = _folder(posixpath.dirname(path))
    _fetch({path: files.version(path)}, folder)
    return os.path.join(folder, posixpath.basename(path))
