"""sentence-transformers directories, both ways: what a saved SentenceTransformer says about turning its encoder's
hidden states into one embedding (read), and those files added to a Hugging Face directory bertjax wrote (write),
so that `sentence_transformers.SentenceTransformer(DIR)` loads it as it is.

A directory is sentence-transformers' when it holds `modules.json`: a Transformer module (a Hugging Face directory,
at the top or in `0_Transformer/`), a Pooling module (`1_Pooling/config.json`: mean or CLS) and optionally a
Normalize module; `config_sentence_transformers.json` names the similarity function and the prompts;
`sentence_bert_config.json` the maximum length and whether sentence-transformers lower-cases the text itself.
Both the classic spellings (sentence-transformers 2-5: `sentence_transformers.models.Pooling`,
`pooling_mode_mean_tokens`) and the newer ones (`...modules.pooling.Pooling`, `"pooling_mode": "mean"`) are read;
the classic ones are written, which every version from 2.x on loads. Only Transformer → Pooling (→ Normalize)
models are taken: any other module (Dense, a Router, static embeddings) is refused in one sentence, since an
embedding computed without it would be wrong, not merely different.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Optional

from bertjax.runtime import files

MODULES = "modules.json"
POOLING_DIR = "1_Pooling"
NORMALIZE_DIR = "2_Normalize"
SBERT_CONFIG = "sentence_bert_config.json"
ST_CONFIG = "config_sentence_transformers.json"
# The classic module types (sentence-transformers 2.x-5.x); 6.x loads them too.
TRANSFORMER_TYPE = "sentence_transformers.models.Transformer"
POOLING_TYPE = "sentence_transformers.models.Pooling"
NORMALIZE_TYPE = "sentence_transformers.models.Normalize"
# Pooling config keys of the classic layout → the mode each one switches on.
CLASSIC_MODES = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
POOLING_MODES = ("mean", "cls")  # what bertjax pools (finetuning/pooling.py)
SIMILARITY_NAMES = {None: "cosine", "cosine": "cosine", "dot": "dot", "dot_product": "dot"}
DOCUMENT_PROMPTS = ("document", "passage", "corpus")  # the prompt names encode_document tries, in its order
NO_LENGTH = 1_000_000  # tokenizer_config.json's model_max_length when it has none (transformers' VERY_LARGE_INTEGER)


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a sentence-transformers directory says about its embeddings."""

    model_dir: str  # the Transformer module's folder: a Hugging Face directory (config.json, weights, tokenizer)
    pooling_mode: str  # "mean" | "cls"
    normalize: bool  # a Normalize module follows the pooling
    similarity: str  # "cosine" | "dot"
    max_seq_length: Optional[int]  # tokens a text is cut to; None: the model's own limit
    do_lower_case: bool  # sentence-transformers lower-cases the text before its tokenizer sees it
    query_prompt: str = ""  # prepended to queries (its prompts' "query")
    document_prompt: str = ""  # prepended to documents (its prompts' "document", "passage" or "corpus")


def is_sentence_transformers_dir(path: str) -> bool:
    return files.isfile(os.path.join(path, MODULES))


def _json(path: str, fix: str) -> Any:
    try:
        return files.read_json(path)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg}); {fix}") from None


def _class_name(module: dict, where: str) -> str:
    kind = module.get("type") if isinstance(module, dict) else None
    if not isinstance(kind, str):
        raise ValueError(f'{where} lists a module without a "type"; save the model again with sentence-transformers.')
    return kind.rsplit(".", 1)[-1]


def _pooling_mode(config: dict, where: str) -> str:
    mode = config.get("pooling_mode")
    if mode is None:  # classic: one boolean a mode
        on = [name for key, name in CLASSIC_MODES.items() if config.get(key)]
    else:  # newer: a name, or a list of names
        on = [mode] if isinstance(mode, str) else list(mode)
    if len(on) != 1 or on[0] not in POOLING_MODES:
        got = "no pooling mode" if not on else f"pooling {' + '.join(map(str, on))}"
        raise ValueError(
            f"{where} sets {got}; bertjax pools with one of {list(POOLING_MODES)} (mean tokens or the CLS token)."
        )
    return on[0]


