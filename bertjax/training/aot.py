"""Will it fit? The job's train step compiled for a TPU topology or for GPUs, on a machine without them.

    python -m bertjax.main --config=configs/large.py --workdir=DIR --compile_only --topology=v5e:16x16
    python -m bertjax.main --config=configs/large.py --workdir=DIR --compile_only --topology=h100:8   # 2x8: 2 hosts

MaxText's train_compile.py, for BERT: libtpu (`pip install 'bertjax[tpu]'`) describes the devices of a
topology that is not present (`jax.experimental.topologies.get_topology_desc`), and the job's own
trainer (`trainer.setup`: the config's mesh, logical-axis rules, attention, remat, micro-batches, dtype,
global batch and record shapes) lowers and compiles the real program for them. Nothing reads data. The
compiled program's memory and cost analyses say what one device needs; a program that cannot fit fails
inside libtpu's compiler, which says by how much. Either way the answer is DIR/compile_report.json.
NVIDIA GPUs (a100, h100, h200: gpu_targets.py) compile the same way with jax's CUDA plugin and no GPU; XLA:GPU
compiles a program of any size, and the report says whether it fits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import importlib.util
import json
import logging
import math
import os
import re
from typing import TYPE_CHECKING, Any, Sequence

import jax

from bertjax.runtime import xla_flags
from bertjax.runtime import gpu_targets

if TYPE_CHECKING:
    from bertjax.config.schema import JobConfig

log = logging.getLogger(__name__)
GIB = 2**30
REPORT_FILE = "compile_report.json"


@dataclasses.dataclass(frozen=True)
class Chip:
    hbm_gib: float  # HBM per chip
    source: str  # where the figure comes from
    chip_config: str = ""  # libtpu's chip config: "megacore" = one JAX device per chip, as on a TPU VM


# HBM per chip from Google's Cloud TPU system-architecture pages (as of 2026). v4 and v5p chips have two
# TensorCores that JAX on a TPU VM drives as one megacore device; libtpu's topology descriptions default
# to one device per core for v4, so v4 asks for megacore (MaxText's train_compile.py does the same).
CHIPS = {
    "v4": Chip(32, "https://cloud.google.com/tpu/docs/v4 (32 GiB HBM2 per chip)", "megacore"),
    "v5e": Chip(16, "https://cloud.google.com/tpu/docs/v5e (16 GiB HBM2 per chip)"),
    "v5p": Chip(95, "https://cloud.google.com/tpu/docs/v5p (95 GiB HBM2e per chip)"),
    "v6e": Chip(32, "https://cloud.google.com/tpu/docs/v6e (32 GiB HBM per chip)"),
}
EXAMPLES = ("v4:2x2x1", "v4:4x4x4", "v5e:2x2", "v5e:4x4", "v5e:16x16", "v5p:2x2x1", "v6e:2x4", "v6e:16x16")
GPU_EXAMPLES = ("h100:1", "h100:8", "h200:2x8", "a100:8")
_TOPOLOGY = re.compile(r"(?P<chip>[a-z0-9]+):(?P<shape>\d+(x\d+){0,2})")
# libtpu's compiler refuses a program that cannot fit, in one of two sentences (amounts like 112.62G):
_SIZE = r"([\d.]+)([KMGT]?)"
_TEMPORARIES_TOO_BIG = re.compile(rf"required for HLO temporaries \({_SIZE}\) exceeds available HBM \({_SIZE}\)")
_USED_TOO_MUCH = re.compile(rf"Used {_SIZE} of {_SIZE} hbm")


class DoesNotFit(ValueError):
    """The compiled step needs more memory per device than the chip has (the report is written)."""


def _valid_topologies() -> str:
    return (
        f"CHIP:SHAPE with CHIP one of {', '.join(CHIPS)} and SHAPE its chips per dimension, e.g. {', '.join(EXAMPLES)}; "
        f"or GPU:[HOSTSx]GPUS with GPU one of {', '.join(gpu_targets.GPUS)}, e.g. {', '.join(GPU_EXAMPLES)}"
    )


def no_tpu_here() -> bool:
    """True on a machine without TPU chips (no /dev/accel*, no /dev/vfio/N: what libtpu opens)."""
    return not (glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def quiet_libtpu() -> None:
    """Before libtpu loads on a machine without TPUs: compiling for a topology touches no chip, so
    several processes may do it at once (libtpu otherwise holds /tmp/libtpu_lockfile), and libtpu need
    not look for TPU worker hosts or host bounds (it warns that it found none: a CPU job with the `tpu`
    extra installed would start with that warning). Never set on a real TPU VM."""
    if no_tpu_here():
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
        os.environ.setdefault("TPU_HOST_BOUNDS", "1,1,1")


def topology_devices(name: str) -> tuple[str, int, Sequence[jax.Device]]:
    """(chip, number of chips, devices) of a TPU topology such as v5e:16x16 or of GPUs such as h100:8 (one
    host) or h100:2x8 (two hosts of 8); one clear ValueError for a bad name."""
    match = _TOPOLOGY.fullmatch(name.strip().lower())
    if match and match["chip"] in gpu_targets.GPUS:
        return _gpu_devices(name, match["chip"], match["shape"])
    if not match or match["chip"] not in CHIPS or "x" not in match["shape"]:
        raise ValueError(f"--topology={name!r} is not a topology bertjax knows; use {_valid_topologies()}.")
    if importlib.util.find_spec("libtpu") is None:  # the compiler for TPU programs
        raise ValueError(
            "--topology compiles with libtpu, which is not installed; install it with "
            "`pip install 'bertjax[tpu]'` (jax[tpu] at the installed jax's version)."
        )
    from jax.experimental import topologies

    try:
        options = {"chip_config_name": CHIPS[match["chip"]].chip_config} if CHIPS[match["chip"]].chip_config else {}
        devices = topologies.get_topology_desc(topology_name=match.group(0), platform="tpu", **options).devices
    except jax.errors.JaxRuntimeError as e:
        reason = str(e).splitlines()[0]
        raise ValueError(
            f"--topology={name!r}: libtpu cannot lay it out ({reason}); use {_valid_topologies()}."
        ) from None
    return match["chip"], math.prod(int(n) for n in match["shape"].split("x")), devices


def _gpu_devices(name: str, chip: str, shape: str) -> tuple[str, int, Sequence[jax.Device]]:
    sizes = [int(n) for n in shape.split("x")]
    if len(sizes) > 2 or min(sizes) < 1:
        raise ValueError(f"--topology={name!r}: GPUs are GPU:GPUS or GPU:HOSTSxGPUS; use {_valid_topologies()}.")
    hosts, per_host = sizes if len(sizes) == 2 else (1, sizes[0])
    if not gpu_targets.cuda_plugin_installed():  # the compiler for NVIDIA GPUs
        raise ValueError(
            f"--topology={name!r} compiles with jax's CUDA plugin, which is not installed; install it with "
            "`pip install 'jax[cuda13-local]'` (the compiler alone, at the installed jax's version) or "
            "`pip install 'bertjax[cuda13]'`."
        )
    gpu_targets.memory_fraction()  # jax's CUDA plugin does not start with a bad one: say so first
    # Before this process's backends start: the XLA flags a job adds on NVIDIA GPUs (runtime/xla_flags.py), so the
    # program compiled is the one it would run there; this machine's own devices stay its own, the plugin quiet.
    xla_flags.apply_gpu_defaults(for_gpu=True)
    gpu_targets.quiet_cuda_plugin(tpu_here=not no_tpu_here())
    from jax.experimental import topologies

    try:
        devices = topologies.get_topology_desc(
            platform="cuda", target_config=gpu_targets.GPUS[chip].target_config(), topology=f"1x{hosts}x{per_host}"
        ).devices
    except NotImplementedError:  # the plugin is installed but did not register (its own error is logged above)
        raise ValueError(
            f"--topology={name!r}: jax's CUDA plugin is installed but did not start (its error is logged above); "
            "reinstall it at the installed jax's version: `pip install -U 'jax[cuda13-local]'`."
        ) from None
    return chip, hosts * per_host, devices


@contextlib.contextmanager
def _cudnn_library_needed(topology: str):
    """jax's 'cuDNN not found' (a plugin without CUDA libraries, compiling cuDNN attention) as one sentence."""
    try:
        yield
    except RuntimeError as e:
        if isinstance(e, jax.errors.JaxRuntimeError) or not re.search(r"cudnn.*not (found|detected)", str(e), re.I):
            raise
        raise ValueError(
            f"--topology={topology}: cuDNN attention compiles with cuDNN's library, which is not installed "
            f"({str(e).splitlines()[0]}); install it with `pip install 'bertjax[cuda13]'`, or compile with "
            "--config.model.attention=xla."
        ) from None


