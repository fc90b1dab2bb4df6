"""`python -m bertjax.finetune --config=configs/finetune.py --workdir=DIR`: fine-tune a pre-trained BERT on a
labelled task (classification, NER, question answering), or sweep learning rates × seeds.

The job is `bertjax.jobs.finetune.finetune`; this command holds its flags. Settings are --config.* overrides
of configs/finetune.py, e.g. `--config.task=sequence_classification --config.train.init_from=PATH
--config.data.train_file=F --config.data.eval_file=F`.
"""

from bertjax.runtime import tcmalloc

if __name__ == "__main__":
    tcmalloc.reexec_under_tcmalloc()  # as bertjax.main does: XLA's per-step buffers stay mapped

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from bertjax import cli  # noqa: E402
from bertjax.runtime import distributed  # noqa: E402


def define_flags() -> None:
    """The command's flags; defined only when run as a program, so importing this module defines none."""
    config_flags.DEFINE_config_file("config", None, "Config file: configs/finetune.py.", lock_config=True)
    flags.DEFINE_string(
        "workdir",
        None,
        "Directory for checkpoints, metrics.jsonl, TensorBoard events and the "
        "held-out predictions; a workdir with checkpoints resumes from the latest.",
    )
    distributed.define_flags()  # several processes (a pod slice, SLURM, or by hand) fine-tune as one job
    flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    cli.run_job(argv, _finetune)  # the prologue first: no backend may start before jax.distributed


def _finetune() -> None:
    distributed.initialize()
    from bertjax.jobs import finetune  # after distributed initialisation: nothing touches devices before

    finetune.finetune(flags.FLAGS.config, flags.FLAGS.workdir)


if __name__ == "__main__":
    define_flags()
    cli.run(main)
