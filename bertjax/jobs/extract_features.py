"""Contextual token vectors from a pre-trained BERT, the paper's feature-based approach (`run`, which
`python -m bertjax.extract_features --init_from=PATH --input_file=F --output_file=OUT.jsonl` calls).

google-research/bert's extract_features.py, same input and output, so scripts written for it read ours:
each input line is one text, or `text_a ||| text_b` for a pair; each output line is
`{"linex_index": i, "features": [{"token": "[CLS]", "layers": [{"index": -1, "values": [...]}, ...]}, ...]}`
(the original's key, typo included), values rounded to 6 decimals, one entry per real token (no padding).
Layer indices are the original's too: into the encoder layers' outputs, 0 the first, -1 the last.

`--init_from` is any source `pretrained.load` reads: a pre-training or a fine-tuned workdir (its encoder;
no head is read), a Hugging Face or a TF1 directory. Batches have one fixed shape (the last one padded) so
the jitted forward compiles once; it returns only the requested layers, so the host copies no more than it
writes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import time
from collections.abc import Iterator, Sequence
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.runtime import files
from bertjax.training import checkpoint as checkpoint_lib
from bertjax import models as models_lib
from bertjax.interop import pretrained
from bertjax.data.vocab import tokenization

log = logging.getLogger(__name__)

PAIR_SEPARATOR = re.compile(r"^(.*) \|\|\| (.*)$")  # the original's: a pair splits at the last " ||| "
PROGRESS_EVERY_S = 30.0


@dataclasses.dataclass(frozen=True)
class Example:
    index: int  # the input line's number from 0: the output's linex_index
    text_a: str
    text_b: Optional[str]


@dataclasses.dataclass(frozen=True)
class Feature:
    index: int
    tokens: list[str]  # with [CLS] and [SEP]; no padding
    input_ids: np.ndarray  # [max_seq_length] int32, padded with 0s
    segment_ids: np.ndarray
    input_mask: np.ndarray


def read_examples(path: str) -> list[Example]:
    """Every line is an example (a blank one too, as the original reads), so linex_index is its line number."""
    if not files.isfile(path):
        raise FileNotFoundError(f"--input_file={path} does not exist; pass a text file with one input per line.")
    try:
        with files.open_file(path, "rb") as f:
            lines = [line.strip() for line in f.read().decode("utf-8").splitlines()]
    except UnicodeDecodeError as e:
        raise ValueError(
            f"--input_file={path} is not UTF-8 text (byte offset {e.start}); re-encode it as UTF-8."
        ) from None
    if not lines:
        raise ValueError(f"--input_file={path} is empty; write one text (or `text_a ||| text_b`) per line.")
    examples = []
    for i, line in enumerate(lines):
        m = PAIR_SEPARATOR.match(line)
        examples.append(Example(i, line, None) if m is None else Example(i, m.group(1), m.group(2)))
    return examples


def find_vocab(init_from: str, vocab_file: Optional[str], do_lower_case: Optional[bool]) -> tuple[str, bool]:
    """(vocab file, do_lower_case): the flags win; else what the checkpoint records (a Hugging Face or TF1
    directory's vocab.txt and tokenizer_config.json, a bertjax workdir's config.json); else lower case."""
    recorded: Optional[bool] = None
    found: Optional[str] = None
    if files.isfile(os.path.join(init_from, tokenization.VOCAB_FILE)):
        found = os.path.join(init_from, tokenization.VOCAB_FILE)
        tokenizer_config = os.path.join(init_from, "tokenizer_config.json")
        if files.isfile(tokenizer_config):
            value = files.read_json(tokenizer_config).get("do_lower_case")
            recorded = value if isinstance(value, bool) else None
        elif re.match(r"(multi_)?cased_", os.path.basename(os.path.normpath(init_from))):
            recorded = False  # google-research/bert's cased_L-12_H-768_A-12 and kin record it only in the name
    elif checkpoint_lib.is_workdir(init_from):
        found, recorded = pretrained.run_vocab(init_from)
    elif files.isfile(os.path.join(init_from, tokenization.TOKENIZER_JSON)):  # applied as is, casing included
        found = os.path.join(init_from, tokenization.TOKENIZER_JSON)
    vocab_file = vocab_file or found
    if not vocab_file:
        raise FileNotFoundError(
            f"--init_from={init_from} records no vocabulary (no {tokenization.VOCAB_FILE}, no "
            "vocab_file in its config.json); pass the one the model was trained with as "
            "--vocab_file."
        )
    return vocab_file, (do_lower_case if do_lower_case is not None else recorded if recorded is not None else True)


def layer_indices(spec: str, num_layers: int) -> list[int]:
    """--layers as ints, each checked against the model's depth (the original's indexing: -1 the last)."""
    try:
        layers = [int(part) for part in spec.split(",") if part.strip()]
    except ValueError:
        raise ValueError(
            f"--layers={spec} is not a comma-separated list of integers; pass e.g. --layers=-1,-2,-3,-4."
        ) from None
    if not layers:
        raise ValueError("--layers is empty; pass e.g. --layers=-1,-2,-3,-4.")
    bad = [i for i in layers if not -num_layers <= i < num_layers]
    if bad:
        raise ValueError(
            f"--layers={spec}: {bad} out of range for a {num_layers}-layer model; pass indices from "
            f"{-num_layers} to {num_layers - 1} (-1 is the last layer, 0 the first)."
        )
    return layers


def truncate_pair(tokens_a: list[str], tokens_b: list[str], max_length: int) -> bool:
    """Drops tokens from the end of the longer list until both fit (the original's longest-first); True if any."""
    truncated = False
    while len(tokens_a) + len(tokens_b) > max_length:
        (tokens_a if len(tokens_a) > len(tokens_b) else tokens_b).pop()
        truncated = True
    return truncated


def featurize(
    examples: Sequence[Example], tokenizer: tokenization.Tokenizer, max_seq_length: int
) -> tuple[list[Feature], int]:
    """([CLS] a [SEP] (b [SEP]) as fixed-length arrays, segment 1 from b on; count of truncated examples)."""
    features, truncated = [], 0
    for ex in examples:
        tokens_a = tokenizer.tokenize(ex.text_a)
        tokens_b = tokenizer.tokenize(ex.text_b) if ex.text_b is not None else []
        budget = max_seq_length - (3 if ex.text_b is not None else 2)
        truncated += truncate_pair(tokens_a, tokens_b, budget)
        tokens = [tokenization.CLS, *tokens_a, tokenization.SEP]
        segments = [0] * len(tokens)
        if ex.text_b is not None:
            tokens += [*tokens_b, tokenization.SEP]
            segments += [1] * (len(tokens_b) + 1)
        ids, segment_ids, mask = (np.zeros(max_seq_length, np.int32) for _ in range(3))
        ids[: len(tokens)] = tokenizer.convert_tokens_to_ids(tokens)
        segment_ids[: len(tokens)] = segments
        mask[: len(tokens)] = 1
        features.append(Feature(ex.index, tokens, ids, segment_ids, mask))
    return features, truncated


def layer_outputs_fn(architecture: Any, layers: Sequence[int]):
    """Jitted (encoder params, ids, segments, mask) -> [batch, len(layers), length, hidden] float32."""
    layers, family = tuple(layers), models_lib.of(architecture)

    @jax.jit
    def forward(params, input_ids, segment_ids, input_mask):
        hidden_states = family.model.encoder_states(architecture, params, input_ids, segment_ids, input_mask)
        encoder_layers = hidden_states[1:]  # [0] is the embeddings' output, not a layer
        return jnp.stack([encoder_layers[i] for i in layers], axis=1).astype(jnp.float32)

    return forward


def extract(
    architecture: Any, params: Any, features: Sequence[Feature], layers: Sequence[int], batch_size: int
) -> Iterator[tuple[Feature, np.ndarray]]:
    """(feature, its requested layers [len(layers), tokens, hidden]) in input order; `params`: the encoder's."""
    forward = layer_outputs_fn(architecture, layers)
    start, last_log = time.monotonic(), time.monotonic()
    for begin in range(0, len(features), batch_size):
        chunk = features[begin : begin + batch_size]
        arrays = []
        for name in ("input_ids", "segment_ids", "input_mask"):
            rows = np.stack([getattr(f, name) for f in chunk])
            arrays.append(np.pad(rows, ((0, batch_size - len(chunk)), (0, 0))))  # one shape: one compile
        values = np.asarray(forward(params, *arrays))
        for f, v in zip(chunk, values):
            yield f, v[:, : len(f.tokens)]
        done = begin + len(chunk)
        if time.monotonic() - last_log > PROGRESS_EVERY_S and done < len(features):
            last_log = time.monotonic()
            log.info("extract_features: %d/%d lines, %.1f lines/s", done, len(features), done / (last_log - start))


def to_json(feature: Feature, values: np.ndarray, layers: Sequence[int]) -> str:
    """One output line in the original's format, values rounded to 6 decimals."""
    rounded = np.round(values.astype(np.float64), 6)  # [layers, tokens, hidden]
    return json.dumps(
        {
            "linex_index": feature.index,
            "features": [
                {
                    "token": token,
                    "layers": [{"index": index, "values": rounded[j, t].tolist()} for j, index in enumerate(layers)],
                }
                for t, token in enumerate(feature.tokens)
            ],
        }
    )


def run(
    init_from: str,
    input_file: str,
    output_file: str,
    layers: str = "-1,-2,-3,-4",
    max_seq_length: int = 128,
    batch_size: int = 8,
    vocab_file: Optional[str] = None,
    do_lower_case: Optional[bool] = None,
) -> dict:
    """Writes output_file; returns {"lines", "truncated", "seconds"}."""
    if batch_size < 1:
        raise ValueError(f"--batch_size={batch_size} must be at least 1.")
    examples = read_examples(input_file)
    vocab_file, do_lower_case = find_vocab(init_from, vocab_file, do_lower_case)
    tokenizer = tokenization.load(vocab_file, do_lower_case)
    # The encoder alone (its family's BODY, of every source): a fine-tuned workdir has no masked-LM head.
    config, params = pretrained.load(init_from, encoder_only=True)
    params = jax.tree.map(jnp.asarray, params[models_lib.of(config).model.BODY])
    indices = layer_indices(layers, config.num_hidden_layers)
    min_length = 3 if any(ex.text_b is not None for ex in examples) else 2
    if not min_length <= max_seq_length <= config.max_position_embeddings:
        raise ValueError(
            f"--max_seq_length={max_seq_length} must be from {min_length} ([CLS] and [SEP]s) to the "
            f"model's max_position_embeddings={config.max_position_embeddings}."
        )
    if tokenizer.vocab_size > config.vocab_size:
        raise ValueError(
            f"--vocab_file {vocab_file} has {tokenizer.vocab_size} tokens but the model at {init_from} "
            f"has {config.vocab_size} embeddings; pass the vocab the model was trained with."
        )
    log.info(
        "extract_features: %d lines from %s, vocab %s (do_lower_case=%s), layers %s of %d",
        len(examples),
        input_file,
        vocab_file,
        do_lower_case,
        indices,
        config.num_hidden_layers,
    )
    start = time.monotonic()
    features, truncated = featurize(examples, tokenizer, max_seq_length)
    if truncated:
        log.info(
            "extract_features: truncated %d of %d lines to --max_seq_length=%d tokens",
            truncated,
            len(features),
            max_seq_length,
        )
    with files.writing_dir(os.path.dirname(output_file) or ".") as directory:  # gs://: written here, uploaded
        target = os.path.join(directory, os.path.basename(output_file))
        with open(target + ".tmp", "w", encoding="utf-8") as f:
            for feature, values in extract(config, params, features, indices, batch_size):
                f.write(to_json(feature, values, indices) + "\n")
        os.replace(target + ".tmp", target)  # a crash never leaves a partial file under the real name
    seconds = time.monotonic() - start
    log.info(
        "extract_features: wrote %d lines to %s in %.1f s (%.1f lines/s)",
        len(features),
        output_file,
        seconds,
        len(features) / max(seconds, 1e-9),
    )
    return {"lines": len(features), "truncated": truncated, "seconds": seconds}