def _chip_facts(chip: str) -> tuple[int, str]:
    """(memory bytes per chip a program may use, where the figures come from). On a GPU, JAX's allocator takes
    XLA_PYTHON_CLIENT_MEM_FRACTION of the memory (0.75 unless set) and the program gets no more."""
    if chip in gpu_targets.GPUS:
        gpu, fraction = gpu_targets.GPUS[chip], gpu_targets.memory_fraction()
        return int(gpu.memory_bytes * fraction), f"{gpu.source}; JAX's share: XLA_PYTHON_CLIENT_MEM_FRACTION={fraction}"
    return int(CHIPS[chip].hbm_gib * GIB), CHIPS[chip].source


def _bytes(amount: str, unit: str) -> int:
    return int(float(amount) * 1024 ** ("KMGT".index(unit) + 1 if unit else 0))


def _out_of_memory(message: str, state_bytes: int, batch_bytes: int) -> dict[str, Any] | None:
    """The report's memory fields from libtpu's out-of-memory error, or None for any other error.

    The state and batch are the arguments (the state aliased with the outputs); libtpu names either the
    temporaries alone or the total it needed."""
    arguments = state_bytes + batch_bytes
    if match := _TEMPORARIES_TOO_BIG.search(message):
        temp, available = _bytes(*match.group(1, 2)), _bytes(*match.group(3, 4))
        total = arguments + temp
    elif match := _USED_TOO_MUCH.search(message):
        total, available = _bytes(*match.group(1, 2)), _bytes(*match.group(3, 4))
        temp = max(total - arguments, 0)
    else:
        return None
    return dict(
        argument_bytes=arguments,
        output_bytes=state_bytes,
        alias_bytes=state_bytes,
        temp_bytes=temp,
        code_bytes=0,
        total_bytes=total,
        compiler_available_bytes=available,
        compiler_message=message.strip().splitlines()[0][:500],
    )


