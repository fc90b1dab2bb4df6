"""What every command (`python -m bertjax.NAME`) shares: flags that end a mistake in one sentence, configs
found from any directory, and the same start and end for every job.

- `run(main)` replaces `absl.app.run(main)`. A misspelled flag or `--config.*` override, an argument a
  config file does not take, a value of the wrong type, a config file that does not exist or does not
  load: each ends in one sentence naming the flag or file (with the nearest real name) and exit status 2,
  whichever layer of absl or ml_collections raised it.
- `--config=configs/NAME.py[:ARG]` names a file in the working directory when there is one, else the
  config of that name shipped in the package (bertjax/configs/), so an installed bertjax runs the README's
  commands from any directory.
- `run_job(argv, job, ...)`: a job command's body: bertjax's INFO lines on, JAX's and orbax's off, and a
  user's error (a bad file, config or environment) as its one sentence (`exit_with_sentence`).

Only commands import this module; libraries raise ValueError/OSError with their sentence and leave the
exit to it.
"""

from __future__ import annotations

import difflib
import gc
import logging
import os
import sys
from typing import Any, Callable, Iterator, Optional, Sequence

from absl import app, flags
from absl import logging as absl_logging

from bertjax.config import convert as config_convert
from bertjax.runtime import tf_import
from bertjax.runtime import stopped_early

PACKAGED_CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
USAGE_EXIT = 2  # as argparse: the command line was wrong, nothing ran
TRACEBACK = "BERTJAX_TRACEBACK"


class UsageError(Exception):
    """A command line that cannot run; its message is the one sentence the user sees."""


# --- Config files ---------------------------------------------------------------------------------------


def packaged_configs() -> list[str]:
    return sorted(name for name in os.listdir(PACKAGED_CONFIGS) if name.endswith(".py") and name != "__init__.py")


def resolve_config(spec: str) -> str:
    """`PATH[:ARG]` → the same with PATH made real: as given when it exists, else the packaged config of
    that name (`configs/large.py` → bertjax/configs/large.py). A file found nowhere is a UsageError."""
    path, colon, arg = spec.partition(":")
    if os.path.isfile(path):
        return spec
    name = os.path.basename(path)
    packaged = os.path.join(PACKAGED_CONFIGS, name)
    if (
        os.path.dirname(os.path.normpath(path)) in ("configs", "")
        and os.path.isfile(packaged)
        and name != "__init__.py"
    ):
        return packaged + colon + arg
    known = packaged_configs()
    nearest = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean configs/{nearest[0]}? " if nearest else ""
    raise UsageError(
        f"config file {path} does not exist, here ({os.getcwd()}) or among bertjax's configs; {hint}"
        f"bertjax ships configs/{{{','.join(n[:-3] for n in known)}}}.py."
    )


def _config_flag_names(fv: flags.FlagValues) -> list[str]:
    """The flags defined by ml_collections' DEFINE_config_file (their parser loads a file)."""
    return [name for name in fv if type(fv[name].parser).__name__ == "ConfigFileFlagParser"]


def _config_values(argv: Sequence[str], flag: str) -> Iterator[tuple[int, str, str]]:
    """(index, prefix, value) of each value given to --FLAG in argv, as `--FLAG=VALUE` (prefix `--FLAG=`,
    at the flag's own index) or `--FLAG VALUE` (prefix '', at the next index), with one dash or two."""
    for i, arg in enumerate(argv):
        for dashes in ("--", "-"):
            if arg.startswith(f"{dashes}{flag}="):
                yield i, f"{dashes}{flag}=", arg.split("=", 1)[1]
            elif arg == f"{dashes}{flag}" and i + 1 < len(argv):
                yield i + 1, "", argv[i + 1]


def _resolve_config_args(argv: list[str], names: Sequence[str]) -> list[str]:
    """argv with every `--NAME=PATH[:ARG]` (or `--NAME PATH[:ARG]`) of a config flag resolved."""
    out = list(argv)
    for i, prefix, value in sorted(hit for name in names for hit in _config_values(argv, name)):  # in argv's order
        out[i] = prefix + resolve_config(value)
    return out


# --- Parsing, with every mistake as one sentence --------------------------------------------------------


def _innermost(error: BaseException) -> BaseException:
    """The exception at the bottom of a chain: ml_collections and absl re-raise a config file's own error
    wrapped in tracebacks-as-text; the first one raised holds the sentence."""
    seen = set()
    while id(error) not in seen:
        seen.add(id(error))
        inner = error.__cause__ or error.__context__
        if inner is None:
            break
        error = inner
    return error


