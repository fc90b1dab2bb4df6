"""ModernBERT as a job (configs/modernbert.py): pre-training from a corpus, its export that transformers loads
as ModernBertForMaskedLM with a tokenizer that tokenizes as bertjax did, fine-tuning from it (packed rows,
both poolings, token classification) with exports equal to transformers' task classes, and the bad inputs
where the two families meet."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import random
import re
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import train_setup

from bertjax.finetuning import tasks
from bertjax.training import checkpoint as checkpoint_lib
from bertjax.jobs import export as exporting, finetune as finetuning, predict as prediction
from bertjax.finetuning import heads
from bertjax.interop import pretrained
from bertjax.config.schema import JobConfig
from bertjax.data.vocab import tokenization
from bertjax.models.bert import model as bert_lib
from bertjax.models.modernbert import model as modernbert, config as modernbert_config
from bertjax.models.modernbert import heads as modernbert_heads
from test_finetune import config as finetune_config
from test_finetune import sentiment

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROOT = pathlib.Path(__file__).resolve().parent.parent
ARCH = train_setup.TINY_MODERNBERT


def modernbert_job_config(arg: str = "size=tiny,runlocal"):
    import runpy

    return runpy.run_path(str(ROOT / "configs" / "modernbert.py"))["get_config"](arg)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> pathlib.Path:
    """The interface command on builtin:pydocs, shrunk: 12 steps, a 1,000-token vocab, the job's own export."""
    path = tmp_path_factory.mktemp("modernbert") / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bertjax.main",
            "--config=configs/modernbert.py:size=tiny,runlocal",
            f"--workdir={path}",
            "--config.data.corpus=builtin:pydocs",
            "--config.data.dupe_factor=1",
            "--config.data.corpus_vocab_size=1000",
            "--config.train.num_train_steps=12",
            "--config.eval.every_steps=12",
            "--config.checkpoint.export_hf=true",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return path


def test_the_config_is_mlm_only_packed_and_sized_as_the_paper():
    for size, (layers, hidden, intermediate, heads_) in {
        "base": (22, 768, 1152, 12),
        "large": (28, 1024, 2624, 16),
    }.items():
        job = JobConfig.from_configdict(modernbert_job_config(f"size={size}"))
        arch = job.model.architecture
        assert isinstance(arch, modernbert_config.ModernBertConfig)
        assert (arch.num_hidden_layers, arch.hidden_size, arch.intermediate_size, arch.num_attention_heads) == (
            layers,
            hidden,
            intermediate,
            heads_,
        )
        assert arch.sliding_window == 64 and arch.layer_types[:4] == (
            "full_attention",
            "sliding_attention",
            "sliding_attention",
            "full_attention",
        )
        assert not job.data.next_sentence_prediction and job.data.packing and job.model.vocab_size == 0


def test_the_job_trains_and_its_export_is_a_transformers_modernbert(workdir):
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r.get("kind") == "train"]
    assert train and train[-1]["step"] == 12 and "nsp_accuracy" not in train[-1]
    assert train[-1]["loss"] < train[0]["loss"], (train[0]["loss"], train[-1]["loss"])
    # ModernBERT's rates: the train records masked at 30%, the held-out ones at 15% (eval_masked_lm_prob).
    rates = {
        name: json.loads((workdir / "data" / name / "metadata.json").read_text())["masked_lm_prob"]
        for name in ("train", "heldout")
    }
    assert rates == {"train": 0.3, "heldout": 0.15}, rates
    fingerprint, _ = checkpoint_lib.load_params(str(workdir))
    assert fingerprint["family"] == "modernbert" and fingerprint["scan_layers"] is False

    hf_dir = workdir / "hf"
    ref, info = transformers.AutoModelForMaskedLM.from_pretrained(
        str(hf_dir), output_loading_info=True, attn_implementation="eager"
    )
    assert type(ref).__name__ == "ModernBertForMaskedLM" and not any(info.values()), info
    vocab = tokenization.load(str(workdir / "data" / "vocab" / "vocab.txt"))
    assert (ref.config.pad_token_id, ref.config.cls_token_id, ref.config.sep_token_id) == (
        vocab.pad_id,
        vocab.cls_id,
        vocab.sep_id,
    )
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(hf_dir))
    texts = ["The interpreter reads a file, then runs its code.", "Ünïcode naïve 東京 lists"]
    enc = hf_tokenizer(texts, padding=True, return_tensors="np")
    assert set(enc) == {"input_ids", "attention_mask"}  # no token types: ModernBERT has none
    for text, row, mask in zip(texts, enc["input_ids"], enc["attention_mask"]):
        assert list(row[mask > 0]) == [vocab.cls_id, *vocab.encode(text), vocab.sep_id]

    model, params = pretrained.from_pretrained(str(workdir))  # the workdir itself, as from_pretrained takes it
    ours = model.apply(
        {"params": params},
        input_ids=jnp.asarray(enc["input_ids"]),
        input_mask=jnp.asarray(enc["attention_mask"]),
        deterministic=True,
    ).mlm_logits
    with torch.no_grad():
        theirs = ref.eval()(**{k: torch.tensor(v) for k, v in enc.items()}).logits.numpy()
    real = enc["attention_mask"] > 0
    np.testing.assert_allclose(np.asarray(ours)[real], theirs[real], atol=1e-4)


