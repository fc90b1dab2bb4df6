"""Before a pre-training job compiles: the vocabulary, the model and the records agree.

Three sizes and one fingerprint must match: `config.model.vocab_size` (0 = unset: taken from the records'
metadata.json, else from the vocab file), the vocab file's size, the vocabulary size in metadata.json,
and the vocab file's sha256 against metadata.json's `vocab_hash`. A vocab that lost a line (say
`[MASK]`) would otherwise train, and its export would ship beside a model with one more row, so that
`transformers` predicts shifted ids.
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

from bertjax import models as models_lib
from bertjax.data.pretraining import record_sets, records
from bertjax.data.vocab import tokenization

log = logging.getLogger(__name__)


def check_job_vocab(job: Any, record_files: Sequence[tuple[str, str]] = ()) -> Any:
    """`job` with model.vocab_size resolved; one sentence on a mismatch. `record_files`: (what, glob) of each
    record set it trains on (a mixture's sources); by default config.data.train_files."""
    d = job.data
    sets = list(record_files) or [("config.data.train_files", d.train_files)]
    found = [(what, records.read_metadata(record_sets.expand_record_files(glob, what))) for what, glob in sets]
    sizes = {what: m["vocab_size"] for what, m in found if m and m.get("vocab_size")}
    first, m = next(iter(sizes.items()), (None, None))
    for what, n in sizes.items():
        if n != m:
            raise ValueError(
                f"{first} was made with a vocabulary of {m:,} tokens and {what} with {n:,}; one model reads every "
                "source: prepare them all with one vocab_file."
            )
    tokenizer = tokenization.load(d.vocab_file, d.do_lower_case) if d.vocab_file else None  # read once
    if tokenizer is not None:
        for what, metadata in found[1:]:
            _check_vocab_file(d, metadata, f"the {records.METADATA_NAME} of {what}", tokenizer)
    metadata = found[0][1]
    where = f"the records' {records.METADATA_NAME}"
    vocab_size = job.model.vocab_size
    if not vocab_size:
        if metadata and metadata.get("vocab_size"):
            vocab_size = int(metadata["vocab_size"])
            log.info("setup: config.model.vocab_size unset: %d from %s", vocab_size, where)
        elif tokenizer is not None:
            vocab_size = tokenizer.vocab_size
            log.info("setup: config.model.vocab_size unset: %d, the size of %s", vocab_size, d.vocab_file)
        else:
            vocab_size = models_lib.get(job.model.family).config.config_for_size("base").vocab_size
            log.warning(
                "setup: config.model.vocab_size unset and the records have no metadata.json: using "
                "%s-base's %d; set it, or config.data.vocab_file, to the records' vocabulary",
                job.model.family,
                vocab_size,
            )
    if tokenizer is not None:
        if tokenizer.vocab_size != vocab_size:
            raise ValueError(
                f"config.data.vocab_file={d.vocab_file} has {tokenizer.vocab_size:,} tokens but "
                f"config.model.vocab_size={vocab_size:,}: use the vocab the records were made with "
                "(a vocab that lost a line shifts every id after it), or set the size to match."
            )
        _check_vocab_file(d, metadata, where, tokenizer)
    model = {"vocab_size": vocab_size}
    if tokenizer is not None:  # special ids the vocab has (ModernBERT's config.json carries them); -1 = unset
        for name, token_id in (
            ("pad_token_id", tokenizer.pad_id),
            ("cls_token_id", tokenizer.cls_id),
            ("sep_token_id", tokenizer.sep_id),
        ):
            if getattr(job.model, name) < 0:
                model[name] = token_id
    return job.replace(model=model)


def _check_vocab_file(d: Any, metadata: Optional[dict], where: str, tokenizer: Any) -> None:
    """The vocab file (`tokenizer`) is the one the records were made with (metadata.json's vocab_hash), when known."""
    made_with = (metadata or {}).get("vocab_hash")
    if made_with and tokenizer.vocab_hash() != made_with:
        raise ValueError(
            f"config.data.vocab_file={d.vocab_file} is not the vocabulary the records were made "
            f"with (its sha256 differs from {where}' vocab_hash; prepare used "
            f"{metadata.get('vocab_file', 'another file')}): set config.data.vocab_file to that "
            "file."
        )
