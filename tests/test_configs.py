"""Config files: every size builds the right model, arguments select variants, every field is commented."""

import ast
import pathlib
import re
import subprocess
import sys

import pytest
from ml_collections import config_flags

from bertjax import model as model_lib

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"


def load(name: str, arg: str = ""):
    path = str(CONFIGS / f"{name}.py") + (f":{arg}" if arg else "")
    module = config_flags.config_flags._LoadConfigModule(f"{name}_config", path.split(":")[0])
    return module.get_config(arg or None)


@pytest.mark.parametrize("size", list(model_lib.SIZES))
def test_size_files_build_their_model(size):
    config = load(size)
    model = model_lib.from_config(config.model)
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
        model_lib.from_config(config.model)
    config = load("tiny")
    config.model.num_attention_heads = 3
    with pytest.raises(ValueError, match=r"config.model: hidden_size=128 is not divisible by num_attention_heads=3"):
        model_lib.from_config(config.model)


def test_every_default_field_is_commented():
    """Each `c.section.field = value` line in default.py carries a comment saying what it does."""
    source = (CONFIGS / "default.py").read_text()
    lines = source.splitlines()
    assignments = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Assign)
                   and isinstance(node.targets[0], ast.Attribute)]
    assert len(assignments) > 30
    for node in assignments:
        if re.search(r"ConfigDict\(\)$", lines[node.lineno - 1]) or node.col_offset > 4:
            continue  # section headers, and the phase/runlocal overrides of fields commented above
        span = lines[node.lineno - 1: node.end_lineno]
        assert any("#" in line for line in span), f"default.py:{node.lineno} has no comment: {span[0].strip()}"


def test_summary_cli_reports_the_model():
    out = subprocess.run([sys.executable, "-m", "bertjax.summary", f"--config={CONFIGS / 'tiny.py'}"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    total = int(re.search(r"total\s+([\d,]+)", out).group(1).replace(",", ""))
    import jax

    shapes = jax.eval_shape(lambda: model_lib.init_params(model_lib.from_config(load("tiny").model),
                                                          jax.random.PRNGKey(0)))
    assert total == model_lib.param_count(shapes)
    assert "mlm_logits       (2, 20, 30522)" in out
