"""Files on a local disk or in an object store (gs://): local paths through os and shutil, URLs through fsspec
(gcsfs for gs://, imported only for them: record preparation never needs it for local files). gcsfs reads the
clients' standard settings, so the same code reaches a bucket with the machine's credentials, or a GCS
emulator on localhost in the tests (tests/gcs_emulator.py); TensorFlow's own gs:// file system can be pointed
at no emulator, so nothing here goes through it."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import posixpath
import shutil
import tempfile
import threading
from collections.abc import Iterator
from typing import IO, Any

from bertjax.runtime import bucket_outage


def is_remote(path: str) -> bool:
    return "://" in path


def resolved(path: str) -> str:
    """A path compared by where it leads: object-store URLs normalised as strings, local ones resolved."""
    if is_remote(path):
        scheme, rest = path.split("://", 1)
        return f"{scheme}://{posixpath.normpath('/' + rest)[1:]}"
    return os.path.realpath(path)


def filesystem(path: str) -> Any:
    """The fsspec file system of an object-store URL (for what the functions here do not cover)."""
    return _fs(path)


def _url(path: str, name: str) -> str:
    """fsspec's name of an object (bucket/key) as a URL of path's scheme."""
    return name if "://" in name else f"{path.split('://', 1)[0]}://{name}"


def glob(pattern: str) -> list[str]:
    """The paths a glob matches, sorted (URLs for an object store's)."""
    if is_remote(pattern):
        return sorted(_url(pattern, n) for n in _fs(pattern).glob(pattern))
    import glob as globbing

    return sorted(globbing.glob(pattern))


def _version(entry: dict) -> tuple[int, str]:
    return int(entry.get("size") or 0), str(entry.get("generation") or entry.get("etag") or "")


def version(path: str) -> tuple[int, str]:
    """(size, version) of one object (one request); FileNotFoundError when it is not there."""
    return _version(_fs(path).info(path))


def size(path: str) -> int:
    """A file's bytes (an object's: one request)."""
    return version(path)[0] if is_remote(path) else os.path.getsize(path)


def read_range(path: str, start: int, end: int) -> bytes:
    """Bytes [start, end) of a file (fewer at its end): one ranged request for an object, not a whole download."""
    if is_remote(path):
        return _fs(path).cat_file(path, start=start, end=end)
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(max(0, end - start))


def versions(directory: str) -> dict[str, tuple[int, str]]:
    """{path: (size, version)} of the files directly in a directory ({} when there is none). The version changes
    whenever the contents do: an object's generation; a local file's modification time."""
    if is_remote(directory):
        fs = _fs(directory)
        if not fs.isdir(directory):
            return {}
        return {
            _url(directory, e["name"]): _version(e) for e in fs.ls(directory, detail=True) if e.get("type") == "file"
        }
    if not os.path.isdir(directory):
        return {}
    return {
        os.path.join(directory, n): (
            os.path.getsize(os.path.join(directory, n)),
            str(os.stat(os.path.join(directory, n)).st_mtime_ns),
        )
        for n in sorted(os.listdir(directory))
        if os.path.isfile(os.path.join(directory, n))
    }


SCHEMES = ("gs",)  # object stores bertjax reads and writes, each tested against a local server


def _check_scheme(path: str, named: str) -> None:
    scheme = path.split("://", 1)[0]
    if scheme not in SCHEMES:
        raise ValueError(
            f"{named}: bertjax reads and writes {', '.join(s + '://' for s in SCHEMES)} object stores and local or "
            f"mounted disks, not {scheme}:// (untested here); copy the files to a bucket or a disk, or mount it."
        )


def _fs(path: str) -> Any:
    """The fsspec file system of a URL, its listings read afresh (another process may have written since)."""
    _check_scheme(path, path)
    try:
        import fsspec

        fs = fsspec.core.url_to_fs(path)[0]
    except ImportError as e:
        raise ImportError(
            f"{path}: reading and writing object-store paths needs gcsfs (for gs://): pip install 'bertjax[gcs]' ({e})."
        ) from None
    fs.invalidate_cache()
    return fs


def _check_local(path: str, flag: str) -> None:
    """A local path with a `gs:` directory is a bucket URL missing a slash (`gs:/bucket/run`): it would become a
    local ./gs:/bucket/run tree and lose the run at its first save; `gs:bucket/x` is warned about."""
    parts = path.replace(os.sep, "/").split("/")
    if "gs:" in parts:
        raise ValueError(
            f"{flag}={path}: a directory named gs: is a bucket URL missing a slash, and would become a local "
            "./gs:/… tree; write gs://BUCKET/… for a bucket, or rename the local directory."
        )
    if parts[0].startswith("gs:"):
        logging.getLogger(__name__).warning(
            "%s=%s is a local path (gs:BUCKET is not a bucket URL; gs://BUCKET/… is)", flag, path
        )


def forget_listings() -> None:
    """Drops every object-store client's cached listings (gcsfs keeps one per client: orbax's, through etils,
    is not ours), after this process moved objects that those clients listed."""
    import sys

    gcsfs = sys.modules.get("gcsfs")
    if gcsfs is not None:
        for client in list(gcsfs.GCSFileSystem._cache.values()):  # noqa: SLF001  (fsspec's instance cache)
            client.invalidate_cache()


def check_bucket(path: str, flag: str) -> None:
    """Before any work on an object-store path: its bucket exists and these credentials may read it; else one
    sentence naming the flag, the bucket and what to do. A local path: no `gs:` directory (_check_local)."""
    if not is_remote(path):
        _check_local(path, flag)
        return
    _check_scheme(path, f"{flag}={path}")
    scheme, rest = path.split("://", 1)
    bucket = f"{scheme}://{rest.split('/', 1)[0]}"
    down = bucket_outage.unreachable(path, flag)  # a refused connection is not a credentials problem
    if down is not None:
        raise down
    try:
        _fs(path).info(bucket)  # one request (the bucket's metadata; a listing where that is not allowed)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{flag}={path}: the bucket {bucket} does not exist (or this project cannot see it); create it "
            f"(gcloud storage buckets create {bucket}) or correct the name."
        ) from None
    except ImportError:
        raise
    except Exception as e:  # noqa: BLE001  (gcsfs raises HttpError, PermissionError, google.auth errors)
        if bucket_outage.transient(e):  # it did not answer (after the client's retries): not a refusal
            raise bucket_outage.unreachable_sentence(path, flag, e) from None
        text = f"{type(e).__name__}: {e}".splitlines()[0][:200]
        raise PermissionError(
            f"{flag}={path}: {bucket} cannot be read with this machine's credentials ({text}); run "
            "`gcloud auth application-default login` (or give the VM's service account Storage Object Admin on "
            "the bucket) and try again."
        ) from None