def compile_for_topology(job: "JobConfig", workdir: str, topology: str) -> dict[str, Any]:
    """Compiles the job's train step for `topology`, writes workdir/compile_report.json, logs the figures.

    Returns the report when the step fits; raises DoesNotFit (one sentence naming the chip, the bytes
    needed and available, and the knobs) after writing the report when it does not."""
    # Imported here: main.py imports this module for quiet_libtpu before jax.distributed may start.
    from bertjax.training import metrics as metrics_lib
    from bertjax.training import sharding as sharding_lib
    from bertjax.training import trainer as trainer_lib

    chip, chips, devices = topology_devices(topology)
    chip_bytes, chip_source = _chip_facts(chip)
    hbm = int(chip_bytes * chips / len(devices))  # per device (a chip's share)
    if job.data.corpus and not job.data.vocab_file:  # the data stage would train a vocab of this size
        job = job.replace(model={"vocab_size": job.data.corpus_vocab_size})
    log.info(
        "aot: compiling %s's train step for %s (%d devices, %s), without them and without data",
        job.model.size,
        topology,
        len(devices),
        devices[0].device_kind,
    )
    with _cudnn_library_needed(topology):  # cuDNN attention asks cuDNN's version as it traces
        trainer = trainer_lib.setup(job, devices, compile=False)
    mesh = dict(trainer.mesh.shape)
    log.info(
        "aot: mesh %s, global batch %d × seq %d, %s, attention %s, remat %s, micro-batches %d",
        mesh,
        job.train.global_batch_size,
        job.data.max_seq_length,
        job.model.dtype,
        trainer.model.attention,
        job.model.remat_policy,
        job.train.micro_batches,
    )
    # What the state and batch alone take per device: known before compiling, and the floor of any plan.
    state_bytes = sharding_lib.per_device_bytes(trainer.abstract_state)
    batch_bytes = sharding_lib.per_device_bytes(trainer.batch_abstract)
    report: dict[str, Any] = dict(
        topology=topology,
        chip=chip,
        device_kind=devices[0].device_kind,
        num_devices=len(devices),
        mesh=mesh,
        hbm_bytes_per_device=hbm,
        hbm_source=chip_source,
        global_batch_size=job.train.global_batch_size,
        max_seq_length=job.data.max_seq_length,
        micro_batches=job.train.micro_batches,
        remat_policy=job.model.remat_policy,
        dtype=job.model.dtype,
        attention=trainer.model.attention,
        packing=job.data.packing,
        state_bytes=state_bytes,
    )
    try:
        with _cudnn_library_needed(topology):
            compiled = trainer.compile_step(gpu_targets.COMPILER_OPTIONS if chip in gpu_targets.GPUS else None)
    except jax.errors.JaxRuntimeError as e:
        memory = _out_of_memory(str(e), state_bytes, batch_bytes) if "RESOURCE_EXHAUSTED" in str(e) else None
        if memory is None:
            raise
        report.update(memory, fits=False, flops_per_device=None, flops_per_step=None)
    else:
        mem = trainer_lib.memory_bytes(compiled)
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        flops_per_device = float(cost.get("flops", 0.0)) if cost else None
        if flops_per_device is not None:  # XLA counts the micro-batch loop's body once; it runs k times
            flops_per_device *= job.train.micro_batches
        report.update(
            {f"{k}_bytes": v for k, v in mem.items()},
            fits=mem["total"] <= hbm,
            flops_per_device=flops_per_device,
            flops_per_step=None if flops_per_device is None else flops_per_device * len(devices),
        )
    model_flops = (
        metrics_lib.flops_per_sequence(job.model.architecture, job.data.max_seq_length, job.data.record_predictions)
        * job.train.global_batch_size
    )
    report["model_flops_per_step"] = model_flops
    if trainer.model.attention == "splash":  # XLA's count does not see inside the kernel: the blocks it computes
        report.update(splash_score_share(job.model.architecture, job.data.max_seq_length))
    report["model_flops_share"] = model_flops / report["flops_per_step"] if report["flops_per_step"] else None
    _log(report)
    if jax.process_index() == 0:
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, REPORT_FILE), "w") as f:
            json.dump(report, f, indent=2)
        log.info("aot: wrote %s", os.path.join(workdir, REPORT_FILE))
    if not report["fits"]:
        raise DoesNotFit(
            f"The train step needs {report['total_bytes'] / GIB:.2f} GiB per device but a {chip} chip has "
            f"{hbm / GIB:.0f} GiB{_for_jax(chip)} (mesh {mesh}, batch {job.train.global_batch_size} × "
            f"{job.data.max_seq_length}); "
            f"shard the state over a larger fsdp axis (--config.mesh.shape='(-1,N,1)'), recompute activations "
            f"(--config.model.remat_policy=full or dots), split the step into micro-batches "
            f"(--config.train.micro_batches=K), or lower --config.train.global_batch_size."
        )
    return report


