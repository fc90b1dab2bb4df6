"""google-research/bert TF1 checkpoints load into bertjax and export to transformers with the same outputs.

The checkpoints are written here with the variable names of google-research/bert's modeling.py (spelled
out below, independently of bertjax/models/bert/tf1.py's table) by `tf.raw_ops.SaveV2`, which stores exactly the
names given, from the weights of a random `transformers.BertForPreTraining`.
"""

import json
import logging
import pathlib

import jax
import numpy as np
import pytest
import tensorflow as tf
import transformers

import bertjax
from bertjax.jobs import export as exporting
from bertjax.models.bert import model as model_lib
from bertjax.interop import pretrained
from bertjax.models.bert import tf1

import reference
from test_bad_inputs import sentence
from test_hf_parity import assert_matches

CONFIG = model_lib.BertConfig(
    vocab_size=100,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
    type_vocab_size=2,
)
DIRNAME = "uncased_L-2_H-32_A-4"  # google's naming, which carries the casing


def google_variables(hf_model: transformers.BertForPreTraining) -> dict[str, np.ndarray]:
    """The model's weights under google-research/bert's TF1 names; dense kernels are [in, out] there."""
    sd = {k: v.detach().numpy() for k, v in hf_model.state_dict().items()}
    out = {}

    def dense(tf_name, hf_name):
        out[f"{tf_name}/kernel"] = sd[f"{hf_name}.weight"].T
        out[f"{tf_name}/bias"] = sd[f"{hf_name}.bias"]

    def layer_norm(tf_name, hf_name):
        out[f"{tf_name}/gamma"] = sd[f"{hf_name}.weight"]
        out[f"{tf_name}/beta"] = sd[f"{hf_name}.bias"]

    for name in ("word_embeddings", "token_type_embeddings", "position_embeddings"):
        out[f"bert/embeddings/{name}"] = sd[f"bert.embeddings.{name}.weight"]
    layer_norm("bert/embeddings/LayerNorm", "bert.embeddings.LayerNorm")
    for i in range(CONFIG.num_hidden_layers):
        t, h = f"bert/encoder/layer_{i}", f"bert.encoder.layer.{i}"
        for name in ("query", "key", "value"):
            dense(f"{t}/attention/self/{name}", f"{h}.attention.self.{name}")
        dense(f"{t}/attention/output/dense", f"{h}.attention.output.dense")
        layer_norm(f"{t}/attention/output/LayerNorm", f"{h}.attention.output.LayerNorm")
        dense(f"{t}/intermediate/dense", f"{h}.intermediate.dense")
        dense(f"{t}/output/dense", f"{h}.output.dense")
        layer_norm(f"{t}/output/LayerNorm", f"{h}.output.LayerNorm")
    dense("bert/pooler/dense", "bert.pooler.dense")
    dense("cls/predictions/transform/dense", "cls.predictions.transform.dense")
    layer_norm("cls/predictions/transform/LayerNorm", "cls.predictions.transform.LayerNorm")
    out["cls/predictions/output_bias"] = sd["cls.predictions.bias"]
    out["cls/seq_relationship/output_weights"] = sd["cls.seq_relationship.weight"]  # [2, hidden], as in HF
    out["cls/seq_relationship/output_bias"] = sd["cls.seq_relationship.bias"]
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def save_v2(prefix: pathlib.Path, variables: dict[str, np.ndarray]) -> None:
    names = sorted(variables)
    tf.raw_ops.SaveV2(
        prefix=str(prefix),
        tensor_names=names,
        shape_and_slices=[""] * len(names),
        tensors=[tf.constant(variables[n]) for n in names],
    )


def write_tf1_dir(
    path: pathlib.Path, variables: dict[str, np.ndarray], name: str = "bert_model.ckpt", config: dict | None = None
) -> pathlib.Path:
    """google's layout: bert_config.json (no layer_norm_eps, as google's have none), vocab.txt, checkpoint."""
    path.mkdir(parents=True)
    config = config or {k: v for k, v in CONFIG.to_dict().items() if k != "layer_norm_eps"}
    (path / "bert_config.json").write_text(json.dumps(config))
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(CONFIG.vocab_size - 5)]
    (path / "vocab.txt").write_text("".join(f"{t}\n" for t in tokens))
    save_v2(path / name, variables)
    return path


@pytest.fixture(scope="module")
def reference_model():
    """(HF model, its google-named variables, a batch, HF's outputs on it)."""
    hf_model = reference.random_hf_model(CONFIG)
    inputs = reference.batch(CONFIG)
    return hf_model, google_variables(hf_model), inputs, reference.hf_outputs(hf_model, inputs)


