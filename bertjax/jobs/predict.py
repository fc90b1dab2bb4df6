"""Predictions: what a fine-tuned workdir says about new inputs (`predict_file`, which `python -m
bertjax.predict` runs), and the top-k guesses for masked words (`show_predictions`, the demo's end).

`predict_file` writes one JSON object per input: sequence_classification a label and its probability (or
a score), token_classification a tag per word and the entities they make, question_answering an answer
cut from the context. Inputs: what the task trains on, without labels (TSV/CSV/JSONL with `text` or
`text_a`, `text_b`; CoNLL or whitespace-tokenised lines; SQuAD JSON), or a .txt file of one text per line
(`a ||| b` for a pair, as google-research/bert's extract_features.py).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Optional

import jax
import numpy as np

from bertjax import models as models_lib
from bertjax.runtime import files
from bertjax.data.vocab import tokenization
from bertjax.finetuning import tasks

log = logging.getLogger(__name__)


def top_k_predictions(
    model: Any, params: Any, batch: dict[str, np.ndarray], k: int = 5
) -> tuple[np.ndarray, np.ndarray]:
    """(ids, probabilities) of the k most likely tokens at every masked position: [batch, predictions, k]."""
    family = models_lib.of(model.config)
    out = jax.jit(
        lambda p, b: model.apply(
            {"params": p},
            input_ids=b["input_ids"],
            segment_ids=b["segment_ids"],
            input_mask=b["input_mask"],
            masked_lm_positions=b["masked_lm_positions"],
            **family.model.pretraining_inputs(b),
        )
    )(params, batch)
    probs = jax.nn.softmax(out.mlm_logits, axis=-1)
    top_probs, top_ids = jax.lax.top_k(probs, k)
    return np.asarray(top_ids), np.asarray(top_probs)


def _words(tokenizer: tokenization.Tokenizer, ids: list[int]) -> str:
    """Pieces joined back into words, for display."""
    text = ""
    for token in tokenizer.convert_ids_to_tokens(ids):
        if tokenizer.is_continuation_token(token):
            text += token[2:] if token.startswith("##") else token.lstrip("▁")
        else:
            text += " " + token.lstrip("▁")
    return text.strip()


def format_predictions(
    tokenizer: tokenization.Tokenizer,
    batch: dict[str, np.ndarray],
    top_ids: np.ndarray,
    top_probs: np.ndarray,
    rows: int = 3,
) -> str:
    """Each row: the input with its masks, then for every masked position the truth and the top-k guesses."""
    lines = []
    for r in range(min(rows, len(batch["input_ids"]))):
        length = int((batch["input_mask"][r] > 0).sum())
        lines.append(f"[{r}] {_words(tokenizer, list(batch['input_ids'][r][:length]))}")
        for j in np.flatnonzero(batch["masked_lm_weights"][r] > 0):
            truth = tokenizer.convert_ids_to_tokens([batch["masked_lm_ids"][r][j]])[0]
            guesses = ", ".join(
                f"{tok} {p:.2f}" for tok, p in zip(tokenizer.convert_ids_to_tokens(top_ids[r, j]), top_probs[r, j])
            )
            mark = "✓" if top_ids[r, j, 0] == batch["masked_lm_ids"][r][j] else " "
            lines.append(
                f"    {mark} position {int(batch['masked_lm_positions'][r][j]):3d}  truth {truth:<14} top-5: {guesses}"
            )
    return "\n".join(lines)


def show_predictions(
    model: Any, params: Any, batch: dict[str, np.ndarray], vocab_file: str, do_lower_case: bool, rows: int
) -> None:
    """Prints the top-5 guesses for the masked words of the first `rows` sequences of a batch."""
    tokenizer = tokenization.load(vocab_file, do_lower_case)
    top_ids, top_probs = top_k_predictions(model, params, batch)
    print("Top-5 predictions for the masked words of held-out sequences (✓: the top guess is right):")
    print(format_predictions(tokenizer, batch, top_ids, top_probs, rows=rows))


# --- A fine-tuned workdir on new inputs -------------------------------------------------------------------


def _refuse_pre_training_run(workdir: str) -> None:
    """A pre-training workdir holds the encoder and its masked-LM/NSP heads, no task head to predict with:
    one sentence saying so and what to pass, before anything is read."""
    from bertjax.training import checkpoint as checkpoint_lib

    path = os.path.join(workdir, "config.json")
    if not (checkpoint_lib.is_workdir(workdir) and files.isfile(path)):
        return  # not a workdir at all: finetuning.load_run says what is missing
    kind = files.read_json(path).get("kind")
    if kind != "finetune":
        raise ValueError(
            f"--workdir={workdir} is a pre-training run, not a fine-tuned one: it has no task head "
            "(classifier or qa_outputs) to predict with; pass the workdir of a run fine-tuned from it "
            f"(python -m bertjax.finetune --config.train.init_from={workdir}), or use python -m "
            f"bertjax.extract_features --init_from={workdir} for its encoder's vectors."
        )


def predict_file(
    workdir: str, input_file: str, output_file: str, step: Optional[int] = None, batch_size: int = 32
) -> int:
    """Runs a fine-tuned workdir on input_file and writes output_file (JSONL); returns the count."""
    from bertjax.jobs import finetune as finetuning

    _refuse_pre_training_run(workdir)
    job, labels, params = finetuning.load_run(workdir, step)
    kind = tasks.get(job.task)
    if kind.embeds:  # no label to predict: its output is a vector a text, which others search
        raise ValueError(
            f"--workdir={workdir} is an embedding model (config.task={job.task}), which predicts no labels: score it "
            f"with `python -m bertjax.retrieval --model={workdir} --data_dir=BEIR_DIR`, or export it for "
            f"sentence-transformers with `python -m bertjax.export --workdir={workdir} --output_dir=DIR`."
        )
    examples = kind.read_inputs(input_file, job.data, labels)
    split, logits = run_on_examples(job, labels, params, examples, os.path.basename(input_file), batch_size)
    predictions = finetuning.predictions_of(job, split, logits, labels)
    if not files.is_remote(output_file):
        files.makedirs(os.path.dirname(os.path.abspath(output_file)))
    lines = (
        json.dumps(kind.prediction_record(example, prediction)) + "\n"
        for example, prediction in zip(examples, predictions)
    )
    files.write_whole(output_file, "".join(lines))
    log.info("predict: %d %s predictions from %s written to %s", len(predictions), job.task, workdir, output_file)
    return len(predictions)


def run_on_examples(
    job: Any, labels: Any, params: Any, examples: list, name: str, batch_size: int = 32
) -> tuple[Any, np.ndarray]:
    """(split, logits of every example in input order) of a fine-tuned run's params (finetuning.load_run)
    on examples of its task, rows built as the run built its own."""
    from bertjax.jobs import finetune as finetuning
    from bertjax.finetuning import heads
    from bertjax.finetuning import arrays, example_packing

    tokenizer = tokenization.load(job.data.vocab_file, job.data.do_lower_case)
    split = finetuning.make_split(job, examples, tokenizer, labels, False, name)
    num_labels = 1 if job.data.regression else (2 if labels is None else len(labels.labels))
    packed = finetuning.uses_packing(job)  # short inputs share rows, as in the run's own evaluation
    model = heads.model_for(job.model.architecture, job.task, num_labels, packed=packed)
    forward = jax.jit(
        lambda p, b: model.apply(
            {"params": p},
            input_ids=b["input_ids"],
            segment_ids=b["segment_ids"],
            input_mask=b["input_mask"],
            **heads.packed_inputs(b),
        )
    )
    if packed:
        batches = example_packing.PackedBatches(split.arrays, batch_size, training=False)
        logits = batches.unpack(
            [np.asarray(forward(params, b)) for b in batches], per_token=tasks.get(job.task).per_token
        )
    else:
        batches = arrays.ArrayBatches(split.arrays, batch_size, training=False)
        logits = np.concatenate([np.asarray(forward(params, b)) for b in batches])[: batches.rows]
    return split, logits
