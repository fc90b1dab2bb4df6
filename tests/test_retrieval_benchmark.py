"""benchmarks/retrieval.py at a tiny scale (`--quick`): every part runs end to end on this machine's manual pages
with a tiny random BERT standing in for both the demo model and all-MiniLM-L6-v2 (so that each process is quick);
the retrieval set's splits are disjoint and its queries and documents come from different parts of the pages; the
scores are scores; exact search agrees with numpy. The figures that are timings or quality are the benchmark's
(docs/retrieval.md), not asserted here."""

import glob
import importlib.util
import json
import subprocess
import sys

import jax
import pytest

import bertjax
from bertjax.models.bert import model as model_lib
from bertjax.interop import sentence_transformers_dir

import train_setup

METRICS = {"ndcg_at_10", "mrr_at_10", "recall_at_100"}
needs_pages = pytest.mark.skipif(
    len(glob.glob("/usr/share/man/man[1-8]/*.gz")) < 150 or not __import__("shutil").which("groff"),
    reason="needs Debian's English manual pages and groff (the set is built from them)",
)


@pytest.fixture(scope="module")
def tiny_st_dir(tmp_path_factory, minilm_dir) -> str:
    """A tiny BERT with random weights and all-MiniLM-L6-v2's vocab, as a sentence-transformers directory (mean
    pooling, normalised): what `--pretrained` and `--minilm` both take here."""
    path = tmp_path_factory.mktemp("tiny_st")
    vocab = minilm_dir / "vocab.txt"
    config = model_lib.BertConfig(
        vocab_size=len(vocab.read_text(encoding="utf-8").splitlines()),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    model = model_lib.BertForPreTraining(config)
    params = model_lib.init_params(model, jax.random.PRNGKey(0))
    bertjax.save_pretrained(str(path), model, params, vocab_file=str(vocab))
    sentence_transformers_dir.write(
        str(path), pooling_mode="mean", normalize=True, similarity="cosine", max_seq_length=128
    )
    return str(path)


@needs_pages
def test_the_benchmark_runs_every_part_and_its_set_is_sound(tmp_path, tiny_st_dir):
    # sentence-transformers' trainer needs accelerate (not in the test extra): without it, the speed part is left out.
    parts = "compare,sweep,speed,search" if importlib.util.find_spec("accelerate") else "compare,sweep,search"
    work = tmp_path / "work"
    # The set built first, as for a GPU machine (which has no manual pages), and taken as it is (--set_dir).
    set_dir = tmp_path / "set"
    built = subprocess.run(
        [sys.executable, "benchmarks/manpage_set.py", f"--out={set_dir}", "--max_pages=150", "--test_queries=20"],
        cwd=train_setup.ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    done = subprocess.run(
        [
            sys.executable,
            "benchmarks/retrieval.py",
            "--quick",
            f"--parts={parts}",
            f"--work_dir={work}",
            f"--set_dir={set_dir}",
            f"--pretrained={tiny_st_dir}",
            f"--minilm={tiny_st_dir}",
            "--search_documents=5000",
        ],
        cwd=train_setup.ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert json.loads((work / "retrieval.json").read_text()) == result  # --quick writes into the work dir
    assert (work / "retrieval.png").stat().st_size > 0
    assert "| (a) demo, pre-trained + fine-tuned |" in (work / "retrieval.md").read_text()

    # The set: disjoint pages; a query is a NAME summary, a document a DESCRIPTION; each query's one relevant
    # document is its own page's.
    info = json.loads((set_dir / "set.json").read_text())
    train_pages, test_pages = set(info["train_pages"]), set(info["test_pages"])
    assert train_pages and test_pages and not train_pages & test_pages
    beir = set_dir / "beir"
    corpus = {r["_id"]: r for r in map(json.loads, (beir / "corpus.jsonl").read_text().splitlines())}
    queries = {r["_id"]: r["text"] for r in map(json.loads, (beir / "queries.jsonl").read_text().splitlines())}
    pairs = [json.loads(line) for line in (set_dir / "train.jsonl").read_text().splitlines()]
    assert set(corpus) == train_pages | test_pages and len(queries) == len(test_pages) == 20
    qrels = [line.split("\t") for line in (beir / "qrels" / "test.tsv").read_text().splitlines()[1:]]
    assert {(q, d) for q, d, _ in qrels} == {(f"q:{p}", p) for p in test_pages}
    training_texts = {p["query"] for p in pairs} | {p["positive"] for p in pairs}
    for page in test_pages:
        query, document = queries[f"q:{page}"], corpus[page]
        assert query not in training_texts and f"{document['title']} {document['text']}" not in training_texts
        assert query != document["text"] and len(document["text"].split()) >= 20 > len(query.split())
    assert result["set"]["train_pairs"] == len(pairs) and result["settings"]["pairs"] % 32 == 0

    # The comparison: every model scored, scores in [0, 1], as many queries and documents as the set holds.
    compared = result["compare"]
    assert set(compared["models"]) == {"demo_finetuned", "random_finetuned", "minilm", "minilm_finetuned", "bm25s"}
    for row in compared["models"].values():
        assert set(row) == METRICS and all(0.0 <= v <= 1.0 for v in row.values()), row
    assert compared["scored_queries"] == 20 and compared["scored_documents"] == len(corpus)
    assert compared["pretraining_gain_ndcg_at_10"] == pytest.approx(
        compared["models"]["demo_finetuned"]["ndcg_at_10"] - compared["models"]["random_finetuned"]["ndcg_at_10"],
        abs=1e-3,
    )
    # BM25 on summaries against descriptions finds most pages' own descriptions among 100 of ~130 documents.
    assert compared["models"]["bm25s"]["recall_at_100"] > 0.5

    (a, b) = result["sweep"]  # --quick's one setting, for (a) and (b)
    assert {a["model"], b["model"]} == {"demo_finetuned", "random_finetuned"}
    assert a["learning_rate"] == b["learning_rate"] == 1e-3 and a["epochs"] == b["epochs"] == 1.0
    assert all(0.0 <= row[m] <= 1.0 for row in (a, b) for m in METRICS)

    if "speed" in parts:
        speed = result["speed"]
        assert speed["pairs"] == result["settings"]["pairs"] and speed["seq_len"] == 128
        assert all(s > 0 for who in ("bertjax", "sentence_transformers") for s in speed["seconds"][who])
        assert speed["speedup"] > 0
        # --quick caches the gradient on both sides (the GPU row's paths): bertjax's micro-batches, CachedMNRL.
        assert (speed["batch_size"], speed["micro_batches"]) == (32, 2)
        assert speed["devices"] == {"bertjax": "cpu", "sentence_transformers": "cpu"}, speed["devices"]
        log = (work / "speed_sentence_transformers_1.log").read_text().splitlines()
        peer = json.loads([line for line in log if line.startswith('{"')][-1])
        assert peer["loss"] == "CachedMultipleNegativesRankingLoss" and peer["steps"] == speed["steps"]
        for row in speed["quality"].values():
            assert set(row) == METRICS and all(0.0 <= v <= 1.0 for v in row.values()), row

    search = result["search"]
    assert search["documents"] == 5000 and search["dim"] == 384 and search["k"] == 100
    assert search["top100_agrees_with_numpy"] and search["scores_finite"]
    assert search["documents_per_s"] > 0 and search["device_search_bytes"] > 0
    assert search["host_rss_before_search_bytes"] > search["embeddings_bytes"]
