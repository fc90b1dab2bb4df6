"""The pre-training job: `python -m bertjax.main --config=configs/large.py --workdir=DIR`.

A thin shell: flags, `jax.distributed.initialize()` for multi-process runs, then
`train.train_and_evaluate`. Override any config field on the command line, e.g.
`--config.train.global_batch_size=512 --config.mesh.shape='(-1,4,1)'`.
"""

from bertjax.runtime import tcmalloc

if __name__ == "__main__":
    tcmalloc.reexec_under_tcmalloc()  # before JAX is imported: the re-executed process starts clean

import logging  # noqa: E402

import jax  # noqa: E402
from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from bertjax.training import aot  # noqa: E402  (jax and the standard library only: safe before jax.distributed)
from bertjax import cli  # noqa: E402
from bertjax.runtime import distributed  # noqa: E402

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The job's flags; defined only when run as a program, so importing this module defines none."""
    config_flags.DEFINE_config_file(
        "config", None, "Config file, e.g. configs/large.py or configs/large.py:phase=2.", lock_config=True
    )
    flags.DEFINE_string(
        "workdir",
        None,
        "Directory for checkpoints, metrics.jsonl and TensorBoard events; a "
        "workdir with checkpoints resumes from the latest.",
    )
    flags.DEFINE_bool(
        "compile_only", False, "Build the state, compile the train step, log its memory analysis and stop."
    )
    flags.DEFINE_string(
        "topology",
        None,
        "With --compile_only: compile for this TPU topology (e.g. v5e:16x16) or these NVIDIA GPUs (h100:8, one "
        "host; h200:2x8, two) on a machine without them and without data, and write WORKDIR/compile_report.json "
        "(needs libtpu: pip install 'bertjax[tpu]'; for GPUs jax's CUDA plugin: pip install 'jax[cuda13-local]').",
    )
    distributed.define_flags()
    flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    cli.run_job(argv, _pretrain)  # the prologue first: no backend may start before jax.distributed


def _pretrain() -> None:
    if FLAGS.topology:
        return _compile_for_topology()
    distributed.initialize()
    from bertjax.jobs import main as pretraining  # after distributed initialisation: nothing touches devices before

    if not tcmalloc.active() and jax.default_backend() == "cpu":
        logging.getLogger("bertjax").info(
            "setup: system malloc; with tcmalloc installed (libtcmalloc-minimal4) "
            "BERT-base CPU steps run 20–40% faster (see bertjax/runtime/tcmalloc.py)"
        )
    pretraining.train_and_evaluate(FLAGS.config, FLAGS.workdir, compile_only=FLAGS.compile_only)


def _compile_for_topology() -> None:
    """--compile_only --topology: one process, no devices of this machine, no data."""
    if not FLAGS.compile_only:
        raise app.UsageError("--topology compiles for a TPU topology or GPUs without running: add --compile_only.")
    from bertjax.config.schema import JobConfig

    aot.compile_for_topology(JobConfig.from_configdict(FLAGS.config), FLAGS.workdir, FLAGS.topology)


if __name__ == "__main__":
    define_flags()
    cli.run(main)