def _for_jax(chip: str) -> str:
    """On a GPU, where the limit comes from: the share of its memory JAX's allocator takes."""
    if chip not in gpu_targets.GPUS:
        return ""
    fraction = gpu_targets.memory_fraction()
    return (
        f" for JAX (XLA_PYTHON_CLIENT_MEM_FRACTION={fraction} of its memory: raise it, e.g. to 0.9, to give JAX more)"
    )


def splash_score_share(architecture: Any, seq_len: int) -> dict[str, Any]:
    """The attention scores splash computes, as a share of every layer attending globally: per layer, the
    blocks its mask leaves (a sliding window skips the blocks wholly outside it) times the block's area."""
    from bertjax.models import attention as attention_lib

    shares = []
    for window in architecture.layer_windows():
        computed, total = attention_lib.splash_blocks_computed(seq_len, window)
        shares.append(computed / total)
    return {"splash_score_share": sum(shares) / len(shares), "splash_score_share_per_layer": shares}


def _log(report: dict[str, Any]) -> None:
    hbm = report["hbm_bytes_per_device"]
    rows = [
        ("arguments (state + batch)", report["argument_bytes"]),
        ("outputs (aliased with arguments: %.2f GiB)" % (report["alias_bytes"] / GIB), report["output_bytes"]),
        ("temporaries (activations, gradients)", report["temp_bytes"]),
        ("generated code", report["code_bytes"]),
        ("total (donated state counted once)", report["total_bytes"]),
    ]
    lines = [f"  {name:<44} {value / GIB:9.3f} GiB" for name, value in rows]
    limit = report["chip"] + (" memory JAX may use" if report["chip"] in gpu_targets.GPUS else " HBM per chip")
    lines.append(
        f"  {limit:<44} {hbm / GIB:9.3f} GiB  → "
        f"{'fits' if report['fits'] else 'DOES NOT FIT'} ({100 * report['total_bytes'] / hbm:.0f}%)"
    )
    log.info("aot: per device on %s:\n%s", report["topology"], "\n".join(lines))
    if "splash_score_share" in report:
        log.info(
            "aot: splash computes %.1f%% of the attention scores every layer attending globally would (XLA's "
            "FLOPs count cannot see inside the kernel)",
            100 * report["splash_score_share"],
        )
    if report["flops_per_step"]:
        log.info(
            "aot: %.3g FLOPs per step (%.3g per device); model FLOPs %.3g: %.0f%% of the compiled FLOPs are "
            "the model's (the rest: remat recomputation, softmax, norms, optimizer)",
            report["flops_per_step"],
            report["flops_per_device"],
            report["model_flops_per_step"],
            100 * report["model_flops_share"],
        )
