"""Several processes as one job: the flags a multi-process command takes, and `jax.distributed.initialize()` when
they (or the machine) say so. The pre-training and fine-tuning commands share them, so both run on a pod slice, under
SLURM, or as processes started by hand (--coordinator_address, --num_processes, --process_id)."""

from __future__ import annotations

import os

from absl import app, flags


def define_flags() -> None:
    flags.DEFINE_string(
        "coordinator_address",
        None,
        "host:port of process 0, for multi-process runs outside TPU VMs and SLURM (where it is found automatically).",
    )
    flags.DEFINE_integer("num_processes", None, "Processes in a multi-process run.")
    flags.DEFINE_integer("process_id", None, "This process's index in a multi-process run.")
    flags.DEFINE_bool(
        "distributed",
        None,
        "Force (or, with --nodistributed, skip) jax.distributed.initialize(); "
        "by default it runs on TPU VMs, under SLURM and when --coordinator_address is given.",
    )


def multi_process(values: flags.FlagValues = flags.FLAGS) -> bool:
    if values.distributed is not None:
        return values.distributed
    if values.coordinator_address:
        return True
    if int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        return True
    return bool(os.environ.get("TPU_WORKER_HOSTNAMES", "").count(","))  # a multi-host TPU slice


def initialize(values: flags.FlagValues = flags.FLAGS) -> None:
    """jax.distributed.initialize() for a multi-process run (before anything touches a device); else nothing."""
    if not multi_process(values):
        return
    if values.coordinator_address and (values.num_processes is None or values.process_id is None):
        raise app.UsageError("--coordinator_address needs --num_processes and --process_id too.")
    import jax

    jax.distributed.initialize(
        coordinator_address=values.coordinator_address,
        num_processes=values.num_processes,
        process_id=values.process_id,
    )
