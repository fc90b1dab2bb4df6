"""The house: commands are thin and no library imports one; only commands, cli.py and __init__.py at the top,
every library in a role folder, each command's library named as the command in jobs/; one exit path (the
contracts and registries: test_contracts.py); the modules' imports form no circle;
record preparation never imports JAX or Flax; an installed wheel runs the README's commands from any directory;
a command-line mistake ends in one sentence and exit 2, on every command that takes --config; an older
jax is refused at import with one sentence."""

from __future__ import annotations

import ast
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

import train_setup

ROOT = train_setup.ROOT
PACKAGE = ROOT / "bertjax"
# `python -m bertjax.NAME`: flags and one call. Every other module is a library, which imports none of these.
COMMANDS = {
    "main",
    "finetune",
    "predict",
    "export",
    "extract_features",
    "summary",
    "prepare",
    "tokenizer",
    "demo_finetune",
    "glue",
    "retrieval",
}
# Every library lives in a folder named for its role (configs/ holds the config files, which are data).
ROLES = {"jobs", "interop", "training", "runtime", "config", "models", "finetuning", "data", "configs"}


def _modules() -> dict[str, pathlib.Path]:
    """bertjax's modules by dotted name (config files are data, loaded by path: not modules of the graph)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        if "configs" in rel.parts:
            continue
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        found[".".join(parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Every import of a bertjax module by a bertjax module, at the top or inside a function."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and target not in ("bertjax", "bertjax.data"):
                    graph[name].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_commands_are_the_modules_that_run_as_programs():
    runnable = {
        name.split(".")[-1] for name, path in _modules().items() if 'if __name__ == "__main__":' in path.read_text()
    }
    assert runnable == COMMANDS


def test_no_library_imports_a_command_and_the_imports_form_no_circle():
    graph = import_graph()
    commands = {f"bertjax.{name}" for name in COMMANDS}
    assert len(graph) > 40 and "bertjax.jobs.finetune" in graph["bertjax.finetune"]  # the walk sees real imports
    wrong = {
        library: sorted(targets & commands)
        for library, targets in graph.items()
        if library not in commands and targets & commands
    }
    assert wrong == {}, f"libraries importing commands: {wrong}"
    assert circles(graph) == []
    # A circle would be found: the walk is not vacuous.
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def misplaced(paths: list[str]) -> list[str]:
    """Modules (paths under bertjax/) that break the layout: at the top but neither a command, cli.py nor
    __init__.py; or in a folder that is not a role's."""
    top = {f"{name}.py" for name in COMMANDS} | {"cli.py", "__init__.py"}
    return sorted(p for p in paths if ("/" not in p and p not in top) or ("/" in p and p.split("/")[0] not in ROLES))


def test_only_commands_cli_and_init_at_the_top_and_libraries_in_role_folders():
    paths = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")]
    assert "jobs/main.py" in paths and "models/bert/model.py" in paths
    assert misplaced(paths) == []
    assert misplaced(["trainer.py", "main.py", "cli.py", "misc/util.py", "training/loop.py"]) == [  # planted
        "misc/util.py",
        "trainer.py",
    ]


def test_each_command_runs_the_library_of_its_name_and_ends_through_cli_run_job():
    """`python -m bertjax.X` imports bertjax.jobs.X, and its one way out is cli.run_job (a user's mistake is
    one sentence there, whatever the command): no command writes its own error or exit."""
    graph, modules = import_graph(), _modules()
    for name in COMMANDS:
        assert f"bertjax.jobs.{name}" in modules, f"bertjax/jobs/{name}.py: the library of python -m bertjax.{name}"
        assert f"bertjax.jobs.{name}" in graph[f"bertjax.{name}"], f"bertjax/{name}.py does not run its library"
        assert own_exits(modules[f"bertjax.{name}"].read_text()) == [], f"bertjax/{name}.py"
    planted = (
        "def main(argv):\n    try:\n        go()\n    except ValueError as e:\n"
        '        sys.stderr.write(f"x: {e}")\n        return 1\n'
    )
    assert own_exits(planted) == ["main does not call cli.run_job", "line 5 writes to stderr"]


def own_exits(source: str) -> list[str]:
    """Where a command's module ends the process its own way (instead of through cli.run_job)."""
    found = []
    tree = ast.parse(source)
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    if not any(isinstance(n, ast.Attribute) and n.attr == "run_job" for n in ast.walk(main)):
        found.append("main does not call cli.run_job")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("exit", "_exit", "stderr"):
            found.append(f"line {node.lineno} {'writes to stderr' if node.attr == 'stderr' else 'exits'}")
        if isinstance(node, ast.Name) and node.id == "SystemExit":
            found.append(f"line {node.lineno} raises SystemExit")
    return found