def test_phase_2_extends_the_context_as_the_paper_does():
    one = JobConfig.from_configdict(modernbert_job_config("size=base"))
    two = JobConfig.from_configdict(modernbert_job_config("size=base,phase=2,init_from=/runs/p1"))
    assert (one.data.max_seq_length, one.model.architecture.global_rope_theta, one.optim.schedule) == (
        1024,
        10_000.0,
        "constant",
    )
    assert (
        two.data.max_seq_length,
        two.model.architecture.global_rope_theta,
        two.model.architecture.local_rope_theta,
    ) == (8192, 160_000.0, 10_000.0)
    assert two.train.global_batch_size * 8192 == one.train.global_batch_size * 1024  # phase 1's tokens a batch
    assert (two.optim.schedule, two.optim.decay_shape, two.optim.decay_steps, two.optim.warmup_steps) == (
        "wsd",
        "1-sqrt",
        two.train.num_train_steps // 6,
        300,
    )
    assert two.data.max_predictions_per_seq == int(8192 * 0.3) + 1 and two.train.init_from == "/runs/p1"
    with pytest.raises(ValueError, match="phase 2 needs config.train.init_from|init_from"):
        JobConfig.from_configdict(modernbert_job_config("size=base,phase=2"))


def test_a_context_extension_run_starts_from_phase_1s_weights(workdir, tmp_path):
    run = tmp_path / "phase2"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bertjax.main",
            f"--config=configs/modernbert.py:size=tiny,phase=2,runlocal,init_from={workdir}",
            f"--workdir={run}",
            "--config.data.corpus=builtin:pydocs",
            "--config.data.dupe_factor=1",
            f"--config.data.vocab_file={workdir}/data/vocab/vocab.txt",
            "--config.train.num_train_steps=6",
            "--config.optim.warmup_steps=2",
            "--config.optim.decay_steps=2",
            "--config.eval.every_steps=6",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "init_from: global_rope_theta 10000.0 → 160000.0" in done.stderr
    saved = json.loads((run / "config.json").read_text())
    assert saved["data"]["max_seq_length"] == 512 and saved["model"]["global_rope_theta"] == 160_000.0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r.get("kind") == "train"]
    # wsd, 2 warmup and 2 decay steps of 6: the 6th update runs at lr(5) = peak · (1 − sqrt(1/2)), 1-sqrt's
    assert train[-1]["step"] == 6 and train[-1]["learning_rate"] == pytest.approx(5e-4 * (1 - 0.5**0.5), rel=1e-5)
    # Phase 1's weights, not a fresh init: the first losses are well below phase 1's own first ones.
    assert f"restore: weights from {workdir}" in done.stderr
    phase1 = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert train[0]["loss"] < next(r["loss"] for r in phase1 if r.get("kind") == "train") - 0.3
    _, params = checkpoint_lib.load_params(str(run))
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(params))
    # Only the RoPE bases and the longest position may change on init_from; the window may not.
    arch, _ = pretrained.load(str(workdir))
    other = modernbert.ModernBertForMaskedLM(dataclasses.replace(arch, local_attention=32, global_rope_theta=1e6))
    with pytest.raises(ValueError, match=r"holds a different model \(local_attention: 64 there, 32 here\)"):
        pretrained.init_params(str(workdir), other)


