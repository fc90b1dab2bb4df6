"""The process around a job: the allocator (tcmalloc), TensorFlow imported without Keras, one job per workdir
(lock.py), which directories are bertjax's to write (ownership.py: another tool's files are refused before
any work starts), the XLA flags and the compilation cache it adds, and where its caches live (`cache_dir`)."""

from __future__ import annotations

import os
from typing import Mapping


def cache_dir(name: str, environ: Mapping[str, str] = os.environ) -> str:
    """$BERTJAX_CACHE_DIR/NAME (default ~/.cache/bertjax/NAME): one of bertjax's caches on this machine, this user's."""
    return os.path.join(environ.get("BERTJAX_CACHE_DIR") or os.path.expanduser("~/.cache/bertjax"), name)
