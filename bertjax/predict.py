"""What a fine-tuned workdir says about new inputs (the work is `bertjax.jobs.predict.predict_file`).

    python -m bertjax.predict --workdir=FINETUNED_DIR --input_file=F --output_file=OUT.jsonl

writes one JSON object per input: sequence_classification a label and its probability (or a score),
token_classification a tag per word and the entities they make, question_answering an answer cut from
the context. Inputs: what the task trains on, without labels (TSV/CSV/JSONL with `text` or `text_a`,
`text_b`; CoNLL or whitespace-tokenised lines; SQuAD JSON), or a .txt file of one text per line (`a ||| b`
for a pair, as google-research/bert's extract_features.py).
"""

from absl import flags

from bertjax import cli


def define_flags() -> None:
    """The command's flags; defined only when run as a program, so importing this module defines none."""
    flags.DEFINE_string("workdir", None, "A fine-tuned run's workdir (python -m bertjax.finetune).")
    flags.DEFINE_string("input_file", None, "Inputs: the task's file format without labels, or .txt lines.")
    flags.DEFINE_string("output_file", None, "JSONL predictions, one line per input.")
    flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
    flags.DEFINE_integer("batch_size", 32, "Rows per forward pass.")
    flags.mark_flags_as_required(["workdir", "input_file", "output_file"])


def main(argv):
    from bertjax.jobs import predict

    FLAGS = flags.FLAGS
    count = cli.run_job(
        argv,
        predict.predict_file,
        FLAGS.workdir,
        FLAGS.input_file,
        FLAGS.output_file,
        FLAGS.step,
        FLAGS.batch_size,
        command="predict",
    )
    print(f"wrote {count} predictions to {FLAGS.output_file}")


if __name__ == "__main__":
    define_flags()
    cli.run(main)