def test_summary_counts_what_transformers_counts_and_its_formula_what_xla_compiles():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bertjax.summary",
            "--config=configs/modernbert.py:size=tiny",
            "--config.data.max_seq_length=256",
            "--config.data.max_predictions_per_seq=40",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    total = int(re.search(r"total\s+([\d,]+)", out).group(1).replace(",", ""))
    arch = JobConfig.from_configdict(modernbert_job_config("size=tiny")).model.architecture
    ref = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(**modernbert_config.to_hf_dict(arch)))
    assert total == sum(p.numel() for p in ref.parameters())  # the tied decoder counted once, as torch does
    gflops = float(re.search(r"([\d.]+) model GFLOPs per training sequence of 256", out).group(1))
    assert gflops == pytest.approx(modernbert.flops_per_sequence(arch, 256, 40) / 1e9, abs=0.05)
    ratio = float(re.search(r"formula/XLA ([\d.]+)", out).group(1))
    # XLA's xla kernel computes every score (the formula counts a window's keys) and elementwise work.
    assert 0.8 < ratio <= 1.0, out


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_packed_rows_classify_each_example_as_padded_rows_do(pooling):
    """Fine-tuning packs short examples into rows: per example, the logits equal those of its own padded row."""
    config = modernbert_config.ModernBertConfig(**ARCH, classifier_pooling=pooling)
    padded = modernbert_heads.ModernBertForFinetuning(config, tasks.get("sequence_classification").head(3))
    packed = modernbert_heads.ModernBertForFinetuning(config, tasks.get("sequence_classification").head(3), packed=True)
    rng = np.random.default_rng(0)
    lengths = [5, 9, 4]
    examples = [rng.integers(4, 40, n) for n in lengths]
    ids, mask = np.zeros((3, 20), np.int32), np.zeros((3, 20), np.int32)
    for i, e in enumerate(examples):
        ids[i, : len(e)], mask[i, : len(e)] = e, 1
    params = nn.meta.unbox(padded.init(jax.random.PRNGKey(1), jnp.asarray(ids), jnp.asarray(mask))["params"])
    alone = np.asarray(padded.apply({"params": params}, input_ids=jnp.asarray(ids), input_mask=jnp.asarray(mask)))
    row, row_mask, positions, starts = (
        np.zeros((1, 20), np.int32),
        np.zeros((1, 20), np.int32),
        np.zeros((1, 20), np.int32),
        [],
    )
    at = 0
    for j, e in enumerate(examples):
        row[0, at : at + len(e)], row_mask[0, at : at + len(e)] = e, j + 1
        positions[0, at : at + len(e)] = np.arange(len(e))
        starts.append(at)
        at += len(e)
    together = packed.apply(
        {"params": params},
        input_ids=jnp.asarray(row),
        input_mask=jnp.asarray(row_mask),
        position_ids=jnp.asarray(positions),
        cls_positions=jnp.asarray([starts]),
    )
    np.testing.assert_allclose(np.asarray(together)[0], alone, atol=1e-5)


