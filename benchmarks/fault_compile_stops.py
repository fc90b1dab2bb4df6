"""benchmarks/faults.py's compile-stop trials: a SIGTERM while fine-tuning (or the GLUE suite) compiles must end
the process cleanly (exit 0, "stopped ... before training"), never in a crash, and the same command must then
train to the end."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sentiment_task(directory: str) -> str:
    """SST-2's layout (sentence, label), a task a tiny model fits in a few steps; the directory holding SST-2/."""
    rng = random.Random(0)
    rows = [
        f"the film was {rng.choice(['very ', ''])}{word}\t{int(word in ('good', 'great'))}"
        for word in ["good", "bad", "great", "awful"] * 8
    ]
    for split in ("train", "dev"):
        os.makedirs(os.path.join(directory, "SST-2"), exist_ok=True)
        with open(os.path.join(directory, "SST-2", f"{split}.tsv"), "w") as f:
            f.write("sentence\tlabel\n" + "\n".join(rows) + "\n")
    return directory


def compile_stop_trial(fault: str, rng: random.Random, init_from: str, directory: str) -> dict:
    """SIGTERM at a random moment between the model's construction and the first step; then the same command."""
    data = sentiment_task(os.path.join(directory, "glue"))
    workdir = os.path.join(directory, "work")
    settings = [
        "--config.train.global_batch_size=8",
        "--config.data.max_seq_length=16",
        "--config.model.scan_layers=false",
    ]
    if fault == "finetune_compile":
        command = [
            "-m",
            "bertjax.finetune",
            "--config=configs/finetune.py:size=tiny",
            f"--workdir={workdir}",
            f"--config.train.init_from={init_from}",
            f"--config.data.train_file={data}/SST-2/train.tsv",
            f"--config.data.eval_file={data}/SST-2/dev.tsv",
            "--config.train.num_train_steps=4",
            *settings,
        ]
    else:
        command = [
            "-m",
            "bertjax.glue",
            "--config=configs/glue.py:size=tiny",
            f"--workdir={workdir}",
            f"--config.init_from={init_from}",
            f"--config.data_dir={data}",
            "--config.tasks=sst2",
            "--config.submission=false",
            "--config.sweep.learning_rate=1e-3",
            "--config.sweep.seeds=0",
            "--config.train.num_epochs=1",
            *settings,
        ]
    # Without the persistent cache: a cached step compiles in a blink, and the signal would land in training.
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        BERTJAX_NO_TCMALLOC="1",
        TF_CPP_MIN_LOG_LEVEL="2",
        JAX_ENABLE_COMPILATION_CACHE="false",
    )
    process = subprocess.Popen(
        [sys.executable, *command], cwd=ROOT, env=env, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    lines, delay = [], rng.uniform(0.0, 1.5)
    for line in process.stderr:  # the model is built: the train step compiles next
        lines.append(line)
        if "attention: auto chose" in line:
            time.sleep(delay)
            process.send_signal(signal.SIGTERM)
            break
    lines += process.stderr.readlines()
    out = {"fault": fault, "signal_after_s": round(delay, 2), "first_exit": process.wait()}
    said = "".join(lines)
    # A step's log line ("train step 1/4 | ..."), not "compile: train step compiled", which a stop may follow.
    out["stopped_before_training"] = "before training" in said and not re.search(r"train step \d+/\d+", said)
    out["crash"] = out["first_exit"] != 0 and (
        out["first_exit"] < 0 or out["first_exit"] == 139 or "Fatal Python error" in said
    )
    rerun = subprocess.run([sys.executable, *command], cwd=ROOT, env=env, capture_output=True, text=True)
    out["rerun_exit"] = rerun.returncode
    out["rerun_finished"] = rerun.returncode == 0 and os.path.exists(
        os.path.join(workdir, "glue.json" if fault == "glue_compile" else "metrics.jsonl")
    )
    if out["first_exit"] != 0 or not out["rerun_finished"]:
        out["log_tail"] = (said + rerun.stderr)[-1500:]
    return out
