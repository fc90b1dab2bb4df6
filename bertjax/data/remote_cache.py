"""Local copies of small files a job reads from an object store (gs://): vocab files, a corpus's files.

The tokenizers read local files, and TensorFlow's own gs:// file system cannot be pointed at an emulator (so
it could never be tested here): such a file in a bucket is read from a copy on the host's disk, made through
the file layer (gcsfs). Record sets are not copied: each process streams its share (data/stream_window.py).

The copies live under $BERTJAX_CACHE_DIR (default ~/.cache/bertjax), one folder per bucket directory (named
by a hash of its URL); a copy whose object is unchanged since (its generation and size, kept beside it in
`.NAME.source`) is not fetched again. Downloads go to a temporary name and are renamed, so a copy cut short
is never read as whole, and processes sharing a host can fetch at once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath

from bertjax import runtime
from bertjax.runtime import files

log = logging.getLogger(__name__)


def cache_root() -> str:
    return runtime.cache_dir("remote")


def _folder(directory: str) -> str:
    """The local folder that mirrors one object-store directory."""
    url = files.resolved(directory).rstrip("/")
    tail = posixpath.basename(url) or "root"
    return os.path.join(cache_root(), f"{tail}-{hashlib.sha256(url.encode()).hexdigest()[:16]}")


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


def copy_of(path: str) -> str:
    """A local path holding path's bytes: path itself when local, else its cached copy (fetched if needed)."""
    if not files.is_remote(path):
        return path
    folder = _folder(posixpath.dirname(path))
    _fetch({path: files.version(path)}, folder)
    return os.path.join(folder, posixpath.basename(path))


def copy_of_dir(directory: str) -> str:
    """A local folder holding the files directly in directory (a Hugging Face or TF1 model directory in a bucket):
    directory itself when local, else its cached copy (what changed since fetched again)."""
    if not files.is_remote(directory):
        return directory
    folder = _folder(directory.rstrip("/"))
    fetched, size = _fetch(files.versions(directory.rstrip("/")), folder)
    if fetched:
        log.info("data: %s → %s: %d file(s), %.1f MB fetched", directory, folder, fetched, size / 1e6)
    return folder
