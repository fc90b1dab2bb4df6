"""transformers' ModernBERT directories both ways: `ModernBertForMaskedLM` (config.json + safetensors) ↔ the
Flax params of models/modernbert/model.py, through one name table; hf_files.py reads and checks the files.

    config, params = load(path)                       # a ModernBertForMaskedLM / ModernBertModel directory
    save(path, config, params, tokenizer_dir=None)    # AutoModelForMaskedLM loads it, no missing or unexpected keys
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from typing import Callable, Optional, Sequence

import jax
import numpy as np

from bertjax.models import hf_files
from bertjax.models.modernbert import model as modernbert_lib
from bertjax.models.modernbert import config as config_lib
from bertjax.models.head import Head
from bertjax.models.modernbert.config import ModernBertConfig

log = logging.getLogger(__name__)


def _t(w, c):
    return w.T


def _qkv_in(w, c):  # [3·heads·kv, embed] → [embed, 3, heads, kv]
    return w.T.reshape(c.hidden_size, 3, c.num_attention_heads, c.head_dim)


def _qkv_out(k, c):
    return k.reshape(c.hidden_size, -1).T


def _qkv_bias_in(b, c):
    return b.reshape(3, c.num_attention_heads, c.head_dim)


def _flat(b, c):
    return b.reshape(-1)


def _wo_in(w, c):  # [embed, heads·kv] → [heads, kv, embed]
    return w.T.reshape(c.num_attention_heads, c.head_dim, c.hidden_size)


def _wo_out(k, c):
    return k.reshape(-1, c.hidden_size).T


def _wi_in(w, c):  # [2·mlp, embed] → [embed, 2, mlp]: the input half, then the gate half
    return w.T.reshape(c.hidden_size, 2, c.intermediate_size)


def _wi_bias_in(b, c):
    return b.reshape(2, c.intermediate_size)


def _same(x, c):
    return x


SAME, DENSE = (_same, _same), (_t, _t)


def name_table(c: ModernBertConfig) -> list[tuple[str, tuple[str, ...], tuple[Callable, Callable]]]:
    """(transformers name, bertjax path, (to bertjax, to transformers)) for every tensor the config has."""
    rows = [("model.embeddings.tok_embeddings.weight", "model/tok_embeddings/embedding", SAME)]

    def norm(hf_name: str, path: str) -> None:
        rows.append((f"{hf_name}.weight", f"{path}/scale", SAME))
        if c.norm_bias:
            rows.append((f"{hf_name}.bias", f"{path}/bias", SAME))

    norm("model.embeddings.norm", "model/embeddings_norm")
    for i in range(c.num_hidden_layers):
        hf_layer, layer = f"model.layers.{i}", f"model/layers_{i}"
        if i:  # layer 0 has no attention norm
            norm(f"{hf_layer}.attn_norm", f"{layer}/attn_norm")
        rows.append((f"{hf_layer}.attn.Wqkv.weight", f"{layer}/Wqkv/kernel", (_qkv_in, _qkv_out)))
        rows.append((f"{hf_layer}.attn.Wo.weight", f"{layer}/Wo_attn/kernel", (_wo_in, _wo_out)))
        if c.attention_bias:
            rows.append((f"{hf_layer}.attn.Wqkv.bias", f"{layer}/Wqkv/bias", (_qkv_bias_in, _flat)))
            rows.append((f"{hf_layer}.attn.Wo.bias", f"{layer}/Wo_attn/bias", SAME))
        norm(f"{hf_layer}.mlp_norm", f"{layer}/mlp_norm")
        rows.append((f"{hf_layer}.mlp.Wi.weight", f"{layer}/Wi/kernel", (_wi_in, _qkv_out)))
        rows.append((f"{hf_layer}.mlp.Wo.weight", f"{layer}/Wo_mlp/kernel", DENSE))
        if c.mlp_bias:
            rows.append((f"{hf_layer}.mlp.Wi.bias", f"{layer}/Wi/bias", (_wi_bias_in, _flat)))
            rows.append((f"{hf_layer}.mlp.Wo.bias", f"{layer}/Wo_mlp/bias", SAME))
    norm("model.final_norm", "model/final_norm")
    rows.append(("head.dense.weight", "head_dense/kernel", DENSE))
    if c.classifier_bias:
        rows.append(("head.dense.bias", "head_dense/bias", SAME))
    norm("head.norm", "head_norm")
    if c.decoder_bias:
        rows.append(("decoder.bias", "decoder_bias", SAME))
    return [(name, tuple(path.split("/")), fns) for name, path, fns in rows]


def task_table(c: ModernBertConfig) -> list[tuple[str, tuple[str, ...], tuple[Callable, Callable]]]:
    """The name table of ModernBertFor<a head's class> (sequence or token classification): the encoder and
    prediction head as the masked LM's, then the classifier."""
    rows = [row for row in name_table(c) if not row[0].startswith("decoder.")]
    return rows + [
        ("classifier.weight", ("classifier", "kernel"), DENSE),
        ("classifier.bias", ("classifier", "bias"), SAME),
    ]


