"""Training: the step on every mesh, accumulation, checkpoints across meshes, the whole job in-process,
init_from, and the errors a user can cause. CPU with 8 virtual devices (conftest)."""

import json
import logging
import os
import pathlib
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
import train_setup
from bertjax.training import checkpoint as checkpoint_lib
from bertjax.training import metrics as metrics_lib
from bertjax.models.bert import model as model_lib
from bertjax.training import optim as optim_lib
from bertjax.training import sharding as sharding_lib
from bertjax.training import loop
from bertjax.jobs import main as train
from bertjax.training import trainer as trainer_lib
from bertjax.config.schema import CheckpointConfig, JobConfig
from bertjax.data.pretraining import pipeline as pipeline_lib


def batches(data_dir: str, n: int, batch_size: int = 16) -> list[dict]:
    pipe = pipeline_lib.InputPipeline(
        pipeline_lib.PipelineConfig(
            files=os.path.join(data_dir, "train", "*.tfrecord"),
            batch_size=batch_size,
            max_seq_length=train_setup.SEQ,
            max_predictions_per_seq=train_setup.PRED,
            shuffle_buffer=100,
        )
    )
    return [next(pipe) for _ in range(n)]


def run_steps(config, mesh_shape, devices, data: list[dict]):
    """Losses of len(data) train steps on a mesh over `devices`, and the final state."""
    job = JobConfig.from_configdict(config).replace(mesh={"shape": tuple(mesh_shape)})
    trainer = trainer_lib.setup(job, devices)
    state, losses = trainer.init_state(), []
    for local in data:
        state, metrics = trainer.train_step(state, trainer.global_batch(local))
        losses.append(float(metrics["loss"][0]))
    return losses, state


@pytest.fixture(scope="module")
def data(pydocs_data):
    return batches(pydocs_data, 5)


def test_same_losses_on_every_mesh_and_params_really_sharded(pydocs_data, data):
    config = train_setup.small_config(pydocs_data)
    reference, _ = run_steps(config, (1, 1, 1), jax.devices()[:1], data)
    assert reference[-1] < reference[0]  # it trains
    for shape in ((8, 1, 1), (2, 2, 2), (1, 8, 1)):
        losses, state = run_steps(config, shape, jax.devices(), data)
        np.testing.assert_allclose(losses, reference, atol=1e-5, err_msg=f"mesh {shape}")
        if shape[1] * shape[2] > 1:  # fsdp or tensor: no large tensor may stay whole on every device
            replicated = [
                jax.tree_util.keystr(p)
                for p, x in jax.tree_util.tree_leaves_with_path(state.params)
                if x.size >= 4096 and x.sharding.is_fully_replicated
            ]
            assert not replicated, f"mesh {shape}: replicated {replicated}"
            mu = jax.tree.leaves(state.opt_state)  # Adam moments sharded like the params
            assert any(not x.sharding.is_fully_replicated for x in mu if x.size >= 4096)