def open_file(path: str, mode: str = "r") -> IO:
    if is_remote(path):
        return _fs(path).open(path, mode)
    return open(path, mode)


def read_text(path: str) -> str:
    """A text file's contents as UTF-8 (whatever the machine's locale), newlines as Python's text mode reads them."""
    with _fs(path).open(path, "r", encoding="utf-8") if is_remote(path) else open(path, encoding="utf-8") as f:
        return f.read()


def read_json(path: str) -> Any:
    with open_file(path) as f:
        return json.load(f)


def remove(path: str) -> None:
    if is_remote(path):
        _fs(path).rm(path)
    else:
        os.remove(path)


def listdir(path: str) -> list[str]:
    """The names in a directory; [] when there is none."""
    if is_remote(path):
        fs = _fs(path)
        return [name.rstrip("/").rsplit("/", 1)[-1] for name in fs.ls(path, detail=False)] if fs.isdir(path) else []
    return os.listdir(path) if os.path.isdir(path) else []


def rmtree(path: str) -> None:
    """Removes a directory and what it holds; nothing when there is none."""
    if is_remote(path):
        fs = _fs(path)
        if fs.exists(path):
            fs.rm(path, recursive=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def rename(src: str, dst: str) -> None:
    """Moves src over dst (replacing it); a directory with what it holds (on an object store: copied, then
    deleted)."""
    if is_remote(src):  # copy and delete, as gsutil mv (gcsfs's mv tries a move API only some buckets have)
        fs = _fs(src)
        if fs.exists(dst):
            fs.rm(dst, recursive=True)
        fs.copy(src, dst, recursive=True)
        fs.rm(src, recursive=True)
    else:
        os.replace(src, dst)


def exists(path: str) -> bool:
    return _fs(path).exists(path) if is_remote(path) else os.path.exists(path)


def isdir(path: str) -> bool:
    """A directory; on an object store, a prefix that holds objects."""
    return _fs(path).isdir(path) if is_remote(path) else os.path.isdir(path)


def isfile(path: str) -> bool:
    return _fs(path).isfile(path) if is_remote(path) else os.path.isfile(path)


def write_whole(path: str, data: str | bytes) -> None:
    """Replaces path's contents at once: a reader sees the old or the new, never a part (locally a temporary
    file moved over it; an object store's upload is all or nothing)."""
    raw = data.encode() if isinstance(data, str) else data
    if is_remote(path):
        _fs(path).pipe_file(path, raw)
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(raw)
    os.replace(tmp, path)


def create_new(path: str, data: str | bytes) -> None:
    """Writes path only if nothing is there, atomically; FileExistsError otherwise. Locally O_EXCL; on an object
    store a conditional create (ifGenerationMatch=0), which two hosts cannot both win."""
    raw = data.encode() if isinstance(data, str) else data
    if is_remote(path):
        _fs(path).pipe_file(path, raw, mode="create")
        return
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(raw)


def upload(local: str, path: str) -> None:
    """A local file copied to path (an object store's, or another local one)."""
    if is_remote(path):
        _fs(path).put_file(local, path)
    else:
        shutil.copyfile(local, path)


def upload_tree(local: str, path: str, last: str = "") -> None:
    """Every file under the local directory `local` copied to the same relative path under path; the top-level
    file named `last` after all the others (a commit mark: whoever finds it finds the rest)."""
    names = [
        os.path.relpath(os.path.join(root, n), local)
        for root, _, found in sorted(os.walk(local))
        for n in sorted(found)
    ]
    for name in sorted(names, key=lambda n: n == last):
        upload(os.path.join(local, name), posixpath.join(path, *name.split(os.sep)))


def download(path: str, local: str, version: str = "") -> None:
    """path (an object store's, or a local file) copied to a local file. `version` (an object's generation, as
    `versions` lists it): that generation or FileNotFoundError, in one request, with no lookup before it."""
    if is_remote(path):
        if version:
            _fs(path).get_file(path, local, concurrency=1, generation=version)  # a GET with ?generation=
        else:
            _fs(path).get_file(path, local)
    else:
        shutil.copyfile(path, local)


def makedirs(path: str) -> None:
    if is_remote(path):
        _fs(path).makedirs(path, exist_ok=True)  # object stores have no directories: nothing to make
    else:
        os.makedirs(path, exist_ok=True)


@contextlib.contextmanager
def writing_dir(path: str, last: str = "") -> Iterator[str]:
    """A local directory to write path's files into (safetensors, the tokenizer trainers and the record writers
    write local files only): path itself on a disk; for an object store a temporary one whose tree is uploaded
    to path on success, its top-level file `last` after the rest (upload_tree)."""
    if not is_remote(path):
        makedirs(path)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="bertjax-upload-") as local:
        yield local
        upload_tree(local, path, last=last)


