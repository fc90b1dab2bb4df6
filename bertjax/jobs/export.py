"""A training run (or a google-research/bert TF1 directory) as a Hugging Face directory.

Reads the params of the latest checkpoint (or `step`) on the host — whatever mesh they were saved
from — and writes config.json, model.safetensors and, when the run names one, the WordPiece vocab.txt
with its tokenizer_config.json. `transformers.BertForPreTraining.from_pretrained(HF)` loads the result;
a fine-tuned run (`bertjax.finetune`) becomes its task's class (BertForSequenceClassification, …) with
id2label/label2id. `python -m bertjax.export` runs `export` from its flags; the pre-training job runs it
at its end (`config.checkpoint.export_hf`), into workdir/hf.

Refused before anything is written, in one sentence: an output_dir holding files bertjax did not write
(`ownership`: left-over model files change what transformers loads; an earlier export's files are replaced);
an output_dir that is the workdir or inside it (it would overwrite the run's config.json, or mix files into
its checkpoints), workdir/hf excepted; and a vocab whose size differs from the model's vocab_size
(transformers would read every id after the difference as its neighbour's token).
"""

from __future__ import annotations

import logging
import os
import posixpath
from typing import Any, Optional

from bertjax import models as models_lib
from bertjax.data import remote_cache
from bertjax.runtime import files
from bertjax.runtime.files import is_remote
from bertjax.data.vocab import tokenization
from bertjax.finetuning import tasks as tasks_lib
from bertjax.interop import sentence_transformers_dir as st_dir
from bertjax.interop import pretrained
from bertjax.runtime import ownership
from bertjax.training import checkpoint as checkpoint_lib

log = logging.getLogger(__name__)


def check_output_dir(workdir: str, output_dir: str) -> None:
    """Refuses an output_dir that is the workdir or inside it, except workdir/hf: that is where the
    pre-training job exports itself (jobs/main.py), a directory of the export's own files that a re-export
    replaces with the same kind; anywhere else config.json (the run's own, for the workdir itself),
    checkpoints/ or the metrics could be overwritten or mixed with model files."""
    run, out = files.resolved(workdir), files.resolved(output_dir)
    if out == run or (out.startswith(run.rstrip("/") + "/") and out != run.rstrip("/") + "/hf"):
        where = "is" if out == run else "is inside"
        own_export = posixpath.join(workdir.rstrip("/"), "hf")
        raise ValueError(
            f"--output_dir={output_dir} {where} the run's --workdir={workdir}, where the Hugging Face "
            "files would overwrite the run's own config.json or mix with its checkpoints; pass a "
            f"directory outside it (or {own_export}, where the job exports)."
        )


def check_vocab_size(vocab_file: Optional[str], do_lower_case: bool, vocab_size: int, source: str) -> None:
    """Refuses a vocab of another size than the model's embeddings, before anything is written."""
    if vocab_file is None:
        return
    tokens = tokenization.load(vocab_file, do_lower_case).vocab_size
    if tokens != vocab_size:
        raise ValueError(
            f"the vocab {vocab_file} has {tokens} tokens but the model in {source} has vocab_size="
            f"{vocab_size}, so transformers would read shifted token ids; put back the vocab it was "
            f"trained with at {vocab_file} and export again."
        )


def export_tf1(path: str, output_dir: str, step: Optional[int] = None) -> str:
    """A google-research/bert directory → Hugging Face, with its vocab.txt and casing."""
    if step is not None:
        raise ValueError(
            f"--step={step} selects a bertjax checkpoint, but --workdir={path} is a TF1 directory; "
            "drop --step: the checkpoint its `checkpoint` file names (else bert_model.ckpt) is converted."
        )
    ownership.check_export_dir(output_dir)
    config, params = pretrained.load(path)
    vocab_file, do_lower_case = pretrained.vocab_of(path)
    check_vocab_size(vocab_file, do_lower_case, config.vocab_size, path)
    kept = ownership.clear_earlier_export(output_dir, keep=[vocab_file])
    with files.writing_dir(output_dir) as local_dir:
        _save(models_lib.of(config), config, {}, params, local_dir, vocab_file, do_lower_case)
    ownership.finish_export(output_dir, kept)
    log.info(
        "export: converted TF1 %s to %s (vocab: %s, do_lower_case=%s)",
        path,
        output_dir,
        vocab_file or "none",
        do_lower_case,
    )
    return output_dir


