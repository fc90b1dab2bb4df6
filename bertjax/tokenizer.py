"""Train a WordPiece vocab.txt, a SentencePiece model or a byte-level BPE tokenizer.json from a corpus.

  python -m bertjax.tokenizer --input_file=GLOB[,GLOB] --vocab_size=N --output_dir=DIR \
      [--model_type=wordpiece|sentencepiece|bpe] [--do_lower_case] [--strip_accents]

--input_file takes what `python -m bertjax.prepare` takes: BERT raw-text files (one sentence per line,
blank lines between documents, `.gz` allowed), Parquet / JSON Lines files (one document per row, its text in
--text_field), `tfds:NAME[/CONFIG][:SPLIT]` or `builtin:pydocs`. The same
corpus and flags write the same bytes on every run (bertjax/data/vocab/training.py). A WordPiece vocab that
comes out another size than --vocab_size (a corpus too small for it) is one printed line with both sizes
and why; SentencePiece refuses such a size instead.
"""

from absl import flags

from bertjax import cli
from bertjax.data.corpus import table as table_corpus
from bertjax.jobs import tokenizer

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Defined only when run as a program, so that importing this module (or two CLIs in one process)
    defines no flags."""
    flags.DEFINE_string(
        "input_file",
        None,
        "Corpus: text files (glob / comma list, .gz ok), Parquet / JSON "
        "Lines files (.parquet, .jsonl[.gz|.zst]), tfds:NAME[:SPLIT] or builtin:pydocs.",
        required=True,
    )
    flags.DEFINE_integer("vocab_size", None, "Size of the vocabulary, special tokens included.", required=True)
    flags.DEFINE_string(
        "output_dir", None, "Directory for vocab.txt, spm.model/spm.vocab or tokenizer.json.", required=True
    )
    flags.DEFINE_enum(
        "model_type",
        tokenizer.MODEL_TYPES[0],
        list(tokenizer.MODEL_TYPES),
        "Tokenizer engine; bpe: byte-level BPE (RoBERTa's, ModernBERT's) in a tokenizer.json.",
    )
    flags.DEFINE_boolean(
        "do_lower_case",
        None,
        "Lower-case (and, for WordPiece, strip accents). Default: "
        "lower-cased for wordpiece and sentencepiece (as BERT's uncased vocab), cased for bpe (as "
        "RoBERTa's and ModernBERT's); --nodo_lower_case / --do_lower_case choose.",
    )
    flags.DEFINE_boolean(
        "strip_accents",
        None,
        "WordPiece: strip accents (NFD, marks dropped), as transformers' BertTokenizer(strip_accents=...). Default: "
        "with --do_lower_case, as BERT's uncased vocab, which merges й into и and が into か; --nostrip_accents keeps "
        "the letters of every script. Recorded in tokenizer_config.json beside vocab.txt.",
    )
    flags.DEFINE_integer(
        "num_threads",
        1,
        "SentencePiece's training threads: more train a large corpus faster, "
        "but its multi-threaded trainer does not give the same model twice.",
    )
    flags.DEFINE_integer(
        "random_seed",
        12345,
        "SentencePiece: seed of the sample of lines it trains on when the corpus has more than 10M.",
    )
    flags.DEFINE_string("tfds_data_dir", None, "TFDS data_dir for tfds: inputs.")
    flags.DEFINE_string(
        "text_field",
        "text",
        "The field holding each document's text: Parquet column, JSON key "
        "or TFDS feature; a dotted name (meta.text) is a field inside a struct column or object.",
    )
    flags.DEFINE_bool(
        "skip_bad_json_lines", False, "Skip (and count) JSON lines that do not parse, instead of stopping at the first."
    )
    flags.DEFINE_string("tfds_text_feature", "text", "Deprecated: use --text_field.")


def main(argv: list[str]) -> None:
    lower = FLAGS.do_lower_case if FLAGS.do_lower_case is not None else FLAGS.model_type != "bpe"
    text_field = table_corpus.resolve_text_field(
        FLAGS.text_field, FLAGS.tfds_text_feature, "--tfds_text_feature", "--text_field"
    )
    report = cli.run_job(
        argv,
        tokenizer.train_tokenizer,
        FLAGS.input_file,
        FLAGS.vocab_size,
        FLAGS.output_dir,
        FLAGS.model_type,
        lower,
        FLAGS.num_threads,
        FLAGS.random_seed,
        FLAGS.tfds_data_dir,
        text_field,
        FLAGS.skip_bad_json_lines,
        FLAGS.strip_accents,
        command="tokenizer",
        uses_jax=False,
    )
    print(report)


if __name__ == "__main__":
    define_flags()
    cli.run(main)
