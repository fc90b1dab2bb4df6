"""Retrieval evaluation: the metrics against pytrec_eval (trec_eval's own code), the blocked top-k against a brute
force, the sentence-transformers directory both ways against the real package, `python -m bertjax.retrieval` end to
end on a BEIR set built from Python's docstrings (a tiny BERT against transformers + numpy + pytrec_eval; the
shipped all-MiniLM-L6-v2 against sentence-transformers' own encode), and every bad input's one sentence."""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import pytrec_eval
import torch
import transformers
from absl import flags

import bertjax
import train_setup
from bertjax import retrieval as retrieval_cli
from bertjax.data.corpus import sources
from bertjax.finetuning import beir, embedding, exact_search, retrieval_eval, retrieval_metrics
from bertjax.jobs import retrieval as retrieval_job
from bertjax.interop import sentence_transformers_dir as st_dir
from bertjax.models.bert import model as model_lib

import reference

EMBED_ATOL = 1e-4
MINILM_LENGTH = 64  # tokens: a quarter of the CPU time of the directory's 256; most documents are cut
PACKAGES = (
    "json/",
    "email/",
    "http/",
    "logging/",
    "asyncio/",
)  # ~60 modules of real prose, read in well under a second
TREC_MEASURES = {"ndcg_cut.10", "recall.100", "recip_rank"}


# --- The metrics against pytrec_eval ------------------------------------------------------------------------------


def trec_reference(run: dict, qrels: dict) -> dict[str, dict[str, float]]:
    """pytrec_eval's per-query values under our names; MRR@10 is trec_eval's recip_rank when the first relevant
    document is in the top 10 (rank <= 10: recip_rank >= 0.1), else 0."""
    trec_run = {q: {d: float(s) for d, s in hits} for q, hits in run.items()}
    values = pytrec_eval.RelevanceEvaluator(qrels, TREC_MEASURES).evaluate(trec_run)
    return {
        q: {
            "ndcg_at_10": v["ndcg_cut_10"],
            "recall_at_100": v["recall_100"],
            "mrr_at_10": v["recip_rank"] if v["recip_rank"] >= 0.1 - 1e-12 else 0.0,
        }
        for q, v in values.items()
    }


def random_run(seed: int, queries: int = 60, docs: int = 400) -> tuple[dict, dict]:
    """Graded qrels (0-3, some queries judged only 0), runs of 20-150 hits with many tied scores (scores on a
    coarse grid), some queries whose relevant documents are never retrieved."""
    rng = np.random.default_rng(seed)
    doc_ids = [f"doc{i}" for i in range(docs)]
    qrels, run = {}, {}
    for q in range(queries):
        judged = rng.choice(docs, size=rng.integers(1, 12), replace=False)
        grades = rng.integers(0, 4, len(judged)) if q % 7 else np.zeros(len(judged), int)
        qrels[f"q{q}"] = {doc_ids[d]: int(g) for d, g in zip(judged, grades)}
        pool = rng.choice(docs, size=rng.integers(20, 151), replace=False)
        if q % 5 == 0:  # nothing judged is retrieved
            pool = np.array([d for d in pool if doc_ids[d] not in qrels[f"q{q}"]])
        scores = np.round(rng.random(len(pool)) * 8) / 8  # ties everywhere
        run[f"q{q}"] = [(doc_ids[d], float(s)) for d, s in zip(pool, scores)]
    return run, qrels


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metrics_equal_pytrec_eval(seed):
    run, qrels = random_run(seed)
    ours, theirs = retrieval_metrics.per_query(run, qrels), trec_reference(run, qrels)
    assert ours.keys() == theirs.keys()
    for q in ours:
        for name in retrieval_metrics.NAMES:
            assert ours[q][name] == pytest.approx(theirs[q][name], abs=1e-12), (q, name)
    means = retrieval_metrics.evaluate(run, qrels)
    assert means["queries"] == len(qrels)
    for name in retrieval_metrics.NAMES:
        assert means[name] == pytest.approx(np.mean([v[name] for v in theirs.values()]), abs=1e-12)
    # The cases are there: ties decide ranks, queries with nothing relevant retrieved score 0.
    assert any(len({s for _, s in hits}) < len(hits) for hits in run.values())
    assert sum(v["recall_at_100"] == 0 for v in theirs.values()) >= len(qrels) // 5
    assert 0 < means["mrr_at_10"] < 1 and 0 < means["ndcg_at_10"] < 1


