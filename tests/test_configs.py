"""Config files: every size builds the right model, arguments select variants, every field is commented."""

import ast
import pathlib
import re
import subprocess
import sys

import pytest
from ml_collections import config_flags

from bertjax.models.bert import model as model_lib
from bertjax.config import schema as config_lib
from bertjax.finetuning.config import FinetuneConfig
from bertjax.config.schema import JobConfig

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"


def load(name: str, arg: str = ""):
    path = str(CONFIGS / f"{name}.py") + (f":{arg}" if arg else "")
    module = config_flags.config_flags._LoadConfigModule(f"{name}_config", path.split(":")[0])
    return module.get_config(arg or None)


@pytest.mark.parametrize("size", list(model_lib.SIZES))
def test_size_files_build_their_model(size):
    model = model_lib.from_config(JobConfig.from_configdict(load(size)).model)
    layers, hidden, heads = model_lib.SIZES[size]
    arch = model.config
    assert (arch.num_hidden_layers, arch.hidden_size, arch.num_attention_heads) == (layers, hidden, heads)
    assert arch.intermediate_size == 4 * hidden
    assert (arch.vocab_size, arch.max_position_embeddings, arch.type_vocab_size) == (30522, 512, 2)


def test_arguments_select_variants():
    assert load("large").data.max_seq_length == 128
    phase2 = load("large", "phase=2")
    assert (phase2.data.max_seq_length, phase2.data.max_predictions_per_seq) == (512, 80)
    assert phase2.model.num_hidden_layers == 24
    assert phase2.train.num_train_steps * 9 == load("large").train.num_train_steps  # 10% of all steps
    assert load("large", "phase=2,init_from=/ckpt/p1").train.init_from == "/ckpt/p1"
    assert load("base", "runlocal").train.num_train_steps < load("base").train.num_train_steps
    assert load("default", "size=mini").model.hidden_size == 256


def test_bad_model_fields_are_named():
    config = load("tiny")
    config.model.dtype = "float16"
    with pytest.raises(ValueError, match=r"config.model.dtype='float16' is not one of"):
        JobConfig.from_configdict(config)
    config = load("tiny")
    config.model.num_attention_heads = 3
    with pytest.raises(ValueError, match=r"config.model: hidden_size=128 is not divisible by num_attention_heads=3"):
        JobConfig.from_configdict(config)
    config = load("tiny")
    config.model.window_block = -2
    with pytest.raises(ValueError, match=r"config.model.window_block=-2 must be -1 \(auto\), 0 \(off\) or a positive"):
        JobConfig.from_configdict(config)


def uncommented_fields(source: str, classes: tuple[str, ...]) -> list[str]:
    """Fields of the named dataclasses with no comment on their line(s) or the line above."""
    lines = source.splitlines()
    return [
        f"{cls.name}.{node.target.id}"
        for cls in ast.parse(source).body
        if isinstance(cls, ast.ClassDef) and cls.name in classes
        for node in cls.body
        if isinstance(node, ast.AnnAssign)
        and not node.target.id.startswith("_")
        and not any("#" in line for line in lines[node.lineno - 2 : node.end_lineno])
    ]


def test_every_pre_training_setting_is_commented_once_in_the_schema():
    """config/schema.py says what each setting does, on its field; configs/default.py writes no value of its
    own beyond a size's model, the phase's and runlocal's changes (its ConfigDict is the schema's defaults)."""
    sections = (
        "ModelConfig",
        "DataConfig",
        "TrainConfig",
        "OptimConfig",
        "MeshConfig",
        "CheckpointConfig",
        "EvalConfig",
    )
    source = pathlib.Path(config_lib.__file__).read_text()
    assert uncommented_fields(source, sections) == []
    assert uncommented_fields("class ModelConfig:\n    dtype: str = 'float32'\n", sections) == [  # planted
        "ModelConfig.dtype"
    ]
    assert load("default").to_dict() == JobConfig().to_dict()


@pytest.mark.parametrize("name", ["finetune"])
def test_every_default_field_is_commented(name):
    """Each `c.section.field = value` line in finetune.py carries a comment saying what it does."""
    source = (CONFIGS / f"{name}.py").read_text()
    lines = source.splitlines()
    assignments = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute)
    ]
    assert len(assignments) > 25
    for node in assignments:
        if re.search(r"ConfigDict\(\)$", lines[node.lineno - 1]) or node.col_offset > 4:
            continue  # section headers, and the phase/runlocal overrides of fields commented above
        span = lines[node.lineno - 1 : node.end_lineno]
        assert any("#" in line for line in span), f"{name}.py:{node.lineno} has no comment: {span[0].strip()}"