def remote_path_tests(source: str) -> list[int]:
    """Lines that decide local-or-remote for themselves (`"://" in path`) instead of asking runtime/files.py."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Compare)
            and isinstance(node.left, ast.Constant)
            and node.left.value == "://"
            and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops)
        ):
            found.append(node.lineno)
    return found


def test_one_file_layer_decides_what_is_remote():
    """`runtime/files.is_remote` is the one place that tells a local path from an object store's (gs://): the
    bucket work lands there, not in a dozen inline checks."""
    layer = PACKAGE / "runtime" / "files.py"
    assert remote_path_tests(layer.read_text()), "the file layer's own check is found"
    inline = {
        str(path.relative_to(ROOT)): lines
        for path in _modules().values()
        if path != layer
        for lines in [remote_path_tests(path.read_text())]
        if lines
    }
    assert inline == {}, f"ask bertjax.runtime.files.is_remote instead: {inline}"
    assert remote_path_tests('def f(path):\n    return "://" not in path\n') == [2]  # a planted one is found


def test_ruff_finds_nothing_in_the_tree(tmp_path):
    """pyproject.toml's lint (syntax errors, pyflakes: unused imports and variables, undefined names) passes
    on bertjax/, tests/ and benchmarks/; a planted unused import is found."""
    ruff = [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise"]
    done = subprocess.run([*ruff, "bertjax", "tests", "benchmarks"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]
    layout = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "bertjax", "tests", "benchmarks"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert layout.returncode == 0, "run `ruff format bertjax tests benchmarks`: " + layout.stdout[-3000:]
    (tmp_path / "planted.py").write_text("import os\n")
    planted = subprocess.run(
        [*ruff, "--config", str(ROOT / "pyproject.toml"), str(tmp_path / "planted.py")], capture_output=True, text=True
    )
    assert planted.returncode == 1 and "F401" in planted.stdout, planted.stdout


def test_every_library_imports_with_the_commands_blocked():
    """At run time too: each library module imports in a process where importing a command fails."""
    blocked = sorted(f"bertjax.{name}" for name in COMMANDS)
    libraries = sorted(name for name in _modules() if name.split(".")[-1] not in COMMANDS and name != "bertjax")
    program = (
        "import importlib, importlib.abc, sys\n"
        f"BLOCKED = {blocked!r}\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name in BLOCKED:\n"
        "            raise ImportError(f'a library imported the command {name}')\n"
        "sys.meta_path.insert(0, Block())\n"
        f"for name in {libraries!r}:\n"
        "    importlib.import_module(name)\n"
        "try:\n"
        "    importlib.import_module('bertjax.main')\n"
        "except ImportError as e:\n"
        "    print('blocked:', e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, BERTJAX_NO_TCMALLOC="1"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "blocked: a library imported the command bertjax.main" in done.stdout  # the block works


def test_prepare_and_the_config_schema_import_no_jax_or_flax(tmp_path):
    """`python -m bertjax.prepare` with two (spawned) workers, and the config schema, in processes where
    importing jax, flax or optax fails."""
    hidden = tmp_path / "hidden"
    for name in ("jax", "jaxlib", "flax", "optax", "orbax"):
        (hidden / name).mkdir(parents=True)
        (hidden / name / "__init__.py").write_text(f"raise ImportError('{name} is hidden by the test')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hidden), str(ROOT)]), BERTJAX_NO_TCMALLOC="1")
    probe = subprocess.run([sys.executable, "-c", "import jax"], env=env, capture_output=True, text=True)
    assert "hidden by the test" in probe.stderr

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(
        "".join(f"sentence {i} of document {d} is here.\nand another one {i}.\n\n" for d in range(20) for i in range(3))
    )
    vocab = tmp_path / "vocab.txt"
    vocab.write_text(
        "\n".join(
            [
                "[PAD]",
                "[UNK]",
                "[CLS]",
                "[SEP]",
                "[MASK]",
                "sentence",
                "of",
                "document",
                "is",
                "here",
                "and",
                "another",
                "one",
                ".",
            ]
            + [str(i) for i in range(20)]
        )
        + "\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bertjax.prepare",
            f"--input_file={corpus}",
            f"--output_dir={tmp_path / 'records'}",
            f"--vocab_file={vocab}",
            "--num_shards=2",
            "--num_workers=2",
            "--max_seq_length=16",
            "--max_predictions_per_seq=2",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "wrote" in done.stdout and len(list((tmp_path / "records").glob("*.tfrecord"))) == 2
    schema = subprocess.run(
        [
            sys.executable,
            "-c",
            "import runpy, bertjax.config.schema as c\n"
            f"c.JobConfig.from_configdict(runpy.run_path({str(PACKAGE / 'configs' / 'large.py')!r})"
            "['get_config']()).validate()",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert schema.returncode == 0, schema.stderr[-3000:]


def _command(tmp_path: pathlib.Path, module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", f"bertjax.{module}", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, BERTJAX_NO_TCMALLOC="1", PYTHONPATH=str(ROOT)),
    )


def _one_sentence(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("bertjax: "), done.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--config.train.num_train_stepz=5"], "did you mean --config.train.num_train_steps?"),
        (["--config.trian.num_train_steps=5"], "did you mean --config.train?"),
        (["--config.train.num_train_steps=abc"], "config.train.num_train_steps takes an int"),
        (["--config.optim.learning_rate=fast"], "config.optim.learning_rate takes a float"),
        (["--workdr=x"], "unknown flag --workdr; did you mean --workdir?"),
    ],
)
def test_a_mistyped_override_or_flag_is_one_sentence(tmp_path, args, expected):
    """From a directory without configs/: the packaged config is found, then the mistake named."""
    done = _command(tmp_path, "main", "--config=configs/tiny.py", f"--workdir={tmp_path / 'w'}", *args)
    assert expected in _one_sentence(done)


def test_config_files_that_do_not_exist_or_take_no_such_argument_are_one_sentence(tmp_path):
    assert "did you mean configs/tiny.py?" in _one_sentence(
        _command(tmp_path, "main", "--config=configs/tini.py", "--workdir=w")
    )
    line = _one_sentence(_command(tmp_path, "main", "--config=configs/demo.py:quikc", "--workdir=w"))
    assert "configs/demo.py:quikc: config argument 'quikc' is not known; this config file takes quick=False" in line
    (tmp_path / "broken.py").write_text("def get_config(:\n")
    assert "broken.py: invalid syntax" in _one_sentence(_command(tmp_path, "summary", "--config=broken.py"))
    (tmp_path / "mine.py").write_text("def get_config():\n    raise ValueError('mine needs a corpus')\n")
    assert "mine.py: mine needs a corpus" in _one_sentence(
        _command(tmp_path, "main", "--config=mine.py", "--workdir=w")
    )


@pytest.mark.parametrize(
    "module, args",
    [
        ("finetune", ["--config=configs/finetune.py:size=tiny", "--workdir=w", "--config.train.num_epoch=1"]),
        ("summary", ["--config=configs/tiny.py", "--config.model.hiden_size=1"]),
        ("glue", ["--config=configs/glue.py", "--workdir=w", "--config.small_task_seed=0"]),
        (
            "demo_finetune",
            ["--config=configs/demo_finetune.py", "--pretrained=p", "--workdir=w", "--config.demo.max_word=3"],
        ),
    ],
)
def test_every_command_with_a_config_names_the_nearest_field(tmp_path, module, args):
    line = _one_sentence(_command(tmp_path, module, *args))
    assert "did you mean --config." in line and "has no field" in line


def test_a_wheel_installed_in_a_fresh_venv_runs_from_an_empty_directory(tmp_path):
    """The package as users install it (a wheel, configs inside), in a venv of its own; its dependencies
    come from this test's environment through a path file, bertjax only from the wheel."""
    source = tmp_path / "source"
    shutil.copytree(
        ROOT,
        source,
        symlinks=True,
        ignore=shutil.ignore_patterns(
            ".venv", ".git", ".pytest_cache", "workdir*", "build", "dist", "*.egg-info", "__pycache__"
        ),
    )
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = dist.glob("bertjax-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "bertjax/configs/tiny.py" in names and "bertjax/configs/default.py" in names
    assert not any(name.startswith(("tests/", "configs/", "benchmarks/")) for name in names)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    deps = [p for p in sys.path if p.endswith("site-packages")]
    pathlib.Path(site, "test_dependencies.pth").write_text("\n".join(deps) + "\n")

    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(BERTJAX_NO_TCMALLOC="1", JAX_PLATFORMS="cpu")
    where = subprocess.run(
        [str(python), "-c", "import bertjax; print(bertjax.__file__)"],
        cwd=empty,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert where.stdout.strip().startswith(str(venv)), where.stdout + where.stderr
    done = subprocess.run(
        [str(python), "-m", "bertjax.summary", "--config=configs/tiny.py"],
        cwd=empty,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "total" in done.stdout and "4,433,468" in done.stdout and "forward pass on cpu" in done.stdout
    assert list(empty.iterdir()) == []


def test_an_older_jax_is_refused_at_import_with_one_sentence(tmp_path):
    """A jax distribution older than bertjax.MIN_JAX, found first on the path (as an old jax in Colab)."""
    import bertjax

    old = tmp_path / "old"
    info = old / "jax-0.4.30.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: jax\nVersion: 0.4.30\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(old), str(ROOT)]), BERTJAX_NO_TCMALLOC="1")
    wanted = ".".join(map(str, bertjax.MIN_JAX))
    imported = subprocess.run([sys.executable, "-c", "import bertjax"], env=env, capture_output=True, text=True)
    assert imported.returncode == 1
    assert f"ImportError: bertjax needs jax>={wanted} but jax 0.4.30 is installed" in imported.stderr
    command = subprocess.run(
        [sys.executable, "-m", "bertjax.summary", "--config=configs/tiny.py"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert command.returncode == 1
    assert command.stderr.strip().splitlines() == [
        f"bertjax: bertjax needs jax>={wanted} but jax 0.4.30 is installed; upgrade it with pip install -U "
        f"'jax>={wanted}' (on TPUs 'jax[tpu]>={wanted}', on NVIDIA GPUs 'jax[cuda12]>={wanted}'), then restart "
        "the Python process."
    ]
    assert bertjax._release("0.10.2") >= bertjax.MIN_JAX > bertjax._release("0.4.30")


TF_WITHOUT_KERAS = """
import sys
from bertjax.runtime import tf_import
tf_import.skip_keras_while_tensorflow_imports()
import tensorflow as tf
print("keras" in sys.modules, "sklearn" in sys.modules)
print(list(tf.data.Dataset.range(4).batch(2).as_numpy_iterator())[1].tolist(), tf.io.gfile.exists(sys.prefix))
print(type(tf.keras.layers.Dense(2)).__name__, "keras" in sys.modules)  # tf.keras afterwards: Keras, as usual
"""


def test_commands_import_tensorflow_without_keras_and_keras_still_loads_after():
    done = subprocess.run(
        [sys.executable, "-c", TF_WITHOUT_KERAS],
        cwd=train_setup.ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:3] == ["False False", "[2, 3] True", "Dense True"], done.stdout


def private_imports(source: str) -> list[str]:
    """`line: name` for each private name (`_x`) taken from another bertjax module: imported by name, or read
    off a bertjax module imported here. A name another file needs is public there (a seam left by a split)."""
    tree = ast.parse(source)
    aliases, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "bertjax":
            aliases |= {a.asname or a.name for a in node.names}
            found += [f"{node.lineno}: {a.name}" for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Import):
            aliases |= {a.asname or a.name.split(".")[0] for a in node.names if a.name.split(".")[0] == "bertjax"}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            found.append(f"{node.lineno}: {node.value.id}.{node.attr}")
    return sorted(found)


def test_no_module_takes_another_modules_private_names():
    found = {str(p.relative_to(ROOT)): private_imports(p.read_text()) for p in _modules().values()}
    assert {path: names for path, names in found.items() if names} == {}
    planted = (
        "from bertjax.config.convert import _bad, ConfigError\n"
        "from bertjax.models.bert import encoder\n"
        "x = encoder._dense\n"
        "y = encoder.__name__\n"
    )
    assert private_imports(planted) == ["1: _bad", "3: encoder._dense"]


# The floors, bottom to top (docs/layout.md "Floors"): a module imports only modules of its own floor or below.
FLOORS = ("runtime", "data", "models", "config", "training", "finetuning", "interop", "jobs", "commands")


def floor(module: str) -> str:
    """A module's floor: its role folder; the commands, cli.py and the public API at the top are one floor."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in ROLES) else "commands"


def imports_up(graph: dict[str, set[str]]) -> list[str]:
    """`a -> b` for each import of a module on a higher floor than the importer's."""
    level = {name: i for i, name in enumerate(FLOORS)}
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets if level[floor(b)] > level[floor(a)])


def test_every_module_imports_only_its_own_floor_and_those_below():
    graph = import_graph()
    assert {floor(m) for m in graph} == set(FLOORS)  # every floor has modules, and no module is outside them
    assert imports_up(graph) == []
    planted = {  # the breaches this house once had: the models importing the trainer's sharding, config the tasks
        "bertjax.models.attention": {"bertjax.training.sharding", "bertjax.models.partitioning"},
        "bertjax.config.schema": {"bertjax.finetuning.tasks"},
        "bertjax.runtime.lock": {"bertjax.runtime.files"},
        "bertjax.jobs.main": {"bertjax.training.loop"},
        "bertjax.cli": {"bertjax.jobs.main"},
    }
    assert imports_up(planted) == [
        "bertjax.config.schema -> bertjax.finetuning.tasks",
        "bertjax.models.attention -> bertjax.training.sharding",
    ]
