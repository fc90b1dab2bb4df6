"""Encoder families and the one registry the rest of the code asks about them.

A family is named by its Hugging Face `model_type` and lives in its own folder, `models/<name>/`, of four
modules whose names are the contract (`CONTRACT` below; tests/test_house.py checks every family has each
name, and that no code outside models/ names a family):

    config.py   the architecture dataclass, its sizes, `from_model_config(config.model)` (no JAX)
    model.py    the Flax modules; building, initialising, FLOPs, layer stacking
    heads.py    the fine-tuning heads: which Heads it builds (models/head.py), and the module for one
    hf.py       transformers directories both ways: `load`, `save_pretrained`, `save_finetuned`

What they share is in layers.py (activations, dtypes, remat, dropout), options.py (the option names),
head.py (a task's output layer, described without the task) and hf_files.py (config.json and safetensors). The trainer, checkpoints, export, fine-tuning, the summary and
the AOT report ask `get(name)`, `of(architecture)` or `of_fingerprint(fingerprint)` and never branch on the
family. Adding a family: its folder, and its name in FAMILIES. The registry imports no JAX: a family's
modules are imported when asked for.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
from types import ModuleType
from typing import Any

FAMILIES = ("bert", "modernbert")
# config.model.family's default, and the family of checkpoints that record none (written before a second family).
DEFAULT_FAMILY = FAMILIES[0]

# What each family module provides, by the names its callers use.
CONTRACT = {
    "config": (
        "from_model_config",  # config.model (ModelConfig) → the architecture dataclass
        "model_config_fields",  # architecture → the config.model fields that rebuild it
        "from_fingerprint",  # a checkpoint's recorded architecture → the dataclass
        "config_for_size",  # a size name (tiny … large) → the architecture
        "with_finetuning_choices",  # a checkpoint's architecture + config.model's fine-tuning-only choices
    ),
    "model": (
        "from_config",  # config.model → the pre-training model
        "from_architecture",  # an architecture → the pre-training model
        "init_params",  # unboxed parameters
        "dummy_inputs",  # shapes-only inputs for init and eval_shape
        "pretraining_inputs",  # what a batch adds to `apply` beyond ids, mask and masked positions
        "flops_per_sequence",  # MFU's and the summary's FLOPs
        "module_param_counts",  # the summary's parameter rows
        "stack_layers",  # the loop layout → the scan layout
        "unstack_layers",  # the scan layout → the loop layout (checkpoints and HF files speak it)
        "encoder_states",  # every layer's output of the encoder alone (extract_features)
        "BODY",  # the encoder's subtree
        "ENCODER",  # what fine-tuning takes from a pre-trained model
    ),
    "heads": (
        "HEADS",  # the heads (models/head.py: their transformers class suffixes) it builds; no task names
        "finetuning_model",  # the body and a task's Head (None: the encoder alone)
    ),
    "hf": (
        "load",  # a transformers directory → (architecture, params)
        "load_config",  # its config.json → the architecture
        "save_pretrained",  # the pre-training model → a transformers directory
        "save_finetuned",  # a fine-tuned model → the transformers class of its Head
    ),
}


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
    def heads(self) -> ModuleType:
        """The fine-tuning heads."""
        return self._module("heads")

    @property
    def hf(self) -> ModuleType:
        """transformers directories."""
        return self._module("hf")


def tf1_checkpoints() -> ModuleType:
    """google-research/bert's TF1 checkpoints, which only BERT has (models/bert/tf1.py): `is_tf1_dir`, `load`,
    `vocab`, `LAYOUT`."""
    return importlib.import_module(f"bertjax.models.{DEFAULT_FAMILY}.tf1")


def get(name: str) -> Family:
    if name not in FAMILIES:
        raise ValueError(f"config.model.family={name!r} is not one of {list(FAMILIES)}.")
    return Family(name)


def of(architecture: Any) -> Family:
    """The family of an architecture dataclass (BertConfig, ModernBertConfig)."""
    return get(architecture.model_type)


def of_fingerprint(fingerprint: dict) -> Family:
    """The family of a bertjax checkpoint, from its fingerprint (BERT's when it records none)."""
    return get(fingerprint.get("family", DEFAULT_FAMILY))


def family_of(path: str) -> str:
    """The family of a Hugging Face directory, from config.json's model_type (BERT when it has none)."""
    config = os.path.join(path, "config.json")
    with open(config, encoding="utf-8") as f:
        try:
            model_type = json.load(f).get("model_type", DEFAULT_FAMILY)
        except (json.JSONDecodeError, AttributeError):
            return DEFAULT_FAMILY  # its reader says what is wrong with the file
    if model_type not in FAMILIES:
        raise ValueError(
            f"{config}: model_type={model_type!r} is not BERT or ModernBERT; bertjax loads "
            f"{' and '.join(repr(f) for f in FAMILIES)} checkpoints (load this one with transformers)."
        )
    return model_type