def test_summary_cli_reports_the_model():
    out = subprocess.run(
        [sys.executable, "-m", "bertjax.summary", f"--config={CONFIGS / 'tiny.py'}"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    total = int(re.search(r"total\s+([\d,]+)", out).group(1).replace(",", ""))
    import jax

    shapes = jax.eval_shape(
        lambda: model_lib.init_params(
            model_lib.from_config(JobConfig.from_configdict(load("tiny")).model), jax.random.PRNGKey(0)
        )
    )
    assert total == model_lib.param_count(shapes)
    assert "mlm_logits       (2, 20, 30522)" in out


# --- The schema (bertjax/config/schema.py) and strict arguments --------------------------------------------


def test_schema_defaults_are_default_py():
    """JobConfig() is configs/default.py converted: the two cannot drift apart."""
    assert JobConfig.from_configdict(load("default")) == JobConfig()
    assert JobConfig.from_configdict(load("base")) == JobConfig()
    assert config_lib.convert(FinetuneConfig, load("finetune", "size=base"), "config") == FinetuneConfig()


def test_scan_layers_is_the_platforms_choice_until_a_flag_or_file_sets_it():
    """None: a loop on GPUs (measured faster there), nn.scan on TPU and CPU; a flag or a file's bool wins, and
    anything else is named."""
    job = JobConfig.from_configdict(load("tiny"))
    assert job.model.scan_layers is None
    assert [job.model.layer_scan(p) for p in ("gpu", "tpu", "cpu")] == [False, True, True]
    config = load("tiny")
    config.model.scan_layers = True  # a user's config file
    assert JobConfig.from_configdict(config).model.layer_scan("gpu") is True
    config = load("tiny").to_dict()
    config["model"]["scan_layers"] = "auto"
    with pytest.raises(ValueError, match=r"config\.model\.scan_layers='auto' must be True, False or None"):
        JobConfig.from_configdict(config)
    assert model_lib.from_config(job.model, platform="gpu").scan_layers is False
    assert model_lib.from_config(job.model, platform="cpu").scan_layers is True


def test_scan_unroll_is_every_layer_unless_a_count_asks_for_a_loop():
    """0 (every layer unrolled) on every platform, whatever this process's backend: a TPU compiled from this CPU
    gets what a TPU job runs; a flag's count reaches pre-training and fine-tuning models; below 0 is named."""
    from bertjax.finetuning import heads as finetuning_heads

    job = JobConfig.from_configdict(load("tiny"))
    assert job.model.scan_unroll == 0
    assert model_lib.from_config(job.model, platform="tpu").scan_unroll == 0
    config = load("tiny")
    config.model.scan_unroll = 4  # --config.model.scan_unroll=4
    model = JobConfig.from_configdict(config).model
    assert model_lib.from_config(model, platform="tpu").scan_unroll == 4
    assert finetuning_heads.from_config(model, model.architecture, "sequence_classification", 2, "tpu").scan_unroll == 4
    config.model.scan_unroll = -1
    with pytest.raises(
        ValueError, match=r"config\.model\.scan_unroll=-1 must be 0 \(every layer unrolled\) or a count"
    ):
        JobConfig.from_configdict(config)


def test_the_activation_is_recomputed_on_cpus_until_a_flag_says_otherwise():
    """recompute_activation None: on for CPUs (measured faster, the same numbers), off on GPUs and TPUs until
    measured there; a flag's bool wins; the models (BERT and ModernBERT, pre-training and fine-tuning) get it."""
    from bertjax.finetuning import heads as finetuning_heads
    from bertjax.models.modernbert import model as modernbert_model

    job = JobConfig.from_configdict(load("tiny"))
    assert job.model.recompute_activation is None
    assert [job.model.activation_recompute(p) for p in ("cpu", "gpu", "tpu")] == [True, False, False]
    assert model_lib.from_config(job.model, platform="cpu").recompute_activation is True
    assert model_lib.from_config(job.model, platform="gpu").recompute_activation is False
    arch = job.model.architecture
    assert finetuning_heads.from_config(job.model, arch, "sequence_classification", 2, "cpu").recompute_activation
    config = load("modernbert", "size=tiny")
    config.model.recompute_activation = True  # --config.model.recompute_activation=true
    modern = JobConfig.from_configdict(config).model
    assert modernbert_model.from_config(modern, platform="gpu").recompute_activation is True


def test_boolean_arguments_mean_what_they_say():
    steps = load("large").train.num_train_steps
    assert load("large", "runlocal=False").train.num_train_steps == steps
    assert load("large", "runlocal=false").train.num_train_steps == steps
    assert load("large", "runlocal=true").train.num_train_steps < steps
    assert load("large", "runlocal").train.num_train_steps < steps
    assert load("demo", "quick=False").train.num_train_steps == load("demo").train.num_train_steps
    assert load("demo", "quick").train.num_train_steps == load("demo").train.num_train_steps // 10


@pytest.mark.parametrize(
    "name,arg,pattern",
    [
        ("demo", "quikc", r"config argument 'quikc' is not known; this config file takes quick=False"),
        ("base", "size=large", r"config argument 'size' is not known"),
        ("large", "phase=two", r"config argument phase='two' must be of type int"),
        ("large", "runlocal=maybe", r"config argument runlocal='maybe' must be true or false"),
        ("default", "size=huge", r"model size 'huge' is not one of"),
    ],
)
def test_bad_arguments_are_refused(name, arg, pattern):
    with pytest.raises(ValueError, match=pattern):
        load(name, arg)


def test_misspelled_missing_and_ill_typed_keys_are_named():
    config = load("tiny")
    config.train.num_train_step = 5
    with pytest.raises(
        ValueError,
        match=r"config\.train\.num_train_step is not a setting; did you mean "
        r"config\.train\.num_train_steps\?",
    ):
        JobConfig.from_configdict(config)
    config = load("tiny")
    del config.eval["every_steps"]
    with pytest.raises(ValueError, match=r"config\.eval\.every_steps is missing"):
        JobConfig.from_configdict(config)
    config = load("tiny").to_dict()  # e.g. a config made from JSON: ConfigDict's own type checks are gone
    config["data"]["max_seq_length"] = "128"
    with pytest.raises(ValueError, match=r"config\.data\.max_seq_length='128' must be an integer"):
        JobConfig.from_configdict(config)
    config = load("tiny")
    config.data.pipeline_threads = -1
    with pytest.raises(ValueError, match=r"config\.data\.pipeline_threads=-1 must be ≥ 0 \(0 = chosen for you\)"):
        JobConfig.from_configdict(config)
    config = load("tiny")
    config.mesh.logical_axis_rules = (("batch", "dta"),)
    with pytest.raises(ValueError, match=r"maps 'batch' to 'dta', which is not a mesh axis"):
        JobConfig.from_configdict(config)


def test_the_job_cli_names_a_misspelled_argument_and_key(tmp_path):
    """A misspelled config-file argument, a misspelled key set in a user's own config file, or a shortened run
    its warmup does not fit, is one sentence from `python -m bertjax.main` and exit status 2, before any work;
    the warmup's names the value to pass."""
    own = tmp_path / "my_config.py"
    own.write_text(
        "import runpy\n\n\ndef get_config():\n"
        f"    c = runpy.run_path({str(CONFIGS / 'demo.py')!r})['get_config']()\n"
        "    c.train.num_train_step = 5\n    return c\n"
    )
    shortened = f"--config={CONFIGS / 'demo.py'} --config.train.num_train_steps=40"  # its warmup is 300 steps
    for flags_given, pattern in (
        (f"--config={CONFIGS / 'demo.py'}:quikc", "config argument 'quikc' is not known"),
        (f"--config={own}", "config.train.num_train_step is not a setting; did you mean"),
        (
            shortened,
            "config.optim.warmup_steps=300 exceeds config.train.num_train_steps=40; warmup must end "
            "within the run: pass --config.optim.warmup_steps=4 (a tenth of it) or fewer.",
        ),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "bertjax.main", *flags_given.split(), f"--workdir={tmp_path / 'work'}"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 2 and pattern in done.stderr.strip().splitlines()[-1], done.stderr[-2000:]
        assert not (tmp_path / "work").exists()  # refused before anything was written


def test_command_line_tools_can_be_imported_together():
    """Each CLI defines its flags only when run as a program, so importing several never collides."""
    import importlib

    from absl import flags

    for name in ("main", "prepare", "tokenizer", "summary", "export", "finetune", "predict", "extract_features"):
        importlib.import_module(f"bertjax.{name}")
    assert not {"config", "input_file", "workdir", "vocab_size", "output_dir"} & set(flags.FLAGS)
