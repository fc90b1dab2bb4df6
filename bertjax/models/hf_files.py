"""The files of a Hugging Face model directory, for every family: config.json, safetensors weights (one file
or an index of shards), and the parameter-tree paths the families' name tables point at.

Weights are only ever read from safetensors: a `pytorch_model.bin` is a pickle, and unpickling runs
arbitrary code.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any, Optional

import numpy as np
from safetensors import safe_open

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack")


def has_config(path: str) -> bool:
    """Whether `path` is a Hugging Face model directory (its config.json), of any family."""
    return os.path.isfile(os.path.join(path, CONFIG_NAME))


def get_path(tree: dict, path: tuple[str, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def set_path(tree: dict, path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def new_directory(path: str) -> None:
    if os.path.exists(path) and not os.path.isdir(path):
        raise NotADirectoryError(
            f"{path} is a file, not a directory; pass a new or existing directory for the Hugging Face files."
        )
    os.makedirs(path, exist_ok=True)


def weight_files(path: str, hf_class: str = "BertForPreTraining") -> list[str]:
    """The safetensors files of a directory; one sentence when there are none, or only pickled ones."""
    index = os.path.join(path, WEIGHTS_INDEX_NAME)
    if os.path.isfile(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        missing = [s for s in shards if not os.path.isfile(os.path.join(path, s))]
        if missing:
            raise FileNotFoundError(f"{index} names shard(s) {missing} that are not in {path}; copy them there.")
        return [os.path.join(path, s) for s in shards]
    single = os.path.join(path, WEIGHTS_NAME)
    if os.path.isfile(single):
        return [single]
    pickled = [n for n in PICKLED_WEIGHTS if os.path.exists(os.path.join(path, n))]
    if pickled:
        raise FileNotFoundError(
            f"{path} holds only {pickled[0]}, which bertjax will not read (pickled weights can run arbitrary "
            f"code); convert it once with transformers: `{hf_class}.from_pretrained(path)"
            f".save_pretrained(path, safe_serialization=True)`."
        )
    raise FileNotFoundError(
        f"{path} has no {WEIGHTS_NAME} (or {WEIGHTS_INDEX_NAME}); point at a directory written by save_pretrained."
    )


def read_safetensors(files: list[str]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(name → array, name → the file it came from)."""
    tensors, origin = {}, {}
    for file in files:
        try:
            with safe_open(file, framework="np") as f:
                for key in f.keys():
                    tensors[key] = f.get_tensor(key)
                    origin[key] = file
        except Exception as e:  # safetensors raises its own error types for truncated/corrupt files
            raise ValueError(
                f"{file} is not a readable safetensors file ({' '.join(str(e).split())}); re-export or re-download it."
            ) from None
    return tensors, origin


# Tensors whose shapes the config fixes, by name suffix (BERT's and ModernBERT's): (config fields of each dim).
HEADER_SHAPES = (
    ("word_embeddings.weight", ("vocab_size", "hidden_size")),
    ("tok_embeddings.weight", ("vocab_size", "hidden_size")),
    ("position_embeddings.weight", ("max_position_embeddings", "hidden_size")),
    ("intermediate.dense.weight", ("intermediate_size", "hidden_size")),
    ("mlp.Wi.weight", ("2×intermediate_size", "hidden_size")),
)


