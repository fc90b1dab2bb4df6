"""Shared set-up for the training tests: a small config, and records prepared once from builtin:pydocs."""

from __future__ import annotations

import os
import pathlib
import runpy
import subprocess
import sys

import ml_collections

ROOT = pathlib.Path(__file__).resolve().parent.parent
SEQ, PRED, VOCAB = 32, 5, 1000

# The suite's programs are tiny, so compiling them is most of their cost. Each flag measured on the 2-core AMD
# EPYC: LLVM's level 0, test_model.py 101 s → 82 s, the fault and job tests 236 → 213 s; XLA:CPU's older loop
# emitters instead of its MLIR fusion emitters, test_model.py + test_attention.py 99 → 65 s from an empty compile
# cache and a tiny job 9.0 → 7.4 s (12.3 → 10.0 on 8 devices). Not for users' jobs: at the default level the
# older emitters compile BERT-Base no faster and step it 4% slower (benchmarks/train_step.py --xla_flags).
FAST_COMPILE_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")


def fast_compile_flags() -> str:
    """FAST_COMPILE_FLAGS this jaxlib knows: XLA aborts on a flag it does not, and a jax release may drop one,
    so they are tried in a subprocess (0.7 s) before the suite sets them (conftest): all at once, and one by one
    only if that fails."""

    def known(flags: str) -> bool:
        env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
        return (
            subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env, capture_output=True).returncode
            == 0
        )

    together = " ".join(FAST_COMPILE_FLAGS)
    return together if known(together) else " ".join(f for f in FAST_COMPILE_FLAGS if known(f))


def job_xla_flags(devices: int, *, optimized: bool = False) -> str:
    """The suite's XLA flags (conftest) for a job process a test starts, on `devices` virtual CPU devices.
    `optimized`: without FAST_COMPILE_FLAGS, for a job whose steps cost more than its compiles, where XLA's
    optimised code repays its longer compile (MiniLM's 108 fine-tuning steps: 88 s of CPU against 121)."""
    flags = os.environ.get("XLA_FLAGS", "").split()
    if optimized:
        flags = [flag for flag in flags if flag not in FAST_COMPILE_FLAGS]
    return " ".join([*flags, f"--xla_force_host_platform_device_count={devices}"])


def small_config(workdir_data: str | None = None, **overrides) -> ml_collections.ConfigDict:
    """configs/default.py shrunk: 1 layer, hidden 64, 8 heads (so every mesh axis of 8 divides it)."""
    c = runpy.run_path(str(ROOT / "configs" / "default.py"))["get_config"]("size=tiny")
    c.model.update(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=8,
        intermediate_size=128,
        max_position_embeddings=64,
        scan_layers=False,
    )
    # Fixed threads, so no autotuning thread: the gc of a finished job's iterator waited 12-76 s for it in
    # teardowns under pytest -n 3 on 2 cores (pipeline.py says why).
    c.data.update(max_seq_length=SEQ, max_predictions_per_seq=PRED, shuffle_buffer=100, pipeline_threads=2)
    c.train.update(global_batch_size=16, num_train_steps=5, log_every_steps=1)
    c.optim.update(learning_rate=1e-3, warmup_steps=2)
    c.checkpoint.update(every_steps=2, keep=10, keep_every=0)
    c.eval.update(every_steps=1000, num_batches=2)
    if workdir_data:
        c.data.update(
            train_files=os.path.join(workdir_data, "train", "*.tfrecord"),
            eval_files=os.path.join(workdir_data, "heldout", "*.tfrecord"),
            vocab_file=os.path.join(workdir_data, "vocab", "vocab.txt"),
        )
    for key, value in overrides.items():
        section, name = key.split(".")
        c[section][name] = value
    return c


def write_config(c: ml_collections.ConfigDict, path: pathlib.Path) -> str:
    """A config file for `python -m bertjax.main --config=PATH` that returns exactly c."""
    data = path.with_suffix(".json")
    data.write_text(c.to_json())
    path.write_text(
        "import json\nimport ml_collections\n\n\ndef get_config():\n"
        f"    return ml_collections.ConfigDict(json.loads(open({str(data)!r}).read()))\n"
    )
    return str(path)


def folder_bytes(path) -> int:
    """Bytes in the files under `path` now; a file deleted while walked (a stream window evicting) counts 0."""
    total = 0
    for root, _, names in os.walk(path):
        for name in names:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


# A ModernBERT that compiles in seconds, its special ids inside a small vocab (the family's defaults point at ids
# 50,281-50,283): config.model fields as much as the architecture's.
TINY_MODERNBERT = dict(
    vocab_size=40,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=4,
    local_attention=6,
    max_position_embeddings=64,
    pad_token_id=0,
    cls_token_id=2,
    bos_token_id=2,
    sep_token_id=3,
    eos_token_id=3,
)


def tiny_modernbert(**fields):
    """TINY_MODERNBERT's architecture; `fields` override any of it."""
    from bertjax.models.modernbert.config import ModernBertConfig

    return ModernBertConfig(**{**TINY_MODERNBERT, **fields})


def vocab_words(vocab_file: pathlib.Path) -> list[str]:
    """The vocab's whole lower-case ASCII words of three letters or more: what the corpus tests make text of."""
    return [
        w
        for w in vocab_file.read_text(encoding="utf-8").splitlines()
        if w.isascii() and w.isalpha() and w.islower() and len(w) >= 3
    ]
