"""Encoder families and the one registry the rest of the code asks about them.

A family is named by its Hugging Face `model_type` and lives in three modules of this package:

    <name>_config.py   the architecture dataclass, its sizes, `from_model_config(config.model)` (no JAX)
    <name>.py          the Flax modules; `from_config`, `init_params`, `pretraining_inputs`, `flops_per_sequence`
    <name>_hf.py       transformers directories both ways: `load`, `save_pretrained`, `save_finetuned`

What they share is in layers.py (activations, dtypes, remat, dropout), options.py (the option names) and
hf_files.py (config.json and safetensors). The trainer, checkpoints, export, fine-tuning, the summary and
the AOT report ask `get(name)` or `of(architecture)` and never branch on the family. The registry imports
no JAX: a family's modules are imported when asked for.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
from types import ModuleType
from typing import Any

FAMILIES = ("bert", "modernbert")


@dataclasses.dataclass(frozen=True)
class Family:
    name: str  # transformers' model_type; config.model.family

    def _module(self, suffix: str) -> ModuleType:
        return importlib.import_module(f"bertjax.models.{self.name}.{suffix}")

    @property
    def config(self) -> ModuleType:
        """The architecture (standard library only)."""
        return self._module("config")

    @property
    def model(self) -> ModuleType:
        """The Flax modules and the family's FLOPs formula."""
        return self._module("model")

    @property
    def hf(self) -> ModuleType:
        """transformers directories."""
        return self._module("hf")


def get(name: str) -> Family:
    if name not in FAMILIES:
        raise ValueError(f"config.model.family={name!r} is not one of {list(FAMILIES)}.")
    return Family(name)


def of(architecture: Any) -> Family:
    """The family of an architecture dataclass (BertConfig, ModernBertConfig)."""
    return get(architecture.model_type)


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