def test_finetuning_from_the_workdir_learns_exports_and_predicts(workdir, tmp_path):
    """Sequence classification (mean pooling, packed rows) from the pre-training workdir, exported as
    ModernBertForSequenceClassification equal to bertjax; predict reads the run back."""
    train = sentiment(tmp_path / "train.tsv", 160, seed=0)
    dev = sentiment(tmp_path / "dev.tsv", 40, seed=1)
    run = tmp_path / "sst"
    result = finetuning.finetune(
        finetune_config(
            str(workdir),
            **{
                "data.train_file": train,
                "data.eval_file": dev,
                "model.classifier_pooling": "mean",
                "train.num_epochs": 3.0,
                "data.max_seq_length": 32,
            },
        ),
        str(run),
    )
    assert result["accuracy"] > 0.8, result
    assert_export_matches(run, "ModernBertForSequenceClassification", vocab_size=1000)
    (tmp_path / "new.txt").write_text("the film was very good\nthe plot was bad\n")
    assert prediction.predict_file(str(run), str(tmp_path / "new.txt"), str(tmp_path / "out.jsonl")) == 2
    assert [json.loads(line)["prediction"] for line in (tmp_path / "out.jsonl").read_text().splitlines()] == [
        "pos",
        "neg",
    ]


def test_token_classification_from_a_transformers_directory(tmp_path):
    """A transformers ModernBERT directory (random weights, a small vocab) as init_from for token
    classification; the export is ModernBertForTokenClassification, equal to bertjax."""
    words = ["john", "mary", "lives", "in", "paris", "london", "."]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words + [f"w{i}" for i in range(40 - 12)]
    source = tmp_path / "hf"
    source.mkdir()
    (source / "vocab.txt").write_text("\n".join(vocab) + "\n")
    config = modernbert_config.ModernBertConfig(**ARCH)
    model = modernbert.ModernBertForMaskedLM(config)
    pretrained.save_pretrained(
        str(source), model, modernbert.init_params(model, jax.random.PRNGKey(0)), vocab_file=str(source / "vocab.txt")
    )
    rng = random.Random(0)
    sentences = [
        f"{rng.choice(['john', 'mary'])} B-PER\nlives O\nin O\n{rng.choice(['paris', 'london'])} B-LOC\n. O\n"
        for _ in range(40)
    ]
    (tmp_path / "train.conll").write_text("-DOCSTART- O\n\n" + "\n".join(sentences))
    run = tmp_path / "ner"
    result = finetuning.finetune(
        finetune_config(
            str(source),
            "token_classification",
            **{
                "data.train_file": str(tmp_path / "train.conll"),
                "data.eval_file": str(tmp_path / "train.conll"),
                "train.num_epochs": 6.0,
            },
        ),
        str(run),
    )
    assert result["f1"] > 0.5, result
    assert_export_matches(run, "ModernBertForTokenClassification", vocab_size=40)


def assert_export_matches(run: pathlib.Path, hf_class: str, vocab_size: int) -> None:
    out = run / "hf"
    exporting.export(str(run), str(out))
    ref, info = getattr(transformers, hf_class).from_pretrained(
        str(out), output_loading_info=True, attn_implementation="eager"
    )
    assert not any(info.values()), info
    fingerprint, params = checkpoint_lib.load_params(str(run))
    config = modernbert_config.from_fingerprint(fingerprint["model"])
    assert ref.config.classifier_pooling == config.classifier_pooling
    model = heads.model_for(config, fingerprint["task"], len(fingerprint["labels"]))
    ids = np.random.default_rng(0).integers(5, vocab_size, (2, 16))
    mask = np.ones_like(ids)
    mask[1, 11:] = 0
    ours = np.asarray(model.apply({"params": params}, input_ids=jnp.asarray(ids), input_mask=jnp.asarray(mask)))
    with torch.no_grad():
        theirs = ref.eval()(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    if ours.ndim == 3:
        ours, theirs = ours[mask > 0], theirs[mask > 0]
    np.testing.assert_allclose(ours, theirs, atol=1e-4)


# --- Where the families meet: one sentence each --------------------------------------------------------------


def test_a_checkpoint_of_the_other_family_as_init_from_is_one_sentence(tmp_path):
    bert_dir, modern_dir = tmp_path / "bert", tmp_path / "modern"
    (tmp_path / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(35)]) + "\n"
    )
    bert_model = bert_lib.BertForPreTraining(
        bert_lib.BertConfig(
            vocab_size=40, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64
        )
    )
    pretrained.save_pretrained(str(bert_dir), bert_model, bert_lib.init_params(bert_model, jax.random.PRNGKey(0)))
    modern_model = modernbert.ModernBertForMaskedLM(modernbert_config.ModernBertConfig(**ARCH))
    pretrained.save_pretrained(
        str(modern_dir), modern_model, modernbert.init_params(modern_model, jax.random.PRNGKey(0))
    )
    with pytest.raises(
        ValueError,
        match=r"init_from=.*bert holds a bert model, but config.model.family is "
        r"'modernbert'",
    ):
        pretrained.init_params(str(bert_dir), modern_model)
    with pytest.raises(
        ValueError,
        match=r"init_from=.*modern holds a modernbert model, but config.model.family "
        r"is 'bert'",
    ):
        pretrained.init_params(str(modern_dir), bert_model)


