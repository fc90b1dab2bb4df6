"""Train a WordPiece vocab.txt, a SentencePiece model or a byte-level BPE tokenizer.json from a corpus.

  python -m bertjax.tokenizer --input_file=GLOB[,GLOB] --vocab_size=N --output_dir=DIR \
      [--model_type=wordpiece|sentencepiece|bpe] [--do_lower_case]

--input_file takes what `python -m bertjax.prepare` takes: BERT raw-text files (one sentence per line,
blank lines between documents, `.gz` allowed), Parquet / JSON Lines files (one document per row, its text in
--text_field), `tfds:NAME[/CONFIG][:SPLIT]` or `builtin:pydocs`. The same
corpus and flags write the same bytes on every run (bertjax/data/vocab/training.py). A WordPiece vocab that
comes out another size than --vocab_size (a corpus too small for it) is one printed line with both sizes
and why; SentencePiece refuses such a size instead.
"""

from collections.abc import Iterator

from absl import flags

from bertjax import cli
from bertjax.data.corpus import sources as corpus_lib
from bertjax.data.corpus import table as table_corpus
from bertjax.data.vocab import training as vocab_training

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Defined only when run as a program, so that importing this module (or two CLIs in one process)
    defines no flags."""
    flags.DEFINE_string("input_file", None, "Corpus: text files (glob / comma list, .gz ok), Parquet / JSON "
                        "Lines files (.parquet, .jsonl[.gz|.zst]), tfds:NAME[:SPLIT] or builtin:pydocs.", required=True)
    flags.DEFINE_integer("vocab_size", None, "Size of the vocabulary, special tokens included.", required=True)
    flags.DEFINE_string("output_dir", None, "Directory for vocab.txt, spm.model/spm.vocab or tokenizer.json.",
                        required=True)
    flags.DEFINE_enum("model_type", "wordpiece", ["wordpiece", "sentencepiece", "bpe"],
                      "Tokenizer engine; bpe: byte-level BPE (RoBERTa's, ModernBERT's) in a tokenizer.json.")
    flags.DEFINE_boolean("do_lower_case", None, "Lower-case (and, for WordPiece, strip accents). Default: "
                         "lower-cased for wordpiece and sentencepiece (as BERT's uncased vocab), cased for bpe (as "
                         "RoBERTa's and ModernBERT's); --nodo_lower_case / --do_lower_case choose.")
    flags.DEFINE_integer("num_threads", 1, "SentencePiece's training threads: more train a large corpus faster, "
                         "but its multi-threaded trainer does not give the same model twice.")
    flags.DEFINE_integer("random_seed", 12345, "SentencePiece: seed of the sample of lines it trains on when the "
                         "corpus has more than 10M.")
    flags.DEFINE_string("tfds_data_dir", None, "TFDS data_dir for tfds: inputs.")
    flags.DEFINE_string("text_field", "text", "The field holding each document's text: Parquet column, JSON key "
                        "or TFDS feature; a dotted name (meta.text) is a field inside a struct column or object.")
    flags.DEFINE_bool("skip_bad_json_lines", False, "Skip (and count) JSON lines that do not parse, instead of "
                      "stopping at the first.")
    flags.DEFINE_string("tfds_text_feature", "text", "Deprecated: use --text_field.")


def sentences(source: corpus_lib.Source) -> Iterator[str]:
    for document in source.documents():
        yield from document


def main(argv: list[str]) -> None:
    del argv
    source = None
    lower = FLAGS.do_lower_case if FLAGS.do_lower_case is not None else FLAGS.model_type != "bpe"
    try:
        text_field = table_corpus.resolve_text_field(FLAGS.text_field, FLAGS.tfds_text_feature,
                                                     "--tfds_text_feature", "--text_field")
        source = corpus_lib.open_source(FLAGS.input_file, data_dir=FLAGS.tfds_data_dir, text_field=text_field,
                                        skip_bad_json_lines=FLAGS.skip_bad_json_lines)
        if FLAGS.model_type == "wordpiece":
            # A vocab of another size than asked says so, and why, in one printed line.
            tok = vocab_training.train_wordpiece(sentences(source), FLAGS.vocab_size, FLAGS.output_dir,
                                                 do_lower_case=lower, report=print)
        elif FLAGS.model_type == "bpe":
            tok = vocab_training.train_bpe(sentences(source), FLAGS.vocab_size, FLAGS.output_dir,
                                           do_lower_case=lower)
        else:
            tok = vocab_training.train_sentencepiece(sentences(source), FLAGS.vocab_size, FLAGS.output_dir,
                                                     do_lower_case=lower, seed=FLAGS.random_seed,
                                                     num_threads=FLAGS.num_threads)
    except (OSError, ValueError) as e:  # a user's bad file or flag: one line, no traceback
        if isinstance(e, vocab_training.NoText) and source is not None:  # nothing to learn from: say what was read
            stats, rows = source.stats, table_corpus.skipped_rows_note(source.stats)
            raise SystemExit(f"error: --input_file={FLAGS.input_file} gave no text to train on: {stats.units} "
                             f"unit(s) read{f', {rows}' if rows else ''}, {stats.empty_files} empty file(s); point it "
                             "at files that hold text (or name the field that does with --text_field).") from None
        raise SystemExit(f"error: {e}") from None
    written = [tok.path] + ([tok.path.with_suffix(".vocab")] if FLAGS.model_type == "sentencepiece" else [])
    stats = source.stats
    rows = table_corpus.skipped_rows_note(stats)  # Parquet / JSON Lines: rows without text are counted
    print(f"Read {stats.units} unit(s), {stats.documents:,} documents, {stats.sentences:,} sentences"
          f"{f' ({rows})' if rows else ''}; wrote "
          f"{', '.join(map(str, written))}; vocab_size={tok.vocab_size} (do_lower_case={tok.do_lower_case}; "
          f"[PAD]={tok.pad_id} [UNK]={tok.unk_id} [CLS]={tok.cls_id} [SEP]={tok.sep_id} [MASK]={tok.mask_id}).")


if __name__ == "__main__":
    define_flags()
    cli.run(main)
