"""Shared set-up for the training tests: a small config, and records prepared once from builtin:pydocs."""

from __future__ import annotations

import os
import pathlib
import runpy

import ml_collections

ROOT = pathlib.Path(__file__).resolve().parent.parent
SEQ, PRED, VOCAB = 32, 5, 1000


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
    c.data.update(max_seq_length=SEQ, max_predictions_per_seq=PRED, shuffle_buffer=100)
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
