"""bertjax and transformers.BertForPreTraining agree numerically, with weights moved either way."""

import numpy as np
import pytest
import torch
import transformers

import bertjax
from bertjax.models.bert import model as model_lib

import reference

CONFIGS = {
    "tiny": model_lib.config_for_size("tiny"),
    "3-layer": model_lib.BertConfig(
        vocab_size=1000,
        hidden_size=96,
        num_hidden_layers=3,
        num_attention_heads=3,
        intermediate_size=160,
        max_position_embeddings=64,
        type_vocab_size=2,
    ),
}
MLM_ATOL, NSP_ATOL, SEQ_ATOL = 1e-4, 1e-5, 1e-5


def assert_matches(model, params, hf: dict[str, np.ndarray], inputs: dict[str, np.ndarray]) -> None:
    positions = inputs["masked_lm_positions"]
    plain = {k: v for k, v in inputs.items() if k != "masked_lm_positions"}
    full = model.apply({"params": params}, **plain)
    gathered = model.apply({"params": params}, **plain, masked_lm_positions=positions)
    np.testing.assert_allclose(full.mlm_logits, hf["mlm_logits"], atol=MLM_ATOL, rtol=0)
    np.testing.assert_allclose(
        gathered.mlm_logits, np.take_along_axis(hf["mlm_logits"], positions[..., None], 1), atol=MLM_ATOL, rtol=0
    )
    for out in (full, gathered):
        np.testing.assert_allclose(out.nsp_logits, hf["nsp_logits"], atol=NSP_ATOL, rtol=0)
        np.testing.assert_allclose(out.sequence_output, hf["sequence_output"], atol=SEQ_ATOL, rtol=0)


@pytest.mark.parametrize("name", CONFIGS)
def test_hf_to_bertjax(name, tmp_path):
    config = CONFIGS[name]
    hf_model = reference.random_hf_model(config)
    hf_model.save_pretrained(tmp_path)
    inputs = reference.batch(config)
    expected = reference.hf_outputs(hf_model, inputs)
    for scan in (False, True):
        model, params = bertjax.from_pretrained(str(tmp_path), scan_layers=scan)
        assert model.config == config
        assert_matches(model, params, expected, inputs)


@pytest.mark.parametrize("name", CONFIGS)
def test_bertjax_to_hf(name, tmp_path):
    config = CONFIGS[name]
    inputs = reference.batch(config, seed=1)
    for scan in (False, True):
        model = model_lib.BertForPreTraining(config, scan_layers=scan)
        params = reference.random_params(model, seed=2)
        out_dir = tmp_path / f"scan={scan}"
        bertjax.save_pretrained(str(out_dir), model, params)
        hf_model, info = transformers.BertForPreTraining.from_pretrained(
            out_dir, output_loading_info=True, attn_implementation="eager"
        )
        assert not any(info.values()), f"transformers reported {info}"
        assert_matches(model, params, reference.hf_outputs(hf_model.eval(), inputs), inputs)


def test_export_loads_as_masked_lm_and_bare_model(tmp_path):
    config = CONFIGS["3-layer"]
    model = model_lib.BertForPreTraining(config)
    params = reference.random_params(model)
    bertjax.save_pretrained(str(tmp_path), model, params)
    inputs = reference.batch(config)
    ours = model.apply({"params": params}, **{k: v for k, v in inputs.items() if k != "masked_lm_positions"})
    kwargs = dict(
        input_ids=torch.tensor(inputs["input_ids"]).long(),
        token_type_ids=torch.tensor(inputs["segment_ids"]).long(),
        attention_mask=torch.tensor(inputs["input_mask"]).long(),
    )

    mlm, info = transformers.BertForMaskedLM.from_pretrained(
        tmp_path, output_loading_info=True, attn_implementation="eager"
    )
    assert not info["missing_keys"], info
    bare, info = transformers.BertModel.from_pretrained(tmp_path, output_loading_info=True, attn_implementation="eager")
    assert not info["missing_keys"], info
    with torch.no_grad():
        mlm_logits = mlm.eval()(**kwargs).logits.numpy()
        bare_out = bare.eval()(**kwargs)
    np.testing.assert_allclose(ours.mlm_logits, mlm_logits, atol=MLM_ATOL, rtol=0)
    np.testing.assert_allclose(ours.sequence_output, bare_out.last_hidden_state.numpy(), atol=SEQ_ATOL, rtol=0)
    np.testing.assert_allclose(ours.pooled_output, bare_out.pooler_output.numpy(), atol=SEQ_ATOL, rtol=0)


@pytest.mark.parametrize("size", list(model_lib.SIZES))
def test_parameter_count_equals_hf(size):
    import jax

    config = model_lib.config_for_size(size)
    shapes = jax.eval_shape(lambda: model_lib.init_params(model_lib.BertForPreTraining(config), jax.random.PRNGKey(0)))
    with torch.device("meta"):
        hf_model = transformers.BertForPreTraining(reference.hf_config(config))
    # parameters() yields the tied decoder weight once, as bertjax stores it once.
    assert model_lib.param_count(shapes) == sum(p.numel() for p in hf_model.parameters())