def read(path: str) -> Settings:
    """The settings of the sentence-transformers directory at `path` (a local directory), each inconsistency one
    sentence naming the file."""
    where = os.path.join(path, MODULES)
    modules = _json(where, "save the model again with sentence-transformers.")
    if not isinstance(modules, list) or not modules:
        raise ValueError(f"{where} lists no modules; save the model again with sentence-transformers.")
    modules = sorted(modules, key=lambda m: m.get("idx", 0) if isinstance(m, dict) else 0)
    names = [_class_name(m, where) for m in modules]
    if names[:2] != ["Transformer", "Pooling"] or names[2:] not in ([], ["Normalize"]):
        other = next((n for n in names if n not in ("Transformer", "Pooling", "Normalize")), None)
        raise ValueError(
            f"{where} lists the modules {' → '.join(names)}; bertjax evaluates Transformer → Pooling (→ Normalize) "
            "models only" + (f" ({other} is not one of them)." if other else ", in that order.")
        )
    model_dir = os.path.join(path, modules[0].get("path", "") or "")
    pooling_config = os.path.join(path, modules[1].get("path", POOLING_DIR) or POOLING_DIR, "config.json")
    if not files.isfile(pooling_config):
        raise FileNotFoundError(f"{pooling_config} does not exist; {where} names it as the Pooling module's folder.")
    pooling = _json(pooling_config, "save the model again with sentence-transformers.")
    mode = _pooling_mode(pooling, pooling_config)

    st_config_path = os.path.join(path, ST_CONFIG)
    st_config = _json(st_config_path, "fix it or remove it.") if files.isfile(st_config_path) else {}
    similarity = st_config.get("similarity_fn_name")
    if similarity not in SIMILARITY_NAMES:
        raise ValueError(
            f"{st_config_path} sets similarity_fn_name={similarity!r}; bertjax retrieves by cosine or dot product."
        )
    prompts = st_config.get("prompts") or {}
    query_prompt = prompts.get("query", "")
    document_prompt = next((prompts[name] for name in DOCUMENT_PROMPTS if prompts.get(name)), "")
    if (query_prompt or document_prompt) and pooling.get("include_prompt", True) is False:
        raise ValueError(
            f"{pooling_config} pools without the prompt's tokens (include_prompt false); bertjax pools every token."
        )

    sbert_path = os.path.join(model_dir, SBERT_CONFIG)
    sbert = _json(sbert_path, "fix it or remove it.") if files.isfile(sbert_path) else {}
    max_seq_length = sbert.get("max_seq_length")
    if max_seq_length is None:  # sentence-transformers 6 keeps it as the tokenizer's model_max_length
        tokenizer_config = os.path.join(model_dir, "tokenizer_config.json")
        recorded = files.read_json(tokenizer_config).get("model_max_length") if files.isfile(tokenizer_config) else None
        max_seq_length = recorded if isinstance(recorded, int) and recorded < NO_LENGTH else None
    return Settings(
        model_dir=model_dir,
        pooling_mode=mode,
        normalize=len(names) == 3,
        similarity=SIMILARITY_NAMES[similarity],
        max_seq_length=max_seq_length,
        do_lower_case=bool(sbert.get("do_lower_case", False)),
        query_prompt=query_prompt,
        document_prompt=document_prompt,
    )


def _write_json(path: str, value: Any) -> None:
    files.write_whole(path, json.dumps(value, indent=2) + "\n")


def write(
    path: str,
    *,
    pooling_mode: str,
    normalize: bool,
    similarity: str,
    max_seq_length: int,
    do_lower_case: bool = False,
) -> None:
    """Adds sentence-transformers' files to the Hugging Face directory at `path` (written before, by
    save_pretrained): modules.json, the pooling folder, the Normalize folder when `normalize`, and the two configs.
    `do_lower_case` is sentence-transformers' own lower-casing of the text (the tokenizer's is in its own files)."""
    if pooling_mode not in POOLING_MODES:
        raise ValueError(f"pooling_mode {pooling_mode!r} is not one of {list(POOLING_MODES)}.")
    if similarity not in ("cosine", "dot"):
        raise ValueError(f"similarity {similarity!r} is not cosine or dot.")
    config_path = os.path.join(path, "config.json")
    if not files.isfile(config_path):
        raise FileNotFoundError(f"{config_path} does not exist; write the Hugging Face directory first.")
    hidden_size = int(files.read_json(config_path)["hidden_size"])
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": TRANSFORMER_TYPE},
        {"idx": 1, "name": "1", "path": POOLING_DIR, "type": POOLING_TYPE},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": NORMALIZE_DIR, "type": NORMALIZE_TYPE})
    files.makedirs(os.path.join(path, POOLING_DIR))
    pooling = {"word_embedding_dimension": hidden_size}
    pooling.update({key: mode == pooling_mode for key, mode in CLASSIC_MODES.items()})
    pooling["include_prompt"] = True
    _write_json(os.path.join(path, POOLING_DIR, "config.json"), pooling)
    if normalize:  # a file in the folder, so that copies that drop empty folders (the Hub) keep it
        files.makedirs(os.path.join(path, NORMALIZE_DIR))
        _write_json(os.path.join(path, NORMALIZE_DIR, "config.json"), {})
    _write_json(os.path.join(path, SBERT_CONFIG), {"max_seq_length": max_seq_length, "do_lower_case": do_lower_case})
    _write_json(
        os.path.join(path, ST_CONFIG),
        {
            "model_type": "SentenceTransformer",
            "prompts": {"query": "", "document": ""},
            "default_prompt_name": None,
            "similarity_fn_name": similarity,
        },
    )
    _write_json(os.path.join(path, MODULES), modules)