def save_finetuned(
    path: str,
    config: ModernBertConfig,
    params: dict,
    head: Head,
    labels: Optional[list[str]],
    regression: bool = False,
    vocab_file: Optional[str] = None,
    do_lower_case: bool = True,
    tokenizer_dir: Optional[str] = None,
) -> None:
    """A fine-tuned ModernBERT (ModernBertForFinetuning's params) as transformers' ModernBertFor<head.hf_class>,
    with id2label/label2id, loading with no missing or unexpected keys."""
    num_labels = 1 if regression else len(labels or [0, 0])
    names = labels if labels else [f"LABEL_{i}" for i in range(num_labels)]
    d = config_lib.to_hf_dict(config, (f"ModernBertFor{head.hf_class}",))
    d.update(
        num_labels=num_labels,
        id2label={str(i): n for i, n in enumerate(names)},
        label2id={n: i for i, n in enumerate(names)},
        problem_type="regression" if regression else "single_label_classification",
    )
    _write_directory(
        path, config, d, to_state_dict(config, params, task_table(config)), tokenizer_dir, vocab_file, do_lower_case
    )


def save_encoder(
    path: str,
    config: ModernBertConfig,
    params: dict,
    vocab_file: Optional[str] = None,
    do_lower_case: bool = True,
    tokenizer_dir: Optional[str] = None,
) -> None:
    """The encoder alone (an embedder's params: finetuning/retrieval_task.py) as transformers' ModernBertModel,
    the body a sentence-transformers directory wraps."""
    table = [(name[len("model.") :], path, fns) for name, path, fns in name_table(config) if name.startswith("model.")]
    d = config_lib.to_hf_dict(config, ("ModernBertModel",))
    _write_directory(path, config, d, to_state_dict(config, params, table), tokenizer_dir, vocab_file, do_lower_case)


def _write_directory(
    path: str,
    config: ModernBertConfig,
    config_dict: dict,
    tensors: dict[str, np.ndarray],
    tokenizer_dir: Optional[str],
    vocab_file: Optional[str],
    do_lower_case: bool,
) -> None:
    """config.json, model.safetensors and a tokenizer in `path`: a WordPiece `vocab_file`'s BertTokenizer files
    (without token_type_ids, which ModernBERT has no use for), or the files of `tokenizer_dir`."""
    from safetensors.numpy import save_file

    hf_files.new_directory(path)
    with open(os.path.join(path, hf_files.CONFIG_NAME), "w") as f:
        json.dump(config_dict, f, indent=2, sort_keys=True)
    save_file(tensors, os.path.join(path, hf_files.WEIGHTS_NAME), metadata={"format": "pt"})
    if vocab_file:
        hf_files.write_tokenizer(
            path,
            vocab_file,
            do_lower_case,
            config.max_position_embeddings,
            model_input_names=["input_ids", "attention_mask"],
        )
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        if tokenizer_dir and os.path.isfile(os.path.join(tokenizer_dir, name)):
            shutil.copyfile(os.path.join(tokenizer_dir, name), os.path.join(path, name))


HEAD_PREFIXES = ("head.", "decoder.")  # what a bare ModernBertModel directory lacks: initialised fresh
_REDUNDANT = ("decoder.weight",)  # tied to the token embeddings


def to_state_dict(config: ModernBertConfig, params: dict, table: Optional[list] = None) -> dict[str, np.ndarray]:
    """bertjax params → transformers tensors by `table` (default: ModernBertForMaskedLM's, without the tied
    decoder.weight, which transformers re-ties on load as for its own saves)."""
    params = jax.device_get(params)
    return {
        name: np.ascontiguousarray(to_hf(np.asarray(hf_files.get_path(params, path), np.float32), config))
        for name, path, (_, to_hf) in (table or name_table(config))
    }