def test_micro_batches_give_the_gradient_of_the_whole_batch(pydocs_data, data):
    config = train_setup.small_config(pydocs_data)
    config.model.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    whole, state1 = run_steps(config, (1, 1, 1), jax.devices()[:1], data[:3])
    config.train.micro_batches = 4
    split, state4 = run_steps(config, (2, 1, 1), jax.devices()[:2], data[:3])
    np.testing.assert_allclose(split, whole, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(state1.params), jax.tree.leaves(state4.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def test_checkpoint_saved_on_8_devices_restores_on_1(pydocs_data, data, tmp_path):
    config = train_setup.small_config(pydocs_data)
    _, state = run_steps(config, (1, 4, 2), jax.devices(), data[:2])
    job = JobConfig.from_configdict(config)
    model = model_lib.from_config(job.model)
    ckpt = checkpoint_lib.Checkpointer(
        str(tmp_path), CheckpointConfig(), checkpoint_lib.model_fingerprint(model.config, model.scan_layers)
    )
    ckpt.save(2, state, force=True)
    ckpt.close()
    # Onto a single device, through the resume path...
    tx = optim_lib.make_optimizer(job.optim, job.train.num_train_steps)
    mesh1 = sharding_lib.make_mesh((1, 1, 1), jax.devices()[:1])
    abstract, _, _ = trainer_lib.sharded_state(model, tx, 0, train_setup.SEQ, mesh1, job.mesh.logical_axis_rules)
    ckpt = checkpoint_lib.Checkpointer(
        str(tmp_path), CheckpointConfig(), checkpoint_lib.model_fingerprint(model.config, model.scan_layers)
    )
    restored = ckpt.restore(2, abstract)
    ckpt.close()
    assert int(restored.step) == 2
    for a, b in zip(
        jax.tree.leaves((state.params, state.opt_state)), jax.tree.leaves((restored.params, restored.opt_state))
    ):
        assert b.sharding.device_set == {jax.devices()[0]}
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # ...and as host arrays for export.
    _, host = checkpoint_lib.load_params(str(tmp_path))
    np.testing.assert_array_equal(
        host["bert"]["embeddings"]["word_embeddings"]["embedding"],
        np.asarray(state.params["bert"]["embeddings"]["word_embeddings"]["embedding"]),
    )


@pytest.fixture(scope="module")
def trained(pydocs_data, tmp_path_factory):
    """One whole job, in-process: eval with baselines, checkpoints, HF export, predictions."""
    workdir = tmp_path_factory.mktemp("trained")
    config = train_setup.small_config(
        pydocs_data,
        **{
            "train.num_train_steps": 6,
            "eval.every_steps": 3,
            "checkpoint.export_hf": True,
            "eval.show_predictions": 1,
            "train.profile_steps": 2,
        },
    )
    result = train.train_and_evaluate(config, str(workdir))
    return workdir, config, result


def test_job_writes_metrics_checkpoints_and_export(trained, capsys):
    workdir, config, result = trained
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r["kind"] == "train"]
    eval_rows = [r for r in rows if r["kind"] == "eval"]
    assert [r["step"] for r in train_rows] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in eval_rows] == [3, 6]
    for key in ("loss", "mlm_accuracy", "nsp_accuracy", "learning_rate", "grad_norm"):
        assert all(np.isfinite(r[key]) for r in train_rows), key
    assert all("seq_per_s" in r and "eta_s" in r for r in train_rows[1:])
    for r in eval_rows:
        assert 0 < r["mlm_accuracy_baseline"] < 1 and 0.4 < r["nsp_accuracy_baseline"] <= 1
        assert {"mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy"} <= set(r)
    assert result["mlm_accuracy"] == eval_rows[-1]["mlm_accuracy"]
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(workdir))
    assert sorted(int(s) for s in os.listdir(workdir / "checkpoints") if s.isdigit()) == [2, 4, 6]
    # The export loads in transformers and computes what bertjax computes from the workdir.
    import torch
    import transformers

    import bertjax

    hf_model = transformers.BertForPreTraining.from_pretrained(str(workdir / "hf")).eval()
    model, params = bertjax.from_pretrained(str(workdir))
    ids = np.random.default_rng(0).integers(5, train_setup.VOCAB, (2, 16))
    ours = model.apply({"params": params}, jnp.asarray(ids), jnp.zeros_like(ids), jnp.ones_like(ids))
    with torch.no_grad():
        theirs = hf_model(torch.tensor(ids))
    np.testing.assert_allclose(np.asarray(ours.mlm_logits), theirs.prediction_logits.numpy(), atol=1e-4)
    tok = transformers.BertTokenizer.from_pretrained(str(workdir / "hf"))
    assert tok.mask_token_id == 4 and tok.vocab_size == train_setup.VOCAB


def test_job_prints_top5_predictions(pydocs_data, tmp_path, capsys):
    config = train_setup.small_config(
        pydocs_data, **{"train.num_train_steps": 1, "optim.warmup_steps": 0, "eval.show_predictions": 2}
    )
    train.train_and_evaluate(config, str(tmp_path))
    out = capsys.readouterr().out
    assert "Top-5 predictions" in out and out.count("truth") >= 2 and "[1]" in out


def test_resuming_a_finished_workdir_and_refusing_a_foreign_one(trained, tmp_path):
    workdir, config, _ = trained
    other = train_setup.small_config(config.data.train_files.rsplit("/train/", 1)[0], **{"train.num_train_steps": 6})
    other.model.hidden_size = 32
    with pytest.raises(ValueError, match=r"different model config \(hidden_size: 64 there, 32 here"):
        train.train_and_evaluate(other, str(workdir))