def check_header(files: list[str], config: Any, source: str) -> None:
    """Before any tensor is read or any head initialised: config.json's sizes and layer count against the shapes
    the safetensors header lists, so that a config.json that does not belong to the weights (vocab_size 10⁹,
    a million layers) is one sentence, not a terabyte allocation or minutes of silence."""
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        try:
            with safe_open(file, framework="np") as f:
                shapes.update({key: tuple(f.get_slice(key).get_shape()) for key in f.keys()})
        except Exception as e:  # safetensors' own error types: a truncated or corrupt header
            raise ValueError(
                f"{file} is not a readable safetensors file ({' '.join(str(e).split())}); re-export or re-download it."
            ) from None
    for suffix, fields in HEADER_SHAPES:
        found = next((shape for key, shape in shapes.items() if key.endswith(suffix)), None)
        if found is None:
            continue
        expected = tuple(2 * getattr(config, f[2:]) if f.startswith("2×") else getattr(config, f) for f in fields)
        if found != expected:
            said = ", ".join(f"{f}={getattr(config, f.lstrip('2×')):,}" for f in dict.fromkeys(fields))
            raise ValueError(
                f"{source}/{CONFIG_NAME} says {said}, but the weights' {suffix} is "
                f"{' × '.join(f'{n:,}' for n in found)}: the config.json does not belong to these "
                "weights; put back the one saved with them."
            )
    layers = {int(m.group(1)) for key in shapes for m in [re.search(r"\.layers?\.(\d+)\.", key)] if m}
    if layers and len(layers) != config.num_hidden_layers:
        raise ValueError(
            f"{source}/{CONFIG_NAME} says num_hidden_layers={config.num_hidden_layers:,}, but the "
            f"weights hold {len(layers)} layers: the config.json does not belong to these weights; put "
            "back the one saved with them."
        )


def write_tokenizer(
    path: str, vocab_file: str, do_lower_case: bool, max_length: int, model_input_names: Optional[list[str]] = None
) -> None:
    """The run's tokenizer files in `path`, which transformers' AutoTokenizer loads and which tokenize as bertjax
    did: a WordPiece vocab.txt as a BertTokenizer, or a tokenizer.json (byte-level BPE, ...) as is, beside a
    tokenizer_config.json. `model_input_names`: what the tokenizer returns (a model without token types takes no
    token_type_ids); with it, a vocab.txt is also written as tokenizer.json, which AutoTokenizer reads for such
    a model."""
    if not os.path.isfile(vocab_file):
        raise FileNotFoundError(f"vocab_file {vocab_file} does not exist; pass the vocab file used for training.")
    if vocab_file.endswith(".json"):
        _write_json_tokenizer(path, vocab_file, max_length, model_input_names)
        return
    from bertjax.data.vocab import tokenization

    tokenizer = tokenization.load(vocab_file, do_lower_case)  # its strip_accents: what the vocab's files record
    target = os.path.join(path, "vocab.txt")
    if not (os.path.exists(target) and os.path.samefile(vocab_file, target)):  # re-exporting in place
        shutil.copyfile(vocab_file, target)
    tokenizer_config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": do_lower_case,
        "strip_accents": tokenizer.strip_accents,  # explicit, so transformers strips exactly as bertjax did
        "model_max_length": max_length,
        "unk_token": "[UNK]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
    }
    if model_input_names:  # a model whose own tokenizer class is a fast one: it needs tokenizer.json as well
        tokenizer.save_tokenizer_json(os.path.join(path, "tokenizer.json"))
        tokenizer_config["model_input_names"] = model_input_names
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config, f, indent=2)


def _write_json_tokenizer(
    path: str, tokenizer_file: str, max_length: int, model_input_names: Optional[list[str]]
) -> None:
    from bertjax.data.vocab import tokenization

    tok = tokenization.load(tokenizer_file)
    target = os.path.join(path, tokenization.TOKENIZER_JSON)
    if not (os.path.exists(target) and os.path.samefile(tokenizer_file, target)):
        shutil.copyfile(tokenizer_file, target)
    names = {
        role: tok.vocab[i]
        for role, i in (
            ("pad_token", tok.pad_id),
            ("unk_token", tok.unk_id),
            ("cls_token", tok.cls_id),
            ("sep_token", tok.sep_id),
            ("mask_token", tok.mask_id),
        )
    }
    tokenizer_config = dict(tokenizer_class="PreTrainedTokenizerFast", model_max_length=max_length, **names)
    if model_input_names:
        tokenizer_config["model_input_names"] = model_input_names
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config, f, indent=2)
