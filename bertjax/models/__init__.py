"""Encoder families and the one registry the rest of the code asks about them.

BERT (bertjax/model.py, architecture.py, hf.py) and ModernBERT (models/modernbert*.py). A family is named by
its Hugging Face `model_type`; `family_of(path)` reads it from a directory's config.json. The registry is
imported without JAX (its entries import their modules when asked).
"""

from __future__ import annotations

import json
import os

FAMILIES = ("bert", "modernbert")


def family_of(path: str) -> str:
    """The family of a Hugging Face directory, from config.json's model_type (BERT when it has none)."""
    config = os.path.join(path, "config.json")
    with open(config, encoding="utf-8") as f:
        try:
            model_type = json.load(f).get("model_type", "bert")
        except (json.JSONDecodeError, AttributeError):
            return "bert"  # bert's reader says what is wrong with the file
    if model_type not in FAMILIES:
        raise ValueError(f"{config}: model_type={model_type!r} is not BERT or ModernBERT; bertjax loads "
                         f"{' and '.join(repr(f) for f in FAMILIES)} checkpoints (load this one with transformers).")
    return model_type