def test_extract_features_reads_a_modernbert_encoder_as_transformers_does(tmp_path):
    """The family contract's `encoder_states`: every layer's vectors of a ModernBERT directory equal
    transformers' ModernBertModel(output_hidden_states=True) at the same token ids."""
    import torch
    import transformers

    from bertjax.jobs import extract_features as features

    modern_dir = tmp_path / "modern"
    (tmp_path / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(35)]) + "\n"
    )
    model = modernbert.ModernBertForMaskedLM(modernbert_config.ModernBertConfig(**ARCH))
    pretrained.save_pretrained(str(modern_dir), model, modernbert.init_params(model, jax.random.PRNGKey(0)))
    (tmp_path / "in.txt").write_text("w3 w7 w1 w30 w2\n")
    out = tmp_path / "out.jsonl"
    features.run(
        str(modern_dir),
        str(tmp_path / "in.txt"),
        str(out),
        layers="-1,-2,-3",
        max_seq_length=16,
        vocab_file=str(tmp_path / "vocab.txt"),
    )
    line = json.loads(out.read_text())
    assert [t["token"] for t in line["features"]] == ["[CLS]", "w3", "w7", "w1", "w30", "w2", "[SEP]"]
    ours = np.array([[layer["values"] for layer in t["layers"]] for t in line["features"]])  # [tokens, 3, hidden]
    ids = torch.tensor([[2, 8, 12, 6, 35, 7, 3]])
    theirs = transformers.ModernBertModel.from_pretrained(str(modern_dir), attn_implementation="eager").eval()
    with torch.no_grad():
        hidden = theirs(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True).hidden_states
    assert len(hidden) == ARCH["num_hidden_layers"] + 1
    for j, index in enumerate((-1, -2, -3)):
        np.testing.assert_allclose(ours[:, j], hidden[index][0].numpy(), atol=1e-4)


def test_family_mismatches_in_the_config_are_one_sentence(tmp_path):
    c = modernbert_job_config()
    c.data.next_sentence_prediction = True
    with pytest.raises(
        ValueError, match="next_sentence_prediction=True, but config.model.family='modernbert' has no NSP head"
    ):
        JobConfig.from_configdict(c)
    c = modernbert_job_config()
    c.model.local_attention = 7
    with pytest.raises(ValueError, match="config.model: local_attention=7 is not even"):
        JobConfig.from_configdict(c).model.architecture  # noqa: B018
    c.model.update(local_attention=8, family="roberta")
    with pytest.raises(ValueError, match=r"config.model.family='roberta' is not one of \['bert', 'modernbert'\]"):
        JobConfig.from_configdict(c)
    with pytest.raises(ValueError, match="config.task='question_answering' has no modernbert head"):
        heads.model_for(modernbert_config.ModernBertConfig(**ARCH), "question_answering", 2)


# --- Ahead of time, for a TPU topology ----------------------------------------------------------------------