def _message(error: BaseException) -> str:
    text = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
    return " ".join(str(text).split())


def _override_problem(config: Any, flag: str, override: str, value: str) -> Optional[str]:
    """Why `--FLAG.OVERRIDE=VALUE` does not apply to the loaded config (a field it does not have, with the
    nearest one, or a value its field's type does not take), or None."""
    node, walked = config, flag
    for key in override.split("."):
        keys = [str(k) for k in node.keys()] if hasattr(node, "keys") else []
        if key not in keys:
            nearest = difflib.get_close_matches(key, keys, n=1)
            hint = f"did you mean --{walked}.{nearest[0]}?" if nearest else f"its fields are {sorted(keys)}."
            return f"--{flag}.{override}: {walked} has no field {key!r}; {hint}"
        node, walked = node[key], f"{walked}.{key}"
    kind = type(node)
    if kind in (int, float):
        try:
            kind(value) if kind is float else int(value, 0)
        except ValueError:
            return (
                f"--{flag}.{override}={value}: {walked} takes {'an int' if kind is int else 'a float'} (its "
                f"value in the config is {node!r})."
            )
    return None


def _config_spec(argv: Sequence[str], flag: str) -> Optional[str]:
    """The first value given to --FLAG in argv, or None."""
    return next((value for _, _, value in _config_values(argv, flag)), None)


def _overrides(argv: Sequence[str], flag: str) -> list[tuple[str, str]]:
    found = []
    for arg in argv:
        for prefix in (f"--{flag}.", f"-{flag}.", f"--no{flag}.", f"-no{flag}."):
            if arg.startswith(prefix):
                name, _, value = arg[len(prefix) :].partition("=")
                found.append((name, value))
                break
    return found


def _sentence(
    error: BaseException, argv: Sequence[str], fv: flags.FlagValues, config_flags: Sequence[str], given: Sequence[str]
) -> str:
    """One sentence for whatever parsing the command line raised (`given`: argv as the user typed it)."""
    for name in config_flags:  # a misspelled override or a bad value, whatever ml_collections raised for it
        spec = _config_spec(argv, name)
        try:  # the file alone, without the overrides: ml_collections' own loader
            config = fv[name].parser.parse(spec) if spec else None
        except Exception:  # noqa: BLE001  (the file itself is what failed: reported below)
            config = None
        if config is None or type(config).__name__ == "_ErrorConfig":
            continue
        for override, value in _overrides(argv, name):
            problem = _override_problem(config, name, override, value)
            if problem:
                return problem
    if isinstance(error, flags.UnrecognizedFlagError):
        nearest = difflib.get_close_matches(error.flagname, list(fv), n=1)
        hint = f"; did you mean --{nearest[0]}?" if nearest else ""
        return f"unknown flag --{error.flagname}{hint} (--helpshort lists this command's flags)"
    inner = _innermost(error)
    link = error
    while link is not None and "Error whilst parsing config file" not in _message(link):
        link = link.__cause__ or link.__context__
    if link is not None or isinstance(error, (OSError, SyntaxError)):  # the config file's own sentence
        spec = next(filter(None, (_config_spec(given, name) for name in config_flags)), "the config file")
        return f"{spec}: {_message(inner)}"
    return _message(error)


def parse_flags(argv: list[str], known_only: bool = False, fv: flags.FlagValues = flags.FLAGS) -> list[str]:
    """absl's parse, with config paths resolved and every mistake one sentence (UsageError)."""
    names = _config_flag_names(fv)
    given, argv = argv, _resolve_config_args(argv, names)
    sys.argv = list(argv)  # ml_collections reads the overrides from sys.argv, not from the argv it is given
    try:
        rest = fv(argv, known_only=known_only)
        for name in names:  # a config file that exists but fails to load is reported when first read
            value = fv[name].value
            if type(value).__name__ == "_ErrorConfig":
                raise value._error  # noqa: SLF001
    except UsageError:
        raise
    except (flags.Error, KeyError, AttributeError, TypeError, ValueError, OSError, SyntaxError) as e:
        raise UsageError(_sentence(e, argv, fv, names, given)) from e
    return rest


