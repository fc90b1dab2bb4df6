"""Contrastive fine-tuning (config.task=retrieval): the loss equals sentence-transformers' own on the same
embeddings, GradCache's chunked gradient equals the whole batch's, negatives span every device, and the job trains
from pairs read from real text (the standard library's docstrings), refusing bad pair files in one sentence."""

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from bertjax.data.corpus import sources as corpus_lib
from bertjax.finetuning import contrastive
from bertjax.finetuning.tasks import retrieval

import train_setup

warnings.filterwarnings("ignore", category=DeprecationWarning)


def st_loss(queries, documents, symmetric=False, grads=False):
    """sentence-transformers' MultipleNegativesRankingLoss (its symmetric form: both directions, averaged); with
    `grads`, also its gradients with respect to the queries and the documents (torch's autograd)."""
    from sentence_transformers.sentence_transformer.losses.multiple_negatives_ranking import (
        MultipleNegativesRankingLoss,
    )

    directions = ("query_to_doc", "doc_to_query") if symmetric else ("query_to_doc",)
    loss = MultipleNegativesRankingLoss(
        torch.nn.Identity(), scale=20.0, directions=directions, partition_mode="per_direction" if symmetric else "joint"
    )
    q = torch.tensor(queries, requires_grad=True)
    d = torch.tensor(documents, requires_grad=True)
    value = loss.compute_loss_from_embeddings([q] + [d[:, k] for k in range(documents.shape[1])], None)
    if not grads:
        return value.item()
    value.backward()
    return value.item(), q.grad.numpy(), d.grad.numpy()


def mean_loss_jax(out):
    total, count = out["contrastive_loss"]
    return total / count


def mean_loss(out):
    total, count = out["contrastive_loss"]
    return float(total / count)


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("negatives", [0, 2])
def test_the_loss_is_sentence_transformers_multiple_negatives_ranking_loss(symmetric, negatives):
    rng = np.random.default_rng(negatives)
    queries = rng.normal(size=(8, 24)).astype(np.float32)
    documents = rng.normal(size=(8, 1 + negatives, 24)).astype(np.float32)
    ours = contrastive.ContrastiveLoss(symmetric=symmetric).sums(queries, documents, jnp.ones(8))
    value, d_queries, d_documents = st_loss(queries, documents, symmetric, grads=True)
    assert mean_loss(ours) == pytest.approx(value, rel=1e-5)
    grads = jax.grad(
        lambda q, d: mean_loss_jax(contrastive.ContrastiveLoss(symmetric=symmetric).sums(q, d, jnp.ones(8))),
        argnums=(0, 1),
    )(jnp.asarray(queries), jnp.asarray(documents))
    np.testing.assert_allclose(np.asarray(grads[0]), d_queries, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(grads[1]), d_documents, rtol=1e-4, atol=1e-6)
    # Matryoshka: the full size's loss plus each truncated size's (MatryoshkaLoss with weights 1)
    cut = contrastive.ContrastiveLoss(symmetric=symmetric, matryoshka_dims=(12, 6)).sums(
        queries, documents, jnp.ones(8)
    )
    expected = sum(st_loss(queries[:, :d], documents[..., :d], symmetric) for d in (24, 12, 6))
    assert mean_loss(cut) == pytest.approx(expected, rel=1e-5)


def test_padding_pairs_and_duplicate_texts_are_no_ones_negatives():
    rng = np.random.default_rng(1)
    queries = rng.normal(size=(6, 16)).astype(np.float32)
    documents = rng.normal(size=(6, 2, 16)).astype(np.float32)
    loss = contrastive.ContrastiveLoss()
    # Pairs 4 and 5 pad the batch: the loss is the first four's alone.
    weights = jnp.array([1, 1, 1, 1, 0, 0], jnp.float32)
    assert mean_loss(loss.sums(queries, documents, weights)) == pytest.approx(
        st_loss(queries[:4], documents[:4]), rel=1e-5
    )
    # Query 1's positive is the same text as query 0's: for query 0 it is no negative (nor the other way).
    hashes = np.arange(12, dtype=np.int32).reshape(6, 2) + 1
    hashes[1, 0] = hashes[0, 0]
    masked = loss.sums(queries, documents, jnp.ones(6), jnp.asarray(hashes))
    scores = np.array(loss.scores(queries, np.swapaxes(documents, 0, 1).reshape(12, 16)))
    scores[0, 1] = scores[1, 0] = -np.inf
    log_softmax = scores - np.logaddexp.reduce(scores, axis=1, keepdims=True)
    assert mean_loss(masked) == pytest.approx(-np.mean(log_softmax[np.arange(6), np.arange(6)]), rel=1e-5)


def tiny_embedder(dropout: float = 0.0):
    from bertjax.finetuning import retrieval_task
    from bertjax.models.bert.config import BertConfig

    config = BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    return retrieval_task.heads.model_for(config, "retrieval", 0)


class Data:
    pooling, normalize, similarity_scale, symmetric_loss, matryoshka_dims = "mean", True, 20.0, True, "8"
    max_query_length, max_seq_length = 6, 10


