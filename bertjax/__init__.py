"""bertjax: pre-train BERT (masked LM + next sentence prediction) in JAX/Flax, from raw text to checkpoints."""

import importlib

__version__ = "0.1.0"

# Imported on first use, so that `python -m bertjax.prepare` workers do not pay for importing JAX.
_LAZY = {
    "from_pretrained": "bertjax.pretrained", "save_pretrained": "bertjax.hf",
    "BertConfig": "bertjax.model", "BertForPreTraining": "bertjax.model", "BertOutput": "bertjax.model",
    "config_for_size": "bertjax.model",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'bertjax' has no attribute {name!r}")
