"""A training run (or a google-research/bert TF1 directory) as a Hugging Face directory.

Reads the params of the latest checkpoint (or `step`) on the host — whatever mesh they were saved
from — and writes config.json, model.safetensors and, when the run names one, the WordPiece vocab.txt
with its tokenizer_config.json. `transformers.BertForPreTraining.from_pretrained(HF)` loads the result;
a fine-tuned run (`bertjax.finetune`) becomes its task's class (BertForSequenceClassification, …) with
id2label/label2id. `python -m bertjax.export` runs `export` from its flags; the pre-training job runs it
at its end (`config.checkpoint.export_hf`).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Optional

from bertjax import checkpoint as checkpoint_lib
from bertjax import hf
from bertjax import model as model_lib
from bertjax import tf1

log = logging.getLogger(__name__)


def run_vocab(workdir: str) -> tuple[Optional[str], bool]:
    """(vocab file, do_lower_case) the run in workdir was trained with, from its saved config.json."""
    path = os.path.join(workdir, "config.json")
    if not os.path.isfile(path):
        return None, True
    with open(path) as f:
        data = json.load(f).get("data", {})
    vocab = data.get("vocab_file") or None
    if vocab and not (os.path.isfile(vocab) and vocab.endswith(".txt")):
        vocab = None  # only a WordPiece vocab.txt belongs in a BertTokenizer directory
    return vocab, bool(data.get("do_lower_case", True))


def export_tf1(path: str, output_dir: str, step: Optional[int] = None) -> str:
    """A google-research/bert directory → Hugging Face, with its vocab.txt and casing."""
    if step is not None:
        raise ValueError(f"--step={step} selects a bertjax checkpoint, but --workdir={path} is a TF1 directory; "
                         "drop --step: the checkpoint its `checkpoint` file names (else bert_model.ckpt) is converted.")
    config, params = tf1.load(path)
    vocab_file, do_lower_case = tf1.vocab(path)
    hf.save_pretrained(output_dir, model_lib.BertForPreTraining(config), params, vocab_file=vocab_file,
                       do_lower_case=do_lower_case)
    log.info("export: converted TF1 %s to %s (vocab: %s, do_lower_case=%s)", path, output_dir,
             vocab_file or "none", do_lower_case)
    return output_dir


def export(workdir: str, output_dir: str, step: Optional[int] = None) -> str:
    if "://" not in workdir and not checkpoint_lib.is_workdir(workdir):  # else orbax says "train first"
        if tf1.is_tf1_dir(workdir):
            return export_tf1(workdir, output_dir, step)
        fix = ("it is a Hugging Face directory already, which bertjax.from_pretrained and transformers load as it is"
               if hf.has_config(workdir) else "pass the --workdir of a training run or a google-research/bert TF1 "
               f"directory ({tf1.LAYOUT})")
        raise FileNotFoundError(f"--workdir={workdir} is not a bertjax workdir (it has no "
                                f"{checkpoint_lib.CHECKPOINTS}/ directory); {fix}.")
    fingerprint, params = checkpoint_lib.load_params(workdir, step)
    config = model_lib.BertConfig(**fingerprint["model"])
    vocab_file, do_lower_case = run_vocab(workdir)
    if "task" in fingerprint:  # a fine-tuned run (bertjax.finetune): the transformers class of its task
        hf.save_finetuned(output_dir, config, params, fingerprint["task"], fingerprint.get("labels"),
                          fingerprint.get("regression", False), vocab_file=vocab_file, do_lower_case=do_lower_case)
    else:
        hf.save_pretrained(output_dir, model_lib.BertForPreTraining(config), params, vocab_file=vocab_file,
                           do_lower_case=do_lower_case)
    log.info("export: wrote %s (%s; vocab: %s)", output_dir, fingerprint.get("task", "pre-training"),
             vocab_file or "none")
    return output_dir
