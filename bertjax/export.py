"""Export a training run as a Hugging Face directory: `python -m bertjax.export --workdir=DIR --output_dir=HF`.

A pre-training or fine-tuning workdir (the latest checkpoint, or --step) or a google-research/bert TF1
directory becomes config.json, model.safetensors and the vocab, which `transformers` loads as
BertForPreTraining or the fine-tuned task's class. The work is `bertjax.jobs.export.export`.
"""

from absl import flags

from bertjax import cli


def define_flags() -> None:
    """The CLI's flags; defined only when run as a program, so importing this module defines none."""
    flags.DEFINE_string(
        "workdir",
        None,
        "The training run's workdir (holding checkpoints/), or a "
        "google-research/bert TF1 directory (bert_config.json + bert_model.ckpt.*).",
    )
    flags.DEFINE_string("output_dir", None, "Directory for the Hugging Face files.")
    flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
    flags.mark_flags_as_required(["workdir", "output_dir"])


def main(argv):
    from bertjax.jobs import export

    FLAGS = flags.FLAGS
    cli.run_job(argv, export.export, FLAGS.workdir, FLAGS.output_dir, FLAGS.step, command="export")
    print(f"exported {FLAGS.workdir} to {FLAGS.output_dir}")


if __name__ == "__main__":
    define_flags()
    cli.run(main)