class BackgroundWrites:
    """Whole-object writes off the caller's thread (metrics in a bucket: the step never waits on an upload).
    put(path, data) queues path's newest contents, replacing a pending older one (each holds the whole file,
    so only the last matters); one thread writes them. wait() returns once everything put so far is written;
    an upload's error (after the client's own retries) is raised by the next put, wait or close."""

    def __init__(self) -> None:
        self._pending: dict[str, bytes] = {}
        self._busy = False
        self._error: BaseException | None = None
        self._closed = False
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="bertjax-background-writes", daemon=True)
        self._thread.start()

    def put(self, path: str, data: str | bytes) -> None:
        with self._cv:
            self._raise()
            self._pending[path] = data.encode() if isinstance(data, str) else data
            self._cv.notify_all()

    def wait(self) -> None:
        with self._cv:
            while self._pending or self._busy:
                self._cv.wait()
            self._raise()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            with self._cv:
                self._closed = True
                self._cv.notify_all()
            self._thread.join()

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._closed:
                    self._cv.wait()
                if not self._pending:
                    return
                path, data = self._pending.popitem()
                self._busy = True
            try:
                write_whole(path, data)
            except BaseException as e:  # noqa: BLE001  (handed to the caller's thread)
                with self._cv:
                    self._error = e
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()