def test_rerunning_a_finished_job_says_it_is_done_without_compiling(trained, tmp_path, monkeypatch, caplog):
    """The same command again on a finished workdir: no compile, no eval, no new metrics row; only a missing
    export is written again."""
    workdir, config, result = trained
    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy)
    shutil.rmtree(copy / "hf")
    metrics_before = (copy / "metrics.jsonl").read_bytes()
    monkeypatch.setattr(trainer_lib, "setup", lambda *a, **k: pytest.fail("a finished job compiled its step again"))
    with caplog.at_level(logging.INFO, logger="bertjax"):
        again = train.train_and_evaluate(config, str(copy))
    assert again["mlm_accuracy"] == result["mlm_accuracy"] and again["mlm_loss"] == result["mlm_loss"]
    assert (copy / "metrics.jsonl").read_bytes() == metrics_before
    assert f"done: {copy} already holds the final step 6" in caplog.text
    assert (copy / "hf" / "model.safetensors").read_bytes() == (workdir / "hf" / "model.safetensors").read_bytes()
    # A final eval that never got written (the job was killed during it): the rerun evaluates, and only that.
    rows = [json.loads(r) for r in metrics_before.decode().splitlines()]
    (copy / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows if (r["kind"], r["step"]) != ("eval", 6))
    )
    monkeypatch.undo()
    again = train.train_and_evaluate(config, str(copy))
    assert again["mlm_accuracy"] == result["mlm_accuracy"]
    evals = [json.loads(r) for r in (copy / "metrics.jsonl").read_text().splitlines() if '"eval"' in r]
    assert [r["step"] for r in evals] == [3, 6]


def test_init_from_a_workdir_or_hf_directory_without_optimizer_state(trained, pydocs_data, tmp_path):
    workdir, _, _ = trained
    # A copy whose checkpoint has no optimizer state: weights only is all init_from needs.
    source = tmp_path / "source"
    shutil.copytree(workdir / "checkpoints", source / "checkpoints")
    for step in os.listdir(source / "checkpoints"):
        shutil.rmtree(source / "checkpoints" / step / "opt_state", ignore_errors=True)
    first_loss = {}
    for name, init_from in (("fresh", ""), ("workdir", str(source)), ("hf", str(workdir / "hf"))):
        config = train_setup.small_config(
            pydocs_data, **{"train.num_train_steps": 1, "optim.warmup_steps": 0, "train.init_from": init_from}
        )
        config.eval.every_steps = 1000
        train.train_and_evaluate(config, str(tmp_path / name))
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        first_loss[name] = rows[0]["loss"]
    assert first_loss["workdir"] < first_loss["fresh"] - 0.05
    assert first_loss["hf"] == pytest.approx(first_loss["workdir"], abs=1e-4)


def test_checkpoints_and_export_do_not_depend_on_the_attention_kernel(trained, pydocs_data, tmp_path):
    """The xla job's workdir resumes under splash (interpreted here; attention dropout off, as fused kernels
    need) and trains on exactly as under xla: same losses, same checkpoint, same Hugging Face export."""
    from safetensors.numpy import load_file

    workdir, _, _ = trained
    runs = {}
    for attention in ("xla", "splash"):
        run = tmp_path / attention
        shutil.copytree(workdir, run, ignore=shutil.ignore_patterns("hf", "plugins", "events.out.*"))
        config = train_setup.small_config(
            pydocs_data,
            **{
                "train.num_train_steps": 8,
                "model.attention": attention,
                "model.attention_probs_dropout_prob": 0.0,
                "checkpoint.export_hf": True,
            },
        )
        train.train_and_evaluate(config, str(run))
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        losses = [r["loss"] for r in rows if r["kind"] == "train" and r["step"] > 6]
        runs[attention] = (
            losses,
            checkpoint_lib.load_params(str(run))[1],
            load_file(str(run / "hf" / "model.safetensors")),
        )
    (xla_losses, xla_params, xla_hf), (splash_losses, splash_params, splash_hf) = runs["xla"], runs["splash"]
    assert len(xla_losses) == 2
    np.testing.assert_allclose(splash_losses, xla_losses, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), splash_params, xla_params)
    assert splash_hf.keys() == xla_hf.keys()
    for name in xla_hf:
        np.testing.assert_allclose(splash_hf[name], xla_hf[name], atol=1e-5, err_msg=name)


