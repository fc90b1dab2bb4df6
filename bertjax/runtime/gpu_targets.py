"""NVIDIA GPUs that are not here, described to XLA: what `--compile_only --topology=h100:8` compiles for.

XLA:GPU compiles for a device it is told about (a `GpuTargetConfigProto`: cores, memory, bandwidth, compute
capability, cuDNN version) as well as for one it finds, so jax's CUDA plugin (`pip install 'bertjax[cuda13]'`, or
only `jax[cuda13-local]`: the compiler, no CUDA libraries) lays out a topology of GPUs on a machine with none
(`jax.experimental.topologies.get_topology_desc(platform="cuda", target_config=...)`). The figures are XLA's own
device specs (xla/backends/gpu/target_config/specs in openxla/xla) and NVIDIA's data sheets.

Without a device nothing can be autotuned, so matmuls compile as cuBLAS calls rather than Triton GEMM fusions
(COMPILER_OPTIONS: XLA cannot tile some dots into Triton GEMMs untuned): the same program and buffers; a real
GPU may fuse a few small matmuls differently.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os

# For a compile without the device: no Triton GEMM fusions, whose tiles XLA would autotune on it (untuned, it
# fails to tile some of BERT's dots).
COMPILER_OPTIONS = {"xla_gpu_enable_triton_gemm": False}


@dataclasses.dataclass(frozen=True)
class Gpu:
    name: str  # what the device calls itself (device_kind)
    memory_bytes: int  # what the device reports (XLA's spec)
    compute_capability: int  # major
    cores: int  # streaming multiprocessors
    fpus_per_core: int
    memory_bandwidth: float  # bytes/s
    l2_bytes: int
    clock_ghz: float
    shared_memory_per_core: int
    shared_memory_per_block_optin: int
    source: str

    def target_config(self) -> str:
        """The GpuTargetConfigProto, in text format, that XLA compiles for."""
        return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: {self.shared_memory_per_core}
  threads_per_core_limit: 2048
  core_count: {self.cores}
  fpus_per_core: {self.fpus_per_core}
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {int(self.memory_bandwidth)}
  l2_cache_size: {self.l2_bytes}
  clock_rate_ghz: {self.clock_ghz}
  device_memory_size: {self.memory_bytes}
  shared_memory_per_block_optin: {self.shared_memory_per_block_optin}
  cuda_compute_capability {{ major: {self.compute_capability} }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 10 }}
runtime_version {{ major: 13 minor: 0 }}
device_description_str: "{self.name}"
"""


GPUS = {
    "a100": Gpu(
        "NVIDIA A100-SXM4-80GB", 85100068864, 8, 108, 64, 2.039e12, 40 * 2**20, 1.41, 167936, 166912,
        "XLA's a100_sxm_80 spec; NVIDIA A100 data sheet (80 GB HBM2e, 2.0 TB/s)",
    ),
    "h100": Gpu(
        "NVIDIA H100 80GB HBM3", 84942979072, 9, 132, 128, 3.35232e12, 50 * 2**20, 1.98, 233472, 232448,
        "XLA's h100_sxm spec; NVIDIA H100 SXM data sheet (80 GB HBM3, 3.35 TB/s)",
    ),
    "h200": Gpu(
        "NVIDIA H200", 151397597184, 9, 132, 128, 4.8e12, 50 * 2**20, 1.98, 233472, 232448,
        "XLA's h200 spec; NVIDIA H200 SXM data sheet (141 GB HBM3e, 4.8 TB/s)",
    ),
}  # fmt: skip


def memory_fraction() -> float:
    """The share of a GPU's memory JAX's allocator takes (XLA_PYTHON_CLIENT_MEM_FRACTION; JAX's default 0.75):
    all a program can use. XLA_PYTHON_CLIENT_PREALLOCATE=false grows into the same limit."""
    raw = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.75")
    try:
        fraction = float(raw)
    except ValueError:
        fraction = -1.0
    if not 0 < fraction <= 1:
        raise ValueError(
            f"XLA_PYTHON_CLIENT_MEM_FRACTION={raw!r} is not a share of the GPU's memory; set it to a number in (0, 1] "
            "such as 0.9, or unset it (JAX's default: 0.75)."
        )
    return fraction


def gpu_here() -> bool:
    """True on a machine with an NVIDIA GPU (its driver's device files)."""
    return bool(glob.glob("/dev/nvidia[0-9]*"))


def cuda_plugin_installed() -> bool:
    return any(importlib.util.find_spec(f"jax_cuda{v}_plugin") for v in (12, 13))


def quiet_cuda_plugin(tpu_here: bool) -> None:
    """Before any JAX backend starts: on a machine without NVIDIA GPUs, jax's CUDA plugin (installed for
    `--topology=h100:8`, or by `bertjax[cuda13]`) is not started, here nor in the processes this one starts;
    it would fail without a driver and log a traceback. It still compiles for GPUs that are not here. A set
    JAX_PLATFORMS wins. `tpu_here`: this machine's TPUs stay its devices (aot.no_tpu_here says)."""
    if gpu_here() or not cuda_plugin_installed() or os.environ.get("JAX_PLATFORMS"):
        return
    import jax

    if not jax.config.jax_platforms:
        jax.config.update("jax_platforms", "tpu,cpu" if tpu_here else "cpu")
    os.environ["JAX_PLATFORMS"] = jax.config.jax_platforms
