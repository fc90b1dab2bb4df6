"""The tokenizer job (`python -m bertjax.tokenizer`): a corpus → a WordPiece vocab.txt, a SentencePiece model or a
byte-level BPE tokenizer.json (the algorithms: data/vocab/training.py), and the line that says what was read and
written."""

from __future__ import annotations

import posixpath
from collections.abc import Iterator

from bertjax.runtime import files
from bertjax.data.corpus import sources as corpus_lib
from bertjax.data.corpus import table as table_corpus
from bertjax.data.vocab import tokenization
from bertjax.data.vocab import training as vocab_training

MODEL_TYPES = ("wordpiece", "sentencepiece", "bpe")


def sentences(source: corpus_lib.Source) -> Iterator[str]:
    for document in source.documents():
        yield from document


def train_tokenizer(
    input_file: str,
    vocab_size: int,
    output_dir: str,
    model_type: str = "wordpiece",
    do_lower_case: bool = True,
    num_threads: int = 1,
    random_seed: int = 12345,
    tfds_data_dir: str | None = None,
    text_field: str = "text",
    skip_bad_json_lines: bool = False,
    strip_accents: bool | None = None,
) -> str:
    """Trains and writes the tokenizer; returns the report line. A corpus with no text raises ValueError naming
    what was read."""
    if model_type not in MODEL_TYPES:
        raise ValueError(f"--model_type={model_type!r} is not one of {list(MODEL_TYPES)}.")
    if strip_accents is not None and model_type != "wordpiece":
        raise ValueError(
            f"--strip_accents applies to WordPiece vocabs only (BERT's accent stripping); --model_type={model_type} "
            "never strips accents: drop the flag."
        )
    source = corpus_lib.open_source(
        input_file, data_dir=tfds_data_dir, text_field=text_field, skip_bad_json_lines=skip_bad_json_lines
    )
    try:
        with files.writing_dir(output_dir) as local_dir:  # a bucket (gs://): written here, then uploaded
            if model_type == "wordpiece":
                # A vocab of another size than asked says so, and why, in one printed line.
                tok = vocab_training.train_wordpiece(
                    sentences(source),
                    vocab_size,
                    local_dir,
                    do_lower_case=do_lower_case,
                    report=print,
                    strip_accents=strip_accents,
                )
            elif model_type == "bpe":
                tok = vocab_training.train_bpe(sentences(source), vocab_size, local_dir, do_lower_case=do_lower_case)
            else:
                tok = vocab_training.train_sentencepiece(
                    sentences(source),
                    vocab_size,
                    local_dir,
                    do_lower_case=do_lower_case,
                    seed=random_seed,
                    num_threads=num_threads,
                )
    except vocab_training.NoText:  # nothing to learn from: say what was read
        stats, rows = source.stats, table_corpus.skipped_rows_note(source.stats)
        raise ValueError(
            f"--input_file={input_file} gave no text to train on: {stats.units} unit(s) read"
            f"{f', {rows}' if rows else ''}, {stats.empty_files} empty file(s); point it at files that "
            "hold text (or name the field that does with --text_field)."
        ) from None
    written = [tok.path] + ([tok.path.with_suffix(".vocab")] if model_type == "sentencepiece" else [])
    if model_type == "wordpiece":
        written.append(tok.path.with_name(tokenization.TOKENIZER_CONFIG))
    if files.is_remote(output_dir):
        written = [posixpath.join(output_dir, p.name) for p in written]
    stats = source.stats
    rows = table_corpus.skipped_rows_note(stats)  # Parquet / JSON Lines: rows without text are counted
    return (
        f"Read {stats.units} unit(s), {stats.documents:,} documents, {stats.sentences:,} sentences"
        f"{f' ({rows})' if rows else ''}; wrote "
        f"{', '.join(map(str, written))}; vocab_size={tok.vocab_size} (do_lower_case={tok.do_lower_case}; "
        + (f"strip_accents={tok.strip_accents}; " if model_type == "wordpiece" else "")
        + f"[PAD]={tok.pad_id} [UNK]={tok.unk_id} [CLS]={tok.cls_id} [SEP]={tok.sep_id} [MASK]={tok.mask_id})."
    )
