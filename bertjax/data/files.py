"""Files on a local disk or in an object store (gs://): local paths through os and shutil, URLs through fsspec
(gcsfs for gs://, imported only for them: record preparation never needs it for local files). gcsfs reads the
clients' standard settings, so the same code reaches a bucket with the machine's credentials, or a GCS
emulator on localhost in the tests (tests/gcs_emulator.py); TensorFlow's own gs:// file system can be pointed
at no emulator, so nothing here goes through it."""

from __future__ import annotations

import json
import os
import shutil
from typing import IO, Any


def is_remote(path: str) -> bool:
    return "://" in path


def _fs(path: str) -> Any:
    """The fsspec file system of a URL, its listings read afresh (another process may have written since)."""
    try:
        import fsspec

        fs = fsspec.core.url_to_fs(path)[0]
    except ImportError as e:
        raise ImportError(
            f"{path}: reading and writing object-store paths needs gcsfs (for gs://): pip install 'bertjax[gcs]' ({e})."
        ) from None
    fs.invalidate_cache()
    return fs


def open_file(path: str, mode: str = "r") -> IO:
    if is_remote(path):
        return _fs(path).open(path, mode)
    return open(path, mode)


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
    if is_remote(src):
        fs = _fs(src)
        if fs.exists(dst):
            fs.rm(dst, recursive=True)
        fs.mv(src, dst, recursive=True)
    else:
        os.replace(src, dst)


def makedirs(path: str) -> None:
    if is_remote(path):
        _fs(path).makedirs(path, exist_ok=True)  # object stores have no directories: nothing to make
    else:
        os.makedirs(path, exist_ok=True)
