"""An encoder scored on a BEIR retrieval set (`run`, which `python -m bertjax.retrieval --model=PATH
--data_dir=BEIR_DIR --output=RESULTS.json` calls): nDCG@10, recall@100 and MRR@10 of exact dense search, and BM25's
on the same data beside them.

`--model` is a bertjax workdir (pre-training or fine-tuning: its encoder), a Hugging Face directory (either family),
a TF1 directory or a sentence-transformers directory. A sentence-transformers directory says how it pools, whether
it normalises, its similarity, its length and prompts (interop/sentence_transformers_dir.py); a fine-tuned workdir
says its pooling in its config.json (`data.pooling`, `data.normalize`); any other model is scored with mean pooling,
normalised, cosine (sentence-transformers' defaults), and the log says so. Everything the user gave is read and
checked (the set, the model's kind, files, lengths) before any weights are read or text embedded.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from typing import Any, Optional

import jax
import jax.numpy as jnp

from bertjax import models as models_lib
from bertjax.runtime import files
from bertjax.data.vocab import tokenization
from bertjax.finetuning import beir
from bertjax.finetuning import bm25
from bertjax.finetuning import embedding
from bertjax.finetuning import pooling as pooling_lib
from bertjax.finetuning import retrieval_eval
from bertjax.models import hf_files
from bertjax.interop import pretrained
from bertjax.interop import sentence_transformers_dir as st_dir
from bertjax.training import checkpoint as checkpoint_lib

log = logging.getLogger(__name__)

DEFAULT_MAX_SEQ_LENGTH = 512  # BEIR's usual cut for documents, when the model records none


def model_settings(path: str) -> tuple[str, pooling_lib.Pooling, Optional[st_dir.Settings]]:
    """(the directory the weights are read from, its pooling, what it records of its embeddings: a
    sentence-transformers directory's settings, or a contrastive run's as its export will write them); a path of no
    known kind is one sentence."""
    here = pretrained.local_dir(path)
    if st_dir.is_sentence_transformers_dir(here):
        settings = st_dir.read(here)
        if not hf_files.has_config(settings.model_dir):
            raise FileNotFoundError(
                f"{settings.model_dir} has no {hf_files.CONFIG_NAME}; {path}'s modules.json names it as its "
                "Transformer module, which must be a Hugging Face directory."
            )
        pooling = pooling_lib.Pooling(settings.pooling_mode, settings.normalize, settings.similarity)
        return settings.model_dir, pooling, settings
    if checkpoint_lib.is_workdir(here):
        config_path = os.path.join(here, "config.json")
        data = files.read_json(config_path).get("data", {}) if files.isfile(config_path) else {}
        if data.get("pooling") in pooling_lib.MODES:  # a contrastive fine-tuning run: as its export will say
            settings = st_dir.Settings(
                model_dir=here,
                pooling_mode=data["pooling"],
                normalize=bool(data.get("normalize", True)),
                similarity="cosine",
                max_seq_length=data.get("max_seq_length"),
                do_lower_case=False,
            )
            return here, pooling_lib.Pooling(settings.pooling_mode, settings.normalize, settings.similarity), settings
        return here, pooling_lib.assumed(path), None
    if hf_files.has_config(here) or pretrained.is_tf1_dir(here):
        return here, pooling_lib.assumed(path), None
    raise FileNotFoundError(
        f"--model={path} is neither a sentence-transformers directory (with {st_dir.MODULES}), a bertjax workdir (with "
        f"{checkpoint_lib.CHECKPOINTS}/), a Hugging Face directory (with {hf_files.CONFIG_NAME}) nor a TF1 directory "
        f"(with {pretrained.TF1_LAYOUT}); pass one of them."
    )


@dataclasses.dataclass(frozen=True)
class ModelPlan:
    """What `--model` is, checked before any weights are read: its weights, architecture, tokenizer and pooling."""

    path: str
    weights_dir: str
    config: Any  # the architecture
    pooling: pooling_lib.Pooling
    settings: Optional[st_dir.Settings]
    max_seq_length: int
    tokenizer: tokenization.Tokenizer


def plan_model(path: str, max_seq_length: Optional[int] = None) -> ModelPlan:
    weights_dir, pooling, settings = model_settings(path)
    config = pretrained.architecture_of(weights_dir)
    limit = config.max_position_embeddings
    if max_seq_length is not None and not 3 <= max_seq_length <= limit:
        raise ValueError(
            f"--max_seq_length={max_seq_length} must be from 3 to the model's max_position_embeddings={limit}."
        )
    recorded = settings.max_seq_length if settings else None
    length = max_seq_length or min(recorded or DEFAULT_MAX_SEQ_LENGTH, limit)
    vocab, do_lower_case = pretrained.vocab_of(weights_dir)
    if vocab is None:
        raise FileNotFoundError(
            f"--model={path} records no vocabulary (no {tokenization.VOCAB_FILE} or {tokenization.TOKENIZER_JSON}); "
            "add the one it was trained with."
        )
    tokenizer = tokenization.load(vocab, do_lower_case)
    if tokenizer.vocab_size > config.vocab_size:
        raise ValueError(
            f"{vocab} has {tokenizer.vocab_size} tokens but the model at {path} has {config.vocab_size} embeddings; "
            "pass a model directory whose vocabulary matches its weights."
        )
    log.info(
        "retrieval: %s (%s, %d layers, hidden %d), vocab %s (do_lower_case=%s)",
        path,
        config.model_type,
        config.num_hidden_layers,
        config.hidden_size,
        vocab,
        do_lower_case,
    )
    return ModelPlan(path, weights_dir, config, pooling, settings, length, tokenizer)


def load_encoder(plan: ModelPlan) -> embedding.Encoder:
    """The planned encoder, ready to embed: its weights (the encoder alone) on the device."""
    config, settings = plan.config, plan.settings
    _, params = pretrained.load(plan.weights_dir, encoder_only=True)
    family = models_lib.of(config).model
    params = jax.tree.map(jnp.asarray, params[family.BODY])

    def hidden_states(p, ids, mask):
        return family.encoder_states(config, p, ids, jnp.zeros_like(ids), mask)[-1]

    return embedding.Encoder(
        hidden_states=hidden_states,
        params=params,
        tokenizer=plan.tokenizer,
        pooling=plan.pooling,
        max_seq_length=plan.max_seq_length,
        lower_case_text=settings.do_lower_case if settings else False,
        query_prompt=settings.query_prompt if settings else "",
        document_prompt=settings.document_prompt if settings else "",
    )


def run(
    model: str,
    data_dir: str,
    output: str,
    split: str = "test",
    batch_size: int = 64,
    max_seq_length: Optional[int] = None,
    block_size: Optional[int] = None,
    with_bm25: bool = True,
) -> dict:
    """Writes `output` (JSON) and returns it: the dense scores, and BM25's under "bm25s"."""
    if batch_size < 1:
        raise ValueError(f"--batch_size={batch_size} must be at least 1.")
    if block_size is not None and block_size < 1:
        raise ValueError(f"--block_size={block_size} must be at least 1.")
    start = time.monotonic()
    data = beir.read(data_dir, split)
    plan = plan_model(model, max_seq_length)  # the model's kind, files, vocab and length checked before any work
    out_dir = os.path.dirname(output)
    if out_dir:
        files.makedirs(out_dir)
    log.info(
        "retrieval: read %s (%s documents, %s judged queries) in %.1f s",
        data_dir,
        f"{data.num_documents:,}",
        f"{data.num_queries:,}",
        time.monotonic() - start,
    )
    encoder = load_encoder(plan)
    results = retrieval_eval.evaluate(encoder, data, batch_size, block_size)
    log.info(
        "retrieval: nDCG@10 %.4f, recall@100 %.4f, MRR@10 %.4f (%.1f s)",
        results["ndcg_at_10"],
        results["recall_at_100"],
        results["mrr_at_10"],
        results["seconds"],
    )
    if with_bm25:
        results[bm25.NAME] = bm25.evaluate(data)
    files.write_whole(output, json.dumps(results, indent=2) + "\n")
    return results
