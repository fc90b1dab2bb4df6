"""Data mixtures in the pre-training job: the corpus stage prepares each source and one vocab; train rows carry
each source's share and epochs, eval rows each source's held-out MLM accuracy and loss with standard errors; a
ModernBERT run with packing, batch warmup and a masking-rate schedule stopped before, at and after a schedule
boundary ends bitwise equal to the uninterrupted run; a rewritten past is refused, a branch may change its
future; record-set sources with their own held-out sets; two processes draw the sources one process draws."""

import itertools
import json
import os
import runpy

import jax
import numpy as np
import pytest

import train_setup
from bertjax.data.corpus import sources as corpus_lib
from bertjax.data.pretraining import mixture
from bertjax.data.pretraining.pipeline import PipelineMismatch
from bertjax.jobs import main as train
from bertjax.jobs import stage
from bertjax.training import checkpoint as checkpoint_lib


def rows(workdir, kind: str) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["kind"] == kind]


@pytest.fixture(scope="module")
def reversed_text(tmp_path_factory) -> str:
    """A second 'language': the pydocs documents with every word spelled backwards (a raw-text corpus)."""
    path = tmp_path_factory.mktemp("reversed") / "reversed.txt"
    docs = itertools.islice(corpus_lib.open_source("builtin:pydocs").documents(), 150)
    path.write_text("".join(stage._document_text([" ".join(w[::-1] for w in s.split()) for s in d]) for d in docs))
    return str(path)


def mixture_config(reversed_text: str, **data):
    c = train_setup.small_config()
    c.model.vocab_size = 0
    c.data.update(
        mixture=f"py=builtin:pydocs:0.7,rev={reversed_text}:0.3",
        mixture_schedule="4:py=0.25,rev=0.75",
        corpus_vocab_size=train_setup.VOCAB,
        dupe_factor=2,
        num_shards=2,
        num_workers=1,
        heldout_every=10,
        mixture_block=1,  # 16-row batches: each row drawn on its own
        **data,
    )
    c.train.update(num_train_steps=8, log_every_steps=4)
    c.eval.update(every_steps=4, num_batches=4)
    return c


def test_a_mixture_of_corpora_trains_with_its_shares_epochs_and_per_source_evals(reversed_text, tmp_path):
    workdir = str(tmp_path / "work")
    train.train_and_evaluate(mixture_config(reversed_text), workdir)
    made = json.loads((tmp_path / "work" / "data" / "stage.json").read_text())
    assert set(made["sources"]) == {"py", "rev"} and made["vocab_size"] == train_setup.VOCAB
    for name in ("py", "rev"):  # each source split and prepared under data/NAME
        assert (tmp_path / "work" / "data" / name / "heldout" / "metadata.json").exists()
    vocab = (tmp_path / "work" / "data" / "vocab" / "vocab.txt").read_text().split()
    assert "noitcnuf" in vocab or "nruter" in vocab  # the reversed corpus is in the vocab's sample
    train_rows = rows(workdir, "train")
    assert [r["mix_py"] for r in train_rows] == pytest.approx([0.7, 0.25], abs=1 / 16)  # 16 rows a step
    assert all(r["epochs_rev"] > 0 and r["epochs_py"] > 0 for r in train_rows)
    assert all(0 <= r["input_wait_fraction"] <= 1 for r in train_rows)  # the loop's wait for batches, measured
    assert train_rows[1]["epochs_rev"] > 2 * train_rows[0]["epochs_rev"]  # drawn faster after step 4
    final = rows(workdir, "eval")[-1]
    for name in ("py", "rev"):
        assert 0 <= final[f"mlm_accuracy_{name}"] <= 1 and final[f"mlm_loss_{name}"] > 0
        p, n = final[f"mlm_accuracy_{name}"], final[f"mlm_targets_{name}"]
        assert final[f"mlm_accuracy_stderr_{name}"] == pytest.approx(np.sqrt(p * (1 - p) / n))
        assert 0 < final[f"mlm_loss_stderr_{name}"] < 1
    # The overall figures pool both sources' targets: their target-weighted mean.
    n = final["mlm_targets_py"] + final["mlm_targets_rev"]
    pooled = (
        final["mlm_accuracy_py"] * final["mlm_targets_py"] + final["mlm_accuracy_rev"] * final["mlm_targets_rev"]
    ) / n
    assert final["mlm_accuracy"] == pytest.approx(pooled) and final["mlm_targets"] == n


