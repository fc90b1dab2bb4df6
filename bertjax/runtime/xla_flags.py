"""The XLA flags bertjax adds on a machine with NVIDIA GPUs, each there for a measurement; the user's XLA_FLAGS win.

XLA reads XLA_FLAGS once, when its first backend starts, so `apply_gpu_defaults` runs before that
(`cli.quiet`, every job command's start; `aot`, before compiling for GPUs that are not here, so that program is
the one a job would run there). A flag the user already set, to any value, is left alone; on a machine without
an NVIDIA GPU, and compiling for none, nothing is added. A flag earns its place here with a row of
`benchmarks/gpu_profile.py` on a GPU (docs/benchmarks.md), written beside it.
"""

from __future__ import annotations

import os
from typing import Mapping, MutableMapping

from bertjax import runtime


def autotune_cache_dir() -> str:
    """Where XLA:GPU keeps each fusion's autotuning result: $BERTJAX_CACHE_DIR/xla_gpu_autotune (default
    ~/.cache/bertjax/...), shared by every run of this user on this machine."""
    return runtime.cache_dir("xla_gpu_autotune")


def gpu_defaults() -> dict[str, str]:
    """Flag name → value, for NVIDIA GPUs."""
    return {
        # Autotuning results kept across processes, keyed by fusion and device: on an H200 the second compile of
        # BERT-Base's step took 13 s instead of 27 (gpu_profile.py's variants, 2026-11-26), and a job that resumes,
        # or a second run of the same model, skips the search.
        "xla_gpu_per_fusion_autotune_cache_dir": autotune_cache_dir(),
        # BERT's LayerNorms by cuDNN's kernel: BERT-Base seq 128 x 256 53.5 -> 50.3 ms a step on an H200 (1.06x, 33.8
        # -> 36.0% MFU), the losses equal to 5e-6 (gpu_profile.py, 2026-11-28). ModernBERT's bias-less norms are
        # not matched by the rewrite, so its program is unchanged.
        "xla_gpu_enable_cudnn_layer_norm": "true",
    }


def named(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The flags XLA_FLAGS names, name → value ("" for a bare flag); the last of a name counts, as for XLA."""
    return dict(part.lstrip("-").partition("=")[::2] for part in environ.get("XLA_FLAGS", "").split())


def apply_gpu_defaults(environ: MutableMapping[str, str] = os.environ, *, for_gpu: bool = False) -> list[str]:
    """Adds gpu_defaults() to environ["XLA_FLAGS"] on a machine with an NVIDIA GPU (or, `for_gpu`, where a
    program is compiled for one that is not here), except flags it already names; returns the flags added."""
    from bertjax.runtime import gpu_targets

    if not (for_gpu or gpu_targets.gpu_here()):
        return []
    current, already = environ.get("XLA_FLAGS", ""), named(environ)
    defaults = gpu_defaults()
    added = [f"--{name}={value}" for name, value in defaults.items() if name not in already]
    if "xla_gpu_per_fusion_autotune_cache_dir" not in already:
        os.makedirs(defaults["xla_gpu_per_fusion_autotune_cache_dir"], exist_ok=True)
    if added:
        environ["XLA_FLAGS"] = " ".join([current, *added]).strip()
    return added
