"""Prints a model's size, memory and cost, then runs one real forward pass.

    python -m bertjax.summary --config=configs/large.py [--batch_size=2]

Use it before launching a job; the report is `bertjax.jobs.summary.print_report`.
"""

from absl import flags
from ml_collections import config_flags

from bertjax import cli

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Defined only when run as a program, so that importing this module defines no flags."""
    config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/tiny.py.", lock_config=True)
    flags.DEFINE_integer("batch_size", 2, "Sequences in the forward pass.")
    flags.mark_flag_as_required("config")


def main(argv):
    from bertjax.jobs import summary

    cli.run_job(argv, summary.print_report, FLAGS.config, FLAGS.batch_size)


if __name__ == "__main__":
    define_flags()
    cli.run(main)