def pair_batch(pairs: int, per_pair: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)

    def tokens(shape):
        ids = rng.integers(5, 50, size=shape).astype(np.int32)
        mask = (np.arange(shape[-1]) < rng.integers(3, shape[-1] + 1, size=shape[:-1])[..., None]).astype(np.int32)
        return ids * mask, mask

    query_ids, query_mask = tokens((pairs, Data.max_query_length))
    document_ids, document_mask = tokens((pairs, per_pair, Data.max_seq_length))
    return {
        "query_ids": query_ids,
        "query_mask": query_mask,
        "document_ids": document_ids,
        "document_mask": document_mask,
        "document_hash": np.arange(1, pairs * per_pair + 1, dtype=np.int32).reshape(pairs, per_pair),
        "example_weight": np.ones(pairs, np.float32),
    }


def test_the_cached_gradient_is_the_whole_batchs_gradient():
    """GradCache in 4 chunks gives the loss and gradient of the whole batch at once (no dropout, so both passes
    see the same network)."""
    from bertjax.finetuning import retrieval_task

    model = tiny_embedder()
    task = retrieval_task.task(model, Data, documents_per_pair=2)
    batch = pair_batch(8, 2)
    params = model.init(
        jax.random.PRNGKey(0), batch["query_ids"], jnp.zeros_like(batch["query_ids"]), batch["query_mask"]
    )["params"]
    import flax.linen as nn

    params = nn.meta.unbox(params)
    (whole, _), grads = task.value_and_grad(params, batch, jax.random.PRNGKey(1), 1)
    (chunked, sums), chunked_grads = task.value_and_grad(params, batch, jax.random.PRNGKey(1), 4)
    assert float(chunked) == pytest.approx(float(whole), rel=1e-6)
    flat, chunked_flat = jax.tree.leaves(grads), jax.tree.leaves(chunked_grads)
    assert len(flat) == len(chunked_flat) and any(np.abs(np.asarray(g)).max() > 0 for g in flat)
    for a, b in zip(flat, chunked_flat):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-4, atol=1e-6)
    assert float(sums["in_batch_accuracy"][1]) == 8


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> pathlib.Path:
    """Real text as pairs: a docstring's first sentence is the query, the rest of it the positive passage."""
    out = tmp_path_factory.mktemp("pairs")
    rows = []
    for document in corpus_lib.open_source("builtin:pydocs").documents():
        if len(document) >= 3 and len(rows) < 400:
            rows.append({"query": document[0], "positive": " ".join(document[1:6])})
    for name, part in (("train", rows[:320]), ("dev", rows[320:])):
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part), encoding="utf-8")
    # The dev pairs as a BEIR set too (config.data.eval_dir): query i's relevant document is its positive.
    beir_dir = out / "beir"
    (beir_dir / "qrels").mkdir(parents=True)
    dev = rows[320:]
    (beir_dir / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": f"d{i}", "title": "", "text": r["positive"]}) + "\n" for i, r in enumerate(dev))
    )
    (beir_dir / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": f"q{i}", "text": r["query"]}) + "\n" for i, r in enumerate(dev))
    )
    (beir_dir / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(len(dev)))
    )
    return out


@pytest.mark.parametrize(
    "line, says",
    [
        ('{"query": "q"}', "train.jsonl:2: the row has no 'positive'"),
        ('{"query": "q", "positive": ""}', "train.jsonl:2: the row has an empty 'positive'"),
        ('{"query": "q", "positive": 3}', "train.jsonl:2: the row has a non-text 'positive'"),
        ('{"query": "q", "positive": "p"', "train.jsonl:2: not JSON"),
        ('["q", "p"]', "train.jsonl:2: a JSON list, not an object"),
        ('{"query": "q", "positive": "p", "negatives": ["a"]}', "train.jsonl:2: the row gives 1 hard negatives, fewer"),
    ],
)
def test_a_bad_pair_is_one_sentence_naming_the_file_and_line(tmp_path, line, says):
    path = tmp_path / "train.jsonl"
    path.write_text('{"query": "a", "positive": "b", "negatives": ["c", "d"]}\n' + line + "\n")
    with pytest.raises(ValueError, match=r".*") as e:
        retrieval.read_pairs(str(path))
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_an_empty_pairs_file_is_refused(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="holds no pairs"):
        retrieval.read_pairs(str(tmp_path / "empty.jsonl"))


