"""Files on a local disk or behind a URL (gs:// and friends): local paths through os and shutil, URLs through
TensorFlow's file systems, imported only for them (record preparation runs without TensorFlow otherwise)."""

from __future__ import annotations

import json
import os
import shutil
from typing import IO, Any


def is_remote(path: str) -> bool:
    return "://" in path


def open_file(path: str, mode: str = "r") -> IO:
    if is_remote(path):
        import tensorflow as tf

        return tf.io.gfile.GFile(path, mode)
    return open(path, mode)


def read_json(path: str) -> Any:
    with open_file(path) as f:
        return json.load(f)


def remove(path: str) -> None:
    if is_remote(path):
        import tensorflow as tf

        tf.io.gfile.remove(path)
    else:
        os.remove(path)


def listdir(path: str) -> list[str]:
    """The names in a directory; [] when there is none."""
    if is_remote(path):
        import tensorflow as tf

        return [name.rstrip("/") for name in tf.io.gfile.listdir(path)] if tf.io.gfile.isdir(path) else []
    return os.listdir(path) if os.path.isdir(path) else []


def rmtree(path: str) -> None:
    """Removes a directory and what it holds; nothing when there is none."""
    if is_remote(path):
        import tensorflow as tf

        if tf.io.gfile.exists(path):
            tf.io.gfile.rmtree(path)
    else:
        shutil.rmtree(path, ignore_errors=True)


def rename(src: str, dst: str) -> None:
    """Moves src over dst (replacing it)."""
    if is_remote(src):
        import tensorflow as tf

        tf.io.gfile.rename(src, dst, overwrite=True)
    else:
        os.replace(src, dst)


def makedirs(path: str) -> None:
    if is_remote(path):
        import tensorflow as tf

        tf.io.gfile.makedirs(path)
    else:
        os.makedirs(path, exist_ok=True)
