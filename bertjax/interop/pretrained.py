"""Weights from a path, whatever wrote them: a bertjax workdir, a Hugging Face directory or a
google-research/bert TF1 directory.

`bertjax.from_pretrained(path)` and the job's `config.train.init_from` both resolve a path here, so a
new kind of source is added in one place. training/checkpoint.py reads workdirs, each family's hf.py its
Hugging Face directories and bert/tf1.py TF1 checkpoints (Google's BERT, by definition); checkpoint.py knows
about neither of the others.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Optional

import jax
import jax.numpy as jnp

from bertjax import models
from bertjax.runtime import files
from bertjax.models import hf_files
from bertjax.training import checkpoint as checkpoint_lib

log = logging.getLogger(__name__)


def local_dir(path: str) -> str:
    """A model directory in a bucket (Hugging Face, TF1) as its local copy, which safetensors and TensorFlow read;
    a workdir (read through orbax) or a local path as it is."""
    if not files.is_remote(path) or checkpoint_lib.is_workdir(path):
        return path
    from bertjax.data import remote_cache

    return remote_cache.copy_of_dir(path)


def _hf_family(path: str) -> models.Family:
    """The family of a Hugging Face directory, by its config.json (without one, the default family's reader
    says what is missing)."""
    return models.get(models.family_of(path) if hf_files.has_config(path) else models.DEFAULT_FAMILY)


def is_hf_dir(path: str) -> bool:
    path = local_dir(path)
    return hf_files.has_config(path)


def is_tf1_dir(path: str) -> bool:
    path = local_dir(path)
    return tf1.is_tf1_dir(path)


tf1 = models.tf1_checkpoints()  # BERT's alone; reached through the registry, as every family module
TF1_LAYOUT = tf1.LAYOUT  # what a TF1 directory holds, for the sentences that ask for one


def load(path: str, seed: int = 0, encoder_only: bool = False) -> tuple[Any, dict]:
    """(architecture, params in the loop layout) from a bertjax workdir (its latest checkpoint), a Hugging
    Face directory (BERT or ModernBERT) or a TF1 directory (heads either lacks initialised from `seed`).

    A fine-tuned workdir (bertjax.finetune) gives its encoder with fresh pre-training heads, as a Hugging
    Face BertFor<Task> directory does; its task head is left out. `encoder_only`: only what fine-tuning takes
    (the family's `ENCODER`: BERT's `bert/`), and nothing initialised, nor warned of, for heads the source lacks."""
    path = local_dir(path)
    if checkpoint_lib.is_workdir(path):
        fingerprint, params = checkpoint_lib.load_params(path)
        family = models.of_fingerprint(fingerprint)
        config = family.config.from_fingerprint(fingerprint["model"])
        if encoder_only:
            return config, {name: params[name] for name in family.model.ENCODER if name in params}
        if "task" in fingerprint:
            log.warning(
                "%s is a fine-tuned %s run: using its encoder, with the pre-training heads initialised fresh",
                path,
                fingerprint["task"],
            )
            model = family.model.from_architecture(config)
            fresh = jax.device_get(family.model.init_params(model, jax.random.PRNGKey(seed)))
            params = dict(fresh, **{family.model.BODY: params[family.model.BODY]})
        return config, params
    # A sentence-transformers model's BertModel has no pre-training heads: with encoder_only, none are built.
    if tf1.is_tf1_dir(path):
        keep = models.get(models.DEFAULT_FAMILY).model.ENCODER if encoder_only else None  # TF1 is BERT's
        config, params = tf1.load(path, seed, keep=keep)
    else:
        family = _hf_family(path)
        config, params = family.hf.load(path, seed, keep=family.model.ENCODER if encoder_only else None)
    return config, {name: params[name] for name in models.of(config).model.ENCODER} if encoder_only else params


def from_pretrained(
    path: str, *, dtype: Any = jnp.float32, scan_layers: bool = False, remat_policy: str = "none", seed: int = 0
) -> tuple[Any, dict]:
    """(model, params) from a Hugging Face BERT or ModernBERT directory (safetensors), a bertjax workdir or
    a google-research/bert TF1 directory. `scan_layers` is BERT's (ModernBERT's layers are a loop)."""
    config, params = load(path, seed)
    family = models.of(config)
    model = family.model.from_architecture(config, dtype=dtype, scan_layers=scan_layers, remat_policy=remat_policy)
    params = jax.tree.map(jnp.asarray, params)
    return model, family.model.stack_layers(params, config.num_hidden_layers) if scan_layers else params


def save_pretrained(
    path: str,
    model: Any,
    params: dict,
    vocab_file: Optional[str] = None,
    do_lower_case: bool = True,
    tokenizer_dir: Optional[str] = None,
) -> None:
    """A directory transformers loads as it is: `BertForPreTraining` for a BERT, `ModernBertForMaskedLM` for a
    ModernBERT, with `vocab_file`'s BertTokenizer files (or, for ModernBERT, `tokenizer_dir`'s tokenizer files)."""
    family = models.of(model.config)
    extra = {"tokenizer_dir": tokenizer_dir} if tokenizer_dir else {}
    family.hf.save_pretrained(path, model, params, vocab_file=vocab_file, do_lower_case=do_lower_case, **extra)


def vocab_of(path: str) -> tuple[Optional[str], bool]:
    """(vocab file or None, do_lower_case) that come with the weights at `path`: a workdir's (its config's or its
    data stage's), a Hugging Face directory's vocab.txt or tokenizer.json, a TF1 directory's vocab.txt."""
    path = local_dir(path)
    if checkpoint_lib.is_workdir(path):
        return _run_vocab(path) or run_vocab(path)
    if hf_files.has_config(path):
        vocab = os.path.join(path, "vocab.txt")
        if not os.path.isfile(vocab):  # a tokenizer.json alone (byte-level BPE, ModernBERT's own) is applied as is
            vocab = os.path.join(path, "tokenizer.json")
        settings = os.path.join(path, "tokenizer_config.json")
        lower = True
        if os.path.isfile(settings):
            with open(settings) as f:
                lower = bool(json.load(f).get("do_lower_case", True))
        return (vocab if os.path.isfile(vocab) else None), lower
    return tf1.vocab(path)