def test_ties_are_ranked_as_trec_eval_ranks_them():
    qrels = {"q": {"a": 1}}
    run = {"q": [("a", 1.0), ("b", 1.0), ("c", 1.0)]}  # trec_eval: c, b, a
    assert retrieval_metrics.evaluate(run, qrels)["mrr_at_10"] == pytest.approx(1 / 3)
    assert trec_reference(run, qrels)["q"]["mrr_at_10"] == pytest.approx(1 / 3)


# --- The blocked search against a brute force ---------------------------------------------------------------------


def test_a_block_is_no_larger_than_the_corpus_needs():
    """A small corpus: one block of its documents rounded up to whole batches (it was 65,536 rows, all scored);
    a large one: the score budget's rows, whole batches."""
    assert exact_search.block_rows(31, 64, num_documents=61) == 64
    assert exact_search.block_rows(31, 64, num_documents=130) == 192
    assert exact_search.block_rows(31, 64) == exact_search.block_rows(31, 64, num_documents=10**7) == 65536
    assert exact_search.block_rows(1000, 1024, num_documents=10**6) == 21504  # the million-document benchmark's


@pytest.mark.parametrize("docs,k,block,batch", [(300, 20, 64, 24), (10, 20, 4, 3), (257, 5, 257, 257)])
def test_blocked_top_k_equals_brute_force(docs, k, block, batch):
    rng = np.random.default_rng(docs)
    queries = rng.normal(size=(7, 16)).astype(np.float32)
    corpus = rng.normal(size=(docs, 16)).astype(np.float32)
    order = rng.permutation(docs)  # documents arrive in any order (embedding.py: longest first)
    batches = []
    for begin in range(0, docs, batch):
        indices = order[begin : begin + batch]
        rows = np.zeros((batch, 16), np.float32)  # padded as embed_batches pads: rows past the indices
        rows[: len(indices)] = corpus[indices]
        batches.append((indices, jnp.asarray(rows)))
    scores, ids = exact_search.search(jnp.asarray(queries), batches, k, block)
    full = queries.astype(np.float64) @ corpus.T.astype(np.float64)
    expected = np.argsort(-full, axis=1, kind="stable")[:, :k]
    found = min(k, docs)
    np.testing.assert_array_equal(ids[:, :found], expected)
    np.testing.assert_allclose(scores[:, :found], np.take_along_axis(full, expected, axis=1), rtol=0, atol=1e-5)
    assert (ids[:, found:] == -1).all() and np.isneginf(scores[:, found:]).all()
    top = exact_search.TopK(jnp.asarray(queries), k, block)
    for indices, rows in batches:
        top.add(indices, rows)
    top.result()
    assert top.blocks == -(-docs // block)  # every block merged once: the blocks were smaller than the corpus


def test_identical_ids_are_dropped_and_one_more_hit_kept():
    data = beir.RetrievalSet(["a", "q1", "b"], ["x", "y", "z"], ["q1"], ["y"], {"q1": {"a": 1}})
    run = retrieval_eval.run_of(data, np.array([[0.9, 0.8, 0.1]]), np.array([[1, 0, 2]]), k=2)
    assert run == {"q1": [("a", 0.8), ("b", 0.1)]}


# --- A BEIR set from Python's docstrings ----------------------------------------------------------------------------


def pydocs_beir(root: pathlib.Path) -> pathlib.Path:
    """One document a stdlib module (its module path as the title, docstring sentences 2-6 as the text); every
    other module's first sentence a query, its own module relevant (2), the next module of its package partly (1),
    one judged irrelevant (0); one query without qrels."""
    source = sources.PyDocsSource()
    units = [u for u in source.list_units() if u.startswith(PACKAGES)]
    docs = [(u, d) for u in units for d in source.read([u]) if len(d) >= 3]
    root.mkdir(parents=True)
    (root / "qrels").mkdir()
    corpus = [{"_id": f"d{i}", "title": u, "text": " ".join(d[1:6])} for i, (u, d) in enumerate(docs)]
    corpus[1].pop("title")  # the title is optional
    queries = [{"_id": f"q{i}", "text": d[0]} for i, (_, d) in enumerate(docs) if i % 2 == 0]
    qrels = ["query-id\tcorpus-id\tscore"]
    for i in range(0, len(docs) - 1, 2):
        qrels.append(f"q{i}\td{i}\t2")
        if docs[i + 1][0].split("/")[0] == docs[i][0].split("/")[0]:
            qrels.append(f"q{i}\td{i + 1}\t1")
        qrels.append(f"q{i}\td{(i + 7) % len(docs)}\t0")
    (root / "corpus.jsonl").write_text("".join(json.dumps(row) + "\n" for row in corpus))
    (root / "queries.jsonl").write_text("".join(json.dumps(row) + "\n" for row in queries))
    (root / "qrels" / "test.tsv").write_text("\n".join(qrels) + "\n")
    assert len(docs) >= 40, len(docs)  # enough to need several blocks
    return root


@pytest.fixture(scope="module")
def beir_dir(tmp_path_factory) -> pathlib.Path:
    return pydocs_beir(tmp_path_factory.mktemp("beir") / "pydocs")


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    """The command in this process, on its own flags: (exit code, stdout, stderr)."""
    fv = flags.FlagValues()
    retrieval_cli.define_flags(fv)
    fv(["retrieval", *args])
    try:
        retrieval_cli.main([], fv)
        code = 0
    except SystemExit as e:  # cli.run_job's one way out of a user's mistake
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def reference_run(data: beir.RetrievalSet, queries: np.ndarray, docs: np.ndarray) -> dict:
    """The top 101 by numpy's cosine, identical ids dropped, the top 100 kept: BEIR's exact search, on the host."""
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    scores = unit(queries.astype(np.float64)) @ unit(docs.astype(np.float64)).T
    run = {}
    for row, q in enumerate(data.query_ids):
        best = np.argsort(-scores[row], kind="stable")[:101]
        run[q] = [(data.doc_ids[i], float(scores[row, i])) for i in best if data.doc_ids[i] != q][:100]
    return run


def assert_metrics_equal(results: dict, run: dict, qrels: dict) -> None:
    expected = trec_reference(run, qrels)
    for name in retrieval_metrics.NAMES:
        assert results[name] == pytest.approx(np.mean([v[name] for v in expected.values()]), abs=1e-9), name
    assert results["queries"] == len(expected)


# --- The command end to end: a tiny BERT against transformers + numpy + pytrec_eval ------------------------------

TINY = model_lib.BertConfig(
    vocab_size=30522,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=96,
)


@pytest.fixture(scope="module")
def tiny_hf_dir(tmp_path_factory, minilm_dir) -> pathlib.Path:
    """A random tiny BERT with all-MiniLM-L6-v2's (lower-casing, 30522-token) vocab, as a Hugging Face directory."""
    path = tmp_path_factory.mktemp("tiny") / "hf"
    model = model_lib.BertForPreTraining(TINY)
    bertjax.save_pretrained(str(path), model, reference.random_params(model), vocab_file=str(minilm_dir / "vocab.txt"))
    return path


def torch_mean_pooled(model_dir: pathlib.Path, texts: list[str], max_length: int) -> np.ndarray:
    tokenizer = transformers.BertTokenizer(str(model_dir / "vocab.txt"), do_lower_case=True)
    model = transformers.BertModel.from_pretrained(str(model_dir)).eval()
    batch = tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"][..., None].float()
    return ((hidden * mask).sum(1) / mask.sum(1)).numpy()


def test_command_end_to_end_on_pydocs(beir_dir, tiny_hf_dir, tmp_path, capsys, caplog):
    caplog.set_level("INFO")
    output = tmp_path / "out" / "results.json"
    code, out, err = run_cli(
        capsys,
        f"--model={tiny_hf_dir}",
        f"--data_dir={beir_dir}",
        f"--output={output}",
        "--batch_size=8",
        "--block_size=16",  # several blocks over the ~60 documents
    )
    assert code == 0, err
    results = json.loads(out.strip().splitlines()[-1])
    assert json.loads(output.read_text()) == results
    assert "records no pooling: assuming mean pooling, normalised, cosine" in caplog.text
    data = beir.read(str(beir_dir))
    assert results["documents"] == data.num_documents and results["queries"] == data.num_queries
    assert data.unjudged_queries == (1 if len(data.doc_ids) % 2 else 0)
    assert results["seconds"] > 0
    # transformers' BertModel, mean pooling and numpy's cosine search score the same.
    limit = TINY.max_position_embeddings
    queries = torch_mean_pooled(tiny_hf_dir, data.query_texts, limit)
    docs = torch_mean_pooled(tiny_hf_dir, data.doc_texts, limit)
    assert_metrics_equal(results, reference_run(data, queries, docs), data.qrels)
    # BM25 beside it: bm25s's own retrieval scored by pytrec_eval, and well above chance on real text.
    import bm25s

    index = bm25s.BM25()
    index.index(bm25s.tokenize(data.doc_texts, stopwords="en", show_progress=False), show_progress=False)
    hits, scores = index.retrieve(
        bm25s.tokenize(data.query_texts, stopwords="en", return_ids=False, show_progress=False),
        k=data.num_documents,
        show_progress=False,
    )
    bm25_run = {
        q: [(data.doc_ids[i], float(s)) for i, s in zip(hits[r], scores[r])][:100] for r, q in enumerate(data.query_ids)
    }
    assert_metrics_equal(results["bm25s"], bm25_run, data.qrels)
    assert results["bm25s"]["ndcg_at_10"] > 0.4 and results["bm25s"]["documents"] == data.num_documents


# --- all-MiniLM-L6-v2: our command against sentence-transformers' own encode -----------------------------------------


def test_minilm_directory_scores_as_sentence_transformers(beir_dir, minilm_dir, tmp_path, capsys):
    from sentence_transformers import SentenceTransformer

    settings = st_dir.read(str(minilm_dir))
    assert (settings.pooling_mode, settings.normalize, settings.similarity, settings.max_seq_length) == (
        "mean",
        True,
        "cosine",
        256,
    )
    data = beir.read(str(beir_dir))
    st_model = SentenceTransformer(str(minilm_dir), device="cpu")
    st_model.max_seq_length = MINILM_LENGTH
    theirs_q, theirs_d = (np.asarray(st_model.encode(t, batch_size=16)) for t in (data.query_texts, data.doc_texts))
    # The embeddings: every query, and the longest documents (cut at MINILM_LENGTH tokens).
    encoder = retrieval_job.load_encoder(retrieval_job.plan_model(str(minilm_dir), MINILM_LENGTH))
    longest = embedding.length_order(data.doc_texts)[:8]
    np.testing.assert_allclose(embedding.embed(encoder, data.query_texts, 16), theirs_q, atol=EMBED_ATOL, rtol=0)
    ours_d = embedding.embed(encoder, [data.doc_texts[i] for i in longest], 8)
    np.testing.assert_allclose(ours_d, theirs_d[longest], atol=EMBED_ATOL, rtol=0)
    assert len(st_model.tokenizer(data.doc_texts[longest[0]])["input_ids"]) > MINILM_LENGTH  # cut: not vacuous

    output = tmp_path / "minilm.json"
    code, out, err = run_cli(
        capsys,
        f"--model={minilm_dir}",
        f"--data_dir={beir_dir}",
        f"--output={output}",
        "--batch_size=16",
        f"--max_seq_length={MINILM_LENGTH}",
        "--nobm25",
    )
    assert code == 0, err
    results = json.loads(output.read_text())
    assert "bm25s" not in results
    assert_metrics_equal(results, reference_run(data, theirs_q, theirs_d), data.qrels)
    assert results["ndcg_at_10"] > 0.6  # a real embedding model finds a module's prose from its first sentence

    # sentence-transformers 6's own layout of the same model (pooling_mode, no max_seq_length in
    # sentence_bert_config.json) reads the same.
    st_model.save(str(tmp_path / "saved"))
    again = st_dir.read(str(tmp_path / "saved"))
    assert (again.pooling_mode, again.normalize, again.similarity, again.max_seq_length) == (
        "mean",
        True,
        "cosine",
        MINILM_LENGTH,
    )


# --- The writer: a directory sentence-transformers loads, embedding as bertjax ----------------------------------


@pytest.fixture(scope="module")
def tiny_modernbert_dir(tmp_path_factory, minilm_dir) -> pathlib.Path:
    """A random tiny ModernBERT (global and sliding-window layers) with the same BERT vocab files."""
    from bertjax.models.modernbert import model as modernbert

    path = tmp_path_factory.mktemp("tiny") / "modernbert"
    config = train_setup.tiny_modernbert(
        vocab_size=30522,
        intermediate_size=40,
        num_attention_heads=2,
        local_attention=8,
        max_position_embeddings=128,
        cls_token_id=101,
        sep_token_id=102,
        bos_token_id=101,
        eos_token_id=102,
    )
    model = modernbert.ModernBertForMaskedLM(config)
    params = modernbert.init_params(model, jax.random.PRNGKey(3))
    bertjax.save_pretrained(str(path), model, params, vocab_file=str(minilm_dir / "vocab.txt"))
    return path


@pytest.mark.parametrize("family", ["bert", "modernbert"])
@pytest.mark.parametrize("mode,normalize,similarity", [("mean", True, "cosine"), ("cls", False, "dot")])
def test_written_directory_loads_in_sentence_transformers(request, family, tmp_path, mode, normalize, similarity):
    from sentence_transformers import SentenceTransformer

    import shutil

    path = tmp_path / "st"
    shutil.copytree(request.getfixturevalue("tiny_hf_dir" if family == "bert" else "tiny_modernbert_dir"), path)
    st_dir.write(str(path), pooling_mode=mode, normalize=normalize, similarity=similarity, max_seq_length=64)
    settings = st_dir.read(str(path))
    assert (settings.pooling_mode, settings.normalize, settings.similarity, settings.max_seq_length) == (
        mode,
        normalize,
        similarity,
        64,
    )
    texts = ["The json module encodes Python objects.", "HTTP status codes", "a " * 80]  # the last cut at 64
    st_model = SentenceTransformer(str(path), device="cpu")
    assert st_model.similarity_fn_name == similarity and st_model.max_seq_length == 64
    theirs = np.asarray(st_model.encode(texts))
    encoder = retrieval_job.load_encoder(retrieval_job.plan_model(str(path)))
    assert encoder.pooling.mode == mode and encoder.pooling.normalize == normalize
    ours = embedding.embed(encoder, texts)
    np.testing.assert_allclose(ours, theirs, atol=EMBED_ATOL, rtol=0)
    if not normalize:
        assert not np.allclose(np.linalg.norm(theirs, axis=1), 1.0)  # the case is not vacuous


# --- Bad inputs: one sentence, naming the file and line, before any work ------------------------------------------


def _rewrite(path: pathlib.Path, change) -> None:
    lines = path.read_text().splitlines()
    path.write_text("\n".join(change(lines)) + "\n")


BAD_SETS = {
    "no corpus": (lambda d: (d / "corpus.jsonl").unlink(), "corpus.jsonl does not exist"),
    "no queries": (lambda d: (d / "queries.jsonl").unlink(), "queries.jsonl does not exist"),
    "no qrels": (lambda d: (d / "qrels" / "test.tsv").rename(d / "qrels" / "dev.tsv"), "it has --split=dev"),
    "bad json": (
        lambda d: _rewrite(d / "corpus.jsonl", lambda ls: [ls[0], ls[1][:-3], *ls[2:]]),
        "corpus.jsonl:2: not valid JSON",
    ),
    "no _id": (
        lambda d: _rewrite(d / "queries.jsonl", lambda ls: [ls[0], json.dumps({"text": "x"}), *ls[1:]]),
        'queries.jsonl:2: the query has no "_id"',
    ),
    "no text": (
        lambda d: _rewrite(d / "corpus.jsonl", lambda ls: [*ls[:2], json.dumps({"_id": "new", "title": "t"}), *ls[2:]]),
        "corpus.jsonl:3: the document 'new' has no \"text\"",
    ),
    "duplicate _id": (
        lambda d: _rewrite(d / "corpus.jsonl", lambda ls: [*ls, ls[0]]),
        "_id 'd0' is given twice (first on line 1)",
    ),
    "no header": (
        lambda d: _rewrite(d / "qrels" / "test.tsv", lambda ls: ls[1:]),
        "test.tsv:1: the first line is not a header",
    ),
    "unknown document": (
        lambda d: _rewrite(d / "qrels" / "test.tsv", lambda ls: [*ls[:3], "q0\tnope\t1", *ls[3:], "q0\tnope2\t1"]),
        "test.tsv:4: names document 'nope', which",
    ),
    "unknown query": (
        lambda d: _rewrite(d / "qrels" / "test.tsv", lambda ls: [*ls, "zz\td0\t1"]),
        "names query 'zz', which",
    ),
    "bad score": (
        lambda d: _rewrite(d / "qrels" / "test.tsv", lambda ls: [*ls[:2], "q0\td3\thigh", *ls[2:]]),
        "test.tsv:3: score 'high' is not an integer",
    ),
}


@pytest.mark.parametrize("case", list(BAD_SETS))
def test_bad_sets_are_one_sentence_before_any_work(case, beir_dir, tiny_hf_dir, tmp_path, capsys, monkeypatch):
    import shutil

    data_dir = tmp_path / "set"
    shutil.copytree(beir_dir, data_dir)
    change, expected = BAD_SETS[case]
    change(data_dir)
    monkeypatch.setattr(retrieval_job, "load_encoder", lambda *a: pytest.fail("weights read before the checks"))
    code, out, err = run_cli(
        capsys, f"--model={tiny_hf_dir}", f"--data_dir={data_dir}", f"--output={tmp_path / 'r.json'}"
    )
    assert code == 1 and err.startswith("retrieval: error: ") and err.count("\n") == 1, err
    assert expected in err, err
    assert str(data_dir) in err  # the file is named by its path
    assert not (tmp_path / "r.json").exists()
    if case == "unknown document":
        assert "(2 qrels rows name missing documents)" in err


def test_a_model_of_no_known_kind_is_one_sentence(beir_dir, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli(
        capsys, f"--model={tmp_path / 'empty'}", f"--data_dir={beir_dir}", f"--output={tmp_path / 'r.json'}"
    )
    assert code == 1 and err.count("\n") == 1, err
    assert "is neither a sentence-transformers directory (with modules.json), a bertjax workdir" in err


def test_sentence_transformers_modules_bertjax_cannot_run_are_refused(tiny_hf_dir, tmp_path):
    import shutil

    path = tmp_path / "st"
    shutil.copytree(tiny_hf_dir, path)
    st_dir.write(str(path), pooling_mode="mean", normalize=True, similarity="cosine", max_seq_length=64)
    modules = json.loads((path / "modules.json").read_text())
    (path / "modules.json").write_text(
        json.dumps([*modules, {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"}])
    )
    with pytest.raises(ValueError, match="Transformer → Pooling → Normalize → Dense; bertjax evaluates"):
        st_dir.read(str(path))
    (path / "modules.json").write_text(json.dumps(modules))
    pooling = json.loads((path / "1_Pooling" / "config.json").read_text())
    pooling.update(pooling_mode_mean_tokens=False, pooling_mode_max_tokens=True)
    (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    with pytest.raises(ValueError, match="sets pooling max; bertjax pools with one of"):
        st_dir.read(str(path))


def test_a_workdir_pools_as_its_run_recorded(tmp_path, caplog):
    caplog.set_level("INFO")
    workdir = tmp_path / "run"
    (workdir / "checkpoints").mkdir(parents=True)
    _, pooling, _ = retrieval_job.model_settings(str(workdir))
    assert (pooling.mode, pooling.normalize) == ("mean", True) and "records no pooling" in caplog.text
    (workdir / "config.json").write_text(
        json.dumps({"data": {"pooling": "cls", "normalize": False, "max_seq_length": 200}})
    )
    _, pooling, settings = retrieval_job.model_settings(str(workdir))
    assert (pooling.mode, pooling.normalize, settings.max_seq_length) == ("cls", False, 200)


def test_progress_logs_a_rate_and_an_eta(caplog, monkeypatch):
    caplog.set_level("INFO")
    clock = iter(np.arange(0.0, 1000.0, 40.0))
    monkeypatch.setattr(embedding.time, "monotonic", lambda: float(next(clock)))
    progress = embedding.Progress("documents", ["x" * 10] * 10, 128)
    progress.update(np.arange(5))
    assert "documents 5/10 (50.0%), 0.1/s, ETA 0:00:40" in caplog.text
