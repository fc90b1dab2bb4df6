"""python -m bertjax.prepare: raw text → pre-masked TFRecord shards, as create_pretraining_data.py.

    python -m bertjax.prepare --input_file='corpus/*.txt' --output_dir=records --vocab_file=vocab.txt \
        --max_seq_length=128 --max_predictions_per_seq=20 --dupe_factor=10 --num_workers=8

Flags keep google-research/bert's names and defaults. --input_file also takes Parquet and JSON Lines files
(`.parquet`, `.jsonl`, `.jsonl.gz`, `.json.gz`, `.jsonl.zst`; one document per row, its text in --text_field),
`tfds:NAME[/CONFIG][:SPLIT]` and `builtin:pydocs`. With --runner=beam, flags this program does not know pass through to Beam
(e.g. --runner=beam --beam_runner=DataflowRunner --project=... --temp_location=gs://...).
"""

import functools
import os

from absl import app, flags

from bertjax import cli
from bertjax.data.corpus import table as table_corpus
from bertjax.data.pretraining import instances, packing, shards
from bertjax.jobs import prepare

FLAGS = flags.FLAGS


def define_flags() -> None:
    """create_pretraining_data.py's flags; defined only when run as a program, so that importing this
    module (or two CLIs in one process) defines none."""
    flags.DEFINE_string(
        "input_file",
        None,
        "Raw text files (glob or comma list; .gz ok), Parquet / JSON Lines "
        "files (.parquet, .jsonl, .jsonl.gz, .json.gz, .jsonl.zst), tfds:NAME[:SPLIT] or builtin:pydocs.",
    )
    flags.DEFINE_string("output_dir", None, "Directory for the record shards and metadata.json.")
    flags.DEFINE_string("vocab_file", None, "WordPiece vocab.txt or SentencePiece .model.")
    flags.DEFINE_bool("do_lower_case", True, "Lower-case and strip accents (uncased models).")
    flags.DEFINE_bool("do_whole_word_mask", False, "Mask whole words, deciding [MASK]/random/keep once per word.")
    flags.DEFINE_integer("max_seq_length", 128, "Tokens per instance, [CLS] and [SEP]s included.")
    flags.DEFINE_integer("max_predictions_per_seq", 20, "Most masked positions per instance.")
    flags.DEFINE_integer("random_seed", 12345, "Seed; each shard and block derives its own from it.")
    flags.DEFINE_integer("dupe_factor", 10, "Passes over the corpus, each with different masks.")
    flags.DEFINE_float("masked_lm_prob", 0.15, "Share of tokens masked.")
    flags.DEFINE_float("short_seq_prob", 0.1, "Probability of a shorter target length.")
    flags.DEFINE_bool("no_nsp", False, "MLM only: one segment per instance, no sentence pairs.")
    flags.DEFINE_bool(
        "packing",
        False,
        "Pack several instances into each row (bertjax/data/pretraining/packing.py); train "
        "on them with --config.data.packing=true.",
    )
    flags.DEFINE_integer("max_instances_per_row", 3, "With --packing: most instances in one row.")
    flags.DEFINE_integer(
        "max_predictions_per_row",
        None,
        "With --packing: prediction slots per row (default: max_predictions_per_seq + max_instances_per_row).",
    )
    flags.DEFINE_integer("num_shards", 16, "Output shards; results depend on this and the seed only.")
    flags.DEFINE_integer("num_workers", os.cpu_count() or 1, "Local worker processes.")
    flags.DEFINE_bool(
        "overwrite",
        False,
        "Replace the record set already in --output_dir (its metadata.json and "
        ".tfrecord files); without it, prepare refuses a directory that holds one.",
    )
    flags.DEFINE_enum("runner", "local", ["local", "beam"], "local processes or Apache Beam.")
    flags.DEFINE_string("beam_runner", "DirectRunner", "Beam runner for --runner=beam.")
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
    flags.mark_flags_as_required(["input_file", "output_dir", "vocab_file"])


def main(argv):
    beam_args = [f"--runner={FLAGS.beam_runner}", *argv[1:]]
    if FLAGS.runner == "local" and len(argv) > 1:
        raise app.UsageError(f"unknown arguments {argv[1:]}")
    cfg = shards.PrepareConfig(
        input_file=FLAGS.input_file,
        output_dir=FLAGS.output_dir,
        vocab_file=FLAGS.vocab_file,
        do_lower_case=FLAGS.do_lower_case,
        random_seed=FLAGS.random_seed,
        num_shards=FLAGS.num_shards,
        tfds_data_dir=FLAGS.tfds_data_dir,
        skip_bad_json_lines=FLAGS.skip_bad_json_lines,
        text_field=table_corpus.resolve_text_field(
            FLAGS.text_field, FLAGS.tfds_text_feature, "--tfds_text_feature", "--text_field"
        ),
        instance=instances.InstanceConfig(
            max_seq_length=FLAGS.max_seq_length,
            max_predictions_per_seq=FLAGS.max_predictions_per_seq,
            masked_lm_prob=FLAGS.masked_lm_prob,
            short_seq_prob=FLAGS.short_seq_prob,
            dupe_factor=FLAGS.dupe_factor,
            do_whole_word_mask=FLAGS.do_whole_word_mask,
            next_sentence_prediction=not FLAGS.no_nsp,
        ),
        packing=packing.PackingConfig(
            FLAGS.max_seq_length,
            FLAGS.max_instances_per_row,
            packing.predictions_per_row(
                FLAGS.max_predictions_per_row or 0, FLAGS.max_predictions_per_seq, FLAGS.max_instances_per_row
            ),
        )
        if FLAGS.packing
        else None,
    )
    job = functools.partial(
        prepare.prepare,
        cfg,
        num_workers=FLAGS.num_workers,
        runner=FLAGS.runner,
        beam_args=beam_args,
        overwrite=FLAGS.overwrite,
    )
    # RuntimeError too: a worker that died (out of memory) or Beam missing is the machine's or the install's
    metadata = cli.run_job(argv, job, command="prepare", uses_jax=False, errors=(*cli.USER_ERRORS, RuntimeError))
    print(prepare.summary(metadata))


if __name__ == "__main__":
    define_flags()
    cli.run(main, known_only=True)  # flags it does not know pass through to Beam