def _run_vocab(workdir: str) -> Optional[tuple[str, bool]]:
    """A fine-tuned workdir's own record of its tokenizer (its config.json's data section)."""
    path = os.path.join(workdir, "config.json")
    if not files.isfile(path):
        return None
    data = files.read_json(path).get("data", {})
    return (data["vocab_file"], bool(data.get("do_lower_case", True))) if data.get("vocab_file") else None


def run_vocab(workdir: str) -> tuple[Optional[str], bool]:
    """(vocab file, do_lower_case) the run in workdir was trained with, from its saved config.json: the files an
    export carries (a WordPiece vocab.txt or a tokenizer.json; a SentencePiece model not)."""
    path = os.path.join(workdir, "config.json")
    if not files.isfile(path):
        return None, True
    data = files.read_json(path).get("data", {})
    vocab = data.get("vocab_file") or None
    if vocab and not (vocab.endswith((".txt", ".json")) and files.isfile(vocab)):
        vocab = None
    return vocab, bool(data.get("do_lower_case", True))


def _check_source(path: str) -> None:
    here = local_dir(path)
    if not (checkpoint_lib.is_workdir(here) or hf_files.has_config(here) or tf1.is_tf1_dir(here)):
        raise FileNotFoundError(
            f"config.train.init_from={path} is neither a bertjax workdir (with "
            f"{checkpoint_lib.CHECKPOINTS}/), a Hugging Face directory (with {hf_files.CONFIG_NAME}) "
            f"nor a google-research/bert TF1 directory (with {tf1.LAYOUT})."
        )


def architecture_of(path: str) -> Any:
    """The architecture at `path`, without reading its weights: a workdir's newest checkpoint's, a Hugging Face
    directory's config.json, a TF1 directory's bert_config.json."""
    _check_source(path)
    path = local_dir(path)
    if checkpoint_lib.is_workdir(path):
        fingerprint = checkpoint_lib.read_fingerprint(path)
        return models.of_fingerprint(fingerprint).config.from_fingerprint(fingerprint["model"])
    if tf1.is_tf1_dir(path):
        return tf1.load_config(path)
    return _hf_family(path).hf.load_config(path)