def export(workdir: str, output_dir: str, step: Optional[int] = None) -> str:
    if not is_remote(workdir) and not checkpoint_lib.is_workdir(workdir):  # else orbax says "train first"
        if pretrained.is_tf1_dir(workdir):
            return export_tf1(workdir, output_dir, step)
        fix = (
            "it is a Hugging Face directory already, which bertjax.from_pretrained and transformers load as it is"
            if pretrained.is_hf_dir(workdir)
            else "pass the --workdir of a training run or a google-research/bert "
            f"TF1 directory ({pretrained.TF1_LAYOUT})"
        )
        raise FileNotFoundError(
            f"--workdir={workdir} is not a bertjax workdir (it has no {checkpoint_lib.CHECKPOINTS}/ directory); {fix}."
        )
    check_output_dir(workdir, output_dir)
    own_export = files.resolved(output_dir) == files.resolved(os.path.join(workdir, "hf"))  # the job's own export
    ownership.check_export_dir(output_dir, own_export)
    fingerprint, params = checkpoint_lib.load_params(workdir, step)
    family = models_lib.of_fingerprint(fingerprint)
    config = family.config.from_fingerprint(fingerprint["model"])
    run_vocab, do_lower_case = pretrained.run_vocab(workdir)
    vocab_file = remote_cache.copy_of(run_vocab) if run_vocab else None  # a vocab in a bucket: its local copy
    check_vocab_size(vocab_file, do_lower_case, config.vocab_size, workdir)
    kept = ownership.clear_earlier_export(output_dir, own_export, keep=[run_vocab])
    with files.writing_dir(output_dir) as local_dir:
        _save(
            family,
            config,
            fingerprint,
            params,
            local_dir,
            vocab_file,
            do_lower_case,
            _run_data(workdir) if "task" in fingerprint else None,
        )
    ownership.finish_export(output_dir, kept)
    log.info(
        "export: wrote %s (%s; vocab: %s)", output_dir, fingerprint.get("task", "pre-training"), run_vocab or "none"
    )
    return output_dir


def _run_data(workdir: str) -> dict:
    """The run's config.data, as its config.json saved it."""
    return files.read_json(posixpath.join(workdir, "config.json")).get("data", {})


def _save(
    family: Any,
    config: Any,
    fingerprint: dict,
    params: Any,
    output_dir: str,
    vocab_file: Optional[str],
    do_lower_case: bool,
    embedder_settings: Optional[dict] = None,
) -> None:
    """The HF files of a bertjax run into a local output_dir; an embedder's (`embedder_settings`: its run's
    config.data: pooling, normalize, max_seq_length) as a sentence-transformers directory."""
    if "task" in fingerprint and tasks_lib.get(fingerprint["task"]).embeds:  # an embedder: sentence-transformers'
        family.hf.save_encoder(output_dir, config, params, vocab_file=vocab_file, do_lower_case=do_lower_case)
        data = embedder_settings
        st_dir.write(
            output_dir,
            pooling_mode=data["pooling"],
            normalize=data["normalize"],
            similarity="cosine",
            max_seq_length=data["max_seq_length"],
        )
    elif "task" in fingerprint:  # a fine-tuned run (bertjax.finetune): the transformers class of its task
        labels = fingerprint.get("labels")
        head = tasks_lib.get(fingerprint["task"]).head(1 if fingerprint.get("regression") else len(labels or [0, 0]))
        family.hf.save_finetuned(
            output_dir,
            config,
            params,
            head,
            labels,
            fingerprint.get("regression", False),
            vocab_file=vocab_file,
            do_lower_case=do_lower_case,
        )
    else:
        family.hf.save_pretrained(
            output_dir,
            family.model.from_architecture(config),
            params,
            vocab_file=vocab_file,
            do_lower_case=do_lower_case,
        )
