"""launch/colab.ipynb, executed headless on CPU as CI runs it: a Jupyter kernel on this interpreter (the
venv's), the notebook's own cells from the repository checkout it sits in, shrunk by overriding its
parameters cell (papermill-style: an "injected-parameters" cell after the "parameters" one)."""

import json
import os
import pathlib
import sys

import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

import train_setup

NOTEBOOK = train_setup.ROOT / "launch" / "colab.ipynb"


def parameters_index(nb) -> int:
    tagged = [i for i, cell in enumerate(nb.cells) if "parameters" in cell.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, f"{NOTEBOOK} should have one cell tagged 'parameters', not {len(tagged)}"
    return tagged[0]


def outputs_text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            parts.append(out["text"])
        elif "data" in out:
            parts.append(out["data"].get("text/plain", ""))
        elif out["output_type"] == "error":
            parts.append("\n".join(out["traceback"]))
    return "".join(parts)


def test_committed_notebook_has_no_outputs_and_one_parameters_cell():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, "clear the notebook's outputs before committing"
    params = nb.cells[parameters_index(nb)].source
    for name in ("BERTJAX_SOURCE", "STEPS", "WORKDIR", "EXTRA_FLAGS"):
        assert f"{name} = " in params, name


def venv_kernel(tmp_path: pathlib.Path) -> AsyncKernelManager:
    """A kernel on this very interpreter, from a kernelspec of our own: no kernelspec installed on the
    machine (a system `python3` one, say) can substitute another Python."""
    spec_dir = tmp_path / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "bertjax test venv",
                "language": "python",
            }
        )
    )
    specs = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])
    return AsyncKernelManager(kernel_name="python3", kernel_spec_manager=specs)


def test_notebook_pretrains_plots_predicts_and_exports_to_transformers(tmp_path):
    workdir = tmp_path / "work"
    nb = nbformat.read(NOTEBOOK, as_version=4)
    overrides = {
        "STEPS": 30,
        "WORKDIR": str(workdir),
        "EXTRA_FLAGS": [
            "--config.data.dupe_factor=1",
            "--config.data.heldout_dupe_factor=1",
            "--config.train.log_every_steps=10",
            "--config.eval.every_steps=20",
            "--config.checkpoint.every_steps=20",
        ],
    }
    source = "# Parameters injected by tests/test_colab.py\n" + "".join(
        f"{name} = {value!r}\n" for name, value in overrides.items()
    )
    source += "import sys\nprint('kernel python:', sys.executable, sys.prefix)\n"
    injected = nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]})
    nb.cells.insert(parameters_index(nb) + 1, injected)

    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        BERTJAX_NO_TCMALLOC="1",
        XLA_FLAGS=train_setup.job_xla_flags(1),
        IPYTHONDIR=str(tmp_path / "ipython"),
        PYDEVD_DISABLE_FILE_VALIDATION="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    env.pop("MPLBACKEND", None)  # the kernel's inline backend, so that plt.show() makes an image output
    client = NotebookClient(
        nb,
        timeout=600,
        km=venv_kernel(tmp_path),
        allow_errors=False,
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )  # Jupyter's cwd: launch/
    # Raises CellExecutionError, naming the cell, when any cell fails; the kernel is shut down either way.
    client.execute(env=env, cleanup_kc=True)

    text = {i: outputs_text(cell) for i, cell in enumerate(nb.cells)}
    everything = "\n".join(text.values())
    assert f"kernel python: {sys.executable} {sys.prefix}" in everything
    assert "runtime: CPU" in everything and "bertjax extra: none" in everything
    assert f"source: {train_setup.ROOT} (the checkout this notebook sits in)" in everything
    assert "is already installed from" in everything and "skipping the install" in everything

    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == [10, 20, 30]
    evals = [r for r in rows if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [20, 30]
    assert all(0 < r["mlm_accuracy_baseline"] < 0.5 and 0.5 <= r["nsp_accuracy_baseline"] < 1 for r in evals)
    assert "train step 30/30" in everything and "done: 30 steps" in everything

    plots = [
        i for i, cell in enumerate(nb.cells) for out in cell.get("outputs", []) if "image/png" in out.get("data", {})
    ]
    assert len(plots) == 1 and (workdir / "curves.png").stat().st_size > 10_000
    assert "held-out after 30 steps: MLM accuracy" in text[plots[0]]

    assert "Top-5 predictions for the masked words of held-out sequences" in everything
    assert everything.count("truth") >= 4
    assert "tokenizers agree on" in everything and ": True (" in everything
    assert "max |bertjax − transformers| on " in everything
    assert sorted(os.listdir(workdir / "hf")) == [
        ".bertjax.json",
        "config.json",
        "model.safetensors",
        "tokenizer_config.json",
        "vocab.txt",
    ]
    assert "transformers fills " in everything