def test_the_window_saves_splash_work_in_the_compiled_tpu_step(tmp_path):
    """configs/modernbert.py compiled for v5e:2x2 with splash at a sequence 8 times the window: the report's
    share of attention scores computed (what the kernel's block mask keeps; XLA's FLOPs count does not see
    inside it) and the model FLOPs are below those of the same model with every layer global."""
    from bertjax.training import aot

    reports = {}
    for every in (1, 2):
        c = modernbert_job_config("size=tiny")
        c.model.update(
            num_hidden_layers=2,
            hidden_size=64,
            intermediate_size=96,
            local_attention=64,
            global_attn_every_n_layers=every,
            attention="splash",
            vocab_size=512,
        )
        c.data.update(max_seq_length=512, max_predictions_per_seq=16)
        c.train.global_batch_size = 4
        reports[every] = aot.compile_for_topology(JobConfig.from_configdict(c), str(tmp_path / str(every)), "v5e:2x2")
    everywhere, windowed = reports[1], reports[2]
    assert everywhere["fits"] and windowed["fits"] and windowed["attention"] == "splash"
    assert everywhere["splash_score_share_per_layer"] == [1.0, 1.0]
    # Layer 1 sees 32 tokens each side: of 4 × 4 blocks of 128, the diagonal and its neighbours (10).
    assert windowed["splash_score_share_per_layer"] == [1.0, 10 / 16]
    assert windowed["model_flops_per_step"] < everywhere["model_flops_per_step"]
    assert json.loads((tmp_path / "2" / aot.REPORT_FILE).read_text())["splash_score_share"] == pytest.approx(13 / 16)


def test_resuming_a_workdir_of_the_other_family_is_one_sentence(workdir):
    """A BERT config pointed at the ModernBERT run's workdir is refused before anything is restored."""
    from bertjax.config.schema import CheckpointConfig

    bert = bert_lib.BertConfig(
        vocab_size=1000, hidden_size=128, num_hidden_layers=4, num_attention_heads=2, intermediate_size=192
    )
    checkpoints = checkpoint_lib.Checkpointer(
        str(workdir), CheckpointConfig(), checkpoint_lib.model_fingerprint(bert, False), read_only=True
    )
    try:
        with pytest.raises(
            checkpoint_lib.IncompatibleCheckpoint,
            match=r"checkpoints/12 holds a modernbert model, but this run's config.model.family is "
            r"'bert'; use a new --workdir",
        ):
            checkpoints.check_compatible_with_newest()
    finally:
        checkpoints.close()


def test_a_run_saved_before_the_family_fields_reads_as_bert():
    """A fine-tuned workdir's config.json written before config.model.family existed still loads (predict,
    GLUE read it back): the settings added since take their defaults."""
    from bertjax.finetuning.config import FinetuneConfig

    saved = FinetuneConfig().to_dict()
    for name in (
        "family",
        "local_attention",
        "global_attn_every_n_layers",
        "global_rope_theta",
        "local_rope_theta",
        "classifier_pooling",
        "pad_token_id",
        "cls_token_id",
        "sep_token_id",
    ):
        del saved["model"][name]
    saved["model"]["hidden_size"] = 384
    saved["data"]["train_file"] = "train.tsv"
    job = FinetuneConfig.from_saved(saved)
    assert job.model.family == "bert" and job.model.hidden_size == 384
    saved["model"]["hidden_sise"] = 384
    with pytest.raises(
        ValueError, match="config.model.hidden_sise is not a setting; did you mean config.model.hidden_size"
    ):
        FinetuneConfig.from_saved(saved)


def test_a_modernbert_init_from_of_an_nsp_config_is_one_sentence_before_any_work(tmp_path):
    """A BERT config (next-sentence prediction on) continuing a ModernBERT checkpoint: refused before any data
    work, naming the setting (it once ended in an AttributeError on nsp_logits after the data stage)."""
    import transformers
    from bertjax.config.schema import JobConfig
    from bertjax.interop import pretrained

    transformers.ModernBertConfig(
        vocab_size=train_setup.VOCAB,
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=128,
        **dict(pad_token_id=0, bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3),
    ).save_pretrained(tmp_path / "mb")
    c = train_setup.small_config(**{"train.init_from": str(tmp_path / "mb")})
    job = JobConfig.from_configdict(c)
    assert job.data.next_sentence_prediction
    with pytest.raises(
        ValueError,
        match=r"holds a modernbert model, which has no next-sentence head, but config\.data\.next_sentence_prediction=True: set it to False",
    ):
        pretrained.adopt_init_from(job)