def test_a_workdir_saved_before_model_families_existed_resumes_and_exports_as_bert(trained, pydocs_data, tmp_path):
    """Checkpoints written before bertjax.models (and ModernBERT) have no "family" in their config item, and the
    workdir's config.json none of the ModernBERT fields: such a workdir reads as BERT. It loads and resumes
    exactly as the same workdir with them does (checked once by hand against the code of 3cb6812~1 itself:
    its run, stopped by SIGTERM at step 32 and finished by this code, ended bitwise equal to its own 60 steps)."""
    from safetensors.numpy import load_file

    workdir, _, _ = trained
    runs = {}
    for name in ("as_saved", "before_families"):
        run = tmp_path / name
        shutil.copytree(workdir, run, ignore=shutil.ignore_patterns("hf", "plugins", "events.out.*"))
        if name == "before_families":
            for item in run.glob("checkpoints/*/config/metadata"):
                saved = json.loads(item.read_text())
                assert saved.pop("family") == "bert"
                item.write_text(json.dumps(saved))
            job = json.loads((run / "config.json").read_text())
            for field in (
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
                del job["model"][field]
            (run / "config.json").write_text(json.dumps(job))
        model, params = bertjax.from_pretrained(str(run))
        assert type(model).__name__ == "BertForPreTraining"
        config = train_setup.small_config(pydocs_data, **{"train.num_train_steps": 7, "checkpoint.export_hf": True})
        train.train_and_evaluate(config, str(run))
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows if r["kind"] == "train"][-1] == 7
        runs[name] = params, checkpoint_lib.load_params(str(run))[1], load_file(str(run / "hf" / "model.safetensors"))
    for before, after in zip(runs["before_families"], runs["as_saved"]):
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b), before, after)


def test_init_from_brings_its_architecture_and_vocab_before_any_data_work(trained, pydocs_data, tmp_path, caplog):
    """Continued pre-training on a corpus: init_from (a Hugging Face directory) gives the model its architecture
    and the corpus stage its vocab (none trained); a vocab_file of another size is refused before any data work."""
    workdir, _, _ = trained
    corpus = tmp_path / "domain.txt"
    corpus.write_text(pathlib.Path(pydocs_data, "heldout.txt").read_text())
    config = train_setup.small_config(
        None, **{"train.init_from": str(workdir / "hf"), "train.num_train_steps": 1, "optim.warmup_steps": 0}
    )
    config.model.update(hidden_size=32, intermediate_size=256, vocab_size=0)  # init_from's architecture wins
    config.data.update(corpus=str(corpus), dupe_factor=1, num_shards=1, num_workers=1, vocab_file="")
    config.eval.every_steps = 1000
    with caplog.at_level(logging.INFO, logger="bertjax"):
        train.train_and_evaluate(config, str(tmp_path / "continued"))
    assert "hidden_size 32 → 64" in caplog.text and "intermediate_size 256 → 128" in caplog.text
    assert "the corpus stage trains none" in caplog.text and not (tmp_path / "continued" / "data" / "vocab").exists()
    saved = json.loads((tmp_path / "continued" / "config.json").read_text())
    assert (saved["model"]["hidden_size"], saved["model"]["vocab_size"]) == (64, train_setup.VOCAB)
    assert saved["data"]["vocab_file"] == str(workdir / "hf" / "vocab.txt")
    other = tmp_path / "vocab.txt"
    other.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a"]) + "\n")
    config.data.vocab_file = str(other)
    with pytest.raises(
        ValueError,
        match=rf"vocab_file={other} has 7 tokens but config.train.init_from=.*hf holds a "
        r"model with vocab_size 1,000: leave config.data.vocab_file empty",
    ):
        train.train_and_evaluate(config, str(tmp_path / "refused"))
    assert not (tmp_path / "refused").exists()


def test_records_disagreeing_with_the_config_fail_before_compiling(pydocs_data, tmp_path):
    config = train_setup.small_config(pydocs_data, **{"data.max_seq_length": 64})
    with pytest.raises(ValueError, match="max_seq_length"):
        train.train_and_evaluate(config, str(tmp_path))
    assert not (tmp_path / "checkpoints").exists() or not os.listdir(tmp_path / "checkpoints")


