"""The files of a Hugging Face model directory, for every family: config.json, safetensors weights (one file
or an index of shards), and the parameter-tree paths the families' name tables point at.

Weights are only ever read from safetensors: a `pytorch_model.bin` is a pickle, and unpickling runs
arbitrary code.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any, Optional

import numpy as np
from safetensors import safe_open

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack")


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
        raise NotADirectoryError(f"{path} is a file, not a directory; pass a new or existing directory for the "
                                 "Hugging Face files.")
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
            f".save_pretrained(path, safe_serialization=True)`.")
    raise FileNotFoundError(f"{path} has no {WEIGHTS_NAME} (or {WEIGHTS_INDEX_NAME}); point at a directory written "
                            "by save_pretrained.")


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
            raise ValueError(f"{file} is not a readable safetensors file ({' '.join(str(e).split())}); re-export "
                             "or re-download it.") from None
    return tensors, origin


def write_wordpiece_tokenizer(path: str, vocab_file: str, do_lower_case: bool, max_length: int,
                              model_input_names: Optional[list[str]] = None) -> None:
    """vocab.txt and the tokenizer_config.json of a BertTokenizer (AutoTokenizer loads it) in `path`.
    `model_input_names`: what the tokenizer returns (a model without token types takes no token_type_ids); with
    it, also the same tokenizer as tokenizer.json, which transformers' AutoTokenizer reads for such a model."""
    if not os.path.isfile(vocab_file):
        raise FileNotFoundError(f"vocab_file {vocab_file} does not exist; pass the vocab.txt used for training.")
    target = os.path.join(path, "vocab.txt")
    if not (os.path.exists(target) and os.path.samefile(vocab_file, target)):  # re-exporting in place
        shutil.copyfile(vocab_file, target)
    tokenizer_config = {
        "tokenizer_class": "BertTokenizer", "do_lower_case": do_lower_case,
        "model_max_length": max_length, "unk_token": "[UNK]", "sep_token": "[SEP]",
        "pad_token": "[PAD]", "cls_token": "[CLS]", "mask_token": "[MASK]",
    }
    if model_input_names:  # a model whose own tokenizer class is a fast one: it needs tokenizer.json as well
        from bertjax.data import tokenization

        tokenization.load(vocab_file, do_lower_case).save_tokenizer_json(os.path.join(path, "tokenizer.json"))
        tokenizer_config["model_input_names"] = model_input_names
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config, f, indent=2)
