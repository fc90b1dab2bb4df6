"""`make demo`'s job and the export CLI, run as a user runs them: `python -m bertjax.main` in a subprocess
on configs/demo.py (shortened), then `python -m bertjax.export` on its workdir."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

import train_setup


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    proc = subprocess.run([sys.executable, "-m", *args], cwd=train_setup.ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    if check:
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return proc


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("demo") / "work"
    proc = run("bertjax.main", "--config=configs/demo.py:quick", f"--workdir={workdir}",
               "--config.train.num_train_steps=30", "--config.train.log_every_steps=10",
               "--config.eval.every_steps=20", "--config.checkpoint.every_steps=20", "--config.data.dupe_factor=1")
    return workdir, proc


def test_demo_job_prepares_trains_evaluates_exports_and_predicts(demo):
    workdir, proc = demo
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == [10, 20, 30]
    evals = [r for r in rows if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [20, 30]
    for r in evals:  # the baselines the demo's targets are measured against sit beside the accuracies
        assert 0 < r["mlm_accuracy_baseline"] < 0.5 and 0.5 <= r["nsp_accuracy_baseline"] < 1
        assert 0 <= r["mlm_accuracy"] <= 1 and 0 <= r["nsp_accuracy"] <= 1
    stage = json.loads((workdir / "data" / "stage.json").read_text())
    assert stage["vocab_size"] == 4096 and stage["heldout_documents"] > 0 and stage["train_documents"] > 400
    assert "Top-5 predictions" in proc.stdout and proc.stdout.count("truth") >= 4
    assert sorted(os.listdir(workdir / "hf")) == ["config.json", "model.safetensors", "tokenizer_config.json",
                                                  "vocab.txt"]
    import transformers

    model = transformers.BertForPreTraining.from_pretrained(str(workdir / "hf"))
    assert model.config.vocab_size == 4096 and model.config.max_position_embeddings == 64
    assert transformers.BertTokenizer.from_pretrained(str(workdir / "hf")).mask_token == "[MASK]"


def test_export_cli_writes_the_checkpoint_and_names_a_bad_workdir(demo, tmp_path):
    workdir, _ = demo
    proc = run("bertjax.export", f"--workdir={workdir}", f"--output_dir={tmp_path / 'at20'}", "--step=20")
    assert "exported" in proc.stdout
    at20, final = load_file(tmp_path / "at20" / "model.safetensors"), load_file(workdir / "hf" / "model.safetensors")
    assert at20.keys() == final.keys()
    assert any(not np.array_equal(at20[k], final[k]) for k in final)  # step 20, not the final step 30
    run("bertjax.export", f"--workdir={workdir}", f"--output_dir={tmp_path / 'at30'}", "--step=30")
    latest = load_file(tmp_path / "at30" / "model.safetensors")
    assert all(np.array_equal(latest[k], final[k]) for k in final)
    bad = run("bertjax.export", f"--workdir={tmp_path / 'nothing'}", f"--output_dir={tmp_path / 'x'}", check=False)
    assert bad.returncode != 0 and "has no checkpoint" in bad.stderr and "Traceback" not in bad.stderr
