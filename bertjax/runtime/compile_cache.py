"""JAX's persistent compilation cache, on for bertjax's commands: a job that resumes after a preemption, a sweep's
next run and the same model trained again load their compiled step from disk instead of compiling it again.

Where: $BERTJAX_CACHE_DIR/jax_compilation_cache (default ~/.cache/bertjax/jax_compilation_cache, beside XLA:GPU's
autotuning results in runtime/xla_flags.py), this user's on this machine, at most MAX_BYTES: the least recently
used programs are evicted first. jax keys each program by its HLO, the jax and XLA versions, the compiler options
and flags and the devices, so a cache never hands one jax's program to another. Programs that compile in under a
second are not kept (jax's own threshold): the cache holds the steps, not every small helper.

The user's own settings win: JAX_COMPILATION_CACHE_DIR (or jax.config's `jax_compilation_cache_dir`) names another
folder, JAX_ENABLE_COMPILATION_CACHE=false turns caching off, and BERTJAX_COMPILATION_CACHE=0 turns off only this
default. Importing bertjax as a library changes nothing: `enable` runs at each command's start (`cli.quiet`).
"""

from __future__ import annotations

import logging
import os
from typing import Mapping, Optional

from bertjax import runtime
from bertjax.runtime import xla_flags

log = logging.getLogger("bertjax")

MAX_BYTES = 8 * 2**30  # an entry is a program's code, not its weights: a 12-layer BERT-Base-sized CPU step, 0.8 MB
OFF = "BERTJAX_COMPILATION_CACHE"
_OFF_WORDS = ("0", "false", "no", "off")
_hits = [0]
_listening = [False]


def default_dir(environ: Mapping[str, str] = os.environ) -> str:
    return runtime.cache_dir("jax_compilation_cache", environ)


def _count_hits(event: str, **_: object) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        _hits[0] += 1


def hits() -> int:
    """Programs loaded from the persistent cache so far in this process (counted once `enable` ran)."""
    return _hits[0]


def enable(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """Turns the persistent cache on in default_dir() unless the user chose a folder or turned caching off; returns
    the folder compiled programs are kept in, or None when none is. Call before the first compile."""
    import jax

    if not _listening[0]:
        jax.monitoring.register_event_listener(_count_hits)
        _listening[0] = True
    if not jax.config.jax_enable_compilation_cache:  # JAX_ENABLE_COMPILATION_CACHE=false
        return None
    if "xla_gpu_per_fusion_autotune_cache_dir" in xla_flags.named(environ):
        # XLA_FLAGS names XLA:GPU's autotuning folder (runtime/xla_flags.py's, or the user's): jax would move it
        # into the compilation cache's folder, over that flag.
        jax.config.update("jax_persistent_cache_enable_xla_caches", "none")
    chosen = jax.config.jax_compilation_cache_dir  # JAX_COMPILATION_CACHE_DIR, or set in code
    if chosen or environ.get(OFF, "").strip().lower() in _OFF_WORDS:
        return chosen or None
    folder = default_dir(environ)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:  # a read-only home: compile as before, and say so once
        log.warning("compile: no compilation cache (%s cannot be made: %s); set BERTJAX_CACHE_DIR elsewhere", folder, e)
        return None
    try:
        import filelock  # noqa: F401  (jax's eviction locks the folder with it)

        jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    except ImportError:  # pragma: no cover  (a dependency of bertjax; without it the cache is not bounded)
        log.warning("compile: the compilation cache in %s is unbounded: `pip install filelock` bounds it", folder)
    jax.config.update("jax_compilation_cache_dir", folder)
    return folder
