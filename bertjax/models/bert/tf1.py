"""google-research/bert TF1 checkpoints in: `bert_config.json` + `vocab.txt` + `bert_model.ckpt.*`.

One table (`_NAME_TABLE`) renames TF1 variables to Hugging Face `BertForPreTraining` tensors, after which
hf.py's import path does the rest (layouts, shape checks, fresh heads), so the two can never disagree on
what a bertjax parameter means. The checkpoint is read with `tf.train.load_checkpoint` alone: no TF1
graph is built, and TensorFlow is imported only when a checkpoint is actually read.
"""

from __future__ import annotations

import glob
import json
import logging
import os
from typing import Optional, Sequence

import jax
import numpy as np

from bertjax.models import hf_files
from bertjax.models.bert import hf
from bertjax.models.bert import model as model_lib

log = logging.getLogger(__name__)

CONFIG_NAME = "bert_config.json"
VOCAB_NAME = "vocab.txt"
CHECKPOINT_NAME = "bert_model.ckpt"
LAYOUT = f"{CONFIG_NAME}, {VOCAB_NAME} and {CHECKPOINT_NAME}.index + {CHECKPOINT_NAME}.data-*"


def _dense(tf_name: str, hf_name: str) -> list[tuple[str, str, bool]]:
    """TF dense kernels are [in, out]; HF Linear weights are [out, in]."""
    return [(f"{tf_name}/kernel", f"{hf_name}.weight", True), (f"{tf_name}/bias", f"{hf_name}.bias", False)]


def _layer_norm(tf_name: str, hf_name: str) -> list[tuple[str, str, bool]]:
    return [(f"{tf_name}/gamma", f"{hf_name}.weight", False), (f"{tf_name}/beta", f"{hf_name}.bias", False)]


_TF_LAYER, _HF_LAYER = "bert/encoder/layer_{i}", "bert.encoder.layer.{i}"  # "{i}" is the layer index

# (TF1 variable, Hugging Face tensor, transpose).
_NAME_TABLE: list[tuple[str, str, bool]] = [
    *[
        (f"bert/embeddings/{n}", f"bert.embeddings.{n}.weight", False)
        for n in ("word_embeddings", "position_embeddings", "token_type_embeddings")
    ],
    *_layer_norm("bert/embeddings/LayerNorm", "bert.embeddings.LayerNorm"),
    *[
        row
        for n in ("query", "key", "value")
        for row in _dense(f"{_TF_LAYER}/attention/self/{n}", f"{_HF_LAYER}.attention.self.{n}")
    ],
    *_dense(f"{_TF_LAYER}/attention/output/dense", f"{_HF_LAYER}.attention.output.dense"),
    *_layer_norm(f"{_TF_LAYER}/attention/output/LayerNorm", f"{_HF_LAYER}.attention.output.LayerNorm"),
    *_dense(f"{_TF_LAYER}/intermediate/dense", f"{_HF_LAYER}.intermediate.dense"),
    *_dense(f"{_TF_LAYER}/output/dense", f"{_HF_LAYER}.output.dense"),
    *_layer_norm(f"{_TF_LAYER}/output/LayerNorm", f"{_HF_LAYER}.output.LayerNorm"),
    *_dense("bert/pooler/dense", "bert.pooler.dense"),
    *_dense("cls/predictions/transform/dense", "cls.predictions.transform.dense"),
    *_layer_norm("cls/predictions/transform/LayerNorm", "cls.predictions.transform.LayerNorm"),
    ("cls/predictions/output_bias", "cls.predictions.bias", False),
    ("cls/seq_relationship/output_weights", "cls.seq_relationship.weight", False),  # already [out, in]
    ("cls/seq_relationship/output_bias", "cls.seq_relationship.bias", False),
]