def test_the_vocab_sample_follows_the_mixture_weights(tmp_path):
    texts = {}
    for name, n in (("big", 90), ("small", 10)):
        (tmp_path / f"{name}.txt").write_text("".join(f"{name} sentence {i}\n" for i in range(n)))
        texts[name] = (str(tmp_path / f"{name}.txt"), "")
    sample = list(stage._weighted_sentences(texts, {"big": 0.5, "small": 0.5}, seed=0))
    counts = {name: sum(s.startswith(name) for s in sample) for name in texts}
    assert counts["small"] == 50 and abs(counts["big"] - 50) <= 12  # repeated ×5; kept with probability 5/9


def modern_config(reversed_text: str, steps: int, **data):
    """MLM-only ModernBERT, packed rows, batch warmup, a masking-rate schedule, a mixture boundary at step 4."""
    c = runpy.run_path(str(train_setup.ROOT / "configs" / "modernbert.py"))["get_config"]("size=tiny,runlocal")
    c.model.update(
        num_hidden_layers=2, hidden_size=64, intermediate_size=96, local_attention=16, max_position_embeddings=64
    )
    base = mixture_config(reversed_text)
    c.data.update(**{k: v for k, v in base.data.items() if k.startswith("mixture") or k in MIXTURE_DATA})
    c.data.update(
        max_seq_length=train_setup.SEQ,
        max_instances_per_row=2,
        max_predictions_per_seq=10,
        dynamic_masking=True,
        masked_lm_prob="0:0.3;4:0.15",
        shuffle_buffer=100,
        **data,
    )
    c.train.update(
        num_train_steps=steps,
        log_every_steps=1,
        global_batch_size=32,
        micro_batches=4,
        batch_warmup_tokens=32 * train_setup.SEQ * 3,
        batch_warmup_start=8,
    )
    c.optim.update(warmup_steps=2)
    c.checkpoint.update(every_steps=1000, keep=10, keep_every=0)
    c.eval.update(every_steps=1000, num_batches=2)
    return c


MIXTURE_DATA = ("corpus_vocab_size", "dupe_factor", "num_shards", "num_workers", "heldout_every")


def test_modernbert_packed_with_warmup_resumes_bitwise_across_the_boundary(reversed_text, tmp_path):
    straight, stopped = str(tmp_path / "straight"), str(tmp_path / "stopped")
    train.train_and_evaluate(modern_config(reversed_text, 8), straight)
    for steps in (3, 4, 5, 8):  # stopped before, at and after the boundary at step 4, then to the end
        train.train_and_evaluate(modern_config(reversed_text, steps), stopped)
    assert [r["step"] for r in rows(stopped, "train")] == list(range(1, 9))  # each run resumed where one stopped
    want, got = (jax.tree.leaves(checkpoint_lib.load_params(w, 8)[1]) for w in (straight, stopped))
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)
    losses = lambda w: {r["step"]: r["loss"] for r in rows(w, "train")}  # noqa: E731
    assert {s: v for s, v in losses(stopped).items() if s in (4, 8)} == {4: losses(straight)[4], 8: losses(straight)[8]}
    assert "batch_rows" in rows(straight, "train")[0]  # the batch was still growing: warmup was on

    # The past may not change: a schedule that moves the boundary to step 2 is refused, naming the step.
    with pytest.raises(PipelineMismatch, match="other weights at step 2 .* trained up to step 8"):
        train.train_and_evaluate(modern_config(reversed_text, 10, mixture_schedule="2:py=0.25,rev=0.75"), stopped)
    # A decay branch may carry its own future: from step 4 of the run, all reversed text from step 6 on, which
    # applies once the batches the stopped run had drawn ahead are used (mixture.HORIZON steps after the branch).
    branch = modern_config(reversed_text, 40, mixture_schedule="4:py=0.25,rev=0.75;6:py=0,rev=1")
    branch.train.branch_from = os.path.join(stopped, "4")
    train.train_and_evaluate(branch, str(tmp_path / "branch"))
    shares = {r["step"]: r["mix_rev"] for r in rows(tmp_path / "branch", "train")}
    switch = 4 + mixture.HORIZON
    assert shares[switch] < 1 and all(shares[s] == 1.0 for s in range(switch + 1, 41))