def test_with_heads(tmp_path, reference_model):
    _, variables, inputs, expected = reference_model
    path = write_tf1_dir(tmp_path / DIRNAME, variables)
    assert tf1.is_tf1_dir(str(path))
    for scan in (False, True):
        model, params = bertjax.from_pretrained(str(path), scan_layers=scan)
        assert model.config == CONFIG
        assert_matches(model, params, expected, inputs)


def test_without_heads(tmp_path, reference_model, caplog):
    """An encoder-only checkpoint: heads are initialised fresh, the encoder's outputs still match."""
    _, variables, inputs, expected = reference_model
    encoder = {k: v for k, v in variables.items() if not k.startswith("cls/")}
    path = write_tf1_dir(tmp_path / DIRNAME, encoder)
    with caplog.at_level(logging.WARNING, logger="bertjax"):
        model, params = bertjax.from_pretrained(str(path))
    assert "initialised fresh" in caplog.text and "cls.seq_relationship" in caplog.text
    assert params["nsp"]["kernel"].shape == (CONFIG.hidden_size, 2)
    assert params["mlm_bias"].shape == (CONFIG.vocab_size,)
    out = model.apply({"params": params}, **{k: v for k, v in inputs.items() if k != "masked_lm_positions"})
    np.testing.assert_allclose(out.sequence_output, expected["sequence_output"], atol=1e-5, rtol=0)
    assert out.mlm_logits.shape == expected["mlm_logits"].shape


def test_optimizer_state_is_ignored(tmp_path, reference_model, caplog):
    _, variables, inputs, expected = reference_model
    rng = np.random.default_rng(0)
    state = {
        f"{k}/{slot}": rng.normal(size=v.shape).astype(np.float32)
        for k, v in variables.items()
        for slot in ("adam_m", "adam_v")
    }
    state["global_step"] = np.array(1000, np.int64)
    path = write_tf1_dir(tmp_path / DIRNAME, {**variables, **state}, name="model.ckpt-1000")
    with caplog.at_level(logging.INFO, logger="bertjax.models.bert.tf1"):
        model, params = bertjax.from_pretrained(str(path))
    assert f"ignored {len(state)} optimizer/training variable(s)" in caplog.text
    assert_matches(model, params, expected, inputs)


def test_export_to_transformers(tmp_path, reference_model):
    _, variables, inputs, expected = reference_model
    path = write_tf1_dir(tmp_path / DIRNAME, variables)
    out_dir = tmp_path / "hf"
    exporting.export(str(path), str(out_dir))
    hf_model, info = transformers.BertForPreTraining.from_pretrained(
        out_dir, output_loading_info=True, attn_implementation="eager"
    )
    assert not any(info.values()), f"transformers reported {info}"
    got = reference.hf_outputs(hf_model.eval(), inputs)
    for key in expected:
        np.testing.assert_allclose(got[key], expected[key], atol=1e-5, rtol=0)
    assert (out_dir / "vocab.txt").read_text() == (path / "vocab.txt").read_text()
    assert json.loads((out_dir / "tokenizer_config.json").read_text())["do_lower_case"] is True
    with pytest.raises(ValueError) as e:
        exporting.export(str(path), str(tmp_path / "hf2"), step=3)
    sentence(e, "--step=3", "is a TF1 directory")


def test_init_from(tmp_path, reference_model):
    """config.train.init_from takes a TF1 directory, in either layer layout; another architecture is refused."""
    _, variables, _, _ = reference_model
    path = write_tf1_dir(tmp_path / DIRNAME, variables)
    _, loaded = bertjax.from_pretrained(str(path))
    for scan in (False, True):
        params = pretrained.init_params(str(path), model_lib.BertForPreTraining(CONFIG, scan_layers=scan))
        if scan:
            params = model_lib.unstack_layers(params)
        jax.tree.map(np.testing.assert_array_equal, params, jax.device_get(loaded))
    other = model_lib.BertForPreTraining(model_lib.BertConfig(**{**CONFIG.to_dict(), "intermediate_size": 128}))
    with pytest.raises(ValueError) as e:
        pretrained.init_params(str(path), other)
    sentence(e, f"config.train.init_from={path} holds a different model", "intermediate_size")
    with pytest.raises(FileNotFoundError) as e:
        pretrained.init_params(str(tmp_path / "nothing"), other)
    sentence(e, "is neither a bertjax workdir", "google-research/bert TF1 directory (with bert_config.json")


def test_unknown_variable(tmp_path, reference_model):
    _, variables, _, _ = reference_model
    extra = {**variables, "cls/squad/output_weights": np.zeros((2, CONFIG.hidden_size), np.float32)}
    path = write_tf1_dir(tmp_path / DIRNAME, extra)
    with pytest.raises(ValueError) as e:
        bertjax.from_pretrained(str(path))
    sentence(e, path / "bert_model.ckpt", "'cls/squad/output_weights'", "bert_config.json")
    # A layer beyond bert_config.json's num_hidden_layers is unknown too.
    deeper = {**variables, "bert/encoder/layer_2/output/dense/bias": np.zeros(CONFIG.hidden_size, np.float32)}
    path = write_tf1_dir(tmp_path / "deeper", deeper)
    with pytest.raises(ValueError) as e:
        tf1.load(str(path))
    sentence(e, "'bert/encoder/layer_2/output/dense/bias'", "num_hidden_layers=2")


