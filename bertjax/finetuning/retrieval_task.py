"""The `trainer.Task` of contrastive retrieval (tasks/retrieval.py reads its pairs): the family's encoder without an
output layer (num_labels=0), its hidden states pooled into one embedding a text, and contrastive.py's loss over the
whole global batch with the cached gradient (config.train.micro_batches chunks of pairs)."""

from __future__ import annotations

import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.finetuning import contrastive
from bertjax.finetuning import heads
from bertjax.finetuning import pooling
from bertjax.finetuning.tasks import retrieval as retrieval_kind
from bertjax.training import metrics as metrics_lib
from bertjax.training import trainer as trainer_lib

Array = jax.Array


def encode(model: Any, data: Any, params: Any, ids: Array, mask: Array, rng: Optional[Array]) -> Array:
    """Embeddings [..., hidden] of token rows [..., length] (any leading shape)."""
    lead = ids.shape[:-1]
    ids, mask = ids.reshape(-1, ids.shape[-1]), mask.reshape(-1, mask.shape[-1])
    hidden = model.apply(
        {"params": params},
        input_ids=ids,
        segment_ids=jnp.zeros_like(ids),
        input_mask=mask,
        deterministic=rng is None,
        rngs=None if rng is None else {"dropout": rng},
    )
    settings = pooling.Pooling(mode=data.pooling, normalize=data.normalize)
    return pooling.pool(hidden, mask, settings).reshape(lead + (-1,))


def embed_pairs(model: Any, data: Any, params: Any, batch: dict, rng: Optional[Array]) -> tuple[Array, Array]:
    """(queries [B, hidden], documents [B, 1 + K, hidden]) of a batch of pairs."""
    query_rng, doc_rng = (None, None) if rng is None else jax.random.split(rng)
    queries = encode(model, data, params, batch["query_ids"], batch["query_mask"], query_rng)
    documents = encode(model, data, params, batch["document_ids"], batch["document_mask"], doc_rng)
    return queries, documents


def embed_packed(model: Any, data: Any, params: Any, batch: dict, rng: Optional[Array]) -> tuple[Array, Array]:
    """The same from packed rows (pair_packing.py): every text pooled over its own slot, then gathered into
    (queries [B, hidden], documents [B, 1 + K, hidden]) by the pairs' slot indices."""
    hidden = model.apply(
        {"params": params},
        input_ids=batch["input_ids"],
        segment_ids=jnp.zeros_like(batch["input_ids"]),
        input_mask=batch["input_mask"],
        deterministic=rng is None,
        rngs=None if rng is None else {"dropout": rng},
        position_ids=batch["position_ids"],
        cls_positions=batch["cls_positions"],
    )
    settings = pooling.Pooling(mode=data.pooling, normalize=data.normalize)
    slots = pooling.pool_slots(hidden, batch["input_mask"], batch["cls_positions"], settings)  # [rows, k, hidden]
    flat = slots.reshape(-1, slots.shape[-1])
    return flat[batch["query_slot"]], flat[batch["document_slot"]]


def counts(batch: dict) -> dict:
    """The log's pairs a row (1: seq/s counts pairs) and real tokens a row (the query's and its documents')."""
    weight = batch["example_weight"]
    pairs = jnp.sum(weight)
    if "query_slot" in batch:  # packed: every real token of the rows (a padding pair places no text)
        return {"instances_per_row": (pairs, pairs), "real_tokens_per_row": (jnp.sum(batch["input_mask"] > 0), pairs)}
    real = jnp.sum(batch["query_mask"] > 0, axis=-1) + jnp.sum(batch["document_mask"] > 0, axis=(-2, -1))
    return {"instances_per_row": (pairs, pairs), "real_tokens_per_row": (jnp.sum(real * weight), pairs)}


def loss_of(data: Any, hidden_size: int) -> contrastive.ContrastiveLoss:
    return contrastive.ContrastiveLoss(
        scale=data.similarity_scale,
        similarity="cosine",
        symmetric=data.symmetric_loss,
        matryoshka_dims=contrastive.matryoshka_dims(data.matryoshka_dims, hidden_size),
    )


