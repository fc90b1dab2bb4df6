"""benchmarks/gpu_table.py (and train_step.py under it) on the CPU, tiny, with TensorFlow hidden: GPU nodes
often have only jax and torch, so the GPU benchmark must run without it; its packed rows must carry more
real tokens than padded ones; a case that cannot run (cudnn on a CPU) is a row saying why, not a crash."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_gpu_table_runs_without_tensorflow(tmp_path):
    hidden = tmp_path / "hidden"
    for name in ("tensorflow", "tensorflow_datasets", "apache_beam"):
        (hidden / name).mkdir(parents=True)
        (hidden / name / "__init__.py").write_text(f"raise ImportError('{name} is hidden by the test')\n")
    env = dict(os.environ, PYTHONPATH=str(hidden), BERTJAX_NO_TCMALLOC="1")
    probe = subprocess.run([sys.executable, "-c", "import tensorflow"], env=env, capture_output=True, text=True)
    assert "hidden by the test" in probe.stderr  # the hiding works, so the run below cannot use TensorFlow

    results = tmp_path / "gpu_table.jsonl"
    done = subprocess.run(
        [
            sys.executable,
            "benchmarks/gpu_table.py",
            "--sizes=tiny",
            "--seqs=128",
            "--attentions=xla,cudnn",
            "--batches=tiny:128:8",
            "--steps=1",
            "--warmup=1",
            "--extra=--no_peak",
            f"--results={results}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [r["attention"] for r in rows] == ["xla", "cudnn"]
    xla, cudnn = rows
    assert "error" not in xla, xla
    for name in ("jax", "jax_packed", "torch"):
        assert all(0 < loss < 20 for loss in xla[f"{name}_loss"]), (name, xla[f"{name}_loss"])
    # Padded rows: instances of 1/4..1 of the length, ~62% real tokens; packed rows are nearly full and
    # hold more than one instance each.
    padded = xla["jax_real_tokens_per_s"] / xla["jax_tokens_per_s"]
    packed = xla["jax_packed_real_tokens_per_s"] / xla["jax_packed_tokens_per_s"]
    assert padded < 0.75 and packed > 0.85, (padded, packed)
    instances_per_row = xla["jax_packed_seq_per_s"] * xla["jax_packed_step_s"] / xla["batch"]
    assert instances_per_row > 1.2
    assert xla["torch_real_tokens_per_s"] / xla["torch_tokens_per_s"] == pytest.approx(padded)  # same rows
    assert "needs an NVIDIA GPU" in cudnn["error"]
    table = done.stdout[done.stdout.index("| model |") :]
    assert "| tiny | 128 | 8 | float32 | xla |" in table and "| cudnn | failed: ValueError" in table


def test_gpu_table_runs_modernbert_at_1024_and_logs_each_case(tmp_path):
    results, log = tmp_path / "gpu_table.jsonl", tmp_path / "cases.log"
    done = subprocess.run(
        [
            sys.executable,
            "benchmarks/gpu_table.py",
            "--family=modernbert",
            "--sizes=tiny",
            "--seqs=1024",
            "--attentions=xla",
            "--frameworks=jax",
            "--batches=tiny:1024:2",
            "--steps=1",
            "--warmup=1",
            "--extra=--no_peak",
            f"--results={results}",
            f"--log={log}",
        ],
        cwd=ROOT,
        env=dict(os.environ, BERTJAX_NO_TCMALLOC="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [row] = [json.loads(line) for line in results.read_text().splitlines()]
    assert (row["family"], row["seq"], row["predictions"], row["vocab"]) == ("modernbert", 1024, 160, 50368), row
    assert 0 < row["jax_loss"][0] < 20 and 0 < row["torch_loss"][0] < 20, row  # beside ModernBertForMaskedLM
    assert "| modernbert-tiny | 1024 | 2 | float32 | xla |" in done.stdout
    assert "train_step.py --family=modernbert --sizes=tiny --seq=1024" in log.read_text()
    # BERT has 512 positions: a longer --seq is one sentence, not a shape error deep in the model.
    bert = subprocess.run(
        [sys.executable, "benchmarks/train_step.py", "--seq=1024"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bert.returncode != 0 and "BERT has 512 positions" in bert.stderr
