"""`make demo`'s last stage: fine-tune the checkpoint it just pre-trained, and the same model from random
initialisation, on a task built offline from the same text; print both dev scores.

    python -m bertjax.demo_finetune --config=configs/demo_finetune.py --pretrained=workdir/demo \\
        --workdir=workdir/demo/finetune

The task (bertjax/finetuning/pydocs_task.py) is written to WORKDIR/task as train.tsv / dev.tsv, its dev modules
checked against the pre-training run's own held-out file. Each run is bertjax.jobs.finetune.finetune with the
same settings; only config.train.init_from differs (the random run gets the pre-training run's
architecture and vocab from its config.json). Scores go to WORKDIR/{pretrained,random}[-seedN] and the
table to WORKDIR/scores.json.
"""

from bertjax.runtime import tcmalloc

if __name__ == "__main__":
    tcmalloc.reexec_under_tcmalloc()  # as bertjax.main does: XLA's per-step buffers stay mapped

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from bertjax import cli  # noqa: E402


def define_flags() -> None:
    """The command's flags; defined only when run as a program, so importing this module defines none."""
    config_flags.DEFINE_config_file("config", None, "Config file: configs/demo_finetune.py.", lock_config=True)
    flags.DEFINE_string("pretrained", None, "The pre-training workdir to fine-tune (make demo's workdir/demo).")
    flags.DEFINE_string("workdir", None, "Directory for the task files and the fine-tuning runs.")
    flags.mark_flags_as_required(["config", "pretrained", "workdir"])


def main(argv):
    from bertjax.jobs import demo_finetune

    cli.run_job(argv, demo_finetune.run, flags.FLAGS.config, flags.FLAGS.pretrained, flags.FLAGS.workdir)


if __name__ == "__main__":
    define_flags()
    cli.run(main)