def test_record_set_sources_with_their_own_heldout_sets(pydocs_data, tmp_path):
    shards = lambda k: os.path.join(pydocs_data, "train", f"records-0000{k}-of-00004.tfrecord")  # noqa: E731
    c = train_setup.small_config(pydocs_data)
    heldout = c.data.eval_files
    c.data.update(
        train_files="",
        mixture=f"a={shards(0)}:0.5,b={shards(1)}:0.5",
        mixture_schedule="2:a=1,b=0",
        eval_files=f"a={heldout},b={heldout}",
    )
    c.train.update(num_train_steps=4, log_every_steps=2)
    c.eval.update(every_steps=1000, num_batches=2)
    workdir = str(tmp_path / "work")
    result = train.train_and_evaluate(c, workdir)
    assert [r["mix_a"] for r in rows(workdir, "train")] == [0.5, 1.0]
    assert result["mlm_accuracy_a"] == result["mlm_accuracy_b"]  # the same held-out set, one batch each
    assert result["mlm_targets_a"] + result["mlm_targets_b"] == result["mlm_targets"]
    assert "nsp_accuracy" in result  # MLM + NSP records

    c.data.eval_files = f"a={heldout},c={heldout}"
    with pytest.raises(ValueError, match="entry 'c=.*' names no source of config.data.mixture"):
        train.train_and_evaluate(c, str(tmp_path / "bad"))


def test_two_processes_draw_each_source_as_one_process_does(pydocs_data, tmp_path):
    from test_resume_and_hosts import finish, free_port, job_config, start, train_rows

    shards = lambda k: os.path.join(pydocs_data, "train", f"records-0000{k}-of-00004.tfrecord")  # noqa: E731
    c = job_config(pydocs_data, **{"train.num_train_steps": 4, "train.log_every_steps": 1})
    c.data.update(train_files="", mixture=f"a={shards(0)}:0.3,b={shards(1)}:0.7", mixture_schedule="2:a=0.8,b=0.2")
    c.data.mixture_block = 4  # two blocks a process
    c.mesh.shape = (-1, 1, 1)
    config_file = train_setup.write_config(c, tmp_path / "config.py")
    finish(start(config_file, tmp_path / "one", devices=4))
    address = f"127.0.0.1:{free_port()}"
    args = (f"--coordinator_address={address}", "--num_processes=2")
    procs = [start(config_file, tmp_path / "two", devices=2, args=args + (f"--process_id={i}",)) for i in range(2)]
    assert "2 process(es), 4 device(s)" in [finish(p) for p in procs][0]
    one, two = train_rows(tmp_path / "one"), train_rows(tmp_path / "two")
    assert [r["step"] for r in two] == [1, 2, 3, 4]
    shares = lambda rows: [(r["mix_a"], r["mix_b"], r["epochs_a"], r["epochs_b"]) for r in rows]  # noqa: E731
    assert shares(two) == shares(one)
    for row, weight in zip(one, (0.3, 0.3, 0.8, 0.8)):  # 16 rows a step: weight × 16 rows, within one block
        assert abs(row["mix_a"] - weight) * 16 < 4