def adopt_init_from(job: Any) -> Any:
    """Continued pre-training (`config.train.init_from`, as BioBERT, SciBERT and FinBERT were made): the job takes
    init_from's architecture and, unless config.data.vocab_file names one, its vocab (the corpus stage then
    trains none), before any data work. config.model keeps what the family lets a continued run change (context
    extension: max_position_embeddings, RoPE thetas) and how the model is computed (dtype, scan, remat,
    attention). A vocab_file of another size than init_from's model is refused here, in one sentence."""
    path = job.train.init_from
    if not path or job.train.branch_from:  # a branch resumes its own workdir's run
        return job
    theirs = architecture_of(path)
    if job.data.next_sentence_prediction and not theirs.has_nsp_head:
        raise ValueError(
            f"config.train.init_from={path} holds a {theirs.model_type} model, which has no next-sentence head, but "
            "config.data.next_sentence_prediction=True: set it to False to continue its pre-training with MLM only "
            "(on records made with `prepare --no_nsp`)."
        )
    fields = models.of(theirs).config.model_config_fields(theirs)
    if job.model.family == theirs.model_type:
        fields.update({f: getattr(job.model, f) for f in type(theirs).init_from_may_change})
    taken = [
        f"{k} {getattr(job.model, k)} → {v}"
        for k, v in fields.items()
        if k != "vocab_size" and getattr(job.model, k, v) != v
    ]
    log.info("init_from: the architecture of %s%s", path, f" ({', '.join(taken)})" if taken else "")
    vocab, lower = vocab_of(path)
    data: dict = {}
    if job.data.vocab_file:
        from bertjax.data.vocab import tokenization

        size = tokenization.load(job.data.vocab_file, job.data.do_lower_case).vocab_size
        if size != theirs.vocab_size:
            raise ValueError(
                f"config.data.vocab_file={job.data.vocab_file} has {size:,} tokens but config.train.init_from={path} "
                f"holds a model with vocab_size {theirs.vocab_size:,}: leave config.data.vocab_file empty to take "
                f"{path}'s own vocab{f' ({vocab})' if vocab else ''}, or start from a model of this vocab."
            )
    elif vocab:
        data = {"vocab_file": vocab, "do_lower_case": lower}
        log.info(
            "init_from: its vocab %s (%s tokens, do_lower_case=%s)%s",
            vocab,
            f"{theirs.vocab_size:,}",
            lower,
            "; the corpus stage trains none" if job.data.corpus else "",
        )
    elif job.data.corpus:
        raise FileNotFoundError(
            f"no vocab comes with config.train.init_from={path}; set --config.data.vocab_file "
            "(and --config.data.do_lower_case) to the vocab it was trained with."
        )
    return job.replace(model=fields, data=data)


def init_params(path: str, model: Any) -> dict:
    """`config.train.init_from`: weights only, as host arrays in the model's layer layout; a different
    family or architecture is one clear error."""
    _check_source(path)
    arch, params = load(path)
    if arch.model_type != model.config.model_type:
        raise ValueError(
            f"config.train.init_from={path} holds a {arch.model_type} model, but config.model.family is "
            f"{model.config.model_type!r}; start from a {model.config.model_type} checkpoint, or train "
            f"with config.model.family={arch.model_type!r} and its architecture."
        )
    theirs = arch.to_dict()
    changed = [
        f"{f} {theirs.get(f)} → {getattr(model.config, f)}"
        for f in model.config.init_from_may_change
        if theirs.get(f) != getattr(model.config, f)
    ]
    if changed:
        log.info("init_from: %s (the same weights, as context extension does)", ", ".join(changed))
    may_change = {f: getattr(model.config, f) for f in model.config.init_from_may_change}
    diff = model.config.differences({**theirs, **may_change})
    if diff:
        raise ValueError(
            f"config.train.init_from={path} holds a different model ({'; '.join(diff)}); set config.model to match it."
        )
    params = jax.device_get(params)
    return (
        models.of(arch).model.stack_layers(params, arch.num_hidden_layers)
        if getattr(model, "scan_layers", False)
        else params
    )