def run(main: Callable[[list[str]], Any], known_only: bool = False) -> None:
    """`absl.app.run(main)`, with command-line mistakes as one sentence and exit 2."""
    tf_import.skip_keras_while_tensorflow_imports()  # a command's process never uses Keras: 1.4 s of each start
    tf_import.quiet_tensorflow_start()  # no oneDNN banner, twice, in every job's log
    # Tracing, TensorFlow's graph building and the imports make millions of objects in the first seconds, and
    # CPython's default (a young collection every 700 allocations, a full one every 70,000) walked them
    # again and again: 1.0 s of a 5.2 s tiny job was the collector, 0.3 s of 4.4 s at these thresholds.
    gc.set_threshold(10_000, 10, 10)

    def parser(argv: list[str]) -> list[str]:
        try:
            return parse_flags(argv, known_only=known_only)
        except UsageError as e:
            if os.environ.get(TRACEBACK, "") not in ("", "0"):
                raise
            sys.stderr.write(f"bertjax: {e}\n")
            raise SystemExit(USAGE_EXIT) from None

    app.run(main, flags_parser=parser)


# --- A job's start and end ------------------------------------------------------------------------------


def quiet() -> None:
    """Before any JAX backend starts: bertjax's INFO lines on; orbax's, JAX's, TensorFlow's and libtpu's
    start-up and per-step lines off (a first run shows only bertjax's own lines)."""
    from bertjax.runtime import bucket_outage
    from bertjax.runtime import compile_cache, xla_flags
    from bertjax.training import aot  # jax, imported here: the data commands never call this
    from bertjax.runtime import gpu_targets

    logging.getLogger("bertjax").setLevel(logging.INFO)
    absl_logging.set_verbosity(absl_logging.WARNING)  # orbax and JAX log every step at INFO
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow (tf.data, TensorBoard) starts with INFO lines
    aot.quiet_libtpu()  # a no-op on TPU VMs
    xla_flags.apply_gpu_defaults()  # a no-op without NVIDIA GPUs
    gpu_targets.quiet_cuda_plugin(tpu_here=not aot.no_tpu_here())  # a no-op on GPU machines
    compile_cache.enable()  # a resumed job, a sweep's next run: the step loaded, not compiled again
    bucket_outage.RETRIES.install()  # a failing bucket's retries counted in the log, not printed as tracebacks


def prologue(argv: Sequence[str]) -> None:
    """Every job command's start: no stray arguments, then `quiet`."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {list(argv[1:])}; settings go in --config.* flags.")
    quiet()


# What a user's mistake raises (a bad file, flag or value, a full disk, a run stopped by non-finite steps): it ends
# the command in one sentence. Anything else is bertjax's fault and keeps its traceback.
USER_ERRORS = (ValueError, OSError, FloatingPointError)


def exit_with_sentence(error: Exception, command: Optional[str] = None) -> None:
    """A bad config, file or environment (and a run stopped by non-finite steps or a full disk) ends in the
    error's one sentence; BERTJAX_TRACEBACK=1 shows the traceback as well. The file commands (prepare,
    tokenizer, predict, export, extract_features) name themselves: `prepare: error: SENTENCE`, exit 1."""
    if os.environ.get(TRACEBACK, "") not in ("", "0"):
        raise error
    if isinstance(error, config_convert.ConfigError):  # a config mistake: nothing ran, as a command-line one
        sys.stderr.write(f"bertjax: {error}\n")
        raise SystemExit(USAGE_EXIT) from None
    if command:
        sys.stderr.write(f"{command}: error: {error}\n")
        raise SystemExit(1) from None
    raise SystemExit(f"bertjax: {error} ({TRACEBACK}=1 shows where it was raised)") from None


def run_job(
    argv: Sequence[str],
    job: Callable[..., Any],
    *args: Any,
    command: Optional[str] = None,
    uses_jax: bool = True,
    errors: tuple[type[Exception], ...] = USER_ERRORS,
) -> Any:
    """Every command's body, its one way out: the prologue, then the job, whose user-caused errors end as one
    sentence (`exit_with_sentence`). uses_jax=False (prepare, tokenizer) keeps JAX unimported: no `quiet`,
    and the arguments absl did not know are the job's to refuse (prepare hands them to Beam)."""
    if uses_jax:
        prologue(argv)
    try:
        result = job(*args)
    except errors as e:
        exit_with_sentence(e, command)
    if stopped_early.before_training():
        # The SIGTERM's exception unwound whatever ran, a compile included; the interpreter's shutdown then
        # crashed (a segfault, rc 139, in 2 of 2 fine-tuning kills). Nothing was trained or is being saved:
        # the process ends here, rc 0.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return result
