"""Every benchmark script stays runnable: each bertjax module and name it imports exists (at its top, inside its
functions, and in the programs it hands to a subprocess), each script imports, and the scripts no other test runs
make their smallest run where they have one. A module that moves breaks this file, not the figure a page cites
months later."""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys


import train_setup

ROOT = train_setup.ROOT
BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.glob("*.py"))


def _imports(tree: ast.AST) -> list[tuple[int, str, str | None]]:
    """(line, module, name or None) for each `bertjax` import, wherever it sits; programs given as string
    constants (`python -c` texts) are parsed too, their lines counted from the string's."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "bertjax":
            found += [(node.lineno, node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, None) for a in node.names if a.name.split(".")[0] == "bertjax"]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "import" in node.value:
            try:
                inner = ast.parse(node.value)
            except SyntaxError:
                continue
            found += [(node.lineno, module, name) for _, module, name in _imports(inner)]
    return found


def missing_imports(source: str) -> list[str]:
    """`line: module[.name]` for each bertjax import in `source` that does not resolve here."""
    missing = []
    for line, module, name in _imports(ast.parse(source)):
        try:
            target = importlib.import_module(module)
        except ImportError:
            missing.append(f"{line}: {module}")
            continue
        if name is not None and not hasattr(target, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{line}: {module}.{name}")
    return missing


def test_every_bertjax_import_of_every_benchmark_resolves():
    assert len(SCRIPTS) >= 25
    found = {path.name: missing_imports(path.read_text()) for path in SCRIPTS}
    assert {name: lines for name, lines in found.items() if lines} == {}
    assert sum(len(_imports(ast.parse(p.read_text()))) for p in SCRIPTS) > 50  # the walk sees the imports
    planted = (  # the two breaks nothing noticed: imports inside functions, of modules that had moved
        "def run():\n    from bertjax.data.pretraining import stage\n\n"
        "def vocab():\n    from bertjax.data import tokenizer\n"
        "PROGRAM = 'from bertjax.jobs import nowhere'\n"
    )
    assert missing_imports(planted) == [
        "2: bertjax.data.pretraining.stage",
        "5: bertjax.data.tokenizer",
        "6: bertjax.jobs.nowhere",
    ]


def test_every_benchmark_script_imports():
    """Each script's own top level (its third-party imports, its constants), in one process, without running it."""
    program = (
        "import importlib.util, sys\n"
        f"sys.path.insert(0, {str(BENCHMARKS)!r})\n"
        f"for path in {[str(p) for p in SCRIPTS]!r}:\n"
        "    spec = importlib.util.spec_from_file_location('bench_' + path.rsplit('/', 1)[1][:-3], path)\n"
        "    spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
        "print('imported', len(sys.argv) and %d)\n" % len(SCRIPTS)
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, BERTJAX_NO_TCMALLOC="1", PYTHONPATH=str(ROOT)),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"imported {len(SCRIPTS)}" in done.stdout


def _run(script: str, *args: str, timeout: int = 300) -> dict:
    """The script as a user runs it; its JSON result (the last line)."""
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, BERTJAX_NO_TCMALLOC="1", PYTHONPATH=str(ROOT)),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# The one script with a dry-run size that no other test runs, at its smallest: the figure still comes out.
# curriculum.py and glue_offline.py train for minutes even at their smallest; pipeline_throughput.py and
# prepare_throughput.py have no small size (24 s and 20 s at their least here): their imports are checked above.


def test_finetune_step_smallest_run():
    result = _run(
        "finetune_step.py",
        "--model=tiny",
        "--seq_len=16",
        "--batch_size=2",
        "--steps=1",
        "--warmup=0",
        "--frameworks=jax",
    )
    assert result["bertjax_step_s"] > 0 and result["bertjax_seq_per_s"] > 0, result
