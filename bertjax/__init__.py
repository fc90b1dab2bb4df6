"""bertjax: pre-train BERT (masked LM + next sentence prediction) in JAX/Flax, from raw text to checkpoints."""

import importlib
import importlib.metadata
import re
import sys

__version__ = "0.1.0"

# The oldest jax bertjax runs on (setup.cfg says why): Colab and many images keep whatever jax they have,
# and an older one fails deep inside a step (splash attention refuses head size 64): say so at import.
MIN_JAX = (0, 7, 1)


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


def _check_jax() -> None:
    """Read from the installed metadata, without importing jax (record preparation never imports it)."""
    try:
        installed = importlib.metadata.version("jax")
    except importlib.metadata.PackageNotFoundError:
        return  # the first module that needs jax says it is missing
    if _release(installed) >= MIN_JAX:
        return
    wanted = ".".join(map(str, MIN_JAX))
    sentence = (
        f"bertjax needs jax>={wanted} but jax {installed} is installed; upgrade it with "
        f"pip install -U 'jax>={wanted}' (on TPUs 'jax[tpu]>={wanted}', on NVIDIA GPUs "
        f"'jax[cuda12]>={wanted}'), then restart the Python process."
    )
    if sys.argv[:1] == ["-m"]:  # `python -m bertjax.X` is importing its package: the sentence alone
        raise SystemExit(f"bertjax: {sentence}")
    raise ImportError(sentence)


_check_jax()

# Imported on first use, so that `python -m bertjax.prepare` workers do not pay for importing JAX.
_LAZY = {
    "from_pretrained": "bertjax.interop.pretrained",
    "save_pretrained": "bertjax.interop.pretrained",
    "BertConfig": "bertjax.models.bert.config",
    "BertForPreTraining": "bertjax.models.bert.model",
    "BertOutput": "bertjax.models.bert.model",
    "config_for_size": "bertjax.models.bert.config",
    "ModernBertConfig": "bertjax.models.modernbert.config",
    "ModernBertForMaskedLM": "bertjax.models.modernbert.model",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'bertjax' has no attribute {name!r}")