def from_state_dict(
    config: ModernBertConfig,
    tensors: dict[str, np.ndarray],
    seed: int = 0,
    source: str = "the checkpoint",
    keep: Optional[Sequence[str]] = None,
) -> dict:
    """transformers tensors (ModernBertForMaskedLM's, or a bare ModernBertModel's) → bertjax params; `keep`: only
    these top-level parts (pretrained.load's encoder_only), nothing initialised or said of the rest."""
    if not any(k.startswith("model.") for k in tensors):  # a bare ModernBertModel: names without "model."
        tensors = {k if k.startswith(HEAD_PREFIXES) else f"model.{k}": v for k, v in tensors.items()}
    model = modernbert_lib.ModernBertForMaskedLM(config)
    rng = jax.random.PRNGKey(seed)
    shapes = jax.eval_shape(lambda: modernbert_lib.init_params(model, rng))
    every = name_table(config)
    table = [row for row in every if keep is None or row[1][0] in keep]
    absent = [name for name, _, _ in table if name not in tensors]
    missing = [n for n in absent if not n.startswith(HEAD_PREFIXES)]
    if missing:
        raise ValueError(
            f"{source} lacks {len(missing)} encoder tensor(s) of its config.json, e.g. {missing[:3]}; the "
            "weights and config.json come from different ModernBERT models."
        )
    fresh = jax.device_get(modernbert_lib.init_params(model, rng)) if absent else None
    params: dict = {}
    for name, path, (to_jax, to_hf) in table:
        expected = hf_files.get_path(shapes, path)
        if name not in tensors:
            hf_files.set_path(params, path, hf_files.get_path(fresh, path))
            continue
        want = to_hf(np.zeros(expected.shape, np.float32), config).shape
        if tuple(tensors[name].shape) != tuple(want):
            raise ValueError(
                f"{source}: '{name}' has shape {tuple(tensors[name].shape)} but config.json implies "
                f"{tuple(want)}; the weights and config.json come from different models."
            )
        hf_files.set_path(params, path, to_jax(tensors[name].astype(np.float32), config))
    decoder = tensors.get("decoder.weight")
    if decoder is not None and not np.array_equal(decoder, tensors["model.embeddings.tok_embeddings.weight"]):
        raise ValueError(
            f"{source}: decoder.weight differs from the token embeddings; bertjax ties them as "
            "ModernBERT does, so an untied checkpoint cannot be loaded faithfully."
        )
    unexpected = sorted(set(tensors) - {n for n, _, _ in every} - set(_REDUNDANT))
    if unexpected:
        log.warning(
            "%s: ignored %d tensor(s) ModernBertForMaskedLM has no place for: %s",
            source,
            len(unexpected),
            ", ".join(unexpected[:8]),
        )
    if absent:
        log.warning(
            "%s: initialised fresh (not in the checkpoint): %s",
            source,
            ", ".join(sorted({n.rsplit(".", 1)[0] for n in absent})),
        )
    return params


def load_config(path: str) -> ModernBertConfig:
    return config_lib.from_json_file(os.path.join(path, hf_files.CONFIG_NAME))


def load(path: str, seed: int = 0, keep: Optional[Sequence[str]] = None) -> tuple[ModernBertConfig, dict]:
    """(config, params) of a transformers ModernBERT directory (safetensors only); `keep`: from_state_dict's."""
    config = load_config(path)
    files = hf_files.weight_files(path, "ModernBertForMaskedLM")
    hf_files.check_header(files, config, path)
    tensors, _ = hf_files.read_safetensors(files)
    return config, from_state_dict(config, tensors, seed, source=path, keep=keep)


def save_pretrained(
    path: str,
    model: modernbert_lib.ModernBertForMaskedLM,
    params: dict,
    vocab_file: Optional[str] = None,
    do_lower_case: bool = True,
    tokenizer_dir: Optional[str] = None,
) -> None:
    """A directory `transformers.AutoModelForMaskedLM.from_pretrained(path)` loads as ModernBertForMaskedLM, with
    `vocab_file`'s BertTokenizer files or the tokenizer files of `tokenizer_dir` (a ModernBERT/HF tokenizer)."""
    save(path, model.config, params, tokenizer_dir, vocab_file, do_lower_case)


def save(
    path: str,
    config: ModernBertConfig,
    params: dict,
    tokenizer_dir: Optional[str] = None,
    vocab_file: Optional[str] = None,
    do_lower_case: bool = True,
) -> None:
    """`save_pretrained` from the config alone."""
    _write_directory(
        path,
        config,
        config_lib.to_hf_dict(config),
        to_state_dict(config, params),
        tokenizer_dir,
        vocab_file,
        do_lower_case,
    )
