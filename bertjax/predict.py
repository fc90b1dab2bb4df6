"""Masked-word predictions for a batch of records: what the demo prints at the end of training."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from bertjax import model as model_lib
from bertjax.data import tokenization


def top_k_predictions(model: Any, params: Any, batch: dict[str, np.ndarray], k: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """(ids, probabilities) of the k most likely tokens at every masked position: [batch, predictions, k]."""
    out = jax.jit(lambda p, b: model.apply({"params": p}, b["input_ids"], b["segment_ids"], b["input_mask"],
                                           masked_lm_positions=b["masked_lm_positions"],
                                           **model_lib.packed_inputs(b)))(params, batch)
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


def format_predictions(tokenizer: tokenization.Tokenizer, batch: dict[str, np.ndarray], top_ids: np.ndarray,
                       top_probs: np.ndarray, rows: int = 3) -> str:
    """Each row: the input with its masks, then for every masked position the truth and the top-k guesses."""
    lines = []
    for r in range(min(rows, len(batch["input_ids"]))):
        length = int((batch["input_mask"][r] > 0).sum())
        lines.append(f"[{r}] {_words(tokenizer, list(batch['input_ids'][r][:length]))}")
        for j in np.flatnonzero(batch["masked_lm_weights"][r] > 0):
            truth = tokenizer.convert_ids_to_tokens([batch["masked_lm_ids"][r][j]])[0]
            guesses = ", ".join(f"{tok} {p:.2f}" for tok, p in
                                zip(tokenizer.convert_ids_to_tokens(top_ids[r, j]), top_probs[r, j]))
            mark = "✓" if top_ids[r, j, 0] == batch["masked_lm_ids"][r][j] else " "
            lines.append(f"    {mark} position {int(batch['masked_lm_positions'][r][j]):3d}  truth {truth:<14} top-5: {guesses}")
    return "\n".join(lines)


def show_predictions(model: Any, params: Any, batch: dict[str, np.ndarray], vocab_file: str, do_lower_case: bool,
                     rows: int) -> None:
    """Prints the top-5 guesses for the masked words of the first `rows` sequences of a batch."""
    tokenizer = tokenization.load(vocab_file, do_lower_case)
    top_ids, top_probs = top_k_predictions(model, params, batch)
    print("Top-5 predictions for the masked words of held-out sequences (✓: the top guess is right):")
    print(format_predictions(tokenizer, batch, top_ids, top_probs, rows=rows))
