"""Hugging Face interop for BERT: read and write `BertForPreTraining` directories (config.json + safetensors),
and the fine-tuned `BertFor{SequenceClassification,TokenClassification,QuestionAnswering}`.

One table (`_NAME_TABLE`) maps Hugging Face tensor names to bertjax parameter paths, with the layout
change between them; both directions use it. hf_files.py reads and checks the files themselves.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import save_file

from bertjax.models.bert import model as model_lib
from bertjax.models.head import Head
from bertjax.models import hf_files
from bertjax.models.hf_files import get_path as _get, set_path as _set

log = logging.getLogger(__name__)

CONFIG_NAME, WEIGHTS_NAME = hf_files.CONFIG_NAME, hf_files.WEIGHTS_NAME


# --- Layout changes: (to_bertjax, to_hf), each f(array, config) -> array. HF Linear weights are [out, in].


def _transpose(w, c):
    return w.T


def _qkv_kernel_to_jax(w, c):  # [heads*kv, embed] -> [embed, heads, kv]
    return w.T.reshape(c.hidden_size, c.num_attention_heads, c.head_dim)


def _merge_heads_to_hf(k, c):
    return k.reshape(c.hidden_size, c.hidden_size).T


def _qkv_bias_to_jax(b, c):  # [heads*kv] -> [heads, kv]
    return b.reshape(c.num_attention_heads, c.head_dim)


def _flatten(b, c):
    return b.reshape(-1)


def _attn_out_to_jax(w, c):  # [embed, heads*kv] -> [heads, kv, embed]
    return w.T.reshape(c.num_attention_heads, c.head_dim, c.hidden_size)


def _identity(x, c):
    return x


IDENTITY = (_identity, _identity)
DENSE = (_transpose, _transpose)
QKV_KERNEL = (_qkv_kernel_to_jax, _merge_heads_to_hf)
QKV_BIAS = (_qkv_bias_to_jax, _flatten)
ATTN_OUT_KERNEL = (_attn_out_to_jax, _merge_heads_to_hf)

# (Hugging Face name, bertjax path, layout change). "{i}" is the layer index.
_NAME_TABLE: list[tuple[str, str, tuple[Callable, Callable]]] = [
    ("bert.embeddings.word_embeddings.weight", "bert/embeddings/word_embeddings/embedding", IDENTITY),
    ("bert.embeddings.position_embeddings.weight", "bert/embeddings/position_embeddings/embedding", IDENTITY),
    ("bert.embeddings.token_type_embeddings.weight", "bert/embeddings/token_type_embeddings/embedding", IDENTITY),
    ("bert.embeddings.LayerNorm.weight", "bert/embeddings/LayerNorm/scale", IDENTITY),
    ("bert.embeddings.LayerNorm.bias", "bert/embeddings/LayerNorm/bias", IDENTITY),
    *[
        (f"bert.encoder.layer.{{i}}.attention.self.{n}.weight", f"bert/encoder/layer_{{i}}/{n}/kernel", QKV_KERNEL)
        for n in ("query", "key", "value")
    ],
    *[
        (f"bert.encoder.layer.{{i}}.attention.self.{n}.bias", f"bert/encoder/layer_{{i}}/{n}/bias", QKV_BIAS)
        for n in ("query", "key", "value")
    ],
    (
        "bert.encoder.layer.{i}.attention.output.dense.weight",
        "bert/encoder/layer_{i}/attention_output/kernel",
        ATTN_OUT_KERNEL,
    ),
    ("bert.encoder.layer.{i}.attention.output.dense.bias", "bert/encoder/layer_{i}/attention_output/bias", IDENTITY),
    (
        "bert.encoder.layer.{i}.attention.output.LayerNorm.weight",
        "bert/encoder/layer_{i}/attention_layer_norm/scale",
        IDENTITY,
    ),
    (
        "bert.encoder.layer.{i}.attention.output.LayerNorm.bias",
        "bert/encoder/layer_{i}/attention_layer_norm/bias",
        IDENTITY,
    ),
    ("bert.encoder.layer.{i}.intermediate.dense.weight", "bert/encoder/layer_{i}/intermediate/kernel", DENSE),
    ("bert.encoder.layer.{i}.intermediate.dense.bias", "bert/encoder/layer_{i}/intermediate/bias", IDENTITY),
    ("bert.encoder.layer.{i}.output.dense.weight", "bert/encoder/layer_{i}/output/kernel", DENSE),
    ("bert.encoder.layer.{i}.output.dense.bias", "bert/encoder/layer_{i}/output/bias", IDENTITY),
    ("bert.encoder.layer.{i}.output.LayerNorm.weight", "bert/encoder/layer_{i}/output_layer_norm/scale", IDENTITY),
    ("bert.encoder.layer.{i}.output.LayerNorm.bias", "bert/encoder/layer_{i}/output_layer_norm/bias", IDENTITY),
    ("bert.pooler.dense.weight", "bert/pooler/kernel", DENSE),
    ("bert.pooler.dense.bias", "bert/pooler/bias", IDENTITY),
    ("cls.predictions.transform.dense.weight", "transform/kernel", DENSE),
    ("cls.predictions.transform.dense.bias", "transform/bias", IDENTITY),
    ("cls.predictions.transform.LayerNorm.weight", "transform_layer_norm/scale", IDENTITY),
    ("cls.predictions.transform.LayerNorm.bias", "transform_layer_norm/bias", IDENTITY),
    ("cls.predictions.bias", "mlm_bias", IDENTITY),
    ("cls.seq_relationship.weight", "nsp/kernel", DENSE),
    ("cls.seq_relationship.bias", "nsp/bias", IDENTITY),
]

# Parts a checkpoint may lack (a plain BertModel, a BertForMaskedLM): initialised fresh, and logged.
_OPTIONAL_PREFIXES = ("bert.pooler.", "cls.predictions.", "cls.seq_relationship.")
# Tensors HF stores that carry no information of their own: buffers, and the tied decoder.
_REDUNDANT = ("bert.embeddings.position_ids", "cls.predictions.decoder.weight", "cls.predictions.decoder.bias")


# --- Export ---------------------------------------------------------------------------------------


def _expand_table(config: model_lib.BertConfig) -> list[tuple[str, tuple[str, ...], tuple[Callable, Callable]]]:
    rows = []
    for hf_name, path, fns in _NAME_TABLE:
        layers = range(config.num_hidden_layers) if "{i}" in hf_name else [None]
        for i in layers:
            rows.append((hf_name.format(i=i), tuple(path.format(i=i).split("/")), fns))
    return rows


def to_hf_state_dict(
    config: model_lib.BertConfig, params: dict, include: Callable[[str], bool] = lambda name: True
) -> dict[str, np.ndarray]:
    """bertjax params (loop or scan layout) → `BertForPreTraining` state dict (tied decoder omitted), or the
    part of it whose names `include` accepts."""
    params = model_lib.unstack_layers(params)
    return {
        name: np.ascontiguousarray(to_hf(np.asarray(_get(params, path), np.float32), config))
        for name, path, (_, to_hf) in _expand_table(config)
        if include(name)
    }


def hf_config_dict(config: model_lib.BertConfig) -> dict:
    return {
        "architectures": ["BertForPreTraining"],
        "model_type": "bert",
        **config.to_dict(),
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "torch_dtype": "float32",
    }


def _write(
    path: str,
    config_dict: dict,
    tensors: dict[str, np.ndarray],
    max_length: int,
    vocab_file: Optional[str],
    do_lower_case: bool,
) -> None:
    """config.json, model.safetensors and, with a vocab, the BertTokenizer files; pad_token_id is the vocab's own
    (a RoBERTa-style tokenizer.json pads with `<pad>` = 1, where id 0 is `<s>`)."""
    if vocab_file is not None:
        from bertjax.data.vocab import tokenization

        config_dict = dict(config_dict, pad_token_id=tokenization.load(vocab_file, do_lower_case).pad_id)
    with open(os.path.join(path, CONFIG_NAME), "w") as f:
        json.dump(config_dict, f, indent=2, sort_keys=True)
    save_file(tensors, os.path.join(path, WEIGHTS_NAME), metadata={"format": "pt"})
    if vocab_file is not None:
        hf_files.write_tokenizer(path, vocab_file, do_lower_case, max_length)


def save_pretrained(
    path: str,
    model: model_lib.BertForPreTraining,
    params: dict,
    vocab_file: Optional[str] = None,
    do_lower_case: bool = True,
) -> None:
    """Writes a directory that `transformers.BertForPreTraining.from_pretrained(path)` loads as is."""
    hf_files.new_directory(path)
    config = model.config
    _write(
        path,
        hf_config_dict(config),
        to_hf_state_dict(config, jax.device_get(params)),
        config.max_position_embeddings,
        vocab_file,
        do_lower_case,
    )


def save_encoder(
    path: str,
    config: model_lib.BertConfig,
    params: dict,
    vocab_file: Optional[str] = None,
    do_lower_case: bool = True,
) -> None:
    """The encoder alone (an embedder's params: finetuning/retrieval_task.py) as transformers' BertModel, the body
    a sentence-transformers directory wraps; its pooler when the params hold one (init_from's)."""
    hf_files.new_directory(path)
    params = model_lib.unstack_layers(jax.device_get(params))
    pooler = "pooler" in params["bert"]
    tensors = to_hf_state_dict(
        config, params, lambda name: name.startswith("bert.") and (pooler or not name.startswith("bert.pooler."))
    )
    tensors = {name[len("bert.") :]: tensor for name, tensor in tensors.items()}
    config_dict = dict(hf_config_dict(config), architectures=["BertModel"])
    _write(path, config_dict, tensors, config.max_position_embeddings, vocab_file, do_lower_case)


# --- Fine-tuned heads (heads.py) → BertFor<the head's class>: SequenceClassification, TokenClassification, ...


def save_finetuned(
    path: str,
    config: model_lib.BertConfig,
    params: dict,
    head: Head,
    labels: Optional[list[str]],
    regression: bool = False,
    vocab_file: Optional[str] = None,
    do_lower_case: bool = True,
) -> None:
    """Writes a fine-tuned model (BertForFinetuning's params) as transformers' BertFor<head.hf_class>, with
    id2label/label2id, loading with no missing or unexpected keys. Its BertModel has the pooler when the head reads
    the pooled output (transformers' sequence classification), none when it reads the tokens."""
    hf_files.new_directory(path)
    pooler = head.reads == "pooled"
    params = model_lib.unstack_layers(jax.device_get(params))
    tensors = to_hf_state_dict(
        config, params, lambda name: name.startswith("bert.") and (pooler or not name.startswith("bert.pooler."))
    )
    tensors[f"{head.name}.weight"] = np.ascontiguousarray(np.asarray(params[head.name]["kernel"], np.float32).T)
    tensors[f"{head.name}.bias"] = np.asarray(params[head.name]["bias"], np.float32)
    config_dict = dict(hf_config_dict(config), architectures=[f"BertFor{head.hf_class}"])
    if regression:
        config_dict.update(num_labels=1, problem_type="regression")
    elif labels:
        config_dict.update(
            id2label={str(i): label for i, label in enumerate(labels)},
            label2id={label: i for i, label in enumerate(labels)},
            problem_type="single_label_classification" if pooler else None,
        )
        config_dict = {k: v for k, v in config_dict.items() if v is not None}
    else:  # outputs that are no labels (a span's start and end)
        config_dict["num_labels"] = head.outputs
    _write(path, config_dict, tensors, config.max_position_embeddings, vocab_file, do_lower_case)


# --- Import ---------------------------------------------------------------------------------------


def _canonical_names(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Names as in `BertForPreTraining`: add the `bert.` prefix of a bare BertModel, old gamma/beta names."""
    bare = not any(k.startswith("bert.") for k in tensors)
    out = {}
    for key, value in tensors.items():
        if bare and not key.startswith("cls."):
            key = "bert." + key
        if "LayerNorm." in key:
            key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        out[key] = value
    return out


def from_hf_state_dict(
    config: model_lib.BertConfig,
    tensors: dict[str, np.ndarray],
    rng: jax.Array,
    source: str = "the checkpoint",
    origin: Optional[dict[str, str]] = None,
    keep: Optional[Sequence[str]] = None,
) -> dict:
    """HF tensors → bertjax params (loop layout). Heads missing from the checkpoint are initialised fresh.
    `keep`: only these top-level parts (pretrained.load's encoder_only: `bert`), and nothing initialised, nor
    said, of the heads a fine-tuning job drops (a bare BertModel directory lacks them)."""
    tensors = _canonical_names(tensors)
    origin = _canonical_names(origin) if origin else {}
    model = model_lib.BertForPreTraining(config)
    shapes = jax.eval_shape(lambda: model_lib.init_params(model, rng))
    every = _expand_table(config)
    table = [row for row in every if keep is None or row[1][0] in keep]
    absent = [name for name, _, _ in table if name not in tensors]
    # An init costs seconds on large models: only when something must be initialised, and only the heads
    # when the encoder is all there (a fine-tuning source, which drops them anyway).
    fresh = model_lib.init_params(model, rng, heads_only=all(n.startswith("cls.") for n in absent)) if absent else None
    params: dict = {}
    used, initialised, missing = set(), [], []
    for name, path, (to_jax, to_hf) in table:
        expected = _get(shapes, path)
        if name not in tensors:
            (initialised if name.startswith(_OPTIONAL_PREFIXES) else missing).append(name)
            _set(params, path, _get(fresh, path))
            continue
        hf_shape = to_hf(np.zeros(expected.shape, np.float32), config).shape
        value = tensors[name]
        if tuple(value.shape) != tuple(hf_shape):
            raise ValueError(
                f"{origin.get(name, source)}: '{name}' has shape {tuple(value.shape)} but config.json implies "
                f"{tuple(hf_shape)}; the weights and config.json come from different models."
            )
        _set(params, path, jnp.asarray(to_jax(value.astype(np.float32), config)))
        used.add(name)
    if missing:
        raise ValueError(
            f"{source} lacks {len(missing)} encoder tensor(s), e.g. {missing[:3]}; it is not a BERT "
            f"checkpoint with num_hidden_layers={config.num_hidden_layers}."
        )
    _check_tied_decoder(tensors, params, source)
    dropped = {name for name, _, _ in every} - {name for name, _, _ in table}  # outside `keep`: not unexpected
    unexpected = sorted(set(tensors) - used - dropped - set(_REDUNDANT))
    if unexpected:
        log.warning(
            "%s: ignored %d tensor(s) that BertForPreTraining has no place for: %s",
            source,
            len(unexpected),
            ", ".join(unexpected[:8]) + (" …" if len(unexpected) > 8 else ""),
        )
    if initialised:
        heads = sorted({n.rsplit(".", 1)[0] for n in initialised})
        why = (
            "masked-word and next-sentence predictions need them trained, while fine-tuning, embeddings and "
            "features use the encoder alone"
            if keep is None
            else "a classification head trains them; embeddings do not use them"
        )
        log.warning("%s: initialised fresh (not in the checkpoint): %s; %s", source, ", ".join(heads), why)
    return params


def _check_tied_decoder(tensors: dict[str, np.ndarray], params: dict, source: str) -> None:
    decoder = tensors.get("cls.predictions.decoder.weight")
    if decoder is None:
        return
    embedding = np.asarray(params["bert"]["embeddings"]["word_embeddings"]["embedding"])
    if decoder.shape != embedding.shape or not np.array_equal(decoder.astype(np.float32), embedding):
        raise ValueError(
            f"{source}: cls.predictions.decoder.weight differs from the word embeddings; bertjax ties "
            "them as BERT does, so an untied checkpoint cannot be loaded faithfully."
        )


def load_config(path: str) -> model_lib.BertConfig:
    config_file = os.path.join(path, CONFIG_NAME)
    if not os.path.isfile(config_file):
        raise FileNotFoundError(
            f"{path} has no {CONFIG_NAME}; point at a Hugging Face BERT directory (config.json + model.safetensors)."
        )
    return model_lib.BertConfig.from_json_file(config_file)


def load(path: str, seed: int = 0, keep: Optional[Sequence[str]] = None) -> tuple[model_lib.BertConfig, dict]:
    """(architecture, params in the loop layout) of a Hugging Face BERT directory (safetensors); heads the
    directory lacks are initialised from `seed`; `keep`: only these top-level parts (from_hf_state_dict).
    `bertjax.from_pretrained` also takes bertjax workdirs."""
    if not os.path.isdir(path):
        hint = (
            f"it is a file: pass the directory that holds it, {os.path.dirname(os.path.abspath(path))}"
            if os.path.exists(path)
            else "nothing is there: check the path"
        )
        raise FileNotFoundError(
            f"{path} is not a directory ({hint}); point at a Hugging Face BERT directory "
            f"({CONFIG_NAME} + {WEIGHTS_NAME})."
        )
    config = load_config(path)
    files = hf_files.weight_files(path)
    hf_files.check_header(files, config, path)
    tensors, origin = hf_files.read_safetensors(files)
    return config, from_hf_state_dict(config, tensors, jax.random.PRNGKey(seed), source=path, origin=origin, keep=keep)