def test_a_nan_loss_stops_with_a_clear_error_and_closes_everything(pydocs_data, tmp_path, monkeypatch):
    closed = []
    for cls in (metrics_lib.MetricWriter, checkpoint_lib.Checkpointer):

        def close(self, _original=cls.close, _name=cls.__name__):
            closed.append(_name)
            _original(self)

        monkeypatch.setattr(cls, "close", close)
    config = train_setup.small_config(pydocs_data, **{"train.num_train_steps": 3, "train.on_nonfinite": "stop"})
    config.optim.update(learning_rate=1e30, warmup_steps=0, max_grad_norm=0.0)
    with pytest.raises(FloatingPointError, match="lower config.optim.learning_rate"):
        train.train_and_evaluate(config, str(tmp_path))
    assert sorted(closed) == ["Checkpointer", "MetricWriter"]  # the one exit path, as at the end of a run
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]  # step 1's row was written and flushed; step 2 stopped the job


def test_library_modules_log_under_the_bertjax_logger(caplog):
    """Each module logs to `bertjax.<module>`, so the job's INFO level shows it (sharding's notice once went
    to the root logger, whose WARNING level hid it)."""
    arch = model_lib.config_for_size("tiny", vocab_size=1001, max_position_embeddings=16)
    model = model_lib.BertForPreTraining(arch, scan_layers=False)
    boxed = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), **model_lib.dummy_inputs(1, 8))["params"])
    with caplog.at_level("INFO", logger="bertjax"):
        sharding_lib.logical_shardings(boxed, sharding_lib.make_mesh((1, 1, 8)), JobConfig().mesh.logical_axis_rules)
    assert any(r.name == "bertjax.training.sharding" and "stay replicated" in r.getMessage() for r in caplog.records)


def test_profile_window_traces_steps_after_warm_up(trained):
    workdir, _, _ = trained
    traces = list((workdir / loop.PROFILE_DIR).rglob("*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0


def test_bad_mesh_and_batch_settings_are_one_sentence(pydocs_data, tmp_path):
    with pytest.raises(ValueError, match=r"mesh.shape=\(3, -1, 1\): 8 devices do not divide by 3"):
        sharding_lib.resolve_mesh_shape((3, -1, 1), 8)
    config = train_setup.small_config(pydocs_data, **{"train.micro_batches": 3})
    with pytest.raises(ValueError, match="global_batch_size=16 must divide by config.train.micro_batches=3"):
        train.train_and_evaluate(config, str(tmp_path))
    config = train_setup.small_config(pydocs_data, **{"train.phase": 2})
    with pytest.raises(ValueError, match="phase=2 continues phase 1: set config.train.init_from"):
        train.train_and_evaluate(config, str(tmp_path))


def test_dynamic_masking_reaches_the_job(pydocs_data, tmp_path):
    losses = {}
    for dynamic in (False, True):
        config = train_setup.small_config(pydocs_data, **{"train.num_train_steps": 2, "data.dynamic_masking": dynamic})
        config.eval.every_steps = 1000
        train.train_and_evaluate(config, str(tmp_path / str(dynamic)))
        rows = [json.loads(line) for line in (tmp_path / str(dynamic) / "metrics.jsonl").read_text().splitlines()]
        losses[dynamic] = [r["loss"] for r in rows if r["kind"] == "train"]
    assert losses[True] != losses[False]  # same records and seed: only the re-drawn masks differ
    config = train_setup.small_config(pydocs_data, **{"data.dynamic_masking": True, "data.vocab_file": ""})
    with pytest.raises(ValueError, match="dynamic_masking=True re-masks .* set config.data.vocab_file"):
        train.train_and_evaluate(config, str(tmp_path / "novocab"))


def test_compile_only_stops_before_training(pydocs_data, tmp_path, caplog):
    config = train_setup.small_config(pydocs_data)
    with caplog.at_level("INFO", logger="bertjax"):
        assert train.train_and_evaluate(config, str(tmp_path), compile_only=True) == {}
    assert re.search("train step (compiled|loaded from the compilation cache) in", caplog.text), caplog.text
    assert "per-device memory" in caplog.text
    assert not (tmp_path / "metrics.jsonl").exists() or not (tmp_path / "metrics.jsonl").read_text()
    assert not (tmp_path / "checkpoints").exists() or not [
        s for s in os.listdir(tmp_path / "checkpoints") if s.isdigit()
    ]


def test_checkpoints_keep_the_last_n_and_every_kth(pydocs_data, tmp_path):
    config = train_setup.small_config(pydocs_data, **{"train.num_train_steps": 7})
    config.checkpoint.update(every_steps=1, keep=2, keep_every=3)
    train.train_and_evaluate(config, str(tmp_path))
    assert sorted(int(s) for s in os.listdir(tmp_path / "checkpoints") if s.isdigit()) == [3, 6, 7]
