"""`python -m bertjax.glue --config=configs/glue.py --workdir=DIR --config.init_from=PATH
--config.data_dir=GLUE_DIR`: the GLUE suite — every task fine-tuned as the BERT paper did (learning rate
chosen on dev, restarts for the small tasks), DIR/glue.json and DIR/glue.md with the GLUE paper's metrics and
the GLUE score, DIR/submission/ with the files the GLUE server takes.

The job is `bertjax.jobs.glue.run_suite`; this command holds its flags. Rerun the same command after a kill:
finished runs are skipped and the unfinished one resumes from its checkpoint.
"""

from bertjax.runtime import tcmalloc

if __name__ == "__main__":
    tcmalloc.reexec_under_tcmalloc()  # as bertjax.finetune does

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from bertjax import cli  # noqa: E402


def define_flags() -> None:
    """The command's flags; defined only when run as a program, so importing this module defines none."""
    config_flags.DEFINE_config_file("config", None, "Config file: configs/glue.py.", lock_config=True)
    flags.DEFINE_string(
        "workdir",
        None,
        "Directory for the suite: one fine-tuning workdir per task and run, "
        "glue.json, glue.md and submission/; a rerun continues where it stopped.",
    )
    flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    from bertjax.jobs import glue

    cli.run_job(argv, glue.run_suite, flags.FLAGS.config, flags.FLAGS.workdir)


if __name__ == "__main__":
    define_flags()
    cli.run(main)