# Parts a checkpoint may lack (google's encoder-only exports): hf.py initialises them fresh.
_OPTIONAL_PREFIXES = ("bert/pooler/", "cls/")
# Training state saved beside the weights: google's AdamWeightDecayOptimizer slots (`<var>/adam_m`,
# `<var>/adam_v`), tf.train.AdamOptimizer's (`<var>/Adam`, `<var>/Adam_1`, beta powers) and the step.
_SLOT_SUFFIXES = ("/adam_m", "/adam_v", "/Adam", "/Adam_1")
_TRAINING_STATE = ("global_step", "beta1_power", "beta2_power")


def _expand_table(config: model_lib.BertConfig) -> dict[str, tuple[str, bool]]:
    rows = {}
    for tf_name, hf_name, transpose in _NAME_TABLE:
        for i in range(config.num_hidden_layers) if "{i}" in tf_name else [None]:
            rows[tf_name.format(i=i)] = (hf_name.format(i=i), transpose)
    return rows


def _is_training_state(name: str) -> bool:
    return name in _TRAINING_STATE or name.endswith(_SLOT_SUFFIXES)


def _has_checkpoint(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "checkpoint")) or bool(glob.glob(os.path.join(path, "*.index")))


def is_tf1_dir(path: str) -> bool:
    """A google-research/bert directory, or part of one (so that its errors name what is missing). A Hugging
    Face config.json beside it wins: its safetensors are read without TensorFlow."""
    return (
        os.path.isdir(path)
        and not hf_files.has_config(path)
        and (os.path.isfile(os.path.join(path, CONFIG_NAME)) or _has_checkpoint(path))
    )


def checkpoint_prefix(path: str) -> str:
    """The checkpoint in `path`: the one its `checkpoint` file names (a training run's latest), else
    google's bert_model.ckpt, else the only `*.index` there."""
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(path)
    if latest:
        return latest
    if os.path.isfile(os.path.join(path, CHECKPOINT_NAME + ".index")):
        return os.path.join(path, CHECKPOINT_NAME)
    indexes = sorted(glob.glob(os.path.join(path, "*.index")))
    if len(indexes) == 1:
        return indexes[0][: -len(".index")]
    if indexes:
        names = ", ".join(os.path.basename(i)[: -len(".index")] for i in indexes)
        raise FileNotFoundError(
            f"{path} holds several TF checkpoints ({names}); keep one, or add a `checkpoint` "
            'file naming the one to load (model_checkpoint_path: "NAME").'
        )
    raise FileNotFoundError(f"{path} has no TF checkpoint (*.index); a TF1 BERT directory holds {LAYOUT}.")


def load_config(path: str) -> model_lib.BertConfig:
    config_file = os.path.join(path, CONFIG_NAME)
    if not os.path.isfile(config_file):
        raise FileNotFoundError(f"{path} has no {CONFIG_NAME}; a TF1 BERT directory holds {LAYOUT}.")
    return model_lib.BertConfig.from_json_file(config_file)