def finetune_job(pairs, minilm_dir, workdir, devices: int, *flags: str) -> subprocess.Popen:
    """python -m bertjax.finetune --config=configs/retrieval.py on the pydocs pairs, a tiny BERT without dropout
    (so that runs laid out differently compute the same function), 8 steps of 32 pairs in 2 GradCache chunks."""
    command = [
        sys.executable,
        "-m",
        "bertjax.finetune",
        "--config=configs/retrieval.py:size=tiny",
        f"--workdir={workdir}",
        f"--config.data.train_file={pairs / 'train.jsonl'}",
        f"--config.data.eval_file={pairs / 'dev.jsonl'}",
        f"--config.data.vocab_file={minilm_dir / 'vocab.txt'}",
        "--config.data.max_seq_length=48",
        "--config.data.max_query_length=16",
        "--config.model.hidden_dropout_prob=0",
        "--config.model.attention_probs_dropout_prob=0",
        "--config.train.global_batch_size=32",
        "--config.train.micro_batches=2",
        "--config.train.num_train_steps=8",
        "--config.train.log_every_steps=2",
        "--config.eval.every_steps=8",
        "--config.optim.learning_rate=1e-3",
        "--config.checkpoint.every_steps=8",
        *flags,
    ]
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=train_setup.job_xla_flags(devices))
    return subprocess.Popen(
        command, cwd=train_setup.ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def finished(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    return out


def test_the_job_trains_an_embedder_whose_negatives_span_every_process_and_device(pairs, tmp_path, minilm_dir):
    """Padded pairs on one device (with a BEIR eval set), and packed rows on 2 processes × 2 devices, each query's
    negatives every positive of the 32 pairs wherever they sit: the same losses, the held-out ranking scored, and
    the run exported for sentence-transformers."""
    from test_resume_and_hosts import free_port

    padded = finetune_job(
        pairs,
        minilm_dir,
        tmp_path / "padded",
        1,
        "--config.data.packing=false",
        f"--config.data.eval_dir={pairs / 'beir'}",
    )
    finished(padded)
    address = f"127.0.0.1:{free_port()}"
    hosts = [
        finetune_job(
            pairs,
            minilm_dir,
            tmp_path / "hosts",
            2,
            f"--coordinator_address={address}",
            "--num_processes=2",
            f"--process_id={i}",
        )
        for i in range(2)
    ]
    assert "data: packing 32 pairs' texts a step into" in [finished(p) for p in hosts][0]
    losses = {}
    for name in ("padded", "hosts"):
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        losses[name] = [r["contrastive_loss"] for r in rows if r.get("kind") == "train"]
        evals = [r for r in rows if r.get("kind") == "eval"]
        assert evals and 0 < evals[-1]["ndcg_at_10"] <= 1, name
        if name == "padded":  # the BEIR set scored as bertjax.retrieval scores it, the eval file's as pairs_*
            assert evals[-1]["documents"] == 80 and evals[-1]["pairs_queries"] == 80 and "pairs_ndcg_at_10" in evals[-1]
        else:
            assert evals[-1]["queries"] == 80
    assert len(losses["padded"]) == 4 and losses["padded"][-1] < losses["padded"][0]
    np.testing.assert_allclose(losses["hosts"], losses["padded"], rtol=2e-3)
    check_sentence_transformers_export(tmp_path / "hosts", tmp_path / "st", pairs)
    from bertjax.jobs import predict

    with pytest.raises(ValueError, match=r"is an embedding model \(config.task=retrieval\), which predicts no labels"):
        predict.predict_file(str(tmp_path / "hosts"), str(pairs / "dev.jsonl"), str(tmp_path / "out.jsonl"))


def check_sentence_transformers_export(workdir: pathlib.Path, out: pathlib.Path, pairs: pathlib.Path):
    """python -m bertjax.export of the run: sentence_transformers.SentenceTransformer(DIR) loads it as it is and
    embeds as bertjax does, to 1e-4."""
    from sentence_transformers import SentenceTransformer

    from bertjax import models as models_lib
    from bertjax.finetuning.config import FinetuneConfig
    from bertjax.data.vocab import tokenization
    from bertjax.finetuning import retrieval_task
    from bertjax.training import checkpoint as checkpoint_lib

    env = dict(os.environ, JAX_PLATFORMS="cpu")
    command = [sys.executable, "-m", "bertjax.export", f"--workdir={workdir}", f"--output_dir={out}"]
    done = subprocess.run(command, cwd=train_setup.ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    saved = json.loads((workdir / "config.json").read_text())
    saved.pop("kind", None)
    job = FinetuneConfig.from_saved(saved)
    fingerprint, params = checkpoint_lib.load_params(str(workdir))
    architecture = models_lib.of_fingerprint(fingerprint).config.from_fingerprint(fingerprint["model"])
    model = retrieval_task.model(dataclasses.replace(job.model, scan_layers=False), architecture)  # params: loop
    texts = [json.loads(line)["query"] for line in (pairs / "dev.jsonl").read_text().splitlines()[:8]]
    tokenizer = tokenization.load(job.data.vocab_file, job.data.do_lower_case)
    ids, mask, _ = retrieval.encode_texts(tokenizer, texts, job.data.max_seq_length)
    ours = np.asarray(retrieval_task.encode(model, job.data, params, jnp.asarray(ids), jnp.asarray(mask), None))
    st = SentenceTransformer(str(out), device="cpu")
    theirs = st.encode(texts, convert_to_numpy=True)
    np.testing.assert_allclose(theirs, ours, atol=1e-4)
    assert st.similarity_fn_name == "cosine" and np.allclose(np.linalg.norm(theirs, axis=1), 1, atol=1e-5)