def task(
    model: Any, data: Any, documents_per_pair: int, packed_rows: int = 0, slots: int = 0, pairs: int = 0
) -> trainer_lib.Task:
    """The task that fine-tunes `model` (a family's fine-tuning module with num_labels=0) on pairs: padded, or
    (`packed_rows` > 0: that many rows of up to `slots` texts for every global batch of `pairs`) packed
    (pair_packing.py)."""
    kind = retrieval_kind.KIND
    loss = loss_of(data, model.config.hidden_size)
    embed = functools.partial(embed_packed if packed_rows else embed_pairs, model, data)

    def shapes(pairs: int) -> dict:
        if not packed_rows:
            return kind.batch_shapes(data, pairs, documents_per_pair)
        tokens, per_row = (packed_rows, data.max_seq_length), (packed_rows, slots)
        return {
            "input_ids": (tokens, np.int32),
            "input_mask": (tokens, np.int32),
            "position_ids": (tokens, np.int32),
            "cls_positions": (per_row, np.int32),
            "query_slot": ((pairs,), np.int32),
            "document_slot": ((pairs, documents_per_pair), np.int32),
            "document_hash": ((pairs, documents_per_pair), np.int32),
            "example_weight": ((pairs,), np.float32),
        }

    def sums(params: Any, batch: dict, rng: Optional[Array]) -> metrics_lib.Metrics:
        queries, documents = embed(params, batch, rng)
        return dict(loss.sums(queries, documents, batch["example_weight"], batch["document_hash"]), **counts(batch))

    def objective(batch: dict):
        def of_embeddings(queries: Array, documents: Array):
            out = loss.sums(queries, documents, batch["example_weight"], batch["document_hash"])
            total, count = out["contrastive_loss"]
            return total / jnp.maximum(count, 1.0), dict(out, **counts(batch))

        return of_embeddings

    def value_and_grad(params: Any, batch: dict, rng: Array, chunks: int):
        return contrastive.cached_value_and_grad(embed, objective(batch), params, batch, rng, chunks)

    def predict(params: Any, batch: dict) -> dict:
        queries, documents = embed(params, batch, None)
        return {"queries": queries, "documents": documents}

    text_flops = metrics_lib.flops_per_sequence(model.config, data.max_seq_length, num_predictions=0)
    return trainer_lib.Task(
        model=model,
        forward_sums=sums,
        loss_denominators=lambda batch: jnp.sum(batch["example_weight"]),
        loss=lambda s, denominator: s["contrastive_loss"][0] / jnp.maximum(denominator, 1.0),
        batch_shapes=shapes,
        seq_len=data.max_seq_length,
        # A pair's documents at full length, its query at its own; GradCache's second forward pass not counted.
        flops_per_row=text_flops * (documents_per_pair + data.max_query_length / data.max_seq_length),
        predict=predict,
        value_and_grad=value_and_grad,
        # A pair's tokens: its query's and documents' rows padded, or its share of the packed rows.
        tokens_per_row=(
            data.max_seq_length * packed_rows / pairs
            if packed_rows and pairs
            else data.max_query_length + documents_per_pair * data.max_seq_length
        ),
    )


def model(cfg: Any, architecture: Any, platform: Optional[str] = None, packed: bool = False) -> Any:
    """The family's fine-tuning module without an output layer: it returns the last hidden states."""
    return heads.from_config(cfg, architecture, retrieval_kind.KIND.name, 0, platform, packed=packed)


def documents_per_pair(arrays: dict[str, np.ndarray]) -> int:
    return int(arrays["document_ids"].shape[1])


def evaluate(trainer: Any, params: Any, batches: Any, examples: list) -> dict[str, float]:
    """An eval file of pairs scored as a retrieval set: every query against every distinct
    document of the file, by exact cosine; ndcg_at_10, mrr_at_10 and recall_at_100 of each query's positive (its
    one relevant document)."""
    batches.reset()
    queries, documents = [], []
    for local in batches:
        out = trainer.predict_step(params, trainer.global_batch(local))
        queries.append(np.asarray(out["queries"], np.float32))
        documents.append(np.asarray(out["documents"], np.float32))
    queries = np.concatenate(queries)[: batches.rows]
    documents = np.concatenate(documents)[: batches.rows]
    index: dict[str, int] = {}
    vectors = []
    for example, own in zip(examples, documents):
        for text, vector in zip((example.positive, *example.negatives), own):
            if text not in index:
                index[text] = len(index)
                vectors.append(vector)
    corpus = np.stack(vectors)
    scores = np.asarray(pooling.normalize(queries) @ pooling.normalize(corpus).T)
    relevant = np.array([index[e.positive] for e in examples])
    positive = scores[np.arange(len(examples)), relevant]
    rank = 1 + np.sum(scores > positive[:, None], axis=1)  # ties go the positive's way
    return {
        "ndcg_at_10": float(np.mean(np.where(rank <= 10, 1.0 / np.log2(rank + 1), 0.0))),
        "mrr_at_10": float(np.mean(np.where(rank <= 10, 1.0 / rank, 0.0))),
        "recall_at_100": float(np.mean(rank <= 100)),
        "queries": float(len(examples)),
        "documents": float(len(corpus)),
    }


_EVAL_ENCODERS: dict = {}


def evaluate_beir(job: Any, source: Any, tokenizer: Any, params: Any, data: Any) -> dict[str, float]:
    """The model being trained scored on a BEIR set (config.data.eval_dir) as `python -m bertjax.retrieval` scores
    it (retrieval_eval.py: exact search on the device, trec_eval's metrics); params gathered to every process."""
    from bertjax.finetuning import embedding, retrieval_eval

    if jax.process_count() > 1:  # params span processes: each embeds with a whole copy
        from jax.experimental import multihost_utils

        params = multihost_utils.process_allgather(params, tiled=True)
    key = (job.model, source.architecture, job.data.pooling, job.data.normalize, job.data.max_seq_length, id(tokenizer))
    encoder = _EVAL_ENCODERS.get(key)
    if encoder is None:  # built once a run: every eval after the first reuses its compiled embedding
        module = model(job.model, source.architecture)

        def hidden_states(p: Any, ids: Array, mask: Array) -> Array:
            return module.apply({"params": p}, input_ids=ids, segment_ids=jnp.zeros_like(ids), input_mask=mask)

        settings = pooling.Pooling(mode=job.data.pooling, normalize=job.data.normalize)
        encoder = embedding.Encoder(hidden_states, None, tokenizer, settings, job.data.max_seq_length)
        _EVAL_ENCODERS.clear()  # one run's at a time
        _EVAL_ENCODERS[key] = encoder
    scores = retrieval_eval.evaluate(encoder.with_params(params), data)
    return {k: float(v) for k, v in scores.items() if k != "seconds"}