def _read(prefix: str, config: model_lib.BertConfig, config_file: str) -> dict[str, np.ndarray]:
    """The checkpoint's weights under Hugging Face names (training state skipped, counted in the log)."""
    import tensorflow as tf

    try:
        reader = tf.train.load_checkpoint(prefix)
        shapes = reader.get_variable_to_shape_map()
    except (tf.errors.OpError, ValueError) as e:
        raise ValueError(
            f"{prefix} is not a readable TF checkpoint ({' '.join(str(e).split())[:300]}); re-download it."
        ) from None
    table = _expand_table(config)
    skipped = sorted(n for n in shapes if n not in table and _is_training_state(n))
    unknown = sorted(n for n in shapes if n not in table and not _is_training_state(n))
    if unknown:
        raise ValueError(
            f"{prefix}: variable '{unknown[0]}'{f' (and {len(unknown) - 1} more)' if len(unknown) > 1 else ''} "
            f"is neither a google-research/bert BertForPreTraining variable for {config_file} "
            f"(num_hidden_layers={config.num_hidden_layers}) nor optimizer state; the checkpoint and "
            f"{CONFIG_NAME} come from different models, or it is not a google-research/bert checkpoint."
        )
    missing = [n for n in table if n not in shapes and not n.startswith(_OPTIONAL_PREFIXES)]
    if missing:
        raise ValueError(
            f"{prefix} lacks variable '{missing[0]}'{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}, "
            f"which {config_file} (num_hidden_layers={config.num_hidden_layers}) requires; the checkpoint is "
            "incomplete or from a different model."
        )
    tensors = {}
    for tf_name, (hf_name, transpose) in table.items():
        if tf_name not in shapes:
            continue
        try:
            value = reader.get_tensor(tf_name)
        except Exception as e:  # the reader raises OpError, IndexError or ValueError for a damaged .data file
            raise ValueError(
                f"{prefix}: variable '{tf_name}' cannot be read ({' '.join(str(e).split())[:300]}); "
                "re-download the checkpoint's .data-* files."
            ) from None
        tensors[hf_name] = np.ascontiguousarray(value.T) if transpose and value.ndim == 2 else value
    if skipped:
        log.info(
            "%s: ignored %d optimizer/training variable(s) (%s)",
            prefix,
            len(skipped),
            ", ".join(sorted({n.rsplit("/", 1)[-1] for n in skipped})),
        )
    return tensors


def load(path: str, seed: int = 0, keep: Optional[Sequence[str]] = None) -> tuple[model_lib.BertConfig, dict]:
    """(architecture, params in the loop layout) of a google-research/bert directory; the pooler and
    pre-training heads it lacks are initialised from `seed`; `keep`: only these top-level parts
    (hf.from_hf_state_dict)."""
    if not os.path.isdir(path):
        hint = "it is a file: pass the directory that holds it" if os.path.exists(path) else "nothing is there"
        raise FileNotFoundError(f"{path} is not a directory ({hint}); a TF1 BERT directory holds {LAYOUT}.")
    config = load_config(path)
    prefix = checkpoint_prefix(path)
    config_file = os.path.join(path, CONFIG_NAME)
    tensors = _read(prefix, config, config_file)
    origin = {hf_name: f"{prefix} ({tf_name})" for tf_name, (hf_name, _) in _expand_table(config).items()}
    try:
        params = hf.from_hf_state_dict(
            config, tensors, jax.random.PRNGKey(seed), source=prefix, origin=origin, keep=keep
        )
    except ValueError as e:  # hf.py speaks of HF's config.json; here the shapes come from bert_config.json
        raise ValueError(str(e).replace(" config.json ", f" {CONFIG_NAME} ")) from None
    log.info("loaded TF1 checkpoint %s", prefix)
    return config, params


def vocab(path: str) -> tuple[Optional[str], bool]:
    """(vocab.txt or None, do_lower_case). bert_config.json rarely says the casing, so google's directory
    names do: `uncased_L-12_H-768_A-12` lower-cases, `cased_*` and `multi_cased_*` do not."""
    vocab_file = os.path.join(path, VOCAB_NAME)
    vocab_file = vocab_file if os.path.isfile(vocab_file) else None
    config_file = os.path.join(path, CONFIG_NAME)
    if os.path.isfile(config_file):
        try:
            with open(config_file, encoding="utf-8") as f:
                explicit = json.load(f).get("do_lower_case")
        except (UnicodeDecodeError, ValueError, AttributeError) as e:
            raise ValueError(
                f"{config_file} is not a JSON object of BERT config fields ({e}); restore the "
                f"{CONFIG_NAME} the checkpoint came with."
            ) from None
        if explicit is not None:
            if not isinstance(explicit, bool):
                raise ValueError(f"{config_file}: do_lower_case={explicit!r} must be true or false.")
            return vocab_file, explicit
    name = os.path.basename(os.path.normpath(os.path.abspath(path))).lower()
    return vocab_file, "uncased" in name or "cased" not in name
