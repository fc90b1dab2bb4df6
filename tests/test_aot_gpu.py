"""Will it fit on GPUs: the job's train step compiled for NVIDIA GPUs that are not here, by jax's CUDA plugin
(the test extra installs it without any CUDA library), as a TPU topology is compiled by libtpu."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

import train_setup
from test_aot import assert_memory_adds_up, state_bytes_unsharded
from bertjax.config.schema import JobConfig
from bertjax.training import aot
from bertjax.runtime import gpu_targets

TINY = str(train_setup.ROOT / "configs" / "tiny.py")


def test_the_cli_compiles_for_gpus_without_one_and_the_cuda_plugin_stays_quiet(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}  # as a user's shell: the CLI quiets it
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bertjax.main",
            f"--config={TINY}",
            f"--workdir={tmp_path / 'work'}",
            "--compile_only",
            "--topology=h100:2",
            "--config.model.dtype=bfloat16",
            "--config.train.global_batch_size=16",
            "--config.data.max_seq_length=64",
        ],
        capture_output=True,
        text=True,
        cwd=train_setup.ROOT,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "plugin configuration error" not in done.stderr
    report = json.loads((tmp_path / "work" / aot.REPORT_FILE).read_text())
    assert report["chip"] == "h100" and report["device_kind"] == "NVIDIA H100 80GB HBM3"
    assert report["num_devices"] == 2 and report["mesh"] == {"data": 2, "fsdp": 1, "tensor": 1}
    # What JAX's allocator takes of the H100 (75% by default), all the program may use.
    assert report["hbm_bytes_per_device"] == int(0.75 * gpu_targets.GPUS["h100"].memory_bytes) and report["fits"]
    assert report["dtype"] == "bfloat16" and report["temp_bytes"] > 0
    assert_memory_adds_up(report)
    # The GPU's own defaults: attention auto is xla while the attention dropout is on (cuDNN has none).
    assert report["attention"] == "xla"
    assert "h100 memory JAX may use" in done.stderr and "fits" in done.stderr


def test_gpus_on_two_hosts_shard_the_state(tmp_path):
    job = JobConfig.from_configdict(
        train_setup.small_config(
            **{
                "model.num_hidden_layers": 2,
                "model.dtype": "bfloat16",
                "mesh.shape": (1, 4, 1),
                "train.global_batch_size": 16,
            }
        )
    )
    report = aot.compile_for_topology(job, str(tmp_path), "a100:2x2")
    assert report["num_devices"] == 4 and report["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}
    assert report["device_kind"] == "NVIDIA A100-SXM4-80GB" and report["fits"]
    assert report["state_bytes"] < state_bytes_unsharded(job) / (0.6 * 4)  # fsdp over the four GPUs


def _cudnn_installed() -> bool:
    """cuDNN's library as pip installs it (nvidia-cudnn-cu12/13, with bertjax[cuda13])."""
    try:
        return importlib.util.find_spec("nvidia.cudnn") is not None
    except ModuleNotFoundError:  # no nvidia package at all
        return False


def test_cudnn_attention_without_cudnns_library_is_one_sentence(tmp_path):
    """The test extra's plugin has no CUDA libraries; cuDNN attention needs cuDNN's to be compiled."""
    if _cudnn_installed():
        pytest.skip("cuDNN's library is installed here: cudnn attention compiles")
    job = JobConfig.from_configdict(
        train_setup.small_config(
            **{"model.attention": "cudnn", "model.attention_probs_dropout_prob": 0.0, "model.dtype": "bfloat16"}
        )
    )
    with pytest.raises(ValueError) as error:
        aot.compile_for_topology(job, str(tmp_path), "h100:1")
    assert "cuDNN attention compiles with cuDNN's library, which is not installed" in str(error.value)
    assert "--config.model.attention=xla" in str(error.value) and "\n" not in str(error.value)


def test_a_step_too_big_for_the_gpu_is_refused_with_its_memory(tmp_path):
    # An 8M-token vocab at width 1024: 8G parameters, 92 GiB of state with Adam's two moments, on an 80 GB H100.
    job = JobConfig.from_configdict(
        train_setup.small_config(
            **{"model.vocab_size": 8_000_000, "model.hidden_size": 1024, "train.global_batch_size": 4}
        )
    )
    with pytest.raises(aot.DoesNotFit) as error:
        aot.compile_for_topology(job, str(tmp_path), "h100:1")
    assert "h100 chip has 59 GiB" in str(error.value) and "\n" not in str(error.value)
    report = json.loads((tmp_path / aot.REPORT_FILE).read_text())
    assert report["fits"] is False and report["state_bytes"] > 90 * 2**30


@pytest.mark.parametrize("chip", sorted(gpu_targets.GPUS))
def test_each_gpu_description_is_one_xla_compiles_for(chip, monkeypatch, tmp_path):
    gpu = gpu_targets.GPUS[chip]
    monkeypatch.setenv("BERTJAX_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0")
    name, count, devices = aot.topology_devices(f"{chip}:2x4")
    # The XLA flags a job adds on NVIDIA GPUs (cuDNN's LayerNorm...): the program compiled is the one run there.
    assert "--xla_gpu_enable_cudnn_layer_norm=true" in os.environ["XLA_FLAGS"].split()
    assert (name, count, len(devices)) == (chip, 8, 8)
    assert {d.device_kind for d in devices} == {gpu.name} and {d.platform for d in devices} == {"gpu"}
    assert f"device_memory_size: {gpu.memory_bytes}" in gpu.target_config()


def test_without_the_cuda_plugin_the_sentence_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_targets, "cuda_plugin_installed", lambda: False)
    job = JobConfig.from_configdict(train_setup.small_config())
    with pytest.raises(ValueError) as error:
        aot.compile_for_topology(job, str(tmp_path), "h200:8")
    assert "compiles with jax's CUDA plugin, which is not installed" in str(error.value)
    assert "pip install 'jax[cuda13-local]'" in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("fraction", ["lots", "0", "1.5"])
def test_a_bad_memory_fraction_is_one_sentence_before_anything_compiles(tmp_path, monkeypatch, fraction):
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", fraction)
    job = JobConfig.from_configdict(train_setup.small_config())
    with pytest.raises(ValueError) as error:
        aot.compile_for_topology(job, str(tmp_path), "h100:1")
    assert f"XLA_PYTHON_CLIENT_MEM_FRACTION={fraction!r} is not a share of the GPU's memory" in str(error.value)
    assert "\n" not in str(error.value) and not (tmp_path / aot.REPORT_FILE).exists()