def test_missing_variable(tmp_path, reference_model):
    _, variables, _, _ = reference_model
    name = "bert/encoder/layer_1/attention/self/query/kernel"
    path = write_tf1_dir(tmp_path / DIRNAME, {k: v for k, v in variables.items() if k != name})
    with pytest.raises(ValueError) as e:
        bertjax.from_pretrained(str(path))
    sentence(e, path / "bert_model.ckpt", f"lacks variable '{name}'")


def test_shape_mismatch_names_bert_config(tmp_path, reference_model):
    _, variables, _, _ = reference_model
    config = {**CONFIG.to_dict(), "vocab_size": 120}
    path = write_tf1_dir(tmp_path / DIRNAME, variables, config=config)
    with pytest.raises(ValueError) as e:
        tf1.load(str(path))
    sentence(e, "bert/embeddings/word_embeddings", "bert_config.json implies")


def test_not_a_tf1_dir(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert not tf1.is_tf1_dir(str(empty))
    with pytest.raises(FileNotFoundError) as e:
        tf1.load(str(empty))
    sentence(
        e,
        empty,
        "has no bert_config.json",
        "a TF1 BERT directory holds bert_config.json, vocab.txt and bert_model.ckpt.index + bert_model.ckpt.data-*",
    )
    (empty / "bert_config.json").write_text(json.dumps(CONFIG.to_dict()))
    assert tf1.is_tf1_dir(str(empty))
    with pytest.raises(FileNotFoundError) as e:  # from_pretrained speaks of the TF1 layout, not of HF's
        bertjax.from_pretrained(str(empty))
    sentence(e, empty, "has no TF checkpoint", "a TF1 BERT directory holds")


def test_damaged_checkpoint(tmp_path, reference_model):
    _, variables, _, _ = reference_model
    path = write_tf1_dir(tmp_path / DIRNAME, variables)
    data = next(path.glob("bert_model.ckpt.data-*"))
    data.write_bytes(data.read_bytes()[:2000])
    with pytest.raises(ValueError) as e:
        tf1.load(str(path))
    sentence(e, path / "bert_model.ckpt", "cannot be read", "re-download")
    data.unlink()
    with pytest.raises(ValueError) as e:
        tf1.load(str(path))
    sentence(e, data, "re-download")
    index = path / "bert_model.ckpt.index"
    index.write_bytes(index.read_bytes()[:30])
    with pytest.raises(ValueError) as e:
        tf1.load(str(path))
    sentence(e, path / "bert_model.ckpt", "is not a readable TF checkpoint")


def test_checkpoint_prefix(tmp_path):
    """The `checkpoint` file's latest, else bert_model.ckpt, else the only *.index; several is an error."""
    one = {"global_step": np.array(1, np.int64)}
    path = tmp_path / "run"
    path.mkdir()
    save_v2(path / "model.ckpt-5", one)
    assert tf1.checkpoint_prefix(str(path)) == str(path / "model.ckpt-5")
    save_v2(path / "model.ckpt-9", one)
    with pytest.raises(FileNotFoundError) as e:
        tf1.checkpoint_prefix(str(path))
    sentence(e, "holds several TF checkpoints (model.ckpt-5, model.ckpt-9)", "`checkpoint` file")
    save_v2(path / "bert_model.ckpt", one)
    assert tf1.checkpoint_prefix(str(path)) == str(path / "bert_model.ckpt")
    (path / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-9"\n')
    assert tf1.checkpoint_prefix(str(path)) == str(path / "model.ckpt-9")


@pytest.mark.parametrize(
    "name, config, lower",
    [
        ("uncased_L-12_H-768_A-12", {}, True),
        ("cased_L-12_H-768_A-12", {}, False),
        ("multi_cased_L-12_H-768_A-12", {}, False),
        ("chinese_L-12_H-768_A-12", {}, True),
        ("cased_L-12_H-768_A-12", {"do_lower_case": True}, True),
        ("my_bert", {"do_lower_case": False}, False),
    ],
)
def test_vocab_casing(tmp_path, name, config, lower):
    path = tmp_path / name
    path.mkdir()
    (path / "bert_config.json").write_text(json.dumps({**CONFIG.to_dict(), **config}))
    assert tf1.vocab(str(path)) == (None, lower)
    (path / "vocab.txt").write_text("[PAD]\n")
    assert tf1.vocab(str(path)) == (str(path / "vocab.txt"), lower)
